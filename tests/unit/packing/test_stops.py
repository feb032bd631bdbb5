"""A piece that cannot be read (packing/base.py `Stops`, `Mode.failed`), through the modes as
the coordinator drives them, without processes: pieces counted by 3 workers in an order
shuffled by a seed, the failure arriving whenever its worker gets to it, every batch freed at
once. The error comes (`Ended`, or a count-only run's `Error`) after exactly the batches of the
same pieces without the failure that do not need the bad piece: the first whose position after
it is the bad piece's first document, or past it (concat: its next token; best fit: the end of
the last chunk its plan took), whatever the seed; and a count-only run whose position comes
before the bad piece finds it and says nothing of the piece."""
import random
from types import SimpleNamespace

import numpy as np
import pytest

from shmloader.config import LoaderConfig
from shmloader.data.order import Piece
from shmloader.ipc.protocol import Counted, Ended, Error, Located
from shmloader.packing.base import SlotMap
from shmloader.packing.mixbestfit import SourceBestFitMode
from shmloader.packing.mixmode import SourceConcatMode
from shmloader.packing.mixcount import SourceCountMode
from shmloader.ipc.runstart import CountTo, RunStart, SourceStart
from shmloader.position import Position
from tests.unit.packing.modes import hand_out

N_SLOTS, WORKERS = 3, 3


def rows(piece) -> np.ndarray:
    """Row r of piece (row group) g: 1 to 12 tokens, the same in every run."""
    return (np.arange(piece.doc_start, piece.doc_end) * 7 + piece.rg * 3) % 12 + 1


def order(n_docs: int):
    """One piece a row group of `n_docs` rows (whole best-fit chunks of 4), file 0, epoch 1."""
    return lambda ramp, cap, first: (Piece(i, 1, 0, i - first, 0, n_docs) for i in range(first, 10**6))


def concat_mode(T: int = 7, n_docs: int = 4, lengths=rows):
    cfg = LoaderConfig(1, T, n_slots=N_SLOTS)
    run = SimpleNamespace(layout=SimpleNamespace(window=cfg.window, n_slots=N_SLOTS),
                          start=RunStart(Position(1, 0, 0), SourceStart()))
    return SourceConcatMode(cfg, run, WORKERS, order(n_docs)), lengths


def bestfit_mode():
    cfg = SimpleNamespace(B=2, T=9, buffer_size=6, tokenizer_batch_size=4, max_piece_docs=8, max_piece_bytes=None, workers_at_once=None)
    run = SimpleNamespace(layout=SimpleNamespace(n_slots=N_SLOTS), start=RunStart(Position(1, 0, 0), SourceStart()))
    return SourceBestFitMode(cfg, run, WORKERS, order(8)), rows


def drive(made, bad=(), seed: int = 0, batches: int = 40) -> tuple:
    """`(the batches announced, the messages)`: up to `batches` batches or the first message;
    piece `bad` (an index or a set of them) fails when its worker gets to it."""
    bad = {bad} if isinstance(bad, int) else set(bad)
    mode, lengths = made
    slots, rng, given, done, said = SlotMap(N_SLOTS), random.Random(seed), [], [], []
    for _ in range(10**4):
        given += hand_out(mode, WORKERS)
        rng.shuffle(given)
        for piece in given[:rng.randint(1, max(1, len(given)))]:
            given.remove(piece)
            if piece.index in bad:
                assert mode.failed(piece.index, Error("data", f"piece {piece.index} cannot be read", ""))
            else:
                mode.counted(Counted(piece.index, lengths(piece), None))
        for _, order_ in mode.orders(slots.take_slot):
            if hasattr(order_, "segments"):
                mode.written([(k, n) for k, _, _, _, n in order_.segments])
            else:
                mode.written([(order_.batch, sum(p[4] for p in order_.placements))])
        for complete in mode.ready():
            done.append(complete)
            slots.release(complete.batch)
            mode.freed(complete.batch)
        said += list(mode.messages())
        if said or len(done) >= batches:
            assert list(mode.messages()) == [], "said twice"
            return done, said
    pytest.fail("the mode went no further")


def needs(done: list, bad: int) -> int:
    """The first batch whose position after it is at the bad piece's first document or past it."""
    return next(c.batch for c in done if tuple(c.position)[:4] >= (1, 0, bad, 0))


@pytest.mark.parametrize("bad", [2, 5, 9])
@pytest.mark.parametrize("make", [concat_mode, bestfit_mode], ids=["concat", "bestfit"])
def test_the_error_comes_after_exactly_the_batches_that_do_not_need_the_bad_piece(make, bad):
    good, _ = drive(make(), batches=60)
    n = needs(good, bad)
    assert 0 < n < 40
    for seed in range(8):
        done, said = drive(make(), bad, seed)
        assert said == [Ended(f"piece {bad} cannot be read")], f"seed {seed}: {said}"
        assert [c.batch for c in done] == list(range(n)), f"seed {seed}: {len(done)} batches, not {n}"
        assert [(c.position, c.docs) for c in done] == [(c.position, c.docs) for c in good[:n]]


def test_a_concat_batch_that_ends_where_the_bad_piece_begins_needs_it():
    """Pieces of 16 tokens, windows of 8: piece 5 begins where batch 9 ends. Batch 9's tokens are
    good, but its state names the place after it, the bad piece's first document: the error comes
    instead of batch 9 (`ConcatSequencer.complete_before`), as without the failure batch 9 waits
    for piece 5's count."""
    made = lambda: concat_mode(T=7, n_docs=4, lengths=lambda piece: np.full(piece.n_docs, 4))  # noqa: E731
    good, _ = drive(made(), batches=20)
    assert tuple(good[9].position) == (1, 0, 5, 0, 0) and needs(good, 5) == 9
    for seed in range(4):
        done, said = drive(made(), 5, seed)
        assert len(done) == 9 and said == [Ended("piece 5 cannot be read")]


def test_the_first_bad_piece_in_the_stream_is_the_one_raised_once():
    good, _ = drive(concat_mode(), batches=60)
    for seed in range(8):  # piece 7 fails first in some of these orders
        done, said = drive(concat_mode(), {3, 7}, seed)
        assert said == [Ended("piece 3 cannot be read")] and len(done) == needs(good, 3), f"seed {seed}"


@pytest.mark.parametrize("bad, found", [(3, False), (40, True)])
def test_a_count_only_run_raises_a_bad_piece_only_when_its_replay_needs_it(bad, found):
    """Finding batch 20's position needs pieces 0-~20 (a piece of 4 rows of 1-12 tokens, windows
    of 8): a bad piece among them is its `Error`, one past them is never said."""
    cfg = LoaderConfig(1, 7, n_slots=2)
    run = SimpleNamespace(start=RunStart(Position(1, 0, 0), SourceStart(), 0, CountTo([[0, 1, 7]], 20)), layout=None)
    mode = SourceCountMode(cfg, run, WORKERS, order(4))
    error = Error("data", f"piece {bad} cannot be read", "")
    said = []
    for _ in range(200):
        for piece in hand_out(mode, WORKERS):
            if piece.index == bad:
                mode.failed(piece.index, error)
            else:
                mode.counted(Counted(piece.index, rows(piece), None))
        said += [m for m in mode.messages() if not type(m).__name__ == "Progress"]
        if said:
            break
    assert len(said) == 1 and isinstance(said[0], Located) == found and (found or said[0] == error), said
