"""Smoke tests of the demo and the tools, each run as a user runs it (a subprocess).
(What of them runs in this process: tests/unit/test_tools.py.)

The demo runs once with tiny settings (B=2, T=256, a 512-token tokenizer) into a module tmp
dir; every benchmark topic (tools/bench/: one tiny run each, its report and its results file
checked for content; its main in this process, its measurements in fresh processes; each
topic's file run with --help), gpu_check (`--device cpu`) and profile_worker reuse that corpus.
tools/inspect_batch.py reads position documents through `helpers.IntTokenizer`, so the rows it
prints are checked by arithmetic, and resuming from the state it prints gives the next batch.
The bench topics' runs (measurement tools: a tiny run each, 1-30 s; two built corpora, repeat
rounds, two checkouts) are marked slow, so that the default suite stays under 5 minutes; CI
runs both. Every topic's --help, the demo, inspect_batch and the tools run from the package
stay in the default suite.
"""
from __future__ import annotations

import importlib
import itertools
import json
import logging
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import shmloader
from shmloader.state import VERSION
from shmloader.demo import corpus
from tests import helpers
from tests.helpers import REPO_ROOT
from shmloader.demo import prepare_data

VOCAB = 512
TIMEOUT_S = 120
# the watchdog's deadline (tests/conftest.py): each bench topic starts fresh processes with torch,
# 10-40 s on a quiet machine and past 60 s at load 6-10 (step_loop, mixture, gpu_train's harness
# beside three other test runs): a hang is still caught
pytestmark = pytest.mark.deadline(240)


def run(*args, cwd=REPO_ROOT) -> str:
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    text = run("-m", "shmloader.demo", "--out-dir", out, "--batches", 20, "--batch-size", 2,
               "--seq-len", 256, "--vocab-size", VOCAB, "--verify", 4)
    return out, text


def test_demo_prints_the_table_and_verifies_the_stream(demo):
    _, text = demo
    head = next(line for line in text.splitlines() if line.startswith("loader"))
    for column in ("tokens/s", "trainer CPU us/batch", "first batch ms"):
        assert column in head
    rows = {line.split("  ")[0]: line for line in text.splitlines()}
    for name in ("nanochat-style baseline (4 threads)", "shmloader, 2 workers", "shmloader against the baseline"):
        assert name in rows, f"no {name!r} row in:\n{text}"
    assert re.search(r"\d+\.\d+ M|\d+\.\d k", rows["shmloader, 2 workers"])
    # each comparison says which way it goes, in words
    assert re.search(r"\d+\.\d+x (faster|slower) +\d+\.\dx (less|more) +\d+\.\d+x (faster|slower)$",
                     rows["shmloader against the baseline"]), rows["shmloader against the baseline"]
    assert "shmloader's first 4 batches equal, token for token, those of the nanochat-style baseline" in text
    assert re.search(r"resume verified: the state after batch 4 \([\d,]+ bytes of JSON\) resumed in a new "
                     r"loader with 1 worker instead of 2; its 8 batches equal", text), text


def test_demo_data_is_cached(demo):
    out, _ = demo
    logged = []
    data = prepare_data(out, VOCAB, log=logged.append)
    assert logged == [], "a second run rebuilt the cached data"
    assert data.n_files == 4 and len(list(data.data_dir.glob("*.parquet"))) == 4
    assert data.tokenizer_path.is_file() and data.vocab_size <= VOCAB


# ---------------------------------------------------------------- tools/bench/, one smoke run a topic

TOPICS = ("throughput", "trainer", "evaluations", "base_train", "cache", "heal", "elastic", "engines", "packing",
          "long_document", "mixture", "positions", "giga", "step_loop", "hf_engine", "gpu_train", "cuda_next",
          "ring_slots")
TINY = ("--batch-size", 2, "--seq-len", 128)


def bench(topic: str, tmp_path, capsys, *args) -> tuple[str, dict]:
    """`python tools/bench/<topic>.py ARGS --json F`, its main in this process (its measurements
    in fresh processes, as ever): its report, and the one run of its results file."""
    out = tmp_path / f"{topic}.json"
    argv = [*map(str, args), "--json", str(out)]
    assert importlib.import_module(f"tools.bench.{topic}").main(argv) == 0
    text = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["topic"] == topic and len(saved["runs"]) == 1
    [figures] = saved["runs"]
    assert figures["command"] == shlex.join(["python", f"tools/bench/{topic}.py", *argv])
    assert figures["date"] and figures["machine"]["cores"] >= 1
    return text, figures


def on_demo(demo) -> tuple:
    out, _ = demo
    return ("--cache-dir", out, "--vocab-size", VOCAB)


def test_bench_help_of_every_topic(tmp_path):
    for topic in TOPICS:  # from another directory: a topic finds its checkout on its own
        text = run(REPO_ROOT / "tools" / "bench" / f"{topic}.py", "--help", cwd=tmp_path)
        assert f"usage: python tools/bench/{topic}.py" in text and "--json PATH" in text, text
        assert f"docs/bench/{topic}.json" in " ".join(text.split())


