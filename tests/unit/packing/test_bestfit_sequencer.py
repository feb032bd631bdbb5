"""packing.bestfit.BestFitSequencer, driven through NOTE [ring protocol] in-process.

A simulation plays coordinator, workers and trainer, as tests/unit/packing/test_concat_sequencer.py
does for concat: pieces (cut at chunk boundaries, as the coordinator cuts them) are counted in
a random order by random workers, write orders are carried out by the packing's own worker
functions (`bestfit._keep`, `bestfit.write`) late and in random order, and the trainer frees
announced batches at random moments and in any order. Every token is unique (its document's
file, row group and row, and its place in the document), so each slot is checked token for
token against nanochat's scan (tests/oracle.py: `plan_batch_scan`) fed the same chunks, and
each announced position and buffer against the scan's. A run resumed from the position and
buffer of a random batch (its buffer re-read as prefix pieces, `order.buffer_pieces`, then
the order from the position) must give the uninterrupted run's next batches.
"""
import random

import numpy as np
import pytest

from shmloader.data.order import Piece, buffer_pieces
from shmloader.packing import bestfit
from shmloader.packing.base import SlotMap
from shmloader.packing.bestfit import Rows
from shmloader.packing.mixbestfit import source_sequencer
from shmloader.packing.mixone import Passing
from tests.cases import seeds
from tests.oracle import plan_batch_scan

B, T = 2, 16
ROW_LEN = T + 1


def doc_tokens(f: int, g: int, row: int, n: int) -> np.ndarray:
    """Document (f, g, row)'s n tokens: unique across the data set, and in order."""
    return (((f * 50 + g) * 1000 + row) * 100 + np.arange(n)).astype(np.int64)


class Data:
    """Row groups of documents: `lengths[(f, g)]` per row (0: a null row), one epoch."""

    def __init__(self, rng, n_files=2, rgs_per_file=4, max_rows=11):
        self.lengths = {}
        for f in range(n_files):
            for g in range(rgs_per_file):
                n = rng.randint(0 if g else 1, max_rows)
                self.lengths[f, g] = [0 if rng.random() < 0.1 else rng.randint(1, 3 * ROW_LEN)
                                      for _ in range(n)]
        self.order = sorted(self.lengths)

    def rest(self, start: tuple):
        """(f, g, first row) of the row groups from position `start` = (f, g, doc) on."""
        f, g, doc = start
        out = [(f, g, doc)] if (f, g) in self.lengths else []
        return out + [(ff, gg, 0) for ff, gg in self.order if (ff, gg) > (f, g)]

    def chunks(self, start: tuple, chunk_docs: int):
        """The scan's chunks from `start`: (ids, lengths, end) with ids (f, g, row)."""
        for f, g, doc in self.rest(start):
            rows = self.lengths[f, g]
            for lo in range(doc, len(rows), chunk_docs):
                part = range(lo, min(lo + chunk_docs, len(rows)))
                live = [r for r in part if rows[r]]
                yield [(f, g, r) for r in live], [rows[r] for r in live], (1, f, g, part[-1] + 1)

    def pieces(self, start: tuple, chunk_docs: int, rng, first_index: int = 0) -> list:
        """Pieces from `start`, each a whole number of chunks of its row group (the last may be
        shorter), of random sizes."""
        out, index = [], first_index
        for f, g, doc in self.rest(start):
            n = len(self.lengths[f, g])
            if n == 0:  # an empty row group is still a step of the order (a piece of no rows)
                out.append(Piece(index, 1, f, g, 0, 0))
                index += 1
            while doc < n:
                end = min(n, doc + chunk_docs * rng.randint(1, 3))
                out.append(Piece(index, 1, f, g, doc, end))
                index, doc = index + 1, end
        return out


