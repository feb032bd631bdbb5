"""Faults at random moments (docs/contract.md §4), with `max_restarts=0` where a heal would
replace the process (tests/loader/test_heal.py): a worker raising, a worker or the
coordinator killed by SIGKILL or SIGSEGV or frozen by SIGSTOP, the trainer killed (alone or
with its process group), /dev/shm too small, hundreds of create/close cycles, repeated
SIGKILL restarts (4 seeds by default, 20 with -m slow).

Each fault is reported in the training process within 5 s as the error docs/contract.md §4 names
(WorkerError naming the process, its pid and its signal, or the worker's own exception with
its traceback), and afterwards no loader process and no /dev/shm/shml_<pid>_* segment is
left (conftest's `no_leaks` checks this process's; the tests check a killed trainer's).
The fault positions are drawn from seeded RNGs; the seed is in every failure message.

Not repeated here: the fixed-moment deaths, exits and Ctrl-C of tests/loader/test_exit.py,
the single random restart of tests/loader/test_resume.py, and refused (unknown-version,
truncated, edited) states, which tests/loader/test_resume.py::test_edited_state_is_refused
and tests/unit/test_state.py already cover field by field.
"""
import errno
import gc
import hashlib
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import shmloader
from shmloader.ipc import ring as ringmod
from shmloader.ipc import segment as segmod
from shmloader.demo import corpus
from tests import helpers
from tests.cases import cross
from tests.helpers import (SCRIPTS, loader_children, shm_segments, sigkill_after, wait_clean, wait_gone,
                           wait_no_segment, window_of)

pytestmark = pytest.mark.usefixtures("watchdog")
DETECT_S = 15.0  # a fault must be reported within this many seconds (under the loaders' timeouts here, 30 s: a fault reported only by the timeout fails; 5 s was near a loaded machine's start)


def assert_clean(seconds=2.0):
    kids, segs = wait_clean(seconds)
    assert not kids, f"loader processes alive {seconds} s after close: {kids}"
    assert not segs, f"shared memory left {seconds} s after close: {segs}"


def next_until_error(loader, limit_s=DETECT_S, max_batches=100_000):
    """Call next() until it raises; return (exception, seconds the raising call took, batches).
    Fails if no error comes within `limit_s` of the call."""
    n = 0
    started = time.monotonic()
    while n < max_batches:
        call = time.monotonic()
        try:
            next(loader)
        except Exception as exc:  # noqa: BLE001 - the caller checks the type
            return exc, time.monotonic() - call, n
        n += 1
        assert time.monotonic() - started < limit_s, f"no error within {limit_s} s ({n} batches)"
    pytest.fail(f"no error after {n} batches")


@pytest.fixture(params=["header", "syscall"])
def handover(request, monkeypatch):
    """Both paths of NOTE [slot handover]: through the header alone, and through system calls
    (the path for machines without x86-64's store order)."""
    monkeypatch.setenv("SHMLOADER_HANDOVER", request.param)
    return request.param


# ---------------------------------------------------------------- an exception in a worker