@pytest.mark.slow  # a measurement tool's tiny run, 5.1 CPU-s (its --help: test_bench_help_of_every_topic)
def test_bench_throughput(demo, tmp_path, capsys, watchdog):
    text, got = bench("throughput", tmp_path, capsys, *on_demo(demo), "--workers", 1, "--packings", "concat", *TINY,
                      "--seconds", 0.3)
    [entry] = got["corpora"]
    base, shm = entry["rows"]
    assert entry["corpus"] == "demo" and (base["kind"], shm["kind"], shm["workers"]) == ("baseline", "shmloader", 1)
    assert all(r["batches"] > 0 and r["tokens_per_s"] > 0 and r["trainer_cpu_us_per_batch"] > 0 for r in (base, shm))
    # the ceilings of 1 worker: 1 bare engine process, and 1 that reads its row groups too, in the same
    # round, for as long
    bare, read = entry["bare"]
    assert (bare["kind"], read["kind"]) == ("bare", "bare_read")
    assert all(b["processes"] == 1 and b["seconds"] == 0.3 and b["tokens_per_s"] > 0 for b in (bare, read))
    assert shm["of_bare_rounds"] == [shm["tokens_per_s"] / bare["tokens_per_s"]]
    assert shm["of_bare_read_rounds"] == [shm["tokens_per_s"] / read["tokens_per_s"]]
    assert shm["vs_base_rounds"] == [shm["tokens_per_s"] / base["tokens_per_s"]]
    [share] = shm["worker_busy_share"]
    assert 0 < share <= 1.5 and shm["worker_cpu_s"] > 0 and shm["coordinator_cpu_s"] >= 0
    assert shm["shmloader"] == str(REPO_ROOT)
    row = next(ln for ln in text.splitlines() if ln.startswith("shmloader, 1 worker "))
    assert f" {shm['tokens_per_s'] / 1e6:.2f} M " in row and f" {shm['of_bare_rounds'][0]:.0%} " in row, text
    assert f" {shm['of_bare_read_rounds'][0]:.0%} " in row and "bare processes that read too" in text, text
    assert re.search(r"where the \d+ cores went, shmloader, 1 worker: workers \d+%, coordinator \d+%, training "
                     r"process \d+%, the rest \(idle, kernel, other processes\) -?\d+%", text), text


@pytest.mark.slow  # a measurement tool's tiny run, 2.2 CPU-s (its --help: test_bench_help_of_every_topic)
def test_bench_trainer(demo, tmp_path, capsys, watchdog):
    text, got = bench("trainer", tmp_path, capsys, *on_demo(demo), "--workers", 1, "--packings", "concat", *TINY,
                      "--seconds", 0.3, "--batches", 3, "--sleep-ms", 2, "--busy-ms", 2, "--step-ms", 5,
                      "--syscall-steps", 0)
    [entry] = got["corpora"]
    [cost], [dropin] = entry["costs"], entry["dropins"]
    assert cost["batches"] == 3 and cost["busy_ms"] == 2 and cost["after_busy_not_ready"] <= 3
    for key in ("back_to_back_us", "after_sleep_us", "after_sleep_floor_us", "after_busy_us", "after_busy_floor_us"):
        assert cost[key]["median"] > 0, key
    assert cost["after_busy_ratio"] == cost["after_busy_us"]["median"] / cost["after_busy_floor_us"]["median"]
    assert dropin["function"] == "tokenizing_distributed_data_loader_with_state" and dropin["fast_batches"] > 0
    assert dropin["trainer_cpu_us_per_batch"] > 0 and dropin["state_json_bytes"] > 0 and dropin["paced_not_ready"] <= 3
    assert got["syscalls"] == [] and re.search(r"^demo +concat +[\d.]+ / [\d.]+ ", text, re.M), text


@pytest.mark.slow  # 6 fresh processes with torch (3 loaders, 2 collector modes): 30 s
def test_bench_step_loop(demo, tmp_path, capsys, watchdog):
    text, got = bench("step_loop", tmp_path, capsys, *on_demo(demo), *TINY, "--step-ms", 2, "--block", 3,
                      "--pairs", 2, "--warmup", 3, "--repeat", 1, "--gc", "frozen", "on")
    [entry] = got["corpora"]
    rows = {(r["kind"], r["gc"]): r for r in entry["rows"]}
    assert set(rows) == {(k, g) for k in ("shmloader", "nanochat", "thread") for g in ("frozen", "on")}
    for r in rows.values():
        assert len(r["pair_ratios"]) == 2 and r["vs_ideal"] > 0 and r["vs_ideal_rounds"] == [r["vs_ideal"]]
        for side in ("loader", "ideal"):  # 2 pairs of 3-step blocks a side
            assert r[side]["steps"] == 6 and r[side]["step_ms"] > 0 and r[side]["next_cpu_us"]["median"] > 0
    assert rows["shmloader", "frozen"]["loader"]["loader_cpu_share"] >= 0  # /proc counts 10 ms ticks: maybe 0
    assert rows["nanochat", "frozen"]["loader"]["loader_cpu_share"] is None
    assert rows["shmloader", "frozen"]["loader"]["collections"] == [0, 0, 0]  # frozen and disabled
    assert got["config"]["units"] > 0 and re.search(r"^demo +frozen +shmloader, 1 worker +[\d.]+x ", text, re.M), text


@pytest.mark.slow  # a measurement tool's tiny run, 2.3 CPU-s (its --help: test_bench_help_of_every_topic)
def test_bench_positions(demo, tmp_path, capsys, watchdog):
    text, got = bench("positions", tmp_path, capsys, *on_demo(demo), "--workers", 1, "--packings", "bos_bestfit",
                      *TINY, "--batches", 3, "--step-ms", 2, "--repeat", 1)
    [entry] = got["packings"]
    for key in ("ready_us", "paced_us"):
        assert entry["ratios"][key] == [w[key] / o[key] for w, o in zip(entry["with"], entry["without"])]
        assert all(r[key] > 0 for r in entry["without"] + entry["with"])
    assert all(r["cu_seqlens_us"] > 0 for r in entry["with"])
    assert all("cu_seqlens_us" not in r for r in entry["without"])
    assert len(entry["with"]) == len(entry["without"]) == 1
    assert re.search(r"^bos_bestfit +median ratio +[\d.]+x +[\d.]+x", text, re.M), text


