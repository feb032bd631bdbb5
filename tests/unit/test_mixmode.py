"""packing/mixmode.py without processes: what a mixture's mode hands out when the workers are at
their hold budget."""
from types import SimpleNamespace

import numpy as np

from shmloader.data.mixture import Mixer, Mixture
from shmloader.data.order import Piece
from shmloader.data.sources import Range
from shmloader.ipc.protocol import Counted, Ended, MixArgs
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


def test_a_state_saved_at_the_mixs_end_ends_before_any_piece():
    """A concat batch that ends where the mix ended saves a mixer that is over (`Mixer.over`):
    resuming it hands out nothing and says `Ended` with the end's words at once (no wait for a
    count that never comes), as the run it was saved from ended."""
    mix = Mixture({"heavy": "h", "light": "l"}, {"heavy": 0.9, "light": 0.1}, max_epochs={"heavy": 1, "light": 1})
    mixer = Mixer(mix)
    mixer.end("heavy")
    mixer.end("light")
    point = {"source": "heavy", "skip": 0, "sources": {"heavy": [2, 0, 0, 0], "light": [2, 2, 0, 0]},
             "mixer": mixer.state()}
    run = SimpleNamespace(mixture=MixArgs(mix, (Range("heavy", 0, 2), Range("light", 2, 4)), point, 7), rank=0,
                          layout=SimpleNamespace(window=11, n_slots=2))
    mode = MixConcatMode(SimpleNamespace(max_piece_bytes=None, max_piece_docs=1024), run, 1, pieces)
    assert hand_out(mode) == [] and mode.ready() == []
    said = list(mode.messages())
    assert [type(m) for m in said] == [Ended] and said[0].text == mixer.over(), said
    assert "(heavy, light: max_epochs); nothing is left to read" in said[0].text
