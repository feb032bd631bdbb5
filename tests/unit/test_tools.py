"""The demo's data preparation, tools/profile_worker.py's sorting of samples and tools/bench.py's
parts, in this process: the demo never overwrites data it did not write, a py-spy profile's
samples are sorted by the worker code they are in, the bench's corpora are built once and its
targets take the worst corpus; tools/base_train_evals.py patches only nanochat's loader import
and times the val loader without changing its batches. (The demo and the tools run as a user runs them:
tests/loader/test_tools.py.)
"""
import re
import sys

import pyarrow.parquet as pq
import pytest

from shmloader.demo import corpus, prepare_data
from tests.helpers import REPO_ROOT, read_texts, row_group_sizes

VOCAB = 512


def test_demo_never_overwrites_data_it_did_not_write(tmp_path):
    theirs = tmp_path / "base_data" / "shard_00000.parquet"  # e.g. --out-dir ~/.cache/nanochat
    theirs.parent.mkdir()
    theirs.write_bytes(b"not ours")
    with pytest.raises(ValueError, match="did not write"):
        prepare_data(tmp_path, VOCAB, log=lambda m: None)
    assert theirs.read_bytes() == b"not ours"


def test_profile_worker_sorts_samples_by_the_worker_code_they_are_in():
    sys.path.insert(0, str(REPO_ROOT / "tools"))
    try:
        import profile_worker
    finally:
        sys.path.pop(0)
    top = "worker_main (shmloader/procs/worker.py:67);_loop (shmloader/procs/worker.py:114)"
    tok = top + ";_tokenize (shmloader/procs/worker.py:250);encode_texts (shmloader/procs/worker.py:280)"
    raw = "\n".join([
        f"{tok};Engines.encode_batch (shmloader/data/engine.py:331);_fastokens.<locals>.batch (shmloader/data/engine.py:161);"
        f"pcre2_match_8 (fastokens/_native.abi3.so) 7",
        f"{tok};Engines.encode_batch (shmloader/data/engine.py:333);Check.batch (shmloader/data/engine.py:196);"
        f"Check._compare (shmloader/data/engine.py:210);<lambda> (shmloader/data/tokenizer.py:178) 2",
        f"{top};_tokenize (shmloader/procs/worker.py:245);ParquetSource.read_texts (shmloader/data/source.py:214);"
        f"ParquetSource._read_column (shmloader/data/source.py:234);read_row_group (pyarrow/parquet/core.py:489);"
        f"ZSTD_decompressSequences_bmi2 (pyarrow/libarrow.so) 3",
        f"{top};_tokenize (shmloader/procs/worker.py:245);ParquetSource.read_texts (shmloader/data/source.py:216);"
        f"unicode_decode_utf8 (libpython3.11.so) 1",
        f"{tok};_with_bos (shmloader/procs/worker.py:292) 4",
        f"{top};_handle (shmloader/procs/worker.py:160);write (shmloader/packing/concat.py:169) 5",
        f"{top};Listener.wait (shmloader/ipc/protocol.py:172);poll (libc.so.6) 6",
        f"{tok} 8",
    ])
    parts, total = profile_worker.classify(raw)
    assert total == 36 and parts == {
        "engine encode": 7, "sampled check (tiktoken) and its bookkeeping": 2, "reading: zstd decompression": 3,
        "reading: the rest (decode, to_pylist)": 1, "inserting BOS": 4, "copies into ring slots": 5,
        "messages and polls": 6, "other": 8}
    assert "engine encode" in profile_worker.report(parts, total) and "19.4%" in profile_worker.report(parts, total)


# ---------------------------------------------------------------- tools/bench.py, in this process

