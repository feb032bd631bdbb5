"""Another rank's state of a mixture whose batch shape changed during the run resumes this rank
exactly (issue 50, step 2), as one source's does: a run of two ranks at B=4, T=64 to batch 8,
resumed at B=2, T=96 to batch 18, then at B=4, T=64 again to batch 24; rank 1 given rank 0's
state there finds the place its own state says (point and position) and gives the batches its
own run gives, concat and best fit, with one stage of weights and with a schedule whose stage
begins inside the second shape. The replay is one count a batch shape, each from the point the
last found, as the rank's run resumed there (mixstate.py `Mixed.replay`, packing/mixcount.py)."""
import itertools
import json

import numpy as np
import pytest

import shmloader
from tests.cases import cross
from tests.helpers import IntTokenizer
from tests.loader.test_one_source_mixture import FIT, v6

SHAPES = ((8, 4, 64), (10, 2, 96), (6, 4, 64))  # (batches, B, T) of each leg of the run
AFTER = 10


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return v6.write_data(tmp_path_factory.mktemp("reshaped"))


def mix(dirs, schedule):
    weights = [(0, {"a": 1, "b": 2}), (13, {"a": 3, "b": 1})] if schedule else {"a": 1, "b": 2}
    return shmloader.Mixture({"a": dirs["a"], "b": dirs["b"]}, weights)


def leg(dirs, schedule, rank, B, T, n, state=None, **kw):
    """`n` batches of rank `rank` of 2 at B, T from `state`: (batches, the state before them, after)."""
    with shmloader.ShmLoader(mix(dirs, schedule), IntTokenizer(), B, T, num_workers=2, device="cpu", rank=rank,
                             world_size=2, resume_state=state, **kw) as loader:
        before = loader.state_dict()
        got = [(x.numpy().copy(), y.numpy().copy()) for x, y in itertools.islice(loader, n)]
        after = loader.state_dict()
    assert len(got) == n
    return got, before, after


@pytest.mark.filterwarnings("ignore:resume state was saved with another batch shape")
# default: weights in concat, a schedule in best fit; the other two with -m slow
@pytest.mark.parametrize("kw,schedule", cross(
    [pytest.param({}, id="concat"), pytest.param(FIT, id="bestfit")],
    [pytest.param(False, id="weights"), pytest.param(True, id="schedule")],
    default={"concat-weights", "bestfit-schedule"}))
def test_another_ranks_state_after_a_change_of_shape_resumes_exactly(dirs, kw, schedule):
    states = {}
    for rank in (0, 1):
        state = None
        for n, B, T in SHAPES:
            _, _, state = leg(dirs, schedule, rank, B, T, n, state, **kw)
        states[rank] = state
    assert states[0]["shapes"] == [[0, 4, 64], [8, 2, 96], [18, 4, 64]] and states[0]["batch"] == 24
    _, B, T = SHAPES[-1]
    want, own, _ = leg(dirs, schedule, 1, B, T, AFTER, states[1], **kw)
    got, located, _ = leg(dirs, schedule, 1, B, T, AFTER, states[0], **kw)
    assert json.loads(located["mixture"]["point"]) == json.loads(own["mixture"]["point"])
    assert located["position"] == own["position"] and located["batch"] == own["batch"] == 24
    assert all(np.array_equal(a, c) and np.array_equal(b, d) for (a, b), (c, d) in zip(got, want))
    assert json.loads(states[0]["mixture"]["point"]) != json.loads(states[1]["mixture"]["point"])  # not vacuous
