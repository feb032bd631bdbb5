"""packing.ConcatSequencer, driven through NOTE [ring protocol] in-process.

A simulation plays coordinator, workers and trainer: pieces are counted in a random order,
write orders are carried out and acknowledged late and in random order, the trainer frees
announced batches at random moments and in any order (lent CPU batches come back when the
caller drops them), and a `SlotMap` puts each batch in a ring slot as the coordinator does. Every token of the concatenation has a
unique value (its index), so each slot, each stream position and each resume position is
checkable by arithmetic."""

import random
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader.packing.concat import ConcatSequencer, Where
from shmloader.packing.base import SlotMap


class Sim:
    """One run of the protocol over `pieces` (a list of per-row token counts)."""

    def __init__(self, pieces, window, n_slots, skip, rng):
        self.pieces = [np.asarray(p, dtype=np.int64) for p in pieces]
        self.W, self.n_slots, self.skip, self.rng = window, n_slots, skip, rng
        sizes = [int(p.sum()) for p in self.pieces]
        self.piece_start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.total = int(self.piece_start[-1])
        self.L = self.total - skip                         # stream length after the skip
        # token values: global index in the concatenation (before the skip)
        self.tokens = [np.arange(self.piece_start[i], self.piece_start[i + 1]) for i in range(len(pieces))]
        self.seq = ConcatSequencer(window, n_slots, skip)
        self.slot_map = SlotMap(n_slots)                   # raises if n_slots batches are held
        self.slots = np.full((n_slots, window), -1, dtype=np.int64)
        n_pos = max(self.L, 0) + n_slots * window + window
        self.stream = np.full(n_pos, -1, dtype=np.int64)   # value written at each stream position
        self.writes = np.zeros(n_pos, dtype=np.int64)      # times each position was written
        self.acked = np.zeros(n_pos, dtype=bool)           # write acknowledged by written()
        self.uncounted = list(range(len(pieces)))
        rng.shuffle(self.uncounted)
        self.pending = []                                  # (piece, segment) not yet written
        self.done = {}                                     # piece -> number of done orders
        self.placed_tokens = [0] * len(pieces)
        self.announced = []                                # (k, where)
        self.freed = set()                                 # batches the trainer freed
        self.orders = []                                   # every (piece, segment) issued

    # ---- the coordinator's side
    def dispatch(self):
        for piece, segs, done in self.seq.placements():
            assert piece not in self.done, f"piece {piece} got an order after done"
            assert 0 <= piece < self.seq.next_index, "order for a piece not yet sequenced"
            for k, off, poff, n in segs:
                assert k not in self.freed and k < len(self.freed) + self.n_slots, (k, self.freed)
                self.slot_map.take_slot(k)
                assert n > 0 and 0 <= off and off + n <= self.W
                assert 0 <= poff and poff + n <= len(self.tokens[piece])
                self.pending.append((piece, (k, off, poff, n)))
                self.orders.append((piece, (k, off, poff, n)))
                self.placed_tokens[piece] += n
            if done:
                self.done[piece] = self.done.get(piece, 0) + 1
                # done only once all of the piece's tokens at stream positions >= 0 are placed
                before = max(0, min(len(self.tokens[piece]), self.skip - self.piece_start[piece]))
                assert self.placed_tokens[piece] == len(self.tokens[piece]) - before

    def announce(self):
        for k, where in self.seq.ready():
            assert k == len(self.announced), "batches announced out of order"
            lo, hi = k * self.W, (k + 1) * self.W
            assert self.acked[lo:hi].all(), f"batch {k} announced before complete"
            self.check_slot(k)
            self.check_position(k, where)
            self.announced.append((k, where))

    # ---- a worker's side
    def write_one(self):
        piece, (k, off, poff, n) = self.pending.pop(self.rng.randrange(len(self.pending)))
        self.slots[self.slot_map.take_slot(k), off:off + n] = self.tokens[piece][poff:poff + n]
        pos = k * self.W + off
        self.stream[pos:pos + n] = self.tokens[piece][poff:poff + n]
        self.writes[pos:pos + n] += 1
        self.acked[pos:pos + n] = True
        self.seq.written([(k, n)])

    # ---- the trainer's side
    def free_one(self):
        k = self.rng.choice([k for k, _ in self.announced if k not in self.freed])
        self.check_slot(k)  # what the caller held until now is still batch k
        self.slot_map.release(k)
        self.seq.freed(k)
        self.freed.add(k)

    # ---- checks
    def check_slot(self, k):
        first = self.skip + k * self.W
        assert np.array_equal(self.slots[self.slot_map.take_slot(k)], np.arange(first, first + self.W)), k

    def check_position(self, k, where):
        piece, row, skip = where.piece, where.row, where.skip
        g = self.skip + (k + 1) * self.W  # global index of the token after batch k
        lengths = self.pieces[piece]
        row_start = self.piece_start[piece] + int(lengths[:row].sum())
        assert 0 <= row < len(lengths) and 0 <= skip < lengths[row], where
        assert row_start + skip == g, (k, where, g)

    # ---- driving
    def step(self):
        moves = []
        if self.uncounted:
            moves.append("count")
        if self.pending:
            moves += ["write"] * 3
        if len(self.freed) < len(self.announced):
            moves.append("free")
        if not moves:
            return False
        move = self.rng.choice(moves)
        if move == "count":
            i = self.uncounted.pop()
            self.seq.counted(i, self.pieces[i].copy())
        elif move == "write":
            self.write_one()
        else:
            self.free_one()
        self.dispatch()
        self.announce()
        return True

    def run(self):
        self.dispatch()
        self.announce()
        while self.step():
            pass
        return self


