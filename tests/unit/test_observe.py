"""observe.py's interval arithmetic on made-up readings: each figure is the difference of two
readings over the time between them; a new interval starts at each step; a replaced worker
counts its whole busy time; shares stay in [0, 1]."""
import pytest

from shmloader.observe import Figures, Interval, Reading, busiest_idlest


def test_figures_are_differences_over_the_interval():
    iv = Interval(Reading(10.0, 1.0, 1000, (11, 12), (0.5, 0.0)))
    f = iv.step(Reading(12.0, 1.5, 5000, (11, 12), (1.5, 2.0)))
    assert f == Figures(2.0, pytest.approx(0.25), pytest.approx(2000.0), (pytest.approx(0.5), pytest.approx(1.0)))
    # the next interval starts at the last reading
    f = iv.step(Reading(16.0, 3.5, 5000, (11, 12), (1.5, 3.0)))
    assert f.interval_s == 4.0 and f.wait_share == pytest.approx(0.5) and f.tokens_per_s == 0.0
    assert f.worker_busy == (0.0, pytest.approx(0.25))


def test_first_interval_runs_from_the_start():
    iv = Interval(Reading(100.0, 0.0, 0))
    f = iv.step(Reading(104.0, 3.0, 400))
    assert (f.interval_s, f.wait_share, f.tokens_per_s, f.worker_busy) == (4.0, 0.75, 100.0, ())


def test_a_replaced_worker_counts_its_whole_busy_time():
    iv = Interval(Reading(0.0, 0.0, 0, (11, 12), (5.0, 5.0)))
    f = iv.step(Reading(10.0, 0.0, 0, (11, 13), (6.0, 2.0)))  # worker 1 replaced: pid 13, 2 s busy
    assert f.worker_busy == (pytest.approx(0.1), pytest.approx(0.2))
    f = iv.step(Reading(20.0, 0.0, 0, (21, 22), (1.0, 1.0)))  # a new run: new pids, counters from zero
    assert f.worker_busy == (pytest.approx(0.1), pytest.approx(0.1))


def test_shares_are_clamped_and_an_empty_interval_says_nothing():
    iv = Interval(Reading(0.0, 0.0, 0, (11,), (0.0,)))
    f = iv.step(Reading(1.0, 2.0, 10, (11,), (3.0,)))  # a piece's busy time lands at its end: lumpy
    assert f.wait_share == 1.0 and f.worker_busy == (1.0,)
    f = iv.step(Reading(1.0, 2.0, 10, (11,), (3.0,)))
    assert f == Figures(0.0, 0.0, 0.0, (0.0,))


def test_busiest_and_idlest():
    assert busiest_idlest((0.2, 0.9, 0.1)) == ((1, 0.9), (2, 0.1))
    assert busiest_idlest(()) == (None, None)
