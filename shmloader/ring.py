"""The shared-memory ring: one segment of `n_slots` slots of `window` int64 tokens.

Used by the trainer (creates, unlinks), the coordinator and the workers (attach, close); it
imports neither side. The protocol that moves slots between them is
NOTE [ring protocol] in shmloader/protocol.py.

Guarantees: each segment's memory is reserved when it is created (`posix_fallocate`), so a
too-small /dev/shm is an OSError at start naming the bytes needed and free, never a SIGBUS
later; names are `shml_<pid>_<hex>` (under 30 characters) and `sweep_stale()` unlinks the
segments of creators that are no longer alive. Linux only (/dev/shm).
"""
import contextlib
import enum
import mmap
import os
import secrets
import signal
from dataclasses import dataclass

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "shml_"
MAGIC = 0x73686D6C6F616472  # "shmloadr"
LAYOUT_VERSION = 3
ALIGN = 4096


class Stat(enum.IntEnum):
    """The header's counters (`Ring.stats`), written by the coordinator only."""

    TOKENS = 0        # tokens counted (BOS included)
    DOCS = 1          # documents with text
    NULLS = 2         # null documents
    PIECES = 3        # pieces counted
    CROPPED = 4       # best fit: tokens cropped
    EPOCH = 5         # epoch of the last announced batch
    SKIPPED_RG = 6    # bad row groups (and files) skipped
    PLACED = 7        # best fit: tokens planned into batches
    CACHE_HITS = 8    # pieces served by the token cache
    CACHE_MISSES = 9  # pieces tokenized with a cache


class Counter(enum.IntEnum):
    """The slot handover's counters (`Ring.counters`; handover.py), after the stats."""

    ANNOUNCED = 0     # batches announced (coordinator)
    MESSAGES = 1      # messages queued for the trainer's pipe (coordinator)
    FREES = 2         # frees logged (trainer)
    FREES_SEEN = 3    # frees the coordinator has taken from the log (coordinator)


# One announcement (`Ring.records[k % n_slots]`, written by the coordinator for batch k).
RECORD_FIELDS = ("batch", "slot", "epoch", "file", "rg", "doc", "skip", "docs")


class WorkerCol(enum.IntEnum):
    """The columns of a worker's status row (`Ring.workers[i]`), written by worker i only."""

    PID = 0
    PIECE = 1         # index of the piece being read, -1 when idle
    FILE = 2
    RG = 3
    DOC = 4           # its first document
    TOKENS = 5        # tokens produced so far
    BUSY_US = 6       # microseconds spent reading and tokenizing
    TOKENIZED = 7     # of TOKENS, those tokenized here (not served by the token cache)


WORKER_FIELDS = tuple(c.name.lower() for c in WorkerCol)
STATS_FIELDS = tuple(s.name.lower() for s in Stat)
FIXED_WORDS = 5 + len(STATS_FIELDS) + len(Counter)


class SlotState(enum.IntEnum):
    """Zero is FREE, so a zeroed segment is a valid ring.

    Legal transitions: FREE -> FILLING (coordinator), FILLING -> READY (coordinator),
    READY -> IN_USE (trainer), IN_USE -> FREE (trainer).
    """

    FREE = 0
    FILLING = 1
    READY = 2
    IN_USE = 3


@dataclass(frozen=True)
class RingLayout:
    n_slots: int
    window: int
    n_workers: int
    max_runs: int = 0  # best fit: room per slot for the buffer's runs in the state after it

    @property
    def header_words(self) -> int:
        return (FIXED_WORDS + self.n_slots + self.n_workers * len(WORKER_FIELDS)
                + self.n_slots * (len(RECORD_FIELDS) + 1))  # the records, then the free log

    @property
    def slots_offset(self) -> int:
        raw = self.header_words * 8
        return (raw + ALIGN - 1) // ALIGN * ALIGN

    @property
    def runs_offset(self) -> int:
        return self.slots_offset + self.n_slots * self.window * 8

    @property
    def runs_words(self) -> int:
        return 1 + 5 * self.max_runs if self.max_runs else 0  # count, then the runs

    @property
    def nbytes(self) -> int:
        return self.runs_offset + self.n_slots * self.runs_words * 8


class Ring:
    """Numpy views of one segment: `header`, `stats` (written by the coordinator only),
    `counters`, `slot_states`, `workers` (row i written by worker i only), the handover's
    `records` and `free_log` (handover.py), and `slots`."""

    def __init__(self, buf, layout: RingLayout, name: str):
        self.name, self.buf = name, buf
        self.layout = layout
        self.header = np.frombuffer(buf, dtype=np.int64, count=layout.header_words)
        n, stats_end = layout.n_slots, 5 + len(STATS_FIELDS)
        self.stats = self.header[5:stats_end]
        self.counters = self.header[stats_end:FIXED_WORDS]
        self.slot_states = self.header[FIXED_WORDS:FIXED_WORDS + n]
        workers_end = FIXED_WORDS + n + layout.n_workers * len(WORKER_FIELDS)
        self.workers = self.header[FIXED_WORDS + n:workers_end].reshape(layout.n_workers, len(WORKER_FIELDS))
        records_end = workers_end + n * len(RECORD_FIELDS)
        self.records = self.header[workers_end:records_end].reshape(n, len(RECORD_FIELDS))
        self.free_log = self.header[records_end:records_end + n]
        n_tokens = layout.n_slots * layout.window
        self.slots = np.frombuffer(buf, dtype=np.int64, count=n_tokens,
                                   offset=layout.slots_offset).reshape(layout.n_slots, layout.window)
        self.runs = np.frombuffer(buf, dtype=np.int64, count=layout.n_slots * layout.runs_words,
                                  offset=layout.runs_offset).reshape(layout.n_slots, layout.runs_words)

    def write_runs(self, slot: int, runs: np.ndarray):
        """Best fit: the buffer after the batch in `slot` (written by the coordinator)."""
        area = self.runs[slot]
        area[0] = len(runs)
        area[1:1 + runs.size] = runs.ravel()

    def runs_of(self, slot: int) -> np.ndarray:
        """A copy of the runs written for the batch in `slot`, as an (n, 5) int64 array."""
        area = self.runs[slot]
        return area[1:1 + 5 * int(area[0])].reshape(-1, 5).copy()

    def release_views(self):
        """Drop every numpy view so that the underlying buffer can be closed."""
        self.header = self.stats = self.counters = self.slot_states = self.workers = None
        self.records = self.free_log = self.slots = self.runs = None
        self.buf = None


