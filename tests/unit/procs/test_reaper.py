"""procs/reaper.py: stopped children joined by their deadline, then killed, then `after()`;
in a thread that ends once nothing is left, or in the caller's where no thread may start;
`close_each` closes every pipe once."""
import gc
import multiprocessing.connection
import multiprocessing.process
import os
import signal
import threading
import time

import pytest

from shmloader.ipc.handover import Doorbell
from shmloader.procs import reaper as reapmod
from shmloader.procs.reaper import Dropped, Reaper, close_each, finish


class FakeProcess:
    """Exits `exit_after` s after it is made (None: only when killed)."""

    def __init__(self, exit_after, log):
        self.exit_at = None if exit_after is None else time.monotonic() + exit_after
        self.exitcode, self.log = None, log

    def join(self, timeout=None):
        self.log.append(("join", self, round(timeout or 0, 1)))
        if self.exitcode is not None:
            return
        wait = float("inf") if self.exit_at is None else self.exit_at - time.monotonic()
        if timeout is None or wait <= timeout:
            time.sleep(max(wait, 0))
            self.exitcode = 0
        else:
            time.sleep(timeout)

    def kill(self):
        self.log.append(("kill", self))
        self.exitcode = -9


def test_finish_joins_by_the_deadline_kills_the_rest_then_calls_after():
    log = []
    quick, stuck = FakeProcess(0.01, log), FakeProcess(None, log)
    finish(Dropped([quick, stuck], time.monotonic() + 0.2, lambda: log.append(("after",))))
    assert quick.exitcode == 0 and stuck.exitcode == -9
    kinds = [e[0] for e in log]
    assert kinds == ["join", "join", "kill", "join", "after"], log
    assert log[1][2] <= 0.2 and log[3][2] == reapmod.KILL_JOIN_S


def test_after_is_called_when_a_join_raises():
    class Broken(FakeProcess):
        def join(self, timeout=None):
            raise OSError("gone")
    called = []
    with pytest.raises(OSError):
        finish(Dropped([Broken(0, [])], time.monotonic() + 1, lambda: called.append(1)))
    assert called == [1]


def test_reap_returns_at_once_and_its_thread_finishes_then_ends():
    r, log, done = Reaper(), [], threading.Event()
    slow = FakeProcess(0.3, log)
    t = time.monotonic()
    r.reap(Dropped([slow], time.monotonic() + 2, done.set))
    assert time.monotonic() - t < 0.1, "reap waited for the exit"
    assert r.pending() == 1 and slow.exitcode is None
    threads = [th for th in threading.enumerate() if th.name == "shmloader-reap"]
    assert len(threads) == 1 and not threads[0].daemon
    assert r.drain(5.0) and done.is_set() and slow.exitcode == 0
    threads[0].join(1.0)
    assert not threads[0].is_alive(), "the thread stays once nothing is left"
    # a later drop starts a new thread; several queued are all finished, in order
    first, second = FakeProcess(0.05, log), FakeProcess(0.05, log)
    order = []
    r.reap(Dropped([first], time.monotonic() + 2, lambda: order.append(1)))
    r.reap(Dropped([second], time.monotonic() + 2, lambda: order.append(2)))
    assert r.drain(5.0) and order == [1, 2] and r.pending() == 0


def test_drain_times_out_while_a_process_holds_on():
    r = Reaper()
    stuck = FakeProcess(None, [])
    r.reap(Dropped([stuck], time.monotonic() + 0.5, lambda: None))
    assert not r.drain(0.1)
    assert r.drain(5.0) and stuck.exitcode == -9


def _the_caller_finishes():
    """A dropped process is joined and its pipes closed by `reap`'s caller itself."""
    r, done = Reaper(), []
    p = FakeProcess(0.05, [])
    r.reap(Dropped([p], time.monotonic() + 1, lambda: done.append(1)))
    assert p.exitcode == 0 and done == [1] and r.pending() == 0


def test_while_the_interpreter_finalizes_the_caller_finishes(monkeypatch):
    monkeypatch.setattr(reapmod.sys, "is_finalizing", lambda: True)
    _the_caller_finishes()


def test_no_thread_can_start_the_caller_finishes(monkeypatch):
    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")
    monkeypatch.setattr(reapmod.threading.Thread, "start", refuse)
    _the_caller_finishes()


def test_a_join_that_raises_is_logged_and_the_next_is_finished(caplog):
    class Broken(FakeProcess):
        def join(self, timeout=None):
            raise OSError("gone")
    r, done = Reaper(), []
    r.reap(Dropped([Broken(0, [])], time.monotonic() + 1, lambda: done.append(1)))
    r.reap(Dropped([FakeProcess(0.05, [])], time.monotonic() + 1, lambda: done.append(2)))
    assert r.drain(5.0) and done == [1, 2]
    assert "joining a stopped loader's processes failed" in caplog.text


