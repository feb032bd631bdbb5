"""data/elastic.py: the plan that shares out, at a change of world size, what the old ranks had
not consumed. Over random files (row groups of 0 to 9 documents, files of 0 to 7 row groups)
and random old positions: the old ranks' consumed documents and the plan's units are the
epochs up to the plan's, each document once; every unit goes to one new rank; a new rank's
steps are its units in order and then plain epochs of the new world size, from its start or
from any position inside its units; best fit's old buffers are dealt out once."""
import itertools
import random

import pytest

from shmloader.data import elastic
from shmloader.position import Position, Step
from shmloader.data.order import row_steps, start_position
from shmloader.ipc.runstart import ONE_SOURCE
from tests.cases import seeds

CHANGES = [(2, 3), (4, 2), (1, 4), (3, 1), (2, 2), (3, 5)]


def random_files(rng, n_files=5):
    return [[rng.choice([0, 1, 2, 5, 9]) for _ in range(rng.randint(0, 7))] for _ in range(n_files)]


def old_stream(counts, rank, world, epochs):
    """Old rank `rank`'s documents `(epoch, file, rg, doc)` in stream order, up to `epochs`."""
    out = []
    for epoch, file, rg, doc, _, rows, _ in row_steps(lambda f: counts[f], len(counts), rank, world, start_position(rank)):
        if epoch > epochs:
            return out
        out.extend((epoch, file, rg, d) for d in range(doc, rows))


def scenario(seed, W):
    """Files, and each old rank's position: a random point of its stream (epochs 1-2), as the
    next document and a token offset into it."""
    rng = random.Random(seed)
    counts = random_files(rng)
    while sum(map(len, counts)) < W or not all(any(len(c) > r for c in counts) for r in range(W)):
        counts = random_files(rng)  # every old rank has a row group (else its stream is an error)
    return (counts, *stopped([old_stream(counts, r, W, 3) for r in range(W)], rng))


def stopped(streams: list, rng) -> tuple[list, set]:
    """Each old rank stopped at a random document of its stream (`streams[r]`: its documents
    `(epoch, file, rg, doc)` in order), with a token offset into it: `(positions, what they had
    consumed)`."""
    positions, consumed = [], set()
    for stream in streams:
        i = rng.randrange(len(stream))
        e, f, g, d = stream[i]
        positions.append((e, f, g, d, rng.choice([0, 0, 3])))
        consumed.update(stream[:i])
    return positions, consumed


@pytest.mark.parametrize("W,W2", CHANGES)
@pytest.mark.parametrize("seed", seeds(12, 3))  # seeds 3-11: -m slow
def test_the_units_and_what_the_old_ranks_consumed_are_the_epochs_each_document_once(seed, W, W2):
    counts, positions, consumed = scenario(seed, W)
    plan = elastic.Plan.of(W, 40, positions)
    assert plan.epoch == max(p[0] for p in positions)
    rc = counts.__getitem__
    units = list(elastic.units(plan, rc, len(counts)))
    left = [(u.epoch, u.file, u.rg, d) for u in units for d in range(u.doc, u.rows)]
    assert len(left) == len(set(left))
    everything = {(e, f, g, d) for e in range(1, plan.epoch + 1) for f, c in enumerate(counts)
                  for g, rows in enumerate(c) for d in range(rows)}
    assert not consumed & set(left) and consumed | set(left) == everything
    for u in units:  # a unit holding an old rank's position starts there, with its token offset
        at = positions[u.rg % W]
        if (u.epoch, u.file, u.rg) == at[:3]:
            assert (u.doc, u.skip) == at[3:]
        else:
            assert (u.doc, u.skip) == (0, 0)
    mine = [list(elastic.rank_units(plan, j, W2, rc, len(counts))) for j in range(W2)]
    assert sorted(itertools.chain(*mine), key=units.index) == units
    assert all(m == units[j::W2] for j, m in enumerate(mine))


@pytest.mark.parametrize("W,W2", CHANGES)
@pytest.mark.parametrize("seed", range(6))
def test_a_new_ranks_steps_are_its_units_then_plain_epochs_from_its_start_or_inside(seed, W, W2):
    counts, positions, _ = scenario(seed, W)
    plan = elastic.Plan.of(W, 40, positions)
    rc, n = counts.__getitem__, len(counts)
    if not all(any(len(c) > j for c in counts) for j in range(W2)):
        return  # a new rank with no row group at all: its plain epochs are an error (order.py)
    for j in range(W2):
        mine = list(elastic.rank_units(plan, j, W2, rc, n))
        cursor = elastic.start(plan, j, W2, rc, n)
        plain = row_steps(rc, n, j, W2, Position(plan.epoch + 1, 0, j, 0))
        expected = [Step(u.epoch, u.file, u.rg, u.doc, u.skip, u.rows) for u in mine]
        if mine:
            assert cursor == Position(mine[0].epoch, mine[0].file, mine[0].rg, mine[0].doc, mine[0].skip)
            expected[0] = expected[0]._replace(skip=0)  # the run's own skip applies there
        else:
            assert cursor == Position(plan.epoch + 1, 0, j, 0, 0)
        tail = list(itertools.islice(plain, 6))
        got = list(itertools.islice(elastic.steps(plan, j, W2, rc, n, cursor), len(expected) + 6))
        assert got == expected + tail
        for m, u in enumerate(mine):  # from inside unit m: the rest of it, then the units after
            at = Position(u.epoch, u.file, u.rg, min(u.doc + 1, u.rows))
            got = list(itertools.islice(elastic.steps(plan, j, W2, rc, n, at), len(mine) - m + 6))
            assert got[0] == Step(u.epoch, u.file, u.rg, at.doc, 0, u.rows)
            assert got[1:] == [Step(v.epoch, v.file, v.rg, v.doc, v.skip, v.rows) for v in mine[m + 1:]] + tail