@pytest.mark.slow  # both packings, and strace
def test_bench_trainer_counts_system_calls_per_next(demo, tmp_path, capsys):
    if not shutil.which("strace"):
        pytest.skip("needs strace")
    text, got = bench("trainer", tmp_path, capsys, *on_demo(demo), "--workers", 1, *TINY, "--seconds", 0.3,
                      "--batches", 3, "--sleep-ms", 2, "--busy-ms", 2, "--step-ms", 5, "--syscall-steps", 20)
    [entry] = got["corpora"]
    assert [r["packing"] for r in entry["dropins"]] == ["concat", "bos_bestfit"]
    assert entry["dropins"][1]["function"] == "tokenizing_distributed_data_loader_with_state_bos_bestfit"
    assert [(r["packing"], r["n"]) for r in got["syscalls"]] == [("concat", 20), ("bos_bestfit", 20)]
    for r in got["syscalls"]:
        assert r["per_next"] == sum(r["by_name"].values()) / 20 and 0 <= r["not_ready"] <= 20
    assert "system calls per next(), bos_bestfit, 1 worker, 20 steps" in text and "best fit / concat" in text


@pytest.mark.slow  # a measurement tool's tiny run, 3.7 CPU-s (its --help: test_bench_help_of_every_topic)
def test_bench_evaluations(demo, tmp_path, capsys, watchdog):
    text, got = bench("evaluations", tmp_path, capsys, *on_demo(demo), "--workers", 1, "--packings", "concat", *TINY,
                      "--loaders", 2, "--take", 2, "--gap-ms", 50, "--step-ms", 5)
    [entry] = got["corpora"]
    base, ours = entry["rows"]
    assert (base["kind"], ours["kind"], ours["workers"]) == ("baseline", "shmloader", 1)
    assert len(ours["per_evaluation_ms"]) == 2 and all(t > 0 for t in ours["per_evaluation_ms"])
    assert ours["vs_nanochat_per_evaluation"] == [a / b for a, b in zip(ours["per_evaluation_ms"],
                                                                        base["per_evaluation_ms"])]
    assert ours["train_first_ms"] > 0 and ours["vs_nanochat_train_first"] == ours["train_first_ms"] / base["train_first_ms"]
    [memory] = ours["memory_between_rounds"]
    # between evaluations: the trainer, the forkserver and the resource tracker at least, with
    # each loader's coordinator and worker once the server has booted (these 50 ms gaps may all
    # come before: the train loader's first batches are the trainer's own then, procs/headstart.py)
    assert len(memory) == 2 and all(m["processes"] >= 3 for m in memory)
    assert base["processes_between"] == 1 and ours["rss_between_mib_median"] > base["rss_between_mib_median"] > 0
    assert "shmloader, 1 worker" in text and "MiB between" in text and "train loader's first" in text


@pytest.mark.slow  # the cache built, then read, in fresh processes: 11 s
def test_bench_cache(demo, tmp_path, capsys, watchdog):
    text, got = bench("cache", tmp_path, capsys, *on_demo(demo), *TINY, "--seconds", 0.3, "--first-runs", 1)
    assert [(r["kind"], r["cache"]) for r in got["rows"]] == \
        [("baseline", None), ("shmloader", "cold"), ("shmloader", "restart"), ("shmloader", "warm")]
    base, cold, restart, warm = got["rows"]
    assert all(r["tokens_per_s"] > 0 for r in got["rows"]) and warm["vs_base"] == warm["tokens_per_s"] / base["tokens_per_s"]
    assert cold["worker_tokenized"] > 0 and warm["worker_tokenized"] == 0  # the warm cache tokenizes nothing
    assert cold["first_batch_ms"] == [] and len(warm["first_batch_ms"]) == 1
    assert "shmloader, 1 worker, warm cache" in text


def test_bench_heal(demo, tmp_path, capsys, watchdog):
    text, got = bench("heal", tmp_path, capsys, *on_demo(demo), "--workers", 1, *TINY, "--faults", 1, "--settle", 0.1,
                      "--after", 0.3, "--stall-s", 1.0)
    # a stall of 1 s, not 0.3: on a loaded machine a live worker starved for 0.3 s was taken for a stopped one
    assert [k["kind"] for k in got["kinds"]] == ["worker-SIGKILL", "coordinator-SIGKILL", "worker-SIGSTOP"]
    assert all(f["heals"] == 1 and f["same_stream"] and f["batches"] > 1 for f in got["faults"])
    stop = got["kinds"][2]
    assert stop["after_ms_max"] >= 1000 * 0.9  # a stopped worker is healed after stall_s
    assert "worker-SIGSTOP" in text


