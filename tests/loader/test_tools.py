"""Smoke tests of the demo and the tools, each run as a user runs it (a subprocess).
(What of them runs in this process: tests/unit/test_tools.py.)

The demo runs once with tiny settings (B=2, T=256, a 512-token tokenizer) into a module tmp
dir; bench and gpu_check (`--device cpu`) reuse that cached corpus. tools/inspect_batch.py reads
position documents through `helpers.IntTokenizer`, so the rows it prints are checked by
arithmetic, and resuming from the state it prints gives the next batch. About 30 s on 2 cores.
"""
from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys

import pytest

from shmloader.state import VERSION
from shmloader.demo import corpus
from tests import helpers
from tests.helpers import REPO_ROOT
from shmloader.demo import prepare_data

VOCAB = 512
TIMEOUT_S = 120


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


def test_bench_engine(demo):
    out, _ = demo
    pytest.importorskip("fastokens")
    text = run("tools/bench_engine.py", "--out-dir", out, "--vocab-size", VOCAB, "--rounds", 1,
               "--loader-s", 0.5)
    for line in ("tiktoken encode_to_numpy", "fastokens + sampled check", "sampled check cost",
                 "start check", "engine='fastokens'"):
        assert line in text, text


def test_bench_help():
    text = run("tools/bench.py", "--help")
    assert "--workers" in text and "--quick" in text and "--json" in text


def test_bench_locate_tiny_run(demo):
    out, _ = demo
    text = run("tools/bench_locate.py", "--cache-dir", out, "--vocab-size", VOCAB, "--batches", 30,
               "-B", 2, "-T", 64, "--raw-seconds", 0.3)
    assert "rank 1 locating batch 30 of rank 0's state" in text
    assert re.search(r"no cache \(tokenizing\) +\d+\.\d+ s +\d+ batches/s +\d+\.\d+ M tokens counted/s", text), text
    assert re.search(r"warm token cache +\d+\.\d+ s", text), text


def test_bench_tiny_run(demo, tmp_path):
    out, _ = demo
    text = run("tools/bench.py", "--cache-dir", out, "--vocab-size", VOCAB, "--workers", 1,
               "--batch-size", 2, "--seq-len", 128, "--seconds", 0.3, "--first-runs", 1,
               "--cost-batches", 3, "--cost-sleep-ms", 5, "--cost-busy-ms", 2, "--syscall-batches", 20,
               "--json", tmp_path / "b.json", "--chart", tmp_path / "b.png")
    assert "nanochat-style baseline" in text and "shmloader, 1 worker" in text and "targets:" in text
    assert "shmloader, 1 worker, best fit" in text and "best fit within 10% of concat" in text
    result = json.loads((tmp_path / "b.json").read_text())
    assert [(r["kind"], r["packing"], r["cache"]) for r in result["runs"]] == \
        [("baseline", "concat", None), ("shmloader", "concat", None), ("shmloader", "bos_bestfit", None),
         ("shmloader", "concat", "cold"), ("shmloader", "concat", "restart"), ("shmloader", "concat", "warm")]
    assert all("worker_tokenized" in r for r in result["runs"][1:])  # (this run is too short to cover an epoch)
    assert "warm token cache >= 20x cold" in text
    assert all(r["batches"] > 0 and r["tokens_per_s"] > 0 for r in result["runs"])
    assert 0 <= result["runs"][2]["cropped_fraction"] < 1
    assert result["raw"]["encode_to_numpy"]["tokens_per_s"] > 0
    # the ceiling of 1 worker: 1 bare engine process, measured in the same round for as long
    [bare] = result["bare"]
    assert bare["processes"] == 1 and bare["seconds"] == 0.3 and bare["per_process"][0] > 0
    assert result["runs"][1]["bare_tokens_per_s"] == bare["tokens_per_s"]
    eff = result["runs"][1]["tokens_per_s"] / bare["tokens_per_s"]
    assert re.search(rf"^shmloader, 1 worker +\S+ M +\S+x +{eff:.0%} ", text, re.M), text
    assert "1 single-thread process (no loader" in text
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # per corpus (the demo alone by default): each worker's busy share, next() after busy work
    # against a bare view after the same, the drop-ins in nanochat's loop
    [demo_corpus] = result["corpora"]
    assert demo_corpus["corpus"] == "demo" and demo_corpus["runs"] == result["runs"][:3]
    for r in result["runs"][1:3]:
        [share] = r["worker_busy_share"]
        assert 0 < share <= 1.5 and r["cost_busy_ms"] == 2
        assert r["next_after_busy_us_median"] > 0 and r["after_busy_floor_us_median"] > 0
    assert [(r["kind"], r["packing"], r["workers"]) for r in demo_corpus["dropin"]] == \
        [("dropin", "concat", 1), ("dropin", "bos_bestfit", 1)]
    assert [r["function"] for r in demo_corpus["dropin"]] == \
        ["tokenizing_distributed_data_loader_with_state", "tokenizing_distributed_data_loader_with_state_bos_bestfit"]
    assert all(r["trainer_cpu_us_per_batch"] > 0 and r["state_json_bytes"] > 0 for r in demo_corpus["dropin"])
    assert [b["processes"] for b in demo_corpus["bare"]] == [1]
    for line in ("each worker busy >= 90% on every corpus (demo), 1 worker, concat: demo ",
                 "loader >= 85% of 1 bare engine process in the same round on every corpus, concat: demo ",
                 "best-fit drop-in trainer CPU per batch <= 1.3x the concat drop-in's",
                 "next() after 2 ms of busy work <= 2x a bare torch.from_numpy(...).view(B, T)"):
        assert line in text, text
    assert re.search(r"^demo +shmloader, 1 worker +\S+ M +\S+x +\d+% +\d+% ", text, re.M), text
    again = run("tools/bench.py", "--from-json", tmp_path / "b.json", "--chart", tmp_path / "c.png")
    assert "targets:" in again and (tmp_path / "c.png").stat().st_size > 0
    assert "best-fit drop-in trainer CPU per batch" in again