WORDS = 7  # tokens per document (without BOS)
RG = 37    # rows per row group


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_worker_exception_at_random_document(tmp_path, seed):
    """IntTokenizer raises ValueError on "boom": the trainer gets WorkerError naming the
    worker, its pid, the file and row group, with the ValueError's traceback; every batch
    yielded before it is exact (tokens equal positions)."""
    rng = random.Random(seed)
    n_docs = 1000  # file 0 (train) holds documents [0, 500)
    lengths = [WORDS] * n_docs
    docs = helpers.position_documents(lengths)
    bad = rng.randrange(20, 480)
    docs[bad] = f"{bad * (WORDS + 1) + 1} boom"
    paths = corpus.write_shards(docs, tmp_path, num_files=2, row_group_size=RG)
    B, T = 1, rng.choice([8, 16, 24])
    W = B * T + 1
    info = f"(seed {seed}: document {bad}, T={T})"
    with shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), B, T, "train",
                             num_workers=2, device="cpu", timeout=30) as loader:
        windows = []
        started = time.monotonic()
        err = None
        while err is None:
            call = time.monotonic()
            try:
                windows.append(window_of(*next(loader)))
            except Exception as exc:  # noqa: BLE001
                err, took = exc, time.monotonic() - call
            assert time.monotonic() - started < 20, f"no error within 20 s {info}"
        worker_pids = {p.pid for p in loader.debug().workers}
    assert isinstance(err, shmloader.WorkerError), f"{type(err).__name__}: {err} {info}"
    assert took < DETECT_S, f"the raising next() took {took:.2f} s {info}"
    msg = str(err)
    m = re.search(r"worker (\d) \(pid (\d+)\)", msg)
    assert m and int(m.group(2)) in worker_pids, f"no worker and pid in: {msg} {info}"
    assert str(paths[0]) in msg and f"row group {bad // RG}" in msg, f"{msg} {info}"
    assert "ValueError" in msg and "'boom'" in msg, msg
    assert "Traceback (most recent call last)" in msg and "helpers.py" in msg and "int(tok)" in msg, msg
    print(f"worker ValueError seed {seed}: raised by a next() of {took:.3f} s after {len(windows)} batches")
    # what came before the failure is the exact stream, and nothing past the bad document came
    stream = np.concatenate([np.concatenate([[0], np.arange(p + 1, p + 1 + WORDS)])
                             for p in range(0, bad * (WORDS + 1), WORDS + 1)])
    assert len(windows) <= len(stream) // W, f"a batch past the bad document was yielded {info}"
    for k, w in enumerate(windows):
        assert np.array_equal(w, stream[k * W:(k + 1) * W]), f"batch {k} differs {info}"
    assert_clean()


def test_a_childs_error_is_raised_again_at_every_next_after_it(tmp_path):
    """A worker's exception ahead of the stream (IntTokenizer's ValueError on "boom") is a
    WorkerError at once, and every next() after it raises it again: no batch, no heal (it
    would raise again), also once its worker has exited. Before, that exit (code 0, after its
    report) was taken for a death: the next next() calls returned the batches the ring held,
    healed "worker 0 died: exit code 0" until max_restarts was spent, then read on."""
    docs = helpers.position_documents([WORDS] * 600)
    docs[150] = "1 boom"  # row group 4 of file 0, ~130 batches of 9 tokens in
    corpus.write_shards(docs, tmp_path, num_files=2, row_group_size=RG)
    with shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), 1, 8, "train", num_workers=1, n_slots=32,
                             device="cpu", timeout=30) as loader:
        err, _, n = next_until_error(loader)
        assert isinstance(err, shmloader.WorkerError) and "boom" in str(err), f"{type(err).__name__}: {err}"
        for k in range(8):
            time.sleep(0.15)  # the worker's exit shows (the liveness check runs twice a second)
            with pytest.raises(shmloader.WorkerError) as again:
                next(loader)
            assert str(again.value) == str(err), f"next() {k + 1} after the error raised another one: {again.value}"
        assert loader.stats()["heals"] == 0 and loader.stats()["batches"] == n
    assert_clean()


# ---------------------------------------------------------------- a child killed

KILL_CASES = [("worker", signal.SIGKILL, 1), ("worker", signal.SIGSEGV, 2), ("worker", signal.SIGKILL, 3),
              ("coordinator", signal.SIGKILL, 4), ("coordinator", signal.SIGSEGV, 5)]


# default: each kill once, on the header path (1, 3, 5) or the system-call path (2, 4); the rest with -m slow
@pytest.mark.parametrize("handover,who,sig,seed", cross(
    ["header", "syscall"], [pytest.param(w, s, n, id=f"{w}-{s.name}-{n}") for w, s, n in KILL_CASES],
    default={"header-worker-SIGKILL-1", "syscall-worker-SIGSEGV-2", "header-worker-SIGKILL-3",
             "syscall-coordinator-SIGKILL-4", "header-coordinator-SIGSEGV-5"}), indirect=["handover"])
