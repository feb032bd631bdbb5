"""packing/mixbestfit.py without processes: the plans of best fit over a mixture depend on the
document lengths only (not on how many workers count the pieces, nor in which order), the
source the mix waits for goes out past the read-ahead cap, a state's buffer is read back (or
refused) by source, and a piece of the mix that fails after a plan ran out for it ends the run
in that turn."""
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest

from shmloader.data.mixture import Mixture
from shmloader.data.order import Piece
from shmloader.data.sources import Range
from shmloader.ipc.protocol import Counted, MixArgs
from shmloader.ipc.runstart import MixStart, RunStart
from shmloader.packing.base import SlotMap
from shmloader.packing.mixbestfit import MixBestFitMode, buffer_entries, buffer_runs
from tests.unit.packing.modes import hand_out, turn

RANGES = (Range("long", 0, 2), Range("short", 2, 4))


def pieces(ramp, cap, first_index, files=None, start=None, plan=None, later=None):
    """A source's order, one piece a row group: long's hold 4 rows, short's 6."""
    lo, _ = files
    rows = 4 if lo == 0 else 6
    return (Piece(i, 1, lo, i, 0, rows) for i in range(10**6))


def lengths(piece) -> np.ndarray:
    """Row r of row group g: long documents of 5-60 tokens, short ones of 1-9, some nulls."""
    rng = np.random.default_rng(piece.file * 1000 + piece.rg)
    if piece.file < 2:
        out = rng.integers(5, 61, piece.n_docs)
    else:
        out = rng.integers(1, 10, piece.n_docs)
    out[rng.random(piece.n_docs) < 0.15] = 0
    return out.astype(np.int64)


def drive(workers: int, seed: int, batches: int = 40, cap: int | None = None, mixture=None, B: int = 2, T: int = 31):
    """Plans of `batches` batches with `workers` workers whose counts arrive in an order shuffled
    by `seed`; each placement as `(batch, row, offset, n, file, rg, row of the document)`; the
    batches' `Complete`s; the mode."""
    mix = mixture or Mixture({"long": "l", "short": "s"}, {"long": 0.6, "short": 0.4})
    run = SimpleNamespace(mixture=MixArgs(mix, RANGES), start=RunStart(None, MixStart()), rank=0,
                          layout=SimpleNamespace(window=0, n_slots=3))
    cfg = SimpleNamespace(B=B, T=T, buffer_size=12, tokenizer_batch_size=5, max_piece_docs=1024,
                          max_piece_bytes=None, workers_at_once=None)
    mode = MixBestFitMode(cfg, run, workers, pieces)
    mode.cap = mode.cap if cap is None else cap
    slots, rng, out, ready = SlotMap(3), random.Random(seed), [], []
    given, handed = [], {}
    for _ in range(10**4):
        for piece in hand_out(mode, workers):
            given.append(piece)
            handed[piece.index] = piece
        rng.shuffle(given)
        for piece in given[:rng.randint(1, max(1, len(given)))]:  # some of them, in any order
            given.remove(piece)
            mode.counted(Counted(piece.index, lengths(piece), None))
        orders, done = turn(mode, slots)
        for order in orders:
            for index, row, r, off, n in order.placements:
                p = handed[index]
                out.append((order.batch, r, off, n, p.file, p.rg, p.doc_start + row))
        ready += done
        if len(ready) >= batches:
            return sorted(out)[:sum(1 for o in out if o[0] < batches)], ready[:batches], mode
    raise AssertionError("the plans stopped: the mix waits for a piece no worker may take")


SCHEDULE = Mixture({"long": "l", "short": "s"}, [(0, {"long": 0.6, "short": 0.4}), (13, {"long": 0.1, "short": 0.9})])


def test_plans_are_the_same_whatever_the_workers_and_the_order_of_counts():
    """And so are the points after them (the mixer's state with them, a stage begun on the way)."""
    want, ready, _ = drive(1, 0, mixture=SCHEDULE)
    assert len(want) > 100 and {o[4] < 2 for o in want} == {True, False}  # both sources placed
    assert ready[-1].runs.point.mixer["stage"] == 1
    for workers, seed in ((2, 1), (3, 2), (3, 7)):
        got, done, _ = drive(workers, seed, mixture=SCHEDULE)
        assert got == want, (workers, seed)
        assert [d.runs.point for d in done] == [d.runs.point for d in ready]
        assert all(np.array_equal(a.runs.runs, b.runs.runs) for a, b in zip(done, ready))