def test_bench_first_batch_on_a_skewed_corpus_as_base_train(demo, tmp_path):
    """--first-batch-only on the skewed corpus (built into the cache dir): every evaluation next to
    nanochat's own loader, the memory left resident between evaluations with the last loader kept."""
    out, _ = demo
    text = run("tools/bench.py", "--cache-dir", out, "--vocab-size", VOCAB, "--corpus", "skewed", "--skewed-docs", 200,
               "--corpus-files", 2, "--first-batch-only", "--workers", 1, "--packings", "concat",
               "--batch-size", 2, "--seq-len", 128, "--first-batch-loaders", 2, "--first-batch-take", 2,
               "--first-batch-gap-ms", 50, "--json", tmp_path / "f.json")
    result = json.loads((tmp_path / "f.json").read_text())
    assert len(list((out / "skewed_corpus" / "base_data").glob("*.parquet"))) == 2
    [entry] = result["corpora"]
    fb = entry["first_batch"]
    assert entry["corpus"] == "skewed" and fb == result["first_batch"] and fb["keep"] and fb["gap_ms"] == 50
    base, ours = fb["rows"]
    assert (base["kind"], ours["kind"]) == ("fb_baseline", "fb_shmloader")
    assert len(ours["per_evaluation_ms"]) == 2 and len(ours["vs_nanochat_per_evaluation"]) == 2
    [memory] = ours["memory_between_rounds"]
    assert len(memory) == 2 and all(m["processes"] >= 4 for m in memory)  # trainer, forkserver, coordinator, worker
    assert base["processes_between"] == 1 and ours["rss_between_mib_median"] > base["rss_between_mib_median"] > 0
    assert "on the skewed corpus" in text and "MiB between evals" in text
    assert "concat (skewed), 1 worker: first val batch <= nanochat's own loader's at every evaluation" in text


@pytest.mark.slow  # ~40 s: two corpora built and measured, 10 fresh processes
def test_bench_two_built_corpora_side_by_side(demo, tmp_path):
    out, _ = demo
    text = run("tools/bench.py", "--cache-dir", out, "--vocab-size", VOCAB, "--corpus", "nanochat", "skewed",
               "--nanochat-docs", 1100, "--skewed-docs", 200, "--corpus-files", 2, "--workers", 1,
               "--packings", "concat", "--no-cache-runs", "--syscall-batches", 0, "--no-dropin-runs",
               "--first-batch", "--first-batch-loaders", 2, "--first-batch-take", 1, "--first-batch-gap-ms", 0,
               "--batch-size", 2, "--seq-len", 128, "--seconds", 0.3, "--first-runs", 1, "--cost-batches", 3,
               "--cost-sleep-ms", 5, "--cost-busy-ms", 2, "--json", tmp_path / "n.json")
    result = json.loads((tmp_path / "n.json").read_text())
    assert [e["corpus"] for e in result["corpora"]] == ["nanochat", "skewed"]
    assert result["config"]["data"] == result["corpora"][0]["data"] and result["runs"] == result["corpora"][0]["runs"]
    for e in result["corpora"]:
        assert [(r["kind"], r["corpus"]) for r in e["runs"]] == [("baseline", e["corpus"]), ("shmloader", e["corpus"])]
        assert e["runs"][1]["bare_tokens_per_s"] == e["bare"][0]["tokens_per_s"] > 0
        assert len(e["runs"][1]["worker_busy_share"]) == 1 and e["first_batch"]["corpus"] == e["corpus"]
        assert e["dropin"] == []
    assert re.search(r"each worker busy >= 90% on every corpus \(nanochat, skewed\), 1 worker, concat: nanochat \d+%; "
                     r"skewed \d+%; worst \d+%", text), text
    assert "on the nanochat corpus" in text and "on the skewed corpus" in text


