"""procs/precedence.py: which runs of a training process give way to one that is starting, and
when they stop, as the words their rings carry."""
import time
from types import SimpleNamespace

import numpy as np

from shmloader.ipc.ring import Counter
from shmloader.procs import precedence


class Run:
    def __init__(self):
        self.ring = SimpleNamespace(counters=np.zeros(len(Counter), dtype=np.int64))

    @property
    def word(self) -> int:
        return int(self.ring.counters[Counter.YIELD_UNTIL])


def started(p, run):
    p.starting(run)
    p.started(run)
    return run


def test_running_runs_give_way_until_the_starting_one_takes_its_first_batch():
    p = precedence.Precedence()
    train = started(p, Run())
    assert train.word == 0, "a run alone gives way to nobody"
    val = Run()
    before = precedence.now_us()
    p.starting(val)
    assert before + precedence.YIELD_S * 1e6 <= train.word <= precedence.now_us() + precedence.YIELD_S * 1e6
    assert val.word == 0, "the starting run itself does not give way"
    p.started(val)
    assert train.word == 0 and val.word == 0


def test_starting_runs_do_not_pause_each_other_and_the_last_one_clears():
    p = precedence.Precedence()
    train = started(p, Run())
    a, b = Run(), Run()
    p.starting(a)
    p.starting(b)
    assert a.word == 0 and b.word == 0 and train.word > 0
    p.started(a)
    assert a.word == train.word > 0, "a run that started while another still starts gives way to it"
    p.started(b)
    assert (train.word, a.word, b.word) == (0, 0, 0)


def test_a_starting_run_that_stops_clears_and_a_running_one_that_stops_is_forgotten():
    p = precedence.Precedence()
    train, other = started(p, Run()), started(p, Run())
    failing = Run()
    p.starting(failing)
    assert train.word > 0 and other.word > 0
    p.stopped(failing)  # closed, or its first batch failed
    assert train.word == 0 and other.word == 0
    p.stopped(other)
    gone = other.ring.counters
    other.ring.counters = None  # unmapped: never written again
    p.starting(Run())
    assert train.word > 0 and gone[Counter.YIELD_UNTIL] == 0


def test_a_stopped_running_run_does_not_clear_the_others_pause():
    p = precedence.Precedence()
    train, old_val = started(p, Run()), started(p, Run())
    new_val = Run()
    p.starting(new_val)
    p.stopped(old_val)  # the previous val loader, dropped while the new one starts
    assert train.word > 0
    assert p.is_starting(new_val)


def test_a_run_garbage_collected_without_stopping_is_dropped():
    p = precedence.Precedence()
    train = started(p, Run())
    p.starting(Run())  # no reference kept: a weak set forgets it
    assert not list(p._starting)
    p.starting(val := Run())
    p.started(val)
    assert train.word == 0


def test_a_failed_wait_ends_a_start_and_a_retried_one_runs():
    p = precedence.Precedence()
    train = started(p, Run())
    val = Run()
    p.starting(val)
    p.failed(train)  # a running run's wait that raised: it still runs, the pause stands
    assert train.word > 0
    p.failed(val)  # its first batch raised: the others go on
    assert train.word == 0
    p.started(val)  # retried, and its first batch came: it runs, and gives way to the next start
    p.starting(third := Run())
    assert val.word > 0 and train.word > 0
    p.started(third)
    assert val.word == 0 and train.word == 0


def two_starts(gap_s: float) -> tuple:
    """The running run's word after one start, and after a second one `gap_s` later."""
    p = precedence.Precedence()
    train = started(p, Run())
    runs = [Run(), Run()]  # referenced: the weak sets keep them
    p.starting(runs[0])
    first = train.word
    time.sleep(gap_s)
    p.starting(runs[1])
    return first, train.word


def test_a_start_during_a_pause_keeps_its_deadline_and_one_after_it_begins_a_new_one(monkeypatch):
    first, second = two_starts(0.01)
    assert second == first, "a second start extended the pause past YIELD_S from the first"
    monkeypatch.setattr(precedence, "YIELD_S", 0.001)
    expired, renewed = two_starts(0.01)
    assert renewed > expired, "a start after the deadline passed did not pause the others"


def test_a_worker_reads_the_pause_left_from_its_ring():
    """The worker's side (`pause_left_us`): none without a word, the time left before the
    deadline, none once the deadline has passed."""
    counters = np.zeros(len(Counter), dtype=np.int64)
    assert precedence.pause_left_us(counters) == 0
    counters[Counter.YIELD_UNTIL] = precedence.now_us() + 2_000_000
    assert 1_000_000 < precedence.pause_left_us(counters) <= 2_000_000
    counters[Counter.YIELD_UNTIL] = precedence.now_us() - 1
    assert precedence.pause_left_us(counters) == 0
