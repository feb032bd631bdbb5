"""Elastic resume: the streams of a run whose world size changed. Pure logic over row counts.

A run saved at world size W goes on at W2. At the change every old rank r stood at its position
`positions[r]` (epoch, file, rg, doc, skip) at the same batch count `batch`; best fit's old
ranks also held a buffer of documents read and not yet placed in a row (`buffers[r]`, runs
`[epoch, file, rg, row, count]`). A `Plan` shares out what they had not consumed so that each
document of it is read once, by one new rank (docs/design.md, "Elastic resume"):

- The *units* (`units`, each a `position.Step`) are the row groups of the old ranks' streams
  after their positions, up to the end of `epoch`, the last epoch any old rank was in: in
  canonical order (epoch, file, row group: a row group `g` is old rank `g % W`'s), every row
  group past its old rank's position, and the row group at the position from its document
  (and, concat, its token) on.
- Unit i goes to new rank i % W2. A new rank reads its units in order (`steps`), then plain
  W2-rank epochs from `epoch + 1` on (row groups rank, rank + W2, ...: data/order.py).
- Best fit's buffers are dealt out the same way, run by run in old-rank order (`buffer`, `deal`): they
  are the new ranks' first buffers, so a document an old rank had read but not placed is
  placed once, by one new rank.

A position in a new rank's stream is an ordinary (epoch, file, rg, doc, skip): a row group is
in at most one unit, so a position at or before `epoch` names the unit it is in. A new rank
starts at its first unit (`start`), or at epoch `epoch + 1` when it has none.

With a shuffle (`shuffle=`, data/shuffle.py) the units are the windows of the old ranks'
shuffled streams: each old rank's windows of an epoch (`Shuffle.shares`) in turn (the first of
each old rank, then the second of each, ...), those past its old rank's position in its share:
the one at it from its document on, every later one unit by unit (`_shuffled_units`); the new
ranks deal them out the same way, then read
plain W2-rank shuffled epochs from `epoch + 1` on, each from its share's first window. A
shuffled mixture's source is planned so in its own order (data/mixelastic.py). A shuffled run
that began at a change does not change again yet (state.py, mixstate.py refuse it).

A run that began at a change may change again (`parent`: the plan it began with). Its ranks'
streams were the parent's units (unit i: rank i % W) and then plain W-rank epochs, which is
still canonical order (epoch, file, row group), each rank's stream a subsequence of it; the
new units are those past each rank's position in it, as for a plain run.
"""
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ..position import Position, Step
from . import shuffle as shufflemod
from .order import row_steps


@dataclass(frozen=True)
class Plan:
    world: int                 # W, the old run's world size
    epoch: int                 # the last epoch of the old ranks' streams the units cover (their
    #                            epochs in progress; a parent's units count as the parent's last epoch)
    batch: int                 # the batch count at the change (every rank's)
    positions: tuple           # per old rank: (epoch, file, rg, doc, skip) at `batch`
    buffers: tuple = ()        # best fit: per old rank, its buffer runs; () for concat
    parent: "Plan | None" = None  # the plan the old run began with, if it began at a change too

    @classmethod
    def of(cls, world: int, batch: int, positions, buffers=(), parent: "Plan | None" = None) -> "Plan":
        positions = tuple(tuple(int(v) for v in p) for p in positions)
        if len(positions) != world:
            raise ValueError(f"an elastic plan needs the positions of all {world} old ranks, got {len(positions)}")
        epoch = max(p[0] for p in positions)
        if parent is not None and any(p[0] <= parent.epoch for p in positions):
            epoch = max(epoch, parent.epoch)  # an old rank inside its parent's units: they are its epoch
        return cls(world, epoch, batch, positions,
                   tuple(tuple(tuple(int(v) for v in run) for run in runs) for runs in buffers), parent)

    def to_state(self) -> dict:
        """The plan as a state holds it (JSON: lists)."""
        return {"world_size": self.world, "epoch": self.epoch, "batch": self.batch,
                "positions": [list(p) for p in self.positions],
                "buffers": [[list(run) for run in runs] for runs in self.buffers],
                "parent": None if self.parent is None else self.parent.to_state()}

    @classmethod
    def from_state(cls, d: dict) -> "Plan":
        return cls(d["world_size"], d["epoch"], d["batch"], tuple(tuple(p) for p in d["positions"]),
                   tuple(tuple(tuple(run) for run in runs) for runs in d["buffers"]),
                   None if d.get("parent") is None else cls.from_state(d["parent"]))


def units(plan: Plan, row_counts: Callable[[int], Sequence[int]], n_files: int, shuffle=None) -> Iterator[Step]:
    """Every unit of the plan, in canonical order (each new rank takes every W2-th); with
    `shuffle`, in each epoch's shuffled order (`_shuffled_units`)."""
    if shuffle is not None:
        yield from _shuffled_units(plan, row_counts, n_files, shuffle)
        return
    for owner, u in _old_units(plan, row_counts, n_files):
        e, f, g, doc, skip = plan.positions[owner]
        at = (u.epoch, u.file, u.rg)
        if at > (e, f, g):
            yield u
        elif at == (e, f, g) and doc < u.rows:  # the owner stood in it: from its position on
            yield Step(u.epoch, u.file, u.rg, doc, skip, u.rows)