def new_stream(plan, rank, world, counts, epochs):
    """New rank `rank`'s documents `(epoch, file, rg, doc, skip)` in stream order, up to `epochs`
    (skip: tokens of it an earlier run read)."""
    rc, out = counts.__getitem__, []
    cursor = elastic.start(plan, rank, world, rc, len(counts))
    skip = cursor.skip
    for n, (epoch, file, rg, doc, step_skip, rows, _) in enumerate(elastic.steps(plan, rank, world, rc,
                                                                               len(counts), cursor)):
        if epoch > epochs:
            return out
        for d in range(doc, rows):  # the first step's skip is the run's own (start's)
            out.append((epoch, file, rg, d, (skip if n == 0 else step_skip) if d == doc else 0))


@pytest.mark.parametrize("W,W2,W3", [(2, 3, 2), (4, 2, 3), (1, 4, 1), (3, 1, 4), (2, 2, 5)])
@pytest.mark.parametrize("seed", seeds(10, 3))  # seeds 3-9: -m slow
def test_a_second_change_inside_the_first_ones_epoch_holds_the_guarantee(seed, W, W2, W3):
    """W -> W2 -> W3, the second change with the W2 ranks inside the first plan's units or just
    past them: what the W and W2 runs consumed and the second plan's units are the epochs up to
    its own, each document once."""
    counts, positions, consumed = scenario(seed, W)
    rng = random.Random(seed + 1000)
    first = elastic.Plan.of(W, 40, positions)
    if not all(any(len(c) > j for c in counts) for j in range(W2)):
        return
    later = []
    for j in range(W2):
        stream = new_stream(first, j, W2, counts, first.epoch + 1)
        i = rng.randrange(len(stream))
        e, f, g, d, skip = stream[i]
        later.append((e, f, g, d, skip or rng.choice([0, 2])))
        consumed.update(x[:4] for x in stream[:i])
    second = elastic.Plan.of(W2, 60, later, parent=first)
    assert second.epoch >= max(p[0] for p in later)
    left = [(u.epoch, u.file, u.rg, d) for u in elastic.units(second, counts.__getitem__, len(counts))
            for d in range(u.doc, u.rows)]
    everything = {(e, f, g, d) for e in range(1, second.epoch + 1) for f, c in enumerate(counts)
                  for g, rows in enumerate(c) for d in range(rows)}
    assert len(left) == len(set(left)) and not consumed & set(left) and consumed | set(left) == everything
    assert elastic.Plan.from_state(second.to_state()) == second


@pytest.mark.parametrize("W,W2", CHANGES)
def test_best_fits_old_buffers_are_dealt_out_once(W, W2):
    rng = random.Random(W * 10 + W2)
    buffers = [[[1, rng.randrange(5), rng.randrange(9), rng.randrange(50), rng.randint(1, 4)]
                for _ in range(rng.randint(0, 6))] for _ in range(W)]
    plan = elastic.Plan.of(W, 7, [(1, 0, r, 0, 0) for r in range(W)], buffers)
    dealt = [elastic.buffer(plan, j, W2) for j in range(W2)]
    every = [run for old in buffers for run in old]
    assert sorted(itertools.chain(*dealt)) == sorted(every)
    assert all(d == every[j::W2] for j, d in enumerate(dealt))


def test_a_plan_round_trips_through_its_state_form():
    plan = elastic.Plan.of(3, 12, [(2, 0, 0, 4, 7), (1, 3, 1, 0, 0), (2, 1, 5, 2, 0)],
                           [[[2, 0, 0, 1, 3]], [], [[1, 3, 1, 0, 2], [2, 1, 5, 0, 2]]])
    assert plan.epoch == 2 and elastic.Plan.from_state(plan.to_state()) == plan
    with pytest.raises(ValueError, match="all 3 old ranks"):
        elastic.Plan.of(3, 12, [(1, 0, 0, 0, 0)])


