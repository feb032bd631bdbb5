"""BOS-aligned best-fit packing (nanochat's current loader): counted pieces into per-batch write
orders, from lengths alone.

Pure bookkeeping for the coordinator (no processes, no tokens). The rule is the planner's
(`planner.BestFitPlanner`, docs/contract.md §2); a slot holds a batch's inputs (B, T) and then
its targets (B, T), so that both come out contiguous. Documents are numbered in
canonical order (`id = piece base + row`, one id left out where the next piece does not go on
in its row group, so that the buffer's runs are its stretches of consecutive ids: ~18 us a
batch for a 1,000-document buffer, `PieceTable.numbered_runs`); a *chunk* is up to `chunk_docs` consecutive rows
of one row group with the nulls left out (pieces are cut at chunk boundaries, so a chunk
never spans pieces). Chunks enter `BestFitPlanner` strictly in order; a batch is planned only
when its slot is free and the chunks it needs are counted (a plan that runs out of chunks is
rolled back and retried when more arrive, so timing never changes a plan). Each placement
becomes a write order `(piece, row, batch_row, row_offset, n)` for the worker that holds the
piece; a document leaves its worker's memory with its placement.

The position after batch k is canonical: the buffer (documents by file, row group and row,
as runs, in arrival order) and the end of the last chunk that entered it. `Chunks` and
`PieceTable` serve the sequencer and `BestFitLocator`, which replays the same planner over a
rank's document lengths to find its position at a batch count (a rank given another rank's
state). The coordinator's mode of best fit, one source's or a mixture's, is one
(packing/mixbestfit.py `MixBestFitMode`; one source's `SourceBestFitMode` is it made of one
source's parts: its pieces cut as these `Chunks` cut them, `add`, as they pass its stream,
this `PieceTable`, `where_one_source_stands`); a worker keeps
each counted piece's documents until each is placed (`_Docs`) and writes the placements a
`Rows` order names (`write`);
`PACKING` is the spec the rest of the loader reads.
"""
from collections import Counter, deque
from typing import NamedTuple

import numpy as np

from ..data.order import buffer_pieces, ramp_for
from ..position import Position
from .base import UNCAPPED, BatchBook, Complete, Found, InOrder, Packing
from .planner import BestFitPlanner, Drained
from .positions import fill_prefix


PRUNE_ROWS = 4096  # rows placed kept (for `unplaced`) before those of pieces gone are dropped, at least


class Rows(NamedTuple):
    """Coordinator -> worker: write these documents' tokens into batch `batch`'s slot.
    Pickled as its placements' bytes (`_rows`): ~1.5 us against ~5 us for as many tuples."""
    batch: int
    slot: int
    placements: np.ndarray         # (n, 5) int64, a placement a row: [piece, row, batch_row, row_offset, n]

    def __reduce__(self):
        return _rows, (self.batch, self.slot, np.asarray(self.placements, dtype=np.int64).tobytes())


def _rows(batch: int, slot: int, placements: bytes) -> Rows:
    return Rows(batch, slot, np.frombuffer(placements, dtype=np.int64).reshape(-1, 5))


def placement_rows(placements) -> list:
    """A `Rows`' placements as a list of 5-lists (or what a test built: 5-tuples); the mixture's
    mode reads them too (packing/mixbestfit.py `holding`)."""
    return placements.tolist() if type(placements) is np.ndarray else placements


class _NeedMore(Exception):
    pass


