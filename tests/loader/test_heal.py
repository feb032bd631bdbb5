"""Self-healing (`max_restarts`, `stall_s`; loader.py `_heal`): a worker or the coordinator that
dies (SIGKILL, SIGSEGV) or stands still (SIGSTOP) while a trainer reads is replaced, with
every other child, from the state after the last batch returned, and the batches and states
are those of an uninterrupted run, both packings, 1 to 4 workers, with and without a token
cache; a state taken after a heal resumes exactly. A row group in flight at two deaths is a
`WorkerError` naming it, or is skipped with `on_bad_row_group="skip"`; a spent budget is
today's error; nothing leaks over many heals. (`max_restarts=0`, today's behaviour, is what
tests/loader/test_faults.py tests.)"""
import itertools
import os
import random
import resource
import signal
import threading
import time
import warnings

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers
from tests.helpers import shm_segments, wait_clean

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 2, 32
OPTS = {"concat": {}, "bos_bestfit": {"buffer_size": 12, "tokenizer_batch_size": 4}}


def tokens(inputs, targets) -> np.ndarray:
    return np.concatenate([inputs.numpy().ravel(), targets.numpy().ravel()])


def reference(ds, packing, n, **kw):
    with ds.loader(B, T, packing=packing, num_workers=2, max_restarts=0, idle_release_s=0,
                   **OPTS[packing], **kw) as loader:
        out = [(tokens(*b), loader.state_dict()) for b in itertools.islice(loader, n)]
    assert len(out) == n
    return out