def oracle(data: Data, chunk_docs: int, buffer_size: int):
    """The scan's batches: per batch (rows (B, T+1), position after it, buffer runs, documents
    placed so far), until the data runs out."""
    source, buffer, out, placed = data.chunks((0, 0, 0), chunk_docs), [], [], 0
    ends, key = [None], {}

    def next_chunk():
        ids, lengths, end = next(source)  # StopIteration: the data ran out
        ends[0] = end
        numbered = [key.setdefault(doc, len(key)) for doc in ids]
        return np.array(numbered, dtype=np.int64), np.array(lengths, dtype=np.int64)

    while True:
        try:
            plan = plan_batch_scan(buffer, next_chunk, B, ROW_LEN, buffer_size)
        except StopIteration:
            return out
        of = {v: doc for doc, v in key.items()}
        rows = np.zeros((B, ROW_LEN), dtype=np.int64)
        for r, off, doc, n in zip(plan.row, plan.row_offset, plan.doc_id, plan.n_tokens):
            rows[r, off:off + n] = doc_tokens(*of[int(doc)], n)
        placed += len(plan.doc_id)
        out.append((rows, ends[0], runs_of([of[d] for d, _ in buffer]), placed))


def cropped(data: Data, chunk_docs: int, buffer_size: int) -> int:
    """Tokens the scan drops from cropped documents over all the batches it can make."""
    source, buffer, total = data.chunks((0, 0, 0), chunk_docs), [], 0
    key = {}

    def next_chunk():
        ids, lengths, _ = next(source)
        return np.array([key.setdefault(d, len(key)) for d in ids], dtype=np.int64), np.array(lengths, dtype=np.int64)

    while True:
        try:
            total += plan_batch_scan(buffer, next_chunk, B, ROW_LEN, buffer_size).n_cropped
        except StopIteration:
            return total


def runs_of(docs) -> list:
    runs = []
    for f, g, row in docs:
        if runs and runs[-1][1:3] == [f, g] and runs[-1][3] + runs[-1][4] == row:
            runs[-1][4] += 1
        else:
            runs.append([1, f, g, row, 1])
    return runs


def _count(one, seq, piece, owner: int, lengths):
    """`piece` counted as the mode counts it (packing/mixbestfit.py `MixBestFitMode.counted`): the
    resumed buffer's into the sequencer, the run's order's into its stream `one` first (the feed's)."""
    if not seq.chunks.ordered(piece.index):
        one.counted(None, piece.index, piece, lengths)
    seq.counted(piece, owner, lengths)


class Sim:
    """One run of the protocol over `pieces` (the first `n_prefix` rebuild a resumed buffer)."""

    def __init__(self, data: Data, pieces: list, n_prefix: int, start, buffer_size, chunk_docs,
                 n_slots, rng):
        self.data, self.pieces, self.rng, self.n_slots = data, pieces, rng, n_slots
        self.one = Passing(first=n_prefix)  # the run's order after the resumed buffer's, as the mode's feed counts it
        self.seq = source_sequencer(B, T, n_slots, buffer_size, chunk_docs, n_prefix, start, self.one)
        self.slot_map, self.held, self.pending = SlotMap(n_slots), {}, []
        self.slots = np.full((n_slots, bestfit.PACKING.window(B, T)), -1, dtype=np.int64)
        self.uncounted = list(range(len(pieces)))
        rng.shuffle(self.uncounted)
        self.announced, self.freed = [], set()   # (k, inputs, targets, position, runs, docs)

    def count_one(self):
        p = self.pieces[self.uncounted.pop()]
        lengths = np.array(self.data.lengths[p.file, p.rg][p.doc_start:p.doc_end], dtype=np.int64)
        tokens = np.concatenate([doc_tokens(p.file, p.rg, p.doc_start + i, n) for i, n in enumerate(lengths)]
                                + [np.zeros(0, dtype=np.int64)])
        held = bestfit.PACKING.keep(tokens, lengths)
        if held is not None:
            self.held[p.index] = held
        _count(self.one, self.seq, p, self.rng.randrange(3), lengths)

    def dispatch(self):
        for k, by_worker in self.seq.plan():
            assert k not in self.freed and k < len(self.freed) + self.n_slots, (k, self.freed)
            slot = self.slot_map.take_slot(k)
            self.pending += [Rows(k, slot, placements) for placements in by_worker.values()]

    def write_one(self):
        order = self.pending.pop(self.rng.randrange(len(self.pending)))
        self.seq.written(bestfit.write(self.slots, self.held, order, B, T))

    def announce(self):
        for k, position, runs, docs, _ in self.seq.ready():
            assert k == len(self.announced), "batches announced out of order"
            window = self.slots[self.slot_map.slot_of(k)]
            self.announced.append((k, window[:B * T].copy(), window[B * T:].copy(), position,
                                   runs.tolist(), docs))

    def free_one(self):
        k = self.rng.choice([a[0] for a in self.announced if a[0] not in self.freed])
        self.slot_map.release(k)
        self.seq.freed(k)
        self.freed.add(k)

    def run(self):
        while True:
            moves = (["count"] * bool(self.uncounted) + ["write"] * 3 * bool(self.pending)
                     + ["free"] * (len(self.freed) < len(self.announced)))
            if not moves:
                return self
            move = self.rng.choice(moves)
            {"count": self.count_one, "write": self.write_one, "free": self.free_one}[move]()
            self.dispatch()
            self.announce()


