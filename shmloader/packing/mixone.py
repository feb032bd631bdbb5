"""A mixture of one source passing its pieces whole: the mix where it has nothing to mix; pure.

A run whose mixture reads one source, in one stage, to no end of its own (`passes`: the one
rule of when a mix is a pass-through) picks that source for every document, so its stream is
its source's pieces end to end, as one source's is. Its concat mode (packing/mixmode.py) then
hands each piece the mix takes (`OneStream.passed`: counted, in order, none after the mix's end)
whole to the packing's shared code as one source's mode does
(`ConcatSequencer.counted`, one `Place` order a piece): no `Rows`, block, stretch or span a
piece. `OneStream` stands for the mix where the feed (packing/mixfeed.py) asks it: which
source the mix waits for, where it stops at a piece that cannot be read, where it ends (a
source without documents). What the mixer would count is kept by the packing's own
bookkeeping: a batch's point (`Passed`) is the piece and row its next token is in, the
tokens of the documents before that one (its stream position, less the tokens into it, plus
the resumed cut document's tokens before the run's start) and their number (the documents
begun by the batch's end); `OneStream.packed` makes what the slot carries of it, its JSON text
that of the `MixPoint` the stream (packing/mix.py) would have made, character for character
(packing/mixtext.py `Packed`); the trainer's head start makes a batch's the same way
(packing/mixmode.py `MixConcatMode.head_start`). Its best-fit mode
(packing/mixbestfit.py) cuts its chunks from the pieces (packing/mixchunks.py `PassingChunks`), telling the mixer
what each takes (`OneStream.took`), and makes its points as a mixture's.

`Passing` is the part of `OneStream` that is no mixture's: counted pieces of one order taken in
that order, whole, and where one that cannot be read stops them. One source's concat and
count-only runs are made of it (packing/mixmode.py `SourceConcatMode`, packing/mixcount.py
`SourceCountMode`: their run's own order, no mixer, no point), so a one-source run and a
pass-through go through the same mode code. One source's best fit (packing/mixbestfit.py
`SourceBestFitMode`) too: its run's order after its resumed buffer's pieces (`first`) counted
into it, its chunks cut from what passes (`PassingChunks`, a pass-through's too; only the cut is
its own, `RowCut`).

What is not a pass-through (`passes` says no) goes through the stream: a second source, a
schedule (a later stage may weigh another), a `max_epochs` (the source ends and the mix with
it), a change of world size's plans or cut documents (`skips`), a mixer over. A resume
decides again: a state of a pass-through resumes under any mixture, as the stream's does.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..data.mixture import Mixer
from ..position import Position
from .base import InOrder
from .mixruns import MixPoint, place
from .mixtext import passing_base, passing_mixer, packed_passing


def passes(run, mixer: Mixer) -> bool:
    """Whether the mixture's run `run` (`RunArgs`, its mixer resumed as `mixer`) passes its one source's
    pieces whole: its mixture has one source, read by the run, one stage (no schedule), no
    `max_epochs`; it starts at no change of world size (no plans, no cut documents of old
    ranks), and its mixer is not over. Such a mix picks that source every time, from where it
    stands, so what it takes is the source's stream."""
    mixture, at = run.mixture.mixture, run.start.at
    return (len(mixture.names) == 1 and tuple(r.name for r in run.mixture.ranges) == mixture.names
            and len(mixture.stages) == 1 and not mixture.max_epochs
            and not at.plans and not (at.point or {}).get("skips")
            and mixer.over() is None)


class Passed(NamedTuple):
    """Where a pass-through's batch ends (`Complete.runs`): its source reads `position` next (its
    `skip` tokens into that document), after `tokens` tokens of `documents` documents taken since
    the run's start (the mixer's counts, the resumed cut document's included)."""
    position: Position
    tokens: int
    documents: int


