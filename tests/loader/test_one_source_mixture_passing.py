"""A mixture of one source passes its pieces whole (packing/mixone.py) where nothing can make it
mix: against the same source's mixture with a schedule that changes nothing (two stages of the
same weight: not a pass-through, so the mix's stream), read as a client reads it, the same
batches and the same places and counts in every state; each run's state, resumed by a mixture
that adds a second source (no pass-through then), goes on with the same batches. In-process,
tests/unit/packing/test_mixone.py compares the two paths' every point character for character."""
import json

import pytest

import shmloader
from tests.loader.test_one_source_mixture import FIT, batches, dirs, same  # noqa: F401 (dirs: a fixture)


def _one(dirs, schedule: bool):
    weights = [(0, {"x": 1}), (10_000, {"x": 1})] if schedule else {"x": 1}
    return shmloader.Mixture({"x": dirs["a"]}, weights)


def _places(state) -> dict:
    """A state's point without the mixture's digest (a schedule is another mixture)."""
    point = json.loads(state["mixture"]["point"])
    point["mixer"] = {k: v for k, v in point["mixer"].items() if k != "mixture"}
    return point


@pytest.mark.parametrize("kw", [{}, FIT], ids=["concat", "bestfit"])
def test_a_pass_through_is_the_stream_and_resumes_as_it_with_a_second_source(dirs, kw):
    passing, states = batches(_one(dirs, False), 40, 2, **kw)
    stream, stream_states = batches(_one(dirs, True), 40, 2, **kw)
    assert same(passing, stream)
    assert [_places(s) for s in states] == [_places(s) for s in stream_states]
    two = shmloader.Mixture({"x": dirs["a"], "b": dirs["b"]}, {"x": 1, "b": 1})
    for k in (7, 25):
        with pytest.warns(UserWarning, match="new to the state"):
            after, _ = batches(two, 20, 2, resume_state=states[k - 1], **kw)
        with pytest.warns(UserWarning, match="new to the state"):
            want, _ = batches(two, 20, 2, resume_state=stream_states[k - 1], **kw)
        assert same(after, want), k