def _tool(name: str):
    """A module of tools/, imported as the tools import each other (tools/ on sys.path)."""
    import importlib

    sys.path.insert(0, str(REPO_ROOT / "tools"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


@pytest.fixture(scope="module")
def bench():
    return _tool("bench")


def test_bench_corpus_options_parse(bench, tmp_path):
    args = bench.parse_args([])
    assert args.corpus == ["demo"] and args.cost_busy_ms == 10 and args.dropin_runs
    assert args.first_batch_gap_ms == 500 and not args.first_batch_close
    args = bench.parse_args(["--corpus", "skewed", "demo", "skewed", "nanochat", "--cost-busy-ms", "5",
                             "--no-dropin-runs", "--first-batch-close", "--first-batch-gap-ms", "0",
                             "--nanochat-docs", "1100", "--skewed-docs", "200", "--corpus-files", "2"])
    assert args.corpus == ["skewed", "demo", "nanochat"]  # each once, in the order given
    assert (args.cost_busy_ms, args.dropin_runs, args.first_batch_close, args.first_batch_gap_ms) == (5, False, True, 0)
    assert (args.nanochat_docs, args.skewed_docs, args.corpus_files) == (1100, 200, 2)
    assert bench.parse_args(["--data", str(tmp_path)]).corpus == []
    for bad in (["--data", str(tmp_path), "--corpus", "demo"], ["--corpus", "web"], ["--corpus-files", "1"],
                ["--cost-busy-ms", "-1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_bench_prepare_corpus_builds_once_and_refuses_foreign_shards(bench, tmp_path):
    logged = []
    data = bench.prepare_corpus("skewed", tmp_path, 200, 2, log=logged.append)
    assert data == tmp_path / "skewed_corpus" / "base_data" and len(list(data.glob("*.parquet"))) == 2
    docs, sizes = corpus.skewed_corpus(200)
    assert read_texts(sorted(data.glob("*.parquet"))) == docs
    assert sum(len(row_group_sizes(p)) for p in data.glob("*.parquet")) == len(sizes)
    assert any("writing the skewed corpus" in m for m in logged)
    logged.clear()
    assert bench.prepare_corpus("skewed", tmp_path, 200, 2, log=logged.append) == data and logged == []
    bench.prepare_corpus("skewed", tmp_path, 201, 2, log=logged.append)  # another size: rebuilt
    assert logged and sum(pq.ParquetFile(p).metadata.num_rows for p in data.glob("*.parquet")) == 201
    theirs = tmp_path / "other" / "nanochat_corpus" / "base_data" / "shard_00000.parquet"
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(b"not ours")
    with pytest.raises(ValueError, match="did not write"):
        bench.prepare_corpus("nanochat", tmp_path / "other", 1100, 2, log=logged.append)
    assert theirs.read_bytes() == b"not ours"


def test_bench_busy_work_spins_without_sleeping(bench):
    import resource
    import time

    import numpy as np

    buf = np.ones(1 << 17)
    r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
    bench.busy_work(0.05, buf)
    r1, wall = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter() - t0
    assert wall >= 0.05 and buf[0] > 2  # numpy passes over the buffer
    # never off the CPU of its own accord (a sleep or a blocking call is a voluntary switch;
    # a shared machine may still preempt it)
    assert r1.ru_nvcsw == r0.ru_nvcsw and r1.ru_utime > r0.ru_utime


def test_bench_tree_memory_counts_this_process_and_its_children(bench):
    import subprocess

    alone = bench.tree_memory()
    assert alone["processes"] >= 1 and alone["rss_mib"] >= alone["trainer_rss_mib"] > 0
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for _ in range(50):  # until the child has its interpreter
            with_child = bench.tree_memory()
            if with_child["rss_mib"] > alone["rss_mib"] + 1:
                break
            __import__("time").sleep(0.05)
        assert with_child["processes"] == alone["processes"] + 1 and with_child["rss_mib"] > alone["rss_mib"]
    finally:
        child.kill()
        child.wait()


def test_bench_first_batch_series_keeps_the_last_loader_until_the_next_is_built(bench):
    events = []

    def make():
        k = sum(e[0] == "built" for e in events)
        events.append(("built", k))

        def gen():
            try:
                while True:
                    yield k
            finally:
                events.append(("closed", k))
        return gen()

    out = bench.first_batch_series(make, 3, 2, keep=True, gap_s=0)
    # base_train: loader k is dropped when loader k+1 is assigned over it, the last one at the end
    assert events == [("built", 0), ("built", 1), ("closed", 0), ("built", 2), ("closed", 1), ("closed", 2)]
    assert len(out["all_ms"]) == 3 and len(out["memory_between"]) == 3 and out["keep"]
    assert all(m["processes"] >= 1 and m["rss_mib"] > 0 for m in out["memory_between"])
    events.clear()
    bench.first_batch_series(make, 2, 1, keep=False)
    assert events == [("built", 0), ("closed", 0), ("built", 1), ("closed", 1)]


def _run(kind, workers, packing, tps, **kw):
    return dict(kind=kind, workers=workers, packing=packing, cache=None, label=None, tokens_per_s=tps, **kw)


def test_bench_corpora_targets_take_the_worst_corpus(bench):
    def entry(name, busy, eff, fit_us, concat_us, after_busy):
        base = _run("baseline", None, "concat", 1e6)
        shm = _run("shmloader", 2, "concat", eff * 10e6, bare_tokens_per_s=10e6, worker_busy_share=busy,
                   next_after_busy_us_median=after_busy * 50, after_busy_floor_us_median=50.0, cost_busy_ms=10.0)
        common = dict(kind="dropin", workers=2, cost_busy_ms=10.0, cost_batches=100, next_after_busy_us_median=90.0,
                      state_json_us=20.0, state_json_bytes=400)
        dropin = [dict(common, packing="concat", trainer_cpu_us_per_batch=concat_us),
                  dict(common, packing="bos_bestfit", trainer_cpu_us_per_batch=fit_us)]
        return {"corpus": name, "runs": [base, shm], "dropin": dropin}

    result = {"cores": 2, "config": {"cost_busy_ms": 10.0},
              "corpora": [entry("demo", [0.95, 0.93], 0.90, 240, 200, 1.5),
                          entry("skewed", [0.46, 0.93], 0.40, 536, 205, 2.5)]}
    lines = bench.corpora_targets(result)
    busy = next(ln for ln in lines if "each worker busy >= 90%" in ln)
    assert "demo 95% 93%; skewed 46% 93%; worst 46%, NOT met" in busy
    vs_bare = next(ln for ln in lines if "of 2 bare engine processes" in ln)
    assert "demo 90%, skewed 40%; worst (the headline) 40%, NOT met" in vs_bare
    dropin = next(ln for ln in lines if "best-fit drop-in" in ln)
    assert "demo 240/200 = 1.20x, skewed 536/205 = 2.61x; worst 2.61x, NOT met" in dropin
    after = next(ln for ln in lines if "after 10 ms of busy work" in ln)
    assert "demo 2w concat 1.50x, skewed 2w concat 2.50x; worst 2.50x, NOT met" in after
    result["corpora"] = result["corpora"][:1]
    assert all(ln.endswith(", met") for ln in bench.corpora_targets(result))
    table = "\n".join(bench.corpora_report(result))
    assert "busy per worker" in table and "95% 93%" in table and "75.0 / 50.0 (1.50x)" in table
    assert bench.corpora_targets({"cores": 2, "config": {}}) == []  # a JSON from before corpora


def test_bench_first_batch_targets_compare_every_evaluation(bench):
    mem = [{"processes": 6, "rss_mib": 500.0, "pss_mib": 300.0, "trainer_rss_mib": 250.0}]
    fb = {"corpus": "nanochat", "rows": [
        dict(kind="fb_baseline", packing="bos_bestfit", per_evaluation_ms=[300.0, 260.0, 250.0],
             rss_between_mib_median=280.0),
        dict(kind="fb_shmloader", packing="bos_bestfit", workers=2, label=None,
             per_evaluation_ms=[700.0, 250.0, 240.0], vs_nanochat_per_evaluation=[7 / 3, 250 / 260, 240 / 250],
             rss_between_mib_median=500.0, pss_between_mib_median=300.0, processes_between=6,
             memory_between_rounds=[mem])]}
    [line] = bench.first_batch_targets(fb)
    assert "bos_bestfit (nanochat), 2 workers: first val batch <= nanochat's own loader's at every evaluation" in line
    assert "700/300, 250/260, 240/250" in line and "worst 2.33x, NOT met" in line
    assert "500 MiB RSS summed over 6 processes (300 PSS) against 280 MiB" in line
    fb["rows"][1]["vs_nanochat_per_evaluation"] = [0.9, 0.96, 0.96]
    assert "worst 0.96x, met" in bench.first_batch_targets(fb)[0]


# ---------------------------------------------------------------- tools/base_train_evals.py

@pytest.fixture(scope="module")
def evals():
    return _tool("base_train_evals")


def test_base_train_evals_patches_only_the_loader_import_and_times_the_val_loader(evals, tmp_path, capsys):
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
    scope = {"time": __import__("time"), "build_val_loader": lambda: iter([10, 11, 12])}
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
