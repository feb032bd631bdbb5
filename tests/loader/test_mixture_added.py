"""Files added to a source of a Mixture between a save and its resume, both packings: a shard
that sorts after the source's files (its val file then becomes a train file; the data of
test_mixture.py) is said once, naming the file, and read after the state's files, in the
source's epoch in progress and the next ones: the batches are the oracle's over the files now,
from the state's point. Another rank's state of the same world size reads them as that rank's
own state does (as one source's: its place replayed over the state's files, past their epochs' ends). Shards that land among two sources' files (the data of
test_growing_data.py, each source's tokens its own) are read as each source alone reads them
(test_one_source_mixture_growing.py compares a mixture of one with its source): after the
state's files in the source's epoch in progress, in their sorted place from its next one, each
source's documents every one once an epoch, none twice; the run's states resume it exactly.
What stays refused says so: another world size, a shuffled source."""
import itertools
import json
import shutil
import warnings
from collections import Counter

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers
from tests.cases import cross
from tests.loader import test_growing_data as growing
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
    with pytest.raises(ValueError, match=f"'code': 1 file.s. added .*{added}.*rank 0 of 2's, this loader rank 0 of 3"):
        shmloader.ShmLoader(mixture(data), tok, B, T, device="cpu", rank=0, world_size=3, resume_state=states[2])
    with pytest.raises(ValueError, match="'code'.*added .*the source is shuffled"):
        shmloader.ShmLoader(shuffled(data), tok, B, T, device="cpu", resume_state=states["shuffled"])
    data = tmp_path / "among"
    shutil.copytree(tmp_path / "before", data)
    shutil.copy(data / "web" / "shard_00000.parquet", data / "web" / "shard_00000b.parquet")  # among web's files
    with pytest.raises(ValueError, match="'web': 1 file.s. added .*shard_00000b.*rank 0 of 2's, this loader rank 1 of 3"):
        shmloader.ShmLoader(mixture(data), tok, B, T, device="cpu", rank=1, world_size=3, resume_state=states[2])


GAPS = {"a": (2, 0), "b": (1, 20)}  # source -> (its shard still downloading at the save, its files' token base)


def two_sources(tmp_path):
    """Two sources of 4 train files and a val file each, one train file of each missing at first
    (`GAPS`); a document of file i of a source holds tokens `1_000_000 * (base + i + 1) + row * 100 + k`."""
    for name, (gap, base) in GAPS.items():
        (tmp_path / name).mkdir()
        for i in range(5):
            if i != gap:
                growing.write_file(tmp_path / name / f"shard_{i:05d}.parquet", base + i)
    return shmloader.Mixture({name: str(tmp_path / name) for name in GAPS}, {"a": 2, "b": 1})


