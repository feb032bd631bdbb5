"""A Mixture of one source is that source's stream (issue 50, step 1; data/mixrules.py), read as a
client reads it: `ShmLoader(Mixture({"x": d}, {"x": 1}))` against `ShmLoader(d)`, the same
batches byte for byte, concat and best fit, in the files' order and shuffled, 1, 2 and 3
workers, over more than an epoch; its states resume as one source's do. A mixture's state of
version 6 (tests/fixtures/mixture_v6_states.json, written by the loader of that version:
tests/scripts/mixture_v6_states.py) resumes exactly as that loader went on, with the chunks and
the seeds of its version, and so do the states of the run it resumes."""
import importlib.util
import itertools
import json

import numpy as np
import pytest

import shmloader
from shmloader import state as statemod
from tests.cases import cross
from tests.helpers import REPO_ROOT, SCRIPTS, IntTokenizer

_spec = importlib.util.spec_from_file_location("mixture_v6_states", SCRIPTS / "mixture_v6_states.py")
v6 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(v6)

B, T = v6.B, v6.T
FIT = dict(packing="bos_bestfit", buffer_size=48, tokenizer_batch_size=16)
SHUFFLED = dict(shuffle=True, seed=5, shuffle_window=20)
N = 90  # batches: source "a" holds about 16 batches of tokens an epoch


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return v6.write_data(tmp_path_factory.mktemp("onemix"))


def batches(data, n, workers, resume_state=None, **kw):
    """The first `n` batches' (inputs, targets) as arrays, and the state after each."""
    out, states = [], []
    with shmloader.ShmLoader(data, IntTokenizer(), B, T, num_workers=workers, device="cpu",
                             resume_state=resume_state, **kw) as loader:
        for x, y in itertools.islice(loader, n):
            out.append((x.numpy().copy(), y.numpy().copy()))
            states.append(loader.state_dict())
    assert len(out) == n > 0
    return out, states


def same(got, want) -> bool:
    return len(got) == len(want) > 0 and all(np.array_equal(a, c) and np.array_equal(b, d)
                                             for (a, b), (c, d) in zip(got, want))


def one(dirs):
    return shmloader.Mixture({"x": dirs["a"]}, {"x": 1})


# default: every pair of packing, order and worker count once; the other six with -m slow
@pytest.mark.parametrize("workers,kw", cross(
    [1, 2, 3], [pytest.param({}, id="concat"), pytest.param(FIT, id="bestfit"),
                pytest.param(SHUFFLED, id="concat-shuffled"), pytest.param({**FIT, **SHUFFLED}, id="bestfit-shuffled")],
    default={"1-concat", "1-bestfit-shuffled", "2-bestfit", "2-concat-shuffled", "3-concat-shuffled", "3-bestfit"}))
def test_a_mixture_of_one_source_is_that_sources_stream(dirs, kw, workers):
    want, _ = batches(dirs["a"], N, 2, **kw)
    got, states = batches(one(dirs), N, workers, **kw)
    assert same(got, want)
    epochs = json.loads(states[-1]["mixture"]["point"])["mixer"]["totals"]["x"][2]
    assert epochs >= 2  # past an epoch of the source


@pytest.mark.parametrize("kw", [FIT, {**FIT, **SHUFFLED}], ids=["bestfit", "bestfit-shuffled"])
def test_its_states_resume_exactly(dirs, kw):
    want, states = batches(one(dirs), 50, 2, **kw)
    assert states[0]["version"] == statemod.VERSION and states[0]["mixture"]["plain"] == "x"
    for k in (3, 21):
        got, _ = batches(one(dirs), 50 - k, 2, resume_state=states[k - 1], **kw)
        assert same(got, want[k:]), k


def tokens(got) -> np.ndarray:
    """The stream's tokens of concat batches (windows of B*T+1 tokens), in order, BOS (0) left out."""
    flat = np.concatenate([np.concatenate([x.ravel()[:1], y.ravel()]) for x, y in got])
    return flat[flat != 0]


def test_a_second_source_added_at_a_resume_keeps_the_firsts_seed(dirs):
    """The source a one-source run read with the loader's seed keeps it when a resume adds another
    (b's tokens are from 100,000): its documents go on in the order the source alone has, and the
    states of that run say so and resume exactly."""
    kw = dict(SHUFFLED, packing="concat")
    alone, _ = batches(dirs["a"], 40, 2, **kw)
    first, states = batches(one(dirs), 12, 2, **kw)
    two = shmloader.Mixture({"x": dirs["a"], "b": dirs["b"]}, {"x": 1, "b": 1})
    with pytest.warns(UserWarning, match="new to the state"):
        then, after = batches(two, 30, 2, resume_state=states[-1], **kw)
    read = tokens(then)
    assert (read >= 100_000).sum() > 1000  # b is read beside x
    x = np.concatenate([tokens(first), read[read < 100_000]])
    assert np.array_equal(x, tokens(alone)[:len(x)]) and len(x) > len(tokens(first)) + 1000
    assert after[-1]["mixture"]["plain"] == "x"
    again, _ = batches(two, 10, 2, resume_state=after[19], **kw)
    assert same(again, then[20:30])


FIXTURE = json.loads((REPO_ROOT / "tests" / "fixtures" / "mixture_v6_states.json").read_text())


@pytest.mark.parametrize("case", sorted(FIXTURE["cases"]))
def test_a_version_6_state_resumes_as_its_loader_went_on(dirs, case):
    sources, kw = v6.CASES[case]
    saved = FIXTURE["cases"][case]
    assert saved["state"]["version"] == 6 and FIXTURE["at"] == v6.AT
    mix = shmloader.Mixture({s: dirs[s] for s in sources}, {s: 1 + i for i, s in enumerate(sources)})
    got, states = batches(mix, v6.N - v6.AT, 2, resume_state=saved["state"], **kw)
    assert v6.digest(got) == saved["after"], case
    assert states[-1]["mixture"]["rules"] == 6 and "plain" not in states[-1]["mixture"]
    # the run it resumes goes on with that version's rules in its own states
    k = 7
    again, _ = batches(mix, v6.N - v6.AT - k, 2, resume_state=states[k - 1], **kw)
    assert same(again, got[k:]), case
