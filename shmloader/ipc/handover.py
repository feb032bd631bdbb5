"""NOTE [slot handover]: how batches and freed slots cross between the trainer and the
coordinator through the ring's header, so that `next()` on a ready batch makes no system call.

Two single-writer logs in the header (`ring.Counter`, `ring.RECORD_FIELDS`):

- **Announcements** (coordinator -> trainer). For batch k the coordinator writes the record
  `records[k % n_slots] = (k, slot, epoch, file, rg, doc, skip, docs, check, read_epoch, read_file,
  read_rg)` (the position after it, its check, the row group its reading ended in) and then the counter
  `ANNOUNCED = k + 1`. The trainer takes batches in order: batch `taken` is ready when
  `ANNOUNCED > taken`. A record is never overwritten before the trainer has read it: batch
  k + n_slots can be written only once one of k..k+n_slots-1 was freed (at most n_slots
  batches hold a slot), and the trainer frees a batch only after it has taken every batch
  before it.
- **Frees** (trainer -> coordinator). The trainer writes `free_log[i % n_slots] = k` and then
  `FREES = i + 1`; the coordinator takes the entries from `FREES_SEEN` to `FREES` at every turn
  of its loop and publishes `FREES_SEEN`. At most n_slots frees are ever unseen (each one holds
  a slot the coordinator has not given again).

Nobody is woken per batch. Two doorbells (eventfds, `Doorbell`) are rung only where a wait
could otherwise last:

- `ready`: the coordinator rings it after every announcement (a cheap write nobody waits on
  while batches are ready). The trainer clears and waits on it only when no batch is ready;
  it clears before looking at `ANNOUNCED`, so an announcement made meanwhile is never missed.
- `kick`: the trainer rings it when it is about to block with frees the coordinator has not
  seen, or when half the ring's slots wait in the log. Otherwise the coordinator notices frees
  by itself: at every turn of its loop, and, while it holds no free slot (the ring is full and
  the trainer is the bottleneck), by looking at the log after the time the trainer takes to
  free a few slots at its recent pace (ipc/freepoll.py: so that a look finds several and their
  write orders go out together, one wake-up of a worker for several batches); each look that
  finds nothing doubles the wait (up to the loop's usual wait), so a trainer away for minutes
  (an evaluation) costs a few wake-ups a second, and the half-ring kick still reaches the
  coordinator at once when it is back.
- `MESSAGES` counts the messages the coordinator has queued for the trainer's pipe (warnings,
  errors, a count-only run's progress): before taking a batch the trainer reads the ones
  queued before its announcement, so a warning still comes before the batches after it.
- `TAKEN` (the batches the trainer has taken, one store per batch) and `WAITING` (1 while it
  is blocked in `next()`) tell the coordinator that the trainer is here: an idle release
  (NOTE [ring protocol] 7) waits for both to say it is away.

Memory order. On x86-64 (total store order) a store is seen by other cores in program order,
and loads are not reordered with each other or with later stores, which is all this needs:
the record before its counter, the slot's tokens (acknowledged to the coordinator through a
pipe) before the counter, and the caller's reads of a lent batch before its free. Elsewhere
(e.g. aarch64, where plain stores and loads may be reordered) every handover also goes
through a system call: the coordinator's doorbell write and the trainer's read of it order the
announcement, and only announcements the trainer has been rung for are taken; each free rings
the kick doorbell. That costs what the pipes cost before, and is correct.
`SHMLOADER_HANDOVER=syscall` forces that path on x86-64 (the tests run both).
"""
import os
import platform
import time
from multiprocessing import reduction
from typing import NamedTuple

from ..position import Position, RowGroup
from .freepoll import FreePoll
from .ring import RECORD_FIELDS, Counter, Ring

HANDOVER_ENV = "SHMLOADER_HANDOVER"
# the counters' indices as plain ints, for the trainer's hot path
_ANNOUNCED, _MESSAGES, _FREES, _FREES_SEEN, _TAKEN, _WAITING = (int(c) for c in (
    Counter.ANNOUNCED, Counter.MESSAGES, Counter.FREES, Counter.FREES_SEEN, Counter.TAKEN, Counter.WAITING))


