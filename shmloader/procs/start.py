"""Starting a loader's children, so that nothing of the training process leaks into them.

Every child starts with an explicit start method: forkserver by default (children are forked
from a clean server that preloaded the worker modules, never from the trainer, so they inherit
neither torch, CUDA state nor the trainer's pipe ends) or spawn; never fork. The children's
targets live in shmloader modules, so they get no `__main__` to import (`_main_hidden`) and a
training script is never re-run in them. They are created with SIGINT blocked (`_start`), so
that a Ctrl-C during start-up reaches only the trainer.

multiprocessing keeps the forkserver's socket in a temporary directory it removes at exit,
named `pymp-*`, which says nothing of its owner: a trainer killed with SIGKILL leaves it in
/tmp. So before the forkserver starts, the training process's temporary directory is made
here (`_tempdir`), named `shml_tmp_<pid>_<random>` and holding a lock file the process keeps
locked for its life; each loader sweeps the directories of that exact name whose lock nobody
holds (their process is gone, in whatever pid namespace it ran).
"""
import contextlib
import enum
import fcntl
import glob
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.spawn
import multiprocessing.util
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import replace
from typing import NamedTuple
from multiprocessing import resource_tracker

from .. import errors
from ..data import tokenizer as tokmod
from ..ipc.handover import Doorbell, TrainerEnd
from ..ipc.signals import sigint_blocked
from .coordinator import coordinator_main
from .reaper import close_each
from .worker import worker_main

# tiktoken too: every worker unpickles an Encoding (a missing module is skipped by the server);
# forkready last: it says the server has booted (`booting`)
PRELOAD = ["shmloader.procs.worker", "shmloader.procs.coordinator", "tiktoken", "shmloader.procs.forkready"]
BOOT_POLL_S = 0.01  # the starter's look at a booting forkserver
BOOT_S = 30.0  # a server not booted after this long is waited for, as any start waits (`booting`)
READY = "forkserver-{pid}.ready"  # the file a booted server leaves in the trainer's temporary directory (forkready.py)


class Boot(NamedTuple):
    """The forkserver this process launched, until it is seen booted."""
    pid: int
    marker: str      # the file its last preload leaves (procs/forkready.py)
    launched: float  # time.monotonic() at its launch


_BOOT: "Boot | None" = None


def prestart(start_method: str):
    """Launch multiprocessing's forkserver now, without waiting for it.

    The first loader of a process starts the server, a fresh interpreter that imports the
    PRELOAD modules (numpy, pyarrow, tiktoken); called when a loader is built,
    those imports overlap the rest of the construction and the ring's creation instead of
    delaying the first child. Later loaders find it running (a waitpid). Started with SIGINT
    blocked, as `_start` explains."""
    if start_method != "forkserver":
        return
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    with _main_hidden():
        _ensure_forkserver()


def _fresh(lock):
    """A new lock of `lock`'s kind (a Lock or an RLock: multiprocessing's differ between versions)."""
    return threading.RLock() if isinstance(lock, type(threading.RLock())) else threading.Lock()


def forget_forkserver():
    """In a child forked (`os.fork()`) from a process that started the forkserver: the server
    is the parent's, not this process's child (multiprocessing would wait for it and fail), so
    this process forgets it, and starts a server of its own if it makes a loader."""
    server = multiprocessing.forkserver._forkserver  # noqa: SLF001 (multiprocessing keeps no public handle)
    # a loader's starter thread (`Start.later`) may have held these at the fork: new ones
    server._lock = _fresh(server._lock)  # noqa: SLF001
    tracker = resource_tracker._resource_tracker  # noqa: SLF001
    tracker._lock = _fresh(tracker._lock)  # noqa: SLF001
    if server._forkserver_pid is None:  # noqa: SLF001
        return
    if server._forkserver_alive_fd is not None:  # noqa: SLF001 (the parent keeps its own copy)
        os.close(server._forkserver_alive_fd)  # noqa: SLF001
    server._forkserver_alive_fd = server._forkserver_address = server._forkserver_pid = None  # noqa: SLF001
    config = multiprocessing.current_process()._config  # noqa: SLF001
    if os.path.basename(config.get("tempdir") or "").startswith(TEMP_PREFIX):  # the parent's: it removes it
        config["tempdir"] = None


