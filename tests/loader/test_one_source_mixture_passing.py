"""A mixture of one source passes its pieces whole (packing/mixone.py) where nothing can make it
mix: against the same source's mixture with a schedule that changes nothing (two stages of the
same weight: not a pass-through, so the mix's stream), read as a client reads it, the same
batches and the same places and counts in every state; each run's state, resumed by a mixture
that adds a second source (no pass-through then), goes on with the same batches. That the first
run is a pass-through and the second not is checked on what the loader gives the coordinator
(`passes` of its `MixArgs`) and, for concat, on the points it packs. In-process,
tests/unit/packing/test_mixone.py compares the two paths' every point character for character."""
import json
import marshal
from types import SimpleNamespace

import pytest

import shmloader
from shmloader import kinds, mixstate
from shmloader.data.mixture import Mixer
from shmloader.packing.mixone import passes
from shmloader.packing.mixtext import Packed
from tests.loader.test_one_source_mixture import FIT, batches, dirs, same  # noqa: F401 (dirs: a fixture)


def _one(dirs, schedule: bool):
    weights = [(0, {"x": 1}), (10_000, {"x": 1})] if schedule else {"x": 1}
    return shmloader.Mixture({"x": dirs["a"]}, weights)


def _places(state) -> dict:
    """A state's point without the mixture's digest (a schedule is another mixture)."""
    point = json.loads(state["mixture"]["point"])
    point["mixer"] = {k: v for k, v in point["mixer"].items() if k != "mixture"}
    return point


def _batches_seen(monkeypatch, *args, **kw) -> tuple:
    """`batches(...)`, and what its runs were: `(passes` of each run's `MixArgs` and start as the
    loader gives them to the coordinator (kinds.py `Mixed.run_args`), the number of values of
    each packed point the trainer copied out of a slot`)` (a concat pass-through's are 8: `mixtext.packed_passing`; the stream's 4;
    best fit's 7 either way, its buffer's: `packed_with_buffer`)."""
    runs, packed = [], set()
    with monkeypatch.context() as mp:
        def run_args(*a):
            fields = run_args.__wrapped__(*a)
            run = SimpleNamespace(**fields)
            runs.append(passes(run, Mixer(run.mixture.mixture, run.start.batch)))
            return fields

        def slot_point(*a):
            point = slot_point.__wrapped__(*a)
            if type(point) is Packed:
                packed.add(len(marshal.loads(point.data)))
            return point
        run_args.__wrapped__, slot_point.__wrapped__ = kinds.Mixed.run_args, mixstate.slot_point
        mp.setattr(kinds.Mixed, "run_args", run_args)
        mp.setattr(mixstate, "slot_point", slot_point)
        out = batches(*args, **kw)
    return out, runs, packed


@pytest.mark.parametrize("kw", [{}, FIT], ids=["concat", "bestfit"])
def test_a_pass_through_is_the_stream_and_resumes_as_it_with_a_second_source(dirs, kw, monkeypatch):
    (passing, states), runs, packed = _batches_seen(monkeypatch, _one(dirs, False), 40, 2, **kw)
    assert runs and all(runs), runs  # the run is a pass-through ...
    assert packed == ({8} if not kw else {7}), packed  # ... and concat's coordinator took it as one
    (stream, stream_states), runs, packed = _batches_seen(monkeypatch, _one(dirs, True), 40, 2, **kw)
    assert runs and not any(runs), runs  # the schedule's run is not
    assert packed == ({4} if not kw else {7}), packed
    assert same(passing, stream)
    assert [_places(s) for s in states] == [_places(s) for s in stream_states]
    two = shmloader.Mixture({"x": dirs["a"], "b": dirs["b"]}, {"x": 1, "b": 1})
    for k in (7, 25):
        with pytest.warns(UserWarning, match="new to the state"):
            after, _ = batches(two, 20, 2, resume_state=states[k - 1], **kw)
        with pytest.warns(UserWarning, match="new to the state"):
            want, _ = batches(two, 20, 2, resume_state=stream_states[k - 1], **kw)
        assert same(after, want), k
