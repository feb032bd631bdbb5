"""A count-only run: where a rank's stream stands at a batch count, from its documents' lengths
alone (another rank's state, one source's or a mixture's: resume.py).

nanochat saves rank 0's loader state only and hands it to every rank. A state carries the batch
count `batch`, the batch shapes the run used (`shapes`: [first batch, B, T], ...) and where the
run began (`origin`), which are the same on every rank; the replay starts there (`run.start`,
an `ipc.runstart.RunStart`: its position, its batch count and, a mixture's, its
`MixStart.point`). A run is defined by its documents' lengths (a mixture's: its sources', the
mixture and the batch shape, packing/mix.py), so replaying it from the run's start over this
rank's own lengths gives the place this rank's own state would hold at that batch count,
exactly. For a mixture it holds for a run whose mixture has applied since batch 0 (the mixer's
`since`): a resume with other weights changes the stream at a batch this rank cannot know its
place at (mixchecks.py refuses those). A run whose B or T changed resumed at each change, so a
mixture's replay is one count a batch shape (its start's `CountTo`: `shapes` `[[first, B, T]]`
and the batch count `until` it ends at, from the start's batch count), the first from the run's
start, each next one from the point the last found, started as a resumed run starts from a
state's point (`run.start`: its `MixStart.point`, its `batch`); one source's locator replays
every shape in one count.

`MixCountMode` is the one mode of such a run (`base.Mode`): workers send document lengths and
keep no tokens (`keep = False`); pieces are handed out by its feed, counted pieces go to its
stream and then to its *place*, what finds the place at the batch count; the trainer gets
`Progress` once a second and then `Located` (the position and the state's buffer text), or the
error of a piece that cannot be read once the replay needs it (the stream stops there before
the place is found): a bad piece past the place is no error. What it is made of is its kind's:

- a mixture's: a `MixFeed` (no ramp), the `MixStream`, and its packing's place
  (`packing.MODES[...].count_place`: concat's `mixmode.ConcatPlace`, where batch k's first
  token is in the mixed stream; best fit's `mixbestfit.BestFitPlace`, the same planning as a
  live run a batch at a time), each made from the `Count` the run starts from;
- one source's (`SourceCountMode`): its run's own order (`mixfeed.OrderFeed`, best fit's
  resumed buffer re-read first), a `mixone.Passing`, and its packing's locator
  (`Packing.locator`: `concat.ConcatLocator`, `bestfit.BestFitLocator`) fed the pieces in
  order (`Locating`).
"""
from __future__ import annotations

import itertools
import time
from typing import NamedTuple

from ..data.mixture import Mixer
from ..ipc.protocol import Located, Progress
from . import MODES
from .base import Mode
from .mixfeed import MixFeed, OrderFeed, held_by_mix, start_points
from .mixone import Passing

PROGRESS_S = 1.0
MAX_WAITING = 64  # one source's pieces counted and waiting for an earlier one's count, at most (a stopped worker's)


class Count(NamedTuple):
    """What a mixture's count-only run starts from, of which its packing's place is made
    (`count_place(count, used)`: its stream, its place-finder; `used(source, piece)`: a piece
    the mix has used up, for the feed)."""
    cfg: object
    run: object                # the run's `RunArgs` (its `MixArgs`, its start's `MixStart`)
    point: object              # the `MixPoint` it starts from, or None (fresh)
    starts: dict               # every source's start (`mixfeed.start_points`)
    mixer: Mixer               # the mixer there
    first_batch: int           # the batch it starts at
    batch: int                 # the batches it counts
    B: int
    T: int
    lo: dict                   # each source's first file in the run's numbering


class Locating:
    """One source's place: its packing's locator (`Packing.locator`) fed every piece in its
    order as it passes (`stream`, a `mixone.Passing`)."""

    prefix = ()  # best fit's resumed buffer is the first pieces of its order (the feed's)

    def __init__(self, locator, stream: Passing):
        self.locator, self.stream, self.total = locator, stream, locator.total

    def counted(self, piece, lengths):
        """Fed in order instead, as they pass (`flow`)."""

    @property
    def result(self):
        return self.locator.result

    @property
    def done_batches(self) -> int:
        return self.locator.done_batches

    def wants(self) -> bool:
        """Until the place is found, and while the counts waiting for an earlier piece's stay few
        (a worker stopped on its piece would have the others read on for ever)."""
        return self.locator.result is None and len(self.stream.waiting()) < MAX_WAITING

    def flow(self):
        for piece, lengths in self.stream.passed():
            self.locator.feed(piece, lengths)  # ignored once it has a result

    def located(self) -> tuple:
        """`(position, runs)` of the `Located` answer."""
        found = self.locator.result
        return found.position, found.runs


