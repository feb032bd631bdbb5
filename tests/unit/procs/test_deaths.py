"""Which death `Children.raise_death` names (procs/children.py), with stand-in processes: a
child that exits cleanly only does so because another died, so the one killed is named even
when its exit shows after the clean one (the forkserver reports a death late on a loaded
machine: test_faults.py's coordinator kill named "worker 0 ... exit code 0" there)."""
import os
import signal
import threading

import numpy as np
import pytest

from shmloader.procs import children as childmod


class StandIn:
    """A process whose exit is a pipe closed: its sentinel becomes readable then."""

    def __init__(self):
        self.sentinel, self._w = os.pipe()
        self.pid = os.getpid()
        self._code = None

    def exit(self, code: int):
        self._code = code
        os.close(self._w)

    @property
    def exitcode(self):
        return self._code

    def join(self, timeout=None):
        pass

    def is_alive(self):
        return self._code is None

    def close(self):
        os.close(self.sentinel)
        if self._code is None:
            os.close(self._w)


class NoMessages:
    def poll(self, timeout):
        raise EOFError  # the coordinator's pipe: it is dead


class Ring:
    workers = np.full((2, 16), -1, dtype=np.int64)


@pytest.fixture
def kids():
    coordinator, workers = StandIn(), [StandIn(), StandIn()]
    made = childmod.Children(segment=None, ring=Ring(), conn=NoMessages(), coordinator=coordinator,
                             workers=workers)
    yield made
    for p in made.procs:
        p.close()


def test_a_kill_that_shows_after_the_clean_exit_it_caused_is_named(kids):
    kids.workers[0].exit(0)  # the worker saw the coordinator's pipe break
    later = threading.Timer(0.2, kids.coordinator.exit, args=(-signal.SIGKILL,))
    later.start()
    try:
        with pytest.raises(childmod.ChildLost) as lost:
            kids.raise_death([kids.workers[0].sentinel])
    finally:
        later.join()
    assert "the coordinator" in str(lost.value) and "SIGKILL" in str(lost.value), str(lost.value)
    assert lost.value.worker is None


def test_a_worker_killed_alone_is_named_at_once(kids):
    kids.workers[1].exit(-signal.SIGSEGV)
    with pytest.raises(childmod.ChildLost) as lost:
        kids.raise_death([kids.workers[1].sentinel])
    assert "worker 1" in str(lost.value) and "SIGSEGV" in str(lost.value), str(lost.value)
    assert lost.value.worker == 1  # the coordinator lives: it can be replaced alone


def test_clean_exits_with_no_other_death_name_the_clean_one_after_the_grace(kids, monkeypatch):
    monkeypatch.setattr(childmod, "ERROR_GRACE_S", 0.05)
    kids.workers[0].exit(0)
    with pytest.raises(childmod.ChildLost) as lost:
        kids.raise_death([kids.workers[0].sentinel])
    assert "worker 0" in str(lost.value) and "exit code 0" in str(lost.value), str(lost.value)


def test_a_workers_loss_whose_coordinator_is_gone_too_is_the_coordinators(kids):
    """A loss named a worker's (the coordinator's kill showed after the grace) while the
    coordinator is gone by the heal: the heal starts every process again (no replacement sent to a
    dead coordinator: a BrokenPipeError out of next() under load), and what the worker held is
    not suspect of poison."""
    held = object()
    lost = childmod.ChildLost("worker 0 (pid 1) died: exit code 0", 1, held, worker=0)
    assert kids.blame(lost) is lost  # the coordinator lives: the worker is replaced alone
    kids.coordinator.exit(-signal.SIGKILL)
    blamed = kids.blame(lost)
    assert blamed.worker is None and blamed.held is None and blamed.pid == kids.coordinator.pid
    assert "the coordinator" in str(blamed) and "SIGKILL" in str(blamed), str(blamed)
