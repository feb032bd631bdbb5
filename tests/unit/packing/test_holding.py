"""What a worker may hold (packing/base.py `Mode.can_take`), through `SourceConcatMode` as the
coordinator drives it: a worker whose counted pieces wait behind another worker's long piece
keeps getting work, up to a budget of tokens; tiny pieces may queue several at a time; and
what any worker holds stays bounded whatever the trainer's pace."""
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from shmloader import cores
from shmloader.config import LoaderConfig
from shmloader.data.order import Piece
from shmloader.ipc.protocol import Counted
from shmloader.packing.base import MAX_HELD_PIECES, MAX_IN_FLIGHT
from shmloader.packing.mixmode import SourceConcatMode
from shmloader.ipc.runstart import RunStart, SourceStart
from shmloader.position import Position

B, T, N_SLOTS = 2, 16, 4


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    """These rules are the mode's, not the machine's: 2 cores, whatever this one has."""
    monkeypatch.setattr(cores, "share", lambda: 2)


def mode_over(pieces, workers: int = 2, **options):
    cfg = LoaderConfig(B, T, n_slots=N_SLOTS, num_workers=workers, **options)
    run = SimpleNamespace(layout=SimpleNamespace(window=cfg.window, n_slots=N_SLOTS),
                          start=RunStart(Position(1, 0, 0), SourceStart()))
    return SourceConcatMode(cfg, run, workers, lambda ramp, cap, first: iter(pieces))


def count(mode, piece, tokens_per_doc):
    mode.counted(Counted(piece.index, np.full(piece.n_docs, tokens_per_doc, dtype=np.int64), None))


def drain(mode):
    """Place what can be placed (every slot taken is freed at once, as a fast trainer does)."""
    for _ in range(10_000):
        orders = list(mode.orders(lambda k: k % N_SLOTS))
        for w, order in orders:
            mode.written([(k, n) for k, _, _, _, n in order.segments])
        ready = mode.ready()
        for k, *_ in ready:
            mode.freed(k)
        if not orders and not ready:
            return


def test_a_worker_behind_a_long_piece_keeps_working_up_to_its_budget():
    # piece 0: 1,000 documents of 80 bytes; then 100-document pieces of the same text
    pieces = [Piece(0, 1, 0, 0, 0, 1000, text_bytes=80_000)]
    pieces += [Piece(i, 1, 0, i, 0, 100, text_bytes=8_000) for i in range(1, 100)]
    mode = mode_over(pieces, max_piece_bytes=80_000)
    long_one = next(mode.pieces)
    mode.take(0, long_one)                  # worker 0 tokenizes a long piece, for a while
    taken = 0
    while mode.can_take(1):                 # worker 1 finishes piece after piece meanwhile
        piece = next(mode.pieces)
        mode.take(1, piece)
        count(mode, piece, 10)              # 1,000 tokens a piece, placed only after piece 0
        drain(mode)
        taken += 1
    assert taken >= 10, "the other worker idled behind a long piece"  # the old limit: 3 pieces
    budget = mode.hold_tokens(1)
    assert budget == 10_000 > mode.ring_tokens, "the budget is not the long piece's tokens (8 bytes a token)"
    assert mode.load(1)[1] >= budget > mode.load(1)[1] - 1_000, "held past its budget"
    count(mode, long_one, 10)             # the long piece is counted: everything drains
    drain(mode)
    assert mode.load(0) == mode.load(1) == (0, 0)
    assert mode.can_take(0) and mode.can_take(1)


def test_pieces_in_flight_two_or_tiny_ones_up_to_a_piece_of_text():
    cap = LoaderConfig(B, T).max_piece_bytes  # the default, resolved
    big = [Piece(i, 1, 0, i, 0, 10, text_bytes=cap * 7 // 10) for i in range(5)]
    mode = mode_over(big)
    mode.take(0, next(mode.pieces))
    assert mode.can_take(0)
    mode.take(0, next(mode.pieces))
    assert not mode.can_take(0), "more than 2 large pieces queued on one worker"
    tiny = [Piece(i, 1, 0, i, 0, 1, text_bytes=50) for i in range(20)]
    mode = mode_over(tiny)
    n = 0
    while mode.can_take(0):
        mode.take(0, next(mode.pieces))
        n += 1
    assert n == MAX_IN_FLIGHT


def test_a_slow_trainer_bounds_what_every_worker_holds():
    """The ring is never freed: every worker stops at its budget of tokens, or of pieces."""
    for tokens_per_doc, docs in ((1000, 100), (1, 1)):
        pieces = (Piece(i, 1, 0, i, 0, docs, text_bytes=docs * 4) for i in itertools.count())
        mode = mode_over(pieces)
        for _ in range(100_000):
            w = min((0, 1), key=lambda w: (not mode.can_take(w), mode.load(w)))
            if not mode.can_take(w):
                break
            piece = next(mode.pieces)
            mode.take(w, piece)
            count(mode, piece, tokens_per_doc)
            list(mode.orders(lambda k: k % N_SLOTS))  # placed into the ring, never freed
        else:
            raise AssertionError("workers took work forever with a stalled trainer")
        for w in (0, 1):
            flight, held = mode.load(w)
            assert mode.hold_tokens(w) == mode.ring_tokens  # nothing long in flight
            assert held < mode.hold_tokens(w) + docs * tokens_per_doc
            assert len([i for i, o in mode.owner.items() if o == w]) <= MAX_HELD_PIECES


def test_more_workers_than_cores_as_many_as_the_cores_tokenize_at_once():
    """8 workers on 2 cores: at most 2 workers have pieces given and not counted, each its pair;
    the least loaded take them (lowest index first, as the coordinator picks), so 2 workers do
    the work and the others stand by; as many workers as cores keep their own bounds alone.
    (Pieces of a row group's worth of text: tiny ones go up to 8 a worker, the pair rule.)"""
    pieces = [Piece(i, 1, 0, i, 0, 10, text_bytes=8 << 20) for i in range(64)]
    mode = mode_over(pieces, 8, max_piece_bytes=8 << 20)
    assert mode.most_active == 2
    given, in_flight = {w: 0 for w in range(8)}, []
    for _ in range(40):
        while (w := next((w for w in sorted(range(8), key=mode.load) if mode.can_take(w)), None)) is not None:
            piece = next(mode.pieces)
            mode.take(w, piece)
            given[w] += 1
            in_flight.append(piece)
        assert len(in_flight) == 4, "not a pair on each of as many workers as the cores"
        assert len({mode.owner[p.index] for p in in_flight}) == 2, "more workers at once than the cores"
        count(mode, in_flight.pop(0), 10)   # the oldest is counted and placed: one more may go out
        drain(mode)
    assert [w for w, n in given.items() if n] == [0, 1] and sum(given.values()) == 43, given
    assert mode_over(pieces, 2).most_active is None  # as many workers as cores: no bound