class Chunks:
    """Counted documents waiting to enter a planner, as chunks `(ids, lengths, end)` in order;
    `end` is the position `(epoch, file, rg, doc)` after the chunk, `last_end` that of the
    last chunk a plan took."""

    dry = False                       # chunks that ended (a stream's: packing/mixchunks.py `_Pulled`)

    def __init__(self, chunk_docs: int, last_end: tuple):
        self.chunk_docs, self.last_end = chunk_docs, last_end
        self.docs = 0                 # documents queued
        self._queue = deque()

    def add(self, piece, base: int, lengths: np.ndarray, live: np.ndarray | None = None):
        """The rows of `piece`, whose first document has id `base`; `live`: its rows with a
        document (`np.flatnonzero(lengths)`, if the caller has it). The documents of every chunk
        in a few whole-array calls, each chunk a pair of slices of them (a piece of 1,024 rows
        is 8 chunks: 32 -> 20 us a piece against a lookup of the rows kept per chunk, docs/benchmarks.md
        "Best fit's coordinator, by part")."""
        n, step = len(lengths), self.chunk_docs
        if live is None:
            live = np.flatnonzero(lengths)
        ids, kept = live + base, lengths[live]
        cuts = np.searchsorted(live, range(step, n, step)).tolist()  # each chunk's first live row
        at, start, q = 0, piece.doc_start, self._queue
        for lo, to in zip(range(0, n, step), cuts + [len(live)]):
            q.append((ids[at:to], kept[at:to], (piece.epoch, piece.file, piece.rg, start + min(lo + step, n))))
            at = to
        self.docs += len(live)

    def _more(self) -> bool:
        """One more chunk into the queue, if one can be made now (here: never, they are added)."""
        return False

    def _drained(self) -> bool:
        """No chunk will ever come again (here: never; a mixture that ended)."""
        return False

    def _ran_out(self):
        """A plan ran out of chunks and was undone."""

    def plan(self, planner: BestFitPlanner, safe: bool = False):
        """Plan one batch from the queued chunks; None after undoing everything when they run
        out (timing never changes a plan). `safe`: the caller knows they cannot run out, so no
        snapshot is taken."""
        snapshot, taken = (None if safe else planner.snapshot()), []

        def next_chunk():
            if not self._queue and not self._more():
                raise Drained if self._drained() else _NeedMore
            chunk = self._queue.popleft()
            taken.append(chunk)
            return chunk[0], chunk[1]

        try:
            plan = planner.plan_batch(next_chunk)
        except (_NeedMore, Drained):
            assert snapshot is not None, "a plan called safe ran out of chunks"
            planner.restore(snapshot)
            self._queue.extendleft(reversed(taken))
            self._ran_out()
            return None
        for ids, _, end in taken:
            self.docs -= len(ids)
            self.last_end = end
        return plan