def test_every_row_is_full_and_no_document_is_placed_twice():
    placed, _, _ = drive(2, 3)
    by_row = {}
    for batch, r, off, n, *doc in placed:
        by_row.setdefault((batch, r), []).append((off, n))
    for spans in by_row.values():
        assert sorted(spans)[0][0] == 0 and sum(n for _, n in spans) == 32
    docs = [tuple(p[4:]) for p in placed]
    assert len(docs) == len(set(docs))


def test_without_read_ahead_the_mix_is_still_fed():
    """A read-ahead cap of 0 documents: a piece goes out only for the source the mix waits for,
    or while the planner waits with nothing being read; the plans go on, and are the same."""
    want, _, _ = drive(1, 0, batches=10)
    for workers in (1, 3):
        got, _, _ = drive(workers, 4, batches=10, cap=0)
        assert got == want


def test_a_buffers_runs_by_source_are_the_tables_runs_with_each_file_numbered_in_its_source():
    """`MixPieceTable.local_runs`: the piece table's runs of documents in arrival order (sources alternating,
    a piece's next row after another piece's, nulls between), each run's file mapped to its
    source's index and its number within the source."""
    from shmloader.data.order import Piece
    from shmloader.packing.mixbestfit import MixPieceTable

    lo = {"b": 3, "a": 0, "c": 5}   # sorted by first file: a, b, c
    firsts = np.array([0, 3, 5])
    # (file, rg, first row, rows): piece 3 goes on from piece 0 in its row group; piece 5 would
    # go on from piece 0's rows in the same file within its source and rg, but is source b's
    pieces = [(0, 0, 0, 9), (3, 1, 4, 6), (5, 0, 0, 7), (0, 0, 9, 5), (4, 2, 0, 8), (3, 0, 9, 4), (0, 0, 14, 3)]
    checked = seams = 0
    for seed in range(40):
        table, base, ids = MixPieceTable(lo), 0, []
        rng = np.random.default_rng(seed)
        for index, (file, rg, start, n) in enumerate(pieces):
            table.add(base, Piece(index, 1 + index % 2, file, rg, start, start + n))
            ids.append(base + np.arange(n))
            base += n
        if seed % 4 == 3:  # a piece gone: the table's arrays made again
            table.remove(1)
            ids[1] = ids[1][:0]
        order = np.concatenate([rng.permutation(x)[:len(x) - 1] for x in ids])
        order = np.sort(order) if seed % 2 else np.sort(order)[rng.permutation(len(order))][:40]
        runs, got = table.runs(order), table.local_runs(order)
        which = np.searchsorted(firsts, runs[:, 1], side="right") - 1
        assert got.tolist() == np.column_stack((which, runs[:, 0], runs[:, 1] - firsts[which], runs[:, 2:])).tolist()
        table_files = [p[0] for p in pieces]
        plan_tokens = rng.integers(1, 100, len(order))
        want = np.bincount(np.searchsorted(firsts, np.array(table_files)[table.piece_of(order)], side="right") - 1,
                           weights=plan_tokens, minlength=3).astype(np.int64).tolist()
        assert table.tokens_by_source(order, plan_tokens) == want
        checked += len(runs)
        seams += int(np.count_nonzero(got[:, 5] > 1))
    assert checked > 500 and seams > 20
    table, base, ids = MixPieceTable(lo), 0, []
    for index, (file, rg, start, n) in enumerate(pieces):
        table.add(base, Piece(index, 1, file, rg, start, start + n))
        ids.append(base + np.arange(n))
        base += n
    # a's file 0, rg 0: rows 0-16 over three pieces, one run; b's piece 5 does not go on from a's
    assert table.local_runs(np.concatenate((ids[0], ids[3], ids[6]))).tolist() == [[0, 1, 0, 0, 0, 17]]
    assert table.local_runs(np.concatenate((ids[0], ids[5]))).tolist() == [[0, 1, 0, 0, 0, 9], [1, 1, 0, 0, 9, 4]]
    assert table.local_runs(order[:0]).shape == (0, 6)


