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
is the same for any number of workers and any order of arrival. A piece that cannot be read
(`unreadable`) stops it where the rule needs that piece's next document (`stopped`: its
error), whichever source's turn it then is, so that too depends on the lengths only. Where it
stands before any document (`Run.at`: every source's next document and the mixer's state
before the run's first pick) is what a state keeps; `point_at(run, row, skip)` is that inside
a run: a resumed mix starts every source at its document and the mixer from its state, and
the document the next token is in comes first (with a new mixture too: it is not skipped).
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
        """Plain JSON; `"skips"`: the sources whose next document is one an old rank had cut at a
        change of world size, with the tokens of it read before (only while there are some)."""
        out = {"source": self.source, "skip": self.skip, "mixer": self.mixer,
               "sources": {name: list(p[:4]) for name, p in sorted(self.sources.items())}}
        skips = {name: p.skip for name, p in sorted(self.sources.items()) if p.skip}
        if skips:
            out["skips"] = skips
        return out

    @classmethod
    def from_json(cls, value: Mapping) -> "MixPoint":
        try:
            skips = value.get("skips", {})
            sources = {str(n): Position(*map(int, p), int(skips.get(n, 0))) for n, p in value["sources"].items()}
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
    after it; `at`: where the mix stood before its first row (`point_at` makes a `MixPoint`)."""
    source: str
    piece: object        # data.order.Piece
    row_lo: int
    row_hi: int
    base: int
    lengths: list        # tokens of each of its rows (0: a null)
    last: bool
    at: tuple            # `(sources, snapshot)`: every source's next document as a `Position` or
    #                      as `(piece, row)` of its head, and the mixer's `snapshot` (`point_at`)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


class _Counted:
    """A counted piece at the head of its source: the rows not yet in a run."""

    def __init__(self, piece, lengths: np.ndarray):
        self.piece, self.lengths = piece, lengths
        self.sizes = lengths.tolist()     # the same as Python ints (read once a document)
        self.row = 0                      # the next row that may hold a document
        self.covered = 0                  # the first row not in a run (nulls before `row`)
        self.base = 0                     # the token offset of `covered`
        self.ran = False                  # a run of it was made

    def skip_nulls(self):
        sizes, row = self.sizes, self.row
        while row < len(sizes) and not sizes[row]:
            row += 1
        self.row = row


class MixStream:
    """Runs of a mixture's documents, in stream order (the module docstring says how).

    `starts`: each source's first piece's position (the position a source reads next before
    its first piece is counted). `batch_of(tokens)`: the batch that the stream's token at
    `tokens` (from the run's start) lands in, for the schedule."""

    def __init__(self, mixer: Mixer, starts: Mapping[str, Position], batch_of: Callable[[int], int],
                 first: str | None = None, cap: int | None = None):
        """`cap`: the mixer counts a document's tokens up to it (best fit: a row)."""
        self.mixer, self.batch_of = mixer, batch_of
        self.cap = cap
        self.names = tuple(mixer.mixture.names)
        self._arrived = {name: InOrder() for name in self.names}
        self._queue = {name: deque() for name in self.names}
        self._next = dict(starts)        # every source's next document, when its queue is empty
        self._out = []                   # runs made, not yet handed out
        self._open = None                # the run being made: (source, head, point)
        self._exhausted = set()          # sources whose order has no piece left (max_epochs)
        self.first = first               # the source whose document must come first (a resumed cut one)
        self.tokens = 0                  # tokens of the runs made
        self.notes: list = []            # what the loader says: stages begun, sources ended
        self.finished = None             # why the mix has ended (nothing left to read), once it has
        self.stopped = None              # the error of a piece it needs and cannot read, once it does
        self._unreadable = {}            # source -> (seq, error) of the first of its pieces that cannot be read
        self._room = None                # documents `runs` may still take (None: no limit)

    def counted(self, source: str, seq: int, piece, lengths: np.ndarray):
        """Piece `seq` of `source`'s order was counted: `lengths[i]` tokens for its row i."""
        for _, (p, n) in self._arrived[source].add(seq, (piece, np.asarray(lengths, dtype=np.int64))):
            self._queue[source].append(_Counted(p, n))

    def exhausted(self, source: str, pieces: int):
        """`source`'s order ends after its `pieces` first pieces: once they are read it ends, and
        its weight goes to the others."""
        self._exhausted.add((source, pieces))

    def unreadable(self, source: str, seq: int, error):
        """Piece `seq` of `source`'s order cannot be read (`error`): the mix stops when it needs it."""
        known = self._unreadable.get(source)
        if known is None or seq < known[0]:
            self._unreadable[source] = (seq, error)

    def waiting_for(self) -> list:
        """The sources taking part whose next document is not counted yet: the mix waits for them."""
        if self.finished is not None or self.stopped is not None:
            return []
        return [name for name in self._taking_part() if self._head(name) is None and not self._ended(name)]

    def finish(self, why: str):
        """The mix ends here (`why`): no document is taken after the ones taken so far."""
        if self.finished is None and self.stopped is None:
            self.finished = why
            self._close()

    def _taking_part(self) -> list:
        """The sources the next pick is among (its batch's stage begun first); none once the mix
        has ended (`_goes_on`)."""
        if self.first is not None:
            return [self.first]
        if len(self.mixer.mixture.stages) > 1:
            self.enter(self.batch_of(self.tokens))
        return list(self.mixer.shares()) if self._goes_on() else []

    def _goes_on(self) -> bool:
        """Whether the mix can take another document: a mixer with no source left to read
        (`Mixer.over`: every source with a weight has ended, also in a state saved after that)
        ends the mix here, after what was taken."""
        if self.finished is None:
            why = self.mixer.over()
            if why is not None:
                self.finish(why)
        return self.finished is None

    def enter(self, batch: int):
        """The schedule's stage at `batch` begins, if it has not (said once); a stage whose every
        source has ended ends the mix here."""
        started = self.mixer.enter(batch)
        if self._goes_on() and started is not None:
            self._close()
            self.notes.append(f"mixture: stage from batch {started.first_batch}: "
                              + ", ".join(f"{n} {w:g}" for n, w in started.weights.items()))

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
            if head.row < len(head.sizes):
                return head
            queue.popleft()
            if self._open is not None and self._open[1] is head:
                self._close()
            elif not head.ran:
                self._out.append(self._run(source, head, len(head.sizes), self._at()))
            p = head.piece
            self._next[source] = Position(p.epoch, p.file, p.rg, p.doc_end)
        return None

    def _at(self) -> tuple:
        """Where the mix stands now."""
        sources = dict(self._next)
        for name, queue in self._queue.items():
            if queue:
                sources[name] = (queue[0].piece, queue[0].row)
        return sources, self.mixer.snapshot()

    def _run(self, source: str, head: _Counted, row_hi: int, at: tuple) -> Run:
        """The rows of `head` not in a run yet, to `row_hi` (the nulls after a run's documents are
        in it), as a run; `head` moves past them."""
        lo = head.covered
        lengths = head.sizes[lo:row_hi]
        run = Run(source, head.piece, lo, row_hi, head.base, lengths, row_hi == len(head.sizes), at)
        head.row = head.covered = row_hi
        head.base, head.ran = head.base + sum(lengths), True
        return run

    def _close(self):
        """The run being made is done: its rows up to its head's next document."""
        if self._open is not None:
            source, head, at = self._open
            self._open = None
            self._out.append(self._run(source, head, head.row, at))

    def runs(self, limit: int | None = None) -> list:
        """The runs that can be made now, in stream order; with `limit`, of at most that many
        documents (best fit takes the mix a chunk at a time: packing/mixbestfit.py)."""
        mixer = self.mixer
        self._room = limit
        while self.finished is None and self.stopped is None and self._room != 0:
            names = self._taking_part()
            if self.finished is not None:
                break
            heads = {name: self._head(name) for name in names}
            ended = [name for name, head in heads.items() if head is None and self._ended(name)]
            if ended:  # their weights go to the rest; with no rest the next `_taking_part` ends the mix
                for name in ended:
                    note = mixer.end(name)
                    if note:
                        self.notes.append(note)
                if self.first in ended:
                    self.first = None
                continue
            if None in heads.values():
                self._stop_if_unreadable(heads)
                self._close()
                out, self._out = self._out, []
                return out
            if self.first is not None:  # a resumed run's cut document, without a pick
                source, self.first = self.first, None
                self._take(source, heads[source])
                continue
            self._pick_while_known(heads)
        if self._room == 0:  # the limit is reached: the run being made ends here
            self._close()
        out, self._out = self._out, []
        return out

    def _stop_if_unreadable(self, heads: dict):
        """The rule needs every source's next document: the mix stops if one of them is in a
        piece that cannot be read (every piece of that source before it is used up)."""
        for name, head in heads.items():
            seq, error = self._unreadable.get(name, (None, None))
            if head is None and seq == self._arrived[name].next:
                self.stopped = error
                return

    def end_point(self) -> MixPoint:
        """Where an ended mix stands: after its last document."""
        at_sources, snapshot = self._at()
        sources = {name: _place(*w) if type(w) is tuple else w for name, w in at_sources.items()}
        return MixPoint(self.names[0], 0, sources, Mixer.state_of_snapshot(snapshot))

    def _pick_while_known(self, heads: dict):
        """The rule (`Mixer.pick`, once a document) while every source's head stays where it is
        and the stage does not change."""
        mixer = self.mixer
        staged = len(mixer.mixture.stages) > 1
        n = sum(mixer.counted.values())
        cap = self.cap
        if cap is None:
            length_of = lambda name: heads[name].sizes[heads[name].row]  # noqa: E731
        else:
            length_of = lambda name: min(heads[name].sizes[heads[name].row], cap)  # noqa: E731
        while True:
            if staged and mixer.mixture.stage_at(self.batch_of(self.tokens)) != mixer.stage:
                return
            best = mixer.pick(n, length_of)
            n += length_of(best)
            picked = heads[best]
            if self._take(best, picked) or self._room == 0:
                return

    def _take(self, source: str, head: _Counted) -> bool:
        """The mix takes `source`'s next document (`head`'s); whether the head is used up."""
        if self._open is None or self._open[1] is not head:
            self._close()
            self._open = (source, head, self._at())
        length = head.sizes[head.row]
        self.mixer.took(source, length if self.cap is None else min(length, self.cap), head.piece.epoch)
        self.tokens += length
        if self._room is not None:
            self._room -= 1
        head.row += 1
        head.skip_nulls()
        if head.row >= len(head.sizes):  # the piece's last document: its run ends with it
            self._close()
            return True
        return False


def point_at(run: Run, row: int, skip: int) -> MixPoint:
    """Where the mix stands at token `skip` of row `row` of `run` (row_lo <= row < row_hi): the
    run's source reads that document, the mixer before it has taken the run's earlier rows."""
    before = run.lengths[:row - run.row_lo]
    at_sources, snapshot = run.at
    mixer = Mixer.state_of_snapshot(snapshot)
    counted, totals = mixer["counted"], mixer["totals"]
    tokens, docs, _ = totals[run.source]
    counted[run.source] += sum(before)
    totals[run.source] = [tokens + sum(before), docs + len(before) - before.count(0), run.piece.epoch]
    sources = {name: _place(*where) if type(where) is tuple else where for name, where in at_sources.items()}
    p = run.piece
    sources[run.source] = Position(p.epoch, p.file, p.rg, p.doc_start + row)
    return MixPoint(run.source, skip, sources, mixer)


def _place(piece, row: int) -> Position:
    """Row `row` of `piece` as a source's next document; its first row keeps the piece's skip (a
    document an old rank had cut at a change of world size, not begun here yet)."""
    return Position(piece.epoch, piece.file, piece.rg, piece.doc_start + row, piece.skip if row == 0 else 0)
