"""A rank's position at a batch count, from its document lengths alone (pure logic).

nanochat saves rank 0's loader state only and hands it to every rank. A state carries the
batch count `batch`, the batch shapes the run used (`shapes`: [first batch, B, T], ...) and
where the run began (`origin`), which are the same on every rank. Replaying them over this
rank's own document lengths, in canonical order from its origin, gives the position this
rank's own state would hold at that batch count, exactly:

- concat: batch k is stream tokens `[start_k, start_k + B_k*T_k + 1)`, so the position is
  the token `sum over shapes of batches * (B*T + 1)` of the stream: the first non-null
  document holding it, and how many of its tokens come before it (`ConcatSequencer.locate`'s
  rule).
- best fit: the planner itself (`BestFitPlanner`), fed the same chunks in the same order, plans
  `batch` batches (rebuilt from its buffer at every change of shape, as a resumed run does);
  the position is the end of the last chunk it took and the buffer its runs.

Cost: O(documents) for concat; best fit adds the planner's ~0.05 ms per batch. Each locator is
fed `(piece, lengths)` in piece order (`feed`) until `result` is set:
`((epoch, file, rg, doc, skip), runs)`. Used by the coordinator in count-only runs.
"""
from collections import deque

import numpy as np

from .bestfit import BestFitPlanner
from .bestfit_seq import plan_from, runs_of


def concat_tokens(shapes: list, batch: int) -> int:
    """Stream tokens before batch `batch` of a run with these [first batch, B, T] shapes."""
    total = 0
    for i, (first, B, T) in enumerate(shapes):
        end = shapes[i + 1][0] if i + 1 < len(shapes) else batch
        total += (min(end, batch) - first) * (B * T + 1)
    return total


class ConcatLocator:
    def __init__(self, shapes: list, batch: int, start):
        self.target, self.consumed = concat_tokens(shapes, batch), 0
        self.total = batch
        self.result = ((start.epoch, start.file, start.rg, start.doc, 0), []) if self.target == 0 else None

    @property
    def done_batches(self) -> int:
        """Progress, in batches of the current shape (approximate across shapes)."""
        per = max(self.target // max(self.total, 1), 1)
        return min(self.consumed // per, self.total)

    def feed(self, piece, lengths: np.ndarray):
        if self.result is not None:
            return
        cum = np.cumsum(lengths, dtype=np.int64)
        rel = self.target - self.consumed
        if len(cum) and rel < cum[-1]:
            row = int(np.searchsorted(cum, rel, side="right"))
            skip = rel - (int(cum[row - 1]) if row else 0)
            self.result = ((piece.epoch, piece.file, piece.rg, piece.doc_start + row, int(skip)), [])
        self.consumed += int(cum[-1]) if len(cum) else 0


class BestFitLocator:
    def __init__(self, shapes: list, batch: int, start, buffer_size: int, chunk_docs: int):
        self.shapes, self.batch, self.total = shapes, batch, batch
        self.buffer_size, self.chunk_docs = buffer_size, chunk_docs
        _, B, T = shapes[0]
        self.planner = BestFitPlanner(B, T + 1, buffer_size)
        self.done_batches = 0
        self._shape = 0
        self._chunks, self._queued = deque(), 0
        self._last_end = (start.epoch, start.file, start.rg, start.doc)
        self._bases, self._meta, self._next_base = [], [], 0
        self.result = None
        self._finish_if_done()

    def feed(self, piece, lengths: np.ndarray):
        if self.result is not None:
            return
        base, self._next_base = self._next_base, self._next_base + len(lengths)
        if np.count_nonzero(lengths):
            self._bases.append(base)
            self._meta.append((piece.epoch, piece.file, piece.rg, piece.doc_start - base))
        for lo in range(0, len(lengths), self.chunk_docs):
            part = lengths[lo:lo + self.chunk_docs]
            keep = np.flatnonzero(part)
            end = (piece.epoch, piece.file, piece.rg, piece.doc_start + lo + len(part))
            self._chunks.append((base + lo + keep, part[keep], end))
            self._queued += len(keep)
        self._plan()

    def _plan(self):
        while self.done_batches < self.batch:
            self._reshape()
            p = self.planner
            got = plan_from(p, self._chunks, safe=self._queued >= p.B * p.row_len + self.buffer_size)
            if got is None:
                return
            for ids, _, end in got[1]:
                self._queued -= len(ids)
                self._last_end = end
            self.done_batches += 1
        self._finish_if_done()

    def _reshape(self):
        """At the first batch of the next shape, rebuild the planner as a resumed run does."""
        nxt = self._shape + 1
        if nxt < len(self.shapes) and self.shapes[nxt][0] == self.done_batches:
            _, B, T = self.shapes[nxt]
            self.planner = BestFitPlanner.from_buffer(B, T + 1, self.buffer_size, *self.planner.buffered())
            self._shape = nxt

    def _finish_if_done(self):
        if self.done_batches == self.batch:
            ids = self.planner.buffered_ids()
            meta = np.array(self._meta, dtype=np.int64).reshape(-1, 4)
            runs = runs_of(ids, np.array(self._bases, dtype=np.int64), meta)
            self.result = ((*self._last_end, 0), runs.tolist())
