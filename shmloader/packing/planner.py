"""BOS-aligned best-fit packing, planned over document lengths only.

Algorithm (docs/contract.md §2 `bos_bestfit`, the rule of nanochat's current loader). Documents arrive in
canonical order, a chunk (up to `tokenizer_batch_size` consecutive documents) at a time. Before
EACH placement the buffer is topped up, one whole chunk at a time, until it holds at least
`buffer_size` documents. A batch is B rows of `row_len = T + 1` tokens; each row is filled from
empty by repeating:

1. take the LONGEST buffered document whose length <= space left, the earliest-buffered on
   ties, and place it whole;
2. when no document fits, take the SHORTEST buffered document, the earliest-buffered on ties,
   place its first `space` tokens (the space left) and drop the rest (the cropped tail); the
   row is full.

Rows never continue into the next batch; the buffer carries over to it.

Data structure. The buffer is a Python list of keys (floats or ints: below) kept sorted, one
key per document: `key = length * 2**32 - arrival`, so keys order by length, and within one
length the earliest arrival has the largest key. Rule 1 is one `bisect_right(keys, space *
2**32) - 1`; rule 2 is
`keys[0]` (the shortest length) and one more bisect for the earliest of that length. A choice
is O(log n) compares plus one `list.pop` memmove; a chunk enters sorted (one numpy sort) with
one `list.sort`, which sees the buffer and the chunk as two sorted runs and merges them in one
pass (no per-document `insort` memmove). Its cost against nanochat's linear scan: `python
tools/bench/packing.py` (docs/benchmarks.md). The arrival is an index into the documents that
entered since the last renumbering: arrays of their ids, lengths and whether each is still
buffered, which give the buffer in arrival order for a checkpoint, and for the state the
coordinator writes with every batch, in a few numpy calls. The placement loop does only the
choice: it pops a key and notes its row and offset (~0.5 us a placement here); the keys taken
become ids, lengths and token counts, and are marked gone, in a few whole-array calls at the
batch's end and before a renumbering (B=32, T=2048, a 1,000-document buffer: ~87 placements,
90-107 us of CPU a batch with its chunks' entry; `python tools/bench/bestfit_parts.py`,
docs/benchmarks.md). When more than the buffer again (plus `RENUMBER_SLACK`) has left, the
buffered ones are renumbered 0, 1, ... in order, which keeps the keys' order, so the arrays
stay about twice the buffer (arrivals far below 2**32), however long a long document lingers.
A snapshot (to undo a plan that ran out of chunks) copies the key list and the flags (a few
microseconds), not a dict of the buffer.
Keys are floats where they are exact (lengths below 2**21: every document in practice), whose
comparisons and sort are the interpreter's fastest (a chunk's entry 27 -> 18 us against Python
ints of two digits), and Python ints above, so any length >= 1 works: an int and a float
compare exactly, and a row shorter than 2**21 is ended by such a document whatever a float
reads its length as (its exact length is read later, `_split`); longer rows use exact ints.

Guarantees, for every batch (tests check each against the scan oracle, tests/oracle.py):
- every row is full: its placements tile [0, row_len) exactly, in order, no padding;
- every placement uses a prefix [0, n_tokens) of its document, so each row starts with a
  document's first token (BOS);
- every document in a row is whole except at most one cropped document, the row's last;
- no document is placed twice; each document enters the buffer once and leaves it once;
- the plan equals `plan_batch_scan` (nanochat's scan) placement for placement;
- resume is exact: `from_buffer(..., *planner.buffered())` plans the same next batches as
  `planner`, because the plan depends only on the buffer's (length, arrival order) and the
  chunk source.
Cropping: documents longer than a row are taken only when they are the shortest buffered,
so they accumulate in the buffer and the cropped share rises until it holds mostly them. With
the bench's lognormal lengths it is 4% of tokens read over batches 1-100 and 17% over 1-2000;
nanochat reports ~35% at T=2048 on its web text.
"""