def test_child_killed_at_random_moment(synth, who, sig, seed, handover):
    rng = random.Random(seed)
    n_workers = 3
    at_batch = rng.randrange(1, 80)
    victim = rng.randrange(n_workers)
    delay = rng.uniform(0, 0.05)
    info = (f"(seed {seed}: {who} {victim if who == 'worker' else ''} after batch {at_batch} + {delay:.3f} s, "
            f"{handover} handover)")
    with synth.loader(2, 32, "val", num_workers=n_workers, timeout=30, max_restarts=0) as loader:
        for _ in range(at_batch):
            next(loader)
        proc = loader.debug().workers[victim] if who == "worker" else loader.debug().coordinator
        pid = proc.pid
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))  # no core file from SIGSEGV
        time.sleep(delay)
        os.kill(pid, sig)
        killed = time.monotonic()
        err, _, n = next_until_error(loader)
        detect = time.monotonic() - killed
    assert isinstance(err, shmloader.WorkerError), f"{type(err).__name__}: {err} {info}"
    assert detect < DETECT_S, f"reported {detect:.2f} s after the kill {info}"
    msg = str(err)
    name = f"worker {victim}" if who == "worker" else "coordinator"
    assert name in msg and f"pid {pid}" in msg and sig.name in msg, f"{msg} {info}"
    print(f"{who} {sig.name} seed {seed}: reported {detect:.3f} s after the kill, {n} batches later")
    assert_clean()


@pytest.mark.parametrize("handover, who", [
    ("syscall", "worker"), ("header", "coordinator"),  # each path of the handover, each kind of child
    pytest.param("header", "worker", marks=pytest.mark.slow),
    pytest.param("syscall", "coordinator", marks=pytest.mark.slow)])
def test_child_frozen_is_a_timeout_not_a_hang(synth, who, handover, monkeypatch):
    """A child that is alive but makes no progress (SIGSTOP): next() raises LoaderTimeout
    after `timeout=` seconds, naming every process and the stopped one as stopped; close()
    still stops everything. Both handover paths and both kinds of child by default, the two
    other pairs in the slow suite: the trainer's wait does not know which child stopped."""
    monkeypatch.setenv("SHMLOADER_HANDOVER", handover)
    with synth.loader(2, 32, "val", num_workers=2, timeout=1.0, max_restarts=0) as loader:
        for _ in range(3):
            next(loader)
        proc = loader.debug().workers[0] if who == "worker" else loader.debug().coordinator
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        err, _, n = next_until_error(loader, limit_s=10.0)
        waited = time.monotonic() - stopped
        assert isinstance(err, shmloader.LoaderTimeout), f"{type(err).__name__}: {err}"
        msg = str(err)
        assert "1 s" in msg and all(f"pid {p.pid}" in msg for p in loader.debug().workers), msg
        assert f"pid {loader.debug().coordinator.pid}" in msg, msg
        assert f"pid {proc.pid}) (stopped" in msg and msg.count("(stopped") == 1, msg
        closing = time.monotonic()
    closed = time.monotonic() - closing
    print(f"{who} SIGSTOP: LoaderTimeout {waited:.2f} s after the stop ({n} batches), close {closed:.2f} s")
    assert closed < 5.0, f"close() took {closed:.1f} s with a stopped {who}"
    assert_clean()


# ---------------------------------------------------------------- the trainer killed

