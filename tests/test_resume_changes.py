"""Resume after the run changed (SPEC §3): a new batch shape continues from the same place in
the data with a warning, also when another rank's state must first be located through the
shape change; shards appended since the save are read after the saved ones, with a warning
naming them; a changed file at or before the position, another tokenizer or another packing
is refused in words. Checked against the single-process oracles in shmloader_dev/reference.py."""
import itertools
import json
import shutil

import numpy as np
import pytest

import shmloader
from shmloader_dev import reference, testing
from conftest import position_of, window_of

pytestmark = pytest.mark.usefixtures("watchdog")


def take(loader, n, bestfit=False):
    out, states = [], []
    for x, y in itertools.islice(loader, n):
        out.append(np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1) if bestfit else window_of(x, y))
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert len(out) == n
    return out, states


def fit(ds, B, T, **kw):
    return ds.loader(B, T, "train", packing="bos_bestfit", buffer_size=5, tokenizer_batch_size=3, **kw)


def test_new_shape_concat_continues_at_the_same_token(posdata):
    with posdata.loader(2, 16, "train") as loader:
        _, states = take(loader, 23)
    state = states[-1]
    with pytest.warns(UserWarning, match=r"B: state has 2, loader has 4, T: state has 16, loader has 8"):
        loader = posdata.loader(4, 8, "train", num_workers=3, resume_state=state)
    cursor, skip = position_of(state)[:4], position_of(state)[4]
    want = [w for w, _ in itertools.islice(posdata.oracle(4, 8, cursor=cursor, skip=skip), 30)]
    with loader:
        got, got_states = take(loader, 30)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert got[0][0] == posdata_token_after(posdata, state), "the new shape did not start at the saved token"
    assert got_states[-1]["shapes"] == [[0, 2, 16], [23, 4, 8]] and got_states[-1]["batch"] == 53


def posdata_token_after(ds, state) -> int:
    """posdata's tokens equal their stream position: the token at the state's position."""
    e, f, g, d, s = position_of(state)
    rows = [r for r in ds.layout if (r[0], r[1]) == (f, g)]
    row = rows[[r[2] for r in rows].index(d)]
    return 0 if s == 0 else row[3] + s  # BOS is 0; token s of the document is its position


def test_new_shape_bestfit_continues_from_the_same_buffer(posdata):
    with fit(posdata, 2, 16) as loader:
        _, states = take(loader, 17, bestfit=True)
    state = states[-1]
    assert state["buffer"]
    with pytest.warns(UserWarning, match=r"T: state has 16, loader has 24"):
        loader = fit(posdata, 2, 24, num_workers=1, resume_state=state)
    pos = position_of(state)[:4]
    want = [r for r, _ in itertools.islice(reference.bestfit_rows(
        posdata.files("train"), posdata.encode, posdata.bos, 2, 24, 5, 3, cursor=pos, runs=state["buffer"]), 25)]
    with loader:
        got, _ = take(loader, 25, bestfit=True)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_other_ranks_state_is_located_through_a_shape_change(posdata, packing):
    """Both ranks ran 11 batches at (2, 16), then resumed at (4, 8) for 9 more. Rank 1 given
    rank 0's state replays both shapes over its own lengths and continues exactly."""
    make = (lambda B, T, **kw: fit(posdata, B, T, **kw)) if packing == "bos_bestfit" else \
        (lambda B, T, **kw: posdata.loader(B, T, "train", **kw))
    bestfit = packing == "bos_bestfit"

    def two_shapes(rank):
        with make(2, 16, rank=rank, world_size=2) as loader:
            _, states = take(loader, 11, bestfit)
        with pytest.warns(UserWarning, match="B: state has 2, loader has 4"):
            loader = make(4, 8, rank=rank, world_size=2, resume_state=states[-1])
        with loader:
            _, states = take(loader, 9, bestfit)
        with make(4, 8, rank=rank, world_size=2, resume_state=states[-1]) as loader:
            follow, _ = take(loader, 15, bestfit)
        return states[-1], follow

    state0, _ = two_shapes(0)
    state1, follow1 = two_shapes(1)
    assert state0["shapes"] == [[0, 2, 16], [11, 4, 8]] and state0["batch"] == 20
    with make(4, 8, rank=1, world_size=2, num_workers=3, resume_state=state0) as loader:
        assert position_of(loader.state_dict()) == position_of(state1)
        assert loader.state_dict().get("buffer") == state1.get("buffer")
        got, _ = take(loader, 15, bestfit)
    assert all(np.array_equal(g, w) for g, w in zip(got, follow1))


def test_appended_shards_are_read_after_the_saved_ones(posdata, tmp_path):
    """A shard appended to the data set: the train split gains the old val file (the new one is
    val). The resumed run continues exactly and names the new train file."""
    for p in posdata.paths:
        shutil.copy(p, tmp_path / p.name)
    with shmloader.ShmLoader(str(tmp_path), testing.IntTokenizer(), 2, 16, "train", device="cpu",
                             num_workers=2) as loader:
        want, states = take(loader, 60)
    k = 25
    shutil.copy(posdata.paths[-1], tmp_path / "shard_00099.parquet")  # a new last file
    with pytest.warns(UserWarning, match=r"1 file\(s\) added .*shard_00003\.parquet"):
        loader = shmloader.ShmLoader(str(tmp_path), testing.IntTokenizer(), 2, 16, "train", device="cpu",
                                     num_workers=3, resume_state=states[k])
    with loader:
        got, _ = take(loader, 60 - k - 1)
    assert all(np.array_equal(g, w) for g, w in zip(got, want[k + 1:]))


def test_a_changed_earlier_file_is_refused_naming_it(posdata, tmp_path):
    for p in posdata.paths:
        shutil.copy(p, tmp_path / p.name)
    with shmloader.ShmLoader(str(tmp_path), testing.IntTokenizer(), 2, 16, "train", device="cpu") as loader:
        _, states = take(loader, 130)
    state = next(s for s in states if s["pq_idx"] == 1)
    shutil.copy(posdata.paths[2], tmp_path / posdata.paths[0].name)  # file 0 rewritten
    with pytest.raises(ValueError, match=r"file 0: state has shard_00000\.parquet \([\d,]+ bytes\), "
                                         r"loader has shard_00000\.parquet \([\d,]+ bytes\)"):
        shmloader.ShmLoader(str(tmp_path), testing.IntTokenizer(), 2, 16, "train", device="cpu",
                            resume_state=state)


def test_another_tokenizer_or_packing_is_refused_in_words(synth):
    from shmloader_dev import corpus
    with synth.loader(2, 32, "train") as loader:
        _, states = take(loader, 5)
    other = corpus.train_tokenizer(corpus.synthetic_texts(100, seed=5, mean_words=20), vocab_size=400)
    with pytest.raises(ValueError, match="saved with another tokenizer"):
        shmloader.ShmLoader(str(synth.root), other, 2, 32, "train", device="cpu", resume_state=states[-1])
    with pytest.raises(ValueError, match="packing: state has 'concat', loader has 'bos_bestfit'"):
        synth.loader(2, 32, "train", packing="bos_bestfit", resume_state=states[-1])
