"""BOS-aligned best-fit packing, planned over document lengths only.

Algorithm (docs/contract.md §2 `bos_bestfit`, the rule of nanochat's current loader). Documents arrive in
canonical order, a chunk (up to `tokenizer_batch_size` consecutive documents) at a time. Before
EACH placement the buffer is topped up, one whole chunk at a time, until it holds at least
`buffer_size` documents. A batch is B rows of `row_len = T + 1` tokens; each row is filled from
empty by repeating:

1. take the LONGEST buffered document whose length <= space left, the earliest-buffered on
   ties, and place it whole;
2. when no document fits, take the SHORTEST buffered document, the earliest-buffered on ties,
   place its first `space_left` tokens and drop the rest (the cropped tail); the row is full.

Rows never continue into the next batch; the buffer carries over to it.

Data structure. The buffer is a Python list of int keys kept sorted, one key per document:
`key = length * 2**40 - arrival`, so keys order by length, and within one length the earliest
arrival has the largest key. Rule 1 is one `bisect_right(keys, space * 2**40) - 1`; rule 2 is
`keys[0]` (the shortest length) and one more bisect for the earliest of that length. A choice
is O(log n) compares plus one `list.pop` memmove; a chunk enters with one `list.sort`, which
keeps the sorted buffer as one run and merges the chunk in one pass (no per-document `insort`
memmove). Its cost against nanochat's linear scan: `python tools/bench/packing.py`
(docs/benchmarks.md). A dict keyed by
the same keys, in insertion order, maps each key to its doc id and gives the buffer in
arrival order for checkpoints. Arrivals are at most 2**40 per planner (renumbered from 0 on
`from_buffer`); lengths are Python ints, so any length >= 1 works.

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

_SHIFT = 40
_M = 1 << _SHIFT  # arrival numbers live below 2**40


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
        self._keys: list[int] = []          # sorted; key = length * 2**40 - arrival
        self._ids: dict[int, int] = {}      # key -> doc id, in arrival order
        self._arrivals = 0
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

    def snapshot(self):
        """Everything `restore` needs to undo a `plan_batch` (O(n) copies)."""
        return list(self._keys), dict(self._ids), self._arrivals, self.tokens_placed, self.tokens_cropped

    def restore(self, snapshot) -> None:
        keys, ids, self._arrivals, self.tokens_placed, self.tokens_cropped = snapshot
        self._keys, self._ids = list(keys), dict(ids)

    def buffered_ids(self) -> np.ndarray:
        """The doc ids of the buffer in arrival order (what `buffered` gives, without lengths)."""
        return np.fromiter(self._ids.values(), dtype=np.int64, count=len(self._ids))

    def buffered(self) -> tuple[np.ndarray, np.ndarray]:
        """(doc_ids, lengths) of the buffer in arrival order: what a checkpoint records."""
        lengths = [-(-key >> _SHIFT) for key in self._ids]  # ceil(key / 2**40)
        return (np.array(list(self._ids.values()), dtype=np.int64),
                np.array(lengths, dtype=np.int64))

    def _add(self, doc_ids: np.ndarray, lengths: np.ndarray) -> None:
        a0 = self._arrivals
        if a0 + lengths.size >= _M:
            raise ValueError("more than 2**40 documents through one planner; rebuild it "
                             "with from_buffer(*buffered()) to renumber arrivals")
        # Python ints, not int64: a length above 2**23 would overflow `length << 40`.
        keys = [(n << _SHIFT) - a for a, n in enumerate(lengths.tolist(), a0)]
        self._arrivals = a0 + len(keys)
        self._ids.update(zip(keys, doc_ids.tolist()))
        self._keys += keys
        self._keys.sort()  # timsort keeps the sorted prefix as one run and merges the chunk

    def plan_batch(self, next_chunk: ChunkSource) -> BatchPlan:
        """Plan B rows, pulling chunks from `next_chunk()` as the top-up rule asks.

        `next_chunk()` returns (doc_ids, lengths), int arrays of one size (0 is allowed);
        it must raise, not return empty chunks forever, when its documents run out."""
        rows, offs, ids, ntok = [], [], [], []
        keys, id_of, row_len, want = self._keys, self._ids, self.row_len, self.buffer_size
        cropped = 0
        for r in range(self.B):
            space = row_len
            while space:
                while len(keys) < want and not self.drained:
                    try:
                        self._add(*_check_chunk(*next_chunk()))
                    except Drained:
                        self.drained = True
                if not keys:
                    raise Drained(f"no document left for row {r} of the batch")
                i = bisect_right(keys, space << _SHIFT) - 1  # longest fitting, earliest
                if i < 0:  # nothing fits whole: the shortest, earliest on ties
                    i = bisect_right(keys, -(-keys[0] >> _SHIFT) << _SHIFT) - 1
                key = keys.pop(i)
                length = -(-key >> _SHIFT)
                n = length if length < space else space
                rows.append(r)
                offs.append(row_len - space)
                ids.append(id_of.pop(key))
                ntok.append(n)
                cropped += length - n
                space -= n
        self.tokens_placed += self.B * row_len
        self.tokens_cropped += cropped
        return _plan(rows, offs, ids, ntok, cropped)


def _plan(rows, offs, ids, ntok, cropped) -> BatchPlan:
    as64 = lambda xs: np.array(xs, dtype=np.int64)
    return BatchPlan(as64(rows), as64(offs), as64(ids), as64(ntok), int(cropped))
