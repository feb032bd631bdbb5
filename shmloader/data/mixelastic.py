"""A mixture at a change of world size: each source's elastic plan and where a new rank starts;
pure (no processes: resume.py finds the old ranks' points and calls `plan`).

Every old rank r of W stood, at the same batch count, at a point of its mix (`MixPoint` JSON,
files numbered within each source): every source's next document, the source and skip of the
next token, the mixer's state. Each source then changes world size on its own, as one source
does (data/elastic.py): its plan's positions are the old ranks' places in it (the skip of the
document an old rank had cut, for the source that document is of), its units what they had not
consumed, dealt out over the new ranks. A new rank starts every source at its first unit (the
tokens before a cut document's place dropped: `"skips"`), with a mixer whose counting stage
begins at the change (weights as the mixture has them there) and whose totals are the old ranks'
together (tokens and documents summed, the furthest epoch): the same for every new rank, from
any old rank's state. So every token of every source that no old rank had consumed is read
once, by one new rank, and each source goes on mixing by its weight.

Best fit: an old rank's point is the one after the last chunk its plans took (skip 0), and its
buffer holds the documents it had taken and not placed, runs `[source, epoch, file, rg, row,
count]` (packing/mixbestfit.py), all before its places. Its places plan the sources as above;
its buffer's runs are dealt out as one source's are (`elastic.deal`: every `world`-th run of the
old ranks' buffers, old rank 0's first, each in arrival order, whatever their sources), each new
rank's share its first buffer (`ElasticStart.buffer`). So a document an old rank had taken and not
placed is placed once, by one new rank, and one it had not taken is in one new rank's units.

A shuffled mixture (`shuffles`: each source's own `data.shuffle.Shuffle`, `Sourced`'s) plans each
source over its own shuffled order, as one shuffled source does: the old ranks' places are in
it, the units those of its epoch in progress in that order past them, then plain shuffled epochs
at the new world size. A source whose shuffled order this rank cannot start (no unit of it left
for this rank and fewer units in an epoch than ranks, or a footer that cannot be read) starts at
the next epoch: reading it raises the source's error, as in a fresh shuffled run
(`Sourced.firsts`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from ..errors import DataError
from ..position import Position
from . import elastic
from .mixture import Mixer


class ElasticStart(NamedTuple):
    """A new rank's start after a change: each source's plan, the point it starts from (JSON,
    as a state's `mixture.point`, with `"skips"`: each source's cut document's tokens to drop),
    and best fit's first buffer, runs `[source, epoch, file, rg, row, count]` ([] for concat)."""
    plans: dict
    point: dict
    buffer: list


def plan(points: list, mixture, batch: int, rank: int, world: int,
         row_counts: Callable[[str], Callable[[int], list]], n_files: Callable[[str], int],
         shuffles: dict | None = None, buffers=()) -> ElasticStart:
    """New rank `rank` of `world`'s start, from every old rank's point at `batch` (old rank r's
    is `points[r]`); `row_counts(name)(f)`: rows per row group of source `name`'s file `f`;
    `shuffles[name]`: source `name`'s shuffled order (None: the files' order); `buffers[r]`: best
    fit's, old rank r's buffer runs `[source, epoch, file, rg, row, count]` (concat: none)."""
    plans, sources, skips = {}, {}, {}
    for name in mixture.names:
        places = [tuple(p["sources"][name]) + (p["skip"] if p["source"] == name else 0,) for p in points]
        plans[name] = elastic.Plan.of(len(points), batch, places)
        start = _start(plans[name], rank, world, row_counts(name), n_files(name), (shuffles or {}).get(name))
        sources[name], skips[name] = list(start[:4]), start.skip
    mixer = Mixer(mixture, batch)
    for name in mixer.totals:
        old = [p["mixer"]["totals"][name] for p in points if name in p["mixer"]["totals"]]
        if old:
            mixer.totals[name] = (sum(t[0] for t in old), sum(t[1] for t in old), max(t[2] for t in old))
    point = {"source": mixture.names[0], "skip": 0, "sources": sources, "mixer": mixer.state(),
             "skips": {name: k for name, k in skips.items() if k}}
    return ElasticStart(plans, point, elastic.deal(buffers, rank, world))


def _start(plan: elastic.Plan, rank: int, world: int, row_counts, n_files: int, shuffle) -> Position:
    """`elastic.start` of a source; shuffled, one whose order raises a `DataError` here starts at
    the next epoch (its order raises the error again when the source is first read)."""
    try:
        return elastic.start(plan, rank, world, row_counts, n_files, shuffle)
    except DataError:
        if shuffle is None:
            raise
        return Position(plan.epoch + 1, 0, rank, 0)
