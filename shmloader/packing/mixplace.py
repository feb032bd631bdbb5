"""Concat placing a mixture's runs a `Stretch` at a time, by arrays; pure.

`MixSequencer` is `ConcatSequencer` (packing/concat.py) with a mixture's stretches of runs in
place of pieces (packing/mix.py makes them, packing/mixruns.py says what they hold): a stretch
is sequenced like a piece, from where the stream stands; its tokens are placed by whole-array
calls, cut at its runs' ends (a run's tokens lie end to end in its piece's) and at the
batches' ends, one `Copies` row a segment (packing/mixmode.py sends them); a piece's tokens go
once its last run is placed. A block's stretch is placed from its documents (`Block`: each
one's length and row), its runs the picks of one source in a row: no `Run` is made, and a
batch's end names the document it falls in, where the mix stood there made from the block
(`mixruns.point_of`, from where it stood at the block's start, made once a span:
`_Span.block_start`); a block of one run (its picks all one source's: a mixture of one) is one
run from its first document's row, its documents end to end, its segments cut at the batches'
ends as a piece of one source is (`concat.batch_segments`). Only a stretch of one run, or one
that goes on with a run begun before its block (a resumed cut document), is placed from its run
arrays (`Stretch.arrays`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from .concat import ConcatSequencer, Where, batch_segments
from .mixruns import offsets, point_at, point_of, start_of


class End(NamedTuple):
    """Where a batch ends in a mixture's stream (`Where.run`): the piece the next token is in
    (`Where.row` is its row there) and `point(skip)`, the `MixPoint` there."""
    piece: object
    point: Callable


class _Span:
    """A `Stretch` sequenced from stream position `start`: each run's start and end in the
    stream, its piece's index and where its tokens begin in the piece's (`src`), whether it
    is its piece's last (`last`); with `doc_ends` (a block's stretch) each document's end."""

    __slots__ = ("stretch", "start", "starts", "ends", "end", "pieces", "src", "last", "doc_ends", "docs",
                 "placed", "done_runs", "done_sent", "docs_before", "segments", "segment_at", "_block_start")

    def __init__(self, stretch, start: int, docs_before: int):
        self.stretch, self.start, self.docs_before = stretch, start, docs_before
        rows, block = stretch.rows, stretch.block
        index = np.array([r.piece.index for r in rows], dtype=np.int64)
        if block is not None and stretch.first is None and block.counts.count(0) == len(block.counts) - 1:
            # a block of one run (its picks all one source's: a mixture of one, or a source that
            # ended or weighs nothing beside it): its documents end to end in its piece
            self.doc_ends = start + np.cumsum(block.doc_lengths)
            i = int(block.picks[0])
            self.ends, self.starts = self.doc_ends[-1:], np.array([start])
            which, self.src = block.picks[:1], rows[i].before[block.doc_rows[:1]]
            self.last = np.array([bool(stretch.used_up())])
            self.docs = len(block.picks)
        elif block is not None and stretch.first is None:
            picks = block.picks
            self.doc_ends = start + np.cumsum(block.doc_lengths)
            opened = np.flatnonzero(np.concatenate(([True], picks[1:] != picks[:-1])))  # each run's first pick
            self.ends = self.doc_ends[np.append(opened[1:], len(picks)) - 1]
            self.starts = np.concatenate(([start], self.ends[:-1]))   # a block's runs hold a token or more
            which = picks[opened]
            at = offsets(len(r.before) for r in rows)[which]
            self.src = np.concatenate([r.before for r in rows])[at + block.doc_rows[opened]]
            self.last = np.zeros(len(opened), dtype=bool)
            for _, piece in stretch.used_up():  # its last run holds its source's last pick
                i = next(i for i, r in enumerate(rows) if r.piece is piece)
                self.last[opened.searchsorted(block.last(i), side="right") - 1] = True
            self.docs = len(picks)
        else:
            a = stretch.arrays
            self.ends = start + np.cumsum(a.tokens)
            self.starts = self.ends - a.tokens
            which, self.src, self.last, self.doc_ends = a.which, a.base, a.last, None
            self.docs = int(a.docs.sum())
        self.pieces = index[which]
        self.end = int(self.ends[-1])
        self.placed = start       # stream position up to which segments were issued
        self.done_runs = 0        # its runs before this are placed whole (their pieces' done sent)
        self.done_sent = False
        self.segments = self.segment_at = None  # all its segments, cut at its first placement
        self._block_start = None  # where the mix stood at its block's start (`mixruns.start_of`), once asked

    def end_at(self, pos: int):
        """`(row, skip, documents before, End)` of stream position `pos` (start <= pos < end)."""
        st = self.stretch
        if self.doc_ends is not None:
            block = st.block
            j = int(self.doc_ends.searchsorted(pos, side="right"))   # the document holding token pos
            rows, row = st.rows[block.picks[j]], int(block.doc_rows[j])
            skip = pos - int(self.doc_ends[j] - block.doc_lengths[j])
            return row, skip, j, End(rows.piece, lambda skip: point_of(block, j, skip, self.block_start()))
        a = st.arrays
        i = int(self.ends.searchsorted(pos, side="right"))     # the run holding token pos
        rows, lo = st.rows[a.which[i]], int(a.row_lo[i])
        at = int(a.base[i]) + pos - int(self.starts[i])        # in the piece
        row = int(rows.before.searchsorted(at, side="right")) - 1
        run = st.run(i)
        docs = int(a.docs[:i].sum()) + int(rows.docs_before[row] - rows.docs_before[lo])
        return row, at - int(rows.before[row]), docs, End(rows.piece, lambda skip: point_at(run, row, skip))

    def block_start(self):
        """`mixruns.start_of` its block, made once: each batch ending in it makes a point from it."""
        if self._block_start is None:
            self._block_start = start_of(self.stretch.block)
        return self._block_start

    def piece_at(self, pos: int):
        """The piece stream position `pos` (start <= pos < end) is in."""
        st = self.stretch
        if self.doc_ends is not None:
            return st.rows[st.block.picks[int(self.doc_ends.searchsorted(pos, side="right"))]].piece
        return st.rows[st.arrays.which[int(self.ends.searchsorted(pos, side="right"))]].piece


