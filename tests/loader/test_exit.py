"""Every way out (docs/contract.md §4, design "Timeouts and shutdown"): break + close/del of the generator,
close() (twice), `with`, garbage collection, Ctrl-C in the trainer, a dead worker or
coordinator. After each, within 2 s, no loader process and no /dev/shm/shml_<pid>_* segment
remains; nothing hangs (SIGALRM watchdog here, `timeout=` for subprocesses).
"""
import functools
import gc
import itertools
import json
import os
import pickle
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers
from tests.helpers import loader_children, pid_alive, position_of, shm_segments, wait_clean, window_of

pytestmark = pytest.mark.usefixtures("watchdog")


def assert_running(n_workers):
    assert len(loader_children()) == n_workers + 1, "expected the coordinator and the workers"
    assert shm_segments(), "expected the loader's shared memory"


def assert_clean_within(seconds=2.0):
    started = time.monotonic()
    kids, segs = wait_clean(seconds)
    assert not kids, f"loader processes alive {seconds} s after close: {kids}"
    assert not segs, f"shared memory left {seconds} s after close: {segs}"
    return time.monotonic() - started


def generator(synth, **kw):
    return shmloader.tokenizing_distributed_data_loader(2, 32, "val", 2, device="cpu", data=str(synth.root),
                                                        tokenizer=synth.tokenizer, **kw)


@pytest.mark.parametrize("end", ["close", "del"])
def test_break_then_end_generator(synth, end):
    gen = generator(synth)
    for i, _ in enumerate(gen):
        if i == 3:
            break
    assert_running(2)
    if end == "close":
        gen.close()
    else:
        del gen
    assert_clean_within(2.0)


def test_close_twice_and_use_after_close(synth):
    loader = synth.loader(2, 32, "val", num_workers=3)
    next(loader)
    assert_running(3)
    loader.close()
    assert_clean_within(2.0)
    loader.close()  # harmless
    with pytest.raises(shmloader.LoaderClosed):
        next(loader)
    never_started = synth.loader(2, 32, "val")
    never_started.close()
    with pytest.raises(shmloader.LoaderClosed):
        next(never_started)


def test_with_block(synth):
    with synth.loader(2, 32, "val", num_workers=1) as loader:
        for _ in itertools.islice(loader, 5):
            pass
        assert_running(1)
    assert_clean_within(2.0)
    with pytest.raises(shmloader.LoaderClosed):
        next(loader)


def test_with_block_left_by_exception(synth):
    with pytest.raises(ZeroDivisionError):
        with synth.loader(2, 32, "val") as loader:
            next(loader)
            1 / 0
    assert_clean_within(2.0)


@pytest.mark.parametrize("cycle", [False, True], ids=["refcount", "cycle"])
def test_garbage_collection(synth, cycle):
    """A loader dropped without close() is closed: at once by its reference count (nothing of
    the loader refers back to it; nanochat's base_train disables the garbage collector after
    its first step, and drops a val loader at every evaluation), or by the collector when the
    caller made a cycle."""
    loader = synth.loader(2, 32, "val")
    next(loader)
    assert_running(2)
    if cycle:
        loader.myself = loader  # only the cycle collector can free it
    enabled = gc.isenabled()
    gc.disable()
    try:
        del loader
        if cycle:
            gc.collect()
        assert_clean_within(2.0)
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("end", ["drop", "generator close", "close(wait=False)", "close()"])
def test_a_dropped_loader_does_not_wait_for_its_processes_to_exit(synth, end):
    """Dropping a loader (base_train assigns a new val loader over the last at each evaluation)
    unlinks its memory and tells its processes to go, but leaves joining them to a thread
    (procs/reaper.py): with a worker that cannot exit (SIGSTOP), the drop returns at once, the
    segment is gone when it does, and the worker is killed at the 2 s deadline. `close()`
    itself waits for that."""
    from shmloader.procs.children import SHUTDOWN_S
    from shmloader.procs.reaper import REAPER

    gen = generator(synth)
    for i, _ in enumerate(gen):
        if i == 3:
            break
    loader = gen.loader
    kids = loader.debug()
    pids = [kids.coordinator.pid] + [w.pid for w in kids.workers]
    del kids
    os.kill(pids[1], signal.SIGSTOP)
    started = time.monotonic()
    if end == "drop":
        del gen, loader
    elif end == "generator close":
        gen.close()
    else:
        loader.close(**({"wait": False} if end == "close(wait=False)" else {}))
    took = time.monotonic() - started
    assert shm_segments() == [], "the segment outlived the call"
    if end == "close()":
        assert took >= SHUTDOWN_S - 0.1, f"close() returned {took:.2f} s after, before the deadline"
        assert not any(pid_alive(p) for p in pids), "close() returned with its processes alive"
    else:
        assert took < SHUTDOWN_S, f"{end} waited {took:.2f} s for the processes"  # (its deadline; and alive:)
        assert pid_alive(pids[1]), "the stopped worker is gone already: the test proves nothing"
        assert REAPER.drain(SHUTDOWN_S + 3.0), "the reaper did not finish"
        assert not any(pid_alive(p) for p in pids)
    assert_clean_within(1.0)