def shuffled_scenario(seed, W, order):
    """As `scenario`, for old ranks reading `order` (data/shuffle.py): each old rank's position a
    random point of its shuffled stream (epochs 1-2)."""
    from shmloader.data import shuffle as shufflemod

    rng = random.Random(seed)
    counts = random_files(rng)
    while sum(map(len, counts)) < W:
        counts = random_files(rng)
    streams = []
    for r in range(W):
        first = shufflemod.first_position(order, counts.__getitem__, len(counts), r, W)
        stream = []
        for e, f, g, d, _, rows, _ in shufflemod.row_steps(order, counts.__getitem__, len(counts), r, W, first):
            if e > 2:
                break
            stream.extend((e, f, g, x) for x in range(d, rows))
        if not stream:
            return None  # an old rank with no document in two epochs: not a scenario
        streams.append(stream)
    return (counts, *stopped(streams, rng))


@pytest.mark.parametrize("k", [1, 12])
@pytest.mark.parametrize("W,W2", CHANGES)
@pytest.mark.parametrize("seed", seeds(8, 2))  # seeds 2-7: -m slow
def test_a_shuffled_plan_and_what_the_old_ranks_consumed_are_the_epochs_each_document_once(seed, W, W2, k):
    """With a shuffle the plan's units are each epoch's shuffled windows (of at least `k`
    documents, named by their head); with what the old ranks consumed (their shuffled streams up to their positions)
    they are every document of the epochs up to the plan's once; each new rank takes every W2-th."""
    from shmloader.data import shuffle as shufflemod

    order = shufflemod.Shuffle(seed + 100, k)
    made = shuffled_scenario(seed, W, order)
    if made is None:
        pytest.skip("an old rank with no row group in this random split")
    counts, positions, consumed = made
    plan = elastic.Plan.of(W, 40, positions)
    rc = counts.__getitem__
    units = list(elastic.units(plan, rc, len(counts), shuffle=order))
    first = min(p[0] for p in positions)
    windows = {(e, *w.head): w for e in range(first, plan.epoch + 1) for share in order.shares(e, counts, W)
               for w in share}

    def row(e, members, head, n, d):  # document d of a window as (epoch, file, unit, row)
        which, rows = shufflemod.locate(members, order.rows(e, *head, n)[d:d + 1])
        return e, members[int(which[0])].file, members[int(which[0])].unit, int(rows[0])

    left = [row(u.epoch, u.members, (u.file, u.rg), u.rows, d) for u in units for d in range(u.doc, u.rows)]
    assert len(left) == len(set(left))
    old = {row(e, windows[e, f, g].members, (f, g), windows[e, f, g].rows, d) for e, f, g, d in consumed if e >= first}
    everything = {(e, f, g, r) for e in range(first, plan.epoch + 1) for f, c in enumerate(counts)
                  for g, n in enumerate(c) for r in range(n)}
    assert not old & set(left) and old | set(left) == everything
    at = {tuple(p[:3]) for p in positions}  # an old rank's window at its position goes on whole; the rest unit by unit
    assert all(u.members == windows[u.epoch, u.file, u.rg].members if (u.epoch, u.file, u.rg) in at
               else u.members == (shufflemod.Member(u.file, u.rg, u.rows),) for u in units)
    # a run's start's `order_plans`
    resolver = shufflemod.Windows(shufflemod.Sourced.one(order, len(counts)), rc, W2, {ONE_SOURCE: plan})
    assert all(resolver.members(u.epoch, u.file, u.rg) == u.members for u in units)
    for e, f, g, _ in consumed:  # the old ranks' windows (a best-fit buffer's runs name them): whole
        if e >= first:
            assert resolver.members(e, f, g) == windows[e, f, g].members
    mine = [list(elastic.rank_units(plan, j, W2, rc, len(counts), shuffle=order)) for j in range(W2)]
    assert all(m == units[j::W2] for j, m in enumerate(mine))


def test_a_shuffled_plan_naming_a_unit_the_split_lacks_is_a_value_error():
    from shmloader.data import shuffle as shufflemod

    counts, order = [[3, 3], [2]], shufflemod.Shuffle(1)
    mine = shufflemod.first_position(order, counts.__getitem__, 2, 0, 2)
    plan = elastic.Plan.of(2, 40, [(1, mine.file, mine.rg, 1, 0), (1, 9, 9, 0, 0)])
    with pytest.raises(ValueError, match="old rank 1's position is file 9, row group 9"):
        list(elastic.units(plan, counts.__getitem__, 2, shuffle=order))
    theirs = shufflemod.first_position(order, counts.__getitem__, 2, 1, 2)  # a unit of the split, not old rank 0's
    plan = elastic.Plan.of(2, 40, [(1, theirs.file, theirs.rg, 1, 0), (1, theirs.file, theirs.rg, 0, 0)])
    with pytest.raises(ValueError, match="old rank 0's position .* heads no window of its share"):
        list(elastic.units(plan, counts.__getitem__, 2, shuffle=order))
