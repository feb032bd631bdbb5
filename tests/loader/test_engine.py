"""data/engine.py in the workers: the fast tokenizer engine (fastokens) and its checks against
tiktoken, through the whole loader.

The stream with `engine="fastokens"` is byte-identical to the tiktoken reference (and to the
oracle) for concat and best fit, with the engine taking over at the first document and
mid-run; a deliberately wrong engine (the test hook `SHMLOADER_ENGINE_HOOK` names a function
of this module, so the workers, started with `spawn` to get the environment, import it) is
stopped by the start check (also when it takes over mid-run: the start check follows it) and,
when it is wrong only on a document after the start sample, by the sampled check, with a
WorkerError naming the file, row group and row and `engine="tiktoken"`; without the knob a
long run's engine does take over (and is checked); with `engine="tiktoken"` the same hook is
never used; the engine adds at most one thread to a worker, and in a fresh interpreter (as in
a worker) its build starts at most one thread, which does almost none of the work; threads
that start beside the build (pyarrow's, as the worker reads) are not the engine's and are not
warned of, a pool of its own (named fastokens-N) is, and a thread variable the user set is said
once at construction.

Most worker tests set `SHMLOADER_ENGINE_AT=0` (the engine takes over at a worker's first
document, as it did when it was built before the first document): a worker builds the engine
only once it has tokenized for about as long as the build costs, which these small data sets
may never reach. (The engine and `Engines` in this process: tests/unit/data/test_engine.py.)
"""
import itertools
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import shmloader
from shmloader.data import engine as enginemod
from shmloader.data import tokenizer as tokmod
from shmloader.errors import WorkerError
from shmloader.demo import corpus
from tests import oracle
from tests.cases import cross
from tests.helpers import REPO_ROOT, hard_texts

pytest.importorskip("fastokens")

B, T = 2, 32
EARLY, LATE = "ENGINE-FAULT-EARLY", "ENGINE-FAULT-LATE"
EARLY_ROW, LATE_ROW = 20, 250  # canonical document indices (train split)


def engine_docs() -> list:
    docs = list(corpus.synthetic_texts(480, seed=21, mean_words=12))
    hard = hard_texts()[:14]
    for k, i in enumerate(range(3, 470, 31)):
        docs[i] = hard[k % len(hard)]
    for i in range(7, len(docs), 29):
        docs[i] = None
    docs[9] = ""
    docs[EARLY_ROW] = f"an early document {EARLY} with some words"
    docs[LATE_ROW] = f"a late document {LATE} with some words"
    return docs


@pytest.fixture(scope="module")
def data(tmp_path_factory, synth_tokenizer):
    root = tmp_path_factory.mktemp("engine_data")
    docs = engine_docs()
    paths = [str(p) for p in corpus.write_shards(docs, root, num_files=3, row_group_size=[64, 7, 100])]
    return root, paths, docs


def _locate(paths, index):
    """(file path, row group, row) of canonical document `index` of the train split."""
    (_, f, g, row), _ = next(itertools.islice(oracle.documents(paths[:-1], epochs=1), index, None))
    return paths[f], g, row


# ------------------------------------------------------------------ wrong engines (the test hook)

