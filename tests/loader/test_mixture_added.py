"""Files added to a source of a Mixture between a save and its resume (the data of
test_mixture.py, both packings): a shard that sorts after the source's files (its val file
then becomes a train file) is said once, naming the file, and read after the state's files, in
the source's epoch in progress and the next ones: the batches are the oracle's over the files
now, from the state's point. What stays refused says so: a file among the state's, another
rank's state, another world size, a shuffled source."""
import json
import shutil

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests.loader import test_mixture as concat
from tests.loader import test_mixture_bestfit as bestfit
from tests.loader.test_mixture import SHAPES, B, T, mixture, mixdata  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("watchdog")
OPTS = {"concat": dict(device="cpu"), "bos_bestfit": bestfit.FIT}


def grown(root, tmp_path):
    """A copy of the data whose source "code" gained a shard sorting after its files; the
    files of every source's train split now, and the file code's train split gained."""
    shutil.copytree(root, tmp_path / "data")
    texts = list(corpus.synthetic_texts(30, seed=99, mean_words=40))
    corpus.write_shards(texts, tmp_path / "data" / "code", num_files=1, row_group_size=[7], prefix="shard_9")
    files = {name: sorted(str(p) for p in (tmp_path / "data" / name).glob("*.parquet"))[:-1] for name in SHAPES}
    return tmp_path / "data", files, "shard_00002.parquet"  # the val file it had


def take(loader, packing, n):
    if packing == "concat":
        return concat.take(loader, n)
    return bestfit.take(loader, n)[0]


def want(files, tok, mix, packing, n, point, batch):
    if packing == "concat":
        return concat.expected(files, tok, mix, n, point=point, batch=batch)[0]
    return [rows for rows, _ in bestfit.expected(files, tok, mix, n, point=point, batch=batch)[0]]


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_shard_added_after_a_sources_files_is_read_after_the_states(mixdata, tmp_path, packing):
    root, _, tok = mixdata
    shutil.copytree(root, tmp_path / "before")
    with shmloader.ShmLoader(mixture(tmp_path / "before"), tok, B, T, num_workers=2, **OPTS[packing]) as loader:
        take(loader, packing, 5)
        state = json.loads(json.dumps(loader.state_dict()))
    point = json.loads(state["mixture"]["point"])
    assert point["sources"]["code"][0] == 1  # code's epoch in progress is its first
    data, files, added = grown(tmp_path / "before", tmp_path)
    expected = want(files, tok, mixture(data), packing, 60, point, 5)
    with pytest.warns(UserWarning, match=f"mixture source 'code': 1 file.s. added since the state was saved: {added}"):
        loader = shmloader.ShmLoader(mixture(data), tok, B, T, num_workers=2, resume_state=state, **OPTS[packing])
    with loader:
        got = take(loader, packing, 60)
        later = loader.state_dict()
    assert len(got) == len(expected) == 60 and all(np.array_equal(a, b) for a, b in zip(got, expected))
    code = json.loads(later["mixture"]["point"])["sources"]["code"]
    assert tuple(code[:2]) >= (1, 2), "code did not reach the added file (its third): the check means little"
    assert [f[0] for f in later["mixture"]["sources"]["code"]["files"]][-1] == added
    with shmloader.ShmLoader(mixture(data), tok, B, T, num_workers=1, resume_state=later, **OPTS[packing]) as loader:
        again = take(loader, packing, 5)  # the run's own states resume it exactly
    on = want(files, tok, mixture(data), packing, 70, point, 5)[60:]
    assert len(again) == 5 and all(np.array_equal(a, b) for a, b in zip(again, on))
    with pytest.raises(ValueError, match="mixture changed at batch 5 .*files added to a source"):
        shmloader.ShmLoader(mixture(data), tok, B, T, rank=1, world_size=2, resume_state=later, **OPTS[packing])


def test_what_stays_refused_when_files_are_added_to_a_source(mixdata, tmp_path):
    root, _, tok = mixdata
    shutil.copytree(root, tmp_path / "before")

    def shuffled(at):  # code read shuffled
        return shmloader.Mixture({**{n: str(at / n) for n in SHAPES}, "code": shmloader.Source(str(at / "code"),
                                                                                              shuffle=True)},
                                 concat.WEIGHTS)
    states = {}
    for world, mix in ((1, mixture), (2, mixture), ("shuffled", shuffled)):
        with shmloader.ShmLoader(mix(tmp_path / "before"), tok, B, T, num_workers=1, device="cpu",
                                 world_size=world if world != "shuffled" else 1) as loader:
            concat.take(loader, 3)
            states[world] = loader.state_dict()
    data, _, added = grown(tmp_path / "before", tmp_path)
    with pytest.raises(ValueError, match=f"'code': 1 file.s. added .*{added}.*rank 0 of 2's, this loader rank 1 of 2"):
        shmloader.ShmLoader(mixture(data), tok, B, T, device="cpu", rank=1, world_size=2, resume_state=states[2])
    with pytest.raises(ValueError, match="added .*rank 0 of 2's, this loader rank 0 of 3"):
        shmloader.ShmLoader(mixture(data), tok, B, T, device="cpu", rank=0, world_size=3, resume_state=states[2])
    with pytest.raises(ValueError, match="'code'.*added .*the source is shuffled"):
        shmloader.ShmLoader(shuffled(data), tok, B, T, device="cpu", resume_state=states["shuffled"])
    shutil.copy(data / "web" / "shard_00000.parquet", data / "web" / "shard_00000b.parquet")  # among web's files
    with pytest.raises(ValueError, match="'web' lists other files than the state's.*added among the state's"):
        shmloader.ShmLoader(mixture(data), tok, B, T, device="cpu", resume_state=states[1])
