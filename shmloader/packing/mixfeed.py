"""Which source of a mixture a coordinator reads next: a mixture's pieces in hand-out order; pure.

Every source has its own canonical order of pieces (its range of the run's files, its row
groups by rank, its epochs, from its own position: `RunArgs.mixture`). A piece goes out from the
source the mix waits for first (`MixStream.waiting_for`: its next document is not counted and
none of its pieces is being read; the mode lets such a piece go even to a worker at its hold
budget, so the mix never waits on a budget that only the mix can free), else from the source
furthest behind in read-ahead (text bytes of its pieces not yet used up by the mix, over its
weight); never from a source that does not take part now (weight 0) or has read its
`max_epochs` (its order ends there: `MixStream.exhausted`). Pieces are numbered in the order
they go out, after `first_index` pieces the mode hands out before (best fit's resumed buffer).

A source whose whole epoch and most of the next held no document with text ends the mix
(`flow`): the mix would wait for it forever. That is judged over its pieces in its order
(`counted`), not in the order they are counted, so it is the same whatever the timing. A source whose order cannot be read on (a file's
footer that cannot be read, a rank with no row group in its files) goes out no more: the
piece that would have come next is one that cannot be read (`MixStream.unreadable`), and the
mix stops where it needs it, as where a worker cannot read a piece, the same batch whatever
the timing (`MixFeed.failed`; `held_by_mix` is `Mode.failed` of the modes that flow the mix
as counts come). Both mixture modes (packing/mixmode.py for concat, packing/mixbestfit.py for
best fit) and the count-only mode (packing/mixcount.py) hand pieces out through one `MixFeed`;
a run of one source through an `OrderFeed`, its run's order as it comes.
"""
from __future__ import annotations

import os
from typing import Callable, NamedTuple

import numpy as np

from ..errors import DataError
from ..ipc.protocol import Ended, Error, Warn
from ..position import Position
from .base import InOrder
from .mix import MixPoint, MixStream


def start_points(run) -> tuple:
    """`(point or None, every source's start)` of a mixture's run (`RunArgs`): the sources it
    reads in the run's numbering of the files, those it does not (a state's, left out) as the
    state has them; a source the point does not place begins at its start's `firsts` (a
    shuffled run: `runstart.MixStart`), else (1, 0, rank, 0)."""
    at = run.start.at  # a `MixStart`
    point = MixPoint.from_json(at.point) if at.point is not None else None
    starts = dict(point.sources) if point is not None else {}
    skips = (at.point or {}).get("skips", {})  # a change of world size's start: each source's cut document
    for r in run.mixture.ranges:
        p = starts.get(r.name) or (at.firsts or {}).get(r.name) or Position(1, 0, run.rank, 0)
        starts[r.name] = p._replace(file=p.file + r.lo, skip=int(skips.get(r.name, 0)))
    return point, starts


class Next(NamedTuple):
    """The source whose piece goes out next; `needed`: the mix waits for its next document and
    none of its pieces is being read."""
    source: str
    needed: bool


class Owned(NamedTuple):
    """A piece that went out: its source and its place in that source's order."""
    source: str
    seq: int


