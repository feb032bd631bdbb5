"""start.py `Start`: a run's children from their making to their start, or their drop. The
processes' start itself (`_start`) is replaced by a recorder: these are the record's rules."""
import threading

import pytest

from shmloader.errors import LoaderTimeout
from shmloader.procs import start as startmod
from shmloader.procs.start import Phase, Start, Unstarted


class End:
    """A pipe's end: what matters is that it is closed once."""

    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


@pytest.fixture
def started(monkeypatch):
    """The procs lists `_start` was called with; `started.fail` makes the next call raise."""
    calls = []

    def record(procs, start_method):
        if getattr(record, "fail", None) is not None:
            raise record.fail
        calls.append(list(procs))

    record.calls = calls
    monkeypatch.setattr(startmod, "_start", record)
    monkeypatch.setattr(startmod, "booting", lambda method: False)
    return record


def _made(noted):
    ends = (End(), End())
    return Start(Unstarted(["coordinator", "worker-0"], ends, "spawn"), lambda: noted.append(1)), ends


def test_wait_starts_them_once_noted_and_their_ends_closed(started):
    noted = []
    start, ends = _made(noted)
    assert start.waiting and start.pending
    start.wait(1.0)
    start.wait(1.0)  # started: nothing more
    assert started.calls == [["coordinator", "worker-0"]] and noted == [1]
    assert [e.closed for e in ends] == [1, 1] and not start.waiting and not start.pending


def test_a_drop_first_starts_nothing_and_closes_the_ends(started):
    noted = []
    start, ends = _made(noted)
    start.drop(1.0)
    start.wait(1.0)
    start.drop(1.0)
    assert started.calls == [] and noted == [] and [e.closed for e in ends] == [1, 1]
    assert not start.pending


def test_later_starts_them_in_a_thread_and_wait_takes_its_end(started):
    start, ends = _made([])
    start.later()
    thread = start._thread
    assert start.pending and thread.name == "shmloader-start"  # until waited for, done or not
    start.wait(5.0)
    assert started.calls == [["coordinator", "worker-0"]] and not start.pending
    assert not thread.is_alive()


def test_what_the_thread_start_raised_is_raised_by_wait_once(started):
    started.fail = OSError("no forkserver")
    start, ends = _made([])
    start.later()
    with pytest.raises(OSError, match="no forkserver"):
        start.wait(5.0)
    assert [e.closed for e in ends] == [1, 1]  # closed whatever happens
    start.wait(5.0)  # raised once; nothing left to start


def test_a_thread_that_does_not_end_is_a_timeout(started, monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(startmod, "booting", lambda method: not release.is_set())
    start, ends = _made([])
    start.later()
    with pytest.raises(LoaderTimeout, match="did not start within"):
        start.wait(0.05)
    start.drop(1.0)  # the run stops: the thread starts nothing and ends
    release.set()
    start._thread.join(5.0)
    assert started.calls == [] and [e.closed for e in ends] == [1, 1]


def test_a_forked_copy_forgets_the_thread_and_starts_nothing(started):
    start, ends = _made([])
    start.forget()
    start.wait(1.0)
    assert started.calls == [] and not start.pending and [e.closed for e in ends] == [1, 1]


def test_the_phase_moves_as_listed(started, monkeypatch):
    """start.py `Phase`: each call moves it as its docstring lists, and `waiting` and `pending`
    are read from it alone."""
    start, _ = _made([])
    assert (start.phase, start.waiting, start.pending) == (Phase.MADE, True, True)
    start.now()
    assert (start.phase, start.waiting, start.pending) == (Phase.STARTED, False, False)
    start.later()  # started: nothing more
    start.drop(1.0)
    assert start.phase is Phase.STOPPED and not start.pending

    release = threading.Event()
    monkeypatch.setattr(startmod, "booting", lambda method: not release.is_set())
    start, _ = _made([])
    start.later()
    assert (start.phase, start.waiting, start.pending) == (Phase.LATER, True, True)
    release.set()
    start._thread.join(5.0)
    assert (start.phase, start.waiting, start.pending) == (Phase.RAN, False, True)
    start.wait(5.0)
    assert start.phase is Phase.STARTED and started.calls == [["coordinator", "worker-0"]] * 2

    release.clear()
    start, ends = _made([])
    start.later()
    start.drop(1.0)  # a thread waiting for the forkserver: stopped, it starts nothing
    release.set()
    start._thread.join(5.0)
    assert start.phase is Phase.STOPPED and len(started.calls) == 2 and [e.closed for e in ends] == [1, 1]
    start, _ = _made([])
    start.forget()
    assert start.phase is Phase.STOPPED


def test_a_drop_that_times_out_on_a_start_under_way_leaves_it_stopped_and_its_ends_to_the_start(started, monkeypatch):
    """`drop`'s lock wait running out while the thread starts the children: drop took the
    unstarted children's ends and closed them under the start, which closed them again and moved
    the stopped start back to RAN. Now drop leaves them to the start, and STOPPED stays."""
    starting, go = threading.Event(), threading.Event()

    def slow(procs, start_method):
        starting.set()
        assert go.wait(5.0)
        started.calls.append(list(procs))

    monkeypatch.setattr(startmod, "_start", slow)
    start, ends = _made([])
    start.later()
    assert starting.wait(5.0)
    start.drop(0.05)  # the start holds the lock
    assert start.phase is Phase.STOPPED and [e.closed for e in ends] == [0, 0]
    go.set()
    start._thread.join(5.0)
    assert not start._thread.is_alive()
    assert start.phase is Phase.STOPPED and not start.pending and [e.closed for e in ends] == [1, 1]
    assert started.calls == [["coordinator", "worker-0"]]


def test_wait_s_lock_held_past_its_timeout_is_a_timeout(started):
    """`wait` took the lock after the thread ended with no timeout (every wait is bounded): a
    `drop` holding it (another thread) made it wait on. Now a `LoaderTimeout`, the phase kept."""
    start, _ = _made([])
    start.later()
    start._thread.join(5.0)
    assert start.phase is Phase.RAN
    with start._lock:
        with pytest.raises(LoaderTimeout, match=r"their start's lock was not free within 0 s \(another thread of "
                                                r"process \d+ is stopping the loader"):
            start.wait(0.05)
    assert start.phase is Phase.RAN
    start.wait(1.0)
    assert start.phase is Phase.STARTED


@pytest.mark.slow  # it measures a wait's length: on a loaded machine, with the slow suite
def test_wait_waits_for_the_thread_and_the_lock_within_one_timeout(started):
    """The thread's join and the lock's take share `timeout`: a start whose thread ends 1 s in and
    whose lock is held then is a `LoaderTimeout` at 1.5 s, not at 1 s + 1.5 s."""
    import time
    start, _ = _made([])
    start.later()
    start._thread.join(5.0)
    begun = threading.Event()
    slow = threading.Thread(target=lambda: (begun.set(), time.sleep(1.0)), daemon=True)
    start._thread = slow  # a thread still starting the children for another second
    with start._lock:
        slow.start()
        begun.wait(5.0)
        t0 = time.monotonic()
        with pytest.raises(LoaderTimeout, match=r"their start's lock was not free"):
            start.wait(1.5)
        took = time.monotonic() - t0
    assert took < 2.2, f"wait took {took:.2f} s for a timeout of 1.5 s"
    start.wait(1.0)
    assert start.phase is Phase.STARTED
