"""The ring's layout: one shared-memory segment (segment.py) holding a header and `n_slots`
slots of `window` int64 tokens, seen as numpy views (`Ring`); with positions (`positions=True`,
packing/positions.py) each slot's window is followed by its batch's B*T int64 positions, in
the same row (`Ring.rows`: tokens then positions, one contiguous block a slot, which the
trainer maps or copies whole; `Ring.slots` and `Ring.positions` are its two parts, and the
batch's check reads the tokens only); a buffered packing adds one
*buffer area* per slot: the buffer after the slot's batch as the state will hold it (its
text and crc, `packing.runs.encode_buffer`), so that the trainer copies a short text per batch and
computes nothing.

Used by every process; it imports neither side. The protocol that moves slots between them is
NOTE [ring protocol] in ipc/protocol.py, and the header's handover logs NOTE [slot handover] in
ipc/handover.py. A zeroed segment is a valid, empty ring: every counter starts at zero.
"""
import enum
import zlib
from dataclasses import dataclass

import numpy as np

MAGIC = 0x73686D6C6F616472  # "shmloadr"
LAYOUT_VERSION = 13  # 5: a slot's buffer is its state text, not int64 runs; 6: workers' BEAT; 7: the batch's check;
#                     8: YIELD_UNTIL; 9: the trainer's TAKEN and WAITING, a worker's RUN and RUN_END; 10: its ENGINE;
#                     11: the trainer's HEAD; 12: its HEAD_BACK and HEAD_GAP_US; 13: a record's read row group
ALIGN = 4096


class Stat(enum.IntEnum):
    """The header's counters (`Ring.stats`), written by the coordinator only."""

    TOKENS = 0        # tokens counted (BOS included)
    DOCS = 1          # documents with text
    NULLS = 2         # null documents
    PIECES = 3        # pieces counted
    CROPPED = 4       # tokens cropped (best fit)
    EPOCH = 5         # epoch of the last announced batch
    SKIPPED_RG = 6    # bad row groups (and files) skipped
    PLACED = 7        # tokens planned into batches (best fit)
    CACHE_HITS = 8    # pieces served by the token cache
    CACHE_MISSES = 9  # pieces tokenized with a cache
    BEAT = 10         # bumped at every turn of the coordinator's loop (at least once a second)


class Counter(enum.IntEnum):
    """The slot handover's counters (`Ring.counters`; handover.py), after the stats, and the
    trainer's word to the workers (YIELD_UNTIL)."""

    ANNOUNCED = 0     # batches announced (coordinator)
    MESSAGES = 1      # messages queued for the trainer's pipe (coordinator)
    FREES = 2         # frees logged (trainer)
    FREES_SEEN = 3    # frees the coordinator has taken from the log (coordinator)
    YIELD_UNTIL = 4   # not the handover's: until when (CLOCK_MONOTONIC us) the workers give way to
    #                   another loader of the trainer that is starting, 0: they don't (procs/precedence.py)
    TAKEN = 5         # batches the trainer has taken (trainer): an idle release waits for it to stand still
    WAITING = 6       # 1 while the trainer is blocked in next() for a batch (trainer): never a release then
    HEAD = 7          # batches the trainer made itself and returned (trainer; procs/headstart.py): taken too
    HEAD_BACK = 8     # of those, the ones the caller has given back (trainer): as a freed slot (procs/idle.py)
    HEAD_GAP_US = 9   # the longest gap between those given back (trainer, microseconds; written before HEAD_BACK)


# One announcement (`Ring.records[k % n_slots]`, written by the coordinator for batch k); "check"
# is `ring.batch_check` of the slot's tokens, which a state resuming at batch k carries.
RECORD_FIELDS = ("batch", "slot", "epoch", "file", "rg", "doc", "skip", "docs", "check", "read_epoch", "read_file",
                 "read_rg")


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
    BEAT = 8          # bumped while it works (every piece, between runs of documents) and once a
    #                   second while idle: a started worker whose beat stands still is stalled (children.py)
    EPOCH = 9         # the piece's epoch and
    END = 10          # its end (a document), with FILE, RG and DOC: what a death or stall held
    RUN = 11          # the documents [RUN, RUN_END) of the piece inside the engine now (-1 while the piece
    RUN_END = 12      # is read): where a death or stall happened (procs/heal.py)
    ENGINE = 13       # the engine it tokenizes with now, a code (data/engine.py `Engines.state`; 0: none yet)


CHECK_STRIDE = 16  # batch_check reads every 16th token of a slot


def batch_check(tokens: np.ndarray) -> int:
    """The check of a batch: crc32 of every `CHECK_STRIDE`-th token of its slot's window (int64),
    from the first. The coordinator writes it into the batch's announcement; a state carries
    the check of the batch it resumes at, and a resumed loader compares its first batch's
    (loader.py). A window of 32K tokens costs 7-13 us here; all of them ~80 us a batch, a
    share of one core the coordinator would take from the workers at a GPU node's rate. A
    file replaced by other text changes nearly every token after its first change (concat) or
    the rows holding its documents (best fit), so a sample catches it; an edit that keeps
    every token count and changes only tokens between samples is not caught."""
    return zlib.crc32(np.ascontiguousarray(tokens[::CHECK_STRIDE]))


WORKER_FIELDS = tuple(c.name.lower() for c in WorkerCol)
STATS_FIELDS = tuple(s.name.lower() for s in Stat)
FIXED_WORDS = 5 + len(STATS_FIELDS) + len(Counter)