def _start_victim(synth, tok_pkl, workers=2, *extra):
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "trainer_victim.py"), str(synth.root), str(tok_pkl),
                             "--workers", str(workers), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    box = {}
    reader = threading.Thread(target=lambda: box.setdefault("line", proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    if not box.get("line"):
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=10)
        pytest.fail(f"the trainer printed no pids: {err}")
    return proc, json.loads(box["line"])


def _signal_mid_stream(proc, send) -> float:
    """After a moment of batches, `send()` a signal to the trainer and wait for it to exit (its
    group is SIGKILLed if it does not); returns when the signal was sent."""
    try:
        time.sleep(random.uniform(0.05, 0.3))  # mid-stream
        assert proc.poll() is None, proc.communicate()[1]
        send()
        sent = time.monotonic()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    proc.stdout.close()
    return sent


def _stderr_once_closed(proc, seconds: float = 10.0) -> str:
    """The trainer's stderr once every process writing to it (the trainer, multiprocessing's
    forkserver and resource tracker) has exited."""
    box = {}
    reader = threading.Thread(target=lambda: box.setdefault("err", proc.stderr.read()), daemon=True)
    reader.start()
    reader.join(seconds)
    assert "err" in box, f"something kept the killed trainer's stderr open for {seconds} s"
    return box["err"]


# each signal and each target by default (two pairs of four), the other two pairs in the slow suite:
# either signal ends the trainer at once, with no handler of shmloader's run
@pytest.mark.parametrize("group, sig", [
    (False, signal.SIGKILL), (True, signal.SIGTERM),
    pytest.param(False, signal.SIGTERM, marks=pytest.mark.slow),
    pytest.param(True, signal.SIGKILL, marks=pytest.mark.slow)],
    ids=["trainer-only-SIGKILL", "process-group-SIGTERM", "trainer-only-SIGTERM", "process-group-SIGKILL"])
def test_trainer_killed(synth, synth_tokenizer_pkl, group, sig):
    """The trainer killed (SIGKILL, or SIGTERM with Python's default action, as schedulers send
    it): its children exit, its segment goes (the coordinator unlinks it; a whole killed group
    leaves it to the next loader's sweep), and nothing is printed about leaked shared memory."""
    proc, info = _start_victim(synth, synth_tokenizer_pkl)
    pid = info["pid"]
    loader_pids = [info["coordinator"], *info["workers"]]
    helpers = [p for p in info["descendants"] if p not in loader_pids]
    assert len(info["workers"]) == 2 and set(loader_pids) <= set(info["descendants"]), info
    assert shm_segments(pid) == [info["segment"]], info
    killed = _signal_mid_stream(proc, lambda: os.killpg(pid, sig) if group else os.kill(pid, sig))
    assert proc.returncode == -sig
    left = wait_gone(loader_pids)
    gone_s = time.monotonic() - killed
    assert not left, f"loader processes outlived the killed trainer by {DETECT_S} s: {left}"
    left = wait_gone(helpers)
    assert not left, f"multiprocessing helpers outlived the killed trainer by {DETECT_S} s: {left}"
    err = _stderr_once_closed(proc)
    assert "leaked" not in err and "Traceback" not in err, f"the killed trainer's processes printed: {err}"
    if not group:
        # the coordinator, seeing the trainer gone with the segment still there, unlinks it
        segs = wait_no_segment(pid)
        seg_s = time.monotonic() - killed
        assert not segs, f"the killed trainer's segment is still there after {DETECT_S} s: {segs}"
        print(f"trainer-only: children gone {gone_s:.3f} s, segment gone {seg_s:.3f} s after {sig.name}")
        return
    # the whole group died, the resource tracker with it: the segment stays until swept (by the
    # next loader here, or by a loader of another process started meanwhile)
    assert shm_segments(pid) in ([info["segment"]], []), "the dead group's segment is not its own"
    with synth.loader(2, 32, "val", num_workers=1) as loader:
        next(loader)  # starting a loader sweeps the segments of dead creators
        assert shm_segments(pid) == [], "a new loader did not sweep the dead trainer's segment"
    assert info["segment"] not in segmod.sweep_stale()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shml_{pid}_")]
    print(f"process-group: children gone {gone_s:.3f} s after {sig.name}; segment swept by the next loader")


def _unlistened(dirs: set) -> set:
    """Those of `dirs` in which no live process listens (a `pymp-*` directory holds its forkserver's
    socket: another test's live pool, run beside this one by xdist, keeps its own; the dead
    trainer's would have none)."""
    with open("/proc/net/unix") as f:
        paths = [line.split()[-1] for line in f.read().splitlines()[1:] if len(line.split()) >= 8]
    return {d for d in dirs if not any(p.startswith(d + os.sep) for p in paths)}


def test_a_killed_trainer_leaves_no_temporary_directory(synth, synth_tokenizer_pkl):
    """multiprocessing's `pymp-*` directory (the forkserver's socket) outlived every trainer
    killed with SIGKILL; the trainer's temporary directory is shmloader's now, and the next
    loader (of any process) sweeps it once its owner is gone."""
    import glob
    import tempfile
    tmp = tempfile.gettempdir()
    before = set(glob.glob(os.path.join(tmp, "pymp-*")))
    proc, info = _start_victim(synth, synth_tokenizer_pkl)
    pid = info["pid"]
    assert len(glob.glob(os.path.join(tmp, f"shml_tmp_{pid}_*"))) == 1
    _signal_mid_stream(proc, lambda: os.killpg(pid, signal.SIGKILL))
    assert wait_gone([info["coordinator"], *info["workers"]]) == []
    new = set(glob.glob(os.path.join(tmp, "pymp-*"))) - before
    assert _unlistened(new) == set(), "multiprocessing made its own"
    with synth.loader(2, 32, "val", num_workers=1) as loader:
        next(loader)
    assert glob.glob(os.path.join(tmp, f"shml_tmp_{pid}_*")) == [], "the dead trainer's directory was not swept"


def test_sigterm_handled_by_the_users_handler_cleans_up(synth, synth_tokenizer_pkl):
    """A training script that handles SIGTERM itself (sys.exit in the handler) closes its loaders
    on the way out: children gone, segment unlinked, nothing printed about leaks."""
    proc, info = _start_victim(synth, synth_tokenizer_pkl, 2, "--sigterm-exits")
    _signal_mid_stream(proc, lambda: os.kill(info["pid"], signal.SIGTERM))
    assert proc.returncode == 0
    assert not wait_gone([info["coordinator"], *info["workers"]]), "loader processes outlived the exit"
    assert not shm_segments(info["pid"]), "the segment outlived the handled SIGTERM"
    err = _stderr_once_closed(proc)
    assert "leaked" not in err and "Traceback" not in err, err


# ---------------------------------------------------------------- /dev/shm too small

def test_no_room_in_dev_shm(synth, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    B, T, n_slots = 4, 64, 8
    need = ringmod.RingLayout(n_slots, B * T + 1, 2).nbytes / 2**20
    loader = synth.loader(B, T, "val", num_workers=2, n_slots=n_slots)
    try:
        started = time.monotonic()
        with pytest.raises(shmloader.ShmLoaderError) as info:
            next(loader)
        assert time.monotonic() - started < DETECT_S
        assert loader_children() == [] and shm_segments() == [], "a failed start left something behind"
    finally:
        loader.close()
    msg = str(info.value)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC, msg
    assert re.search(rf"needs {need:.1f} MiB \([\d,]+ bytes\) .* only \d+\.\d MiB \([\d,]+ bytes\) are free", msg), msg
    assert "/dev/shm" in msg and "shm-size" in msg, msg
    assert_clean()


def test_a_read_only_dev_shm(synth, monkeypatch):
    """/dev/shm refuses the segment (read-only, EROFS, stubbed here): the first next() raises
    a ShmLoaderError naming /dev/shm, the size and what to do, raised from the OSError, and
    nothing is left running."""
    def read_only(name, create=False, size=0):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), f"/{name}")

    monkeypatch.setattr(segmod, "open_shared", read_only)
    loader = synth.loader(4, 64, "val", num_workers=2)
    try:
        with pytest.raises(shmloader.ShmLoaderError, match=r"MiB .* of shared memory in /dev/shm .* read-only") as info:
            next(loader)
        assert loader_children() == [] and shm_segments() == [], "a failed start left something behind"
    finally:
        loader.close()
    assert info.value.__cause__.errno == errno.EROFS and "--shm-size" in str(info.value)
    assert_clean()


