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
`((epoch, file, rg, doc, skip), runs)`. `CountMode` runs them in the coordinator
(`sequencing.Mode`) for a count-only run.
"""
import time

import numpy as np

from .bestfit import BestFitPlanner
from .bestfit_seq import Chunks, PieceTable
from .plan import ramp_for
from .protocol import Located, Progress
from .sequencing import Mode

PROGRESS_S = 1.0


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
        self.buffer_size = buffer_size
        _, B, T = shapes[0]
        self.planner = BestFitPlanner(B, T + 1, buffer_size)
        self.done_batches = 0
        self._shape = 0
        self._chunks = Chunks(chunk_docs, (start.epoch, start.file, start.rg, start.doc))
        self._table, self._next_base = PieceTable(), 0
        self.result = None
        self._finish_if_done()

    def feed(self, piece, lengths: np.ndarray):
        if self.result is not None:
            return
        base, self._next_base = self._next_base, self._next_base + len(lengths)
        if np.count_nonzero(lengths):
            self._table.add(base, piece)
        self._chunks.add(piece, base, lengths)
        self._plan()

    def _plan(self):
        while self.done_batches < self.batch:
            self._reshape()
            p = self.planner
            if self._chunks.plan(p, safe=self._chunks.docs >= p.B * p.row_len + self.buffer_size) is None:
                return
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
            runs = self._table.runs(self.planner.buffered_ids())
            self.result = ((*self._chunks.last_end, 0), runs.tolist())


class CountMode(Mode):
    """Count-only (a run that finds a position): workers send document lengths and keep no
    tokens; the locator replays the batches over them in piece order. When it knows the
    position, the trainer gets `Located` (pieces tokenized and read from the cache counted
    with the read-ahead); meanwhile `Progress` once a second."""

    keep = None

    def __init__(self, cfg, run, n_workers: int, pieces):
        super().__init__(n_workers)
        shapes, batch = run.locate
        if cfg.bestfit:
            cap = ramp_for(cfg.tokenizer_batch_size, cfg.piece_cap)[1]  # whole chunks
            self.locator = BestFitLocator(shapes, batch, run.start, cfg.buffer_size, cfg.tokenizer_batch_size)
        else:
            cap = cfg.piece_cap
            self.locator = ConcatLocator(shapes, batch, run.start)
        self.pieces = pieces((), cap, 0)  # no ramp: nothing waits for a first batch
        self._counted, self._next = {}, 0
        self.from_cache = [0, 0]  # pieces tokenized, pieces read from the token cache
        self._reported, self._next_progress = False, time.monotonic() + PROGRESS_S

    def can_take(self, worker: int) -> bool:
        return self.locator.result is None and super().can_take(worker)

    def counted(self, msg):
        self._load[self.owner.pop(msg.piece)] -= 1
        self._counted[msg.piece] = msg.lengths
        self.from_cache[bool(msg.cache_hit)] += 1
        piece = self.specs[msg.piece]
        while self._next in self._counted and self.locator.result is None:
            self.locator.feed(self.specs.pop(self._next), self._counted.pop(self._next))
            self._next += 1
        return piece

    def messages(self):
        if self.locator.result is not None and not self._reported:
            self._reported = True
            yield Located(*self.locator.result, *self.from_cache)
        elif not self._reported and time.monotonic() >= self._next_progress:
            self._next_progress = time.monotonic() + PROGRESS_S
            yield Progress(self.locator.done_batches, self.locator.total)