def test_a_ctrl_c_during_a_drop_comes_after_the_drop_is_whole(synth, monkeypatch, request):
    """A Ctrl-C that lands inside `close(wait=False)` (here: just before the run is handed to
    the reaper) is held until the stop is whole, then raised: the run is handed over and its
    processes are joined, never left half-stopped."""
    from shmloader.procs import children as childmod

    # Ctrl-C as in a terminal's foreground: a run started in the background (a non-interactive
    # shell's `&`, nohup) inherits SIGINT ignored, and the held Ctrl-C was then given back to
    # SIG_IGN, which raises nothing ('DID NOT RAISE')
    request.addfinalizer(functools.partial(signal.signal, signal.SIGINT,
                                           signal.signal(signal.SIGINT, signal.default_int_handler)))

    handed, real_reap = [], childmod.REAPER.reap

    def interrupted_reap(dropped):
        os.kill(os.getpid(), signal.SIGINT)
        # the handler would run here, were it not held: wait until the held one has noted it (the
        # kernel gives it to a thread that does not block it, which a loaded machine runs late)
        held = signal.getsignal(signal.SIGINT).__self__  # ipc/signals.py `_Deferred`
        deadline = time.monotonic() + 30
        while not held.came and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held.came, "the Ctrl-C never came"
        handed.append(dropped)
        real_reap(dropped)

    loader = synth.loader(2, 32, "val")
    next(loader)
    pids = [p.pid for p in (loader.debug().coordinator, *loader.debug().workers)]
    monkeypatch.setattr(childmod.REAPER, "reap", interrupted_reap)
    with pytest.raises(KeyboardInterrupt):
        loader.close(wait=False)
    assert len(handed) == 1, "the Ctrl-C cut the drop short"
    assert childmod.REAPER.drain(5.0) and not any(pid_alive(p) for p in pids)
    assert_clean_within(1.0)


def test_the_interpreter_exit_waits_for_a_dropped_loaders_processes(synth, tmp_path):
    """A script that drops a loader and ends at once leaves no process behind (here a worker
    stopped by SIGSTOP, killed at the 2 s deadline by the reaper, whose thread the exit waits
    for, as multiprocessing's exit handler waits for its children), and prints nothing."""
    script = tmp_path / "drop_and_exit.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, pickle, signal, sys
        import shmloader
        enc = pickle.loads({pickle.dumps(synth.tokenizer)!r})
        gen = shmloader.tokenizing_distributed_data_loader(2, 32, "val", 2, device="cpu",
                                                           data={str(synth.root)!r}, tokenizer=enc)
        next(gen)
        kids = gen.loader.debug()
        pids = [kids.coordinator.pid] + [w.pid for w in kids.workers]
        del kids
        os.kill(pids[1], signal.SIGSTOP)
        print(json.dumps(pids), flush=True)
        del gen
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pids = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not [p for p in pids if pid_alive(p)], "a process outlived the script's exit"
    assert "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- a drop in a reference cycle (issue 49)

class Trainer:
    """Holds its val loader (the nanochat drop-in) and a bound method of itself: a cycle, so only
    the collector frees it and its generator."""

    def __init__(self, synth):
        self.val = generator(synth)
        self.step = self.evaluate

    def evaluate(self):
        return next(self.val)


def drop_in_a_cycle(synth, holder: str) -> set:
    """Read a batch from a loader (`holder` "loader": it refers to itself; "trainer": the drop-in
    held by a `Trainer`), drop it and collect it; returns the `id`s its run's pipes had (not the
    pipes: a reference to them would keep them out of the collected cycle)."""
    if holder == "loader":
        loader = synth.loader(2, 32, "val")
        loader.myself = loader
        next(loader)
    else:
        trainer = Trainer(synth)
        trainer.step()
        loader = trainer.val.loader
    kids = loader._runs.run.children
    pipes = {id(kids.conn), id(kids.alive_r), id(kids.alive_w)}
    kids = loader = trainer = None  # noqa: F841 (only the collector can free the loader now)
    gc.collect()
    return pipes


def open_files(tmp_path, n: int) -> list:
    """`n` files opened read-only: (fd, inode, contents)."""
    out = []
    for i in range(n):
        path = tmp_path / f"user_{i}"
        path.write_bytes(f"file {i}".encode())
        fd = os.open(path, os.O_RDONLY)
        out.append((fd, os.fstat(fd).st_ino, f"file {i}".encode()))
    return out


