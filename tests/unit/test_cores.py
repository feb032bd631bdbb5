"""cores.py: more workers than usable cores is a warning naming both counts and what it costs;
as many or fewer is nothing."""
import os

from shmloader import cores


def test_workers_that_fit_say_nothing():
    assert cores.oversubscribed(1, 1) is None
    assert cores.oversubscribed(8, 16) is None
    assert cores.oversubscribed(16, 16) is None


def test_more_workers_than_cores_names_both_and_the_fitting_count():
    text = cores.oversubscribed(8, 2)
    assert "num_workers=8" in text and "2 cores" in text and "num_workers=2 reads as much" in text
    assert "More workers than cores" in text  # where its figures are
    assert "1 core " in cores.oversubscribed(3, 1)


def test_usable_is_this_process_affinity():
    assert cores.usable() == len(os.sched_getaffinity(0)) >= 1