class MixCountMode(Mode):
    """Count-only (the module docstring says how), over a mixture; `SourceCountMode`: the same
    over one source's run."""

    keep = False

    def __init__(self, cfg, run, n_workers: int, pieces):
        Mode.__init__(self, n_workers, cfg)
        mix, first_batch, end = run.mixture, run.start.batch, run.start.locate.until
        _, B, T = run.start.locate.shapes[0]
        point, starts = start_points(run)
        mixer = (Mixer.resume(mix.mixture, point.mixer, first_batch).mixer if point is not None
                 else Mixer(mix.mixture, first_batch))
        count = Count(cfg, run, point, starts, mixer, first_batch, end - first_batch, B, T,
                      {r.name: r.lo for r in mix.ranges})
        place = MODES[cfg.packing].count_place(count, lambda *used: self.feed.used_up(*used))
        feed = MixFeed(run, place.stream, starts, pieces, (), place.cap, self._in_flight.keys, len(place.prefix),
                       stopping=self._flow)  # no ramp: nothing waits
        self._begin(place, feed, itertools.chain(place.prefix, feed.feed()))

    def _begin(self, place, feed, pieces):
        """The mode over its parts: `place` what finds the place (its `stream`, what the feed asks;
        its `prefix`, pieces handed out before the feed's: best fit's resumed buffer), `feed`
        what hands pieces out, `pieces` the pieces in hand-out order."""
        self.place, self.stream, self.feed, self.pieces = place, place.stream, feed, pieces
        self.n_prefix = len(place.prefix)
        self.from_cache = [0, 0]  # pieces tokenized, pieces read from the token cache
        self.docs = 0             # documents counted
        self._reported, self._next_progress = False, time.monotonic() + PROGRESS_S
        self._flow()

    @property
    def done_batches(self) -> int:
        return self.place.done_batches

    def can_take(self, worker: int) -> bool:
        return self.place.wants() and self.feed.pick() is not None and super().can_take(worker)

    def counted(self, msg):
        piece = self.specs.pop(msg.piece)
        self._counted_by(self.owner.pop(msg.piece), piece, 0)
        self.from_cache[bool(msg.cache_hit)] += 1
        self.docs += len(msg.lengths)
        self.place.counted(piece, msg.lengths)
        if msg.piece >= self.n_prefix:  # not one of a mixture's resumed buffer (the feed's)
            self.feed.counted(msg.piece, piece, msg.lengths)
        self._flow()
        return piece

    def failed(self, index: int, error) -> bool:
        """A piece the feed hands out is held until the replay needs it (a mixture's resumed
        buffer's is not: `MixFeed.failed` says no, and the coordinator raises it now)."""
        return held_by_mix(self, index, error)

    def _flow(self):
        """The stream's documents as far as they are counted, into the place-finder."""
        self.feed.flow()
        self.place.flow()

    def messages(self):
        if self.place.result is not None and not self._reported:
            self._reported = True
            yield Located(*self.place.located(), *self.from_cache)
        elif not self._reported and time.monotonic() >= self._next_progress:
            self._next_progress = time.monotonic() + PROGRESS_S
            yield Progress(self.done_batches, self.place.total, self.docs)
        if self.stream.stopped is not None and not self._reported:  # a piece it needs cannot be read
            self._reported = True
            yield self.stream.stopped
        if self.stream.finished is not None and not self._reported:
            self._reported = True
            yield Located(None, self.stream.finished, *self.from_cache)


class SourceCountMode(MixCountMode):
    """Count-only over one source's run: the same mode made of one source's parts (its run's
    order, best fit's resumed buffer first, through a `Passing` into its packing's locator)."""

    def __init__(self, cfg, run, n_workers: int, pieces):
        Mode.__init__(self, n_workers, cfg)
        locator, cap = cfg.spec.locator(cfg, run)
        prefix = getattr(locator, "prefix", [])  # best fit: the buffer it starts from, re-read first
        stream = Passing()
        feed = OrderFeed(itertools.chain(prefix, pieces((), cap, len(prefix))), stream)  # no ramp: nothing waits
        self._begin(Locating(locator, stream), feed, feed.feed())