class PieceTable:
    """The pieces holding live documents, by their first document id (added in id order):
    which piece holds a document, and documents as runs `[epoch, file, rg, row, count]`."""

    def __init__(self):
        self._rows = np.zeros((0, 7), dtype=np.int64)  # [base, epoch, file, rg, doc_start - base, index, owner]
        self._new = []                # rows added since the arrays were last made
        self._gone = []               # piece indices removed since then
        self._held = set()            # the live pieces' indices
        self._arrays = None           # (bases, indices, table, owners): made again when a piece came or went
        self._heads_of = self._head_rows = None  # `_heads`' rows, and the arrays they were made from

    def add(self, base: int, piece, owner: int = 0):
        if piece.index in self._gone:  # back after it left: its old row goes first
            self._tables()
        self._held.add(piece.index)
        self._new.append((base, piece.epoch, piece.file, piece.rg, piece.doc_start - base, piece.index, owner))
        self._arrays = None

    def remove(self, index: int):
        self._held.remove(index)      # a KeyError for a piece not in the table
        self._gone.append(index)
        self._arrays = None

    def _tables(self):
        """The live pieces' rows as arrays, the new ones appended and the gone ones dropped in a
        few whole-array calls (hundreds of pieces stay live while their documents linger in a
        best-fit buffer: a table made again from every piece took most of a batch's planning)."""
        if self._arrays is None:
            rows = self._rows
            if self._new:
                rows = np.concatenate((rows, np.array(self._new, dtype=np.int64)))
                self._new = []
            if self._gone:
                rows = rows[~np.isin(rows[:, 5], self._gone)]
                self._gone = []
            self._rows = rows
            self._arrays = rows[:, 0].copy(), rows[:, 5].copy(), np.ascontiguousarray(rows[:, 1:5]), rows[:, 6].copy()
        return self._arrays

    def piece_of(self, ids: np.ndarray) -> np.ndarray:
        bases, indices, *_ = self._tables()
        return indices[np.searchsorted(bases, ids, side="right") - 1]

    def rows_of(self, ids: np.ndarray) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
        """(the piece each of documents `ids` is in, its row there counted from the piece's base,
        the piece's owner as `add` was told)."""
        bases, indices, _, owners = self._tables()
        at = np.searchsorted(bases, ids, side="right") - 1
        return indices[at], ids - bases[at], owners[at]

    def file_of(self, ids: np.ndarray) -> np.ndarray:
        """The file (the run's numbering) each of documents `ids` is in."""
        bases, _, table, _ = self._tables()
        return table[np.searchsorted(bases, ids, side="right") - 1, 1]

    def runs(self, ids: np.ndarray, lead=None) -> np.ndarray:
        """Documents `ids` (in arrival order) as runs of consecutive rows, an (n, 5) array. A run
        goes on while the next document is the next row of the same row group; the row groups
        are compared only where the piece changes (every step works on whole arrays, the few
        piece changes aside); any order of ids (a mixture's arrival order; the sequencer's own
        buffer, in id order, takes `numbered_runs`). `lead(pieces)`: each run's leading columns
        from its piece's `[epoch, file, rg]` (an (m, 3) array, a row a piece) instead of those (a
        mixture's: packing/mixbestfit.py)."""
        n = len(ids)
        if not n:
            return np.zeros((0, 5 if lead is None else lead(np.zeros((0, 3), dtype=np.int64)).shape[1] + 2),
                            dtype=np.int64)
        bases, _, table, _ = self._tables()
        at = np.searchsorted(bases, ids, side="right") - 1  # each document's piece, as a table row
        rows = table[:, 3][at] + ids
        new = np.empty(n, dtype=bool)
        new[0] = True
        np.not_equal(rows[1:], rows[:-1] + 1, out=new[1:])
        seam = np.flatnonzero(~new[1:] & (at[1:] != at[:-1])) + 1  # the next row, in another piece
        if len(seam):
            new[seam] = (table[at[seam], :3] != table[at[seam - 1], :3]).any(axis=1)
        starts = np.flatnonzero(new)
        if lead is not None:
            head = lead(table[:, :3])[at[starts]]
            out = np.empty((len(starts), head.shape[1] + 2), dtype=np.int64)
            out[:, :-2] = head
            out[:, -2] = rows[starts]
            out[:, -1] = np.diff(starts, append=n)
            return out
        out = np.empty((len(starts), 5), dtype=np.int64)
        out[:, :3] = table[at[starts], :3]
        out[:, 3] = rows[starts]
        out[:, 4] = np.diff(starts, append=n)
        return out

    def numbered_runs(self, ids: np.ndarray) -> np.ndarray:
        """`runs(ids)` for increasing `ids` numbered as `BestFitSequencer` numbers them (the next
        id runs on from a piece's last row only into the next rows of its row group, a gap of
        one id elsewhere): a run is a stretch of consecutive ids, so only each run's first
        document is looked up, and no row group compared; its piece's values are taken whole
        from `_heads` (22 -> 18 us a 1,000-run buffer, cache-warm, against four columns
        written). (A buffer holds mostly documents longer than a row, which linger: most runs
        are one document long.)"""
        n = len(ids)
        if not n:
            return np.zeros((0, 5), dtype=np.int64)
        starts = np.flatnonzero(ids[1:] != ids[:-1] + 1)
        starts += 1
        starts = np.concatenate(([0], starts))
        first = ids[starts]
        bases, heads = self._heads()
        out = np.take(heads, np.searchsorted(bases, first, side="right") - 1, axis=0)
        out[:, 3] += first
        out[:-1, 4] = starts[1:] - starts[:-1]
        out[-1, 4] = n - starts[-1]
        return out

    def _heads(self) -> "tuple[np.ndarray, np.ndarray]":
        """(bases, each live piece's run values `[epoch, file, rg, doc_start - base, 0]`), made
        again with the table's arrays."""
        arrays = self._tables()
        if self._heads_of is not arrays:
            heads = np.zeros((len(arrays[2]), 5), dtype=np.int64)
            heads[:, :4] = arrays[2]
            self._heads_of, self._head_rows = arrays, heads
        return arrays[0], self._head_rows


