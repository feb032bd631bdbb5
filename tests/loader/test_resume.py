"""Resume (docs/contract.md §3): a loader given the state of batch k yields batches k+1, k+2, ... of the
uninterrupted run byte for byte, whatever num_workers either run used; at exact row-group,
file and epoch boundaries, inside documents and at random points. nanochat-format states
resume where nanochat does; another rank's state resumes exactly at its batch count (or as
nanochat does, with other_rank="nanochat"); mismatched states are refused in words. A
trainer killed with SIGKILL and restarted from its last checkpoint continues the stream.
After the run changed: a new batch shape continues from the same place in the data, also
when another rank's state is located through the change; shards appended since the save are
read after the saved ones; a changed earlier file, another tokenizer or packing is refused.
(nanochat's own prefetching loop: test_nanochat_loop.py; the state on its own:
tests/unit/test_state.py.)
"""
import hashlib
import itertools
import json
import random
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import shmloader
from shmloader.cores import CoresWarning
from shmloader.demo import corpus
from shmloader.state import decode_runs
from tests import helpers, oracle
from tests.helpers import (ALIGN_W, SCRIPTS, pid_alive, position_of, second_pid, shm_segments, sigkill_after,
                           window_of)

pytestmark = pytest.mark.usefixtures("watchdog")
FOLLOW = 40  # batches compared after each resume point


def run(loader, n):
    out_w, out_s = [], []
    for inputs, targets in itertools.islice(loader, n):
        out_w.append(window_of(inputs, targets))
        out_s.append(loader.state_dict())
    assert len(out_w) == n
    return out_w, out_s


class Run:
    """An uninterrupted run: windows[k] and states[k] (the state yielded with batch k);
    states[-1] of a resume point means the loader's state before any batch."""

    def __init__(self, ds, B, T, split="train", n=0, **kw):
        self.ds, self.B, self.T, self.split, self.kw = ds, B, T, split, kw
        with ds.loader(B, T, split, num_workers=2, **kw) as loader:
            self.initial = loader.state_dict()
            self.windows, self.states = run(loader, n)
        self.positions = [position_of(s) for s in self.states]
        rank, world = kw.get("rank", 0), kw.get("world_size", 1)
        want_w, want_p = ds.expected(n, B, T, split, rank=rank, world=world)
        assert all(np.array_equal(a, b) for a, b in zip(self.windows, want_w)), "run != oracle"
        assert self.positions == want_p

    def state(self, k):
        state = self.initial if k < 0 else self.states[k]
        return json.loads(json.dumps(state))  # as a checkpoint stores it

    def check_follow(self, loader, k, n=FOLLOW):
        n = min(n, len(self.windows) - k - 1)
        assert n >= 10, "too few batches left after the resume point"
        got_w, got_s = run(loader, n)
        for i in range(n):
            assert np.array_equal(got_w[i], self.windows[k + 1 + i]), \
                f"resumed after batch {k}: batch {k + 1 + i} differs"
            assert position_of(got_s[i]) == self.positions[k + 1 + i]


