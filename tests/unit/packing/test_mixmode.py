"""packing/mixmode.py without processes: what a mixture's mode hands out when the workers are at
their hold budget; a source whose order cannot be read on."""
import random
from types import SimpleNamespace

import numpy as np
import pytest

from shmloader.data.mixture import Mixer, Mixture
from shmloader.data.order import Piece
from shmloader.errors import DataError
from shmloader.data.sources import Range
from shmloader.ipc.protocol import Counted, Ended, MixArgs
from shmloader.ipc.runstart import MixStart, RunStart
from shmloader.packing.base import SlotMap
from shmloader.packing.mixmode import MixConcatMode
from tests.unit.packing.modes import hand_out, turn


def pieces(ramp, cap, first_index, files=None, start=None, plan=None, later=None):
    """A source's order: heavy's pieces (files 0-1) hold 3 rows, light's (files 2-3) one."""
    lo, _ = files
    return (Piece(i, 1, lo, i, 0, 3 if lo == 0 else 1) for i in range(10**6))


def test_the_source_the_mix_waits_for_goes_out_past_the_budget():
    mix = Mixture({"heavy": "h", "light": "l"}, {"heavy": 0.9, "light": 0.1})
    ranges = (Range("heavy", 0, 2), Range("light", 2, 4))
    run = SimpleNamespace(mixture=MixArgs(mix, ranges), start=RunStart(None, MixStart()), rank=0,
                          layout=SimpleNamespace(window=11, n_slots=2))
    cfg = SimpleNamespace(max_piece_bytes=None, max_piece_docs=1024, workers_at_once=None)
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
    run = SimpleNamespace(mixture=MixArgs(mix, (Range("heavy", 0, 2), Range("light", 2, 4))),
                          start=RunStart(None, MixStart(point), 7), rank=0,
                          layout=SimpleNamespace(window=11, n_slots=2))
    mode = MixConcatMode(SimpleNamespace(max_piece_bytes=None, max_piece_docs=1024, workers_at_once=None), run, 1, pieces)
    assert hand_out(mode) == [] and mode.ready() == []
    said = list(mode.messages())
    assert [type(m) for m in said] == [Ended] and said[0].text == mixer.over(), said
    assert "(heavy, light: max_epochs); nothing is left to read" in said[0].text


def _unreadable_after(n: int):
    """`pieces` whose light source's order cannot be read on after its `n` first pieces (a file
    whose footer cannot be read: the coordinator's order raises `DataError` there)."""
    def order(ramp, cap, first_index, files=None, start=None, plan=None, later=None):
        lo, _ = files
        for i in range(10**6):
            if lo == 2 and i == n:
                raise DataError(f"light{i}.parquet: not a readable parquet file")
            yield Piece(i, 1, lo, i, 0, 3 if lo == 0 else 1)
    return order


def _drive(order, seed: int, batches: int = 60) -> tuple:
    """`(batches announced, messages)`: pieces counted in an order shuffled by `seed` (by up to 3
    workers, every batch freed at once), as the coordinator drives the mode."""
    mix = Mixture({"heavy": "h", "light": "l"}, {"heavy": 0.7, "light": 0.3})
    run = SimpleNamespace(mixture=MixArgs(mix, (Range("heavy", 0, 2), Range("light", 2, 4))),
                          start=RunStart(None, MixStart()), rank=0,
                          layout=SimpleNamespace(window=11, n_slots=3))
    mode = MixConcatMode(SimpleNamespace(max_piece_bytes=None, max_piece_docs=1024, workers_at_once=None), run, 3, order)
    rows = {"heavy": [6, 6, 6], "light": [2]}
    slots, rng, given, done, said = SlotMap(3), random.Random(seed), [], [], []
    for _ in range(10**4):
        given += hand_out(mode, 3)
        rng.shuffle(given)
        for piece in given[:rng.randint(1, max(1, len(given)))]:
            given.remove(piece)
            mode.counted(Counted(piece.index, np.array(rows["heavy" if piece.file < 2 else "light"]), None))
        done += turn(mode, slots)[1]
        said += [m for m in mode.messages() if isinstance(m, Ended)]
        if said or len(done) >= batches:
            return done, said
    raise AssertionError("the mode went no further")


