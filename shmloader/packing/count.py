"""A count-only run: a rank's position at a batch count, from its document lengths alone.

nanochat saves rank 0's loader state only and hands it to every rank. A state carries the
batch count `batch`, the batch shapes the run used (`shapes`: [first batch, B, T], ...) and
where the run began (`origin`), which are the same on every rank. Replaying them over this
rank's own document lengths, in canonical order from its origin, gives the position this
rank's own state would hold at that batch count, exactly: each packing's locator
(`concat.ConcatLocator`, `bestfit.BestFitLocator`, named by its spec) is fed `(piece,
lengths)` in piece order (`feed`) until its `result` is set (`base.Found`: the position and,
best fit, the buffer's runs there).

`CountMode` is the coordinator's mode for such a run (`base.Mode`): workers send document
lengths and keep no tokens (`keep = False`); the trainer gets `Progress` once a second and
then `Located`, or the error of a piece that cannot be read once the replay needs it (every
piece before it fed and no position found yet): a bad row group past the position is no
error.
"""
import itertools
import time

from ..ipc.protocol import Located, Progress
from .base import InOrder, Mode

PROGRESS_S = 1.0
MAX_WAITING = 64  # pieces counted and waiting for an earlier one's count, at most (a stopped worker's)


class CountMode(Mode):
    """Count-only (a run that finds a position): the locator replays the batches over the
    counted lengths in piece order. When it knows the position, the trainer gets `Located`
    (pieces tokenized and read from the cache counted with the read-ahead); meanwhile
    `Progress` once a second."""

    keep = False

    def __init__(self, cfg, run, n_workers: int, pieces):
        super().__init__(n_workers, cfg)
        self.locator, cap = cfg.spec.locator(cfg, run)
        prefix = getattr(self.locator, "prefix", [])  # best fit: the buffer it starts from, re-read first
        self.pieces = itertools.chain(prefix, pieces((), cap, len(prefix)))  # no ramp: nothing waits
        self._counted = InOrder()
        self.from_cache = [0, 0]  # pieces tokenized, pieces read from the token cache
        self.docs = 0             # documents counted
        self._reported, self._next_progress = False, time.monotonic() + PROGRESS_S

    def can_take(self, worker: int) -> bool:
        """Until the position is found, and while the counts waiting for an earlier piece's
        stay few (a worker stopped on its piece would have the others read on for ever)."""
        return (self.locator.result is None and len(self._counted.waiting()) < MAX_WAITING
                and super().can_take(worker))

    def counted(self, msg):
        self._counted_by(self.owner.pop(msg.piece), self.specs[msg.piece], 0)
        self.from_cache[bool(msg.cache_hit)] += 1
        self.docs += len(msg.lengths)
        piece = self.specs[msg.piece]
        for index, lengths in self._counted.add(msg.piece, msg.lengths):
            self.locator.feed(self.specs.pop(index), lengths)  # ignored once it has a result
        return piece

    def failed(self, index: int, error) -> bool:
        self._forget(index)
        self.stops.add(index, error)
        return True

    def messages(self):
        error = self.stops.due(self.stops.first() == self._counted.next and self.locator.result is None)
        if error is not None:
            self._reported = True
            yield error
        if self.locator.result is not None and not self._reported:
            self._reported = True
            found = self.locator.result
            yield Located(found.position, found.runs, *self.from_cache)
        elif not self._reported and time.monotonic() >= self._next_progress:
            self._next_progress = time.monotonic() + PROGRESS_S
            yield Progress(self.locator.done_batches, self.locator.total, self.docs)
