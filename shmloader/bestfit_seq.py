"""Best-fit sequencing: turn counted pieces into per-batch write orders, from lengths alone.

Pure bookkeeping for the coordinator (no processes, no tokens). Documents are numbered in
canonical order (`id = piece base + row`); a *chunk* is up to `chunk_docs` consecutive rows
of one row group with the nulls left out (pieces are cut at chunk boundaries, so a chunk
never spans pieces). Chunks enter `BestFitPlanner` strictly in order; a batch is planned only
when its slot is free and the chunks it needs are counted (a plan that runs out of chunks is
rolled back and retried when more arrive, so timing never changes a plan). Each placement
becomes a write order `(piece, row, batch_row, row_offset, n)` for the worker that holds the
piece; a document leaves its worker's memory with its placement.

The position after batch k is canonical: the buffer (documents by file, row group and row,
as runs, in arrival order) and the end of the last chunk that entered it.
"""
from collections import deque

import numpy as np

from .bestfit import BestFitPlanner


class _NeedMore(Exception):
    pass


class BestFitSequencer:
    def __init__(self, B: int, T: int, n_slots: int, buffer_size: int, n_prefix: int, start_doc_end):
        """`n_prefix` pieces (indices 0..n_prefix-1) rebuild a resumed buffer; `start_doc_end`
        is the position `(epoch, file, rg, doc)` the run starts from."""
        self.B, self.row_len, self.n_slots = B, T + 1, n_slots
        self.buffer_size = buffer_size
        self.planner = None if n_prefix else BestFitPlanner(B, T + 1, buffer_size)
        self.n_prefix = n_prefix
        self.n_freed = 0
        self.planned = 0                      # batches planned
        self.announced = 0
        self._pieces = {}                     # index -> [spec, owner, base, lengths, docs left]
        self._bases = []                      # sorted (base, index) of live pieces
        self._counted = {}                    # counted, waiting for earlier pieces
        self._next_index = 0                  # next piece to turn into chunks
        self._backlog = 0                     # rows of pieces in _counted
        self._next_base = 0
        self._chunks = deque()                # (ids, lengths, end position) not yet in the planner
        self._queued_docs = 0
        self._last_end = start_doc_end        # end of the last chunk taken by the planner
        self._prefix = []                     # (ids, lengths) of the buffer being rebuilt
        self._acks = {}                       # batch -> write orders not yet acknowledged
        self._positions = {}                  # batch -> position after it
        self.tokens_cropped = 0
        self.starved = False                  # the last plan() stopped for want of counted chunks
        self._table = None                    # cache of _lookup()

    @property
    def queued_docs(self) -> int:
        return self._queued_docs

    @property
    def backlog_docs(self) -> int:
        """Documents counted but waiting for an earlier piece."""
        return self._backlog

    def counted(self, piece, owner: int, lengths: np.ndarray, chunk_docs: int):
        self._counted[piece.index] = (piece, owner, np.asarray(lengths, dtype=np.int64))
        self._backlog += len(lengths)
        while self._next_index in self._counted:
            piece, owner, lengths = self._counted.pop(self._next_index)
            self._backlog -= len(lengths)
            base = self._next_base
            self._next_base += len(lengths)
            self._next_index += 1
            live = int(np.count_nonzero(lengths))
            if live:
                self._pieces[piece.index] = [piece, owner, base, lengths, live]
                self._bases.append((base, piece.index))
                self._table = None
            if piece.index < self.n_prefix:
                self._add_prefix(base, lengths)
            else:
                self._add_chunks(piece, base, lengths, chunk_docs)

    def _add_prefix(self, base, lengths):
        keep = np.flatnonzero(lengths)
        self._prefix.append((base + keep, lengths[keep]))
        if self._next_index == self.n_prefix:
            ids = np.concatenate([i for i, _ in self._prefix])
            lens = np.concatenate([n for _, n in self._prefix])
            self.planner = BestFitPlanner.from_buffer(self.B, self.row_len, self.buffer_size, ids, lens)
            self._prefix = []

    def _add_chunks(self, piece, base, lengths, chunk_docs):
        for lo in range(0, len(lengths), chunk_docs):
            part = lengths[lo:lo + chunk_docs]
            keep = np.flatnonzero(part)
            end = (piece.epoch, piece.file, piece.rg, piece.doc_start + lo + len(part))
            self._chunks.append((base + lo + keep, part[keep], end))
            self._queued_docs += len(keep)

    def freed(self, batch: int):
        self.n_freed += 1  # in any order: at most n_slots batches are planned and not freed

    def plan(self) -> list[tuple[int, dict]]:
        """Plan every batch whose slot is free and whose chunks are counted.
        Returns `(batch, {worker: [(piece, row, batch_row, row_offset, n), ...]})`."""
        out = []
        self.starved = False  # set again below if a free slot waits for documents
        while self.planner is not None and self.planned < self.n_freed + self.n_slots:
            orders = self._try_plan()
            if orders is None:
                break
            out.append((self.planned, orders))
            self._acks[self.planned] = len(orders)
            self.planned += 1
        return out

    def _try_plan(self):
        got = plan_from(self.planner, self._chunks)
        if got is None:
            self.starved = True
            return None
        plan, taken = got
        self.starved = False
        for ids, _, end in taken:
            self._queued_docs -= len(ids)
            self._last_end = end
        self.tokens_cropped += plan.n_cropped
        self._positions[self.planned] = (self._last_end, self.buffer_runs())
        return self._orders(plan)

    def _orders(self, plan) -> dict:
        orders = {}
        pieces = self._piece_of(plan.doc_id).tolist()  # before any piece leaves below
        for r, off, doc, n, index in zip(plan.row.tolist(), plan.row_offset.tolist(),
                                         plan.doc_id.tolist(), plan.n_tokens.tolist(), pieces):
            entry = self._pieces[index]
            orders.setdefault(entry[1], []).append((index, doc - entry[2], r, off, n))
            entry[4] -= 1
            if entry[4] == 0:
                del self._pieces[index]
                self._bases.remove((entry[2], index))
                self._table = None
        return orders

    def buffer_runs(self) -> np.ndarray:
        """The buffer in arrival order as runs `[epoch, file, rg, row, count]` (an (n, 5) array)."""
        bases, _, table = self._lookup()
        return runs_of(self.planner.buffered_ids(), bases, table)

    def _lookup(self):
        """(bases, piece indices, [epoch, file, rg, doc_start - base]) of the live pieces, as
        arrays; rebuilt only when a piece comes or goes, not for every batch."""
        if self._table is None:
            live = [self._pieces[i] for _, i in self._bases]
            self._table = (np.array([b for b, _ in self._bases], dtype=np.int64),
                           np.array([i for _, i in self._bases], dtype=np.int64),
                           np.array([(p.epoch, p.file, p.rg, p.doc_start - base)
                                     for p, _, base, _, _ in live], dtype=np.int64).reshape(-1, 4))
        return self._table

    def _rows_of(self, doc_ids: np.ndarray) -> np.ndarray:
        """Which live piece (row of the lookup table) holds each document."""
        return np.searchsorted(self._lookup()[0], doc_ids, side="right") - 1

    def _piece_of(self, doc_ids: np.ndarray) -> np.ndarray:
        return self._lookup()[1][self._rows_of(doc_ids)]

    def written(self, batch: int):
        self._acks[batch] -= 1

    def ready(self) -> list[tuple[int, tuple]]:
        out = []
        while self._acks.get(self.announced) == 0:
            del self._acks[self.announced]
            out.append((self.announced, self._positions.pop(self.announced)))
            self.announced += 1
        return out