def expected_announced(L, W):
    """Batch k is announced when complete and its next token (k+1)*W exists."""
    return max(0, -(-L // W) - 1) if L > 0 else 0


def check_final(sim):
    L, W = sim.L, sim.W
    n = max(L, 0)
    # every stream position in [0, L) written exactly once, with the concatenation's token
    assert (sim.writes[:n] == 1).all()
    assert (sim.writes[n:] == 0).all()
    assert np.array_equal(sim.stream[:n], np.arange(sim.skip, sim.skip + n))
    # the first `skip` tokens were never placed
    placed = [sim.tokens[p][poff:poff + cnt] for p, (_, _, poff, cnt) in sim.orders]
    flat = np.concatenate(placed) if placed else np.zeros(0, np.int64)
    assert (flat >= sim.skip).all() and len(flat) == n
    # done exactly once per piece
    assert sim.done == {i: 1 for i in range(len(sim.pieces))}
    assert [k for k, _ in sim.announced] == list(range(expected_announced(L, W)))


piece_st = st.lists(st.integers(0, 9), max_size=6)  # rows; 0 = a null (no tokens at all)


@settings(max_examples=250, deadline=None)
@given(pieces=st.lists(piece_st, max_size=14), window=st.integers(1, 12),
       n_slots=st.integers(1, 4), skip=st.integers(0, 40), seed=st.integers(0, 2**32))
def test_protocol_simulation(pieces, window, n_slots, skip, seed):
    sim = Sim(pieces, window, n_slots, skip, random.Random(seed)).run()
    check_final(sim)


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(piece_st, min_size=1, max_size=14), window=st.integers(1, 12),
       n_slots=st.integers(1, 4), skip=st.integers(0, 20),
       seeds=st.tuples(st.integers(0, 2**32), st.integers(0, 2**32)))
def test_arrival_order_does_not_change_outputs(pieces, window, n_slots, skip, seeds):
    a = Sim(pieces, window, n_slots, skip, random.Random(seeds[0])).run()
    b = Sim(pieces, window, n_slots, skip, random.Random(seeds[1])).run()
    assert a.announced == b.announced
    n = max(a.L, 0)
    assert np.array_equal(a.stream[:n], b.stream[:n])

    def token_map(sim):  # stream position -> (piece, piece offset), whatever the segment cuts
        m = {}
        for p, (k, off, poff, cnt) in sim.orders:
            for j in range(cnt):
                m[k * window + off + j] = (p, poff + j)
        return m
    assert token_map(a) == token_map(b)


def test_long_run_many_batches():
    rng = np.random.default_rng(7)
    pieces = [rng.integers(0, 50, size=rng.integers(0, 20)).tolist() for _ in range(300)]
    for seed in range(3):
        sim = Sim(pieces, 37, 3, 11, random.Random(seed)).run()
        check_final(sim)
        assert len(sim.announced) > 100  # guard: the run really went through many batches


# ------------------------------------------------------------------ hand-checked cases

def test_hand_example_segments_and_positions():
    # W=4, 2 slots; pieces: [3], [6], [] (0 docs), [2, 0, 3]; stream of 14 tokens
    seq = ConcatSequencer(window=4, n_slots=2)
    seq.counted(1, np.array([6]))
    assert seq.placements() == []  # piece 0 not counted yet: nothing is sequenced
    seq.counted(0, np.array([3]))
    seq.counted(3, np.array([2, 0, 3]))
    assert seq.placements() == [
        (0, [(0, 0, 0, 3)], True),
        (1, [(0, 3, 0, 1), (1, 0, 1, 4)], False),  # slots 0, 1 in use; batch 2 must wait
    ]
    seq.counted(2, np.array([], dtype=np.int64))
    seq.written([(0, 3), (0, 1), (1, 4)])
    # batch 0 is complete and token 4 (piece 1, row 0, token 1) is sequenced
    assert seq.ready() == [(0, Where(1, 0, 1, last=1)), (1, Where(1, 0, 5, last=1))]
    assert seq.ready() == []
    seq.freed(0)
    assert seq.placements() == [(1, [(2, 0, 5, 1)], True), (2, [], True), (3, [(2, 1, 0, 3)], False)]
    seq.written([(2, 1), (2, 3)])
    # token 12 is token 1 of row 2 of piece 3 (row 1 is a null)
    assert seq.ready() == [(2, Where(3, 2, 1, last=3))]
    seq.freed(1)
    assert seq.placements() == [(3, [(3, 0, 3, 2)], True)]
    seq.written([(3, 2)])
    assert seq.ready() == []  # batch 3 is incomplete (2 of 4 tokens)


def test_skip_drops_the_first_tokens():
    # skip 5 of pieces [3], [4], [2]: the stream starts at piece 1 offset 2
    seq = ConcatSequencer(window=3, n_slots=2, skip=5)
    for i, lengths in enumerate([[3], [4], [2]]):
        seq.counted(i, np.array(lengths))
    assert seq.placements() == [(0, [], True), (1, [(0, 0, 2, 2)], True), (2, [(0, 2, 0, 1), (1, 0, 1, 1)], True)]
    seq.written([(0, 2), (0, 1)])
    assert seq.ready() == [(0, Where(2, 0, 1, last=2))]


def test_batch_waits_for_the_piece_holding_its_next_token():
    seq = ConcatSequencer(window=4, n_slots=2)
    seq.counted(0, np.array([4]))
    assert seq.placements() == [(0, [(0, 0, 0, 4)], True)]
    seq.written([(0, 4)])
    assert seq.ready() == []          # token 4 is not sequenced yet
    seq.counted(1, np.array([0, 0]))  # two nulls: still no token 4
    assert seq.ready() == []
    seq.counted(2, np.array([0, 2]))
    assert seq.ready() == [(0, Where(2, 1, 0, last=0))]  # its last token is piece 0's: the row group it ends in


def test_nothing_placed_beyond_free_slots_until_freed():
    seq = ConcatSequencer(window=2, n_slots=1)
    seq.counted(0, np.array([7]))
    assert seq.placements() == [(0, [(0, 0, 0, 2)], False)]
    assert seq.placements() == []
    seq.written([(0, 2)])
    assert seq.ready() == [(0, Where(0, 0, 2, last=0))]
    assert seq.placements() == []     # announced but not freed: slot 0 still in use
    seq.freed(0)
    assert seq.placements() == [(0, [(1, 0, 2, 2)], False)]


@pytest.mark.parametrize("skip", [0, 1, 9, 10, 11])
def test_oldest_live_never_passes_a_piece_still_needed(skip):
    rng = random.Random(skip)
    pieces = [[rng.randint(0, 5) for _ in range(rng.randint(0, 4))] for _ in range(40)]
    sim = Sim(pieces, 5, 2, skip, rng)
    sim.dispatch()
    while sim.step():
        live = sim.seq.oldest_live()
        # every piece whose tokens are still to be placed or located is >= oldest_live
        for p in range(len(pieces)):
            if p < sim.seq.next_index and p not in sim.done:
                assert p >= live
        # the piece holding the next token to announce, which ready() will name, too
        g = skip + (len(sim.announced) + 1) * 5
        if g < sim.total:
            holder = int(np.searchsorted(sim.piece_start, g, side="right")) - 1
            assert holder >= live
    check_final(sim)


def test_slot_map_reuses_freed_slots_in_any_order():
    slots = SlotMap(3)
    assert [slots.take_slot(k) for k in (0, 1, 2)] == [0, 1, 2]
    assert slots.take_slot(1) == 1                  # asking again does not move a batch
    with pytest.raises(RuntimeError, match="batch 3 needs a ring slot"):
        slots.take_slot(3)
    assert slots.release(1) == 1               # batch 1 freed before batch 0
    assert slots.take_slot(3) == 1
    slots.release(2)
    slots.release(0)
    assert [slots.take_slot(k) for k in (4, 5)] == [0, 2]


@pytest.mark.parametrize("seed", range(5))
def test_runs_of_pieces_interleaved(seed):
    """A mixture's runs (packing/mix.py): each piece's rows cut into runs, two sources' runs
    interleaved. The stream is the runs' tokens in order, each written from its piece's own
    tokens (at the run's base), a piece is done once, after its last run, and every batch's
    end names the run, row and token that follow it."""
    rng = random.Random(seed)
    W, n_slots = 37, 3
    values = iter(range(10**9))
    pieces = [[rng.choice([0, rng.randint(1, 30)]) for _ in range(rng.randint(0, 6))] for _ in range(60)]
    tokens = [np.array([next(values) for _ in range(sum(p))]) for p in pieces]
    queues = [deque(range(0, 60, 2)), deque(range(1, 60, 2))]  # two sources' pieces, each in order
    runs, left = [], {}
    while queues[0] or queues[1]:
        q = queues[rng.randrange(2)] if queues[0] and queues[1] else (queues[0] or queues[1])
        i = q[0]
        lo = left.get(i, 0)
        hi = min(len(pieces[i]), lo + rng.randint(1, 3)) if pieces[i] else 0
        base = sum(pieces[i][:lo])
        runs.append((i, lo, hi, base, hi == len(pieces[i])))
        left[i] = hi
        if hi == len(pieces[i]):
            q.popleft()
    seq = ConcatSequencer(W, n_slots)
    slots = SlotMap(n_slots)
    stream, done, expected = {}, [], []
    for i, lo, hi, base, last in runs:
        seq.append(i, np.array(pieces[i][lo:hi], dtype=np.int64), base, last, tag=(i, lo))
        expected.extend(tokens[i][base:base + sum(pieces[i][lo:hi])])
    announced = 0
    for _ in range(10_000):
        for i, segs, is_done in seq.placements():
            for k, off, poff, n in segs:
                slots.take_slot(k)
                for j in range(n):
                    stream[k * W + off + j] = tokens[i][poff + j]
                seq.written([(k, n)])
            if is_done:
                done.append(i)
        ready = seq.ready()
        for k, where in ready:
            assert k == announced
            announced += 1
            i, lo = where.run
            row = lo + where.row
            assert where.piece == i
            at = sum(pieces[i][:row]) + where.skip  # the token after batch k, within its piece
            assert tokens[i][at] == expected[(k + 1) * W]
            slots.release(k)
            seq.freed(k)
        if not ready and announced * W + W >= len(expected):
            break
    assert announced == len(expected) // W - 1 or announced == (len(expected) - 1) // W
    assert [stream[p] for p in range(announced * W)] == expected[:announced * W]
    assert sorted(done) == sorted(set(done))
    last_placed = {i for i, lo, hi, base, last in runs if last}
    assert set(done) <= last_placed and len(done) > 10