# ---------------------------------------------------------------- many cycles

def _resources() -> dict:
    shm = [n for n in os.listdir("/dev/shm") if n.startswith(f"shml_{os.getpid()}_")]
    return {"fds": len(os.listdir("/proc/self/fd")), "children": len(loader_children()),
            "threads": len(os.listdir("/proc/self/task")), "shm": len(shm)}


def _cycles(synth, n: int):
    def cycle():
        with synth.loader(1, 8, "val", num_workers=1, n_slots=2) as loader:
            for _ in range(3):
                next(loader)

    for _ in range(3):  # warm up: the forkserver, the resource tracker, lazy imports
        cycle()
    gc.collect()
    before = _resources()
    started = time.monotonic()
    for _ in range(n):
        cycle()
    took = time.monotonic() - started
    deadline = time.monotonic() + 2  # the last cycle's children are joined by close()
    while _resources()["children"] and time.monotonic() < deadline:
        time.sleep(0.02)
    gc.collect()
    after = _resources()
    print(f"{n} cycles in {took:.1f} s ({took / n * 1000:.0f} ms each): before {before}, after {after}")
    assert before["children"] == 0 and before["shm"] == 0, before
    assert after == before, f"resources grew over {n} create/iterate/close cycles: {before} -> {after}"


def test_create_close_cycles(synth):
    _cycles(synth, 40)  # 1000 with -m slow


