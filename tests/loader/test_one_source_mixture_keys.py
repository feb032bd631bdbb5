"""A Mixture of one source says and reads nanochat's keys as that source does (issue 50, step 2),
read as a client reads it: `ShmLoader(Mixture({"x": d}, {"x": 1}))` against `ShmLoader(d)`.

- Its states' `epoch`, `pq_idx`, `rg_idx` are the source's at every batch, concat and best fit,
  also where a concat batch ends with a row group (data whose documents of 257 tokens fill a
  B=4, T=64 window each, in row groups of 1-3 documents: the row group the batch's reading
  ended in is not its position's), and before the first batch of a resumed run.
- A state of nanochat's keys alone resumes it where it resumes the source (the same batches), and
  another rank's state of that run is replayed from those keys (rank 1 of 2 from rank 0's state
  gives rank 1's own batches), and so is a state of that run resumed at another world size
  (2 -> 3 ranks: every new rank's batches are the source's).
- `other_rank="nanochat"` resumes it approximately as it resumes the source: the same batches.
A mixture of several sources keeps its own keys (the document the next token is in, in its
source): tests/loader/test_mixture.py."""
import itertools
import pathlib

import pytest

import shmloader
from shmloader.demo import corpus
from tests.cases import cross
from tests.helpers import IntTokenizer, position_documents
from tests.loader.test_one_source_mixture import FIT, B, T, same, v6

KEYS = ("epoch", "pq_idx", "rg_idx")
N = 30
KWS = [pytest.param({}, id="concat"), pytest.param(FIT, id="bestfit")]  # the packings, as ids name them


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("onekeys")
    out = v6.write_data(root)
    lengths = [256, 256, None, 256, 100, 155, 256, 0, 255, 256] * 4  # 257 tokens with BOS: B*T+1
    corpus.write_shards(position_documents(lengths), pathlib.Path(root) / "aligned", num_files=3,
                        row_group_size=[1, 2, 3])
    out["aligned"] = str(pathlib.Path(root) / "aligned")
    return out


def run(data, n, resume_state=None, before=False, **kw):
    """The first `n` batches (arrays), the state after each (and before the first, `before`)."""
    out, states = [], []
    with shmloader.ShmLoader(data, IntTokenizer(), B, T, num_workers=2, device="cpu", resume_state=resume_state,
                             **kw) as loader:
        if before:
            states.append(loader.state_dict())
        for x, y in itertools.islice(loader, n):
            out.append((x.numpy().copy(), y.numpy().copy()))
            states.append(loader.state_dict())
    assert len(out) == n > 0
    return out, states


def one(d):
    return shmloader.Mixture({"x": d}, {"x": 1})


def keys(states) -> list:
    return [tuple(s[k] for k in KEYS) for s in states]


# default: the aligned data in concat (the check below that is not vacuous) and "a" in best fit
@pytest.mark.parametrize("data,kw", cross(["aligned", "a"], KWS, default={"aligned-concat", "a-bestfit"}))
def test_its_states_say_the_sources_nanochat_keys(dirs, data, kw):
    _, want = run(dirs[data], N, before=True, **kw)
    _, got = run(one(dirs[data]), N, before=True, **kw)
    assert keys(got) == keys(want)
    if data == "aligned" and not kw:  # not vacuous: the reading's row group is not the position's
        assert sum(s["rg_idx"] != s["position"][2] for s in want) > 10
    k = 11  # a resumed run's state before its first batch says the state's keys, as the source's
    _, want2 = run(dirs[data], 3, resume_state=want[k], before=True, **kw)
    _, got2 = run(one(dirs[data]), 3, resume_state=got[k], before=True, **kw)
    assert keys(got2) == keys(want2) and keys(got2)[0] == keys(want)[k]


