"""A Mixture of one source takes files added among its source's files at a resume as that source
does (docs/contract.md §3; tests/loader/test_growing_data.py's cases), read as a client reads
it: `ShmLoader(Mixture({"x": d}, {"x": 1}))` against `ShmLoader(d)`, concat and best fit. A shard
that lands inside the sort order after a save (the state in the file before the gap, past it,
or in a later epoch) is read after the state's files in the epoch in progress and in its sorted
place from the next epoch on: the same batches byte for byte, and the same states (nanochat's
keys, the position, the files listed in the order of their epoch); the run's states resume as
the source's do, in that epoch and after it; and a restart in the epoch after the reordered one
(a worker healed, an idle release) goes on in the sorted order, as the source's does."""
import itertools
import warnings

import numpy as np
import pytest

import shmloader
from tests import helpers
from tests.cases import cross
from tests.loader.test_growing_data import B, T, write_file

FIT = dict(packing="bos_bestfit", buffer_size=6, tokenizer_batch_size=3)
KWS = [pytest.param({}, id="concat"), pytest.param(FIT, id="bestfit")]  # the packings, as ids name them
NAMES = [f"shard_{i:05d}.parquet" for i in range(5)]  # shard 4 is the val file


def loader(data, **kw):
    return shmloader.ShmLoader(data, helpers.IntTokenizer(), B, T, device="cpu", num_workers=2, timeout=30, **kw)


def run(data, n, quiet=True, **kw):
    """The first `n` batches (arrays) and the state after each (`quiet`: its warnings not shown)."""
    out, states = [], []
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        with loader(data, **kw) as ld:
            for x, y in itertools.islice(ld, n):
                out.append((x.numpy().copy(), y.numpy().copy()))
                states.append(ld.state_dict())
    assert len(out) == n
    return out, states


def same(got, want) -> bool:
    return len(got) == len(want) > 0 and all(np.array_equal(a, c) and np.array_equal(b, d)
                                             for (a, b), (c, d) in zip(got, want))


def said(state) -> tuple:
    """What a state says of where it stands: nanochat's keys, the position, its files' names in
    the order of its epoch (one source's `files`, a mixture's source's)."""
    files = state["files"] or state["mixture"]["sources"]["x"]["files"]
    return state["epoch"], state["pq_idx"], state["rg_idx"], tuple(state["position"]), tuple(f[0] for f in files)


def gapped(tmp_path):
    """A data set whose shard 2 is still downloading, and the mixture of it alone."""
    data = tmp_path / "data"
    data.mkdir()
    for i in (0, 1, 3, 4):
        write_file(data / NAMES[i], i)
    return str(data), shmloader.Mixture({"x": str(data)}, {"x": 1})


# default: each landing point once, both packings; the other three with -m slow
@pytest.mark.parametrize("k,where,kw", cross(
    [pytest.param(5, (1, 1), id="before_gap"), pytest.param(9, (1, 2), id="past_gap"),
     pytest.param(30, (3, 0), id="epoch_3")], KWS,
    default={"before_gap-concat", "past_gap-bestfit", "epoch_3-concat"}))
def test_a_shard_that_lands_inside_the_sort_order_is_read_as_the_source_reads_it(tmp_path, kw, k, where):
    data, one = gapped(tmp_path)
    _, wstates = run(data, k, **kw)
    _, gstates = run(one, k, **kw)
    at = tuple(wstates[-1]["position"][:2])
    assert (at == where if not kw else at[0] == where[0]) and said(gstates[-1]) == said(wstates[-1])
    write_file(tmp_path / "data" / NAMES[2], 2)  # shard 2 lands
    with pytest.warns(UserWarning, match=f"mixture source 'x': 1 file.s. added since the state was saved: {NAMES[2]}"):
        got, gnext = run(one, 60, quiet=False, resume_state=gstates[-1], **kw)
    want, wnext = run(data, 60, resume_state=wstates[-1], **kw)
    assert same(got, want)
    assert [said(s) for s in gnext] == [said(s) for s in wnext]
    assert said(gnext[-1])[4] == tuple(NAMES[:4]) and gnext[-1]["epoch"] > where[0]  # past the reordered epoch
    if where[0] == 1:  # not vacuous: the reordered epoch's states list shard 2 last
        assert said(gnext[0])[4] == tuple(NAMES[i] for i in (0, 1, 3, 2))
    for j in (3, 45):  # the run's own states resume as the source's: in the reordered epoch and after it
        again, _ = run(one, 8, resume_state=gnext[j], **kw)
        assert same(again, got[j + 1:j + 9]), j