@pytest.mark.slow  # 4 rows of fresh processes, then 4 without a trainer's pace: 30 s
def test_bench_mixture(demo, tmp_path, capsys, watchdog):
    text, got = bench("mixture", tmp_path, capsys, *on_demo(demo), "--workers", 1, *TINY, "--seconds", 0.5,
                      "--repeat", 1, "--paced-batches", 5, "--step-ms", 1)
    assert [len(got["rows"][k]) for k in ("single", "mixture", "single_paced", "mixture_paced")] == [1, 1, 1, 1]
    assert all(r["batches"] == 5 and r["next_cpu_us_median"] > 0 for r in got["rows"]["mixture_paced"])
    assert all(r["batches"] > 0 for rows in got["rows"].values() for r in rows)
    assert len(got["tokens_per_s_ratio"]) == 1 and all(x > 0 for x in got["tokens_per_s_ratio"])
    assert all(x > 0 for x in got["coordinator_cpu_ratio"] + got["worker_cpu_ratio"])
    assert "median ratio" in text and "coordinator CPU" in text
    # the same files as one source, and before/after with another checkout (this one): no paced rows
    text, got = bench("mixture", tmp_path, capsys, *on_demo(demo), "--workers", 1, *TINY, "--seconds", 0.5,
                      "--repeat", 1, "--paced-batches", 0, "--single", "files", "--compare", REPO_ROOT)
    assert sorted(got["rows"]) == ["before mixture", "before single", "mixture", "single"]
    assert got["config"]["single"] == "files" and len(got["before"]["tokens_per_s_ratio"]) == 1
    assert "before (tokens/s" in text and "its 3 sources' files as one source" in text
    # a mixture of the single source itself
    text, got = bench("mixture", tmp_path, capsys, *on_demo(demo), "--workers", 1, *TINY, "--seconds", 0.5,
                      "--repeat", 1, "--paced-batches", 0, "--sources", 1)
    assert sorted(got["rows"]) == ["mixture", "single"] and got["config"]["sources"] == ["x"]
    assert "a mixture of that one source against the corpus as one source" in text


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_profile_mixture(capsys, packing):
    from tools import profile_mixture

    assert profile_mixture.main(["--packing", packing, "--batches", "3", "--batch-size", "2", "--seq-len", "64"]) == 0
    out = capsys.readouterr().out
    assert f"{packing} over 3 sources" in out and " ms CPU a batch" in out and "3 batches" in out
    assert profile_mixture.main(["--packing", packing, "--batches", "3", "--batch-size", "2", "--seq-len", "64",
                                 "--single", "--weights", "5,3,2"]) == 0
    assert f"{packing} over one source" in capsys.readouterr().out
    assert profile_mixture.main(["--packing", packing, "--batches", "3", "--batch-size", "2", "--seq-len", "64",
                                 "--sources", "1"]) == 0
    assert f"{packing} over 1 source as a mixture" in capsys.readouterr().out


def test_bench_elastic(demo, tmp_path, capsys, watchdog):
    text, got = bench("elastic", tmp_path, capsys, *on_demo(demo), "--corpus", "demo", "--workers", 1, *TINY, "--batches", 30,
                      "--repeat", 1)
    assert [r["resume"] for r in got["rows"]] == ["same rank, same world size (no replay)", "rank 1 of 2, no cache",
                                                  "rank 1 of 2, token cache", "rank 0 of 3, no cache",
                                                  "rank 0 of 3, token cache"]
    assert all(0 < r["built_s"][0] <= r["first_batch_s"][0] for r in got["rows"]) and got["old_batch"] == 30
    assert got["check_us"] > 0 and re.search(r"rank 1 of 2, no cache +[\d.]+ / +[\d.]+ s .* M tokens counted/s", text)


@pytest.mark.slow  # a measurement tool's tiny run, 2.5 CPU-s (its --help: test_bench_help_of_every_topic)
def test_bench_engines(demo, tmp_path, capsys, watchdog):
    pytest.importorskip("fastokens")
    text, got = bench("engines", tmp_path, capsys, *on_demo(demo), "--rounds", 1, "--docs", 300, "--loader-seconds", 0.3, *TINY)
    assert got["docs"] == 300 and [r["method"] for r in got["rates"]] == \
        ["tiktoken encode_to_numpy", "fastokens", "fastokens + sampled check (1 in 256)"]
    assert all(r["tokens_per_s"] > 0 for r in got["rates"] + got["loaders"])
    assert [r["engine"] for r in got["loaders"]] == ["tiktoken", "fastokens"]
    for line in ("sampled check cost", "start check", "engine='fastokens'"):
        assert line in text, text


@pytest.mark.slow  # a measurement tool's tiny run, 1.7 CPU-s (its --help: test_bench_help_of_every_topic)
def test_bench_giga(demo, tmp_path, capsys, watchdog):
    """The third engine's topic: tokenizers of both patterns trained on the corpus, every document's
    ids equal to tiktoken's for both fast engines, and a rate for each of the three."""
    text, got = bench("giga", tmp_path, capsys, *on_demo(demo), "--docs", 200, "--rounds", 1,
                      "--vocab-size-trained", 512, "--train-chars", 2e5)
    assert [(e["corpus"], e["pattern"]) for e in got["corpora"]] == [("demo", "gpt2"), ("demo", "cl100k")]
    for e in got["corpora"]:
        assert e["docs"] == 200 and e["differ"] == {"fastokens": 0, "gigatoken": 0}
        assert e["engines"] == {"fastokens": "fastokens", "gigatoken": "gigatoken"}
        assert [r["engine"] for r in e["rates"]] == ["tiktoken", "fastokens", "gigatoken"]
        assert all(r["tokens_per_s"] > 0 for r in e["rates"])
    assert re.search(r"demo +gpt2 +200 .* 0, 0 of 200", text), text


