"""What the coordinator's sequencing modes share: their interface and their batch bookkeeping.

A *mode* (`packing.ConcatMode`, `bestfit_seq.BestFitMode`, `locate.CountMode`) turns counted
pieces into write orders and complete batches; the coordinator (`coordinator.py`) only moves
its messages and never looks inside it. `BatchBook` is the bookkeeping both sequencers need:
which batches may be written (at most `n_slots` between their first order and their free),
how many tokens each still waits for, and which are complete, in order. `SlotMap` says which
ring slot holds which batch. Pure logic: no processes, no tokens. See NOTE [ring protocol]
in protocol.py.
"""
import heapq

MAX_PIECES_PER_WORKER = 3


class BatchBook:
    """Batches freed, writable, written and announced, for one run."""

    def __init__(self, n_slots: int):
        self.n_slots = n_slots
        self.n_freed = 0          # batches the trainer gave back, in any order
        self.announced = 0        # batches < announced were announced
        self._left = {}           # batch -> tokens still to be written

    def freed(self):
        self.n_freed += 1

    @property
    def limit(self) -> int:
        """Batches below this may be written: every freed batch is among them, so at most
        `n_slots` batches hold a slot at once."""
        return self.n_freed + self.n_slots

    def expect(self, batch: int, tokens: int):
        self._left[batch] = self._left.get(batch, 0) + tokens

    def written(self, counts):
        """A worker wrote `n` tokens of batch `k` for each `(k, n)`."""
        for k, n in counts:
            self._left[k] -= n

    def ready(self, position_of) -> list:
        """`(batch, position)` of the batches now complete, in order; `position_of(k)` is None
        while the position after batch k is not known yet, and k waits."""
        out = []
        while self._left.get(self.announced) == 0:
            pos = position_of(self.announced)
            if pos is None:
                break
            del self._left[self.announced]
            out.append((self.announced, pos))
            self.announced += 1
        return out


class Mode:
    """The coordinator's view of a sequencer. Pieces come from `pieces`; `take` gives one to a
    worker, which answers with `counted`; `orders(take_slot)` yields `(worker, write order,
    slots it fills)`; `written` takes the workers' acknowledgements, `freed` the trainer's;
    `ready` yields `(batch, position, runs or None, documents begun by the end of the batch)`
    of complete batches in order; `messages`
    are extra messages for the trainer and `stats` the header counters `(ring.Stat, value)`
    the mode keeps. `keep` tells workers how to keep a counted piece's tokens (worker.KEEP)."""

    keep = "stream"

    def __init__(self, n_workers: int):
        self._load = [0] * n_workers   # pieces a worker holds that count against its share
        self.owner, self.specs = {}, {}

    def load(self, worker: int) -> int:
        return self._load[worker]

    def can_take(self, worker: int) -> bool:
        return self._load[worker] < MAX_PIECES_PER_WORKER

    def take(self, worker: int, piece):
        self.owner[piece.index], self.specs[piece.index] = worker, piece
        self._load[worker] += 1

    def counted(self, msg):
        raise NotImplementedError

    def freed(self, batch: int):
        pass

    def orders(self, take_slot):
        return ()

    def written(self, counts):
        pass

    def ready(self):
        return ()

    def messages(self):
        return ()

    def stats(self):
        return ()


class SlotMap:
    """Which ring slot holds which batch (the coordinator's). A batch takes the lowest free
    slot when its first write order is issued and gives it back when the trainer frees it,
    in any order: the trainer lends CPU batches until the caller drops them. The sequencers
    keep at most `n_slots` batches between their first order and their free, so a slot is
    always free when one is asked for."""

    def __init__(self, n_slots: int):
        self._free = list(range(n_slots))
        self._of = {}

    @property
    def full(self) -> bool:
        """Every slot is held: nothing more can be written until the trainer frees one."""
        return not self._free

    def slot_of(self, batch: int) -> int:
        """The slot batch `batch` holds (it must hold one)."""
        return self._of[batch]

    def take_slot(self, batch: int) -> int:
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
