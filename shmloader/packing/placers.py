"""Concat's placers: what differs between pieces passing whole and a mix of several's runs in
concat's mode (packing/mixmode.py `MixConcatMode`), chosen once where the mode is made.

A placer holds the mode's sequencer and does what differs: a counted piece's spec kept or not
(`spec`), the flow of what the mix took into the sequencer (`flow`), the batches ready
(`ready`, their `Complete`) and the write orders (`orders`, bound as the mode's own). Pieces
passing whole (one source's, `WholePieces`: a `mixone.Passing` into a `ConcatSequencer`, a `Place`
a piece; a pass-through's, `PassThrough`: the same, and its mix may end, `OneStream.end_point`)
or a mix of several's runs (`Runs`: the `MixStream`'s stretches into a `MixSequencer`, a
`Copies` a worker a turn, its end `MixStream.end_point`). Only what can end has an end: one
source's order never ends (its end is the coordinator's), so `WholePieces` makes none.
"""
from __future__ import annotations

import numpy as np

from .base import Complete, Mode
from .concat import ConcatSequencer, Copies, Place, position_at, row_group_of
from .mix import MixStream
from .mixone import Passing
from .mixplace import MixSequencer


class WholePieces:
    """The placer of pieces passing whole (`MixConcatMode._begin`; one source's, `SourceConcatMode`):
    each counted piece, as its `one` (a `mixone.Passing`) hands it on in order, into a
    `ConcatSequencer` by token offset (`flow`), a `Place` order a piece (`orders`); a counted
    piece's spec is kept (`spec`) until no batch needs it, since a batch's position and row group
    are read from its pieces' specs (`ready`). One source's order never ends (its end is the
    coordinator's): no batch here is the end of a mix (`PassThrough`'s is)."""

    def __init__(self, seq: ConcatSequencer, one: Passing, mode: Mode):
        self.seq, self.one = seq, one
        self._specs, self._owner, self._written_out = mode.specs, mode.owner, mode._written_out
        self.spec = mode.specs.__getitem__  # a counted piece's spec, kept (`ready` drops it)

    def flow(self, feed):
        """The pieces `one` passed (in order, none after its end) into the sequencer."""
        seq, name = self.seq, self.one.name
        for piece, lengths in self.one.passed():
            seq.passed(piece.index, lengths)
            feed.used_up(name, piece)

    def ready(self) -> list:
        """`Complete` of every batch ready now; the specs no piece needs any more dropped."""
        seq = self.seq
        out = [self._complete(k, where) for k, where in seq.ready()]
        if out:
            specs = self._specs
            keep = min(min(self._owner, default=seq.next_index), seq.oldest_live())
            for index in [i for i in specs if i < keep]:
                del specs[index]
        return out

    def _complete(self, k: int, where) -> Complete:
        """Batch k, which ends at `where`: its position, the documents begun by its end and the
        row group its last token was read from (its point, where the sink makes one, is made from
        them: `Points`)."""
        specs = self._specs
        return Complete(k, position_at(specs[where.piece], where), None, self.seq.docs_at.pop(k),
                        row_group_of(specs[where.last]))

    def orders(self, take_slot):
        """A `Place` a piece: every piece's segments placed now, to its worker."""
        owner = self._owner
        for index, segments, done in self.seq.placements():
            w = owner[index]
            if done:
                self._written_out(w, index)
                del owner[index]
            segments = [(k, take_slot(k), off, src, n) for k, off, src, n in segments]
            yield w, Place(index, segments, done)


class PassThrough(WholePieces):
    """The placer of a pass-through's mix (`one` a `mixone.OneStream`): one source's
    (`WholePieces`), and its mix may end (a source without documents, packing/mixfeed.py): then
    its sequencer ends there, and its last batch's point is where the mix ended
    (`OneStream.end_point`)."""

    def flow(self, feed):
        WholePieces.flow(self, feed)
        if self.one.finished is not None:
            self.seq.finished = True

    def _complete(self, k: int, where) -> Complete:
        if where.piece < 0:  # the end of a mix that ended
            one, seq = self.one, self.seq
            docs = seq.docs_at.pop(k)
            point = one.end_point((k + 1) * seq.window, docs)
            return Complete(k, point.sources[one.name], point, docs)
        return WholePieces._complete(self, k, where)