@dataclass(frozen=True)
class RingLayout:
    n_slots: int
    window: int
    n_workers: int
    max_runs: int = 0  # a buffered packing: room per slot for the buffer's runs after its batch
    positions: int = 0  # int64 positions per slot after its window (B*T with positions=True, else 0)

    @property
    def row_words(self) -> int:
        """int64 words of one slot: its window of tokens, then its positions."""
        return self.window + self.positions

    @property
    def header_words(self) -> int:
        return (FIXED_WORDS + self.n_workers * len(WORKER_FIELDS)
                + self.n_slots * (len(RECORD_FIELDS) + 1))  # the records, then the free log

    @property
    def slots_offset(self) -> int:
        raw = self.header_words * 8
        return (raw + ALIGN - 1) // ALIGN * ALIGN

    @property
    def buffer_offset(self) -> int:
        return self.slots_offset + self.n_slots * self.row_words * 8

    @property
    def buffer_bytes(self) -> int:
        """Bytes of one slot's buffer area: its text's length and crc, then the text (at most
        `u8:` and 16 hex digits for each of a run's 5 values), in whole words."""
        if not self.max_runs:
            return 0
        return 16 + (3 + 80 * self.max_runs + 7) // 8 * 8

    @property
    def nbytes(self) -> int:
        return self.buffer_offset + self.n_slots * self.buffer_bytes


class Ring:
    """Numpy views of one segment: `header`, `stats` (written by the coordinator only), the
    handover's `counters`, `records` and `free_log` (handover.py), `workers` (row i written by
    worker i only), `rows` (a slot's whole block), its `slots` (the tokens' window) and
    `positions` (None without), and each slot's buffer area (`buffers`, a buffered packing's)."""

    def __init__(self, buf, layout: RingLayout, name: str):
        self.name, self.buf = name, buf
        self.layout = layout
        self.header = np.frombuffer(buf, dtype=np.int64, count=layout.header_words)
        n, stats_end = layout.n_slots, 5 + len(STATS_FIELDS)
        self.stats = self.header[5:stats_end]
        self.counters = self.header[stats_end:FIXED_WORDS]
        workers_end = FIXED_WORDS + layout.n_workers * len(WORKER_FIELDS)
        self.workers = self.header[FIXED_WORDS:workers_end].reshape(layout.n_workers, len(WORKER_FIELDS))
        records_end = workers_end + n * len(RECORD_FIELDS)
        self.records = self.header[workers_end:records_end].reshape(n, len(RECORD_FIELDS))
        self.free_log = self.header[records_end:records_end + n]
        n_words = layout.n_slots * layout.row_words
        self.rows = np.frombuffer(buf, dtype=np.int64, count=n_words,
                                  offset=layout.slots_offset).reshape(layout.n_slots, layout.row_words)
        self.slots = self.rows[:, :layout.window] if layout.positions else self.rows
        self.positions = self.rows[:, layout.window:] if layout.positions else None
        self.buffers = np.frombuffer(buf, dtype=np.uint8, count=layout.n_slots * layout.buffer_bytes,
                                     offset=layout.buffer_offset).reshape(layout.n_slots, layout.buffer_bytes)
        self._buffer_heads = [row[:16].view(np.int64) for row in self.buffers]  # (length, crc)

    def initialise(self):
        """The creator's first write: what `is_valid` checks, and no worker on a piece (the rest
        is zero: an empty ring)."""
        lay = self.layout
        self.workers[:, WorkerCol.PIECE] = -1  # no worker holds a piece before it says so
        self.header[:5] = (MAGIC, LAYOUT_VERSION, lay.n_slots, lay.window, lay.n_workers)

    def is_valid(self) -> bool:
        """Whether the segment holds a ring of this layout."""
        lay = self.layout
        return list(self.header[:5]) == [MAGIC, LAYOUT_VERSION, lay.n_slots, lay.window, lay.n_workers]

    def write_buffer(self, slot: int, text: str | bytes, crc: int):
        """The buffer after the batch in `slot`, as its state text and crc (`packing.runs.BufferText`;
        written by the coordinator before it announces the batch), or bytes the crc field says
        how to read (a mixture's packed point: packing/mixtext.py)."""
        data = text if type(text) is bytes else text.encode("ascii")
        row, head = self.buffers[slot], self._buffer_heads[slot]
        if 16 + len(data) > len(row):
            raise ValueError(f"a buffer text of {len(data)} bytes does not fit a slot's {len(row) - 16}")
        row[16:16 + len(data)] = np.frombuffer(data, dtype=np.uint8)
        head[0], head[1] = len(data), crc

    def buffer_of(self, slot: int) -> tuple[str, int]:
        """`(text, crc)` written for the batch in `slot`, copied out (the trainer's, before the
        slot is freed)."""
        head = self._buffer_heads[slot]
        n = int(head[0])
        return self.buffers[slot, 16:16 + n].tobytes().decode("ascii"), int(head[1])

    def buffer_raw(self, slot: int) -> tuple[bytes, int]:
        """`(bytes, crc field)` written for the batch in `slot`, copied out."""
        head = self._buffer_heads[slot]
        return self.buffers[slot, 16:16 + int(head[0])].tobytes(), int(head[1])

    def release_views(self):
        """Drop every numpy view so that the underlying buffer can be closed."""
        self.header = self.stats = self.counters = self.workers = None
        self.records = self.free_log = self.slots = self.buffers = None
        self.rows = self.positions = None
        self._buffer_heads = []
        self.buf = None