def lost(files: list) -> list:
    """The files whose descriptor no longer holds them (closed, or another file's since); all closed."""
    gone = []
    for fd, ino, text in files:
        try:
            if os.fstat(fd).st_ino != ino or os.pread(fd, 64, 0) != text:
                gone.append(fd)
            os.close(fd)
        except OSError:
            gone.append(fd)
    return gone


@pytest.fixture
def collector_off():
    """The collector runs only when the test calls it (as in nanochat's base_train)."""
    enabled = gc.isenabled()
    gc.disable()
    yield
    if enabled:
        gc.enable()


@pytest.mark.parametrize("holder", ["loader", "trainer"])
def test_a_loader_collected_in_a_cycle_closes_its_pipes_once(synth, holder, tmp_path, monkeypatch, collector_off):
    """Issue 49: the collector that frees a dropped loader's cycle must not close its pipes
    itself (a Connection's `__del__` closes its descriptor and keeps its handle, so the reaper's
    `close()` closed the number again, then the caller's file). Ten drops, each followed by 8
    files opened and held until the reaper has finished: none is closed under the caller, and
    no pipe of a loader is closed by its `__del__` (they are all closed by `close()`, once)."""
    from multiprocessing.connection import _ConnectionBase

    from shmloader.procs.children import SHUTDOWN_S
    from shmloader.procs.reaper import REAPER

    finalized_open, real_del = set(), _ConnectionBase.__del__

    def recording_del(conn):
        if conn._handle is not None:
            finalized_open.add(id(conn))
        real_del(conn)

    monkeypatch.setattr(_ConnectionBase, "__del__", recording_del)
    for k in range(10):
        pipes = drop_in_a_cycle(synth, holder)
        files = open_files(tmp_path, 8)
        assert REAPER.drain(SHUTDOWN_S + 3.0), "the reaper did not finish"
        assert not lost(files), f"drop {k}: files closed under the caller"
        assert not pipes & finalized_open, f"drop {k}: a pipe closed by its own __del__"
        assert_clean_within(2.0)


def test_drops_in_a_cycle_leak_no_descriptor(synth, collector_off):
    """Eight loaders dropped in cycles (half of them held by a `Trainer`) leave the process the
    descriptors it had after the first (which starts what a process's loaders share). (Twenty
    before: a leak at every drop shows after one; eight still drop each holder four times.)"""
    from shmloader.procs.children import SHUTDOWN_S
    from shmloader.procs.reaper import REAPER

    drop_in_a_cycle(synth, "loader")
    assert REAPER.drain(SHUTDOWN_S + 3.0)
    before = len(os.listdir("/proc/self/fd"))
    for k in range(8):
        drop_in_a_cycle(synth, ("loader", "trainer")[k % 2])
    assert REAPER.drain(SHUTDOWN_S + 3.0), "the reaper did not finish"
    assert len(os.listdir("/proc/self/fd")) == before
    assert_clean_within(2.0)


def test_two_loaders_at_once(synth):
    want = {split: synth.expected(40, 2, 32, split) for split in ("train", "val")}
    got = {"train": ([], []), "val": ([], [])}
    with synth.loader(2, 32, "train", num_workers=2) as train, synth.loader(2, 32, "val", num_workers=1) as val:
        for k in range(40):
            for split, loader in (("train", train), ("val", val)):
                x, y = next(loader)
                got[split][0].append(window_of(x, y))
                got[split][1].append(position_of(loader.state_dict()))
            if k == 0:
                assert len(loader_children()) == 5 and len(shm_segments()) == 2
    for split in ("train", "val"):
        assert len(got[split][0]) == 40
        assert all(np.array_equal(g, w) for g, w in zip(got[split][0], want[split][0])), split
        assert got[split][1] == want[split][1], split
    assert_clean_within(2.0)


