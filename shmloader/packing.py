"""Concat packing: where every token of every piece lands, from token counts alone.

The documents' tokens (`[BOS] + tokens`, one document after another in canonical order) form
one stream; batch k is the window of stream positions `[k*W, (k+1)*W)`, `W = B*T + 1`.
`ConcatSequencer` is pure bookkeeping over integers: it assigns each piece its stream offset
(piece i starts where piece i-1 ends, so the order of arrival cannot change the stream), cuts
each piece into per-batch segments once the batch may be written (at most `n_slots` batches
are written and not yet freed), tracks how many tokens of each batch are written, and maps a stream position back to
(piece, document, token) for the resume state. Positions below zero are the tokens a resumed
run skips: they are never placed. Work per piece is O(batches it spans); per batch O(1).
`SlotMap` says which ring slot holds which batch. See NOTE [ring protocol] in docs/design.md.
"""
import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Seq:
    index: int
    start: int
    cum_ends: np.ndarray  # end offset (relative to start) of each document row of the piece
    placed: int = field(default=0)  # stream position up to which segments were issued
    done_sent: bool = field(default=False)

    @property
    def end(self) -> int:
        return self.start + (int(self.cum_ends[-1]) if len(self.cum_ends) else 0)


class ConcatSequencer:
    """Bookkeeping for one run. Call `counted`, `freed`, `written`; read `placements`, `ready`."""

    def __init__(self, window: int, n_slots: int, skip: int = 0):
        self.window, self.n_slots = window, n_slots
        self.next_start = -skip   # stream position where the next sequenced piece begins
        self.next_index = 0       # next piece index to sequence
        self.n_freed = 0          # batches the trainer gave back, in any order
        self.announced = 0        # batches < announced were announced
        self._counts = {}         # counted, waiting for earlier pieces: index -> lengths
        self._seq = deque()       # sequenced pieces still needed for placement or positions
        self._filled = {}         # batch -> tokens written

    def counted(self, index: int, lengths: np.ndarray):
        """Piece `index` was tokenized: `lengths[i]` tokens for its i-th row (0 for a null)."""
        self._counts[index] = np.cumsum(lengths, dtype=np.int64)
        while self.next_index in self._counts:
            cum = self._counts.pop(self.next_index)
            s = _Seq(self.next_index, self.next_start, cum, placed=self.next_start)
            self._seq.append(s)
            self.next_start = s.end
            self.next_index += 1

    def freed(self, batch: int):
        """The trainer gave back batch `batch` (batches come back in any order)."""
        self.n_freed += 1

    def placements(self) -> list[tuple[int, list[tuple[int, int, int, int]], bool]]:
        """New write orders `(piece, [(batch, batch_offset, piece_offset, n), ...], done)`;
        `done` means the piece has no further tokens to place. Batches below
        `n_freed + n_slots` may be written: every freed batch is among them, so at most
        `n_slots` batches hold a slot at once."""
        limit = (self.n_freed + self.n_slots) * self.window
        orders = []
        for s in self._seq:
            if s.done_sent:
                continue
            end = s.end
            lo, hi = max(s.placed, 0), min(end, limit)
            if hi <= lo < end:
                break  # the slots this piece needs next are still in use
            segs = self._segments(s.start, lo, hi) if hi > lo else []
            s.placed = max(s.placed, hi)
            s.done_sent = s.placed >= end
            orders.append((s.index, segs, s.done_sent))
            if not s.done_sent:
                break
        return orders

    def _segments(self, start: int, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
        segs = []
        w = self.window
        while lo < hi:
            k = lo // w
            n = min(hi, (k + 1) * w) - lo
            segs.append((k, lo - k * w, lo - start, n))
            lo += n
        return segs

    def written(self, batches: list[tuple[int, int]]):
        """A worker finished writing `n` tokens of batch `k` for each `(k, n)`."""
        for k, n in batches:
            self._filled[k] = self._filled.get(k, 0) + n

    def ready(self) -> list[tuple[int, tuple[int, int, int]]]:
        """Batches now complete, in order, each with the position of the next token:
        `(batch, (piece, row, skip))`. A batch waits until the piece holding the token after it
        is sequenced, so that its position is the same in every run."""
        out = []
        while self._filled.get(self.announced, 0) == self.window:
            pos = (self.announced + 1) * self.window
            where = self.locate(pos)
            if where is None:
                break
            del self._filled[self.announced]
            out.append((self.announced, where))
            self.announced += 1
        self._prune()
        return out

    def locate(self, pos: int) -> tuple[int, int, int] | None:
        """(piece, row, skip): token `pos` is token `skip` of row `row` of that piece."""
        for s in self._seq:
            if s.start <= pos < s.end:
                rel = pos - s.start
                row = int(np.searchsorted(s.cum_ends, rel, side="right"))
                row_start = int(s.cum_ends[row - 1]) if row else 0
                return s.index, row, rel - row_start
        return None

    def oldest_live(self) -> int:
        """The smallest piece index the sequencer may still need."""
        return self._seq[0].index if self._seq else self.next_index

    def _prune(self):
        keep_from = self.announced * self.window
        while self._seq and self._seq[0].done_sent and self._seq[0].end <= keep_from:
            self._seq.popleft()


class SlotMap:
    """Which ring slot holds which batch (the coordinator's). A batch takes the lowest free
    slot when its first write order is issued and gives it back when the trainer frees it,
    in any order: the trainer lends CPU batches until the caller drops them. The sequencers
    keep at most `n_slots` batches between their first order and their free, so a slot is
    always free when one is asked for."""

    def __init__(self, n_slots: int):
        self._free = list(range(n_slots))
        self._of = {}

    def of(self, batch: int) -> int:
        """The slot batch `batch` holds (it must hold one)."""
        return self._of[batch]

    def slot(self, batch: int) -> int:
        """The slot of `batch`, the lowest free one if it holds none yet."""
        s = self._of.get(batch)
        if s is None:
            if not self._free:
                raise RuntimeError(f"batch {batch} needs a ring slot but all {len(self._of)} are held "
                                   f"(batches {sorted(self._of)})")
            s = self._of[batch] = heapq.heappop(self._free)
        return s

    def release(self, batch: int) -> int:
        s = self._of.pop(batch)
        heapq.heappush(self._free, s)
        return s