@pytest.mark.slow  # a tokenizer.json trained, 2 packings in fresh processes: 15 s
def test_bench_hf_engine(tmp_path, capsys, watchdog):
    pytest.importorskip("fastokens")
    pytest.importorskip("tokenizers")
    text, got = bench("hf_engine", tmp_path, capsys, "--rounds", 1, "--seconds", 1.5, "--files", 60,
                      "--vocab-size", 300, "--workers", 1, "--data-dir", tmp_path / "data")
    assert [r["packing"] for r in got["rows"]] == ["concat", "bos_bestfit"]
    for r in got["rows"]:
        assert r["first_batch_s"] > 0 and r["engines"] == ["fastokens"], r
    assert "bos_bestfit" in text and "fastokens" in text, text


def test_bench_packing(tmp_path, capsys, watchdog):
    text, got = bench("packing", tmp_path, capsys, "--batches", 20)
    assert got["plans_identical"] and got["planner_ms_per_batch"] > 0 and got["scan_ms_per_batch"] > 0
    assert 0 < got["cropped_fraction"] < 1 and "plans identical: yes (20 batches)" in text


@pytest.mark.slow  # a measurement tool's tiny run, 2.3 CPU-s (its --help: test_bench_help_of_every_topic)
def test_bench_long_document(demo, tmp_path, capsys, watchdog):
    text, got = bench("long_document", tmp_path, capsys, *on_demo(demo), "--mb", 1, "--workers", 1)
    [row] = got["rows"]
    assert row["workers"] == 1 and row["first_batch_s"] > 0 and row["worker_peak_rss_mib"][0] > 0
    assert "a 1 MiB document at row 60" in text and "1 worker: first batch" in text


@pytest.mark.slow  # two corpora built and measured
def test_bench_throughput_on_two_built_corpora(demo, tmp_path, capsys):
    _, got = bench("throughput", tmp_path, capsys, *on_demo(demo), "--corpus", "nanochat", "skewed", "--nanochat-docs", 1100,
                   "--skewed-docs", 200, "--corpus-files", 2, "--workers", 1, 2, "--packings", "concat", *TINY,
                   "--seconds", 0.3)
    assert [e["corpus"] for e in got["corpora"]] == ["nanochat", "skewed"]
    for e in got["corpora"]:
        assert [(r["kind"], r["workers"]) for r in e["rows"]] == [("baseline", None), ("shmloader", 1), ("shmloader", 2)]
        assert [(b["kind"], b["processes"]) for b in e["bare"]] == [  # every worker count, its own ceilings
            ("bare", 1), ("bare_read", 1), ("bare", 2), ("bare_read", 2)]
        assert all("of_bare_read_rounds" in r for r in e["rows"][1:])
        assert all(len(r["worker_busy_share"]) == r["workers"] and r["tokens_per_s"] > 0 for r in e["rows"][1:])