@pytest.mark.parametrize("kw", [{}, FIT], ids=["concat", "bestfit"])
def test_a_nanochat_state_resumes_it_as_it_resumes_the_source(dirs, kw):
    nanochat = {"pq_idx": 1, "rg_idx": 2, "epoch": 1}
    for rank in (0, 1):
        want, wstates = run(dirs["a"], N, resume_state=nanochat, rank=rank, world_size=2, **kw)
        got, gstates = run(one(dirs["a"]), N, resume_state=nanochat, rank=rank, world_size=2, **kw)
        assert same(got, want) and keys(gstates) == keys(wstates), rank
        assert gstates[-1]["origin"] == nanochat
        if rank == 0:
            zero = gstates
    # another rank's state of that run: rank 1 finds its place by replaying from the keys
    k = 9
    again, _ = run(one(dirs["a"]), N - k - 1, resume_state=zero[k], rank=1, world_size=2, **kw)
    assert same(again, got[k + 1:])


# default: each origin once, the one inside a file (nanochat2) in best fit; the rest with -m slow
@pytest.mark.parametrize("nanochat,old_rank,n,kw", cross(
    [pytest.param({"pq_idx": 0, "rg_idx": 0, "epoch": 1}, 1, 5, id="nanochat0-1-5"),
     pytest.param({"pq_idx": 0, "rg_idx": 0, "epoch": 1}, 0, 20, id="nanochat1-0-20"),
     pytest.param({"pq_idx": 1, "rg_idx": 2, "epoch": 1}, 1, 5, id="nanochat2-1-5")], KWS,
    default={"nanochat0-1-5-bestfit", "nanochat1-0-20-concat", "nanochat2-1-5-bestfit"}))
def test_a_run_begun_from_nanochat_keys_changes_world_size_as_the_source(dirs, kw, nanochat, old_rank, n):
    """A run begun from nanochat's keys at 2 ranks, its state after `n` batches resumed at 3: every
    new rank's batches and keys are the source's, byte for byte (the old ranks replayed from
    where the keys put them, its `origin`, not from the run's start), and so are those of the
    new run's own state resumed; its states keep the origin."""
    _, wstates = run(dirs["a"], n, resume_state=nanochat, rank=old_rank, world_size=2, **kw)
    _, gstates = run(one(dirs["a"]), n, resume_state=nanochat, rank=old_rank, world_size=2, **kw)
    for rank in range(3):
        want, wnext = run(dirs["a"], 20, resume_state=wstates[-1], rank=rank, world_size=3, **kw)
        got, gnext = run(one(dirs["a"]), 20, resume_state=gstates[-1], rank=rank, world_size=3, **kw)
        assert same(got, want) and keys(gnext) == keys(wnext), rank
        assert gnext[-1]["origin"] == nanochat
    k = 7  # the new run's own state (the last rank's) resumes it on
    again, _ = run(one(dirs["a"]), 20 - k - 1, resume_state=gnext[k], rank=2, world_size=3, **kw)
    assert same(again, got[k + 1:])


@pytest.mark.parametrize("kw", [{}, FIT], ids=["concat", "bestfit"])
def test_other_rank_nanochat_resumes_it_as_it_resumes_the_source(dirs, kw):
    _, wstates = run(dirs["a"], 8, rank=0, world_size=2, **kw)
    _, gstates = run(one(dirs["a"]), 8, rank=0, world_size=2, **kw)
    for world in (2, 3):
        with pytest.warns(UserWarning, match="resuming as nanochat does"):
            want, _ = run(dirs["a"], 10, resume_state=wstates[-1], rank=1, world_size=world, other_rank="nanochat", **kw)
        with pytest.warns(UserWarning, match="resuming as nanochat does"):
            got, _ = run(one(dirs["a"]), 10, resume_state=gstates[-1], rank=1, world_size=world, other_rank="nanochat",
                         **kw)
        assert same(got, want), world


def test_several_sources_refuse_a_nanochat_state(dirs):
    two = shmloader.Mixture({"a": dirs["a"], "b": dirs["b"]}, {"a": 1, "b": 1})
    with pytest.raises(ValueError, match="resuming a single source's run as a mixture is not built yet"):
        shmloader.ShmLoader(two, IntTokenizer(), B, T, device="cpu", resume_state={"pq_idx": 0, "rg_idx": 0, "epoch": 1})