TEMP_PREFIX = "shml_tmp_"
TEMP_NAME = re.compile(r"shml_tmp_\d+_[a-z0-9_]{8}")  # tempfile.mkdtemp's 8 random characters
TEMP_LOCK = ".owner"
UNBORN_S = 60.0  # a temporary directory without its lock file yet is being made, for this long
#                  (the lock file is locked before it gets its name, so one with it is judged by it)


def _tempdir():
    """multiprocessing's temporary directory for this process, made by shmloader when nobody
    has made one yet (see the module docstring); and the sweep of those left by dead ones."""
    _sweep_tempdirs()
    config = multiprocessing.current_process()._config  # noqa: SLF001 (get_temp_dir reads it first)
    if config.get("tempdir") is not None:
        return
    path = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}_")
    fd = os.open(os.path.join(path, TEMP_LOCK + ".new"), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held for the process's life: the kernel drops it at its death
    os.rename(os.path.join(path, TEMP_LOCK + ".new"), os.path.join(path, TEMP_LOCK))  # seen locked
    config["tempdir"] = path
    multiprocessing.util.Finalize(None, _remove_tempdir, args=(shutil.rmtree, path, fd), exitpriority=-100)


def _remove_tempdir(rmtree, path: str, fd: int):
    rmtree(path, ignore_errors=True)
    os.close(fd)


def _sweep_tempdirs():
    """Remove shmloader's temporary directories whose owner is gone (their lock is free)."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), TEMP_PREFIX + "*")):
        if not TEMP_NAME.fullmatch(os.path.basename(path)):
            continue  # not one of ours
        try:
            fd = os.open(os.path.join(path, TEMP_LOCK), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                if time.time() - os.stat(path).st_mtime > UNBORN_S:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its process holds it
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)


def _ensure_forkserver():
    """The forkserver, started with SIGINT blocked (see `_start`); the resource tracker first,
    because starting it unblocks SIGINT. Its socket goes in `_tempdir()`. A server launched
    here is `booting` until its last preload says otherwise."""
    global _BOOT
    _tempdir()
    resource_tracker.ensure_running()
    server = multiprocessing.forkserver._forkserver  # noqa: SLF001 (its pid: no public handle)
    before = server._forkserver_pid  # noqa: SLF001
    with sigint_blocked():
        multiprocessing.forkserver.ensure_running()
    pid, tempdir = server._forkserver_pid, multiprocessing.util.get_temp_dir()  # noqa: SLF001
    if pid != before and TEMP_NAME.fullmatch(os.path.basename(tempdir)) and "shmloader.procs.forkready" in PRELOAD:
        _BOOT = Boot(pid, os.path.join(tempdir, READY.format(pid=pid)), time.monotonic())


def booting(start_method: str) -> bool:
    """Whether this process's forkserver, launched by a loader of this process, is still
    importing its preloads: a child started now would wait for them. False once its marker
    is there (procs/forkready.py), once it is dead (a start launches another), for a server
    launched by someone else (no marker comes: the start waits, as it always did), for spawn,
    and after `BOOT_S`."""
    global _BOOT
    boot = _BOOT
    if start_method != "forkserver" or boot is None:
        return False
    server = multiprocessing.forkserver._forkserver  # noqa: SLF001
    if (server._forkserver_pid != boot.pid or os.path.exists(boot.marker)  # noqa: SLF001
            or not _running(boot.pid) or time.monotonic() - boot.launched > BOOT_S):
        _BOOT = None
        return False
    return True


def _running(pid: int) -> bool:
    """Whether process `pid` (a child of this one) runs: not gone, not a zombie. It is not
    reaped here: multiprocessing reaps its server itself."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def wait_booted(start_method: str = "forkserver", timeout: float = BOOT_S) -> bool:
    """Launch the forkserver if it is not running and wait until it has booted (tests, tools,
    and a trainer that wants its loader's children started at its first `next()`). Returns
    whether it had booted within `timeout` s."""
    prestart(start_method)
    deadline = time.monotonic() + timeout
    while booting(start_method):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


class Unstarted(NamedTuple):
    """A run's children made and not started (`spawn(..., now=False)`), with the pipes' ends
    that are theirs: closed once they are started, or the run stops."""
    procs: list
    ends: tuple
    start_method: str


class Phase(enum.Enum):
    """Where a run's children stand from their making to their start (`Start.phase`). Its moves,
    each made in one place:
    - MADE -> LATER (`Start.later`), or -> STARTED (`Start.now`, `Start.wait`);
    - LATER -> RAN (the thread's start is over, started or raised), or -> STARTED (`Start.now`: the
      caller started them first, and the thread starts nothing);
    - RAN -> STARTED (`Start.wait`: what the thread's start raised is raised, once);
    - any -> STOPPED (`Start.drop`: the run stops; `Start.forget`: a forked copy), the last: a start
      under way when the run stopped does not move it back.
    `PENDING`: something is still to start, or a thread's start to wait for."""
    MADE = "made"          # made, not started, and nobody is starting them
    LATER = "later"        # a thread ("shmloader-start") starts them once the forkserver has booted
    RAN = "ran"            # the thread's start is over (`Start._error`: what it raised), not waited for yet
    STARTED = "started"    # started (or their start raised to the caller): nothing is left to start
    STOPPED = "stopped"    # the run stopped first, or this is a forked copy: nothing starts here any more


PENDING = frozenset({Phase.MADE, Phase.LATER, Phase.RAN})
UNSTARTED = frozenset({Phase.MADE, Phase.LATER})


class Start:
    """A run's children from their making to their start: by a thread of the training process
    once the forkserver has booted (`later`), or by the caller (`wait`, which
    first waits for that thread and raises what its start raised); or never, the run stopped
    first (`drop`: their pipes' ends closed). One lock orders a start and a drop. Where they
    stand is one `Phase` (`phase`); `waiting`: made and not started yet (MADE, LATER); `pending`:
    waiting, or a thread's start not yet waited for (RAN: what it raised is still to raise).
    `on_started()` runs once they are started."""

    def __init__(self, unstarted: Unstarted, on_started):
        self._unstarted, self._on_started = unstarted, on_started  # what to start, until started or dropped
        self._phase = Phase.MADE
        self._thread, self._error = None, None  # LATER and RAN: the thread, and what its start raised
        self._lock = threading.Lock()

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def waiting(self) -> bool:
        return self._phase in UNSTARTED

    @property
    def pending(self) -> bool:
        return self._phase in PENDING

    def later(self):
        """Start them in a thread ("shmloader-start") once the forkserver has booted (MADE -> LATER)."""
        if self._phase is not Phase.MADE:
            return
        self._phase = Phase.LATER
        self._thread = threading.Thread(target=self._when_booted, args=(self._unstarted.start_method,),
                                        name="shmloader-start", daemon=True)
        self._thread.start()

    def _when_booted(self, start_method: str):
        while self._phase is Phase.LATER and booting(start_method):
            time.sleep(BOOT_POLL_S)
        with self._lock:
            if self._phase is not Phase.LATER:  # stopped, or the caller started them
                return
            try:
                self._start(Phase.RAN)
            except BaseException as exc:  # raised in the trainer's thread, at `wait`
                self._error = exc

    def wait(self, timeout: float):
        """Return once they are started: wait for the thread (LATER, RAN: at most `timeout` s,
        then `LoaderTimeout`) and raise what its start raised (RAN -> STARTED); start them here
        if it did not (`now`). The lock, taken after the thread ended, is held only by a `drop`
        in another thread: not taken within what is left of `timeout`, a `LoaderTimeout` too (the
        phase stays)."""
        if self._phase in (Phase.LATER, Phase.RAN):
            deadline = time.monotonic() + timeout  # the thread and the lock within one `timeout`
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise errors.LoaderTimeout(f"the loader's processes did not start within {timeout:.0f} s: "
                                           f"multiprocessing's forkserver did not answer")
            if not self._lock.acquire(timeout=max(deadline - time.monotonic(), 0)):
                raise errors.LoaderTimeout(f"the loader's processes started, but their start's lock was not free "
                                           f"within {timeout:.0f} s (another thread of process {os.getpid()} is "
                                           f"stopping the loader: close() or a shutdown under way)")
            try:
                if self._phase is Phase.RAN:
                    self._phase, self._thread = Phase.STARTED, None
                error, self._error = self._error, None
            finally:
                self._lock.release()
            if error is not None:
                raise error
        self.now()

    def now(self):
        """Start them here, now (MADE or LATER -> STARTED; nothing in another phase)."""
        with self._lock:
            if self._phase in UNSTARTED:
                self._start(Phase.STARTED)

    def _start(self, then: Phase):
        """Start what is made, waiting for a booting forkserver, and move to `then` (RAN, the
        thread's; STARTED, the caller's) whatever happens; their pipes' ends are closed here."""
        later = self._unstarted
        try:
            with _main_hidden():
                _start(later.procs, later.start_method)
        finally:
            self._unstarted = None
            if self._phase is not Phase.STOPPED:  # a drop that did not wait for this start stays
                self._phase = then
            self._on_started()
            close_each(later.ends)

    def drop(self, timeout: float):
        """The run stops (any phase -> STOPPED): start nothing more; a start under way (at most
        `timeout` s) ends first, and the pipes' ends of what was never started are closed. A start
        still under way after `timeout` s keeps what it starts (it closes their ends itself) and
        leaves the phase STOPPED."""
        self._phase = Phase.STOPPED  # first, unlocked: a thread waiting for the forkserver stops waiting
        if not self._lock.acquire(timeout=timeout):
            return
        try:
            later, self._unstarted, self._phase = self._unstarted, None, Phase.STOPPED  # again: after a start under way
            if later is not None:
                close_each(later.ends)
        finally:
            self._lock.release()

    def forget(self):
        """In a process forked from the trainer (any phase -> STOPPED): the thread and its lock are
        the parent's; this copy starts nothing and closes its copies of the unstarted children's
        pipes' ends."""
        self._lock, self._thread, self._phase = threading.Lock(), None, Phase.STOPPED
        later, self._unstarted = self._unstarted, None
        if later is not None:
            close_each(later.ends)


def spawn(kids, config, cargs, now: bool = True):
    """Create `kids`' coordinator and workers (a `children.Children`: its pipes, doorbells and
    handover are set here) for the run `cargs`, and start them (`now`), or leave them to
    `kids.start` (a `Start`) to start later."""
    ctx = multiprocessing.get_context(config.start_method)
    if config.start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    kids.alive_r, kids.alive_w = ctx.Pipe(duplex=False)  # the read end kept: a replaced worker gets it too
    alive_r = kids.alive_r
    kids.conn, coord_end = ctx.Pipe()
    kids.ready, kids.kick = Doorbell(), Doorbell()
    kids.handover = TrainerEnd(kids.ring, kids.ready, kids.kick)
    pipes = [ctx.Pipe() for _ in range(config.num_workers)]
    theirs, its = _spilled(cargs), replace(cargs, tokenizer=None)  # the coordinator never tokenizes
    kids.coordinator = ctx.Process(target=coordinator_main, name="shmloader-coordinator", daemon=True,
                                   args=(config, its, coord_end, [a for a, _ in pipes], alive_r,
                                         (kids.ready, kids.kick, kids.handover.header_only)))
    for i, (_, end) in enumerate(pipes):
        kids.workers.append(ctx.Process(target=worker_main, name=f"shmloader-worker-{i}", daemon=True,
                                        args=(config, replace(theirs, worker=i), end, alive_r)))
    kids.start = Start(Unstarted(kids.procs, (coord_end, *(c for pair in pipes for c in pair)), config.start_method),
                       kids.note_started)
    if now:
        kids.start.now()


def _spilled(cargs):
    """The workers' run arguments, a large tokenizer payload in a file of the training process's
    temporary directory (`tokenizer.spilled`) rather than in every start's pickle."""
    _tempdir()
    return replace(cargs, tokenizer=tokmod.spilled(cargs.tokenizer, multiprocessing.util.get_temp_dir()))


def respawn_worker(kids, config, cargs, i: int):
    """Start a new worker `i` for `kids` (its predecessor died), as `spawn` starts them;
    `kids.workers[i]` is it. Returns the other end of its pipe, for the coordinator."""
    ctx = multiprocessing.get_context(config.start_method)
    theirs, its = ctx.Pipe()
    p = ctx.Process(target=worker_main, name=f"shmloader-worker-{i}", daemon=True,
                    args=(config, replace(_spilled(cargs), worker=i, replacement=True), its, kids.alive_r))
    try:
        with _main_hidden():
            _start([p], config.start_method)
    except BaseException:
        theirs.close()
        raise
    finally:
        its.close()
    kids.workers[i] = p
    return theirs


def _start(procs, start_method: str):
    """Start the children so that a Ctrl-C (sent to the whole foreground process group)
    cannot interrupt them while they start up: the forkserver's interpreter and preloads, a
    spawned child's interpreter, a forked child's unpickling and bootstrap would each print
    a traceback. Processes are created with SIGINT blocked (`signals.sigint_blocked`; the mask
    survives fork and exec), and each child ignores SIGINT before unblocking it
    (`coordinator_main`, `worker_main`), which drops a pending one. The forkserver ignores
    SIGINT and keeps it blocked, so every child it forks starts blocked (other processes
    forked by the same server, e.g. the user's own, inherit that too).

    The trainer's own side of a start is kept whole too: a request to the forkserver is a
    connection, the child's file descriptors and then its pickled process object, and a
    KeyboardInterrupt between those steps leaves the server a connection that ends early (it
    dies with an EOFError traceback) or the child a truncated object (a traceback of its own).
    So SIGINT stays blocked in the trainer while it starts the children, its Python handler
    deferred too (the trainer's other threads would take the Ctrl-C otherwise), and a Ctrl-C
    that came meanwhile is raised once they are all started (the caller then stops them). Waiting
    for the server's preloads (~0.1-0.4 s after a process's first loader is built, on a
    2-core machine) is part of that, as waiting for a spawned child's interpreter is."""
    resource_tracker.ensure_running()  # before the block: starting it unblocks SIGINT
    if start_method == "forkserver":
        _ensure_forkserver()
    with sigint_blocked():
        for p in procs:
            p.start()


_HIDDEN = threading.local()  # `on`: this thread starts children without the user's __main__
_preparation_data = multiprocessing.spawn.get_preparation_data


def _preparation_without_main(name):
    """multiprocessing's preparation data for a child (or the forkserver), without the main
    module while this thread is in `_main_hidden`; installed as `spawn.get_preparation_data`,
    which multiprocessing looks up at every start: other threads and other users of
    multiprocessing get the original's answer."""
    data = _preparation_data(name)
    if getattr(_HIDDEN, "on", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


multiprocessing.spawn.get_preparation_data = _preparation_without_main


@contextlib.contextmanager
def _main_hidden():
    """Start children without the user's __main__ module.

    multiprocessing's spawn and forkserver re-import the parent's main script in every child
    (so that its functions can be unpickled). Training scripts such as nanochat's run their
    whole training at the top level, so the children would train too. The children's targets
    live in shmloader modules, so their preparation data names no main module (as for an
    interactive session), in this thread only: `sys.modules["__main__"]` is never touched, so a
    start in the background (`Start.later`) cannot change what the trainer's main thread
    sees.
    """
    was = getattr(_HIDDEN, "on", False)
    _HIDDEN.on = True
    try:
        yield
    finally:
        _HIDDEN.on = was