@pytest.mark.slow  # ~50 s: 14 fresh processes; test_bench_tiny_run runs the bench end to end by default
def test_bench_repeat_interleaves_rounds_and_reports_medians(demo, tmp_path):
    out, _ = demo
    text = run("tools/bench.py", "--cache-dir", out, "--vocab-size", VOCAB, "--workers", 1, "--repeat", 3,
               "--packings", "concat", "--batch-size", 2, "--seq-len", 128,
               "--seconds", 0.3, "--first-runs", 1, "--cost-batches", 3, "--cost-sleep-ms", 5,
               "--json", tmp_path / "r.json")
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["rounds"] == 3 and [(r["kind"], r["cache"]) for r in result["runs"]] == \
        [("baseline", None), ("shmloader", None), ("shmloader", "cold"), ("shmloader", "restart"),
         ("shmloader", "warm")]
    base, shm = result["runs"][:2]
    assert len(shm["tokens_per_s_rounds"]) == 3 and shm["tokens_per_s"] == sorted(shm["tokens_per_s_rounds"])[1]
    ratios = shm["vs_base_rounds"]
    row = next(ln for ln in text.splitlines() if ln.startswith("shmloader, 1 worker "))
    assert len(ratios) == 3 and f" {sorted(ratios)[1]:.2f}x " in row
    assert "3 rounds" in text and "shmloader, 1 worker: " + ", ".join(f"{x:.2f}x" for x in ratios) in text
    # efficiency: each round's loader over that round's bare process, the median of those ratios
    bare = [rnd[0]["tokens_per_s"] for rnd in result["bare_rounds"]]
    assert len(bare) == 3 and all(len(rnd) == 1 and rnd[0]["processes"] == 1 for rnd in result["bare_rounds"])
    effs = [t / b for t, b in zip(shm["tokens_per_s_rounds"], bare)]
    assert shm["efficiency_rounds"] == pytest.approx(effs)
    assert re.search(rf" {sorted(effs)[1]:.0%} ", row), row


@pytest.mark.slow  # ~22 s: two checkouts side by side (the default suite's 10 minutes)
def test_bench_compare_runs_both_checkouts_and_counts_worker_cpu(demo, tmp_path):
    """--compare DIR: each shmloader throughput row also with DIR's package, interleaved; the
    workers' CPU over the window gives the CPU efficiency; the engine's batch rate is measured."""
    out, _ = demo
    text = run("tools/bench.py", "--cache-dir", out, "--vocab-size", VOCAB, "--workers", 1, "--packings", "concat",
               "--no-cache-runs", "--no-dropin-runs", "--syscall-batches", 0, "--compare", REPO_ROOT, "--batch-size", 2, "--seq-len", 128, "--seconds", 0.3,
               "--first-runs", 1, "--cost-batches", 3, "--cost-sleep-ms", 5, "--json", tmp_path / "c.json")
    result = json.loads((tmp_path / "c.json").read_text())
    assert [(r["kind"], r["label"]) for r in result["runs"]] == \
        [("baseline", None), ("shmloader", "before"), ("shmloader", "this checkout")]
    assert all(r["worker_cpu_s"] > 0 for r in result["runs"][1:]) and result["runs"][0]["worker_cpu_s"] is None
    assert "shmloader, 1 worker (before)" in text and "CPU eff/worker" in text
    assert all(r["coordinator_cpu_s"] >= 0 for r in result["runs"][1:]) and result["runs"][0]["coordinator_cpu_s"] is None
    assert re.search(r"where the \d+ cores went with 1 worker: workers \d+%, coordinator \d+%, training process "
                     r"\d+%, the rest \(idle, kernel, other processes\) -?\d+%", text), text
    assert "per worker CPU second" in text
    if result["engine"] == "fastokens":
        assert result["raw"]["fastokens batch"]["tokens_per_s"] > 0 and "as a worker calls it (batch)" in text


def test_profile_worker_samples_a_running_worker(demo):
    out, _ = demo
    if subprocess.run([sys.executable, "-c", "import shutil, sys, os; sys.exit(shutil.which('py-spy', path="
                       "os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH']) is None)"]).returncode:
        pytest.skip("needs py-spy (the dev extras install it)")
    text = run("tools/profile_worker.py", "--cache-dir", out, "--vocab-size", VOCAB, "-B", 2, "-T", 128,
               "--seconds", 2, "--warmup", 0.2)
    samples = re.search(r"^all +([\d,]+)$", text, re.M)
    engine = re.search(r"^engine encode +([\d,]+) ", text, re.M)
    assert samples and engine and int(engine.group(1).replace(",", "")) > 0, text
    assert "M tokens/s meanwhile" in text


def test_gpu_check_help():
    text = run("tools/gpu_check.py", "--help")
    assert "--device" in text and "--workers" in text


def test_gpu_check_harness_on_cpu(demo):
    out, _ = demo
    text = run("tools/gpu_check.py", "--device", "cpu", "--out-dir", out, "--vocab-size", VOCAB,
               "--workers", 1, "--batches", 16, "--buffer-size", 32, "--seconds", 0.3, "--cost-batches", 3)
    for check in ("PASS  device 'cpu': 16/16", "PASS  bos_bestfit: 16/16", "PASS  close", "all checks passed"):
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


def test_inspect_prints_rows_and_state_and_resumes(posdata, tmp_path):
    root, tok, bos_positions = posdata
    common = ["tools/inspect_batch.py", "--data", root / "data", "--tokenizer", tok, "-B", 2, "-T", 8, "--chars", 500]
    text = run(*common, "--batch", 2)
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