def _blocked_in_next(ident: int, timeout: float = 30.0) -> bool:
    """Whether thread `ident` is (within `timeout` s) blocked in next() waiting for a batch."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(ident)
        while frame is not None:
            if frame.f_code.co_name == "_wait_for_batch":
                return True
            frame = frame.f_back
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt])
def test_a_signal_handler_that_closes_the_loader_and_exits_is_not_turned_into_loader_closed(posdata, raised):
    """A SIGTERM handler's `loader.close(); sys.exit(0)` (a preempted job's) landing while
    next() waits: the caller gets its SystemExit (or KeyboardInterrupt), as from any other
    place; it was a LoaderClosed (the close seen as another thread's), and the exit code lost."""
    loader = shmloader.ShmLoader(str(posdata.root), helpers.SlowTokenizer(3.0), 2, 16, "train", num_workers=1,
                                 device="cpu", head_start=False)

    def handler(signum, frame):
        loader.close()
        raise raised(3) if raised is SystemExit else raised()

    main, before = threading.get_ident(), signal.signal(signal.SIGUSR1, handler)
    sender = threading.Thread(target=lambda: _blocked_in_next(main) and os.kill(os.getpid(), signal.SIGUSR1))
    try:
        sender.start()
        with pytest.raises(raised):
            next(loader)
    finally:
        sender.join(60)
        signal.signal(signal.SIGUSR1, before)
        loader.close()
    assert_clean_within(2.0)


# ---------------------------------------------------------------- a child dies

@pytest.mark.parametrize("who,sig", [("worker", signal.SIGKILL), ("worker", signal.SIGSEGV),
                                     ("coordinator", signal.SIGKILL)])
def test_dead_child_is_reported(synth, who, sig):
    with synth.loader(2, 32, "val", num_workers=2, max_restarts=0) as loader:  # a heal: tests/loader/test_heal.py
        for _ in itertools.islice(loader, 3):
            pass
        proc = loader.debug().workers[1] if who == "worker" else loader.debug().coordinator
        pid = proc.pid
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))  # no core file from SIGSEGV
        os.kill(pid, sig)
        started = time.monotonic()
        with pytest.raises(shmloader.WorkerError) as info:
            while time.monotonic() - started < 5:
                next(loader)
        assert time.monotonic() - started < 5, "the death was not reported within 5 s"
    msg = str(info.value)
    assert who in msg and str(pid) in msg and sig.name in msg, msg
    assert_clean_within(2.0)


def test_worker_exception_is_reported_while_batches_are_queued(tmp_path):
    """A worker raises (IntTokenizer cannot read "boom") while finished batches wait in the
    trainer's pipe: next() must raise a WorkerError carrying that exception, not a bare
    "died: exit code 0"."""
    docs = helpers.position_documents([10] * 500)
    # pieces: documents [0, 16), [16, 48), [48, 112), [112, 240): the 4th is handed to the
    # one worker only once the 1st is fully placed (3 pieces in flight), i.e. after the trainer
    # freed batch ~11; by then the ring is full of finished batches from the 2nd piece
    docs[200] = "boom"
    corpus.write_shards(docs, tmp_path, num_files=2, row_group_size=1000)
    with shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), 1, 8, "train", num_workers=1,
                             device="cpu", tokenizer_batch_size=1) as loader:
        started = time.monotonic()
        with pytest.raises(shmloader.WorkerError) as info:
            for _ in range(25):
                next(loader)
                time.sleep(0.005)  # slower than the worker: the ring stays full
            time.sleep(1.0)  # the worker fails meanwhile; announced batches queue up
            for _ in range(1000):
                next(loader)
        assert time.monotonic() - started < 6
    msg = str(info.value)
    assert "worker 0" in msg and "ValueError" in msg and "boom" in msg, msg
    assert_clean_within(2.0)


# ---------------------------------------------------------------- Ctrl-C

TRAINER = textwrap.dedent("""
    import json, os, signal, sys
    # Ctrl-C as in a terminal's foreground: a test run from a background job inherits SIGINT
    # ignored, and Python then raises no KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import shmloader

    def descendants(root):
        table = {}
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            table.setdefault(ppid, []).append(int(p))
        out, stack = [], [root]
        while stack:
            kids = table.get(stack.pop(), [])
            out += kids
            stack += kids
        return out

    data, tok, out = sys.argv[1:4]
    gen = shmloader.tokenizing_distributed_data_loader_with_state(
        8, 512, "val", 1, device="cpu", data=data, tokenizer=tok)
    for n, (inputs, targets, state) in enumerate(gen):
        if n == 0:
            with open(os.path.join(out, "pids.json"), "w") as f:
                json.dump(descendants(os.getpid()), f)
        if n % 20 == 0:
            with open(os.path.join(out, "progress"), "w") as f:
                f.write(str(n))
""")



@pytest.mark.parametrize("group", [False, True], ids=["trainer-only", "process-group"])
def test_keyboard_interrupt(synth, synth_tokenizer_pkl, tmp_path, group):
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(synth.root), str(synth_tokenizer_pkl),
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        progress = tmp_path / "progress"
        while not (progress.exists() and progress.read_text() not in ("", "0")):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the trainer made no progress"
            time.sleep(0.01)
        if group:
            os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C in a terminal
        else:
            os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGINT, err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert err.rstrip().splitlines()[-1] == "KeyboardInterrupt", err
    for text in ("worker.py", "coordinator.py", "Process shmloader", "leaked"):
        assert text not in err, err
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert len(pids) >= 2, pids  # at least the coordinator and the worker
    deadline = time.monotonic() + 2
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in pids if pid_alive(p)], "loader processes outlived the interrupted trainer"
    assert not shm_segments(proc.pid), "the interrupted trainer left shared memory behind"