@pytest.mark.slow  # 3 rounds of 3 fresh processes, and the chart
def test_bench_throughput_repeat_interleaves_rounds_and_reports_medians(demo, tmp_path, capsys):
    text, got = bench("throughput", tmp_path, capsys, *on_demo(demo), "--workers", 1, "--packings", "concat", *TINY,
                      "--seconds", 0.3, "--repeat", 3, "--chart", tmp_path / "t.png")
    [entry] = got["corpora"]
    base, shm = entry["rows"]
    assert len(shm["tokens_per_s_rounds"]) == 3 and shm["tokens_per_s"] == sorted(shm["tokens_per_s_rounds"])[1]
    ratios = shm["vs_base_rounds"]
    assert len(ratios) == 3 and len(base["tokens_per_s_rounds"]) == 3
    row = next(ln for ln in text.splitlines() if ln.startswith("shmloader, 1 worker "))
    assert f" {sorted(ratios)[1]:.2f}x " in row, text
    assert "shmloader, 1 worker: vs base per round " + ", ".join(f"{x:.2f}x" for x in ratios) in text
    bare = entry["bare"][0]["tokens_per_s_rounds"]
    assert shm["of_bare_rounds"] == pytest.approx([t / b for t, b in zip(shm["tokens_per_s_rounds"], bare)])
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # two checkouts side by side, in three topics
def test_bench_compare_runs_the_other_checkouts_loader(demo, tmp_path, capsys):
    """--compare DIR: each shmloader row also with DIR's package (here a copy of this one),
    interleaved, and that row's process (and its workers') imported DIR's shmloader."""
    before = tmp_path / "before"
    shutil.copytree(REPO_ROOT / "shmloader", before / "shmloader", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "tools", before / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    _, got = bench("throughput", tmp_path, capsys, *on_demo(demo), "--workers", 1, "--packings", "concat", *TINY,
                   "--seconds", 0.3, "--compare", before)
    rows = got["corpora"][0]["rows"]
    assert [(r["kind"], r["label"], r["shmloader"]) for r in rows] == \
        [("baseline", None, str(REPO_ROOT)), ("shmloader", "before", str(before)),
         ("shmloader", "this checkout", str(REPO_ROOT))]
    _, got = bench("evaluations", tmp_path, capsys, *on_demo(demo), "--workers", 1, "--packings", "concat", *TINY,
                   "--loaders", 2, "--take", 1, "--gap-ms", 0, "--compare", before)
    assert [(r["label"], r["shmloader"]) for r in got["corpora"][0]["rows"]] == \
        [(None, str(REPO_ROOT)), ("before", str(before)), ("this checkout", str(REPO_ROOT))]
    _, got = bench("cache", tmp_path, capsys, *on_demo(demo), *TINY, "--seconds", 0.3, "--first-runs", 0, "--compare", before)
    assert [(r["cache"], r["label"]) for r in got["rows"][1:]] == \
        [(k, who) for who in ("before", "this checkout") for k in ("cold", "restart", "warm")]
    assert all(r["shmloader"] == str(before) for r in got["rows"] if r["label"] == "before")


def test_plot_pipeline_measures_and_draws_the_interval_lines(demo, tmp_path):
    """tools/plot_pipeline.py --measure: a loader's own log lines, parsed into a table whose
    clock runs from the start-up through contiguous intervals, and a PNG."""
    out, _ = demo
    png = tmp_path / "pipeline.png"
    text = run("tools/plot_pipeline.py", "--measure", 2, "--step-ms", 5, "--log-every", 5, "--cache-dir", out,
               "--vocab-size", VOCAB, *TINY, "--out", png)
    start_up = float(re.search(r"start-up: the first batch after ([\d.]+) s", text)[1])
    rows = [line.split() for line in text.splitlines() if re.match(r" +\d+ +[\d.]+ +[\d,]+ +[\d.]+% +\d+/", line)]
    assert len(rows) >= 3, text
    batches, times = [int(r[0]) for r in rows], [float(r[1]) for r in rows]
    assert batches == list(range(5, 5 * len(rows) + 1, 5))
    # the table prints times to 0.1 s
    assert start_up <= times[0] + 0.05 and times == sorted(times) and times[-1] < start_up + 2 + 1, text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in text


def test_plot_pipeline_reads_a_log_and_keeps_one_loaders_lines(tmp_path):
    from tools import plot_pipeline
    log = tmp_path / "train.log"
    log.write_text("step 1 loss 9.1\n"
                   "batch 1: shmloader start-up: the first batch came 2.50 s after the loader was made (2.40 s of it "
                   "waited in next()), 2 workers; the interval lines count from here\n"
                   "batch 4: shmloader interval 1.5 s: 20000 tokens/s delivered, wait share 60.0% (last wait 0.300 s),"
                   " ring 0/8 ready, busiest worker 0 99% busy, idlest worker 1 97%; epoch 0, 3.3 s waited in all\n"
                   "batch 3: shmloader interval 0.4 s: 100 tokens/s delivered, wait share 1.0% (last wait 0.000 s),"
                   " ring 1/4 ready; epoch 0, 0.1 s waited in all\n"
                   "batch 8: shmloader interval 2.0 s: 30000 tokens/s delivered, wait share 1.5% (last wait 0.001 s),"
                   " ring 7/8 ready; epoch 0, 3.3 s waited in all\n")
    start_up, points = plot_pipeline.parse(log.read_text().splitlines(), every=4)
    assert start_up == 2.5
    assert points == [plot_pipeline.Point(4, 4.0, 1.5, 20000.0, 0.6, 0, 8),
                      plot_pipeline.Point(8, 6.0, 2.0, 30000.0, 0.015, 7, 8)]
    assert plot_pipeline.main(["--log", str(log), "--every", "4", "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_plot_pipeline_tells_the_loaders_of_one_log_apart(tmp_path, caplog):
    """A train and a val loader of one process, both logging every 2 batches to the same
    logger: each line names its loader (pid, number, split), and the tool keeps each one's
    lines apart (`--every 2` kept both)."""
    import shmloader
    from tools import plot_pipeline

    helpers.position_shards(tmp_path, [(i * 7) % 19 for i in range(200)], num_files=3)
    caplog.set_level(logging.INFO, logger="shmloader")
    made = [shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), 2, 16, split, device="cpu", num_workers=1,
                                log_every=2, timeout=60) for split in ("train", "val")]
    with made[0] as train, made[1] as val:
        for _ in range(3):
            for loader in (train, val):
                for _ in itertools.islice(loader, 2):
                    pass
    lines = [r.getMessage() for r in caplog.records if r.name == "shmloader"]
    found = plot_pipeline.loaders(lines)
    assert list(found.values()) == [4, 4], found
    ids = list(found)
    assert re.fullmatch(rf"{os.getpid()}-(\d+) \(train\)", ids[0]) and re.fullmatch(rf"{os.getpid()}-\d+ \(val\)", ids[1])
    for ident in ids:
        start_up, points = plot_pipeline.parse(lines, loader=ident)
        assert start_up > 0 and [p.batch for p in points] == [2, 4, 6], (ident, lines)
    assert [p.batch for p in plot_pipeline.parse(lines, every=2)[1]] == [2, 2, 4, 4, 6, 6]  # what --every did


def test_profile_worker_samples_a_running_worker(demo):
    out, _ = demo
    if subprocess.run([sys.executable, "-c", "import shutil, sys, os; sys.exit(shutil.which('py-spy', path="
                       "os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH']) is None)"]).returncode:
        pytest.skip("needs py-spy (the dev extras install it)")
    for seconds in (2, 4, 8):  # a loaded machine may leave the worker no sample in its engine in 2 s (load 13: 0 of 166)
        text = run("tools/profile_worker.py", "--cache-dir", out, "--vocab-size", VOCAB, "-B", 2, "-T", 128,
                   "--seconds", seconds, "--warmup", 0.2)
        samples = re.search(r"^all +([\d,]+)$", text, re.M)
        engine = re.search(r"^engine encode +([\d,]+) ", text, re.M)
        assert samples and engine, text
        if int(engine.group(1).replace(",", "")) > 0:
            break
    assert int(engine.group(1).replace(",", "")) > 0, text
    assert "M tokens/s meanwhile" in text


def test_coordinator_parts_times_the_live_coordinator_by_part(demo):
    out, _ = demo
    text = run("tools/bench/coordinator_parts.py", "--data", out / "base_data",
               "--tokenizer", out / "tokenizer" / "tokenizer.pkl", "-B", 2, "-T", 128, "--warmup", 5,
               "--batches", 300, "--rounds", 1)
    rows = {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^(.+?) {2,}([\d.]+)$", text, re.M)}
    assert rows["whole (all its threads)"] > 0 and rows["batches/s"] > 0, text
    for part in ("dispatch", "announce", "planner"):
        assert rows[part] > 0, (part, text)  # the coordinator's own parts, timed inside it
    assert {"batch check", "buffer runs", "poll"} <= set(rows), text  # cheap at B=2, T=128: may print 0.0
    assert rows["planner"] < rows["dispatch"] < rows["main thread"], text  # a part holds the parts it calls


@pytest.mark.slow  # 4 fresh processes with torch, each training a tiny model: 40 s
def test_bench_gpu_train_harness_on_cpu(demo, tmp_path, capsys, watchdog):
    text, got = bench("gpu_train", tmp_path, capsys, *on_demo(demo), "--corpus", "demo", "--device", "cpu",
                      "--quick", "--models", "tiny", "--workers", 1, "--steps", 4, "--warmup", 1)
    rows = {r["kind"]: r for r in got["rows"]}
    assert set(rows) == {"ideal", "shmloader", "nanochat", "thread"}
    for r in rows.values():
        assert r["steps"] == 4 and r["step_ms"] > 0 and r["next_ms_median"] >= 0 and "gpu_wait_share" not in r
    assert rows["shmloader"]["shmloader"] == str(REPO_ROOT)
    assert re.search(r"^tiny \(\d+M\) +shmloader \(drop-in\) +[\d.,]+ +[\d.]+x +-?[\d.]+% +- ", text, re.M), text


@pytest.mark.slow  # a measurement tool's tiny run, 4.6 CPU-s (its --help: test_bench_help_of_every_topic)
def test_bench_ring_slots(demo, tmp_path, capsys, watchdog):
    text, got = bench("ring_slots", tmp_path, capsys, *on_demo(demo), "--corpus", "demo", "--workers", 1,
                      "--slots", 2, 8, *TINY, "--seconds", 0.3)
    first, more = got["rows"]
    assert (first["n_slots"], more["n_slots"]) == (2, 8) and first["vs_first_rounds"] == [1.0]
    assert more["vs_first_rounds"] == [more["tokens_per_s"] / first["tokens_per_s"]] and more["tokens_per_s"] > 0
    assert re.search(r"^1 +8 +[\d.]+ M +[\d.]+x ", text, re.M), text


def test_bench_cuda_next_without_a_gpu_times_the_loader_alone(demo, tmp_path, capsys, watchdog):
    text, got = bench("cuda_next", tmp_path, capsys, *on_demo(demo), "--corpus", "demo", "--device", "cpu",
                      "--workers", 1, "--n", 3, "--pauses", 0, 0.001)
    assert list(got["rows"]) == ["next"] and set(got["rows"]["next"]) == {"0.0", "0.001"}
    assert all(v["thread_us"] > 0 for v in got["rows"]["next"].values()) and text.count("\nnext ") == 1, text


def test_gpu_check_help():
    text = run("tools/gpu_check.py", "--help")
    assert "--device" in text and "--workers" in text


@pytest.mark.slow  # every check of the GPU script, on the CPU: 10 s
def test_gpu_check_harness_on_cpu(demo):
    out, _ = demo
    text = run("tools/gpu_check.py", "--device", "cpu", "--out-dir", out, "--vocab-size", VOCAB,
               "--workers", 1, "--batches", 16, "--buffer-size", 32, "--seconds", 0.3, "--cost-batches", 3)
    for check in ("PASS  device 'cpu': 16/16", "PASS  bos_bestfit: 16/16", "PASS  positions: 32/32", "PASS  close",
                  "PASS  mixture: 16/16", "SKIP  staged", "all checks passed"):
        assert check in text, text


# ---------------------------------------------------------------- tools/inspect_batch.py

@pytest.fixture(scope="module")
def posdata(tmp_path_factory):
    """Position documents: each non-BOS token is its position in the stream; BOS is 0."""
    root = tmp_path_factory.mktemp("inspect")
    lengths = [5, 0, 12, 3, 9, 1, 7, 2, 11, 4] * 4
    corpus.write_shards(helpers.position_documents(lengths), root / "data", num_files=4, row_group_size=3)
    tok = root / "int_tokenizer.pkl"
    tok.write_bytes(pickle.dumps(helpers.IntTokenizer()))
    bos_positions, pos = set(), 0
    for n in lengths:
        bos_positions.add(pos)
        pos += n + 1
    return root, tok, bos_positions


def inspect_rows(text: str) -> list[tuple[int, list[int]]]:
    """(number of BOS, numbers shown) per printed row."""
    rows = []
    for m in re.finditer(r"^row \d+ \((\d+) BOS\): (.*)$", text, re.M):
        rows.append((int(m.group(1)), [int(t) for t in re.findall(r"\d+", m.group(2))]))
    return rows


def expected_rows(k: int, B: int, T: int, bos_positions) -> list[tuple[int, list[int]]]:
    start = k * (B * T + 1)
    rows = []
    for r in range(B):
        positions = range(start + r * T, start + r * T + T)
        rows.append((sum(p in bos_positions for p in positions), [p for p in positions if p not in bos_positions]))
    return rows


def inspect_args(posdata) -> list:
    root, tok, _ = posdata
    return ["--data", root / "data", "--tokenizer", tok, "-B", 2, "-T", 8, "--chars", 500]


@pytest.fixture(scope="module")
def shim_batch_2(posdata) -> str:
    """The checkout's shim, tools/inspect_batch.py, on batch 2 (run once for the two tests below)."""
    return run("tools/inspect_batch.py", *inspect_args(posdata), "--batch", 2)


def test_inspect_prints_rows_and_state_and_resumes(posdata, shim_batch_2, tmp_path):
    _, _, bos_positions = posdata
    common = ["tools/inspect_batch.py", *inspect_args(posdata)]
    text = shim_batch_2
    assert inspect_rows(text) == expected_rows(2, 2, 8, bos_positions)
    state = json.loads(text[text.index("state dict:") + len("state dict:"):])
    assert state["version"] == VERSION and state["shapes"] == [[0, 2, 8]] and state["batch"] == 3
    (tmp_path / "state.json").write_text(json.dumps(state))
    resumed = run(*common, "--batch", 0, "--resume-state", tmp_path / "state.json")
    assert inspect_rows(resumed) == expected_rows(3, 2, 8, bos_positions)


def test_inspect_bestfit_rows_start_with_bos(posdata):
    root, tok, _ = posdata
    text = run("tools/inspect_batch.py", "--data", root / "data", "--tokenizer", tok, "-B", 3, "-T", 8,
               "--packing", "bos_bestfit", "--batch", 1, "--bos-mark", "<B>")
    rows = re.findall(r"^row \d+ \(\d+ BOS\): (.*)$", text, re.M)
    assert len(rows) == 3 and all(r.startswith("<B>") for r in rows), text


def test_the_tools_run_from_the_package_outside_a_checkout(posdata, shim_batch_2, tmp_path, sp_model):
    """`python -m shmloader.tools.<name>` (what the console scripts run) from a directory that
    is not the checkout: the same batch as the checkout's shim; a SentencePiece model's batch
    decodes to the documents' text; each tool's --help."""
    _, _, bos_positions = posdata
    text = run("-m", "shmloader.tools.inspect_batch", *inspect_args(posdata), "--batch", 2, cwd=tmp_path)
    assert inspect_rows(text) == expected_rows(2, 2, 8, bos_positions)
    assert text == shim_batch_2
    docs = corpus.synthetic_texts(30, seed=2, mean_words=6)
    corpus.write_shards(docs, tmp_path / "text", num_files=2, row_group_size=5)
    text = run("-m", "shmloader.tools.inspect_batch", "--data", tmp_path / "text", "--tokenizer", sp_model,
               "-B", 1, "-T", 24, "--chars", 10000, "--bos-mark", "<B>", cwd=tmp_path)
    row = re.search(r"^row 0 \(\d+ BOS\): <B>(.*)$", text, re.M).group(1)
    first = next(d for d in docs if d)
    assert row.split("<B>")[0] in first.replace("\n", "\\n") and len(row) > 10, (row, first)
    for name in ("pretokenize", "inspect_batch", "plot_pipeline"):
        assert "usage:" in run("-m", f"shmloader.tools.{name}", "--help", cwd=tmp_path)


def test_the_tools_read_any_column_and_inspect_shuffles(posdata, tmp_path, capsys):
    """issue 51: neither tool had --column (a corpus in `content` failed with "pass column= naming
    it"), nor inspect_batch --shuffle/--seed: its batch is the loader's with those options, and
    pretokenize fills the entries a loader of that column reads (no miss)."""
    from tests import formats_data
    root, tok, _ = posdata
    docs = helpers.position_documents([5, 0, 12, 3, 9, 1, 7, 2, 11, 4] * 4)
    d = tmp_path / "content"
    for i in range(2):
        formats_data.write(str(d / f"shard_{i}.jsonl"), docs[i * 20:(i + 1) * 20], "jsonl", column="content")
    opts = dict(split="all", column="content", num_workers=1, device="cpu", timeout=60)
    text = run("-m", "shmloader.tools.inspect_batch", "--data", d, "--tokenizer", tok, "-B", 2, "-T", 8, "--chars",
               500, "--batch", 1, "--split", "all", "--column", "content", "--shuffle", "--seed", 3, "--workers", 1)
    with shmloader.ShmLoader(str(d), str(tok), 2, 8, shuffle=True, seed=3, **opts) as loader:
        x, _ = list(itertools.islice(loader, 2))[1]
    assert inspect_rows(text) == [(row.count(0), [v for v in row if v]) for row in x.tolist()]
    state = json.loads(text[text.index("state dict:") + len("state dict:"):])
    assert state["config"]["shuffle"] == "seed 3 window 256" and state["config"]["column"] == "content"
    cache = tmp_path / "cache"
    out = run("-m", "shmloader.tools.pretokenize", "--data", d, "--tokenizer", tok, "--cache-dir", cache,
              "--column", "content", "--workers", 1)
    assert "2 units of 1024 lines: 2 tokenized" in out, out  # JSON Lines: its units, not "row groups"
    with shmloader.ShmLoader(str(d), str(tok), 2, 8, cache_dir=str(cache), **opts) as loader:
        assert len(list(itertools.islice(loader, 8))) == 8
        stats = loader.stats()
    assert stats["cache_misses"] == 0 and stats["cache_hits"] > 0, stats
    from shmloader.tools import inspect_batch, pretokenize
    for main in (pretokenize.main, inspect_batch.parse_args):
        with pytest.raises(SystemExit):
            main(["--help"])
        usage = capsys.readouterr().out
        assert "--column" in usage and "parquet shards" not in usage
