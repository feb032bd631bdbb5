"""A mixture's stream: counted pieces of several sources, interleaved document by document by
the mixing rule (data/mixture.py), as *runs* a packing places; pure.

Each source has its own canonical order of pieces (its files, its row groups by rank, its
epochs), counted in any order (`counted(source, seq, piece, lengths)`, `seq` its place in
its source's order). Whenever the next document of every source taking part is counted, the
`Mixer` picks the next document's source; consecutive documents of one piece picked in a row
(in one counting stage) form a `Run`: rows `[row_lo, row_hi)` of one piece, whose tokens are
`[base, base + tokens)` of what the worker holding that piece keeps. A packing places runs
in the order they come, as it places a single source's pieces (one run a piece). Null rows
(0 tokens) are no documents: they ride in the run before them, and a piece of nulls only is
one empty run, so that every piece ends with a run that says it is its `last`.

The stream depends on the sources' document lengths only (the rule sees nothing else), so it
is the same for any number of workers and any order of arrival. Where it stands before any
document (`Run.point`: every source's next document and the mixer's state before the run's
first pick) is what a state keeps; `point_at(run, row, skip)` is that inside a run: a resumed
mix starts every source at its document and the mixer from its state, and the document the
next token is in comes first (with a new mixture too: it is not skipped).
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Mapping, NamedTuple

import numpy as np

from ..data.mixture import Mixer
from ..position import Position
from .base import InOrder


class MixPoint(NamedTuple):
    """A place in a mixed stream: the next token is `skip` tokens into the document that source
    `source` reads at `sources[source]`; every other source reads next at its `sources` entry;
    `mixer` is the mixer's state (`Mixer.state`) before that document was picked."""
    source: str
    skip: int
    sources: Mapping[str, Position]
    mixer: dict

    def to_json(self) -> dict:
        return {"source": self.source, "skip": self.skip, "mixer": self.mixer,
                "sources": {name: list(p[:4]) for name, p in sorted(self.sources.items())}}

    @classmethod
    def from_json(cls, value: Mapping) -> "MixPoint":
        try:
            sources = {str(n): Position(*map(int, p)) for n, p in value["sources"].items()}
            point = cls(str(value["source"]), int(value["skip"]), sources, dict(value["mixer"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"the mixture's place in the state is malformed ({type(e).__name__}: {e}): "
                             f"{value!r}") from None
        if point.source not in sources or point.skip < 0:
            raise ValueError(f"the mixture's place in the state names source {point.source!r} (skip {point.skip}), "
                             f"not among its sources {sorted(sources)}")
        return point


class Run(NamedTuple):
    """Rows `[row_lo, row_hi)` of piece `piece` of source `source`, picked in a row: tokens
    `[base, base + lengths.sum())` of the piece's; `last`: no document of the piece comes
    after it; `point`: where the mix stood before its first row."""
    source: str
    piece: object        # data.order.Piece
    row_lo: int
    row_hi: int
    base: int
    lengths: np.ndarray  # tokens of each of its rows (0: a null)
    last: bool
    point: MixPoint

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


class _Counted:
    """A counted piece at the head of its source: the rows not yet in a run."""

    def __init__(self, piece, lengths: np.ndarray):
        self.piece, self.lengths = piece, lengths
        self.row = 0                      # the next row that may hold a document
        self.covered = 0                  # the first row not in a run (nulls before `row`)
        self.base = 0                     # the token offset of `covered`
        self.ran = False                  # a run of it was made

    def skip_nulls(self):
        while self.row < len(self.lengths) and self.lengths[self.row] == 0:
            self.row += 1

    def position(self) -> Position:
        p = self.piece
        return Position(p.epoch, p.file, p.rg, p.doc_start + self.row)


class MixStream:
    """Runs of a mixture's documents, in stream order (the module docstring says how).

    `starts`: each source's first piece's position (the position a source reads next before
    its first piece is counted). `batch_of(tokens)`: the batch that the stream's token at
    `tokens` (from the run's start) lands in, for the schedule."""

    def __init__(self, mixer: Mixer, starts: Mapping[str, Position], batch_of: Callable[[int], int],
                 first: str | None = None):
        self.mixer, self.batch_of = mixer, batch_of
        self.names = tuple(mixer.mixture.names)
        self._arrived = {name: InOrder() for name in self.names}
        self._queue = {name: deque() for name in self.names}
        self._next = dict(starts)        # every source's next document, as known
        self._out = []                   # runs made, not yet handed out
        self._exhausted = set()          # sources whose order has no piece left (max_epochs)
        self.first = first               # the source whose document must come first (a resumed cut one)
        self.tokens = 0                  # tokens of the runs made
        self.notes: list = []            # what the loader says: stages begun, sources ended

    def counted(self, source: str, seq: int, piece, lengths: np.ndarray):
        """Piece `seq` of `source`'s order was counted: `lengths[i]` tokens for its row i."""
        for _, (p, n) in self._arrived[source].add(seq, (piece, np.asarray(lengths, dtype=np.int64))):
            self._queue[source].append(_Counted(p, n))

    def exhausted(self, source: str, pieces: int):
        """`source`'s order ends after its `pieces` first pieces: once they are read it ends, and
        its weight goes to the others."""
        self._exhausted.add((source, pieces))

    def waiting_for(self) -> list:
        """The sources taking part whose next document is not counted yet: the mix waits for them."""
        return [name for name in self._taking_part() if self._head(name) is None and not self._ended(name)]

    def _taking_part(self) -> list:
        """The sources the next pick is among (its batch's stage begun first)."""
        if self.first is not None:
            return [self.first]
        started = self.mixer.enter(self.batch_of(self.tokens))
        if started is not None:
            self.notes.append(f"mixture: stage from batch {started.first_batch}: "
                              + ", ".join(f"{n} {w:g}" for n, w in started.weights.items()))
        return list(self.mixer.shares())

    def _ended(self, source: str) -> bool:
        return any(name == source and self._arrived[name].next >= n and not self._queue[name]
                   for name, n in self._exhausted)

    def _head(self, source: str):
        """The counted piece holding `source`'s next document, or None. Pieces with no document
        left end here as they are passed (an empty run each, if none was made)."""
        queue = self._queue[source]
        while queue:
            head = queue[0]
            head.skip_nulls()
            if head.row < len(head.lengths):
                self._next[source] = head.position()
                return head
            queue.popleft()
            if not head.ran:
                self._out.append(self._run(source, head, len(head.lengths), self._point(source)))
        return None

    def _point(self, source: str, skip: int = 0) -> MixPoint:
        return MixPoint(source, skip, dict(self._next), self.mixer.state())

    def _run(self, source: str, head: _Counted, row_hi: int, point: MixPoint) -> Run:
        """The rows of `head` not in a run yet, to `row_hi` (the nulls after a run's documents are
        in it), as a run; `head` moves past them, and so does where `source` reads next."""
        lo = head.covered
        lengths = head.lengths[lo:row_hi]
        run = Run(source, head.piece, lo, row_hi, head.base, lengths, row_hi == len(head.lengths), point)
        head.row = head.covered = row_hi
        head.base, head.ran = head.base + int(lengths.sum()), True
        p = head.piece
        self._next[source] = Position(p.epoch, p.file, p.rg, p.doc_start + row_hi)
        return run

    def runs(self) -> list:
        """The runs that can be made now, in stream order."""
        while True:
            heads = {name: self._head(name) for name in self._taking_part()}
            ended = [name for name, head in heads.items() if head is None and self._ended(name)]
            if ended:
                for name in ended:
                    note = self.mixer.end(name)  # raises DataError when nothing is left
                    if note:
                        self.notes.append(note)
                if self.first in ended:
                    self.first = None
                continue
            if any(h is None for h in heads.values()):
                out, self._out = self._out, []
                return out
            if self.first is not None:
                source = self.first
                self.first = None
            else:
                source = self.mixer.choose(self.batch_of(self.tokens),
                                           lambda name: int(heads[name].lengths[heads[name].row])).source
            head = heads[source]
            point = self._point(source)
            row = head.row
            while True:  # this document, then the same source's next ones in the piece while it is picked again
                length = int(head.lengths[row])
                self.mixer.took(source, length, head.piece.epoch)
                self.tokens += length
                row += 1
                while row < len(head.lengths) and head.lengths[row] == 0:
                    row += 1
                if row >= len(head.lengths) or not self._again(source, int(head.lengths[row])):
                    break
            self._out.append(self._run(source, head, row, point))

    def _again(self, source: str, length: int) -> bool:
        """The mixer picks `source` again for its next document (of `length` tokens), in the
        same counting stage, knowing every other source's next document."""
        if self.mixer.mixture.stage_at(self.batch_of(self.tokens)) != self.mixer.stage:
            return False
        lengths = {source: length}
        for name in self.mixer.shares():
            if name != source:
                head = self._head_peek(name)
                if head is None:
                    return False
                lengths[name] = int(head.lengths[head.row])
        return self.mixer.choose(self.batch_of(self.tokens), lengths.__getitem__).source == source

    def _head_peek(self, source: str):
        """`_head` without passing pieces: the next document's piece if it is at the queue's head."""
        queue = self._queue[source]
        if not queue:
            return None
        head = queue[0]
        head.skip_nulls()
        return head if head.row < len(head.lengths) else None


def point_at(run: Run, row: int, skip: int) -> MixPoint:
    """Where the mix stands at token `skip` of row `row` of `run` (row_lo <= row < row_hi): the
    run's source reads that document, the mixer before it has taken the run's earlier rows."""
    before = run.lengths[:row - run.row_lo]
    mixer = dict(run.point.mixer)
    counted, totals = dict(mixer["counted"]), dict(mixer["totals"])
    tokens, docs, epoch = totals[run.source]
    counted[run.source] += int(before.sum())
    totals[run.source] = [tokens + int(before.sum()), docs + int(np.count_nonzero(before)), run.piece.epoch]
    mixer.update(counted=counted, totals=totals)
    p = run.piece
    sources = dict(run.point.sources)
    sources[run.source] = Position(p.epoch, p.file, p.rg, p.doc_start + row)
    return MixPoint(run.source, skip, sources, mixer)