def _wrong_on(marker):
    def make(spec):
        right = tokmod.build(spec)

        def encode(text):
            ids = np.array(right(text), dtype=np.uint32)
            if marker in text and len(ids):
                ids[len(ids) // 2] ^= 1  # one id off, same length
            return ids
        return encode
    return make


wrong_early = _wrong_on(EARLY)
wrong_late = _wrong_on(LATE)
wrong_all = _wrong_on("")


def _nonnull_before(docs, index) -> int:
    """How many non-null documents precede canonical document `index` (a lone worker's count)."""
    return sum(d is not None for d in docs[:index])


def test_engine_threads_pinned_to_one(synth_tokenizer, tmp_path):
    """In a fresh interpreter (fastokens not yet imported), as in a worker: the engine's build
    sets the thread variables and starts at most one thread, and under a long run of work (one
    document per call, then many: a batch could go parallel) the threads it started do almost
    none of it (the caller's thread does). Threads that
    existed before the build (e.g. a BLAS pool of numpy's) are not the engine's and are not
    counted: CPU is read per thread from /proc, not for the whole process."""
    path = corpus.save_tokenizer(synth_tokenizer, tmp_path)
    code = f"""
import os, threading
from shmloader.data import engine
from shmloader.data import tokenizer

def cpu(tid):
    f = open(f"/proc/self/task/{{tid}}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])  # utime + stime, clock ticks

before = set(os.listdir("/proc/self/task"))
e = engine.build(tokenizer.resolve({str(path)!r}), "fastokens")
main = str(threading.get_native_id())
main0 = cpu(main)
for i in range(150):  # texts that differ, so that no cache of the engine's does the work
    e.encode(" ".join(f"w{{i}}x{{j * 7919 % 10007}} naïve" for j in range(2000)))
for i in range(150, 300, 15):  # and many at a time, as a worker calls it
    e.encode_batch([" ".join(f"w{{k}}x{{j * 7919 % 10007}} naïve" for j in range(2000)) for k in range(i, i + 15)])
new = set(os.listdir("/proc/self/task")) - before
print(e.name, e.threads, len(new), os.environ["FASTOKENS_BPE_THREADS"], os.environ["RAYON_NUM_THREADS"],
      cpu(main) - main0, sum(cpu(t) for t in new))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("FASTOKENS_BPE_THREADS", None)
    env.pop("RAYON_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    name, at_build, started, bpe, rayon, main_ticks, engine_ticks = out.stdout.split()
    assert name == "fastokens" and (bpe, rayon) == ("1", "1")
    assert int(at_build) <= 1 and int(started) <= 1, out.stdout
    assert int(main_ticks) >= 10, f"too little work to judge: {out.stdout}"
    assert int(engine_ticks) <= 0.3 * int(main_ticks), f"the engine's own threads did the work: {out.stdout}"


_BUILD_BESIDE_READS = """
import os, sys, threading
from shmloader.data import engine
from shmloader.data import tokenizer

if sys.argv[2] == "unpinned":  # as if fastokens ignored the pin: its own pool starts
    engine.THREAD_ENV = {}
real, gone = engine._fastokens, threading.Event()

def beside(*args):  # the worker's reads start threads of pyarrow's while the engine builds
    for _ in range(3):
        threading.Thread(target=gone.wait, args=(30,), daemon=True).start()
    return real(*args)

engine._fastokens = beside
said = []
e = engine.Engines(tokenizer.resolve(sys.argv[1]), "fastokens", warn=said.append)
e.start()
e._thread.join(30)
e.poll()
gone.set()
print(e.encoder.name, os.getpid())
print(said)
"""


def _built_beside_reads(path, how: str) -> tuple:
    """A fresh interpreter's `Engines` built while 3 threads that are not the engine's start:
    (engine name, pid, what it warned)."""
    env = {k: v for k, v in os.environ.items() if k not in enginemod.THREAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", _BUILD_BESIDE_READS, str(path), how], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    head, said = out.stdout.splitlines()[-2:]
    name, pid = head.split()
    return name, pid, said


def test_threads_started_beside_the_build_are_not_the_engines(synth_tokenizer, tmp_path):
    """The build runs on a thread while the worker goes on reading (pyarrow starts pool threads
    of its own then, named like the process): those are not the engine's, and nothing is said.
    (It warned "the fastokens engine started 3 threads, not 1": a count around the build.)"""
    name, _, said = _built_beside_reads(corpus.save_tokenizer(synth_tokenizer, tmp_path), "pinned")
    assert name == "fastokens" and said == "[]", said


def test_a_pool_of_the_engines_own_is_warned_of_by_name(synth_tokenizer, tmp_path):
    """Unpinned, fastokens starts its own pool (threads named fastokens-N): the warning names
    them and the worker's pid, and counts none of the 3 other threads."""
    name, pid, said = _built_beside_reads(corpus.save_tokenizer(synth_tokenizer, tmp_path), "unpinned")
    assert name == "fastokens" and "fastokens-0" in said and f"pid {pid}" in said, said
    assert f"runs {said.count('fastokens-')} thread" in said, said


def _stream(root, enc, n, packing="concat", **kw):
    kw.setdefault("num_workers", 2)
    extra = dict(buffer_size=12, tokenizer_batch_size=4) if packing == "bos_bestfit" else {}
    with shmloader.ShmLoader(str(root), enc, B, T, "train", packing=packing, device="cpu",
                             timeout=60, **extra, **kw) as loader:
        return [(x.numpy().copy(), y.numpy().copy()) for x, y in itertools.islice(loader, n)]


# default: concat from the first document, best fit mid-run; the other two with -m slow
@pytest.mark.parametrize("packing,at", cross(
    ["concat", "bos_bestfit"], [pytest.param(0, id="from the first document"), pytest.param(150, id="mid-run")],
    default={"concat-from the first document", "bos_bestfit-mid-run"}))
def test_fast_stream_is_byte_identical_to_tiktoken(data, synth_tokenizer, packing, at, monkeypatch, watchdog):
    root, paths, _ = data
    enc = synth_tokenizer
    bos = enc.encode_single_token("<|bos|>")
    n = 700  # past the end of the first epoch (~40k train tokens in 65-token windows: ~620 batches)
    monkeypatch.setenv(enginemod.AT_ENV, str(at))  # each worker's engine takes over at its at-th document
    fast = _stream(root, enc, n, packing, engine="fastokens", start_method="spawn")
    ref = _stream(root, enc, n, packing, engine="tiktoken")
    assert len(fast) == len(ref) == n
    for k, ((fx, fy), (rx, ry)) in enumerate(zip(fast, ref)):
        assert fx.tobytes() == rx.tobytes() and fy.tobytes() == ry.tobytes(), f"batch {k}"
    if packing == "concat":
        expected = [w for w, _ in itertools.islice(
            oracle.concat_windows(paths[:-1], enc.encode_ordinary, bos, B, T), n)]
        for k, ((x, y), w) in enumerate(zip(fast, expected)):
            assert np.array_equal(np.concatenate([x.reshape(-1)[:1], y.reshape(-1)]), w), f"batch {k}"
    else:
        expected = list(itertools.islice(oracle.bestfit_rows(paths[:-1], enc.encode_ordinary, bos, B, T,
                                                              buffer_size=12, chunk_docs=4), n))
        for k, ((x, y), (rows, _)) in enumerate(zip(fast, expected)):
            assert np.array_equal(x, rows[:, :-1]) and np.array_equal(y, rows[:, 1:]), f"batch {k}"


def _expect_mismatch(root, enc, paths, index, phase):
    path, rg, row = _locate(paths, index)
    with pytest.raises(WorkerError) as info:
        _stream(root, enc, 10_000, num_workers=1, start_method="spawn")
    text = str(info.value)
    print(text.splitlines()[0])
    for part in (os.path.basename(path), f"row group {rg}, row {row}", phase,
                 'engine="tiktoken"', "EngineMismatch"):
        assert part in text, f"{part!r} not in: {text}"


def test_wrong_engine_is_caught_by_the_start_check(data, synth_tokenizer, monkeypatch, watchdog):
    root, paths, _ = data
    monkeypatch.setenv(enginemod.HOOK_ENV, f"{__name__}:wrong_early")
    monkeypatch.setenv(enginemod.AT_ENV, "0")
    assert EARLY_ROW < enginemod.START_DOCS
    _expect_mismatch(root, synth_tokenizer, paths, EARLY_ROW, "start check")


def test_a_mismatch_in_a_json_lines_file_names_its_line(synth_tokenizer, tmp_path, monkeypatch, watchdog):
    """The worker's message names a JSON Lines file's place by its line (and its piece by its
    lines), as its format words it, not by a "row group" and row."""
    from tests import formats_data

    docs = list(corpus.synthetic_texts(2100, seed=21, mean_words=4))
    docs[2050] = f"{LATE} {docs[2050]}"  # line 2051 of file 0 (unit 2, row 2)
    for i, part in enumerate((docs, docs[:100])):
        formats_data.write(str(tmp_path / f"shard_{i}.jsonl"), part, "jsonl")
    monkeypatch.setenv(enginemod.HOOK_ENV, f"{__name__}:wrong_late")
    monkeypatch.setenv(enginemod.CHECK_ENV, "0,1")
    monkeypatch.setenv(enginemod.AT_ENV, "0")
    with pytest.raises(WorkerError) as info:
        _stream(tmp_path, synth_tokenizer, 10_000, num_workers=1, start_method="spawn")
    text = str(info.value).splitlines()[0]
    assert "shard_0.jsonl, line 2051 (" in text and "row group" not in text, text
    assert re.search(r"worker 0 \(pid \d+\) on \S+shard_0.jsonl, lines 2049-\d+: EngineMismatch", text), text


def test_start_check_follows_an_engine_that_takes_over_mid_run(data, synth_tokenizer, monkeypatch, watchdog):
    """The late document is far past a worker's first START_DOCS documents and between two
    samples; an engine that takes over 30 documents before it is start-checked on it."""
    root, paths, docs = data
    late = _nonnull_before(docs, LATE_ROW)
    assert late - 30 > enginemod.START_DOCS and (late - enginemod.START_DOCS) % enginemod.SAMPLE_EVERY != \
        enginemod.SAMPLE_EVERY - 1
    monkeypatch.setenv(enginemod.HOOK_ENV, f"{__name__}:wrong_late")
    monkeypatch.setenv(enginemod.AT_ENV, str(late - 30))
    _expect_mismatch(root, synth_tokenizer, paths, LATE_ROW, "start check")


def test_engine_takes_over_without_the_knob(data, synth_tokenizer, monkeypatch, watchdog):
    """No knob: once a worker has tokenized for about as long as the build costs, a wrong
    engine (here wrong on every document) takes over and its start check stops the run."""
    root, _, _ = data
    monkeypatch.setenv(enginemod.HOOK_ENV, f"{__name__}:wrong_all")
    monkeypatch.delenv(enginemod.AT_ENV, raising=False)
    with pytest.raises(WorkerError, match="EngineMismatch") as info:
        _stream(root, synth_tokenizer, 100_000, num_workers=1, start_method="spawn")
    assert "start check" in str(info.value)


def test_wrong_engine_is_caught_by_the_sampled_check(data, synth_tokenizer, monkeypatch, watchdog):
    root, paths, _ = data
    monkeypatch.setenv(enginemod.HOOK_ENV, f"{__name__}:wrong_late")
    monkeypatch.setenv(enginemod.AT_ENV, "0")
    # the late document is far past the start sample; every later document is sampled here
    monkeypatch.setenv(enginemod.CHECK_ENV, f"{enginemod.START_DOCS},1")
    assert LATE_ROW > 2 * enginemod.START_DOCS
    _expect_mismatch(root, synth_tokenizer, paths, LATE_ROW, "sampled check")


def test_wrong_engine_unsampled_document_goes_unseen_only_between_samples(data, synth_tokenizer, monkeypatch,
                                                                          watchdog):
    """The sampled check is a sample: with the late document between two samples the run goes
    on (this documents the limit; the start check covers the first documents)."""
    root, paths, _ = data
    monkeypatch.setenv(enginemod.HOOK_ENV, f"{__name__}:wrong_late")
    monkeypatch.setenv(enginemod.AT_ENV, "0")
    monkeypatch.setenv(enginemod.CHECK_ENV, f"{enginemod.START_DOCS},100000")
    assert len(_stream(root, synth_tokenizer, 60, num_workers=1, start_method="spawn")) == 60


def test_tiktoken_forced_never_uses_the_engine(data, synth_tokenizer, monkeypatch, watchdog):
    root, paths, _ = data
    monkeypatch.setenv(enginemod.HOOK_ENV, f"{__name__}:wrong_early")
    monkeypatch.setenv(enginemod.AT_ENV, "0")
    enc = synth_tokenizer
    got = _stream(root, enc, 60, num_workers=1, start_method="spawn", engine="tiktoken")
    expected = [w for w, _ in itertools.islice(oracle.concat_windows(
        paths[:-1], enc.encode_ordinary, enc.encode_single_token("<|bos|>"), B, T), 60)]
    for (x, y), w in zip(got, expected):
        assert np.array_equal(np.concatenate([x.reshape(-1)[:1], y.reshape(-1)]), w)


def test_engine_adds_at_most_one_thread_to_a_worker(data, synth_tokenizer, monkeypatch, watchdog):
    """Counted once the engine has taken over (at the first document) and its build thread is done."""
    root, _, _ = data
    monkeypatch.setenv(enginemod.AT_ENV, "0")
    counts = {}
    for engine in ("tiktoken", "fastokens"):
        with shmloader.ShmLoader(str(root), synth_tokenizer, B, T, "train", num_workers=1, device="cpu",
                                 timeout=60, engine=engine, start_method="spawn") as loader:
            for _ in itertools.islice(loader, 100):
                pass
            pid = loader.debug().workers[0].pid
            counts[engine] = len(os.listdir(f"/proc/{pid}/task"))
    assert counts["fastokens"] - counts["tiktoken"] <= 1, counts