def source_docs(tmp_path, name, order) -> list:
    """Source `name`'s documents (their first tokens) in files `order`."""
    out = []
    for i in order:
        tokens = growing.tokens_of([tmp_path / name / f"shard_{i:05d}.parquet"])
        out += [t for j, t in enumerate(tokens) if j and tokens[j - 1] == 0]
    return out


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_shards_added_among_two_sources_files_are_read_as_each_source_reads_them(tmp_path, packing):
    kw = {} if packing == "concat" else dict(packing="bos_bestfit", buffer_size=6, tokenizer_batch_size=3)
    mix = two_sources(tmp_path)

    def run(n, state=None):
        with shmloader.ShmLoader(mix, helpers.IntTokenizer(), growing.B, growing.T, device="cpu", num_workers=2,
                                 resume_state=state, **kw) as ld:
            out, states = [], []
            for x, y in itertools.islice(ld, n):
                rows = np.concatenate([x.numpy(), y.numpy()[:, -1:]], 1)  # best fit: each row's T + 1 tokens
                out.append(helpers.window_of(x, y) if packing == "concat" else rows)
                states.append(ld.state_dict())
        return out, states

    before, states = run(6)
    point = json.loads(states[-1]["mixture"]["point"])["sources"]
    assert all(point[name][0] == 1 and point[name][1] < gap for name, (gap, _) in GAPS.items())  # before its gap
    for name, (gap, base) in GAPS.items():
        growing.write_file(tmp_path / name / f"shard_{gap:05d}.parquet", base + gap)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        after, later = run(150, states[-1])
    for name, (gap, _) in GAPS.items():
        words = [str(w.message) for w in caught]
        assert sum(f"mixture source {name!r}: 1 file(s) added" in w and f"shard_{gap:05d}" in w for w in words) == 1, words
    tokens, missed = np.concatenate(before + after).reshape(-1).tolist(), 0
    firsts = [t for j, t in enumerate(tokens) if j and tokens[j - 1] == 0 and t % 100 == 0]  # a document's first token
    for name, (gap, base) in GAPS.items():
        mine = [t for t in firsts if 1_000_000 * (base + 1) <= t < 1_000_000 * (base + 6)]
        first = source_docs(tmp_path, name, [i for i in range(4) if i != gap] + [gap])  # the state's, then the new one
        every = source_docs(tmp_path, name, range(4))  # the sorted order, from its next epoch on
        assert len(mine) > 2 * len(every), name  # read into its third epoch
        if packing == "concat":  # in the order the source alone reads them
            assert mine == (first + every * 10)[:len(mine)], name
        else:  # best fit places them in another order, each once an epoch (one cropped to its BOS is not seen)
            counts, epoch = Counter(mine), json.loads(later[-1]["mixture"]["point"])["sources"][name][0]
            unseen = set(every) - set(counts)  # documents of one token (row % 7 == 0) only: always cropped
            assert set(counts) <= set(every) and all(t % 1_000_000 // 100 % 7 == 0 for t in unseen), name
            assert epoch >= 3 and all(counts[t] <= epoch for t in counts), (name, epoch)  # once an epoch at most
            missed += sum(max(0, epoch - 1 - counts[t]) for t in every)  # a completed epoch's read not seen
    if packing != "concat":  # each such read is a document cropped to its BOS: a row that ends in a BOS
        assert missed <= sum(int((row[:, -1] == 0).sum()) for row in before + after), missed
    for j in (2, len(after) - 10):  # its states resume it exactly: in a reordered epoch, and after
        again, _ = run(6, later[j])
        assert all(np.array_equal(a, b) for a, b in zip(again, after[j + 1:j + 7])), j
    assert json.loads(later[2]["mixture"]["point"])["sources"]["a"][0] == 1


# default: each save point once, both packings; the other three with -m slow
@pytest.mark.parametrize("saved_at,packing", cross(
    [pytest.param(0, id="before-a-batch"), pytest.param(4, id="epoch-1"), pytest.param(30, id="epochs-on")],
    ["concat", "bos_bestfit"], default={"before-a-batch-concat", "epoch-1-bos_bestfit", "epochs-on-concat"}))
def test_another_ranks_state_reads_the_files_added_as_the_ranks_own_does(tmp_path, packing, saved_at):
    """Rank 1 of 2 resumed from rank 0's state, after shards landed among both sources' files, gives
    the batches it gives from its own state (test_shards_added_among_... checks those), also where
    its replay runs past the ends of its sources' epochs (saved at batch 30: a in its 4th), and
    from a state taken before the first batch (no place to replay to: the files sorted, and the
    run's states any rank's, as a fresh run's); its states resume it, and another rank's state of
    that run is refused (its files changed) but for the last case."""
    kw = {} if packing == "concat" else dict(packing="bos_bestfit", buffer_size=6, tokenizer_batch_size=3)
    mix = two_sources(tmp_path)

    def run(n, rank, state=None):
        with shmloader.ShmLoader(mix, helpers.IntTokenizer(), growing.B, growing.T, device="cpu", num_workers=2,
                                 rank=rank, world_size=2, resume_state=state, **kw) as ld:
            out, states = [], [] if n else [ld.state_dict()]
            for x, y in itertools.islice(ld, n):
                out.append(np.concatenate([x.numpy(), y.numpy()[:, -1:]], 1))  # best fit: each row's T + 1 tokens
                states.append(ld.state_dict())
        return out, states

    zero, one = run(saved_at, 0)[1][-1], run(saved_at, 1)[1][-1]
    for name, (gap, base) in GAPS.items():
        growing.write_file(tmp_path / name / f"shard_{gap:05d}.parquet", base + gap)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        own, _ = run(100, 1, one)
        other, later = run(100, 1, zero)
    assert len(own) == len(other) == 100 and all(np.array_equal(a, b) for a, b in zip(own, other))
    words = [str(w.message) for w in caught]
    assert all(sum(f"mixture source {name!r}: 1 file(s) added" in w for w in words) == 2 for name in GAPS), words
    assert json.loads(later[-1]["mixture"]["point"])["sources"]["a"][0] > 3  # through reordered and sorted epochs
    again, _ = run(5, 1, later[10])
    assert all(np.array_equal(a, b) for a, b in zip(again, other[11:16]))
    if saved_at == 0:  # nothing read before the files came: a run over them all, replayable by any rank
        fresh, _ = run(16, 0)
        assert all(np.array_equal(a, b) for a, b in zip(run(5, 0, later[10])[0], fresh[11:16]))
        return
    with pytest.raises(ValueError, match=f"mixture changed at batch {saved_at} .*files added to a source"):
        run(1, 0, later[10])