def check_against(announced, expected, first: int = 0):
    """Each announced batch equals the scan's batch `first + k`: rows, position and buffer."""
    for k, x, y, position, runs, docs in announced:
        rows, end, want_runs, placed = expected[first + k]
        assert np.array_equal(x, rows[:, :-1].reshape(-1)), f"batch {first + k}: inputs"
        assert np.array_equal(y, rows[:, 1:].reshape(-1)), f"batch {first + k}: targets"
        assert position == (*end, 0) and runs == want_runs, f"batch {first + k}: position / buffer"
        if first == 0:
            assert docs == placed, f"batch {k}: documents placed"


@pytest.mark.parametrize("seed", seeds(40, 10))  # seeds 10-39: -m slow
def test_batches_positions_and_buffers_equal_the_scan_whatever_the_order(seed):
    rng = random.Random(seed)
    data = Data(rng)
    buffer_size, chunk_docs, n_slots = rng.randint(1, 8), rng.randint(1, 4), rng.randint(1, 4)
    expected = oracle(data, chunk_docs, buffer_size)
    sim = Sim(data, data.pieces((0, 0, 0), chunk_docs, rng), 0, (1, 0, 0, 0), buffer_size, chunk_docs,
              n_slots, rng).run()
    assert len(expected) >= 3, "the data set is too small to test anything"
    # every batch the scan can make is announced (the last ones wait only if the data ran out)
    assert len(sim.announced) == len(expected)
    check_against(sim.announced, expected)
    assert sim.seq.tokens_cropped == cropped(data, chunk_docs, buffer_size) > 0 or not any(
        n > ROW_LEN for rows in data.lengths.values() for n in rows), "no document was cropped"


@pytest.mark.parametrize("seed", seeds(40, 10))  # seeds 10-39: -m slow
def test_a_run_resumed_from_any_batch_continues_the_scan(seed):
    rng = random.Random(1000 + seed)
    data = Data(rng)
    buffer_size, chunk_docs, n_slots = rng.randint(1, 8), rng.randint(1, 4), rng.randint(1, 4)
    expected = oracle(data, chunk_docs, buffer_size)
    assert len(expected) >= 3, "the data set is too small to test anything"
    k = rng.randrange(len(expected) - 1)
    _, end, runs, _ = expected[k]
    prefix = buffer_pieces(runs, max_docs=rng.randint(1, 4))  # the buffer, re-read as small pieces
    rest = data.pieces(end[1:], chunk_docs, rng, first_index=len(prefix))
    sim = Sim(data, prefix + rest, len(prefix), end, buffer_size, chunk_docs, n_slots, rng).run()
    assert len(sim.announced) == len(expected) - k - 1
    check_against(sim.announced, expected, first=k + 1)