def new_name() -> str:
    return f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}"


class Segment:
    """A /dev/shm segment the trainer created: its name, and `unlink()` (safe to repeat).

    It is created with `os.open`, not `multiprocessing.shared_memory`, so that Python's
    resource tracker never holds it: the tracker would print "leaked shared_memory objects"
    whenever the trainer is killed (SIGTERM, SIGKILL), although the segment is not leaked: the
    trainer unlinks it on close, the coordinator when the trainer dies (`unlink_orphan`), and
    the next loader's start sweeps what is left of a run killed whole (`sweep_stale`)."""

    def __init__(self, name: str):
        self.name = name

    def unlink(self):
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass


def create(layout: RingLayout) -> tuple[Segment, Ring]:
    """Create, reserve and initialise a segment. Only the trainer calls this.

    The trainer's views come from a mapping of its own: CPU batches are lent to the caller as
    views of the ring, and a batch the caller still holds when the loader closes keeps that
    mapping alive (it is unmapped when the last view is freed), while the segment's name is
    unlinked at once."""
    # A Ctrl-C must not land between the segment's creation and `segment` (nobody would
    # unlink it): it is created with SIGINT blocked; one that came meanwhile is raised on
    # leaving the block, and the except below unlinks the segment.
    segment = None
    try:
        with sigint_blocked():
            name = new_name()
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            segment = Segment(name)
        try:
            _reserve(fd, layout.nbytes)
            mapping = mmap.mmap(fd, layout.nbytes)
        finally:
            os.close(fd)
    except BaseException:
        if segment is not None:
            segment.unlink()
        raise
    ring = Ring(mapping, layout, name)
    ring.header[:5] = (MAGIC, LAYOUT_VERSION, layout.n_slots, layout.window, layout.n_workers)
    return segment, ring


def unlink_orphan(name: str):
    """The coordinator's last step when the trainer is gone: a trainer that closes the loader
    unlinks the segment before it lets the children go (`Children.shutdown`), so a segment
    still there was left by a trainer that died; unlink it."""
    Segment(name).unlink()


def ignore_sigint():
    """A child's first step: Ctrl-C is the trainer's. Children are started with SIGINT blocked
    (loader_procs._start); ignoring it before unblocking it drops one that is pending."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def sigint_blocked():
    """Run the body with SIGINT blocked in this thread; a Ctrl-C that came meanwhile is
    delivered on leaving (a KeyboardInterrupt then, in the trainer). Processes created in the
    body inherit the blocked mask, through fork and exec."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _reserve(fd: int, nbytes: int):
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        st = os.statvfs(SHM_DIR)
        free = st.f_bavail * st.f_frsize
        raise OSError(exc.errno, f"shmloader needs {nbytes / 2**20:.1f} MiB of shared memory in "
                      f"{SHM_DIR} but only {free / 2**20:.1f} MiB are free: enlarge /dev/shm "
                      f"(docker: --shm-size) or lower B, T or n_slots") from exc


class Attached:
    """A segment mapped by a process that did not create it (coordinator, workers).

    It maps /dev/shm/<name> directly rather than through SharedMemory, so that the
    attaching process never registers the segment with a resource tracker.
    """

    def __init__(self, name: str, layout: RingLayout):
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        try:
            self._mmap = mmap.mmap(fd, layout.nbytes)
        finally:
            os.close(fd)
        self.ring = Ring(self._mmap, layout, name)
        if self.ring.header[0] != MAGIC or self.ring.header[1] != LAYOUT_VERSION:
            raise RuntimeError(f"shared memory {name} is not a shmloader ring of layout {LAYOUT_VERSION}")

    def close(self):
        self.ring.release_views()
        self._mmap.close()


def attach_unless_gone(name: str, layout: RingLayout, trainer_gone) -> Attached | None:
    """`Attached(name, layout)`, or None when attaching fails and `trainer_gone()` (the alive
    pipe at EOF): the trainer closed the loader or died, and unlinked the segment, before this
    child got to it, so there is nothing to report. A failure while the trainer is alive
    raises as usual."""
    try:
        return Attached(name, layout)
    except Exception:
        if trainer_gone():
            return None
        raise


def creator_pid(name: str) -> int | None:
    if not name.startswith(PREFIX):
        return None
    head = name[len(PREFIX):].split("_", 1)[0]
    return int(head) if head.isdigit() else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Unlink segments whose creating process is gone; returns their names.

    Liveness is judged in this PID namespace: containers that share one /dev/shm
    (`--ipc=host`) but not their PIDs must not run loaders side by side."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    swept = []
    for name in names:
        pid = creator_pid(name)
        if pid is not None and not pid_alive(pid):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                swept.append(name)
            except FileNotFoundError:
                pass
    return swept