def _shuffled_units(plan: Plan, row_counts, n_files: int, shuffle) -> Iterator[Step]:
    """`units` of a shuffled run: each epoch's windows of the old ranks' shares in turn (window j
    of old rank 0, of old rank 1, ..., then window j + 1), those past its old rank's position in
    its share: the one at it whole, from its document on; every later one unit by unit (each
    unit a window of its own: its documents in `Shuffle.rows` of the unit), so that the new
    ranks share the rest of the epoch as evenly as without a window."""
    assert plan.parent is None, "a shuffled run that began at a change of world size changes again (state.py refuses it)"
    counts = [list(row_counts(f)) for f in range(n_files)]
    W, first = plan.world, min(p[0] for p in plan.positions)
    for epoch in range(first, plan.epoch + 1):
        shares = shuffle.shares(epoch, counts, W)
        here = []  # each old rank's (epoch, its window's place in its share), and its document
        for r, (e, pf, pg, doc, skip) in enumerate(plan.positions):
            heads = {w.head: j for j, w in enumerate(shares[r])}
            if e == epoch and (pf, pg) not in heads:
                raise ValueError(f"resume state: old rank {r}'s position is file {pf}, row group {pg} of epoch "
                                 f"{e}, which heads no window of its share of the split's shuffled order (files "
                                 f"changed, another shuffle_window, or an edited state)")
            here.append(((e, heads[(pf, pg)]) if e == epoch else (e, -1), doc, skip))
        for j in range(max(map(len, shares))):
            for r, share in enumerate(shares):
                if j >= len(share):
                    continue
                w, (at, doc, skip) = share[j], here[r]
                if (epoch, j) > at:  # a window no old rank began: its units dealt one by one
                    for m in w.members:
                        yield Step(epoch, m.file, m.unit, 0, 0, m.rows, (m,))
                elif (epoch, j) == at and doc < w.rows:
                    yield Step(epoch, *w.head, doc, skip, w.rows, w.members)


def _old_units(plan: Plan, row_counts, n_files: int) -> Iterator[tuple[int, Step]]:
    """`(old rank, unit)` of the old ranks' streams in canonical order, up to the end of
    `plan.epoch`: their parent plan's units, if any, then plain epochs (row group g: old rank
    g % W), from where the earliest old rank stood on."""
    W = plan.world
    first_epoch, first_file = min((p[0], p[1]) for p in plan.positions)
    if plan.parent is not None:
        for i, u in enumerate(units(plan.parent, row_counts, n_files)):
            yield i % W, u
        first_epoch, first_file = max((first_epoch, first_file), (plan.parent.epoch + 1, 0))
    for epoch in range(first_epoch, plan.epoch + 1):
        for file in range(first_file if epoch == first_epoch else 0, n_files):
            for rg, rows in enumerate(row_counts(file)):
                yield rg % W, Step(epoch, file, rg, 0, 0, rows)


def rank_units(plan: Plan, rank: int, world: int, row_counts, n_files: int, shuffle=None) -> Iterator[Step]:
    """New rank `rank` of `world`'s units, in order."""
    for i, unit in enumerate(units(plan, row_counts, n_files, shuffle)):
        if i % world == rank:
            yield unit


def start(plan: Plan, rank: int, world: int, row_counts, n_files: int, shuffle=None) -> Position:
    """Where new rank `rank` of `world` begins: its first unit (its `skip` too), or the first
    epoch after the plan's when it has none."""
    first = next(rank_units(plan, rank, world, row_counts, n_files, shuffle), None)
    if first is None:
        return _after(plan, rank, world, row_counts, n_files, shuffle)
    return Position(first.epoch, first.file, first.rg, first.doc, first.skip)


def buffer(plan: Plan, rank: int, world: int) -> list[list[int]]:
    """New rank `rank` of `world`'s first best-fit buffer: `deal` of the old ranks' buffers."""
    return deal(plan.buffers, rank, world)


def deal(buffers, rank: int, world: int) -> list[list]:
    """Every `world`-th run of the old ranks' `buffers` (old rank 0's first, each in arrival
    order), from run `rank` on: new rank `rank`'s share (a mixture's runs lead with their source:
    data/mixelastic.py)."""
    runs = [list(run) for old in buffers for run in old]
    return runs[rank::world]


def _after(plan: Plan, rank: int, world: int, row_counts, n_files: int, shuffle) -> Position:
    """Where new rank `rank` of `world`'s plain epochs begin: `plan.epoch + 1` (shuffled: its
    share's first unit of that epoch)."""
    if shuffle is None:
        return Position(plan.epoch + 1, 0, rank, 0)
    return shufflemod.first_position(shuffle, row_counts, n_files, rank, world, plan.epoch + 1)


def steps(plan: Plan, rank: int, world: int, row_counts, n_files: int, at: Position,
          later=None, shuffle=None) -> Iterator[tuple]:
    """The row-group steps (`order.cut_pieces`) of new rank `rank` of `world`'s stream from
    position `at`: the rest of its units, then plain epochs. The step holding `at` starts at
    its document with skip 0 (a run's own `skip` applies there); later units keep theirs."""
    if at.epoch <= plan.epoch:
        here, passed = (at.epoch, at.file, at.rg), False
        for u in rank_units(plan, rank, world, row_counts, n_files, shuffle):
            key = (u.epoch, u.file, u.rg)
            if key == here:
                passed = True
                yield Step(u.epoch, u.file, u.rg, at.doc, 0, u.rows, u.members)
            elif passed if shuffle is not None else key > here:  # shuffled: after it in the units' order
                yield u
        at = _after(plan, rank, world, row_counts, n_files, shuffle)
    yield from row_steps(row_counts, n_files, rank, world, at, later, shuffle)


def in_units(plan: Plan | None, epoch: int) -> bool:
    """Whether a position of `epoch` lies in the plan's units (not in the plain epochs after)."""
    return plan is not None and epoch <= plan.epoch