class Watched(Sim):
    """A `Sim` that keeps by hand each counted piece's owner and the rows its orders placed,
    and checks `unplaced` (what a replacement worker is given again) after every move."""

    def __init__(self, *args):
        super().__init__(*args)
        self.owner, self.placed, self.checks = {}, set(), 0
        counted = self.seq.counted
        self.seq.counted = lambda p, w, lengths: (self.owner.__setitem__(p.index, (p, w)), counted(p, w, lengths))

    def dispatch(self):
        for k, by_worker in self.seq.plan():
            slot = self.slot_map.take_slot(k)
            for placements in by_worker.values():
                self.placed.update((index, row) for index, row, *_ in placements)
                self.pending.append(Rows(k, slot, placements))
        for w in range(3):
            want = {}
            for index, (p, owner) in self.owner.items():
                rows = {r for r, n in enumerate(self.data.lengths[p.file, p.rg][p.doc_start:p.doc_end])
                        if n and (index, r) not in self.placed}
                if owner == w and rows:
                    want[index] = rows
            got = self.seq.unplaced(w)
            assert {i: rows for i, rows in got.items() if rows} == want  # (a piece of nulls waiting: no rows)
            self.checks += 1


@pytest.mark.parametrize("seed", range(12))
def test_the_rows_not_yet_placed_are_each_pieces_live_rows_less_those_ordered(seed):
    """`unplaced(worker)` (what a replacement is given again), from the rows placed kept in
    bulk and pruned of pieces gone (here from 5 rows kept on, `PRUNE_ROWS`): asked at any
    moment, it is every counted piece's live rows less those its orders placed."""
    rng = random.Random(500 + seed)
    data = Data(rng, max_rows=20)
    buffer_size, chunk_docs, n_slots = rng.randint(1, 8), rng.randint(1, 4), rng.randint(1, 4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bestfit, "PRUNE_ROWS", 5)
        sim = Watched(data, data.pieces((0, 0, 0), chunk_docs, rng), 0, (1, 0, 0, 0), buffer_size,
                      chunk_docs, n_slots, rng).run()
    assert sim.checks > 30 and sim.placed and len(sim.announced) >= 3


def test_a_plan_that_ran_out_is_not_tried_again_until_a_chunk_comes():
    """The coordinator calls plan() on every message (two workers' acknowledgements per batch);
    a plan that ran out of counted chunks would run out again at the same place, so it is not
    tried (nor its snapshot taken) until another chunk is counted: not at a count of a piece
    that waits in the stream for an earlier one (it passes nothing)."""
    one = Passing()
    seq = source_sequencer(B, T, n_slots=4, buffer_size=4, chunk_docs=2, n_prefix=0, start_doc_end=(0, 0, 0, 0),
                           stream=one)
    tries = []
    plan_batch = seq.planner.plan_batch
    seq.planner.plan_batch = lambda source: tries.append(1) or plan_batch(source)
    _count(one, seq, Piece(0, 0, 0, 0, 0, 2), 0, np.array([3, 3]))  # 6 tokens: no batch of 2 x 17
    assert seq.plan() == [] and seq.starved and len(tries) == 1
    for _ in range(5):  # acknowledgements, frees: nothing new to plan from
        assert seq.plan() == [] and seq.starved
    assert len(tries) == 1, "a starved plan was tried again with no new chunk"
    _count(one, seq, Piece(2, 0, 0, 0, 8, 10), 0, np.array([ROW_LEN] * 2))  # waits for piece 1
    assert seq.plan() == [] and len(tries) == 1, "a starved plan was tried again at a count that passed nothing"
    _count(one, seq, Piece(1, 0, 0, 0, 2, 8), 1, np.array([ROW_LEN] * 6))
    out = seq.plan()
    assert len(tries) >= 2 and [k for k, _ in out] == [0, 1, 2]


def _runs_by_hand(pieces, ids) -> list:
    """Documents `ids` as runs `[epoch, file, rg, row, count]`, one document at a time."""
    out = []
    for i in ids:
        base, p = max((b, p) for b, p in pieces if b <= i)
        key, row = (p.epoch, p.file, p.rg), p.doc_start + i - base
        if out and tuple(out[-1][:3]) == key and out[-1][3] + out[-1][4] == row:
            out[-1][4] += 1
        else:
            out.append([*key, row, 1])
    return out


