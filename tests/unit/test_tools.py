"""The demo's data preparation, tools/profile_worker.py's sorting of samples and the parts of
tools/bench/, in this process: the demo never overwrites data it did not write and says in one
line what to install without rustbpe, a py-spy profile's samples are sorted by the worker code
they are in, the bench's corpora are built once, busy work never sleeps, memory is counted over a
process tree, base_train's evaluations keep the last val loader until the next is built, rounds
become medians and per-round ratios by arithmetic, a results file says what, where, when and how,
another checkout is put first on a child's path, and tools/bench/base_train.py patches only
nanochat's loader import and times the val loader without changing its batches, and
tools/plot_pipeline.py plots one loader of a log that holds several. (The tools run as a user runs
them: tests/loader/test_tools.py.)
"""
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from shmloader.data.shuffle import WINDOW
from shmloader.demo import corpus, prepare_data
from shmloader.tools import inspect_batch
from tests.helpers import REPO_ROOT, read_texts, row_group_sizes
from tools import plot_pipeline
from tools.bench import children, corpora, evaluations, measure, results, scaling, step_loop, throughput, trainer

VOCAB = 512


def test_demo_never_overwrites_data_it_did_not_write(tmp_path):
    theirs = tmp_path / "base_data" / "shard_00000.parquet"  # e.g. --out-dir ~/.cache/nanochat
    theirs.parent.mkdir()
    theirs.write_bytes(b"not ours")
    with pytest.raises(ValueError, match="did not write"):
        prepare_data(tmp_path, VOCAB, log=lambda m: None)
    assert theirs.read_bytes() == b"not ours"


