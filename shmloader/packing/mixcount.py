"""A count-only run over a mixture: where a rank's mix stands at a batch count, from its
documents' lengths alone (another rank's state of a mixture: resume.py).

A mixture's run is defined by its sources' document lengths, the mixture and the batch shape
(packing/mix.py), so replaying it from the run's start over this rank's own lengths gives the
point this rank's own state would hold at that batch count, exactly, as `count.CountMode` does
for one source. It holds for a run whose mixture has applied since batch 0 (the mixer's
`since`): a resume with other weights changes the stream at a batch this rank cannot know its
place at (mixchecks.py refuses those). A run whose B or T changed resumed at each change, so
its replay is one count a batch shape (`run.locate`: `([first, B, T]], end, first)`), the first
from the run's start, each next one from the point the last found, started as a resumed run
starts from a state's point (`run.mixture.point`, its `first_batch`): its mixer resumed, concat
from the cut document, best fit's buffer re-read first (mixstate.py `Mixed.replay` chains them).

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

import itertools
import time
from types import SimpleNamespace

import numpy as np

from ..data import mixrules
from ..data.mixture import Mixer
from ..data.order import buffer_pieces, ramp_for
from ..ipc.protocol import Located, Progress
from .base import Mode
from .count import PROGRESS_S
from .mix import MixStream, point_at
from .mixbestfit import MixBestFitSequencer, buffer_runs, buffer_text
from .mixfeed import MixFeed, held_by_mix, start_points
from .mixtext import point_text


class ConcatPlace:
    """Where concat's batch `batch` (of the count) starts in a mixed stream, from its runs in
    order; `skip`: the tokens of its first document before the count's start."""

    def __init__(self, window: int, batch: int, skip: int = 0):
        self.window, self.skip = window, skip
        self.target = batch * window + skip   # the stream's token the batch starts at
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

    def __init__(self, cfg, stream: MixStream, batch: int, used, lo: dict, n_prefix: int = 0, start=None):
        self.batch = batch
        self.seq = MixBestFitSequencer(cfg, 1, n_prefix, stream, start, used, lo)
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
        shapes, end, first_batch = run.locate
        _, B, T = shapes[0]
        self.batch = self.total = end - first_batch  # batches of this count
        point, starts = start_points(mix, run.rank)
        mixer = (Mixer.resume(mix.mixture, point.mixer, first_batch).mixer if point is not None
                 else Mixer(mix.mixture, first_batch))
        self._lo = lo = {r.name: r.lo for r in mix.ranges}
        self.bestfit = cfg.packing == "bos_bestfit"
        place = SimpleNamespace(B=B, T=T, buffer_size=cfg.buffer_size, tokenizer_batch_size=cfg.tokenizer_batch_size)
        prefix = []
        if self.bestfit:  # as packing/mixbestfit.py `MixBestFitMode` starts
            self.stream = MixStream(mixer, starts, lambda _: first_batch + self.place.seq.planned, cap=T + 1,
                                    chunk=mixrules.chunk(mix.rules, cfg.tokenizer_batch_size))
            prefix = buffer_pieces(buffer_runs(mix.point, lo), cfg.max_piece_docs)
            self.place = BestFitPlace(place, self.stream, self.batch, lambda *used: self.feed.used_up(*used), lo,
                                      len(prefix), point._replace(sources=starts) if point is not None else None)
        else:  # as packing/mixmode.py `MixConcatMode` starts: from the cut document, its tokens before dropped
            window = B * T + 1
            cut = point.source if point is not None and point.skip and point.source in lo else None
            skip = point.skip if cut is not None else 0
            self.stream = MixStream(mixer, starts, lambda tokens: first_batch + (tokens - skip) // window, cut)
            self.place = ConcatPlace(window, self.batch, skip)
        cap = ramp_for(cfg.tokenizer_batch_size, cfg.max_piece_docs)[1] if self.bestfit else cfg.max_piece_docs
        self.feed = MixFeed(mix, self.stream, starts, pieces, (), cap, self._in_flight.keys, len(prefix),  # whole chunks
                            stopping=self._flow)
        self.n_prefix = len(prefix)
        self.pieces = itertools.chain(prefix, self.feed.feed())
        self.from_cache = [0, 0]
        self.docs = 0
        self._reported, self._next_progress = False, time.monotonic() + PROGRESS_S

    @property
    def done_batches(self) -> int:
        if self.bestfit:
            return self.place.seq.planned
        return min(max(self.place.tokens - self.place.skip, 0) // self.place.window, self.batch)

    def can_take(self, worker: int) -> bool:
        return self.place.result is None and self.feed.pick() is not None and super().can_take(worker)

    def counted(self, msg):
        piece = self.specs.pop(msg.piece)
        self._counted_by(self.owner.pop(msg.piece), piece, 0)
        self.from_cache[bool(msg.cache_hit)] += 1
        self.docs += len(msg.lengths)
        if self.bestfit:
            self.place.counted(piece, msg.lengths)
        if msg.piece >= self.n_prefix:  # not one of a resumed buffer's
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