def test_a_forked_child_forgets_the_parents_processes():
    """The child of a fork has no reaper thread and must not join its parent's processes
    (multiprocessing's exit handler would, from the set of children it inherited)."""
    stuck = FakeProcess(None, [])
    multiprocessing.process._children.add(stuck)
    try:
        reapmod.REAPER.reap(Dropped([stuck], time.monotonic() + 3.0, lambda: None))  # killed after the fork's checks,
        #                                                                          even on a loaded machine
        pid = os.fork()
        if pid == 0:
            signal.alarm(5)  # a lock the parent's reaper held at the fork would hang this
            ok = (reapmod.REAPER.pending() == 0 and reapmod.REAPER.drain(0.01)
                  and stuck not in multiprocessing.process._children)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert reapmod.REAPER.pending() == 1, "the parent's reaper forgot its own"
        assert reapmod.REAPER.drain(10.0) and stuck.exitcode == -9
    finally:
        multiprocessing.process._children.discard(stuck)


def test_a_ctrl_c_while_the_thread_starts_leaves_one_known_thread(monkeypatch):
    """A KeyboardInterrupt in `Thread.start()` once the thread runs (a Ctrl-C during a drop, in
    the wait for its start): the thread is the reaper's, later drops are finished by it or its
    successor, each once, and no second thread takes the same one."""
    real_start = threading.Thread.start

    def start_then_interrupt(self):
        real_start(self)
        raise KeyboardInterrupt

    r, done = Reaper(), []
    monkeypatch.setattr(threading.Thread, "start", start_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        r.reap(Dropped([FakeProcess(0.2, [])], time.monotonic() + 2, lambda: done.append(1)))
    monkeypatch.setattr(threading.Thread, "start", real_start)
    for k in (2, 3, 4):
        r.reap(Dropped([FakeProcess(0.02, [])], time.monotonic() + 2, lambda k=k: done.append(k)))
    assert r.drain(5.0) and sorted(done) == [1, 2, 3, 4], done
    assert len([t for t in threading.enumerate() if t.name == "shmloader-reap"]) <= 1


def test_a_dead_thread_is_replaced():
    r, done = Reaper(), []
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    r._thread = dead  # as if it had died without clearing itself
    r.reap(Dropped([FakeProcess(0.01, [])], time.monotonic() + 1, lambda: done.append(1)))
    assert r.drain(5.0) and done == [1]


def test_close_each_closes_every_pipe_once_also_after_an_error():
    """A pipe whose close fails does not leave the next ones open (issue 49: the reaper stopped
    at the first EBADF and leaked the rest); the first error is raised once all are closed."""
    class Pipe:
        def __init__(self, fail):
            self.fail, self.closes = fail, 0

        def close(self):
            self.closes += 1
            if self.fail:
                raise OSError(9, f"Bad file descriptor {id(self)}")

    pipes = [Pipe(False), Pipe(True), Pipe(False), Pipe(True)]
    with pytest.raises(OSError, match=str(id(pipes[1]))):
        close_each(pipes)
    assert [p.closes for p in pipes] == [1, 1, 1, 1]
    a, b = multiprocessing.Pipe()
    bell = Doorbell()
    close_each([a, bell, b])
    close_each([a, bell, b])  # each one's close() is a no-op the second time
    assert a.closed and b.closed and bell.fd == -1


def test_a_doorbell_is_closed_once_even_when_its_close_fails():
    bell = Doorbell()
    os.close(bell.fd)  # as if another owner had closed it
    with pytest.raises(OSError):
        bell.close()
    assert bell.fd == -1
    bell.close()  # no second close of the number (by now maybe another file's)


class DaemonThread(threading.Thread):
    """The reaper's threads as daemons, so that a test of a deadlock fails instead of hanging the exit."""

    def __init__(self, *args, **kwargs):
        kwargs["daemon"] = True
        super().__init__(*args, **kwargs)


@pytest.mark.parametrize("where", ["under the lock", "in reap()", "in the reaper's thread"])
def test_a_drop_collected_inside_the_reaper_is_finished(monkeypatch, where):
    """A dropped loader is stopped by its finalizer, from a collection that any allocation may
    start: also one inside the reaper's own sections under its lock (the caller's thread in
    `reap()`, as it makes the thread; the reaper's thread in its loop). The drop nested there is
    queued and finished, where a plain lock hung that thread for ever."""
    monkeypatch.setattr(threading, "Thread", DaemonThread)
    r, done, collected = Reaper(), [], []

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            r.reap(Dropped([FakeProcess(0.01, [])], time.monotonic() + 1, lambda: done.append("nested")))

    def collect_once():
        if not collected:
            collected.append(1)
            Cycle()
            gc.collect()

    if where == "in reap()":
        class Collecting(DaemonThread):
            def __init__(self, *args, **kwargs):
                collect_once()
                super().__init__(*args, **kwargs)
        monkeypatch.setattr(threading, "Thread", Collecting)
    elif where == "in the reaper's thread":
        class CollectingCondition(threading.Condition):
            def notify_all(self):
                collect_once()
                super().notify_all()
        r._idle = CollectingCondition(r._lock)

    def drop_and_drain():
        with r._lock:
            if where == "under the lock":
                collect_once()
        r.reap(Dropped([FakeProcess(0.01, [])], time.monotonic() + 1, lambda: done.append("first")))
        done.append(r.drain(5.0))

    caller = DaemonThread(target=drop_and_drain)  # a deadlock there fails the test instead of hanging it
    caller.start()
    caller.join(10.0)
    assert not caller.is_alive(), "a thread deadlocked on the reaper's lock"
    assert collected and sorted(done, key=str) == [True, "first", "nested"], done
