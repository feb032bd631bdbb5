"""A count-only run over a mixture: where a rank's mix stands at a batch count, from its
documents' lengths alone (another rank's state of a mixture: resume.py).

A mixture's run is defined by its sources' document lengths, the mixture and the batch shape
(packing/mix.py), so replaying it from the run's start over this rank's own lengths gives the
point this rank's own state would hold at that batch count, exactly, as `count.CountMode` does
for one source. It holds for a run whose mixture has applied since batch 0 (the mixer's
`since`) with one batch shape: a resume with other weights, or another B or T, changes the
stream at a batch this rank cannot know its place at (mixstate.py refuses those).

- Concat (`ConcatPlace`): batch k starts at token k·(B·T+1) of the mixed stream; the point is
  where that token is, as the live run's sequencer finds it (`ConcatSequencer._find`: the
  next document, past nulls, at a document's boundary).
- Best fit (`BestFitPlace`): the same planning as a live run (`MixBestFitSequencer`, chunks
  picked when a plan asks), a batch at a time, until `batch` are planned: the point and the
  buffer after the last one.

`MixCountMode` hands out pieces as a live mixture does (`MixFeed`, no ramp), feeds counted
lengths to the stream and the place-finder, and says `Progress` and then `Located` (the
position, and the point as the state's JSON text in `runs`), or the error of a piece that
cannot be read, once the mix stops there before the place is found.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

from ..data import mixrules
from ..data.mixture import Mixer
from ..data.order import ramp_for
from ..ipc.protocol import Located, Progress
from .base import Mode
from .count import PROGRESS_S
from .mix import MixStream, point_at
from .mixbestfit import MixBestFitSequencer, buffer_text
from .mixfeed import MixFeed, held_by_mix, start_points
from .mixtext import point_text


class ConcatPlace:
    """Where concat's batch `batch` starts in a mixed stream, from its runs in order."""

    def __init__(self, window: int, batch: int):
        self.window = window
        self.target = batch * window          # the stream's token the batch starts at
        self.tokens = 0                       # the stream's tokens so far
        self.result = None                    # the `MixPoint` there, once known

    def add(self, run):
        cum = np.cumsum(np.asarray(run.lengths, dtype=np.int64))
        start = self.tokens
        self.tokens += int(cum[-1]) if len(cum) else 0
        if self.result is None and start <= self.target < self.tokens:
            rel = self.target - start
            row = int(np.searchsorted(cum, rel, side="right"))
            skip = rel - (int(cum[row - 1]) if row else 0)
            row += run.row_lo
            self.result = point_at(run, row, skip + (run.piece.skip if row == 0 else 0))


class BestFitPlace:
    """The point and buffer after best fit's batch `batch - 1`, planned as a live run plans;
    `used(source, piece)`: each piece whose last run went into a chunk."""

    def __init__(self, cfg, stream: MixStream, batch: int, used, lo: dict):
        self.batch = batch
        self.seq = MixBestFitSequencer(cfg, 1, 0, stream, None, used, lo)
        self.result = None                    # the `Complete` of batch `batch - 1`, once planned

    def counted(self, piece, lengths):
        self.seq.counted(piece, -1, lengths)

    def plan(self):
        seq = self.seq
        while self.result is None and seq.planned < self.batch:
            if not seq.plan():
                return
            done = seq._positions.pop(seq.planned - 1)
            seq.freed(seq.planned - 1)
            if seq.planned == self.batch:
                self.result = done


class MixCountMode(Mode):
    """Count-only over a mixture (the module docstring says how)."""

    keep = False

    def __init__(self, cfg, run, n_workers: int, pieces):
        super().__init__(n_workers, cfg)
        mix = run.mixture
        shapes, self.batch, _ = run.locate
        _, B, T = shapes[0]
        self.total = self.batch
        _, starts = start_points(mix, run.rank)
        self.bestfit = cfg.packing == "bos_bestfit"
        place = SimpleNamespace(B=B, T=T, buffer_size=cfg.buffer_size, tokenizer_batch_size=cfg.tokenizer_batch_size)
        if self.bestfit:
            self.stream = MixStream(Mixer(mix.mixture, 0), starts, lambda _: self.place.seq.planned, cap=T + 1,
                                    chunk=mixrules.chunk(mix.rules, cfg.tokenizer_batch_size))
            self.place = BestFitPlace(place, self.stream, self.batch, lambda *used: self.feed.used_up(*used),
                                      {r.name: r.lo for r in mix.ranges})
        else:
            window = B * T + 1
            self.stream = MixStream(Mixer(mix.mixture, 0), starts, lambda tokens: tokens // window)
            self.place = ConcatPlace(window, self.batch)
        cap = ramp_for(cfg.tokenizer_batch_size, cfg.max_piece_docs)[1] if self.bestfit else cfg.max_piece_docs
        self.feed = MixFeed(mix, self.stream, starts, pieces, (), cap, self._in_flight.keys,  # whole chunks
                            stopping=self._flow)
        self.pieces = self.feed.feed()
        self._lo = {r.name: r.lo for r in mix.ranges}
        self.from_cache = [0, 0]
        self.docs = 0
        self._reported, self._next_progress = False, time.monotonic() + PROGRESS_S

    @property
    def done_batches(self) -> int:
        if self.bestfit:
            return self.place.seq.planned
        return min(self.place.tokens // self.place.window, self.batch)

    def can_take(self, worker: int) -> bool:
        return self.place.result is None and self.feed.pick() is not None and super().can_take(worker)

    def counted(self, msg):
        piece = self.specs.pop(msg.piece)
        self._counted_by(self.owner.pop(msg.piece), piece, 0)
        self.from_cache[bool(msg.cache_hit)] += 1
        self.docs += len(msg.lengths)
        if self.bestfit:
            self.place.counted(piece, msg.lengths)
        self.feed.counted(msg.piece, piece, msg.lengths)
        self._flow()
        return piece

    def failed(self, index: int, error) -> bool:
        return held_by_mix(self, index, error)

    def _flow(self):
        """The mix's documents as far as they are counted, into the place-finder."""
        self.feed.flow()
        if self.bestfit:
            self.place.plan()
        else:
            for run in self.stream.runs():
                self.place.add(run)
                if run.last:
                    self.feed.used_up(run.source, run.piece)

    def messages(self):
        if self.place.result is not None and not self._reported:
            self._reported = True
            done = self.place.result
            if self.bestfit:
                text, position = buffer_text(done.runs, self._lo), done.position
            else:
                text, position = point_text(done, self._lo), done.sources[done.source]._replace(skip=done.skip)
            yield Located(tuple(position), text, *self.from_cache)
        elif not self._reported and time.monotonic() >= self._next_progress:
            self._next_progress = time.monotonic() + PROGRESS_S
            yield Progress(self.done_batches, self.total, self.docs)
        if self.stream.stopped is not None and not self._reported:  # a piece it needs cannot be read
            self._reported = True
            yield self.stream.stopped
        if self.stream.finished is not None and not self._reported:
            self._reported = True
            yield Located(None, self.stream.finished, *self.from_cache)