@pytest.mark.slow
@pytest.mark.deadline(600)  # 1000 loaders, about 0.1 s each, longer on a loaded machine
def test_create_close_cycles_1000(synth):
    _cycles(synth, 1000)


# ---------------------------------------------------------------- restarts at random kill points

RESTART_SEEDS = [pytest.param(s, marks=[] if s < 1 else [pytest.mark.slow]) for s in range(20)]  # 1 by default: the suite's 10 minutes
TOTAL, RB, RT = 90, 2, 32


@pytest.fixture(scope="module")
def restart_oracle(synth):
    windows, _ = synth.expected(TOTAL, RB, RT, "train")
    return [hashlib.sha256(w.tobytes()).hexdigest() for w in windows]


@pytest.mark.parametrize("seed", RESTART_SEEDS)
@pytest.mark.deadline(300)  # a hang guard over its own: three trainers, each starting torch (60, 60, 120 s)
def test_restarts_at_random_kill_points(synth, synth_tokenizer_pkl, restart_oracle, tmp_path, seed):
    """Kill the trainer with SIGKILL at 2 random points (random worker counts per run), resume
    each time from its last checkpoint: the logged stream equals the uninterrupted one."""
    rng = random.Random(seed)
    a = rng.randrange(3, TOTAL // 2)
    kills = [a, rng.randrange(a + 4, TOTAL - 10)]
    workers = [rng.randint(1, 3) for _ in range(len(kills) + 1)]
    info = f"(seed {seed}: kills after {kills} logged batches, workers {workers})"
    base = [sys.executable, str(SCRIPTS / "restart_trainer.py"), "--data", str(synth.root),
            "--tokenizer", str(synth_tokenizer_pkl), "--out", str(tmp_path), "--total", str(TOTAL),
            "--batch-size", str(RB), "--seq-len", str(RT), "--step-s", "0.002"]
    log = tmp_path / "log.jsonl"
    log.touch()
    dead = [sigkill_after(base + ["--workers", str(w)], tmp_path, log, at, info)
            for at, w in zip(kills, workers)]
    last = subprocess.run(base + ["--workers", str(workers[-1])], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert last.returncode == 0, f"{info}\n{last.stderr}"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["k"] for r in records] == list(range(TOTAL)), info
    runs = list(dict.fromkeys(r["pid"] for r in records))
    assert runs[:-1] == dead and len(runs) == len(kills) + 1, f"runs {runs} {info}"
    for r in records:
        assert r["sha"] == restart_oracle[r["k"]], f"batch {r['k']} differs {info}"
    assert not shm_segments(runs[-1]), info
    assert not wait_gone(json.loads((tmp_path / f"pids-{runs[-1]}.json").read_text()), 2.0), info


def test_a_large_ring_fills_while_the_trainer_does_not_read(synth):
    """More announcements than the trainer's pipe holds (about 270 small messages): the
    coordinator must not block in send to a trainer away from next(), or it stops serving the
    workers and a 400-slot ring stops filling at about 280."""
    with synth.loader(1, 7, "train", num_workers=2, n_slots=400) as loader:
        next(iter(loader))
        deadline = time.monotonic() + 30
        while loader.stats()["ring_ready"] < 399 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert loader.stats()["ring_ready"] == 399
        for _ in range(399):  # and every announcement arrives
            next(loader)