def plan_from(planner: BestFitPlanner, chunks: deque, safe: bool = False):
    """Plan one batch, taking chunks `(ids, lengths, end)` from the left of `chunks`; returns
    `(plan, chunks taken)`, or None after undoing everything when they run out (timing never
    changes a plan). `safe`: the caller knows they cannot run out, so no snapshot is taken."""
    snapshot, taken = (None if safe else planner.snapshot()), []

    def next_chunk():
        if not chunks:
            raise _NeedMore
        chunk = chunks.popleft()
        taken.append(chunk)
        return chunk[0], chunk[1]

    try:
        plan = planner.plan_batch(next_chunk)
    except _NeedMore:
        assert snapshot is not None, "a plan called safe ran out of chunks"
        planner.restore(snapshot)
        chunks.extendleft(reversed(taken))
        return None
    return plan, taken


def runs_of(ids: np.ndarray, bases: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Documents `ids` (in arrival order) as runs `[epoch, file, rg, row, count]` of consecutive
    rows: `bases` are the sorted first ids of the pieces holding them and `table` their
    `[epoch, file, rg, doc_start - base]`."""
    if not len(ids):
        return np.zeros((0, 5), dtype=np.int64)
    meta = table[np.searchsorted(bases, ids, side="right") - 1]
    rows = meta[:, 3] + ids
    same = np.ones(len(ids), dtype=bool)
    same[1:] = (meta[1:, :3] == meta[:-1, :3]).all(axis=1) & (rows[1:] == rows[:-1] + 1)
    same[0] = False
    starts = np.flatnonzero(~same)
    counts = np.diff(np.append(starts, len(ids)))
    return np.column_stack((meta[starts, :3], rows[starts], counts))