def kill(pid: int, sig):
    """`os.kill`, unless the process is gone already (a heal replaced it)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def victim(loader, rng, who):
    d = loader.debug()
    proc = d.coordinator if who == "coordinator" else rng.choice(d.workers)
    resource.prlimit(proc.pid, resource.RLIMIT_CORE, (0, 0))  # no core file from SIGSEGV
    return proc.pid


def read_with_faults(loader, n, rng, faults, who, sig):
    """`n` batches (tokens, state), sending `sig` to a `who` child at each batch index in
    `faults`, after a random delay: half of them from a timer while next() runs."""
    out, it = [], iter(loader)
    for k in range(n):
        if k in faults:
            pid, delay = victim(loader, rng, who), rng.uniform(0, 0.02)
            if rng.random() < 0.5:
                threading.Timer(delay, kill, (pid, sig)).start()
            else:
                time.sleep(delay)
                kill(pid, sig)
        out.append((tokens(*next(it)), loader.state_dict()))
    return out


def assert_same(got, want, info):
    assert len(got) == len(want)
    for k, ((w, s), (x, t)) in enumerate(zip(got, want)):
        assert np.array_equal(w, x), f"batch {k} differs from the uninterrupted run {info}"
        assert s == t, f"the state after batch {k} differs from the uninterrupted run's {info}"


SLOW = pytest.mark.slow
CASES = [  # (who, signal, packing, workers, cache, seed); two more with -m slow
    ("worker", signal.SIGKILL, "concat", 1, False, 1),
    ("worker", signal.SIGKILL, "concat", 3, True, 2),
    ("worker", signal.SIGSEGV, "bos_bestfit", 2, False, 3),
    pytest.param("worker", signal.SIGKILL, "bos_bestfit", 4, True, 4, marks=SLOW),
    ("coordinator", signal.SIGKILL, "concat", 2, False, 5),
    ("coordinator", signal.SIGKILL, "bos_bestfit", 3, True, 6),
    pytest.param("coordinator", signal.SIGSEGV, "concat", 4, False, 7, marks=SLOW),
]


def _case_id(c) -> str:
    c = c.values if hasattr(c, "values") else c
    return f"{c[0]}-{c[1].name}-{c[2]}-{c[3]}w{'-cache' if c[4] else ''}"


@pytest.mark.parametrize("who,sig,packing,workers,cache,seed", CASES, ids=[_case_id(c) for c in CASES])
def test_a_dead_child_is_replaced_and_the_stream_goes_on_exactly(synth, tmp_path, who, sig, packing,
                                                                  workers, cache, seed):
    rng = random.Random(seed)
    n = 120
    want = reference(synth, packing, n)
    # 30 batches apart: each death's piece is read whole before the next (two deaths on a piece
    # not yet read through are a poison pill, tested below)
    first = rng.randrange(1, 20)
    faults = {first, first + rng.randrange(30, 40), first + rng.randrange(70, 80)}
    info = f"(seed {seed}: {who} {sig.name} at batches {sorted(faults)}, {packing}, {workers} workers, cache {cache})"
    kw = {"cache_dir": str(tmp_path / "cache")} if cache else {}
    with synth.loader(B, T, packing=packing, num_workers=workers, max_restarts=5, **OPTS[packing], **kw) as loader:
        got = read_with_faults(loader, n, rng, faults, who, sig)
        heals = loader.stats()["heals"]
    assert 1 <= heals <= 3, f"{heals} heals for 3 faults {info}"  # a fault after the run's last batch is not seen
    assert_same(got, want, info)
    # a state taken after a heal resumes exactly, with another number of workers
    at = max(faults) + 2
    with synth.loader(B, T, packing=packing, num_workers=5 - workers, resume_state=got[at][1],
                      **OPTS[packing]) as loader:
        rest = [tokens(*b) for b in itertools.islice(loader, n - at - 1)]
    assert all(np.array_equal(a, w) for a, (w, _) in zip(rest, want[at + 1:])), f"resume after a heal {info}"


@pytest.mark.parametrize("who", ["worker", "coordinator"])
@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_stalled_child_is_killed_and_replaced(synth, who, packing):
    """SIGSTOP: no progress while next() waits; after stall_s the child is killed (its stall
    logged and counted), every child starts again, and the stream is unchanged."""
    want = reference(synth, packing, 40)
    rng = random.Random(8)
    with synth.loader(B, T, packing=packing, num_workers=2, stall_s=1.0, timeout=30, max_restarts=3,
                      **OPTS[packing]) as loader:
        it = iter(loader)
        got = [(tokens(*next(it)), loader.state_dict()) for _ in range(5)]
        os.kill(victim(loader, rng, who), signal.SIGSTOP)
        began = time.monotonic()
        got += [(tokens(*next(it)), loader.state_dict()) for _ in range(35)]
        assert loader.stats()["heals"] == 1, "the stall was not healed once"
    assert time.monotonic() - began < 15, "the heal took too long"
    assert_same(got, want, f"({who} SIGSTOP, {packing})")


def poison_data(tmp_path):
    """Position documents (IntTokenizer: tokens are numbers) in 2 files of row groups of 20; the
    document of file 0, row group 3, row 5 holds "kill" (KillerTokenizer's process dies on it)."""
    lengths = [6] * 400
    docs = helpers.position_documents(lengths)
    poison = 3 * 20 + 5
    docs[poison] = docs[poison] + " kill"
    paths = corpus.write_shards(docs, tmp_path, num_files=2, row_group_size=20)
    return docs, paths


def test_a_row_group_that_kills_its_worker_twice_is_an_error_naming_it(tmp_path):
    _, paths = poison_data(tmp_path)
    with shmloader.ShmLoader(str(tmp_path), helpers.KillerTokenizer(), 1, 16, "train", num_workers=2,
                             device="cpu", max_restarts=5) as loader:
        with pytest.raises(shmloader.WorkerError) as info:
            for _ in itertools.islice(loader, 1000):
                pass
        assert loader.stats()["heals"] == 1, "the first death is healed, the second one with it in flight is not"
    msg = str(info.value)
    assert f"{paths[0]}, row group 3 was being tokenized at two deaths" in msg and "SIGKILL" in msg, msg
    assert "on_bad_row_group='skip'" in msg, msg


def test_a_row_group_that_kills_its_worker_twice_is_skipped_on_request(tmp_path):
    docs, paths = poison_data(tmp_path)
    kept = [d for i, d in enumerate(docs[:200]) if i // 20 != 3]  # file 0 is the train split
    stream = np.concatenate([[0] + [int(t) for t in d.split()] for d in kept])
    W = 16 + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with shmloader.ShmLoader(str(tmp_path), helpers.KillerTokenizer(), 1, 16, "train", num_workers=2,
                                 device="cpu", max_restarts=5, on_bad_row_group="skip") as loader:
            got = [helpers.window_of(*b) for b in itertools.islice(loader, len(stream) // W)]
            stats = loader.stats()
    assert stats["heals"] == 2 and stats["bad_row_groups_skipped"] == 1, stats
    assert any(f"skipping {paths[0]}, row group 3" in str(w.message) for w in caught), [str(w.message) for w in caught]
    for k, w in enumerate(got):
        assert np.array_equal(w, stream[k * W:(k + 1) * W]), f"batch {k} is not the stream without row group 3"


def read_until_healed(loader, it, heals: int, limit_s: float = 10.0):
    """next() until the loader has healed `heals` times (a death is seen at the next liveness
    check, twice a second, or when next() waits)."""
    until = time.monotonic() + limit_s
    while loader.stats()["heals"] < heals:
        assert time.monotonic() < until, f"no heal {heals} within {limit_s} s"
        next(it)


def test_a_spent_budget_is_todays_error(synth):
    with synth.loader(B, T, num_workers=2, max_restarts=2) as loader:
        it = iter(loader)
        next(it)
        for heal in range(1, 3):
            os.kill(loader.debug().workers[0].pid, signal.SIGKILL)
            read_until_healed(loader, it, heal)
        pid = loader.debug().workers[0].pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(shmloader.WorkerError) as info:
            read_until_healed(loader, it, 3)
        assert loader.stats()["heals"] == 2
    msg = str(info.value)
    assert f"worker 0 (pid {pid})" in msg and "SIGKILL" in msg and "max_restarts=2 is spent" in msg, msg


def test_nothing_grows_over_many_heals(synth):
    """12 heals: no process, file descriptor or /dev/shm segment more than after the first;
    a batch held from before the heals is still what it was."""
    rng = random.Random(9)
    with synth.loader(B, T, num_workers=2, max_restarts=100) as loader:
        it = iter(loader)
        held = next(it)
        kept = tokens(*held)
        for _ in range(3):
            next(it)
        counts = []
        for heal in range(1, 13):
            os.kill(victim(loader, rng, rng.choice(["worker", "coordinator"])), signal.SIGKILL)
            read_until_healed(loader, it, heal)
            for _ in range(40):  # past what the dead worker held (else a second death there is a poison pill)
                next(it)
            counts.append((len(os.listdir("/proc/self/fd")), len(shm_segments(os.getpid())),
                           len(helpers.loader_children(os.getpid()))))
        assert loader.stats()["heals"] == 12
        assert np.array_equal(tokens(*held), kept), "a held batch changed over the heals"
    assert max(counts) == counts[0] and min(counts) == counts[-1] == counts[0], counts
    kids, segs = wait_clean(2.0)
    assert not kids and not segs