class MixFeed:
    """A mixture's pieces, in the order they go out (the module docstring says which)."""

    def __init__(self, run, stream: MixStream, starts: dict, pieces: Callable, ramp, cap: int,
                 reading: Callable[[], set], first_index: int = 0, stopping: Callable[[], None] = lambda: None):
        """`run`: the mixture's run (`RunArgs`); `pieces(ramp, cap, first_index, files=, start=)`:
        a source's canonical order (the coordinator's); `reading()`: the piece indices given to workers and not counted;
        `stopping()`: a source's order could not be read on, or has ended (`_peek`), for a mode
        to let the stream stop or end there now if it waits for that source."""
        self.stream, self._reading, self._stopping = stream, reading, stopping
        self._orders, self._seqs, self.owned = {}, {}, {}      # per source: its pieces; piece index -> Owned
        self._ahead = {}                                      # per source: text bytes (+1 a piece) not used up
        mix, at = run.mixture, run.start.at  # a `MixStart`
        self._max_epochs = mix.mixture.max_epochs
        self._judged, self._epoch0 = {}, {}                   # per source: its pieces counted, in its order, until
        #                                                       one holds a document (`counted`); its first epoch
        for r in mix.ranges:
            if r.name in mix.mixture.names:  # a source the state has and this mixture does not: not read
                local = starts[r.name]._replace(file=starts[r.name].file - r.lo)
                plan = (at.plans or {}).get(r.name)  # a run that began at a change of world size
                later = (at.laters or {}).get(r.name)  # files added among its own at the resume
                self._orders[r.name] = pieces(ramp, cap, 0, files=(r.lo, r.hi - r.lo), start=local, plan=plan,
                                              later=later)
                self._seqs[r.name], self._ahead[r.name] = 0, 0
                self._judged[r.name], self._epoch0[r.name] = InOrder(), local.epoch
        self._peeked, self._barren = {}, {}                   # per source: its next piece; why it has no document
        self._index = first_index
        self._now = (None, None)                              # `pick_now`'s: (its key, its pick)
        self.moves = 0                                        # pieces given out, counted, failed or used up

    def pick_now(self) -> "Next | None":
        """`pick`, made again only once the mix (`MixStream.version`) or the pieces out and counted
        (`moves`) have changed: a coordinator's turn asks for every worker, at every message."""
        key = (self.stream.version, self.moves)
        if self._now[0] != key:
            self._now = key, self.pick()
        return self._now[1]

    def pick(self) -> "Next | None":
        """The source whose next piece goes out next (that piece peeked), or None (also once the
        mix has ended or stopped: nothing it reads would be used)."""
        stream, orders = self.stream, self._orders
        while stream.finished is None and stream.stopped is None:
            waiting = [n for n in stream.waiting_for() if n in orders]
            name = None
            if waiting:  # (the pieces being read looked at only then: a pick at every count)
                reading = {self.owned[i].source for i in self._reading() if i in self.owned}
                name = next((n for n in waiting if n not in reading), None)
            needed = name is not None
            if name is None:
                shares, ahead = stream.mixer.shares(), self._ahead
                live = [(ahead[n] / w, n) for n, w in shares.items() if n in orders]
                name = min(live)[1] if live else None
            if name is None:
                return None
            if self._peek(name) is not None:
                return Next(name, needed)
            self.flow()  # its order has ended: the mix may go on, or end
        return None

    def _peek(self, name: str):
        """Source `name`'s next piece, or None once its order has ended (`max_epochs`), or cannot be
        read on (a file whose footer cannot be read: the piece that would come next cannot be read,
        and the mix stops where it needs it, as where a worker cannot read a piece)."""
        piece = self._peeked.get(name)
        if piece is None:
            try:
                piece = self._next_of(name)
            except DataError as e:
                self.stream.unreadable(name, self._seqs[name], Error.of(f"coordinator (pid {os.getpid()})", e))
                del self._orders[name]  # never picked again: the mix stops before it needs more of it
                self._stopping()
                return None
            if name in self._max_epochs and piece.epoch > self._max_epochs[name]:
                self.stream.exhausted(name, self._seqs[name])
                del self._orders[name]
                self._stopping()  # the mix may end here, and no count may come to flow it (a rank given
                return None       # none of the epoch at a change of world size, or all counted already)
            self._peeked[name] = piece
        return piece

    def _next_of(self, name: str):
        """The next piece of source `name`'s own order; its data's errors (a rank with no row group
        in the source's files, a bad file) name the source, whose files alone that order reads."""
        try:
            return next(self._orders[name])
        except DataError as e:
            raise type(e)(f"mixture source {name!r}: {e}") from None

    def feed(self):
        """The pieces, forever (the mode asks only when `pick` gave a source)."""
        while True:
            pick = self.pick_now()  # the mode's `can_take` made it: nothing changed since
            if pick is None:  # the mode's `can_take` said there was one
                raise RuntimeError("mixture: a piece was asked for while none may go out")
            name = pick.source
            self.moves += 1
            piece = self._peeked.pop(name)
            if piece.index != self._index:  # numbered as they go out (one source's are already)
                piece = piece.but(index=self._index)
            self.owned[self._index] = Owned(name, self._seqs[name])
            self._seqs[name] += 1
            self._ahead[name] += piece.text_bytes + 1
            self._index += 1
            yield piece

    def counted(self, index: int, piece, lengths):
        """Piece `index` (one of the mix's) was counted: to the stream. Its source is without
        documents once a piece of the epoch after its first whole one held none, and no piece
        before it in its order did: judged in that order (pieces are counted in any), so the
        same whatever the timing."""
        self.moves += 1
        name, seq = self.owned[index]
        judged = self._judged.get(name)
        if judged is not None:  # (until a piece in its order holds a document, or it is found without)
            for _, (epoch, docs) in judged.add(seq, (piece.epoch, bool(np.count_nonzero(lengths)))):
                if docs or epoch >= self._epoch0[name] + 2:
                    del self._judged[name]
                    if not docs:
                        self._barren[name] = (f"mixture source {name!r}: a whole epoch held no document with text "
                                              "(all null or no rows); the mix cannot go on without it (give it "
                                              "weight 0, or leave it out)")
                    break
        self.stream.counted(name, seq, piece, lengths)

    def failed(self, index: int, error) -> bool:
        """Piece `index` cannot be read (`error`): the mix stops when it needs it. False for a
        piece that is not the mix's (one its orders could not be read on to)."""
        owned = self.owned.get(index)
        if owned is None:
            return False
        self.moves += 1  # no longer being read
        self.stream.unreadable(owned.source, owned.seq, error)
        return True

    def used_up(self, source: str, piece):
        """The packing took the last run of `piece` (of `source`): it leaves the read-ahead."""
        self.moves += 1
        del self.owned[piece.index]
        if source in self._ahead:
            self._ahead[source] -= piece.text_bytes + 1

    def flow(self):
        """A mix that waits for a source without documents ends."""
        if self.stream.finished is None:
            barren = [n for n in self.stream.waiting_for() if n in self._barren]
            if barren:
                self.stream.finish(self._barren[barren[0]])