@pytest.fixture(scope="module")
def posrun(posdata):
    layout = [r for r in posdata.layout if r[0] < 3]
    P = layout[-1][3] + layout[-1][4] + 1
    return Run(posdata, 2, 16, "train", n=P // ALIGN_W + FOLLOW + 5)


@pytest.fixture(scope="module")
def synthrun(synth):
    return Run(synth, 2, 32, "train", n=240, rank=1, world_size=2)


def boundary_points(r: Run) -> dict:
    """Resume points found from the run's positions (after batch k)."""
    pos = r.positions
    pts = {}
    for k in range(1, len(pos) - FOLLOW):
        (e0, f0, g0, _, _), (e, f, g, d, s) = pos[k - 1], pos[k]
        if s == 0 and (e, f, g) != (e0, f0, g0):
            kind = "exact-epoch" if e != e0 else "exact-file" if f != f0 else "exact-rg"
            pts.setdefault(kind, k)
        elif (e, f, g) != (e0, f0, g0):
            pts.setdefault("epoch" if e != e0 else "file" if f != f0 else "rg", k)
        if s > 0 and d > 0:
            pts.setdefault("mid-document", k)
    return pts


def test_boundary_points_exist(posrun, synthrun):
    pts = boundary_points(posrun)
    assert {"exact-rg", "exact-file", "exact-epoch", "rg", "file", "mid-document"} <= set(pts), pts
    pts = boundary_points(synthrun)
    assert {"file", "epoch", "mid-document"} <= set(pts), pts


@pytest.mark.parametrize("kind", ["start", "exact-rg", "exact-file", "exact-epoch", "rg", "file",
                                  "mid-document", "random1", "random2"])
def test_resume_posdata(posrun, kind):
    pts = boundary_points(posrun)
    pts.update(start=-1, random1=random.Random(1).randrange(len(posrun.windows) - FOLLOW),
               random2=random.Random(2).randrange(len(posrun.windows) - FOLLOW))
    k = pts[kind]
    workers = {"start": 1, "exact-rg": 3, "exact-file": 4, "exact-epoch": 1}.get(kind, 3)
    with posrun.ds.loader(2, 16, "train", num_workers=workers, resume_state=posrun.state(k)) as loader:
        assert position_of(loader.state_dict()) == position_of(posrun.state(k))
        posrun.check_follow(loader, k)


@pytest.mark.parametrize("kind", ["file", "epoch", "mid-document", "random"])
def test_resume_synth_rank1_via_load_state_dict(synthrun, kind):
    pts = boundary_points(synthrun)
    pts["random"] = random.Random(3).randrange(len(synthrun.windows) - FOLLOW)
    k = pts[kind]
    with synthrun.ds.loader(2, 32, "train", num_workers=4, rank=1, world_size=2) as loader:
        loader.load_state_dict(synthrun.state(k))
        synthrun.check_follow(loader, k)


def test_load_state_dict_rewinds_a_running_loader(synthrun):
    k = 30
    with synthrun.ds.loader(2, 32, "train", num_workers=1, rank=1, world_size=2) as loader:
        run(loader, 60)
        loader.load_state_dict(synthrun.state(k))
        synthrun.check_follow(loader, k)


def test_chained_resumes(posrun):
    """Resume, run a few batches, save, resume again: the stream is still the same."""
    k = 3
    for workers in (1, 4, 2, 3):
        with posrun.ds.loader(2, 16, "train", num_workers=workers, resume_state=posrun.state(k)) as loader:
            got_w, got_s = run(loader, 17)
        for i, w in enumerate(got_w):
            assert np.array_equal(w, posrun.windows[k + 1 + i])
        k = k + 17
        assert position_of(got_s[-1]) == posrun.positions[k]


# ---------------------------------------------------------------- nanochat-format states

@pytest.mark.parametrize("state,rank,world", [
    ({"pq_idx": 1, "rg_idx": 2}, 0, 1),
    ({"pq_idx": 0, "rg_idx": 0}, 0, 1),
    ({"pq_idx": 0, "rg_idx": 2, "epoch": 2}, 0, 2),
    ({"pq_idx": 0, "rg_idx": 2, "epoch": 2}, 1, 2),  # row group 5 is past file 0's end
    ({"pq_idx": 2, "rg_idx": 1}, 1, 2),
])
def test_nanochat_state_resumes_like_nanochat(synth, state, rank, world):
    rg = (state["rg_idx"] // world + 1) * world + rank
    cursor = (state.get("epoch", 1), state["pq_idx"], rg, 0)
    want_w, want_p = synth.expected(30, 2, 32, "train", rank=rank, world=world, cursor=cursor)
    with synth.loader(2, 32, "train", num_workers=2, rank=rank, world_size=world,
                      resume_state=dict(state)) as loader:
        got_w, got_s = run(loader, 30)
    assert all(np.array_equal(g, w) for g, w in zip(got_w, want_w))
    assert [position_of(s) for s in got_s] == want_p
    assert got_s[0]["version"] >= 1 and got_s[0]["rank"] == rank


@pytest.mark.parametrize("k", [0, 7, 160])  # the start, inside file 0, in epoch 2
def test_other_ranks_state_resumes_exactly_at_its_batch_count(synth, k):
    """nanochat hands rank 0's state to every rank: rank 1 finds its own position at the
    state's batch count by counting its own document lengths, and continues exactly."""
    with synth.loader(2, 32, "train", num_workers=2, rank=0, world_size=2) as loader:
        _, states = run(loader, k) if k else ([], [])
        state = json.loads(json.dumps(states[-1] if k else loader.state_dict()))
    assert state["batch"] == k
    want_w, want_p = synth.expected(k + 20, 2, 32, "train", rank=1, world=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", CoresWarning)  # 3 workers on a 2-core machine: not this test's matter
        loader = synth.loader(2, 32, "train", num_workers=3, rank=1, world_size=2, resume_state=state)
    with loader:
        assert position_of(loader.state_dict()) == (want_p[k - 1] if k else (1, 0, 1, 0, 0))
        assert loader.state_dict()["rank"] == 1 and loader.state_dict()["batch"] == k
        got_w, got_s = run(loader, 20)
    assert all(np.array_equal(g, w) for g, w in zip(got_w, want_w[k:]))
    assert [position_of(s) for s in got_s] == want_p[k:]
    assert got_s[-1]["batch"] == k + 20
    if k:
        assert want_p[k - 1] != position_of(state), "rank 1's position should differ from rank 0's"


def test_other_ranks_state_with_other_rank_nanochat_resumes_like_nanochat(synth):
    with synth.loader(2, 32, "train", num_workers=2, rank=0, world_size=2) as loader:
        _, states = run(loader, 25)
    state = json.loads(json.dumps(states[-1]))
    e, p, r = state["epoch"], state["pq_idx"], state["rg_idx"]
    want_w, want_p = synth.expected(20, 2, 32, "train", rank=1, world=2, cursor=(e, p, (r // 2 + 1) * 2 + 1, 0))
    with pytest.warns(UserWarning, match="rank"):
        loader = synth.loader(2, 32, "train", num_workers=3, rank=1, world_size=2, resume_state=state,
                              other_rank="nanochat")
    with loader:
        got_w, got_s = run(loader, 20)
    assert all(np.array_equal(g, w) for g, w in zip(got_w, want_w))
    assert [position_of(s) for s in got_s] == want_p
    with warnings.catch_warnings():  # the same state on its own rank: no warning
        warnings.simplefilter("error")
        synth.loader(2, 32, "train", rank=0, world_size=2, resume_state=state).close()


# ---------------------------------------------------------------- refused states

def _edited(state, **changes):
    state = json.loads(json.dumps(state))
    for key, value in changes.items():
        if value is KeyError:
            del state[key]
        else:
            state[key] = value
    return state


@pytest.mark.parametrize("field,kwargs", [
    ("split", dict(split="val")),  # another world_size resumes elastically (test_elastic.py)
])
def test_state_of_other_config_is_refused(posrun, field, kwargs):
    args = dict(B=2, T=16, split="train")
    args.update(kwargs)
    B, T, split = args.pop("B"), args.pop("T"), args.pop("split")
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        posrun.ds.loader(B, T, split, resume_state=posrun.state(20), **args)


@pytest.mark.parametrize("field,changes", [
    ("version", dict(version=99)),
    ("position", dict(position=KeyError)),
    ("config", dict(config=KeyError)),
    ("position", dict(position=[1, 0, 0, 3])),
    ("position", dict(position=[1, 0, 0, 3, -1])),
    ("position", dict(position=[1, 7, 0, 3, 0])),  # a file the split does not have
    ("pq_idx", dict(pq_idx="0")),
    ("epoch", dict(epoch=0)),
])
def test_edited_state_is_refused(posrun, field, changes):
    state = _edited(posrun.state(20), **changes)
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        posrun.ds.loader(2, 16, "train", resume_state=state)
    with posrun.ds.loader(2, 16, "train") as loader:  # load_state_dict checks the same
        with pytest.raises(ValueError, match=rf"\b{field}\b"):
            loader.load_state_dict(state)


def test_state_of_other_files_is_refused_naming_the_file(synth):
    """A file at or before the position that is gone or changed: refused, naming it."""
    with synth.loader(2, 32, "train") as loader:
        _, states = run(loader, 5)
    assert states[-1]["pq_idx"] == 0
    fewer = [str(p) for i, p in enumerate(synth.paths) if i != 0]  # file 0 is gone
    with pytest.raises(ValueError, match=r"file 0: state has shard_00000\.parquet \([\d,]+ bytes\), "
                                         r"loader has no file of that name"):  # files are matched by name
        shmloader.ShmLoader(fewer, synth.tokenizer, 2, 32, "train", device="cpu", resume_state=states[-1])


def test_state_of_other_tokenizer_is_refused(synth):
    with synth.loader(2, 32, "train") as loader:
        _, states = run(loader, 5)
    other = corpus.train_tokenizer(corpus.synthetic_texts(100, seed=5, mean_words=20), vocab_size=400)
    with pytest.raises(ValueError, match=r"\btokenizer\b"):
        shmloader.ShmLoader(str(synth.root), other, 2, 32, "train", device="cpu", resume_state=states[-1])


def test_state_of_same_names_other_content_is_refused(posrun, tmp_path):
    """Shards regenerated under the same names (other rows, other row groups): the saved
    position would point at other documents, so the state must be refused."""
    docs = helpers.position_documents([3] * 500)
    corpus.write_shards(docs, tmp_path, num_files=4, row_group_size=[17])
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in posrun.ds.paths]
    with pytest.raises(ValueError, match=r"\bdata\b"):
        shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), 2, 16, "train", device="cpu",
                            resume_state=posrun.state(20))


def test_moved_dataset_resumes(posrun, tmp_path):
    for p in posrun.ds.paths:
        (tmp_path / p.name).write_bytes(p.read_bytes())
    k = 25
    with shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), 2, 16, "train", num_workers=2,
                             device="cpu", resume_state=posrun.state(k)) as loader:
        posrun.check_follow(loader, k)


# ---------------------------------------------------------------- restart after SIGKILL

# The slow suite's: tests/loader/test_faults.py::test_restarts_at_random_kill_points[0] runs the same
# script on the same data by default, killed twice (other worker counts) and checked batch by batch;
# test_faults.py::test_trainer_killed checks that a killed trainer's segment goes.
@pytest.mark.slow
def test_restart_after_sigkill(synth, synth_tokenizer_pkl, tmp_path):
    total, B, T = 120, 2, 32
    seed = random.randrange(1 << 30)
    kill_at = random.Random(seed).randrange(5, total - 30)
    info = f"(seed {seed}, kill after {kill_at} batches)"
    cmd = [sys.executable, str(SCRIPTS / "restart_trainer.py"), "--data", str(synth.root),
           "--tokenizer", str(synth_tokenizer_pkl), "--out", str(tmp_path), "--total", str(total),
           "--batch-size", str(B), "--seq-len", str(T), "--workers", "2", "--step-s", "0.01"]
    log = tmp_path / "log.jsonl"
    first_pid = sigkill_after(cmd, tmp_path, log, kill_at, info)

    second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert second.returncode == 0, f"{info}\n{second.stderr}"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["k"] for r in records] == list(range(total)), info
    by_pid = {r["pid"] for r in records}
    assert by_pid == {first_pid, second_pid(tmp_path, first_pid)}, info
    resumed_at = next(r["k"] for r in records if r["pid"] != first_pid)
    assert resumed_at >= kill_at - 1, info  # the kill may fall between log line and checkpoint
    want_w, _ = synth.expected(total, B, T, "train")
    for r, w in zip(records, want_w):
        assert r["sha"] == hashlib.sha256(w.tobytes()).hexdigest(), f"batch {r['k']} differs {info}"
        assert r["head"] == w[:8].tolist()
    for pid in (first_pid, second_pid(tmp_path, first_pid)):
        assert not shm_segments(pid), f"shared memory of trainer {pid} left behind {info}"
    later = json.loads((tmp_path / f"pids-{second_pid(tmp_path, first_pid)}.json").read_text())
    deadline = time.monotonic() + 2
    while any(pid_alive(p) for p in later) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in later if pid_alive(p)], "children of the finished trainer still alive"