from bisect import bisect_right
from typing import Callable, NamedTuple

import numpy as np

ChunkSource = Callable[[], "tuple[np.ndarray, np.ndarray]"]

_SHIFT = 32
_SCALE = 1 << _SHIFT  # a key's length unit: an int, so that `key // _SCALE` is exact for a key of either type
_FLOAT_EXACT = 1 << 53  # integers below it are exact as floats
_FLOAT_BELOW = _FLOAT_EXACT >> _SHIFT  # lengths whose keys are exact as floats (below 2**21)
RENUMBER_SLACK = 1024  # documents gone from the buffer beyond its size before arrivals are renumbered


class Drained(Exception):
    """Raised by a chunk source that has no document left, ever (a mixture that ended): the
    planner tops up no more and plans from what it holds; raised by `plan_batch` when a row
    cannot be filled from what is left (the batch is not made)."""


class BatchPlan(NamedTuple):
    """One batch's placements, in row order then offset order; all arrays int64."""
    row: np.ndarray         # row index in [0, B)
    row_offset: np.ndarray  # first position in the row
    doc_id: np.ndarray      # the caller's document id
    n_tokens: np.ndarray    # tokens [0, n_tokens) of the document go to the row
    n_cropped: int          # tokens dropped from cropped documents in this batch


def _check_chunk(doc_ids, lengths):
    doc_ids = np.asarray(doc_ids, dtype=np.int64).ravel()
    lengths = np.asarray(lengths, dtype=np.int64).ravel()
    if doc_ids.shape != lengths.shape:
        raise ValueError(f"chunk has {doc_ids.size} doc ids but {lengths.size} lengths; "
                         "the chunk source must return one length per document")
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"chunk has a document of length {lengths.min()}; every document "
                         "holds at least its BOS token, so lengths must be >= 1")
    return doc_ids, lengths