class MixSequencer(ConcatSequencer):
    """`ConcatSequencer` placing a mixture's stretches of runs (the module docstring says how)."""

    def add(self, stretch):
        """Sequence a stretch of runs next."""
        span = _Span(stretch, self.next_start, self._docs)
        self._docs += span.docs
        self._seq.append(span)
        self.next_start = span.end

    def placements(self) -> list:
        """New write orders `(segments, done)`: segments `(piece, batch, 0, batch_offset,
        piece_offset, n)` a row (the slot is the mode's to fill in) and the pieces with no
        further tokens to place. Batches below `book.limit` may be written."""
        limit = self.book.limit * self.window
        out = []
        for s in self._seq:
            if s.done_sent:
                continue
            end = s.end
            lo, hi = max(s.placed, 0), min(end, limit)
            if hi <= lo < end:
                break  # the slots this stretch needs next are still in use
            segments = self._segments(s, lo, hi)
            s.placed = max(s.placed, hi)
            s.done_sent = s.placed >= end
            done_runs = int(s.ends.searchsorted(s.placed, side="right"))
            done = s.pieces[s.done_runs:done_runs][s.last[s.done_runs:done_runs]].tolist()
            s.done_runs = done_runs
            if len(segments) or done:
                out.append((segments, done))
            if not s.done_sent:
                break
        return out

    def _segments(self, s: _Span, lo: int, hi: int) -> np.ndarray:
        """The segments of stream positions `[lo, hi)` of span `s` (`lo`, `hi`: its start or end,
        or batches' ends), from all of its segments, cut once (a turn places a batch: cutting a
        block's few batches at once costs what cutting one did)."""
        if s.segments is None:
            first = max(s.start, 0)
            s.segments = self._cut(s, first, s.end) if s.end > first else np.zeros((0, 6), dtype=np.int64)
            s.segment_at = s.segments[:, 1] * self.window + s.segments[:, 3]  # each one's stream position
        if hi <= lo:
            return s.segments[:0]
        i, j = s.segment_at.searchsorted((lo, hi)).tolist()
        out = s.segments[i:j]
        if j > i:
            last, w = int(out[-1, 1]), self.window
            while self._opened <= last:  # segments go out in stream order: each batch's first one
                self.book.expect(self._opened, w)
                self._opened += 1
        return out

    def _cut(self, s: _Span, lo: int, hi: int) -> np.ndarray:
        """The segments of stream positions `[lo, hi)` of span `s`: one a run and a batch (a span
        of one run, a mixture of one's, as a piece of one source is cut: its few segments in
        Python, not a score of array calls)."""
        w = self.window
        if len(s.ends) == 1:
            piece, src = int(s.pieces[0]), int(s.src[0]) - int(s.starts[0])
            return np.array([(piece, k, 0, off, src + at, n) for k, off, at, n in batch_segments(0, lo, hi, w)],
                            dtype=np.int64).reshape(-1, 6)
        first, stop = s.ends.searchsorted(lo, side="right"), s.starts.searchsorted(hi, side="left")
        cuts = np.concatenate(([lo, hi], s.starts[first + 1:stop], np.arange(lo // w + 1, (hi - 1) // w + 1) * w))
        cuts.sort()
        cuts = cuts[np.concatenate(([True], cuts[1:] != cuts[:-1]))]  # an empty run's start is the next one's
        at, n = cuts[:-1], cuts[1:] - cuts[:-1]
        run = s.ends.searchsorted(at, side="right")            # the run holding each segment's first token
        k = at // w
        out = np.empty((len(at), 6), dtype=np.int64)  # (filled a column at a time: column_stack and
        out[:, 0] = s.pieces[run]                      # zeros_like cost more than the rest on tiny arrays)
        out[:, 1] = k
        out[:, 2] = 0
        out[:, 3] = at - k * w
        out[:, 4] = s.src[run] + at - s.starts[run]
        out[:, 5] = n
        return out

    def _position_after(self, k: int):
        """Where batch k ends (`Where`, its `run` an `End`; its `last`, the piece its last token
        is in, itself: the batch's reading ends in its row group), noting how many documents of
        the run began by then (`docs_at`)."""
        pos = (k + 1) * self.window
        for s in self._seq:
            if s.start <= pos < s.end:
                break
        else:
            if self.finished and pos == self.next_start:  # the last batch of a stream that ended
                self.docs_at[k] = self._docs
                return Where(-1, 0, 0)
            return None
        row, skip, docs, end = s.end_at(pos)
        self.docs_at[k] = s.docs_before + docs + (1 if skip else 0)
        return Where(end.piece.index, row, skip, end, end.piece if skip else self._piece_at(pos - 1))

    def _piece_at(self, pos: int):
        """The piece stream position `pos` is in (its stretch is kept: it ends after the last
        batch announced), or None."""
        return next((s.piece_at(pos) for s in self._seq if s.start <= pos < s.end), None)