class OrderFeed:
    """The feed of one source's run (packing/mixmode.py `SourceConcatMode`, packing/mixcount.py
    `SourceCountMode`, packing/mixbestfit.py `SourceBestFitMode`, whose resumed buffer's pieces go
    out before it): its run's own order (`pieces`, numbered from 0, its elastic plan, its files
    added and its shuffle in it; a count's best-fit buffer re-read first), handed
    out as it comes, each counted piece to `stream` (a `mixone.Passing`) in that order. Nothing to
    weigh or to wait for: the hold budget holds (no pick is `needed`); a source without documents
    is the coordinator's to judge; an order that cannot be read on raises where the coordinator
    takes the next piece, and the mode holds its error as a piece's that cannot be read. Best
    fit's (`SourceBestFitMode`) hands out its order after the resumed buffer's pieces (the
    sequencer's own) and counts each into its `Passing` as concat's does; its pick is never asked
    (the read-ahead cap alone decides, `mixbestfit.CapAlone`)."""

    def __init__(self, pieces, stream):
        self.stream = stream
        self._pieces = pieces
        self._next = Next(stream.name, False)

    def pick(self) -> "Next | None":
        """The one source, until the stream stops (nothing after it would be used)."""
        return self._next if self.stream.stopped is None else None

    pick_now = pick  # (nothing to make again)

    def feed(self):
        """The order itself: its pieces are numbered as they go out."""
        return self._pieces

    def counted(self, index: int, piece, lengths):
        self.stream.counted(None, index, piece, lengths)

    def failed(self, index: int, error) -> bool:
        """Piece `index` (handed out or the next of an order that cannot be read on) cannot be
        read: the stream stops where it needs it."""
        self.stream.unreadable(None, index, error)
        return True

    def used_up(self, source, piece):
        pass

    def flow(self):
        pass


def held_by_mix(mode, index: int, error) -> bool:
    """`Mode.failed` of a mode that flows its mix as counts come (`MixConcatMode`, `MixCountMode`:
    `mode.feed`, `mode._flow`): piece `index` leaves its worker's load; one of the mix's is held by
    the stream (`MixFeed.failed`) and the mix flows now, since it may stop there before another
    count comes; False for one that is not the mix's (the coordinator raises it now)."""
    mode._forget(index)
    if not mode.feed.failed(index, error):
        return False
    mode._flow()
    return True


class Said:
    """What a mixture's mode tells the trainer: each note of the stream once (a stage begun is
    logged, a source ended warned of), and `Ended` once, when the mix has ended, or stopped at a
    piece that cannot be read (its error's text), and every batch before is announced (the
    trainer raises it once it took them). One source's stream (a `mixone.Passing`, concat's and
    best fit's) has no note and never ends: it says only a piece that cannot be read."""

    def __init__(self, stream: MixStream):
        self.stream, self._said, self._ended = stream, 0, False

    def messages(self, all_out: bool) -> list:
        """`all_out`: the mix ended (or stopped) and every batch it made is announced. (Asked at
        every turn of the coordinator: a list, nothing made while there is nothing to say.)"""
        notes = self.stream.notes
        if len(notes) == self._said and (self._ended or not all_out):
            return []
        out = [Warn(text, info=text.startswith("mixture: stage")) for text in notes[self._said:]]
        self._said = len(notes)
        if all_out and not self._ended:
            self._ended = True
            stopped = self.stream.stopped
            out.append(Ended(self.stream.finished if stopped is None else stopped.head))
        return out