# default: a heal in best fit, an idle release in concat; the other two with -m slow
@pytest.mark.parametrize("restart,kw", cross(["heal", "idle_release"], KWS,
                                             default={"heal-bestfit", "idle_release-concat"}))
def test_a_restart_in_the_epoch_after_a_reordered_one_reads_the_sorted_order(tmp_path, kw, restart):
    """Resumed in epoch 1 with shard 2 arrived inside the sort order, restarted in epoch 2: the
    batches and states are the source's, restarted the same way."""
    data, one = gapped(tmp_path)
    states = {d: run(d, 7, **kw)[1][-1] for d in (data, one)}
    write_file(tmp_path / "data" / NAMES[2], 2)
    options = {"idle_release_s": 0.3} if restart == "idle_release" else {}
    out = {}
    for d in (data, one):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with loader(d, resume_state=states[d], n_slots=2, **options, **kw) as ld:
                got = [next(ld) for _ in range(20)]
                assert ld.state_dict()["epoch"] == 2
                helpers.heal_or_release(ld, restart)
                got += [next(ld) for _ in range(30)]
                counted = ld.stats()["heals" if restart == "heal" else "idle_releases"]
                later = ld.state_dict()
        assert counted == 1
        out[d] = ([(x.numpy(), y.numpy()) for x, y in got], later)
    assert same(out[one][0], out[data][0]) and said(out[one][1]) == said(out[data][1])
    again, _ = run(one, 5, resume_state=out[one][1], **kw)
    want, _ = run(data, 5, resume_state=out[data][1], **kw)
    assert same(again, want)


# default: back to the reordered epoch in best fit, to epoch 2 in concat; the other two with -m slow
@pytest.mark.parametrize("back,kw", cross(
    [pytest.param(1, id="to_the_reordered_epoch"), pytest.param(2, id="to_epoch_2")], KWS,
    default={"to_the_reordered_epoch-bestfit", "to_epoch_2-concat"}))
def test_a_reordered_loader_given_its_own_state_reads_as_a_fresh_one(tmp_path, kw, back):
    """Resumed in epoch 1 with shard 2 arrived inside the sort order, read into epoch 2, then
    `load_state_dict` on the same loader with one of its own states (of the reordered epoch, or
    of epoch 2): the next batches are a fresh loader's given that state, and the source's own
    loader does the same."""
    data, one = gapped(tmp_path)
    states = {d: run(d, 7, **kw)[1][-1] for d in (data, one)}
    write_file(tmp_path / "data" / NAMES[2], 2)
    out = {}
    for d in (data, one):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with loader(d, resume_state=states[d], **kw) as ld:
                seen = []
                for _ in range(24):
                    next(ld)
                    seen.append(ld.state_dict())
                assert seen[0]["epoch"] == 1 and seen[-1]["epoch"] >= 2  # not vacuous: past the reordered epoch
                state = next(s for s in (seen if back == 2 else seen[::-1]) if s["epoch"] == back)
                ld.load_state_dict(state)
                got = [(x.numpy().copy(), y.numpy().copy()) for x, y in itertools.islice(ld, 12)]
            fresh, _ = run(d, 12, resume_state=state, **kw)
        assert same(got, fresh), d
        out[d] = got
    assert same(out[one], out[data])


def test_a_reordered_loader_replays_another_ranks_state_over_the_sorted_order(tmp_path):
    """Rank 0 of 2 resumed with shard 2 arrived inside the sort order (its epoch in progress
    reordered), then given rank 1's state of a run over every shard from batch 0: it replays its
    place over the sorted order, as a fresh rank 0 given that state does."""
    data, one = gapped(tmp_path)
    ranks = dict(rank=0, world_size=2)
    _, states = run(one, 3, **ranks)
    write_file(tmp_path / "data" / NAMES[2], 2)
    _, others = run(one, 6, rank=1, world_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with loader(one, resume_state=states[-1], **ranks) as ld:
            first = [next(ld) for _ in range(3)]
            assert said(ld.state_dict())[4] == tuple(NAMES[i] for i in (0, 1, 3, 2))  # not vacuous: reordered
            ld.load_state_dict(others[-1])
            got = [(x.numpy().copy(), y.numpy().copy()) for x, y in itertools.islice(ld, 8)]
    assert len(first) == 3
    want, _ = run(one, 8, resume_state=others[-1], **ranks)
    assert same(got, want)