def header_only() -> bool:
    """Whether batches and frees may cross through the header alone (see the NOTE)."""
    forced = os.environ.get(HANDOVER_ENV, "")
    if forced not in ("", "header", "syscall"):
        raise ValueError(f'{HANDOVER_ENV} must be "header" or "syscall", got {forced!r}')
    if forced:
        return forced == "header"
    return platform.machine().lower() in ("x86_64", "amd64")


_new = tuple.__new__


def kick_at(n_slots: int) -> int:
    """Unseen frees at which the trainer rings the coordinator: half the ring."""
    return max(1, n_slots // 2)


class Announcement(NamedTuple):
    """Batch `batch` (counted from the run's first, 0) is ready in `slot`: what the trainer takes
    from the header (`TrainerEnd.take`) and passes on, one record, to the loader. The run fills
    in the last two fields (procs/run.py)."""
    batch: int
    slot: int
    position: Position      # the canonical position after it (where the next batch starts)
    docs: int               # documents begun (concat) or placed (best fit) by its end, in this run
    check: int              # `ring.batch_check` of its slot: a state resuming at it carries it
    buffer: object = None   # a buffered packing: the buffer after it, as the state's text (`packing.runs.BufferText`)
    waited: float = 0.0     # seconds `next()` blocked for it
    read: RowGroup | None = None  # the row group its reading ended in (nanochat's keys with it)


class Doorbell:
    """An eventfd that one process rings and another waits on (`fileno()` for poll). Ringing
    adds to a counter and never blocks; `clear()` reads and zeroes it without blocking.
    Pickles for a child as a duplicate of its descriptor (as a multiprocessing Connection)."""

    def __init__(self, fd: int | None = None):
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) if fd is None else fd

    def ring(self):
        os.eventfd_write(self.fd, 1)

    def clear(self) -> int:
        """How many rings since the last clear (0 if none)."""
        try:
            return os.eventfd_read(self.fd)
        except BlockingIOError:
            return 0

    def fileno(self) -> int:
        return self.fd

    def close(self):
        """Close the descriptor once (forgotten first: a second call, even after an error, is a no-op)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __reduce__(self):
        return _rebuild_doorbell, (reduction.DupFd(self.fd),)


def _rebuild_doorbell(dup) -> Doorbell:
    return Doorbell(dup.detach())


class TrainerEnd:
    """The trainer's side: `take()` the next announced batch's record, `free(k)` a batch,
    `pending_messages()`, and `before_blocking()`.

    It reads and writes the header through `memoryview`s of its words, not numpy: on a ready
    batch `next()` is a handful of these accesses, and after a busy training step (code and
    data cold) a numpy scalar access costs about twice as much as a memoryview's, whose code
    is the interpreter's own. An aligned 8-byte word is one load or store either way.
    `release()` lets go of the views (before the ring is unmapped)."""

    def __init__(self, ring: Ring, ready: Doorbell, kick: Doorbell, header: bool | None = None):
        """`header`: take the header-only path (default: `header_only()`, by machine)."""
        self.ring, self.ready, self.kick = ring, ready, kick
        self.n = ring.layout.n_slots
        self.header_only = header_only() if header is None else header
        self.kick_at = kick_at(self.n)
        self.taken = 0           # batches taken, in order
        self.rung = 0            # announcements the ready doorbell was rung for (syscall path)
        self.messages_read = 0
        self.frees = 0
        self._counters, self._records, self._free_log = (_words(a) for a in (ring.counters, ring.records,
                                                                             ring.free_log))
        self._width = len(RECORD_FIELDS)

    def take(self) -> Announcement | None:
        """Batch `taken`'s announcement if it is announced, else None."""
        if self.header_only:
            if self._counters[_ANNOUNCED] <= self.taken:
                return None
        elif self.rung <= self.taken:
            self.rung += self.ready.clear()
            if self.rung <= self.taken:
                return None
        at = self.taken % self.n * self._width
        k, slot, epoch, file, rg, doc, skip, docs, check, r_epoch, r_file, r_rg = self._records[at:at + self._width].tolist()
        if k != self.taken:
            raise RuntimeError(f"ring handover: record {self.taken % self.n} holds batch {k}, "
                               f"expected batch {self.taken}")
        self.taken += 1
        self._counters[_TAKEN] = self.taken
        # the records made without their Python constructors (a frame each): this is every batch's path
        return _new(Announcement, (k, slot, _new(Position, (epoch, file, rg, doc, skip)), docs, check, None, 0.0,
                                   _new(RowGroup, (r_epoch, r_file, r_rg))))

    def announced(self) -> int:
        """Batches the coordinator has announced."""
        return self._counters[_ANNOUNCED]

    def pending_messages(self) -> int:
        return self._counters[_MESSAGES] - self.messages_read

    def free(self, k: int):
        """Log batch k's slot as free; ring the coordinator only when half the ring waits
        (on the system-call path, for every free)."""
        self._free_log[self.frees % self.n] = k
        self.frees += 1
        self._counters[_FREES] = self.frees
        if not self.header_only or self.frees - self._counters[_FREES_SEEN] >= self.kick_at:
            self.kick.ring()

    def waiting(self, blocked: bool):
        """The trainer is (no longer) blocked in `next()` waiting for a batch."""
        if self._counters is not None:
            self._counters[_WAITING] = int(blocked)

    def before_blocking(self):
        """No batch is ready: clear the ready doorbell (then look at the header again before
        waiting on it), and ring the coordinator if it has frees it has not seen."""
        if self.header_only:
            self.ready.clear()
            if self.frees > self._counters[_FREES_SEEN]:
                self.kick.ring()

    def release(self):
        """Let go of the header's views (the ring can be unmapped once nothing else holds it)."""
        for view in (self._counters, self._records, self._free_log):
            if view is not None:
                view.release()
        self._counters = self._records = self._free_log = None