class Passing:
    """Counted pieces of one order taken in that order, whole, to be handed on (`passed`); the
    first piece that cannot be read stops it once every piece before it is taken (`stopped`).
    One source's concat run (packing/mixmode.py `SourceConcatMode`: its pieces are its run's own
    order) passes them so; a pass-through's mix (`OneStream`) does too, and more (its point, and
    an end: `OneStream.finish`). An order alone never ends (`finished` stays None: where one
    source's run has nothing left to read is the coordinator's to say). One source's best fit
    (packing/mixbestfit.py `SourceBestFitMode`) counts its run's order into one as concat's does,
    its chunks cut from what passes (`PassingChunks`)."""

    def __init__(self, name=None, first: int = 0):
        """`first`: the index in its order of its first piece (one source's: after the resumed
        buffer's pieces, which are its best fit's sequencer's own)."""
        self.name = name
        self.version = 0            # grows whenever what the mix waits for may change (the feed's cache)
        self.notes: list = []       # nothing to say: no stage begins, the source does not end
        self.finished = None        # why the mix ended (a source without documents), once it has
        self.stopped = None         # the error of a piece it needs and cannot read, once it does
        self._arrived = InOrder(first)
        self._unreadable = None     # (seq, error) of the first piece that cannot be read
        self._passed = []           # (piece, lengths) taken in order, not yet handed on (`passed`)
        self._last = None           # the last piece taken

    def counted(self, source: str, seq: int, piece, lengths: np.ndarray):
        """Piece `seq` of the source's order was counted: taken once the ones before it are."""
        self.version += 1
        for _, (p, n) in self._arrived.add(seq, (piece, lengths)):
            self._take(p, n)
        if self._unreadable is not None:
            self._stop_if_unreadable()

    def _take(self, piece, lengths: np.ndarray):
        """A piece counted in order: handed on (`passed`)."""
        self._passed.append((piece, lengths))
        self._last = piece

    def passed(self) -> list:
        """`(piece, lengths)` of the pieces taken since last asked, in order."""
        out, self._passed = self._passed, []
        return out

    def waiting(self) -> dict:
        """`{seq: (piece, lengths)}` of the pieces counted that wait for an earlier one."""
        return self._arrived.waiting()

    def unreadable(self, source: str, seq: int, error):
        """Piece `seq` of the order cannot be read: the mix stops once every piece before it is taken."""
        if self._unreadable is None or seq < self._unreadable[0]:
            self.version += 1
            self._unreadable = (seq, error)
            self._stop_if_unreadable()

    def _stop_if_unreadable(self):
        if self.finished is not None:  # an ended mix needs no piece after it (as `MixStream`'s)
            return
        if self._unreadable is not None and self.stopped is None and self._unreadable[0] == self._arrived.next:
            self.version += 1
            self.stopped = self._unreadable[1]