class BestFitSequencer:
    """Best fit's planning of one run, one source's or a mixture's: counted pieces numbered
    (`number`), their documents entering the planner a chunk at a time (`chunks`), each batch
    planned when its slot is free, its write orders by worker and what it announces once written
    (`sink`). What differs between one source and a mixture is its parts, given where it is made
    (packing/mixbestfit.py: `source_sequencer` makes one source's, `mix_sequencer` a mixture's):
    its `chunks` (cut from what its stream passes or mixes: which pieces are the sequencer's own
    order, the resumed buffer's, is theirs to say, `arrive`), its `table` (a mixture's knows each
    piece's source) and its `sink` (`where_one_source_stands`; a mixture's point and buffer)."""

    def __init__(self, B: int, T: int, n_slots: int, buffer_size: int, n_prefix: int, *, chunks: Chunks,
                 table: PieceTable, sink):
        """`n_prefix` pieces (indices 0..n_prefix-1) rebuild a resumed buffer. The parts, each
        required (packing/mixbestfit.py: one source's `source_sequencer`, a mixture's
        `mix_sequencer`): `chunks` (where the run starts is theirs, `last_end`), `table` and
        `sink` (`sink(seq, plan)`: the `Complete` of the batch just planned)."""
        self.B, self.row_len = B, T + 1
        self.buffer_size = buffer_size
        self.planner = None if n_prefix else BestFitPlanner(B, T + 1, buffer_size)
        self.n_prefix = n_prefix
        self.book = BatchBook(n_slots)
        self.chunks, self.table, self._sink = chunks, table, sink
        self.planned = 0                      # batches planned
        self._pieces = {}                     # index -> [owner, its live rows, how many are not placed]
        self._placed_rows = []                # (pieces, rows) placed, arrays: those of pieces gone pruned
        self._placed_n, self._prune_at = 0, PRUNE_ROWS  # rows in it; when it is pruned next
        self._counted = InOrder()             # the resumed buffer's counted pieces, taken in index order
        self.backlog_docs = 0                 # rows of those counted but waiting for an earlier one
        self._next_base = 0
        self._last_end = None                 # (epoch, file, rg, doc_end) of the piece numbered last
        self._prefix = []                     # (ids, lengths) of the buffer being rebuilt
        self._positions = {}                  # batch -> its `Complete`, once planned
        self.tokens_cropped = 0
        self.docs_placed = 0                  # documents placed in rows (whole or cropped)
        self.starved = False                  # the last plan() stopped for want of counted chunks
        self._starved_news = None             # chunks.news() when it did (what a plan that ran out waits for)

    def counted(self, piece, owner: int, lengths: np.ndarray):
        """`piece`, held by `owner`, was counted: into the chunks as they take it (`chunks.arrive`:
        the resumed buffer's back to `in_order`)."""
        self.chunks.arrive(self, piece, owner, np.asarray(lengths, dtype=np.int64))

    def in_order(self, piece, owner: int, lengths: np.ndarray):
        """A counted piece of the sequencer's own order, the resumed buffer's (`0..n_prefix-1`),
        numbered once those before it are; with the last, the planner is rebuilt from them."""
        self.backlog_docs += len(lengths)
        for _, (piece, owner, lengths) in self._counted.add(piece.index, (piece, owner, lengths)):
            self.backlog_docs -= len(lengths)
            base, _ = self.number(piece, owner, lengths)
            self._add_prefix(base, lengths, last=piece.index == self.n_prefix - 1)

    def number(self, piece, owner: int, lengths: np.ndarray) -> "tuple[int, np.ndarray]":
        """Documents get ids `base + row` (pieces numbered in the order they are counted); a piece
        with documents is `owner`'s until every one is placed. One id is left out before a piece
        that does not go on from the last one's end in its row group, so that consecutive ids
        are consecutive rows of one row group (`PieceTable.numbered_runs`). Returns `base` and the
        piece's rows with a document (`np.flatnonzero(lengths)`)."""
        base = self._next_base + (self._last_end != (piece.epoch, piece.file, piece.rg, piece.doc_start))
        self._next_base = base + len(lengths)
        self._last_end = (piece.epoch, piece.file, piece.rg, piece.doc_end)
        live = np.flatnonzero(lengths)
        if len(live):
            self._pieces[piece.index] = [owner, live, len(live)]
            self.table.add(base, piece, owner)
        return base, live

    def _add_prefix(self, base, lengths, last: bool):
        """A piece of the resumed buffer; with the `last` one, the planner is rebuilt from it."""
        keep = np.flatnonzero(lengths)
        self._prefix.append((base + keep, lengths[keep]))
        if last:
            ids = np.concatenate([i for i, _ in self._prefix])
            lens = np.concatenate([n for _, n in self._prefix])
            self.planner = BestFitPlanner.from_buffer(self.B, self.row_len, self.buffer_size, ids, lens)
            self._prefix = []

    @property
    def next_index(self) -> int:
        """The next piece index to take in (those below it are counted and in chunks or the buffer)."""
        return self._counted.next

    def stuck(self) -> bool:
        """No batch can be planned with the pieces taken in: a plan ran out of them, or the
        resumed buffer is not whole yet."""
        return self.planner is None or self.starved

    def freed(self, batch: int):
        self.book.freed()  # in any order: at most n_slots batches are planned and not freed

    def unplaced(self, worker: int) -> dict:
        """`{piece index: its rows not yet placed}` of the counted pieces `worker` holds, also
        those not numbered yet (waiting for an earlier piece's count: `chunks.unnumbered`)."""
        self._prune()
        (index, row), = self._placed_rows
        out = {i: set(live.tolist()).difference(row[index == i].tolist())
               for i, (owner, live, _) in self._pieces.items() if owner == worker}
        for waiting in (self._counted.waiting(), self.chunks.unnumbered()):
            out.update((index, set(np.flatnonzero(lengths).tolist()))
                       for index, (_, owner, lengths) in waiting.items() if owner == worker)
        return out

    def plan(self) -> list[tuple[int, dict]]:
        """Plan every batch whose slot is free and whose chunks are counted.
        Returns `(batch, {worker: placements})`, a worker's placements an (n, 5) array of rows
        `[piece, row, batch_row, row_offset, n]`."""
        if self.starved and self._starved_news is not None and self.chunks.news() == self._starved_news:
            return []  # no chunk came since a plan ran out: it would run out again at the same place
        out = []
        self.starved = False  # set again below if a free slot waits for documents
        while self.planner is not None and self.planned < self.book.limit:
            plan = self.chunks.plan(self.planner)
            if plan is None:
                self.starved, self._starved_news = True, self.chunks.news()
                break
            self.tokens_cropped += plan.n_cropped
            self.docs_placed += len(plan.doc_id)
            self._positions[self.planned] = self._complete(plan)
            self.book.expect(self.planned, int(plan.n_tokens.sum()))
            out.append((self.planned, self._orders(plan)))
            self.planned += 1
        return out

    def _complete(self, plan) -> Complete:
        """What batch `planned`, just planned (`plan`), announces once written: the sink's."""
        return self._sink(self, plan)

    def _orders(self, plan) -> dict:
        """`{worker: placements}` of `plan` (an (n, 5) array of rows `[piece, row, batch_row,
        row_offset, n]`), each worker's in the plan's order, the workers in the order the plan
        first names them; pieces whose every document is now placed leave the table. Python per
        piece the batch reads from (a few), whole-array calls and a C loop (Counter) per
        placement: the rows placed are only kept (`_placed_rows`), for `unplaced`."""
        index, row, owner = self.table.rows_of(plan.doc_id)  # before any piece leaves below
        placements = np.empty((len(index), 5), dtype=np.int64)
        for c, column in enumerate((index, row, plan.row, plan.row_offset, plan.n_tokens)):
            placements[:, c] = column
        for i, n in Counter(index.tolist()).items():
            entry = self._pieces[i]
            entry[2] -= n
            if not entry[2]:
                del self._pieces[i]
                self.table.remove(i)
        self._placed_rows.append((index, row))
        self._placed_n += len(index)
        if self._placed_n > self._prune_at:
            self._prune()
        workers = dict.fromkeys(owner.tolist())  # in the order the plan first names them
        if len(workers) == 1:
            return {w: placements for w in workers}
        return {w: placements[owner == w] for w in workers}

    def _prune(self):
        """`_placed_rows` as one pair of arrays, without the rows of pieces gone; pruned again
        when it has doubled, so that each row placed is looked at a few times at most."""
        parts = self._placed_rows or [(np.zeros(0, np.int64),) * 2]
        index, row = (np.concatenate(c) for c in zip(*parts))
        keep = np.isin(index, np.fromiter(self._pieces, dtype=np.int64, count=len(self._pieces)))
        self._placed_rows = [(index[keep], row[keep])]
        self._placed_n = int(np.count_nonzero(keep))
        self._prune_at = max(PRUNE_ROWS, 2 * self._placed_n)

    def buffer_runs(self) -> np.ndarray:
        """The buffer in arrival order as runs `[epoch, file, rg, row, count]` (an (n, 5) array)."""
        return self.table.numbered_runs(self.planner.buffered_ids())

    def written(self, counts):
        self.book.written(counts)

    def ready(self) -> list[Complete]:
        """The batches now complete, in order."""
        return [done for _, done in self.book.ready(self._positions.pop)]