def _words(array) -> memoryview:
    """A flat memoryview of int64 words over a C-contiguous numpy array of the ring."""
    return memoryview(array).cast("B").cast("q")


class CoordinatorEnd:
    """The coordinator's side: `freed()` the batches freed since the last call, `kicked_now()`
    when the kick doorbell is readable, `announce()` a batch, `message_queued()` before a
    message to the trainer goes out. On the system-call path a free is taken only once its
    kick was read (the eventfd orders the log's entry)."""

    def __init__(self, ring: Ring, ready: Doorbell, kick: Doorbell, header: bool):
        self.ring, self.ready, self.kick = ring, ready, kick
        self.n = ring.layout.n_slots
        self.header_only = header
        self.seen = 0
        self.kicked = 0          # frees the trainer rang for (system-call path)
        self.poll = FreePoll(kick_at(self.n) - 1)  # a look finds the frees just short of a kick
        self._after_wait = False  # the next look ends a wait that nothing woke

    def wait_s(self, slots_full: bool, idle_s: float) -> float:
        """How long the loop may wait for its pipes: `idle_s`, or while every slot is held,
        until the next look at the free log (ipc/freepoll.py)."""
        return min(self.poll.wait_s, idle_s) if slots_full else idle_s

    def timed_out(self):
        """A wait ended with nothing to read: if the next look finds no free, look half as often."""
        self._after_wait = True

    def kicked_now(self):
        """The kick doorbell is readable: clear it (on the system-call path, count the frees
        it was rung for; otherwise it was only a hint to look at the log)."""
        rings = self.kick.clear()
        if not self.header_only:
            self.kicked += rings

    def freed(self) -> list[int]:
        logged = int(self.ring.counters[Counter.FREES]) if self.header_only else self.kicked
        after_wait, self._after_wait = self._after_wait, False
        if logged == self.seen:
            if after_wait:
                self.poll.none_found()
            return []
        out = [int(self.ring.free_log[i % self.n]) for i in range(self.seen, logged)]
        self.seen = logged
        self.ring.counters[Counter.FREES_SEEN] = logged
        self.poll.found(len(out), time.monotonic())
        return out

    def announce(self, k: int, slot: int, position: Position, docs: int, check: int = 0, read: RowGroup | None = None):
        """`position`: the one after batch k; `check`: `ring.batch_check` of the slot's tokens;
        `read`: the row group its reading ended in (None: the position's)."""
        self.ring.records[k % self.n] = (k, slot, *position, docs, check, *(read or position[:3]))
        self.ring.counters[Counter.ANNOUNCED] = k + 1
        self.ready.ring()

    def message_queued(self):
        self.ring.counters[Counter.MESSAGES] += 1