class Runs:
    """The placer of a mix of several (`MixConcatMode`): the `MixStream`'s stretches of runs into a
    `MixSequencer`, in the order they come (`flow`), each worker's segments of a turn as one
    `Copies` order (`orders`); a batch's point is carried in its `Complete` (`runs`), so a counted
    piece's spec is not kept (`spec`); the mix may end (the stream's `finished`), its last batch
    there (`MixStream.end_point`)."""

    def __init__(self, seq: MixSequencer, stream: MixStream, mode: Mode):
        self.seq, self.stream = seq, stream
        self._owner, self._written_out = mode.owner, mode._written_out
        self.spec = mode.specs.pop  # a counted piece's spec, dropped: its runs carry what is needed

    def flow(self, feed):
        """The stream's stretches of runs made now, into the sequencer; the pieces whose last run
        they place told to the feed."""
        seq = self.seq
        for stretch in self.stream.stretches():
            seq.add(stretch)
            for source, piece in stretch.used_up():
                feed.used_up(source, piece)
        if self.stream.finished is not None:
            seq.finished = True

    def ready(self) -> list:
        """`Complete` of every batch ready now, its point the runs' (or the stream's end)."""
        seq, out = self.seq, []
        for k, where in seq.ready():
            if where.piece < 0:  # the end of a mix that ended
                point = self.stream.end_point()
                out.append(Complete(k, point.sources[self.stream.names[0]], point, seq.docs_at.pop(k)))
                continue
            position = position_at(where.run.piece, where)  # (mixplace.End: the row is the piece's)
            out.append(Complete(k, position, where.run.point(position.skip), seq.docs_at.pop(k),
                                row_group_of(where.last) if where.last is not None else None))
        return out

    def orders(self, take_slot):
        """The runs' segments placed now, a `Copies` a worker."""
        placed = self.seq.placements()
        if not placed:
            return
        segments = np.concatenate([seg for seg, _ in placed]) if len(placed) > 1 else placed[0][0]
        owner = self._owner
        if len(segments):
            # by whole arrays (a turn places some hundred segments of a few pieces and batches): each
            # piece's worker looked up once, and each batch's slot, taken in stream order (a
            # batch's first segment takes it), repeated over its segments
            pieces, batches = segments[:, 0], segments[:, 1]
            keys = sorted(set(pieces.tolist()))
            owners = [owner[i] for i in keys]
            workers = None  # one worker's pieces (a mixture of one's turn, mostly): it is sent every segment
            if len(set(owners)) > 1:
                workers = np.array(owners, dtype=np.int64)[np.searchsorted(keys, pieces)]
            first, last = int(batches[0]), int(batches[-1])
            if first == last:  # the usual turn: one batch's segments
                segments[:, 2] = take_slot(first)
            else:
                opens = np.flatnonzero(np.concatenate(([True], batches[1:] != batches[:-1])))
                slots = [take_slot(k) for k in batches[opens].tolist()]
                segments[:, 2] = np.repeat(slots, np.diff(np.append(opens, len(batches))))
            sending = set(owners)
        else:
            workers, sending = np.zeros(0, dtype=np.int64), set()
        finished = {}
        for _, indices in placed:
            for index in indices:
                finished.setdefault(owner[index], []).append(index)
        for w in sorted(sending | set(finished)):
            done = finished.get(w, [])
            for index in done:
                self._written_out(w, index)
                del owner[index]
            if workers is None:  # one worker's segments: all of them or none
                mine = segments if w in sending else segments[:0]
            else:
                mine = segments[workers == w]
            yield w, Copies(mine, tuple(done))