def where_one_source_stands(seq: BestFitSequencer, plan) -> Complete:
    """One source's sink: the position after the batch just planned (the end of the last chunk
    its plan took) and the buffer as runs (`buffer_runs`)."""
    return Complete(seq.planned, Position(*seq.chunks.last_end), seq.buffer_runs(), seq.docs_placed)


def read_ahead_cap(buffer_size: int, max_piece_docs: int, piece_docs: int = 0, cap: int = 0) -> int:
    """Best fit's read-ahead cap (documents counted or given and not yet in the buffer): the
    buffer and two pieces of `max_piece_docs`. With a token cache pieces are whole row groups
    (`max_piece_docs` `UNCAPPED`): there two of the largest piece given so far (`piece_docs`, the
    piece given now; `cap`, the cap before it), at least two of 1,024 documents; an uncapped
    cap let the workers count the whole corpus ahead of the planner (docs/benchmarks.md, "Best
    fit's coordinator, by part"). Where pieces are read never changes the stream."""
    if max_piece_docs < UNCAPPED:
        return buffer_size + 2 * max_piece_docs
    return max(cap, buffer_size + 2 * max(piece_docs, 1024))


class BestFitLocator:
    """Replays the planner over counted lengths from batch `first` (0: the run's start) to
    `batch`; `prefix` pieces (`buffer_pieces` of `runs`, the buffer at `first`) come first and
    rebuild the planner's buffer, as a resumed run does."""

    def __init__(self, shapes: list, batch: int, start, buffer_size: int, chunk_docs: int,
                 first: int = 0, runs=()):
        self.shapes, self.batch, self.total = shapes, batch, batch
        self.buffer_size = buffer_size
        self._shape = max(i for i, s in enumerate(shapes) if s[0] <= first)
        _, B, T = shapes[self._shape]
        self.prefix = buffer_pieces(runs, chunk_docs)
        self.planner = None if self.prefix else BestFitPlanner(B, T + 1, buffer_size)
        self._rebuilding = []             # (ids, lengths) of the prefix pieces counted so far
        self.done_batches = first
        self._chunks = Chunks(chunk_docs, (start.epoch, start.file, start.rg, start.doc))
        self._table, self._next_base = PieceTable(), 0
        self.result = None
        if batch == first:  # the start itself, with its buffer
            self.result = Found(Position(start.epoch, start.file, start.rg, start.doc), [list(r) for r in runs])

    def feed(self, piece, lengths: np.ndarray):
        if self.result is not None:
            return
        base, self._next_base = self._next_base, self._next_base + len(lengths)
        if np.count_nonzero(lengths):
            self._table.add(base, piece)
        if piece.index < len(self.prefix):
            keep = np.flatnonzero(lengths)
            self._rebuilding.append((base + keep, lengths[keep]))
            if piece.index == len(self.prefix) - 1:
                _, B, T = self.shapes[self._shape]
                self.planner = BestFitPlanner.from_buffer(B, T + 1, self.buffer_size,
                                                          np.concatenate([i for i, _ in self._rebuilding]),
                                                          np.concatenate([n for _, n in self._rebuilding]))
                self._rebuilding = []
            else:
                return
        else:
            self._chunks.add(piece, base, lengths)
        self._plan()

    def _plan(self):
        while self.done_batches < self.batch:
            self._reshape()
            p = self.planner
            if self._chunks.plan(p, safe=self._chunks.docs >= p.B * p.row_len + self.buffer_size) is None:
                return
            self.done_batches += 1
        self._finish_if_done()

    def _reshape(self):
        """At the first batch of the next shape, rebuild the planner as a resumed run does."""
        nxt = self._shape + 1
        if nxt < len(self.shapes) and self.shapes[nxt][0] == self.done_batches:
            _, B, T = self.shapes[nxt]
            self.planner = BestFitPlanner.from_buffer(B, T + 1, self.buffer_size, *self.planner.buffered())
            self._shape = nxt

    def _finish_if_done(self):
        if self.done_batches == self.batch:
            runs = self._table.runs(self.planner.buffered_ids())
            self.result = Found(Position(*self._chunks.last_end), runs.tolist())


