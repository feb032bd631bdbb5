"""data/mixelastic.py: a mixture's plans at a change of world size, from the old ranks' points."""
from shmloader.data import elastic, mixelastic
from shmloader.data.mixture import Mixer, Mixture
from shmloader.data.shuffle import Shuffle, share

MIX = Mixture({"a": "a", "b": "b"}, {"a": 2, "b": 1})
ROWS = {"a": [[5, 5, 5, 5], [5, 5, 5, 5]], "b": [[3, 3, 3], [3, 3, 3]]}  # per source: files' row groups


def point(source, skip, a, b, totals):
    mixer = Mixer(MIX, 0).state()
    mixer["totals"] = totals
    return {"source": source, "skip": skip, "sources": {"a": a, "b": b}, "mixer": mixer}


POINTS = [point("a", 4, [1, 0, 2, 3], [1, 1, 0, 0], {"a": [40, 9, 1], "b": [20, 6, 1]}),   # old rank 0: a's doc cut
          point("b", 0, [1, 0, 3, 1], [2, 0, 1, 2], {"a": [38, 8, 1], "b": [22, 7, 2]})]   # old rank 1


def plan(rank, world):
    return mixelastic.plan(POINTS, MIX, 50, rank, world, lambda n: lambda f: ROWS[n][f], lambda n: len(ROWS[n]))


def test_each_source_plans_from_the_old_ranks_places_in_it():
    start = plan(0, 3)
    assert start.plans["a"].positions == ((1, 0, 2, 3, 4), (1, 0, 3, 1, 0))  # the cut document's skip with a
    assert start.plans["b"].positions == ((1, 1, 0, 0, 0), (2, 0, 1, 2, 0))
    assert start.plans["b"].epoch == 2 and start.plans["a"].epoch == 1


def test_a_new_rank_starts_every_source_at_its_first_unit_with_the_cut_tokens_dropped():
    for rank in range(3):
        start = plan(rank, 3)
        for name in ("a", "b"):
            first = elastic.start(start.plans[name], rank, 3, lambda f, n=name: ROWS[n][f], 2)
            assert start.point["sources"][name] == list(first[:4])
            assert start.point["skips"].get(name, 0) == first.skip
    assert plan(0, 3).point["skips"] == {"a": 4}  # rank 0's first unit of a is the cut row group


def test_the_mixer_begins_a_counting_stage_at_the_change_with_the_old_ranks_totals():
    mixer = plan(1, 2).point["mixer"]
    assert mixer["stage_batch"] == 50 and mixer["since"] == 50 and set(mixer["counted"].values()) == {0}
    assert mixer["totals"] == {"a": [78, 17, 1], "b": [42, 13, 2]}
    assert plan(0, 2).point["mixer"] == mixer  # the same for every new rank


BUFFERS = [[["a", 1, 0, 2, 0, 3], ["b", 1, 1, 0, 0, 1], ["a", 1, 0, 2, 3, 1]],  # old rank 0's, arrival order
           [["b", 2, 0, 0, 1, 2], ["a", 1, 0, 1, 0, 5]]]                             # old rank 1's


def test_best_fits_old_buffers_are_dealt_out_run_by_run_whatever_their_sources():
    """As one source's (data/elastic.py `deal`): every world-th run, old rank 0's first; each old
    run in one new rank's first buffer; concat has none."""
    every = [run for old in BUFFERS for run in old]
    for world in (1, 2, 3, 7):
        dealt = [mixelastic.plan(POINTS, MIX, 50, rank, world, lambda n: lambda f: ROWS[n][f], lambda n: len(ROWS[n]),
                                 buffers=BUFFERS).buffer for rank in range(world)]
        assert all(d == every[rank::world] for rank, d in enumerate(dealt))
        assert sorted(sum(dealt, [])) == sorted(every)
    assert plan(0, 3).buffer == [] and plan(0, 3).plans == mixelastic.plan(
        POINTS, MIX, 50, 0, 3, lambda n: lambda f: ROWS[n][f], lambda n: len(ROWS[n]), buffers=BUFFERS).plans


ORDERS = {"a": Shuffle(11), "b": Shuffle(12)}  # each source's own shuffled order


def _at(name, epoch, rank, j, doc):
    """Old rank `rank` of 2's place in source `name`'s shuffled order: its share's window `j` of `epoch`."""
    return [epoch, *share(ORDERS[name], epoch, ROWS[name], rank, 2)[j].head, doc]


SHUFFLED = [point("a", 4, _at("a", 1, 0, 1, 3), _at("b", 1, 0, 0, 0), {"a": [40, 9, 1], "b": [20, 6, 1]}),
            point("b", 0, _at("a", 1, 1, 2, 1), _at("b", 2, 1, 0, 2), {"a": [38, 8, 1], "b": [22, 7, 2]})]


def test_a_shuffled_mixture_starts_every_source_at_its_first_unit_of_its_own_order():
    moved = 0
    for rank in range(3):
        start = mixelastic.plan(SHUFFLED, MIX, 50, rank, 3, lambda n: lambda f: ROWS[n][f], lambda n: len(ROWS[n]),
                                ORDERS)
        for name in ("a", "b"):
            first = elastic.start(start.plans[name], rank, 3, lambda f, n=name: ROWS[n][f], 2, ORDERS[name])
            assert start.point["sources"][name] == list(first[:4])
            assert start.point["skips"].get(name, 0) == first.skip
            moved += start.point["sources"][name] != plan(rank, 3).point["sources"][name]
    assert moved  # not the files' order


def test_a_shuffled_source_with_fewer_units_than_new_ranks_starts_where_reading_it_raises():
    """Rank 39 of 40 has no unit of b's order (6 units): it starts b at the next epoch, whose
    order raises the source's error when b is first read (as a fresh shuffled run's would)."""
    start = mixelastic.plan(SHUFFLED, MIX, 50, 39, 40, lambda n: lambda f: ROWS[n][f], lambda n: len(ROWS[n]), ORDERS)
    assert start.point["sources"]["b"] == [3, 0, 39, 0]