class OneStream(Passing):
    """The mix of a pass-through (`passes`), as the feed and the mode ask it (packing/mix.py's
    `MixStream` answers the same questions for a mix of several): counted pieces taken in their
    source's order, whole (`Passing`). Concat leaves the mixer as it was at the start and makes
    each point from its state there and the batch's counts (`at`, `packed`, `end_point`); best fit
    tells it what each chunk takes (`took`) and makes its points as a mixture's
    (packing/mixbestfit.py)."""

    def __init__(self, mixer: Mixer, starts: dict, lo: int, skip: int):
        """`starts`: every source's start (the run's numbering); `lo`: the source's first file in
        it; `skip`: the tokens of the run's first document before its start (a resumed cut one)."""
        super().__init__(mixer.mixture.names[0])
        self.mixer = mixer
        self.names = (self.name,)
        self.skip = skip
        self.holding = lambda: False  # whether the packing holds a document of a piece handed on
        #                               (best fit takes a chunk when a plan asks: packing/mixbestfit.py
        #                               `mix_sequencer` sets it to its `DocumentCut`'s `holding`)
        self._start = starts[self.name]  # where the source reads first
        self._others = {n: p for n, p in starts.items() if n != self.name}  # a state's, left out
        state = Mixer.state_of_snapshot(mixer.snapshot())
        self._state = state
        self._after_end = None  # the first piece counted in order after the mix ended (`end_point`)
        # what every packed point shares, marshalled once (`packed`)
        self._base = passing_base(self.name, state, [(n, *p) for n, p in self._others.items()], lo)

    def _take(self, piece, lengths: np.ndarray):
        """A piece counted in order: handed on while the mix has not ended; after its end, the
        first is where the mix's head stands (`end_point`), the rest dropped."""
        if self.finished is None:
            Passing._take(self, piece, lengths)
        elif self._after_end is None:
            self._after_end = piece

    def finish(self, why: str):
        """The mix ends here (`why`): no piece is taken after those taken."""
        if self.finished is None and self.stopped is None:
            self.version += 1
            self.finished = why

    def exhausted(self, source: str, pieces: int):  # never: `passes` takes no `max_epochs`
        raise AssertionError(f"mixture source {source!r} of a pass-through has no max_epochs")

    def waiting_for(self) -> list:
        """The mix waits for its source's next piece when the packing holds none of its documents
        (concat takes every piece counted in order at once), until it ends or stops."""
        if self.finished is not None or self.stopped is not None or self.holding():
            return []
        return [self.name]

    def enter(self, batch: int):
        """One stage: none begins (best fit asks before each batch)."""

    @staticmethod
    def batch_of(tokens: int) -> int:
        """One stage: the batch a token lands in never matters (0)."""
        return 0

    def took(self, piece, tokens: int, documents: int, row: int) -> MixPoint:
        """The packing took `documents` documents of `piece`, `tokens` as the mixer counts them, up
        to its row `row` (the nulls after them included): told to the mixer, as the stream tells
        it a block; returns where the mix stands after them (skip 0, no mixer state: best fit's
        chunk end, its mixer's state made after the batch)."""
        self.version += 1
        self.mixer.took(self.name, tokens, piece.epoch, documents=documents)
        return MixPoint(self.name, 0, {**self._others, self.name: Position(piece.epoch, piece.file, piece.rg,
                                                                           piece.doc_start + row)}, None)

    def end_point(self, end: int, begun: int) -> MixPoint:
        """Where an ended mix stands (the stream's `end_point`), its last batch ending at stream
        position `end` with `begun` documents begun (`at`'s). A pass-through ends only where its
        source held no document in its order (packing/mixfeed.py `counted`, `flow`) from the
        start to past a whole epoch: it took none, so the mixer's epoch is the one it started with."""
        tokens, documents = self._counts(end, 0, begun)
        if self._after_end is not None:  # the stream's head there
            where = place(self._after_end, 0)
        elif self._last is not None:     # ... else where its last piece taken ends
            where = Position(self._last.epoch, self._last.file, self._last.rg, self._last.doc_end)
        else:
            where = self._start
        return MixPoint(self.name, 0, {**self._others, self.name: where},
                        passing_mixer(self._state, self.name, tokens, documents,
                                      self._state["totals"][self.name][2]))

    def at(self, position: Position, end: int, begun: int) -> Passed:
        """`Passed` of a batch that ends at stream position `end` (from the run's first token) and
        `position` (its skip with its piece's own: none in a pass-through), `begun`
        documents of the run begun by then (`ConcatSequencer.docs_at`: the resumed cut document
        not among them, the one the batch ends in among them)."""
        return Passed(position, *self._counts(end, position.skip, begun))

    def _counts(self, end: int, skip: int, begun: int) -> tuple:
        """`(tokens, documents)` the mixer took before the document `skip` tokens before stream
        position `end`, `begun` documents of the run begun by then."""
        return end - skip + self.skip, begun - (1 if skip else 0) + (1 if self.skip else 0)

    def packed(self, at: Passed) -> tuple:
        """`(data, PACKED)`: the point of `at` as a slot carries it (mixtext.py `Packed` reads it):
        its values over the shared part marshalled once."""
        p = at.position
        return packed_passing(self._base, p.skip, p.epoch, p.file, p.rg, p.doc, at.tokens, at.documents)
