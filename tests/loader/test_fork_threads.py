"""A loader across `os.fork()` and from several threads (docs/contract.md §1).

Fork: a trainer script builds a loader, takes batches, forks three children one after another
(batches taken between them); one exits the usual way
(`sys.exit`, so multiprocessing's and shmloader's exit handlers run in it), one calls `next()` on
the inherited loader (a `LoaderClosed` naming the fork), one builds a loader of its own. The
parent's loader must go on untouched: the same processes, the same segment, never asked to
give way to the child's loader, and the batches of an uninterrupted run (token = position data, so each window is checked by arithmetic).
Threads: two threads calling `next()` on one loader get every batch of the stream exactly once,
each thread its batches in stream order.
"""
import json
import subprocess
import sys
import threading

import numpy as np
import pytest

import shmloader
from tests.helpers import window_of

B, T = 2, 16

FORK_SCRIPT = """
import json, os, sys, threading
import shmloader
from shmloader.ipc.ring import Counter
from tests.helpers import IntTokenizer, window_of

data, cases = sys.argv[1], sys.argv[2:]
make = lambda: shmloader.ShmLoader(data, IntTokenizer(), {B}, {T}, num_workers=2, device="cpu")
loader = make()
windows = [window_of(*next(loader)).tolist() for _ in range(3)]
info = loader.debug()
before = {{"pids": [p.pid for p in [info.coordinator, *info.workers]], "segment": info.segment}}
first = windows[0]
out = {{}}
for case in cases:  # one fork after another from the same loader, batches taken between them
    child = os.fork()
    if child == 0:
        if case == "next":
            try:
                next(loader)
                print("child: next() returned a batch", file=sys.stderr)
                sys.exit(3)
            except shmloader.LoaderClosed as exc:
                sys.exit(0 if "forked" in str(exc) else 4)
        if case == "own":
            with make() as own:
                got = window_of(*next(own)).tolist()
            sys.exit(0 if got == first else 5)
        sys.exit(0)  # exit handlers run here: multiprocessing's, atexit's
    # the parent's ring while the child runs: a child's own loader must not make this one give way
    # (the child forgets the trainer's runs: procs/precedence.py)
    words, done = [], threading.Event()
    def watch():
        while not done.is_set():
            words.append(int(info.ring.counters[Counter.YIELD_UNTIL]))
            done.wait(0.002)
    watcher = threading.Thread(target=watch)
    watcher.start()
    _, status = os.waitpid(child, 0)
    done.set()
    watcher.join()
    alive = all(os.path.exists(f"/proc/{{pid}}") for pid in before["pids"])
    segment_there = os.path.exists("/dev/shm/" + before["segment"])
    windows += [window_of(*next(loader)).tolist() for _ in range(15)]
    out[case] = {{"child_status": status, "alive": alive, "segment": segment_there, "paused": max(words),
                 "looks": len(words)}}
loader.close()
print(json.dumps({{"cases": out, "windows": windows}}))
""".format(B=B, T=T)

CASES = ["exit", "next", "own"]


def test_a_forked_child_never_touches_the_parents_loader(posdata, tmp_path):
    """The three children forked one after another from one trainer (one fresh interpreter,
    not one each): the parent's loader goes on untouched after each."""
    script = tmp_path / "fork_trainer.py"
    script.write_text(FORK_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(posdata.root), *CASES], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(got["cases"]) == CASES
    for case, out in got["cases"].items():
        assert out["child_status"] == 0, f"{case}: the child's check failed (wait status {out['child_status']}): {proc.stderr}"
        assert out["alive"] and out["segment"], f"{case}: the child's exit touched the parent's processes or segment"
        assert out["looks"] > 0 and out["paused"] == 0, f"{case}: the child's loader made the parent's loader give way"
    want, _ = posdata.expected(len(got["windows"]), B, T)
    assert [np.array(w).tolist() for w in want] == got["windows"]
    assert "Traceback" not in proc.stderr and "leaked" not in proc.stderr, proc.stderr


def test_two_threads_get_every_batch_once_in_order(posdata, watchdog):
    n = 60
    want, _ = posdata.expected(2 * n, B, T)
    index = {w.tobytes(): k for k, w in enumerate(want)}
    got = {0: [], 1: []}
    errors = []
    with posdata.loader(B, T) as loader:
        start = threading.Barrier(2)

        def take(i):
            try:
                start.wait(10)
                for _ in range(n):
                    got[i].append(index[window_of(*next(loader)).tobytes()])  # KeyError: not the stream's
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=take, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a thread is still in next()"
    assert not errors, errors
    assert sorted(got[0] + got[1]) == list(range(2 * n)), "a batch came twice or never"
    assert all(g == sorted(g) for g in got.values()), "a thread got its batches out of order"
    assert got[0] and got[1]


def test_a_thread_waiting_behind_another_times_out_with_a_clear_error(posdata):
    with posdata.loader(B, T, timeout=1) as loader:
        next(loader)
        assert loader._lock.acquire()  # another thread is inside next() (and stays)
        try:
            with pytest.raises(shmloader.LoaderTimeout, match="another thread"):
                next(loader)
        finally:
            loader._lock.release()
        next(loader)