def _locator(cfg, run) -> tuple:
    start = run.start
    cap = ramp_for(cfg.tokenizer_batch_size, cfg.max_piece_docs)[1]  # whole chunks
    return BestFitLocator(start.locate.shapes, start.locate.until, start.position, cfg.buffer_size,
                          cfg.tokenizer_batch_size, start.batch, start.at.runs), cap


COMPACT_AT = 4  # a piece's documents left are copied apart once they hold under 1/COMPACT_AT of what is kept


class _Docs:
    """A piece's documents as the worker keeps them until each is placed: the piece's tokens end
    to end (each document `[BOS] + tokens`), each document's start in them (-1 once placed, or
    when null) and length, and how many documents and tokens are still to place. Python lists,
    not arrays: `write` reads them a placement at a time."""
    __slots__ = ("tokens", "starts", "lengths", "live", "live_tokens")

    def __init__(self, tokens: np.ndarray, starts: list, lengths: list, live: int, live_tokens: int):
        self.tokens, self.starts, self.lengths = tokens, starts, lengths
        self.live, self.live_tokens = live, live_tokens

    def placed(self, row: int) -> bool:
        """Document `row` left (placed, or dropped); whether none is left. Once the documents
        left hold under a quarter (`COMPACT_AT`) of the tokens kept, they are copied apart
        (`_compact`)."""
        self.starts[row] = -1
        self.live -= 1
        self.live_tokens -= self.lengths[row]
        if not self.live:
            return True
        if COMPACT_AT * self.live_tokens < len(self.tokens):
            self._compact()
        return False

    def _compact(self):
        """Keep only the documents not placed yet, end to end (a copy): a document that lingers
        in the buffer pins at most 4x its tokens of its piece, not the piece. Each copy takes
        under a quarter of what is kept, so all of a piece's copies together copy under a third
        of its tokens (at a half: up to all of them, ~0.6 ns a token more of a worker's writes:
        docs/benchmarks.md "Best fit's writes: cut, and the floor")."""
        starts, lengths, tokens = self.starts, self.lengths, self.tokens
        live = [i for i, start in enumerate(starts) if start >= 0]
        kept = np.concatenate([tokens[starts[i]:starts[i] + lengths[i]] for i in live])
        at = 0
        for i in live:
            starts[i] = at
            at += lengths[i]
        self.tokens = kept


