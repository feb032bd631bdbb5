"""cores.py: more workers than usable cores is a warning naming both counts and what it costs;
as many or fewer is nothing; a rank's share of the cores and the default `num_workers`."""
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


def test_a_ranks_share_splits_an_unpinned_machine_among_its_local_ranks(monkeypatch):
    """torchrun's LOCAL_WORLD_SIZE ranks on a machine whose every core each may run on share
    them; a rank pinned to fewer cores than the machine has sees its share as its affinity."""
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(cores, "usable", lambda: 16)
    assert cores.share({}) == 16 and cores.share({"LOCAL_WORLD_SIZE": "1"}) == 16
    assert cores.share({"LOCAL_WORLD_SIZE": "8"}) == 2 and cores.share({"LOCAL_WORLD_SIZE": "32"}) == 1
    for junk in ("", "0", "x", "-2"):
        assert cores.share({"LOCAL_WORLD_SIZE": junk}) == 16
    monkeypatch.setattr(cores, "usable", lambda: 2)  # pinned: 2 of the 16
    assert cores.share({"LOCAL_WORLD_SIZE": "8"}) == 2


def test_the_default_workers_are_the_share_at_most_four(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    for usable, ranks, expected in ((1, "1", 1), (2, "1", 2), (3, "1", 3), (16, "1", 4), (16, "8", 2), (16, "2", 4)):
        monkeypatch.setattr(cores, "usable", lambda usable=usable: usable)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
        assert cores.default_workers() == expected, (usable, ranks)


def test_more_workers_than_cores_as_many_as_the_cores_tokenize_at_once():
    assert cores.at_once(8, 2) == 2 and cores.at_once(3, 2) == 2 and cores.at_once(17, 16) == 16
    assert cores.at_once(2, 2) is None and cores.at_once(1, 4) is None