def test_a_source_whose_order_cannot_be_read_on_stops_the_mix_where_it_needs_it():
    """light's order cannot be read on after its 20 first pieces (the coordinator cannot read a
    footer of its): nothing is raised when the order is planned (it was, ahead of the stream, at
    a batch that depended on the timing); the mix stops where it needs light's next document,
    whichever source it would then pick, and says the error (`Ended`, naming the source) after
    exactly the batches whose point has light's next document before it, in every order of
    counting: also when the mix already waits for light when its order fails (then nothing else
    is counted before the stop)."""
    good, _ = _drive(_unreadable_after(10**6), 0)
    lo = next(c.batch for c in good if tuple(c.runs.sources["light"])[:4] >= (1, 2, 20, 0))
    assert 5 < lo < 50, lo
    for seed in range(6):
        done, said = _drive(_unreadable_after(20), seed)
        assert [c.batch for c in done] == list(range(lo)), f"seed {seed}: {len(done)} batches, not {lo}"
        assert [c.position for c in done] == [c.position for c in good[:lo]], f"seed {seed}"
        assert len(said) == 1 and "mixture source 'light': light20.parquet: not a readable parquet file" in said[0].text
        assert said[0].text.startswith("coordinator (pid "), said


def _ending_heavy(n_heavy: int, n_light: int):
    """heavy's order: `n_heavy` pieces of epoch 1, then epoch 2 (its `max_epochs` is 1); light's
    cannot be read on after its `n_light` first pieces."""
    def order(ramp, cap, first_index, files=None, start=None, plan=None, later=None):
        lo, _ = files
        for i in range(10**6):
            if lo == 2 and i == n_light:
                raise DataError(f"light{i}.parquet: not a readable parquet file")
            yield Piece(i, 1 if lo == 2 or i < n_heavy else 2, lo, i, 0, 3 if lo == 0 else 1)
    return order


@pytest.mark.parametrize("n_heavy, n_light, w_heavy", [(3, 2, 0.8), (5, 1, 0.95), (5, 6, 0.8)])
def test_a_source_whose_order_fails_when_the_mix_waits_for_it_alone_stops_it_at_once(n_heavy, n_light, w_heavy):
    """heavy has read its max_epochs, the mix waits for light's next document, and light's order
    fails only then, with every piece of light counted: nothing more will be counted, so the
    mode flows the mix at once (`MixFeed`'s `stopping`) and says the error after the batches
    before it. Without that the mix waited for light forever (next(): a LoaderTimeout instead
    of the error)."""
    mix = Mixture({"heavy": "h", "light": "l"}, {"heavy": w_heavy, "light": 1 - w_heavy}, max_epochs={"heavy": 1})

    def drive(order):
        run = SimpleNamespace(mixture=MixArgs(mix, (Range("heavy", 0, 2), Range("light", 2, 4))),
                          start=RunStart(None, MixStart()), rank=0,
                              layout=SimpleNamespace(window=11, n_slots=3))
        mode = MixConcatMode(SimpleNamespace(max_piece_bytes=None, max_piece_docs=1024, workers_at_once=None), run, 1, order)
        slots, done = SlotMap(3), []
        for _ in range(200):
            for piece in hand_out(mode, 1):  # each counted at once, in order
                mode.counted(Counted(piece.index, np.array([6, 6, 6] if piece.file < 2 else [2]), None))
            done += turn(mode, slots)[1]
            said = [m for m in mode.messages() if isinstance(m, Ended)]
            if said:
                return done, said
        return done, []

    good, _ = drive(_ending_heavy(n_heavy, 10**6))  # light alone after heavy's end, on and on
    lo = next(c.batch for c in good if tuple(c.runs.sources["light"])[:4] >= (1, 2, n_light, 0))
    done, said = drive(_ending_heavy(n_heavy, n_light))
    assert len(said) == 1 and f"mixture source 'light': light{n_light}.parquet" in said[0].text, said
    assert [c.position for c in done] == [c.position for c in good[:lo]]