# ---------------------------------------------------------------- after the run changed

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
    want = [r for r, _ in itertools.islice(oracle.bestfit_rows(
        posdata.files("train"), posdata.encode, posdata.bos, 2, 24, 5, 3, cursor=pos, runs=decode_runs(state["buffer"]).tolist()), 25)]
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
    with shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), 2, 16, "train", device="cpu",
                             num_workers=2) as loader:
        want, states = take(loader, 60)
    k = 25
    shutil.copy(posdata.paths[-1], tmp_path / "shard_00099.parquet")  # a new last file
    with pytest.warns(UserWarning, match=r"1 file\(s\) added .*shard_00003\.parquet"):
        loader = shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), 2, 16, "train", device="cpu",
                                     num_workers=3, resume_state=states[k])
    with loader:
        got, _ = take(loader, 60 - k - 1)
    assert all(np.array_equal(g, w) for g, w in zip(got, want[k + 1:]))


def test_a_changed_earlier_file_is_refused_naming_it(posdata, tmp_path):
    for p in posdata.paths:
        shutil.copy(p, tmp_path / p.name)
    with shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), 2, 16, "train", device="cpu") as loader:
        _, states = take(loader, 130)
    state = next(s for s in states if s["pq_idx"] == 1)
    shutil.copy(posdata.paths[2], tmp_path / posdata.paths[0].name)  # file 0 rewritten
    with pytest.raises(ValueError, match=r"file 0: state has shard_00000\.parquet \([\d,]+ bytes\), "
                                         r"loader has shard_00000\.parquet \([\d,]+ bytes\)"):
        shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), 2, 16, "train", device="cpu",
                            resume_state=state)


def test_another_tokenizer_or_packing_is_refused_in_words(synth):
    from shmloader.demo import corpus
    with synth.loader(2, 32, "train") as loader:
        _, states = take(loader, 5)
    other = corpus.train_tokenizer(corpus.synthetic_texts(100, seed=5, mean_words=20), vocab_size=400)
    with pytest.raises(ValueError, match="saved with another tokenizer"):
        shmloader.ShmLoader(str(synth.root), other, 2, 32, "train", device="cpu", resume_state=states[-1])
    with pytest.raises(ValueError, match="packing: state has 'concat', loader has 'bos_bestfit'"):
        synth.loader(2, 32, "train", packing="bos_bestfit", resume_state=states[-1])