def _check_config(B, row_len, buffer_size):
    for name, v in (("B", B), ("row_len", row_len), ("buffer_size", buffer_size)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


class BestFitPlanner:
    """Best-fit planner with an O(log n) choice; see the module docstring."""

    def __init__(self, B: int, row_len: int, buffer_size: int):
        _check_config(B, row_len, buffer_size)
        self.B, self.row_len, self.buffer_size = int(B), int(row_len), int(buffer_size)
        self._keys: list = []               # sorted; key = length * 2**32 - arrival (a float or an int: module docstring)
        self._ids = np.zeros(0, np.int64)   # doc id by arrival (since the last renumbering)
        self._lengths = np.zeros(0, np.int64)
        self._live = np.zeros(0, bool)      # still buffered
        self.tokens_placed = 0
        self.tokens_cropped = 0
        self.drained = False                # the chunk source has no document left (`Drained`)

    @classmethod
    def from_buffer(cls, B: int, row_len: int, buffer_size: int, doc_ids, lengths,
                    tokens_placed: int = 0, tokens_cropped: int = 0) -> "BestFitPlanner":
        """A planner whose buffer is `buffered()` of another; it plans what that one would."""
        planner = cls(B, row_len, buffer_size)
        planner._add(*_check_chunk(doc_ids, lengths))
        planner.tokens_placed, planner.tokens_cropped = int(tokens_placed), int(tokens_cropped)
        return planner

    def __len__(self) -> int:
        return len(self._keys)

    def snapshot(self) -> "Snapshot":
        """Everything `restore` needs to undo a `plan_batch`: copies of the key list and the
        flags (the arrays of ids and lengths are only ever replaced, never changed in place)."""
        return Snapshot(list(self._keys), self._ids, self._lengths, self._live.copy(),
                        self.tokens_placed, self.tokens_cropped)

    def restore(self, snapshot: "Snapshot") -> None:
        """Back to `snapshot` (any snapshot of this planner, any number of times)."""
        s = snapshot
        self._keys, self._ids, self._lengths = list(s.keys), s.ids, s.lengths
        self._live = s.live.copy()
        self.tokens_placed, self.tokens_cropped = s.tokens_placed, s.tokens_cropped

    def buffered_ids(self) -> np.ndarray:
        """The doc ids of the buffer in arrival order (what `buffered` gives, without lengths)."""
        return self._ids[self._live]

    def buffered(self) -> tuple[np.ndarray, np.ndarray]:
        """(doc_ids, lengths) of the buffer in arrival order: what a checkpoint records."""
        return self._ids[self._live], self._lengths[self._live]

    def _add(self, doc_ids: np.ndarray, lengths: np.ndarray) -> None:
        if self._renumber_due():
            self._renumber()
        a0 = len(self._ids)
        self._ids = np.concatenate((self._ids, doc_ids))
        self._lengths = np.concatenate((self._lengths, lengths))
        self._live = np.concatenate((self._live, np.ones(len(lengths), bool)))
        self._keys += _keys(lengths, a0)  # sorted: the list is two runs, which timsort merges in one pass
        self._keys.sort()

    def _renumber_due(self) -> bool:
        """More than the buffer again (plus `RENUMBER_SLACK`) has left since the last renumbering."""
        return len(self._ids) - len(self._keys) > len(self._keys) + RENUMBER_SLACK

    def _renumber(self) -> None:
        """Number the buffered documents' arrivals 0, 1, ... in order, their keys with them (the
        keys' order is kept: the new numbers keep the old ones' order); new lists and arrays,
        so that a snapshot keeps the old ones."""
        live = self._live
        new = np.cumsum(live) - 1  # new arrival of each buffered one
        lengths, arrivals = _split(self._keys)
        self._keys = _made(lengths, new[arrivals])
        self._ids, self._lengths = self._ids[live], self._lengths[live]
        self._live = np.ones(len(self._ids), bool)

    def plan_batch(self, next_chunk: ChunkSource) -> BatchPlan:
        """Plan B rows, pulling chunks from `next_chunk()` as the top-up rule asks.

        `next_chunk()` returns (doc_ids, lengths), int arrays of one size (0 is allowed);
        it must raise, not return empty chunks forever, when its documents run out.

        The loop only chooses: it pops each placement's key and notes its row and offset; the
        keys taken become ids, lengths and token counts in a few whole-array calls, before a
        renumbering (it changes the arrivals; chunks enter without one) and at the end."""
        keys, row_len, want = self._keys, self.row_len, self.buffer_size
        # a float scale (the interpreter's fastest arithmetic and comparisons) where a row is
        # shorter than every key past a float's exact range (an int key's length, rounded, still
        # ends the row, and is read exactly later: `_split`); else the int scale, exact for a key
        # of either type (a power of two: `space * scale`, `key // scale` exact for a float too)
        scale, full, zero = (float(_SCALE), float(row_len), 0.0) if row_len < _FLOAT_BELOW else (_SCALE, row_len, 0)
        taken, done, rows, offs = [], [], [], []  # keys popped (since the last renumbering); settled; each's row, offset
        # bound methods and the bisect as locals: ~10 us a batch of ~87 placements' lookups
        bisect, pop, take, add_row, add_off = bisect_right, keys.pop, taken.append, rows.append, offs.append
        for r in range(self.B):
            space = full
            while space > zero:
                if len(keys) < want and not self.drained:
                    while len(self._keys) < want and not self.drained:
                        if self._renumber_due():  # it changes the arrivals: the keys taken are settled first
                            done.append(self._take(taken))
                            taken = []
                            take = taken.append
                        try:
                            self._add(*_check_chunk(*next_chunk()))
                        except Drained:
                            self.drained = True
                    keys = self._keys  # a renumbering made a new list
                    pop = keys.pop
                if not keys:
                    raise Drained(f"no document left for row {r} of the batch")
                i = bisect(keys, space * scale) - 1  # longest fitting, earliest
                if i < 0:  # nothing fits whole: the shortest, earliest on ties
                    i = bisect(keys, -(-keys[0] // _SCALE) * _SCALE) - 1  # (exact for a key of either type)
                key = pop(i)
                take(key)
                add_row(r)
                add_off(full - space)
                space += -key // scale  # minus its length
        done.append(self._take(taken))
        return self._plan(done, rows, offs)

    def _take(self, taken: list) -> "tuple[np.ndarray, np.ndarray]":
        """The ids and lengths of the keys `taken` (by the current arrivals), now gone from the
        buffer."""
        lengths, arrivals = _split(taken)
        self._live[arrivals] = False
        return self._ids[arrivals], lengths

    def _plan(self, done: list, rows: list, offs: list) -> BatchPlan:
        """The batch's placements from the ids and lengths taken, in turn, and their rows and
        offsets (floats below 2**21: read as such, exactly)."""
        ids, lengths = done[0] if len(done) == 1 else (np.concatenate(part) for part in zip(*done))
        offset = (np.fromiter(offs, np.float64, len(offs)).astype(np.int64) if self.row_len < _FLOAT_BELOW
                  else np.array(offs, dtype=np.int64))
        n_tokens = np.minimum(lengths, self.row_len - offset)  # only a row's last one is cut
        cropped = int(lengths.sum()) - self.B * self.row_len  # the rows are full
        self.tokens_placed += self.B * self.row_len
        self.tokens_cropped += cropped
        return BatchPlan(np.array(rows, dtype=np.int64), offset, ids, n_tokens, cropped)


class Snapshot(NamedTuple):
    """A planner's state before a plan (`BestFitPlanner.snapshot`), for `restore`."""
    keys: list              # a copy
    ids: np.ndarray
    lengths: np.ndarray
    live: np.ndarray        # a copy
    tokens_placed: int
    tokens_cropped: int


def _keys(lengths: np.ndarray, a0: int) -> list:
    """The keys of documents of `lengths` arriving from `a0` on, sorted (`_made`'s)."""
    if not lengths.size:
        return []
    arrivals = np.arange(a0, a0 + len(lengths), dtype=np.int64)
    if int(lengths.max()) < _FLOAT_BELOW:
        return np.sort((lengths << _SHIFT) - arrivals).astype(np.float64).tolist()
    return sorted(_made(lengths, arrivals))


def _made(lengths: np.ndarray, arrivals: np.ndarray) -> list:
    """The keys `length * 2**32 - arrival` (arrivals below 2**32) of int64 arrays, in their
    order: floats where they are exact (lengths below 2**21, every document in practice),
    whose comparisons and sort are the interpreter's fastest; Python ints above (exact at any
    size; an int and a float compare exactly)."""
    if int(lengths.max(initial=0)) < _FLOAT_BELOW:
        return ((lengths << _SHIFT) - arrivals).astype(np.float64).tolist()
    return [float((n << _SHIFT) - a) if n < _FLOAT_BELOW else (n << _SHIFT) - a
            for n, a in zip(lengths.tolist(), arrivals.tolist())]


def _split(keys: list) -> "tuple[np.ndarray, np.ndarray]":
    """(lengths, arrivals) of `keys`, int64 arrays."""
    top = max(keys, default=0)
    if top < 1 << 63:  # keys are positive
        k = (np.fromiter(keys, np.float64, len(keys)).astype(np.int64) if top < _FLOAT_EXACT
             else np.array(keys, dtype=np.int64))  # (the floats' own reading is the faster)
        lengths = -(-k >> _SHIFT)
        return lengths, (lengths << _SHIFT) - k
    lengths = [int(-(-key // _SCALE)) for key in keys]
    return (np.array(lengths, dtype=np.int64),
            np.array([(n << _SHIFT) - int(key) for n, key in zip(lengths, keys)], dtype=np.int64))
