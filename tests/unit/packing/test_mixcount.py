"""packing/mixcount.py without processes: a count-only replay of a mixture finds, at every batch
count, the point (and best fit's buffer) the live mode announced after that batch, including
batches that end exactly at a document's end, before nulls, or inside a document."""
from types import SimpleNamespace

import numpy as np
import pytest

from shmloader.data.mixture import Mixture
from shmloader.data.order import Piece
from shmloader.ipc.protocol import Counted, Located, MixArgs
from shmloader.ipc.runstart import CountTo, MixStart, RunStart
from shmloader.packing.base import SlotMap
from shmloader.packing.mixcount import MixCountMode
from shmloader.packing.mixmode import MixConcatMode
from tests.unit.packing.modes import hand_out, turn
from tests.unit.packing.test_mixbestfit import RANGES, drive, lengths, pieces

B, T = 2, 5                   # concat windows of 11 tokens: documents of 1-9 tokens end on them often
MIX = Mixture({"long": "l", "short": "s"}, [(0, {"long": 0.6, "short": 0.4}), (9, {"long": 0.2, "short": 0.8})])


def cfg(packing: str):
    return SimpleNamespace(packing=packing, B=B, T=T, buffer_size=12, tokenizer_batch_size=5, max_piece_docs=1024,
                           max_piece_bytes=None, workers_at_once=None)


def live_concat(n: int) -> list:
    """The `MixPoint` after each of the first `n` batches of a live concat mode, one worker."""
    run = SimpleNamespace(mixture=MixArgs(MIX, RANGES), start=RunStart(None, MixStart()), rank=0,
                          layout=SimpleNamespace(window=B * T + 1, n_slots=3))
    mode, slots, points = MixConcatMode(cfg("concat"), run, 1, pieces), SlotMap(3), []
    while len(points) < n:
        for piece in hand_out(mode):
            mode.counted(Counted(piece.index, lengths(piece), None))
        points += [done.runs for done in turn(mode, slots)[1]]
    return points[:n]


def located(packing: str, batch: int, workers: int = 2) -> Located:
    """What a count-only run over the same sources says for `batch`, its counts in reverse order."""
    run = SimpleNamespace(mixture=MixArgs(MIX, RANGES), start=RunStart(None, MixStart(), 0, CountTo([[0, B, T]], batch)),
                          rank=0)
    mode = MixCountMode(cfg(packing), run, workers, pieces)
    for _ in range(10**4):
        for piece in reversed(hand_out(mode, workers)):
            mode.counted(Counted(piece.index, lengths(piece), None))
        said = [m for m in mode.messages() if isinstance(m, Located)]
        if said:
            return said[0]
    raise AssertionError("the count never located the batch")


def test_concat_replay_finds_every_batchs_point():
    live = live_concat(30)
    assert {p.skip == 0 for p in live} == {True, False}  # batches ending at a document's end, and inside one
    for k in range(1, 31):
        found = located("concat", k)
        point = live[k - 1]
        assert found.runs == _text(point), k
        assert tuple(found.position) == tuple(point.sources[point.source]._replace(skip=point.skip)), k


def test_bestfit_replay_finds_every_batchs_point_and_buffer():
    from shmloader.packing.mixbestfit import buffer_text

    _, ready, mode = drive(1, 0, batches=25, mixture=MIX, B=B, T=T)
    for k in (1, 2, 7, 9, 10, 25):
        found = located("bos_bestfit", k)
        assert found.runs == buffer_text(ready[k - 1].runs, mode._lo), k
        assert tuple(found.position) == tuple(ready[k - 1].position), k


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_the_answer_is_the_same_whatever_the_workers(packing):
    one, three = located(packing, 12, workers=1), located(packing, 12, workers=3)
    assert (one.position, one.runs) == (three.position, three.runs)


def _text(point) -> str:
    from shmloader.packing.mixtext import point_text

    return point_text(point, {r.name: r.lo for r in RANGES})


def test_lengths_hit_exact_window_ends():
    """The data above does what the tests rely on: whole documents end on window boundaries."""
    ends = np.cumsum([n for i in range(40) for n in lengths(Piece(i, 1, 2, i, 0, 6)) if n])
    assert np.any(ends % (B * T + 1) == 0)


def test_a_resumed_buffers_piece_that_cannot_be_read_is_raised_at_once_not_held():
    """A best-fit count from a point with a buffer re-reads the buffer's pieces first, before the
    feed's: one of them that cannot be read is no piece of the mix (`MixFeed.failed` says no), so
    the coordinator raises it at once; the mix's own pieces are held until the replay needs them.
    (Held in a `Stops` for a mixture too, the prefix's error was never said: the stream stops only
    at its own pieces.)"""
    import json

    from shmloader.ipc.protocol import Error
    from shmloader.packing.mixbestfit import buffer_text

    _, ready, live = drive(1, 0, batches=6, mixture=MIX, B=B, T=T)
    point = json.loads(buffer_text(ready[5].runs, live._lo))
    run = SimpleNamespace(mixture=MixArgs(MIX, RANGES), start=RunStart(None, MixStart(point), 6, CountTo([[0, B, T]], 12)),
                          rank=0)
    mode = MixCountMode(cfg("bos_bestfit"), run, 2, pieces)
    assert mode.n_prefix > 0
    error = Error("data", "cannot be read", "")
    first, *others = hand_out(mode, 2)
    assert first.index == 0 < mode.n_prefix
    assert mode.failed(first.index, error) is False  # not the mix's: raised now
    for _ in range(100):
        for piece in others:
            if piece.index >= mode.n_prefix:
                assert mode.failed(piece.index, error) is True  # the mix's: held until needed
                return
            mode.counted(Counted(piece.index, lengths(piece), None))
        others = hand_out(mode, 2)
    raise AssertionError("no piece of the mix was handed out")
