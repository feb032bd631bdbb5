"""Concat's mode: the coordinator's mode of a concat run, over a mixture (`MixConcatMode`) or
one source (`SourceConcatMode`: the same code, made of one source's parts, below).

Every source has its own canonical order of pieces (its range of the run's files, its row
groups by rank, its epochs, from its own position: `RunArgs.mixture`). Pieces are handed out
as packing/mixfeed.py says (the source the mix waits for first, even to a worker at its hold
budget; then the one furthest behind in read-ahead for its weight). Counted pieces go to the `MixStream`,
whose stretches of runs the mixture's sequencer places in the order they come, by arrays
(packing/mixplace.py, `MixSequencer`), each worker's segments of a turn as one `Copies` order;
a piece's tokens go once its last run is placed. After each batch, the `MixPoint` there travels
in the batch's slot (its buffer area), packed (packing/mixtext.py: the trainer makes its JSON
text only when asked): the state's `mixture.point`, and where a heal or an idle release starts
again.

A mixture of one source, in one stage, to no end of its own (packing/mixone.py `passes`, the one
rule) has nothing to mix: its counted pieces pass whole to the packing's shared code as the mix
takes them (`OneStream.passed`: in order, none after its end), sequenced as one source's
(`ConcatSequencer.counted`, a `Place` a piece), a `OneStream` answering the feed
for the mix; each batch's point is made from its position and the documents begun by its end
(`mixone.Passed`, packed over a part marshalled once, by the mode's sink `Points` from the
batch's `Complete`), the point the stream would have made, character for character
(tests/unit/packing/test_mixone.py).

One source's run (kinds.py `OneSource`) is such a pass-through without a mixer: its run's own
order (`mixfeed.OrderFeed`: the coordinator's pieces from its start, with its elastic plan, its
files added and its shuffle) passes whole through a `mixone.Passing` into the same sequencer, by
the same code, and its sink makes nothing (one source's state is its position). What differs is
what the mode is made of (`SourceConcatMode.__init__`), not a branch in what it does: its placer
(packing/placers.py: `WholePieces`; a pass-through's `PassThrough`, which can also end; a mix of
several's `Runs`) is chosen where the mode is made and does what differs between pieces passing
whole and runs. Such a run gets the trainer's head start as one source's does
(`MixConcatMode.head_start`, procs/headstart.py): it begins where this mode begins (`start`, the
one place `passes` is asked) and makes the same points.

What is said once: a schedule's stage that begins (logged), a source that ends (warned).
A mix that ends (every source with a weight has read its `max_epochs`, or the mix waits for a
source that read a whole epoch and most of another without a document) stops taking documents
there: every complete batch before is placed and announced, then `Ended` tells the trainer
why, which it raises as a `DataError` once it has taken them (the partial last batch is not
made). So the batches before the end are the same whatever the workers and the timing. A mix
that stops at a piece that cannot be read (packing/mix.py) says its error the same way, once
the batches that do not need it (nor the token after them) are announced.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..data import shuffle
from ..data.mixture import Mixer
from ..data.order import RAMP
from ..errors import DataError
from ..position import Position
from .base import MAX_IN_FLIGHT, Begin, Complete, Mode
from .concat import PACKING, ConcatSequencer
from .mix import MixStream, point_at
from .mixplace import MixSequencer
from .mixfeed import MixFeed, OrderFeed, Said, held_by_mix, start_points
from .mixone import OneStream, Passing, passes
from .mixtext import kept, packed, point_text
from .placers import PassThrough, Runs, WholePieces


class Start(NamedTuple):
    """Where a mixture's concat run starts (`start`): its point (None: fresh), every source's start
    (`mixfeed.start_points`), the source of the document the next token is in and the tokens of
    it dropped (`first`, `skip`: None and 0 where the run starts at a document's start), its
    mixer, and whether the mix passes its one source's pieces whole (packing/mixone.py `passes`)."""
    point: object
    starts: dict
    first: str | None
    skip: int
    mixer: Mixer
    passes: bool


def start(run) -> Start:
    """The `Start` of a mixture's run (`RunArgs`: its `MixArgs`, and its start's point at batch
    count `RunStart.batch`): what the coordinator's mode and the trainer's head start
    (`MixConcatMode.head_start`) both begin from."""
    mix = run.mixture
    point, starts = start_points(run)
    # the document the next token is in comes first, its tokens before the point dropped (not if its
    # source is left out now: then the mix starts at a document's start)
    first = point.source if point is not None and point.skip and point.source in _read(mix) else None
    if point is not None:
        mixer = Mixer.resume(mix.mixture, point.mixer, run.start.batch).mixer
    else:
        mixer = Mixer(mix.mixture, run.start.batch)
    return Start(point, starts, first, point.skip if first is not None else 0, mixer, passes(run, mixer))


class MixConcatMode(Mode):
    """Concat's mode: a mixture's runs placed (the module docstring says how pieces are handed
    out), or, where pieces pass whole (a pass-through's, one source's: `SourceConcatMode`), each
    counted piece placed by token offset as it comes in order, its tokens counting against its
    worker's hold until it is fully placed (base.py: what a worker may hold). Which of the two is
    the placer's, chosen once where the mode is made (`Runs`; `PassThrough`, `WholePieces`): it
    holds the sequencer and does what differs (a counted piece's spec kept or not, the flow into
    the sequencer, the batches ready, the write orders, the end of a mix that can end). A piece that
    cannot be read stops the stream where it would begin: its error is said (`Ended`) once
    every piece before it is taken and every batch they make is announced. What a batch's slot
    carries for the state is the sink's to make from its `Complete` (`buffer_of` is the sink):
    a mixture's point (`Points`), or nothing (one source's)."""

    def __init__(self, cfg, run, n_workers: int, pieces):
        Mode.__init__(self, n_workers, cfg, run.layout.window, run.layout.n_slots)
        mix, window = run.mixture, run.layout.window
        _, starts, first, skip, mixer, passing = start(run)
        lo = {r.name: r.lo for r in mix.ranges}  # each source's first file in the run's numbering
        if passing:  # one source, nothing to mix: its pieces pass whole (packing/mixone.py)
            stream = one = OneStream(mixer, starts, lo[mixer.mixture.names[0]], skip)
            placer = PassThrough(ConcatSequencer(window, run.layout.n_slots, skip), one, self)
        else:
            one = None
            first_batch = run.start.batch
            stream = MixStream(mixer, starts, lambda tokens: first_batch + (tokens - skip) // window, first)
            placer = Runs(MixSequencer(window, run.layout.n_slots, skip), stream, self)
        feed = MixFeed(run, stream, starts, pieces, RAMP, cfg.max_piece_docs, self._in_flight.keys,
                       stopping=self._flow)
        self._begin(placer, stream, feed, Points(lo, one, window))

    def _begin(self, placer, stream, feed, sink):
        """The mode over its collaborators: `placer` what places counted pieces (`WholePieces`,
        `PassThrough`, `Runs`: chosen once, here; its sequencer is the mode's `seq`, its `ready` and
        `orders` the mode's own), `stream` what the feed asks (a `MixStream`, a `OneStream`, a
        `Passing`), `feed` what hands pieces out (`MixFeed`, `OrderFeed`), `sink` what a batch's
        slot carries for the state (`buffer_of`)."""
        self.placer, self.seq, self.stream, self.feed = placer, placer.seq, stream, feed
        # the placer's own, bound once (no frame of the mode's around them: asked at every turn)
        self._spec, self.ready, self.orders = placer.spec, placer.ready, placer.orders
        self.buffer_of = sink  # `Mode.buffer_of`: what a batch's slot carries for the state, the sink's
        self.said = Said(stream)
        self.pieces = feed.feed()
        self._flow()  # a state saved at the mix's end starts over (`Mixer.over`): it ends before any piece

    @staticmethod
    def head_start(cfg, run) -> "Begin | None":
        """A pass-through's (`start`'s `passes`): its source's files from its start, in its order,
        as the feed orders them (`MixFeed`: its range, its `later`, its own shuffle; a shuffled
        source the point does not place from its share's first window, as procs/coordinator.py
        `_with_firsts` finds it), a batch's point made as this mode makes it (`OneStream.at`,
        `packed`), kept as the trainer keeps a slot's (`mixtext.kept`); none for a mix of several
        (its stream decides each document)."""
        mix, begins = run.mixture, run.start.at
        begun = start(run)
        if not begun.passes:
            return None
        (source,) = mix.ranges  # `passes`: the one source the mixture has is the one the run reads
        one = OneStream(begun.mixer, begun.starts, source.lo, begun.skip)

        def point(position: Position, end: int, docs: int):
            return kept(*one.packed(one.at(position, end, docs)))

        start_pos = begun.starts[source.name]  # where the source reads first (a Position)
        reads = shuffle.of_run(cfg, run)
        begin = Begin.reading(source.lo, source.hi, start_pos._replace(file=start_pos.file - source.lo, skip=begun.skip),
                              (begins.laters or {}).get(source.name), reads, point)
        if begin.order is None or source.name in begins.placed:
            return begin

        def first(row_counts):
            found = reads.firsts(frozenset(), lambda f: row_counts(f - source.lo), run.rank, run.world)
            if source.name not in found:  # a footer that cannot be read: the coordinator's to say
                raise DataError(f"mixture source {source.name!r}: its first window cannot be found")
            return found[source.name]
        return begin._replace(first=first)

    def can_take(self, worker: int) -> bool:
        pick = self.feed.pick_now()
        if pick is None:
            return False
        if pick.needed:  # past the hold budget: only the mix can free it, and the mix waits for this
            return sum(1 for w, _ in self._in_flight.values() if w == worker) < MAX_IN_FLIGHT
        return self._room(worker, pair=True)  # `Mode.can_take`'s (a frame less: asked at every turn)

    # ---- counts, runs and batches

    def counted(self, msg):
        piece = self._spec(msg.piece)  # the placer's: kept (pieces passing whole) or dropped (runs)
        self._counted_by(self.owner[msg.piece], piece, int(msg.lengths.sum()))
        self.feed.counted(msg.piece, piece, msg.lengths)
        self._flow()
        return piece

    def failed(self, index: int, error) -> bool:
        return held_by_mix(self, index, error)

    def _flow(self):
        """The runs the mix can make now, into the sequencer (the placer's `flow`); a mix that
        waits for a source without documents, or has nothing left to read, ends (`Ended` once
        its batches are out)."""
        self.feed.flow()
        self.placer.flow(self.feed)

    def freed(self, batch: int):
        self.seq.freed(batch)

    def written(self, counts):
        self.seq.written(counts)

    # `ready` and `orders`: the placer's, bound in `_begin`

    def holding(self, worker: int, orders) -> dict:
        """Every piece `worker` owns (not fully placed) or was sent an order for: whole."""
        out = Mode.holding(self, worker, orders)
        out.update((i, None) for i, w in self.owner.items() if w == worker)
        out.update((index, None) for order in orders for index in PACKING.order_pieces(order))
        return out

    def messages(self):
        seq = self.seq
        over = seq.finished or self.stream.stopped is not None
        return self.said.messages(over and seq.book.announced >= seq.complete_before())


class SourceConcatMode(MixConcatMode):
    """Concat's mode over one source's run (kinds.py `OneSource`): its run's own order
    (`mixfeed.OrderFeed`: its pieces as the coordinator's `pieces` makes them, from the run's
    start, its elastic plan, its files added and its shuffle) passes whole through a
    `mixone.Passing` into the `ConcatSequencer` as a pass-through's does, and its batches carry
    nothing for the state (one source's state is its position). Only what it is made of differs."""

    def __init__(self, cfg, run, n_workers: int, pieces):
        Mode.__init__(self, n_workers, cfg, run.layout.window, run.layout.n_slots)
        one = Passing()
        skip = run.start.position.skip
        self._begin(WholePieces(ConcatSequencer(run.layout.window, run.layout.n_slots, skip), one, self),
                    one, OrderFeed(pieces(RAMP, cfg.max_piece_docs, 0), one), _no_point)

    @staticmethod
    def head_start(cfg, run) -> "Begin | None":
        """One source's: every file of the run from its start, in the loader's order; none at a
        change of world size (an elastic plan's order)."""
        start = run.start
        if start.at.plan is not None:
            return None
        # a `Sourced` of one, as the workers read it
        return Begin.reading(0, len(run.files), start.position, start.at.later, shuffle.of_run(cfg, run))


class Points:
    """A mixture's sink (`MixConcatMode.buffer_of`): the `MixPoint` after a batch, packed
    (packing/mixtext.py: the trainer makes the state's text from it when a state asks); a
    pass-through's made from its `Complete` (`OneStream.at`: its position, stream position
    and documents begun), a mix's carried in it (`Complete.runs`)."""

    def __init__(self, lo: dict, one: OneStream | None, window: int):
        self._lo, self._one, self._window = lo, one, window

    def __call__(self, done: Complete):
        if done.runs is not None:
            return packed(done.runs, self._lo)
        one = self._one
        return one.packed(one.at(done.position, (done.batch + 1) * self._window, done.docs))


def _no_point(done: Complete) -> None:
    """One source's sink: its batches carry nothing for the state."""
    return None


class ConcatPlace:
    """A mixture's count-only place of concat (packing/mixcount.py, `count_place` in
    `packing.MODES`): where batch `batch` of the count starts in the mixed stream, from its runs
    in order, as the live run's sequencer finds it (`ConcatSequencer._find`: the next document,
    past nulls, at a document's boundary). Its stream starts as `MixConcatMode`'s does: from the
    cut document, its tokens before dropped (`skip`)."""

    prefix = ()

    def __init__(self, count, used):
        """`count`: a `mixcount.Count`; `used(source, piece)`: a piece whose last run was taken."""
        point, lo = count.point, count.lo
        self.window = window = count.B * count.T + 1
        cut = point.source if point is not None and point.skip and point.source in lo else None
        self.skip = skip = point.skip if cut is not None else 0
        first_batch = count.first_batch
        self.stream = MixStream(count.mixer, count.starts, lambda tokens: first_batch + (tokens - skip) // window, cut)
        self.cap, self.total, self._lo, self._used = count.cfg.max_piece_docs, count.batch, lo, used
        self.target = count.batch * window + skip   # the stream's token the batch starts at
        self.tokens = 0                             # the stream's tokens so far
        self.result = None                          # the `MixPoint` there, once known

    @property
    def done_batches(self) -> int:
        return min(max(self.tokens - self.skip, 0) // self.window, self.total)

    def wants(self) -> bool:
        return self.result is None

    def counted(self, piece, lengths):
        """The stream's runs come in order instead (`flow`)."""

    def flow(self):
        for run in self.stream.runs():
            self.add(run)
            if run.last:
                self._used(run.source, run.piece)

    def add(self, run):
        cum = np.cumsum(np.asarray(run.lengths, dtype=np.int64))
        start = self.tokens
        self.tokens += int(cum[-1]) if len(cum) else 0
        if self.result is None and start <= self.target < self.tokens:
            rel = self.target - start
            row = int(np.searchsorted(cum, rel, side="right"))
            skip = rel - (int(cum[row - 1]) if row else 0)
            row += run.row_lo
            self.result = point_at(run, row, skip + (run.piece.skip if row == 0 else 0))

    def located(self) -> tuple:
        """`(position, the point's JSON text)` of the `Located` answer."""
        done = self.result
        return tuple(done.sources[done.source]._replace(skip=done.skip)), point_text(done, self._lo)


def _read(mix) -> set:
    """The sources a run reads (a state's left-out ones are not)."""
    return {r.name for r in mix.ranges}
