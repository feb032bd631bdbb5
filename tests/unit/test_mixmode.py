"""packing/mixmode.py without processes: what a mixture's mode hands out when the workers are at
their hold budget."""
from types import SimpleNamespace

import numpy as np

from shmloader.data.mixture import Mixture
from shmloader.data.order import Piece
from shmloader.data.sources import Range
from shmloader.ipc.protocol import Counted, MixArgs
from shmloader.packing.base import SlotMap
from shmloader.packing.mixmode import MixConcatMode
from tests.unit.modes import hand_out


def pieces(ramp, cap, first_index, files=None, start=None, plan=None):
    """A source's order: heavy's pieces (files 0-1) hold 3 rows, light's (files 2-3) one."""
    lo, _ = files
    return (Piece(i, 1, lo, i, 0, 3 if lo == 0 else 1) for i in range(10**6))


def test_the_source_the_mix_waits_for_goes_out_past_the_budget():
    mix = Mixture({"heavy": "h", "light": "l"}, {"heavy": 0.9, "light": 0.1})
    ranges = (Range("heavy", 0, 2), Range("light", 2, 4))
    run = SimpleNamespace(mixture=MixArgs(mix, ranges, None, 0), rank=0,
                          layout=SimpleNamespace(window=11, n_slots=2))
    cfg = SimpleNamespace(max_piece_bytes=None, max_piece_docs=1024)
    rows = {"heavy": [6, 6, 6], "light": [2]}
    mode = MixConcatMode(cfg, run, 1, pieces)
    slots = SlotMap(2)
    waited = 0
    for _ in range(200):  # the trainer never frees a batch: the ring fills, then the budget
        given = hand_out(mode)
        for piece in given:
            name = "heavy" if piece.file < 2 else "light"
            mode.counted(Counted(piece.index, np.array(rows[name], dtype=np.int64), None))
        list(mode.orders(slots.take_slot))
        if mode.stream.waiting_for():
            waited += 1
            assert mode.can_take(0), "the mix waits for a source that no worker may be given"
        if not given:
            break
    assert waited
    assert mode._held_tokens[0] > mode.hold_tokens(0)  # the worker was over its budget
