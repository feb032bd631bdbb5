"""Stopped children joined off the caller's thread, so that dropping a loader costs its caller
nothing it waits on.

A loader that is dropped (collected, or its nanochat generator dropped: base_train assigns a
new val loader over the last at every evaluation) has already unlinked its ring and closed the
alive pipe by the time its processes are joined: every child exits on that pipe's EOF, and
nothing is left to leak but the processes themselves. Joining them took 8-20 ms of the next
evaluation's first batch on 2 cores (docs/benchmarks.md). `REAPER.reap(Dropped(procs,
deadline, after))` hands them to a thread ("shmloader-reap") that joins them by `deadline`, kills what is
left (then joins it for at most `KILL_JOIN_S`), then calls `after()` (the caller's pipes,
closed once the children no longer write to them). `finish` is the same work done in the
caller's thread: `close()` waits for it (`close(wait=False)` does not).

The thread is not a daemon, and it exits once nothing is left to join: the interpreter waits
for it at exit (at most the deadline plus `KILL_JOIN_S`), as multiprocessing's exit handler
waits for every child it started, so no child outlives the trainer's exit through it. Where no thread can start (the interpreter is finalizing) the work is
done in the caller's thread. A process forked from the trainer forgets the processes held here
(they are its parent's; multiprocessing's exit handler would otherwise join them).

Pipes. `after` closes the caller's pipes (`close_each`: every one, also after one fails; a
Connection's or a doorbell's `close()` forgets its descriptor, so a second call is a no-op),
and the queued `Dropped` holds them until then. Nothing else closes them: a dropped loader's
runs are stopped by a `weakref.finalize` that holds them (procs/lifecycle.py), so the
collector never finalizes one itself, as it did when the loader had a `__del__` and was freed
in a reference cycle: `Connection.__del__` closes the descriptor without forgetting it, and
this thread's `close()` closed the number again, by then the caller's next file (issue 49).

The lock is re-entrant: a drop may come from a collection that starts at an allocation inside
a section under it (the caller's `reap`, this thread's loop), which a plain lock deadlocked.

The reaper never calls `Process.close()`: that closes the process's sentinel, which another
thread's `multiprocessing.process._cleanup` (every `Process.start`) may be polling from a
snapshot of the children taken before the join; the sentinel is closed when the object is
collected, which that snapshot holds off.
"""
import logging
import multiprocessing.process
import os
import sys
import threading
import time
from typing import Callable, NamedTuple

KILL_JOIN_S = 1.0
log = logging.getLogger("shmloader")


class Dropped(NamedTuple):
    """Processes told to stop: joined by `deadline` (time.monotonic), then killed; `after()` then."""
    procs: list
    deadline: float
    after: Callable[[], None]


def finish(dropped: Dropped):
    """Join `dropped.procs` by its deadline, kill and join what is left, then call `after`."""
    try:
        for p in dropped.procs:
            p.join(timeout=max(dropped.deadline - time.monotonic(), 0))
        for p in dropped.procs:
            if p.exitcode is None:
                p.kill()
                p.join(timeout=KILL_JOIN_S)
    finally:
        dropped.after()


def close_each(pipes):
    """Close every one of `pipes` (Connections, doorbells: each one's `close()` closes its
    descriptor once and is then a no-op), also after one of them raised; the first error is
    raised once all are tried."""
    failed = None
    for c in pipes:
        try:
            c.close()
        except OSError as exc:
            failed = failed or exc
    if failed is not None:
        raise failed


class Reaper:
    """The dropped runs of this process and the thread that finishes them (the lock is
    re-entrant: see the module's docstring)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._queue: list[Dropped] = []   # handed over, not taken yet
        self._taken: list[Dropped] = []   # taken by a thread, not finished yet
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition(self._lock)

    def reap(self, dropped: Dropped):
        """Finish `dropped` in the reaper's thread (started if none runs), or here when no thread
        can start. A Ctrl-C while the thread starts leaves it started and known: each dropped run
        is taken by one thread only, and a thread that died is replaced at the next drop."""
        with self._lock:
            self._queue.append(dropped)
            if self._thread is not None and self._thread.is_alive():  # it takes this one before it exits
                return
            if not sys.is_finalizing():
                thread = threading.Thread(target=self._run, name="shmloader-reap", daemon=False)
                self._thread = thread  # a drop nested in this one (a collection here) may start its own
                try:
                    thread.start()
                    return
                except RuntimeError:  # "can't create new thread at interpreter shutdown"
                    if self._thread is thread:
                        self._thread = None
            try:
                self._queue.remove(dropped)
            except ValueError:  # a thread a nested drop started has taken it
                return
        finish(dropped)

    def pending(self) -> int:
        """Dropped runs not finished yet."""
        with self._lock:
            return len(self._queue) + len(self._taken)

    def drain(self, timeout: float) -> bool:
        """Wait until every dropped run handed over so far is finished (at most `timeout` s)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queue or self._taken:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _run(self):
        me = threading.current_thread()
        while True:
            with self._lock:
                if not self._queue:
                    if self._thread is me:
                        self._thread = None
                    self._idle.notify_all()
                    return
                dropped = self._queue.pop(0)
                self._taken.append(dropped)
            try:
                finish(dropped)
            except Exception:  # noqa: BLE001 (the thread goes on with the next; nobody else would)
                log.warning("shmloader: joining a stopped loader's processes failed", exc_info=True)
            finally:
                with self._lock:
                    self._taken.remove(dropped)
                    del dropped  # its processes freed (their sentinels closed) before `drain` returns
                    self._idle.notify_all()

    def _forget_in_child(self):
        """In a process forked from the trainer: the held processes are the parent's (the
        ones a thread of the parent had taken are the parent's to finish too)."""
        for dropped in self._queue + self._taken:
            for p in dropped.procs:
                multiprocessing.process._children.discard(p)  # noqa: SLF001 (the set its exit handler reads)
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._queue, self._taken, self._thread = [], [], None


REAPER = Reaper()
os.register_at_fork(after_in_child=REAPER._forget_in_child)
