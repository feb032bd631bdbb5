"""shmloader/progress.py: the meter's arithmetic, when a report says a line and at which level,
the bar on a terminal. Made-up clocks and streams; the replays through the loader are
tests/loader/test_progress.py's."""
import io
import logging

import pytest

from shmloader import progress


def test_the_rate_and_the_time_left_are_what_was_done_over_the_time_it_took():
    m = progress.Meter(40, began=100.0)
    r = m.update(100.0, 0)
    assert (r.done, r.total, r.rate, r.left_s) == (0, 40, 0.0, None)
    r = m.update(104.0, 10)
    assert r.rate == pytest.approx(2.5) and r.left_s == pytest.approx(12.0) and r.elapsed_s == 4.0
    r = m.update(108.0, 40)
    assert r.left_s == 0.0


def test_a_count_that_goes_back_begins_the_meter_again_there():
    m = progress.Meter(40, began=0.0)
    m.update(4.0, 20)
    r = m.update(5.0, 0)  # a lost coordinator counts again from the start
    assert r.rate == 0.0 and r.left_s is None and r.elapsed_s == 5.0
    r = m.update(7.0, 10)
    assert r.rate == pytest.approx(5.0) and r.left_s == pytest.approx(6.0)


def test_a_new_total_is_taken():
    m = progress.Meter(10, began=0.0)
    assert m.update(1.0, 5, total=20).left_s == pytest.approx(3.0)


@pytest.mark.parametrize("seconds, text", [(0.44, "0.4 s"), (9.96, "10.0 s"), (45.2, "45 s"), (200, "3 min 20 s"),
                                           (7500, "2 h 05 min")])
def test_durations_read_as_a_person_says_them(seconds, text):
    assert progress.duration(seconds) == text


def test_a_line_says_done_total_share_rate_and_time_left():
    r = progress.Reading(12, 40, 3.1, 9.2, 4.0)
    assert progress.line("old rank 1", r, "batches", "78 documents counted") == (
        "old rank 1: 12 of 40 batches (30%), 3.1 batches/s, about 9.2 s left; 78 documents counted")
    r = progress.Reading(0, 40, 0.0, None, 3.0)
    assert progress.line("x", r, "batches") == "x: 0 of 40 batches (0%), 3.0 s so far, the time left not known yet"


def report(began=0.0, **kw):
    said = []
    return progress.Report("replay", 100, "batches", began, lambda level, text: said.append((level, text)), **kw), said


def test_short_work_says_only_its_end():
    r, said = report()
    r.update(0.5, 30)
    r.update(0.9, 90)
    r.finish(0.95, "at epoch 1")
    assert said == [(logging.WARNING, "replay: done, 100 batches in 0.9 s; at epoch 1")]


def test_long_work_says_a_line_after_the_first_second_then_one_each_ten():
    r, said = report(began=50.0)
    for t in range(1, 26):  # one reading a second, 4 batches a second
        r.update(50.0 + t, 4 * t)
    r.finish(76.0)
    times = [1, 11, 21]
    assert [text for _, text in said[:-1]] == [
        f"replay: {4 * t} of 100 batches ({4 * t}%), 4.0 batches/s, about {progress.duration((100 - 4 * t) / 4)} left"
        for t in times]
    assert said[-1] == (logging.WARNING, "replay: done, 100 batches in 26 s")
    assert all(level == logging.WARNING for level, _ in said)


def test_a_line_without_the_time_left_is_followed_a_second_later_by_one_with_it():
    """Work slow to begin (a loaded machine, a cold cache): the first line cannot say the time
    left; the next comes once it is known, a second later, not ten."""
    r, said = report(began=0.0)
    for t, done in [(1.3, 0), (2.0, 0), (2.3, 0), (3.3, 8), (4.3, 16), (13.0, 50), (14.3, 60)]:
        r.update(t, done)
    assert [text for _, text in said] == [
        "replay: 0 of 100 batches (0%), 1.3 s so far, the time left not known yet",
        "replay: 0 of 100 batches (0%), 2.3 s so far, the time left not known yet",
        "replay: 8 of 100 batches (8%), 2.4 batches/s, about 38 s left",
        "replay: 60 of 100 batches (60%), 4.2 batches/s, about 9.5 s left"]


def test_on_a_terminal_a_bar_shows_instead_of_lines():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty = Tty()
    r, said = report(bar=True, stream=tty)
    r.update(0.5, 10)
    r.update(30.0, 60, extra="7 documents counted")
    r.finish(40.0, "found")
    text = tty.getvalue()
    assert "replay" in text and "100/100" in text and "batches" in text
    assert said == [(logging.WARNING, "replay: done, 100 batches in 40 s; found")]


def test_a_bar_only_on_a_terminal():
    stream = io.StringIO()  # a log file, a pipe
    r, said = report(bar=True, stream=stream)
    r.update(2.0, 10)
    r.close()
    assert stream.getvalue() == "" and len(said) == 1 and "10 of 100 batches" in said[0][1]


@pytest.mark.parametrize("shown, loud, level", [(logging.WARNING, True, logging.WARNING),
                                                 (logging.INFO, True, logging.INFO),
                                                 (logging.WARNING, False, logging.INFO),
                                                 (logging.DEBUG, False, logging.INFO)])
def test_lines_are_at_info_where_info_shows_else_at_warning_from_the_loud_rank(shown, loud, level, caplog):
    logger = logging.getLogger("shmloader.test_progress")
    caplog.set_level(logging.DEBUG)  # the handler catches everything; the logger decides
    logger.setLevel(shown)
    try:
        progress.log_emitter(logger, loud)(logging.WARNING, "a line")
    finally:
        logger.setLevel(logging.NOTSET)
    got = [r.levelno for r in caplog.records if r.name == logger.name]
    assert got == ([level] if level >= shown else [])