def test_the_demo_without_rustbpe_says_in_one_line_what_to_install(tmp_path, monkeypatch, capsys):
    """rustbpe is the demo extra's: without it the demo says so in one line (exit 2), before it
    builds anything, and training a tokenizer raises an ImportError saying what to install."""
    from shmloader.demo import main

    monkeypatch.setitem(sys.modules, "rustbpe", None)  # `import rustbpe` raises ImportError: not installed
    assert main(["--out-dir", str(tmp_path / "demo")]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == ["demo: training a BPE tokenizer needs rustbpe, which is not installed: "
                                "pip install shmloader[demo]"] and out == ""
    assert not (tmp_path / "demo").exists()
    with pytest.raises(ImportError, match=r"pip install shmloader\[demo\]"):
        corpus.train_tokenizer(["some text"], VOCAB)


def test_profile_worker_sorts_samples_by_the_worker_code_they_are_in():
    from tools import profile_worker

    top = "worker_main (shmloader/procs/worker.py:67);_loop (shmloader/procs/worker.py:114)"
    tok = top + ";_tokenize (shmloader/procs/worker.py:250);encode_texts (shmloader/procs/worker.py:280)"
    raw = "\n".join([
        f"{tok};Engines.encode_batch (shmloader/data/engine.py:331);_fastokens.<locals>.batch (shmloader/data/engine.py:161);"
        f"pcre2_match_8 (fastokens/_native.abi3.so) 7",
        f"{tok};Engines.encode_batch (shmloader/data/engine.py:333);Check.batch (shmloader/data/engine.py:196);"
        f"Check._compare (shmloader/data/engine.py:210);<lambda> (shmloader/data/tokenizer.py:178) 2",
        f"{top};_tokenize (shmloader/procs/worker.py:245);Reader.read_texts (shmloader/data/source.py:214);"
        f"Reader._read_column (shmloader/data/source.py:234);read_row_group (pyarrow/parquet/core.py:489);"
        f"ZSTD_decompressSequences_bmi2 (pyarrow/libarrow.so) 3",
        f"{top};_tokenize (shmloader/procs/worker.py:245);Reader.read_texts (shmloader/data/source.py:216);"
        f"unicode_decode_utf8 (libpython3.11.so) 1",
        f"{top};_tokenize (shmloader/procs/worker.py:245);Reader.read_texts (shmloader/data/source.py:216);"
        f"Parquet._read (shmloader/data/formats/parquet.py:90);read_row_group (pyarrow/parquet/core.py:489);"
        f"ZSTD_decompressSequences_bmi2 (pyarrow/libarrow.so) 2",
        f"{top};_tokenize (shmloader/procs/worker.py:245);Reader.read_texts (shmloader/data/source.py:216);"
        f"docs_of (shmloader/data/formats/column.py:60);to_pylist (pyarrow/lib.so) 3",
        f"{tok};_with_bos (shmloader/procs/worker.py:292) 4",
        f"{top};_handle (shmloader/procs/worker.py:160);write (shmloader/packing/concat.py:169) 5",
        f"{top};Listener.wait (shmloader/ipc/protocol.py:172);poll (libc.so.6) 6",
        f"{tok} 8",
    ])
    parts, total = profile_worker.classify(raw)
    assert total == 41 and parts == {  # reading: the Reader's frames, or a format's (data/formats/)
        "engine encode": 7, "sampled check (tiktoken) and its bookkeeping": 2, "reading: zstd decompression": 5,
        "reading: the rest (decode, to_pylist)": 4, "inserting BOS": 4, "copies into ring slots": 5,
        "messages and polls": 6, "other": 8}
    assert "engine encode" in profile_worker.report(parts, total) and "17.1%" in profile_worker.report(parts, total)


def test_profile_worker_counts_the_coordinators_samples_by_its_innermost_function():
    from tools import profile_worker

    top = "coordinator_main (shmloader/procs/coordinator.py:374);_Coordinator.run (shmloader/procs/coordinator.py:152)"
    raw = "\n".join([
        f"{top};_Coordinator._dispatch (shmloader/procs/coordinator.py:349);BestFitMode.orders "
        f"(shmloader/packing/bestfit.py:320);PieceTable.runs (shmloader/packing/bestfit.py:155);searchsorted (numpy) 5",
        f"{top};_Coordinator._dispatch (shmloader/procs/coordinator.py:349);BestFitMode.orders "
        f"(shmloader/packing/bestfit.py:320);PieceTable.runs (shmloader/packing/bestfit.py:155) 2",
        f"{top};Listener.wait (shmloader/ipc/protocol.py:274);poll (libc.so.6) 3",
        "_bootstrap (threading.py:1002);_run (threading.py:975) 4",
    ])
    parts, total = profile_worker.functions(raw)
    assert total == 14 and parts == {"PieceTable.runs bestfit.py:155": 7, "Listener.wait protocol.py:274": 3,
                                     "(outside shmloader)": 4}
    text = profile_worker.report_functions(parts, total, top=2)
    assert "PieceTable.runs bestfit.py:155" in text and "50.0%" in text and "(outside shmloader)" in text
    assert "Listener.wait" not in text, "only the `top` functions are listed"


# ---------------------------------------------------------------- tools/bench: corpora, measurements

def test_bench_corpus_options_parse(tmp_path):
    args = throughput.parse_args([])
    assert args.corpus == ["demo"] and args.workers == [1, 2] and args.seconds == 10 and args.compare is None
    assert args.json == REPO_ROOT / "docs" / "bench" / "throughput.json"  # the topic's results file
    args = throughput.parse_args(["--corpus", "skewed", "demo", "skewed", "nanochat", "--quick", "--nanochat-docs",
                                  "1100", "--skewed-docs", "200", "--corpus-files", "2"])
    assert args.corpus == ["skewed", "demo", "nanochat"] and args.seconds == 3  # each once, in the order given
    assert (args.nanochat_docs, args.skewed_docs, args.corpus_files) == (1100, 200, 2)
    assert throughput.parse_args(["--data", str(tmp_path), "--tokenizer", "t.pkl"]).corpus == []
    assert trainer.parse_args(["--corpus", "nanochat"]).corpus == ["nanochat"]
    for bad in (["--data", str(tmp_path), "--corpus", "demo"], ["--data", str(tmp_path)], ["--corpus", "web"],
                ["--corpus-files", "1"], ["--workers", "0"], ["--compare", str(tmp_path)]):
        with pytest.raises(SystemExit):
            throughput.parse_args(bad)


def test_bench_prepare_corpus_builds_once_and_refuses_foreign_shards(tmp_path):
    logged = []
    data = corpora.prepare_corpus("skewed", tmp_path, 200, 2, log=logged.append)
    assert data == tmp_path / "skewed_corpus" / "base_data" and len(list(data.glob("*.parquet"))) == 2
    docs, sizes = corpus.skewed_corpus(200)
    assert read_texts(sorted(data.glob("*.parquet"))) == docs
    assert sum(len(row_group_sizes(p)) for p in data.glob("*.parquet")) == len(sizes)
    assert any("writing the skewed corpus" in m for m in logged)
    assert corpora.split_files(str(data), "val") == [str(sorted(data.glob("*.parquet"))[-1])]
    logged.clear()
    assert corpora.prepare_corpus("skewed", tmp_path, 200, 2, log=logged.append) == data and logged == []
    corpora.prepare_corpus("skewed", tmp_path, 201, 2, log=logged.append)  # another size: rebuilt
    assert logged and sum(pq.ParquetFile(p).metadata.num_rows for p in data.glob("*.parquet")) == 201
    theirs = tmp_path / "other" / "nanochat_corpus" / "base_data" / "shard_00000.parquet"
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(b"not ours")
    with pytest.raises(ValueError, match="did not write"):
        corpora.prepare_corpus("nanochat", tmp_path / "other", 1100, 2, log=logged.append)
    assert theirs.read_bytes() == b"not ours"


def test_bench_busy_work_spins_without_sleeping():
    import resource

    import numpy as np

    buf = np.ones(1 << 17)
    r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
    measure.busy_work(0.05, buf)
    r1, wall = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter() - t0
    assert wall >= 0.05 and buf[0] > 2  # numpy passes over the buffer
    # never off the CPU of its own accord (a sleep or a blocking call is a voluntary switch;
    # a shared machine may still preempt it)
    assert r1.ru_nvcsw == r0.ru_nvcsw and r1.ru_utime > r0.ru_utime


def test_bench_tree_memory_counts_this_process_and_its_children():
    alone = measure.tree_memory()
    assert alone["processes"] >= 1 and alone["rss_mib"] >= alone["trainer_rss_mib"] > 0
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for _ in range(50):  # until the child has its interpreter
            with_child = measure.tree_memory()
            if with_child["rss_mib"] > alone["rss_mib"] + 1:
                break
            time.sleep(0.05)
        assert with_child["processes"] == alone["processes"] + 1 and with_child["rss_mib"] > alone["rss_mib"]
    finally:
        child.kill()
        child.wait()


def test_bench_evaluations_keep_the_last_val_loader_until_the_next_is_built():
    events = []

    def make(name):
        def build():
            k = sum(e[:2] == ("built", name) for e in events)
            events.append(("built", name, k))

            def gen():
                try:
                    while True:
                        yield k
                finally:
                    events.append(("closed", name, k))
            return gen()
        return build

    out = evaluations.evaluations(make("train"), make("val"), 3, 2, gap_s=0, step_s=0)
    # base_train: the train loader first; val loader k is dropped when k+1 is assigned over it
    assert events == [("built", "train", 0), ("built", "val", 0), ("built", "val", 1), ("closed", "val", 0),
                      ("built", "val", 2), ("closed", "val", 1), ("closed", "val", 2), ("closed", "train", 0)]
    assert len(out["per_evaluation_ms"]) == 3 and len(out["memory_between"]) == 3
    assert all(m["processes"] >= 1 and m["rss_mib"] > 0 for m in out["memory_between"])


# ---------------------------------------------------------------- tools/bench: rounds into rows

def _row(kind, workers, tps, **kw):
    return dict(kind=kind, workers=workers, packing="concat", label=None, tokens_per_s=tps, **kw)


def test_bench_throughput_rounds_become_the_median_round_and_per_round_ratios():
    def one(base, bare1, shm):  # a round: the baseline, 1 bare process, 1 worker
        return [_row("baseline", None, base), _row("bare", 1, bare1, processes=1, engine="fastokens"),
                _row("shmloader", 1, shm, wall_s=2.0, worker_cpu_s=1.0, worker_busy_share=[0.5])]

    got = throughput.summarise([one(1.0, 10.0, 4.0), one(2.0, 10.0, 9.0), one(1.0, 20.0, 6.0)])
    base, shm = got["rows"]
    assert [b["tokens_per_s"] for b in got["bare"]] == [10.0] and got["bare"][0]["tokens_per_s_rounds"] == [10, 10, 20]
    assert shm["tokens_per_s"] == 6.0 and shm["tokens_per_s_rounds"] == [4.0, 9.0, 6.0]  # the median round
    assert shm["vs_base_rounds"] == [4.0, 4.5, 6.0] and throughput.ratio(shm, "vs_base") == 4.5
    assert shm["of_bare_rounds"] == [0.4, 0.9, 0.3] and throughput.ratio(shm, "of_bare") == 0.4
    # tokens per worker CPU second (tokens/s x 2 s / 1 CPU s) over one bare process's tokens/s
    assert shm["cpu_of_bare_rounds"] == [0.8, 1.8, 0.6]
    assert base["vs_base_rounds"] == [1.0, 1.0, 1.0] and "of_bare_rounds" not in base


def test_bench_evaluations_compare_every_evaluation_with_nanochats_own_loader():
    mem = lambda rss: {"processes": 2, "rss_mib": rss, "pss_mib": rss / 2, "trainer_rss_mib": 100.0}  # noqa: E731
    rnd = lambda base, ours: [  # noqa: E731
        dict(kind="baseline", packing="bos_bestfit", workers=None, label=None, per_evaluation_ms=base,
             train_first_ms=base[0] / 5, memory_between=[mem(300.0)] * len(base)),
        dict(kind="shmloader", packing="bos_bestfit", workers=2, label=None, per_evaluation_ms=ours,
             train_first_ms=ours[0], memory_between=[mem(600.0), mem(700.0)])]
    base, ours = evaluations.summarise([rnd([300.0, 260.0], [700.0, 250.0]), rnd([500.0, 240.0], [100.0, 250.0])])
    assert base["train_first_ms"] == 80.0 and ours["train_first_ms"] == 400.0 and ours["vs_nanochat_train_first"] == 5.0
    assert ours["train_first_ms_rounds"] == [700.0, 100.0]
    assert ours["per_evaluation_ms"] == [400.0, 250.0] and base["per_evaluation_ms"] == [400.0, 250.0]
    assert ours["vs_nanochat_per_evaluation"] == [1.0, 1.0] and ours["per_evaluation_ms_rounds"][1] == [100.0, 250.0]
    assert ours["rss_between_mib_median"] == 650.0 and ours["pss_between_mib_median"] == 325.0
    assert base["rss_between_mib_median"] == 300.0 and ours["processes_between"] == 2


def test_bench_trainer_row_is_the_round_with_the_median_ratio_after_busy_work():
    us = lambda m: {"median": m, "mean": m}  # noqa: E731
    cost = lambda after, floor: dict(kind="cost", packing="concat", after_busy_us=us(after),  # noqa: E731
                                     after_busy_floor_us=us(floor))
    dropin = lambda cpu: dict(kind="dropin", packing="concat", trainer_cpu_us_per_batch=cpu)  # noqa: E731
    got = trainer.summarise([[cost(300, 100), dropin(90)], [cost(100, 100), dropin(70)], [cost(300, 200), dropin(80)]])
    [c], [d] = got["costs"], got["dropins"]
    assert c["after_busy_ratio_rounds"] == [3.0, 1.0, 1.5] and c["after_busy_ratio"] == 1.5
    assert d["trainer_cpu_us_per_batch"] == 80 and d["trainer_cpu_us_per_batch_rounds"] == [90, 70, 80]


def test_bench_step_loop_pools_every_rounds_pairs_and_says_what_it_resolves():
    rnd = lambda ratios: [dict(kind="shmloader", vs_ideal=sorted(ratios)[len(ratios) // 2], pair_ratios=ratios)]  # noqa: E731
    rounds = [rnd([1.0, 1.2, 0.9]), rnd([1.1, 1.3, 1.05]), rnd([0.8, 1.02, 0.95])]
    [row] = step_loop.summarise(rounds)
    assert row["vs_ideal"] == 1.0 and row["vs_ideal_rounds"] == [1.0, 1.1, 0.95]  # the median round
    assert sorted(row["pair_ratios_all"]) == sorted([1.0, 1.2, 0.9, 1.1, 1.3, 1.05, 0.8, 1.02, 0.95])
    assert row["vs_ideal_pooled"] == 1.02
    lo, hi = row["vs_ideal_interval"]
    assert lo <= 1.02 <= hi and lo < hi


def test_bench_median_interval_narrows_with_samples_and_is_made_again_from_them():
    import random

    rng = random.Random(1)
    few, many = ([rng.gauss(1.0, 0.15) for _ in range(n)] for n in (32, 2048))
    width = lambda xs: (lambda lo, hi: hi - lo)(*results.median_interval(xs))  # noqa: E731
    assert width(many) < width(few) / 4, "the interval shrinks as 1/sqrt(n)"
    assert results.median_interval(few) == results.median_interval(few), "seeded: the same samples, the same interval"
    lo, hi = results.median_interval(many)
    assert lo < 1.0 < hi and hi - lo < 0.03


def test_bench_scaling_caps_worker_counts_by_the_cores_and_compares_cpu_seconds(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    args = scaling.parse_args([])
    assert args.workers == [1, 2, 4, 8] and (args.batch_size, args.corpus) == (32, ["nanochat"])
    assert scaling.parse_args(["--most-per-core", "8"]).workers == [1, 2, 4, 8, 14]
    # 8 bare processes on 2 cores: each 1 M tokens/s but 4 M per CPU second; the loader's workers
    # read 6 M tokens/s with 2 CPU seconds a second: 3 M per CPU second, 75% of a bare one's
    rnd = [_row("baseline", None, 1.0), _row("bare", 8, 8.0, tokens_per_cpu_s=4.0),
           _row("shmloader", 8, 6.0, wall_s=2.0, worker_cpu_s=4.0)]
    scaling.per_cpu(rnd)
    assert rnd[2]["cpu_of_bare_cpu"] == 0.75


# ---------------------------------------------------------------- tools/bench: results, checkouts

def test_bench_results_file_says_what_where_when_and_how(tmp_path):
    run = results.write(tmp_path / "t.json", "throughput", results.begin(), {"rows": [1]}, ["--quick"])
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved == {"topic": "throughput", "runs": [run]} and run["rows"] == [1]
    assert run["command"].startswith("python ") and run["command"].endswith(" --quick")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", run["date"])
    assert re.fullmatch(r"[0-9a-f]{7,}(\+changes)?", run["commit"] or "")
    assert run["machine"]["cores"] >= 1 and run["machine"]["python"] and run["machine"]["load_average"]
    assert results.table(("a", "bb"), [("x", 1), ("yyy", 22)]).splitlines() == ["a    bb", "-------", "x     1",
                                                                                "yyy  22"]


def test_bench_compare_puts_the_other_checkouts_shmloader_first(tmp_path):
    (tmp_path / "shmloader").mkdir()
    with children.checkouts(tmp_path) as (before, ours):
        assert (before.label, ours.label) == ("before", "this checkout") and ours.path == str(REPO_ROOT)
        assert os.listdir(before.path) == ["shmloader"]  # its tools/ stays out of the way of this checkout's
        assert os.path.realpath(os.path.join(before.path, "shmloader")) == str(tmp_path / "shmloader")
        path = children.env(before)["PYTHONPATH"].split(os.pathsep)
        assert path[:2] == [before.path, str(REPO_ROOT)] and children.env(before)["PYTHONSAFEPATH"] == "1"
        assert "shmloader" not in os.listdir(before.cwd)
    with children.checkouts(None) as [alone]:
        assert alone.label is None and alone.path == alone.root == str(REPO_ROOT)


# ---------------------------------------------------------------- tools/bench/base_train.py

def test_base_train_patches_only_the_loader_import_and_times_the_val_loader(tmp_path, capsys):
    from tools.bench import base_train as evals

    checkout = tmp_path / "nanochat"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "base_train.py").write_text(f"import time\n{evals.IMPORT}\nx = 1\n{evals.BUILD}\ny = 2\n")
    (checkout / ".git").mkdir()
    own = (evals.patched(checkout, tmp_path / "own", "nanochat") / "scripts" / "base_train.py").read_text()
    shm = (evals.patched(checkout, tmp_path / "shm", "shmloader") / "scripts" / "base_train.py").read_text()
    assert evals.IMPORT in own and evals.IMPORT not in shm
    assert evals.IMPORT.replace("nanochat.dataloader", "shmloader.nanochat") in shm
    assert own.replace(evals.IMPORT, "") == shm.replace(evals.IMPORT.replace("nanochat.dataloader", "shmloader.nanochat"), "")
    assert not (tmp_path / "own" / ".git").exists()
    # the wrapper yields the loader's batches unchanged and prints the time to the first one
    scope = {"time": time, "build_val_loader": lambda: iter([10, 11, 12])}
    exec(evals.TIMER, scope)
    gen = scope["build_val_loader"]()
    assert capsys.readouterr().out == ""  # nothing read before the first next(), as in the script
    assert list(gen) == [10, 11, 12]
    assert re.fullmatch(r"FIRSTVAL [\d.]+ ms\n", capsys.readouterr().out)
    (checkout / "scripts" / "base_train.py").write_text("import time\n")
    with pytest.raises(SystemExit, match="patch it by hand"):
        evals.patched(checkout, tmp_path / "other", "shmloader")
    with pytest.raises(SystemExit, match="no scripts/base_train.py"):
        evals.patched(tmp_path / "bare", tmp_path / "again", "shmloader")


def _interval(batch, interval_s, tokens_per_s, loader=None):
    return (f"batch {batch}: shmloader interval {interval_s} s: {tokens_per_s} tokens/s delivered, wait share 1.0% "
            f"(last wait 0.001 s), ring 3/8 ready; epoch 1, 0.1 s waited in all, engines object | object"
            + (f"; loader {loader}" if loader else ""))


def _start(seconds, loader):
    return (f"batch 1: shmloader start-up: the first batch came {seconds} s after the loader was made (0.10 s of it "
            f"waited in next()), 2 workers; the interval lines count from here; loader {loader}")


def test_plot_pipeline_plots_one_loader_of_a_log_of_several(tmp_path, capsys):
    """A train and a val loader logging every 4 batches to one log: their lines interleave and
    `--every` cannot tell them apart (the tool mixed the val loader's lines into the train
    timeline). Each line names its loader; the tool plots the first, or `--loader` (an id or a
    split), and says which the log holds."""
    log = tmp_path / "train.log"
    log.write_text("\n".join([
        "step 1 loss 9.1",
        _start("2.00", "77-1 (train)"), _interval(4, 1.0, 1000, "77-1 (train)"),
        _start("0.50", "77-2 (val)"), _interval(4, 0.2, 500, "77-2 (val)"),
        _interval(8, 1.5, 2000, "77-1 (train)"), _interval(8, 0.3, 600, "77-2 (val)"),
        _interval(12, 2.0, 3000, "77-1 (train)")]) + "\n")
    lines = log.read_text().splitlines()
    assert plot_pipeline.loaders(lines) == {"77-1 (train)": 4, "77-2 (val)": 3}
    start_up, points = plot_pipeline.parse(lines, loader="77-1 (train)")
    assert start_up == 2.0 and [(p.batch, p.at_s, p.tokens_per_s) for p in points] == \
        [(4, 3.0, 1000), (8, 4.5, 2000), (12, 6.5, 3000)]
    start_up, points = plot_pipeline.parse(lines, loader="77-2 (val)")
    assert start_up == 0.5 and [(p.batch, p.at_s) for p in points] == [(4, 0.7), (8, 1.0)]

    def table(*args):
        assert plot_pipeline.main(["--log", str(log), "--no-plot", *args]) == 0
        out, err = capsys.readouterr()
        return [line.split()[:3] for line in out.splitlines()[2:]], err

    rows, err = table()
    assert rows == [["4", "3.0", "1,000"], ["8", "4.5", "2,000"], ["12", "6.5", "3,000"]], rows
    assert "the log holds 2 loaders (77-1 (train): 4 lines, 77-2 (val): 3 lines); plotting 77-1 (train)" in err, err
    assert table("--loader", "val")[0] == table("--loader", "77-2")[0] == [["4", "0.7", "500"], ["8", "1.0", "600"]]
    # ranks in other containers may share a pid: a loader is its whole name
    ranks = {"9-1 (val, rank 1 of 2)": 2, "9-1 (train, rank 0 of 2)": 5, "9-1 (train, rank 1 of 2)": 5}
    assert plot_pipeline.pick(ranks, "train") == "9-1 (train, rank 0 of 2)"
    assert plot_pipeline.pick(ranks, "9-1 (train, rank 1 of 2)") == "9-1 (train, rank 1 of 2)"
    assert plot_pipeline.pick(ranks, "9-1") == "9-1 (val, rank 1 of 2)"
    assert plot_pipeline.main(["--log", str(log), "--no-plot", "--loader", "77-3"]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "no loader '77-3' in the log; it holds 77-1 (train)" in err, err


def test_plot_pipeline_reads_a_log_whose_lines_name_no_loader(tmp_path, capsys):
    """A log from a shmloader before the lines named their loader is one loader's, as before."""
    log = tmp_path / "old.log"
    log.write_text(_interval(4, 1.0, 1000) + "\n" + _interval(8, 1.5, 2000) + "\n")
    assert plot_pipeline.main(["--log", str(log), "--no-plot"]) == 0
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["4", "8"] and err == "", (out, err)


def test_plot_pipeline_without_its_log_says_so_in_one_line(tmp_path):
    """A missing log file: one line on stderr and exit code 2, not a traceback."""
    gone = tmp_path / "no_such.log"
    proc = subprocess.run([sys.executable, "tools/plot_pipeline.py", "--log", str(gone), "--no-plot"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr == f"plot_pipeline: cannot read the log {gone}: No such file or directory; give a log file " \
                          f"holding shmloader's log_every lines\n", proc.stderr


def test_each_console_script_is_a_package_tools_main_and_each_shim_calls_it():
    """setup.cfg's console scripts name `shmloader.tools.<name>:main`; tools/<name>.py in a
    checkout is that main; the plot extra brings matplotlib."""
    import configparser
    import importlib

    cfg = configparser.ConfigParser()
    cfg.read(REPO_ROOT / "setup.cfg")
    scripts = dict(line.split(" = ") for line in cfg["options.entry_points"]["console_scripts"].split("\n") if line)
    assert set(scripts) == {"shmloader-pretokenize", "shmloader-inspect-batch", "shmloader-plot-pipeline"}
    for script, target in scripts.items():
        module, func = target.split(":")
        name = module.rsplit(".", 1)[1]
        assert module == f"shmloader.tools.{name}" and script == "shmloader-" + name.replace("_", "-")
        main = getattr(importlib.import_module(module), func)
        assert importlib.import_module(f"tools.{name}").main is main
    assert "matplotlib" in cfg["options.extras_require"]["plot"]


def test_bench_mixture_reports_a_row_without_ratios_as_a_dash():
    """A short round whose coordinator read 0 CPU ticks has no ratio: its row says "-", and the
    report is written (it raised StatisticsError, failing the slow suite's test_bench_mixture)."""
    from tools.bench.mixture import median_text

    assert median_text([]) == "-"
    assert median_text([0.5, 2.0, 1.0]) == "1.000"


def test_bench_made_checks_measures_each_figure(tmp_path):
    """tools/bench/made_checks.py's measurement, in this process, with 2 calls a figure."""
    from tools.bench import made_checks

    got = made_checks.measure({"root": str(tmp_path), "calls": 2})
    assert set(got) == {"files_order_us", "shuffled_us", "ids_plain_ms", "ids_with_bos_ms"}
    assert all(v > 0 for v in got.values())


def test_bench_sourced_measures_each_figure_and_says_its_help(tmp_path, capsys):
    """tools/bench/sourced.py's measurement, in this process, with 2 batches a figure; its --help."""
    from tools.bench import sourced

    got = sourced.measure({"root": str(tmp_path), "calls": 2})
    assert set(got) == set(sourced.FIGURES) and all(v > 0 for v in got.values())
    with pytest.raises(SystemExit) as done:
        sourced.main(["--help"])
    assert done.value.code == 0 and "--compare DIR" in capsys.readouterr().out


def test_a_bench_child_calls_its_function_on_the_config_or_with_its_keys(tmp_path):
    """tools/bench/child.py: `MODULE:FUNCTION` gets the config as one dict, `MODULE:FUNCTION**`
    its keys as keyword arguments (a bench's `one_round(B=..., T=...)` without an adapter)."""
    from tools.bench import children

    with children.checkouts(None) as [ours]:
        whole = children.run("made_checks:measure", {"root": str(tmp_path), "calls": 1}, ours)
        keys = children.run("bestfit_parts:one_round**", {"B": 2, "T": 64, "buffer_size": 20, "chunk": 4,
                                                          "piece_docs": 20, "batches": 5, "seed": 0}, ours)
    assert {"files_order_us", "shuffled_us"} <= set(whole) and whole["files_order_us"] > 0
    assert keys["all"] > 0 and keys["shmloader"]


@pytest.mark.parametrize("script,args,shape", [
    ("mode_replay.py", ["concat", "60", "--single"], r"^\d+\.\d\d \| hand_out=\d+\.\d\d .*slot_buffers=\d+\.\d\d$"),
    ("mode_replay.py", ["bos_bestfit", "30", "--sources", "3"], r"^\d+\.\d\d \| hand_out="),
    ("count_replay.py", ["concat", "200"], r"^\d+\.\d\d \(1, 0, \d+, \d+, \d+\) \d+$"),
    ("count_replay.py", ["bos_bestfit", "20"], r"^\d+\.\d\d \(1, 0, \d+, \d+, 0\) \d+$")])
def test_bench_replays_run_a_checkouts_modes_and_print_their_cpu_a_batch(script, args, shape):
    """tools/bench/mode_replay.py and count_replay.py, the replays docs/benchmarks.md's step-4
    figures came from, run from a checkout's root and print µs a batch (and the count's place)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, f"tools/bench/{script}", *args], cwd=repo, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": repo})
    assert out.returncode == 0, out.stderr
    assert re.match(shape, out.stdout.strip().splitlines()[-1]), out.stdout


# ----------------------------------------------------------------
# a tool's help says the loader's defaults. `shmloader-inspect-batch --help` said `--shuffle-
# window` was "units whose documents are shuffled together ... (default 8)", while the tool (None:
# the loader's) and the loader read windows of 256 documents: a user who passed 8 to match saw
# another stream than the loader's.

def test_inspect_batch_help_says_the_loaders_shuffle_window():
    assert inspect_batch.parse_args([]).shuffle_window is None  # the loader's own default
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        inspect_batch.parse_args(["--help"])
    text = " ".join(out.getvalue().split())
    assert f"shuffle_window= (default {WINDOW})" in text, text
    assert "documents a shuffled window holds" in text, text