@pytest.mark.parametrize("seed", range(4))
def test_the_buffer_runs_join_rows_across_pieces_of_one_row_group(seed):
    """`PieceTable.runs`: a run goes on into the next piece of the same row group, also when a
    piece of another row group lies between their ids (a mixture's arrival order), and never
    across row groups, files or epochs."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        table, pieces, base, index, ids = bestfit.PieceTable(), [], 0, 0, []
        for _ in range(int(rng.integers(1, 7))):
            epoch, f, g = (int(x) for x in rng.integers(0, 2, size=3))
            n, row = int(rng.integers(1, 40)), 0
            while row < n:
                k = int(rng.integers(1, n - row + 1))
                piece = Piece(index, epoch, f, g, row, row + k)
                table.add(base, piece)
                pieces.append((base, piece))
                ids.extend(range(base, base + k))
                base, index, row = base + k + int(rng.integers(0, 2)), index + 1, row + k
        chosen = np.sort(rng.choice(ids, size=int(rng.integers(0, len(ids) + 1)), replace=False))
        cut = int(rng.integers(0, len(chosen) + 1))
        for order in (chosen, np.concatenate([chosen[cut:], chosen[:cut]])):
            got = table.runs(order.astype(np.int64))
            assert got.dtype == np.int64 and got.shape == (len(got), 5)
            assert got.tolist() == _runs_by_hand(pieces, order.tolist())


@pytest.mark.parametrize("seed", range(4))
def test_the_piece_table_follows_pieces_that_come_and_go(seed):
    """`PieceTable` as the sequencer uses it: pieces added in id order and removed in any order
    (once their documents are placed), several of either between two looks, and looks
    (`piece_of`, `file_of`, `runs`) at documents of the live pieces: each answers as the live
    pieces, kept by hand, say."""
    rng = np.random.default_rng(seed)
    table, live, base, index, looks = bestfit.PieceTable(), {}, 0, 0, 0
    for _ in range(400):
        for _ in range(int(rng.integers(0, 3))):  # pieces counted
            n = int(rng.integers(1, 20))
            start = int(rng.integers(0, 50))
            piece = Piece(index, int(rng.integers(0, 2)), int(rng.integers(0, 3)), int(rng.integers(0, 3)),
                          start, start + n)
            table.add(base, piece)
            live[index] = (base, piece)
            base, index = base + n + int(rng.integers(0, 2)), index + 1
        for gone in rng.permutation(list(live))[:int(rng.integers(0, 3))].tolist():  # pieces placed
            table.remove(gone)
            del live[gone]
        if not live or rng.random() < 0.3:
            continue
        pieces = sorted(live.values(), key=lambda bp: bp[0])
        all_ids = [i for b, p in pieces for i in range(b, b + p.doc_end - p.doc_start)]
        ids = np.sort(rng.choice(all_ids, size=int(rng.integers(1, len(all_ids) + 1)), replace=False))
        owner = [max((b, p) for b, p in pieces if b <= i)[1] for i in ids.tolist()]
        assert table.piece_of(ids).tolist() == [p.index for p in owner]
        assert table.file_of(ids).tolist() == [p.file for p in owner]
        assert table.runs(ids).tolist() == _runs_by_hand(pieces, ids.tolist())
        assert table._tables()[1].tolist() == sorted(live)  # noqa: SLF001 (a gone piece is not kept)
        looks += 1
    assert looks > 150


def test_the_piece_table_refuses_a_piece_it_does_not_hold_and_takes_one_back():
    """A piece removed that is not in the table is a KeyError (as when the table was a dict); a
    piece removed and added again before the next look is the new one (from an adversarial
    review: its index dropped both)."""
    table = bestfit.PieceTable()
    table.add(0, Piece(0, 0, 0, 0, 0, 5))
    with pytest.raises(KeyError):
        table.remove(7)
    table.add(5, Piece(1, 0, 0, 1, 0, 5))
    table.remove(1)
    with pytest.raises(KeyError):
        table.remove(1)
    table.add(5, Piece(1, 0, 2, 3, 10, 15))
    assert table.piece_of(np.array([2, 6])).tolist() == [0, 1]
    assert table.runs(np.array([6, 7])).tolist() == [[0, 2, 3, 11, 2]]