def test_a_buffer_is_written_and_read_back_by_source_and_a_left_out_one_refused():
    from shmloader.packing.mix import MixPoint
    from shmloader.packing.mixbestfit import MixBuffer, buffer_text
    from shmloader.position import Position

    lo = {"long": 0, "short": 2}
    runs = np.array([[2, 3, 4, 0, 3], [1, 0, 7, 2, 1], [1, 3, 300, 9, 2]], dtype=np.int64)  # the run's numbering
    local = np.array([[1, 2, 1, 4, 0, 3], [0, 1, 0, 7, 2, 1], [1, 1, 1, 300, 9, 2]], dtype=np.int64)  # by source
    start = MixPoint("long", 0, {"long": Position(1, 0, 0, 0), "short": Position(1, 2, 0, 0)}, {})
    point = json.loads(buffer_text(MixBuffer(start, local), lo))
    assert buffer_entries(point) == [["short", 2, 1, 4, 0, 3], ["long", 1, 0, 7, 2, 1], ["short", 1, 1, 300, 9, 2]]
    assert buffer_runs(point, lo) == runs.tolist()
    assert buffer_runs(None, lo) == [] and buffer_runs(json.loads(buffer_text(MixBuffer(start, local[:0]), lo)), lo) == []
    with pytest.raises(ValueError, match="source 'short'.*not built yet"):
        buffer_runs(point, {"long": 0})
    for bad in ({"sources": ["long"], "runs": "u1:0102"}, {"sources": ["long"], "runs": "u1:010000000000"},
                {"sources": [], "runs": "u1:000100000001"}, {"runs": ""}, ["long", 1, 0, 7, 2, 1]):
        with pytest.raises(ValueError, match="buffer"):
            buffer_runs({"buffer": bad}, {"long": 0})


def test_a_mix_that_ends_announces_every_batch_it_planned_then_ends():
    """Sources that read their max_epochs: the last chunk is short, the plan that needs more is
    undone for good (its chunks back in the queue), and `Ended` follows the last batch."""
    from shmloader.ipc.protocol import Ended

    def epochs(ramp, cap, first_index, files=None, start=None, plan=None, later=None):
        lo, _ = files
        return (Piece(i, 1 + i // 5, lo, i % 5, 0, 4 if lo == 0 else 6) for i in range(10**6))

    mix = Mixture({"long": "l", "short": "s"}, {"long": 0.6, "short": 0.4}, max_epochs={"long": 2, "short": 3})
    run = SimpleNamespace(mixture=MixArgs(mix, RANGES), start=RunStart(None, MixStart()), rank=0,
                          layout=SimpleNamespace(window=0, n_slots=3))
    cfg = SimpleNamespace(B=2, T=31, buffer_size=12, tokenizer_batch_size=5, max_piece_docs=1024, max_piece_bytes=None, workers_at_once=None)
    mode, slots, ready = MixBestFitMode(cfg, run, 1, epochs), SlotMap(3), []
    for _ in range(2000):
        for piece in hand_out(mode):
            mode.counted(Counted(piece.index, lengths(piece), None))
        ready += turn(mode, slots)[1]
        said = [m for m in mode.messages() if isinstance(m, Ended)]
        if said:
            break
    assert said and "nothing is left to read" in said[0].text and len(ready) == mode.seq.planned > 5


@pytest.mark.parametrize("bad", [4, 7, 12])
def test_a_mix_piece_that_fails_after_a_plan_ran_out_for_it_ends_the_run_at_once(bad):
    """One worker; short's piece `bad` fails only once every other piece out is counted and a
    plan ran out waiting for it. The failure itself is a change of the mix (`MixStream.version`):
    the plan is tried again at once, finds the mix stopped there, and `Ended` names the error in
    that same turn, with no piece handed out or counted after the failure; the batches before it
    are those of a run where it does not fail."""
    from shmloader.ipc.protocol import Ended, Error

    _, good, _ = drive(1, 0, batches=80)
    run = SimpleNamespace(mixture=MixArgs(Mixture({"long": "l", "short": "s"}, {"long": 0.6, "short": 0.4}), RANGES),
                          start=RunStart(None, MixStart()), rank=0, layout=SimpleNamespace(window=0, n_slots=3))
    cfg = SimpleNamespace(B=2, T=31, buffer_size=12, tokenizer_batch_size=5, max_piece_docs=1024, max_piece_bytes=None, workers_at_once=None)
    mode, slots, ready, held = MixBestFitMode(cfg, run, 1, pieces), SlotMap(3), [], None

    def turned() -> list:
        ready.extend(turn(mode, slots)[1])
        return list(mode.messages())

    for _ in range(2000):
        given = hand_out(mode)
        for piece in given:
            if piece.file >= 2 and piece.rg == bad:
                held = piece  # its worker gets to it last
            else:
                mode.counted(Counted(piece.index, lengths(piece), None))
        assert not [m for m in turned() if isinstance(m, Ended)]
        if held is not None and not given and mode.seq.starved:
            break
    assert held is not None and mode.seq.starved and len(ready) > 0, (held, len(ready))
    assert mode.failed(held.index, Error("data", f"short{bad}.parquet: not a readable parquet file", ""))
    said = [m for m in turned() if isinstance(m, Ended)]
    assert hand_out(mode) == []
    assert len(said) == 1 and f"short{bad}.parquet" in said[0].text, said
    assert [d.position for d in ready] == [d.position for d in good[:len(ready)]]
    assert turned() == [] and hand_out(mode) == []
