"""Concat's first batches made in one process: the stream the trainer's head start hands out
(procs/headstart.py) while a run's children start. Pure: pieces and their tokens come from
the caller.

Where the head start reads is its packing's mode's to say (packing/base.py `Begin`; packing/mixmode.py:
`SourceConcatMode.head_start`, one source's files from the run's start; `MixConcatMode.head_start`,
a mixture's one source whose mix passes its pieces whole, packing/mixone.py), so that nothing here
or in the trainer learns what the data is.

`Stream` runs the very parts a concat run runs in its coordinator and its workers: the
`ConcatSequencer` over each piece's row lengths, the worker's keep and `write` of the
segments it is ordered to copy (with positions, packing/positions.py), `position_at` for the
position after each batch and `ring.batch_check` of its window. Only the ring is its own: one
row per batch (tokens, then positions, as a ring slot's row), never reused, so a batch handed
to the caller keeps its row for as long as the caller holds it. Batch k made here is batch k
of a run from the same start, byte for byte, with the record the coordinator announces for it
(`Made`: the position after it, the documents begun by its end, the check, the row group of its
last token, and what its slot carries for a state: a pass-through's point, `Begin.point`), which
the trainer compares with the ring's own announcement when that comes.

`PieceSizes` says how many documents the next piece takes: about what the batch being made
still needs (`Stream.short`), so that the first batch reads and tokenizes little more than it
uses. Piece boundaries never change the stream, only how much is read ahead of it.
"""
import math
from collections import deque
from typing import NamedTuple

import numpy as np

from ..ipc.ring import batch_check
from ..position import Position, RowGroup
from .concat import ConcatSequencer, Place, _keep, position_at, row_group_of, write


class Made(NamedTuple):
    """Batch `batch` of the run, made in-process: its slot's row and what its announcement says."""
    batch: int
    row: np.ndarray     # the window's tokens, then (with positions) the inputs' positions
    position: Position  # the canonical position after it
    docs: int           # documents begun by its end, in the run
    check: int          # `batch_check` of its window
    read: RowGroup      # the row group of its last token
    buffer: object = None  # what its slot carries for a state (`Begin.point`'s), None: nothing


class Stream:
    """Concat batches `0, 1, ..., most - 1` of a run that starts `skip` tokens into its first
    document: `add` each piece in order, take what is `ready`; `point`: `Begin.point`."""

    def __init__(self, B: int, T: int, skip: int, most: int, positions: bool = False, point=None):
        self.B, self.T, self.most, self.point = B, T, most, point
        self.window = B * T + 1
        self.rows = np.empty((most, self.window + (B * T if positions else 0)), dtype=np.int64)
        self.slots = self.rows[:, :self.window]  # batch k is in row k: its "slot"
        self.positions = self.rows[:, self.window:] if positions else None
        self.seq = ConcatSequencer(self.window, most, skip)  # never freed: batches < most may be written
        self._pieces, self._held = {}, {}
        self._ready = deque()
        self.added = 0  # pieces added
        self.docs_added = self.tokens_added = 0  # their rows (nulls too) and tokens (BOS too)

    def add(self, piece, tokens: np.ndarray, lengths: np.ndarray):
        """The next piece of the order (`data.order.Piece`, indexed from 0, none skipped) with
        its tokens (`[BOS] + ids` per non-null row, end to end) and each row's length."""
        if piece.index != self.added or piece.skip:
            raise ValueError(f"piece {piece.index} (skip {piece.skip}) added as piece {self.added}: "
                             f"pieces come in order, from 0, whole")
        self.added += 1
        self.docs_added += len(lengths)
        self.tokens_added += int(lengths.sum())
        self._pieces[piece.index] = piece
        held = _keep(tokens, lengths, 0)
        if held is not None:
            self._held[piece.index] = held
        self.seq.counted(piece.index, lengths)
        for index, segments, done in self.seq.placements():
            order = Place(index, [(k, k, off, src, n) for k, off, src, n in segments], done)
            self.seq.written(write(self.slots, self._held, order, self.B, self.T, self.positions))
        for k, where in self.seq.ready():
            position, docs = position_at(self._pieces[where.piece], where), self.seq.docs_at.pop(k)
            self._ready.append(Made(k, self.rows[k], position, docs, batch_check(self.slots[k]),
                                    row_group_of(self._pieces[where.last]),
                                    None if self.point is None else self.point(position, (k + 1) * self.window, docs)))
        live = self.seq.oldest_live()
        for index in [i for i in self._pieces if i < live]:
            del self._pieces[index]

    @property
    def short(self) -> int:
        """Tokens still to be added before the next batch can be made (0: it is, or is about to be)."""
        return max(0, (self.seq.book.announced + 1) * self.window - self.seq.next_start)

    @property
    def exhausted(self) -> bool:
        """It has made every batch it may (`most`) and they were all taken: nothing more comes."""
        return self.seq.book.announced >= self.most and not self._ready

    def ready(self) -> "Made | None":
        """The next batch made, in order, or None until more pieces are added."""
        return self._ready.popleft() if self._ready else None


MARGIN = 1.25   # documents asked for over the estimate of those needed
GROWTH = 4      # a piece takes at most this many times the documents read before it


class PieceSizes:
    """Documents per piece for a `Stream`, as an iterator (data/order.py `cut_pieces` takes the
    next size when it cuts the next piece, after the last one was added): 1 to begin with,
    then the tokens the batch being made still needs (`short`) over the tokens per row read so
    far, times `MARGIN`, at most `GROWTH` times the rows read so far (a first document far
    longer than the rest must not make a piece of hundreds), and at least 1."""

    def __init__(self, stream: Stream):
        self.stream = stream

    def __iter__(self):
        return self

    def __next__(self) -> int:
        s = self.stream
        if s.docs_added == 0 or s.tokens_added == 0:
            return 1
        per_doc = s.tokens_added / s.docs_added
        return max(1, min(math.ceil(s.short * MARGIN / per_doc), GROWTH * s.docs_added))