def _keep(tokens: np.ndarray, lengths: np.ndarray, first: int = 0) -> "_Docs | None":
    """A worker keeps a piece's tokens as they are, each document by its start, and copies
    those left apart once they hold under a quarter of the tokens kept (`_Docs.placed`), so that
    a document that lingers in the buffer does not pin its whole piece in memory. (A copy of
    each document, a numpy call each, cost 1.3 of a worker's 89 ns a token: docs/benchmarks.md.)"""
    live = int(np.count_nonzero(lengths))
    if not live:
        return None
    if not tokens.flags.writeable:  # a token cache's mapping (data/cache.py): copied, not pinned
        tokens = tokens.copy()
    ends = np.cumsum(lengths)
    starts = np.where(lengths > 0, ends - lengths, -1)
    return _Docs(tokens, starts.tolist(), lengths.tolist(), live, int(ends[-1]))


def write(slots: np.ndarray, held: dict, order: Rows, B: int, T: int, positions: np.ndarray | None = None) -> list:
    """A worker writes one batch's placements: tokens [0, n) of a document at column `off` of
    row `r` of the (B, T+1) rows go to inputs[r, off:] and targets[r, off-1:] of the slot
    (inputs (B, T), then targets (B, T)); with `positions` (the ring's positions areas) the
    inputs' positions 0, 1, ... beside them (packing/positions.py). A document leaves memory
    once placed (`_Docs.placed`). Two copies a placement, into the inputs and into `targets`
    (the slot from its B*T-1-th word, where column c of row r's token, its target r*T + c - 1,
    is at r*T + c), with as little else as can be: ~80 placements a B=32, T=2048 batch, each
    ~800 tokens of a document long out of the cache copied twice into a slot out of the cache,
    ~5 ns a token against ~2.3 for the same bytes in two whole copies (docs/benchmarks.md
    "Best fit's writes: cut, and the floor")."""
    slot, total = slots[order.slot], 0
    targets = slot[B * T - 1:]
    for index, row, r, off, n in placement_rows(order.placements):
        docs = held[index]
        start, at = docs.starts[row], r * T + off
        doc = docs.tokens[start:start + n]
        inputs = n if off + n <= T else T - off  # a cropped document's token at column T is a target only
        slot[at:at + inputs] = doc if inputs == n else doc[:inputs]
        if off:
            targets[at:at + n] = doc
        else:  # a row's first token is an input only
            targets[at + 1:at + n] = doc[1:]
        if positions is not None and inputs > 0:
            fill_prefix(positions[order.slot, at:at + inputs])
        total += n
        if docs.placed(row):
            del held[index]
    return [(order.batch, total)]


def _keep_rows(held: "_Docs", rows) -> "_Docs | None":
    """Of a piece done again for a replaced worker, only `rows`: the others were written."""
    for i, start in enumerate(held.starts):
        if start >= 0 and i not in rows and held.placed(i):
            return None
    return held


def _stats(counters: dict) -> dict:
    planned = counters["placed"] + counters["cropped"]
    return {"tokens_cropped": counters["cropped"],
            "cropped_fraction": counters["cropped"] / planned if planned else 0.0}


PACKING = Packing(
    name="bos_bestfit", locator=_locator, order=Rows, keep=_keep, write=write,
    keep_rows=_keep_rows, order_pieces=lambda order: {p[0] for p in placement_rows(order.placements)},
    window=lambda B, T: 2 * B * T,     # inputs, then targets
    targets_at=lambda B, T: B * T,
    stats=_stats, settings=("buffer_size", "tokenizer_batch_size"),
    buffer_docs=lambda cfg: cfg.buffer_size + cfg.tokenizer_batch_size)
