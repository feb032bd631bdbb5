"""A Mixture as `data`, read as a client reads it: three sources of different sizes (each runs
out and starts its next epoch alone), concat, B=8, T=256, against the single-process oracle
(tests/oracle.py `mixed_documents`: each source's canonical documents and the mixing rule);
shares by token weight; the same batches with 1, 2 and 3 workers; states that resume exactly,
with other weights, with a source left out and brought back; a schedule; a worker killed; the
drop-in; and what is refused."""
import itertools
import json
import os
import signal
import time
import warnings
import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import oracle
from tests.helpers import window_of

B, T = 8, 256
W = B * T + 1
WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}
# name -> (documents, row group sizes, mean words): row groups of 1 to 40 documents, nulls among them
SHAPES = {"web": (420, [40, 3, 17], 30), "code": (160, [9, 1, 25], 55), "math": (90, [12], 15)}


@pytest.fixture(scope="module")
def mixdata(tmp_path_factory, synth_tokenizer):
    root = tmp_path_factory.mktemp("mix")
    files = {}
    for i, (name, (n, groups, words)) in enumerate(SHAPES.items()):
        docs = list(corpus.synthetic_texts(n, seed=20 + i, mean_words=words))
        for j in range(3, n, 37):
            docs[j] = None
        docs[5] = ""
        paths = corpus.write_shards(docs, root / name, num_files=3, row_group_size=groups)
        files[name] = [str(p) for p in paths[:-1]]
    return root, files, synth_tokenizer


def mixture(root, weights=WEIGHTS, names=None, **kw):
    names = names or list(SHAPES)
    return shmloader.Mixture({name: str(root / name) for name in names}, weights, **kw)


def expected(files, tok, mix, n, point=None, batch=0, names=None):
    """The oracle's first `n` windows (from `point` at `batch`), and the documents it read."""
    bos = tok.encode_single_token("<|bos|>")
    read = []

    docs = oracle.mixed_documents({k: files[k] for k in (names or files)}, tok.encode_ordinary, bos, mix, W,
                                  point=point, batch=batch, log=read)

    skip = point["skip"] if point is not None and point["source"] in (names or files) else 0
    windows = [w for w, _ in itertools.islice(oracle.concat_windows([], tok.encode_ordinary, bos, B, T, skip=skip,
                                                                     docs=docs), n)]
    return windows, read


def take(loader, n):
    return [window_of(x, y) for x, y in itertools.islice(loader, n)]


def shares(read, upto_tokens):
    """Each source's share of the stream's first `upto_tokens` tokens (documents read in order)."""
    got, total = {}, 0
    for name, n, _ in read:
        if total >= upto_tokens:
            break
        got[name] = got.get(name, 0) + n
        total += n
    return {name: v / total for name, v in got.items()}


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_mixed_stream_is_the_oracle_whatever_the_workers(mixdata, workers):
    root, files, tok = mixdata
    want, read = expected(files, tok, mixture(root), 120)
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=workers, device="cpu") as loader:
        got = take(loader, 120)
        stats = loader.stats()["sources"]
    assert all(np.array_equal(a, b) for a, b in zip(got, want)), workers
    share = shares(read, 120 * W)
    for name, w in WEIGHTS.items():
        assert abs(share[name] - w) < 0.02, (name, share)
        assert abs(stats[name]["share"] - w) < 0.02, (name, stats)
    assert {name: stats[name]["epoch"] for name in SHAPES}["math"] >= 2  # the small source ran out, alone


def test_a_state_resumes_exactly_with_any_workers(mixdata):
    root, files, tok = mixdata
    want, _ = expected(files, tok, mixture(root), 110)
    states = {}
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, device="cpu") as loader:
        for k in range(1, 91):
            next(loader)
            if k in (17, 63, 90):
                states[k] = loader.state_dict()
    assert any(s["position"][4] for s in states.values())  # a document cut at a batch's end among them
    for k, state in states.items():
        with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=1 + k % 3, device="cpu",
                                 resume_state=state) as loader:
            got = take(loader, 20)
        assert all(np.array_equal(a, b) for a, b in zip(got, want[k:k + 20])), k


def test_new_weights_at_a_resume_go_on_with_every_source(mixdata):
    root, files, tok = mixdata
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, device="cpu") as loader:
        take(loader, 40)
        state = loader.state_dict()
    other = {"web": 0.1, "code": 0.2, "math": 0.7}
    point = json.loads(state["mixture"]["point"])
    want, read = expected(files, tok, mixture(root, other), 120, point=point, batch=40)
    with pytest.warns(UserWarning, match="weights differ"):
        loader = shmloader.ShmLoader(mixture(root, other), tok, B, T, num_workers=2, device="cpu",
                                     resume_state=state)
    with loader:
        got = take(loader, 120)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    share = shares(read, 120 * W)
    for name, w in other.items():
        assert abs(share[name] - w) < 0.03, (name, share)
    # every source goes on from its own place: its documents before the state and after it are its
    # canonical order without a gap or a repeat (the document cut at the state's batch, in both, once)
    _, before = expected(files, tok, mixture(root), 40)
    start = 0
    for i, (name, n, meta) in enumerate(before):
        if start + n > 40 * W:
            before = before[:i + 1]
            break
        start += n
    for name in SHAPES:
        seen = [meta for n_, _, meta in before if n_ == name]
        after = [meta for n_, _, meta in read if n_ == name]
        if point["skip"] and point["source"] == name:
            assert after[0] == seen[-1]
            after = after[1:]
        seen += after
        own = [meta for meta, text in itertools.islice(oracle.documents(files[name]), 10 * len(seen) + 100)
               if text is not None]
        assert len(seen) > 20 and seen == own[:len(seen)], name


def test_a_schedule_follows_its_stages(mixdata, caplog):
    root, files, tok = mixdata
    schedule = [(0, {"web": 0.7, "code": 0.3}), (50, {"web": 0.2, "math": 0.8})]
    mix = mixture(root, schedule)
    want, read = expected(files, tok, mix, 110)
    with caplog.at_level("INFO", logger="shmloader"):
        with shmloader.ShmLoader(mix, tok, B, T, num_workers=2, device="cpu") as loader:
            got = take(loader, 110)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert [r.message for r in caplog.records if "stage from batch 50" in r.message]
    at, stage0, stage1 = 0, {}, {}
    for name, n, _ in read:
        (stage0 if at // W < 50 else stage1)[name] = (stage0 if at // W < 50 else stage1).get(name, 0) + n
        at += n
    for got_, weights in ((stage0, schedule[0][1]), (stage1, schedule[1][1])):
        total = sum(got_.values())
        for name in SHAPES:
            assert abs(got_.get(name, 0) / total - weights.get(name, 0)) < 0.03, (name, got_)


def test_a_killed_worker_changes_no_batch(mixdata):
    root, files, tok = mixdata
    want, _ = expected(files, tok, mixture(root), 80)
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, device="cpu") as loader:
        got = take(loader, 30)
        os.kill(loader.debug().workers[0].pid, signal.SIGKILL)
        got += take(loader, 25)
        os.kill(loader.debug().coordinator.pid, signal.SIGKILL)
        got += take(loader, 25)
        assert loader.stats()["heals"] == 2
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_source_left_out_is_kept_and_goes_on_when_it_comes_back(mixdata):
    root, files, tok = mixdata
    two = mixture(root, {"web": 0.6, "code": 0.4}, names=["web", "code"])
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, device="cpu") as loader:
        take(loader, 30)
        state = loader.state_dict()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loader = shmloader.ShmLoader(two, tok, B, T, num_workers=2, device="cpu", resume_state=state)
    said = [str(w.message) for w in said]
    assert any("'math' of the state is not in this mixture" in w for w in said), said
    assert any("weights differ" in w for w in said), said
    with loader:
        take(loader, 20)
        later = loader.state_dict()
    assert "math" in json.loads(later["mixture"]["point"])["sources"]
    point = json.loads(later["mixture"]["point"])
    want, _ = expected(files, tok, mixture(root), 20, point=point, batch=50)
    with pytest.warns(UserWarning, match="weights differ"):
        loader = shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, device="cpu", resume_state=later)
    with loader:
        got = take(loader, 20)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert point["sources"]["math"] == json.loads(state["mixture"]["point"])["sources"]["math"]


def test_the_dropin_takes_a_mixture_in_nanochats_prefetch_and_save_loop(mixdata):
    """nanochat's loop: the state yielded with batch k (the batch in hand, not trained on) is
    saved, and the resumed drop-in's first batch is batch k."""
    root, files, tok = mixdata
    want, _ = expected(files, tok, mixture(root), 30)
    gen = shmloader.tokenizing_distributed_data_loader_with_state(B, T, "train", device="cpu", data=mixture(root),
                                                                   tokenizer=tok, num_workers=2)
    got, saved = [], None
    for step, (x, y, state) in enumerate(itertools.islice(gen, 20)):
        got.append(window_of(x, y))
        if step == 13:
            saved = json.loads(json.dumps(state))  # a checkpoint holds it as JSON
    gen.close()
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    again = shmloader.tokenizing_distributed_data_loader_with_state(B, T, "train", device="cpu", data=mixture(root),
                                                                     tokenizer=tok, num_workers=1,
                                                                     resume_state_dict=saved)
    resumed = [window_of(x, y) for x, y, _ in itertools.islice(again, 16)]
    again.close()
    assert all(np.array_equal(a, b) for a, b in zip(resumed, want[13:29]))


def test_a_source_that_lost_a_file_since_the_state_is_refused(mixdata, tmp_path):
    """A shard removed from a source's files between the save and the resume: refused, naming the
    source, as one source refuses it (files added to a source are read: test_mixture_added.py)."""
    root, files, tok = mixdata
    import shutil

    shutil.copytree(root, tmp_path / "data")
    mix = mixture(tmp_path / "data")
    with shmloader.ShmLoader(mix, tok, B, T, num_workers=1, device="cpu") as loader:
        take(loader, 5)
        state = loader.state_dict()
    (tmp_path / "data" / "code" / "shard_00000.parquet").unlink()
    with pytest.raises(ValueError, match="mixture source 'code' lists other files than the state's.*files removed"):
        shmloader.ShmLoader(mix, tok, B, T, device="cpu", resume_state=state)


def test_what_a_mixture_refuses(mixdata, tmp_path):
    root, files, tok = mixdata
    (tmp_path / "empty").mkdir()
    with pytest.raises(shmloader.DataError, match="mixture source 'none'"):
        shmloader.ShmLoader(shmloader.Mixture({"web": str(root / "web"), "none": str(tmp_path / "empty")},
                                              {"web": 1, "none": 1}), tok, B, T, device="cpu")
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=1, device="cpu", rank=0, world_size=2) as loader:
        next(loader)
        state = loader.state_dict()
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=1, device="cpu", rank=0, world_size=2,
                             packing="bos_bestfit") as loader:
        next(loader)
        fit = loader.state_dict()
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=1, device="cpu", rank=1, world_size=3,
                             resume_state=fit, packing="bos_bestfit") as loader:
        next(loader)  # another world size's best-fit state: built (test_mixture_bestfit_elastic.py checks it)
    with pytest.raises(ValueError, match="state is of a Mixture and this loader reads one source"):
        shmloader.ShmLoader(str(root / "web"), tok, B, T, device="cpu", rank=0, world_size=2, resume_state=state)
    with shmloader.ShmLoader(str(root / "web"), tok, B, T, num_workers=1, device="cpu") as loader:
        next(loader)
        single = loader.state_dict()
    with pytest.raises(ValueError, match="resume state is of one source"):
        shmloader.ShmLoader(mixture(root), tok, B, T, device="cpu", resume_state=single)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_source_without_a_row_group_for_this_rank_is_named(mixdata, packing):
    """math's files hold 3 row groups each: rank 3 of 4 has none of them (web's and code's hold 7
    and 6), and the error says which source, which rank of how many, and what to do."""
    root, files, tok = mixdata
    with pytest.raises(shmloader.DataError) as info:
        with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=1, device="cpu", rank=3, world_size=4,
                                 packing=packing, buffer_size=64, tokenizer_batch_size=16, timeout=30) as loader:
            next(loader)
    said = str(info.value)
    assert "mixture source 'math': rank 3 of 4 has no row group in any of the 2 files" in said, said
    assert "use fewer ranks or write files with more row groups" in said, said


def test_a_trainer_that_pauses_never_leaves_the_mix_waiting(mixdata):
    """With a ring of 2 slots and a trainer that stops now and then, the workers fill their hold
    budget with the heavy source's pieces; the light source's next piece must still go out
    (the mix waits for it, and only the mix can free that budget): no LoaderTimeout."""
    root, files, tok = mixdata
    mix = mixture(root, {"web": 0.9, "math": 0.1}, names=["web", "math"])
    want, _ = expected(files, tok, mix, 60, names=["web", "math"])
    got = []
    with shmloader.ShmLoader(mix, tok, B, T, num_workers=2, n_slots=2, device="cpu", timeout=20) as loader:
        for k in range(60):
            if k % 10 == 0:
                time.sleep(0.5)
            got.append(window_of(*next(loader)))
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def _until_error(loader, match, ended=()):
    """Every batch until the DataError `match`; the sources `ended` are said to end once each."""
    got = []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(shmloader.DataError, match=match):
            for x, y in loader:
                got.append(window_of(x, y))
        with pytest.raises(shmloader.DataError, match=match):  # and again
            next(loader)
    said = [str(w.message) for w in said]
    assert sorted(n for n in SHAPES for w in said if f"source {n!r} has read its" in w) == sorted(ended), said
    return got


@pytest.mark.parametrize("workers", [1, 2])
def test_a_mixture_whose_sources_all_end_gives_every_batch_then_says_so(mixdata, workers):
    root, files, tok = mixdata
    mix = mixture(root, {"code": 1, "math": 1}, names=["code", "math"], max_epochs={"code": 1, "math": 2})
    want, _ = expected(files, tok, mix, 10**6, names=["code", "math"])
    with shmloader.ShmLoader(mix, tok, B, T, num_workers=workers, device="cpu", timeout=60) as loader:
        got = _until_error(loader, "has ended .*nothing is left to read", ended=["math"])
    assert len(got) == len(want) > 5
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stage_whose_sources_have_ended_ends_the_mix_where_it_begins(mixdata, workers):
    root, files, tok = mixdata
    mix = mixture(root, [(0, {"web": 1, "math": 1}), (30, {"math": 1})], names=["web", "math"], max_epochs={"math": 1})
    want, _ = expected(files, tok, mix, 10**6, names=["web", "math"])
    with shmloader.ShmLoader(mix, tok, B, T, num_workers=workers, device="cpu", timeout=60) as loader:
        got = _until_error(loader, "stage 1 .* has ended", ended=["math"])
    assert len(got) == len(want) >= 30
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_source_without_documents_paused_at_first_ends_the_mix_only_when_it_is_needed(mixdata, tmp_path):
    root, files, tok = mixdata
    corpus.write_shards([None] * 12, tmp_path / "nulls", num_files=3, row_group_size=2)
    mix = shmloader.Mixture({"web": str(root / "web"), "nulls": str(tmp_path / "nulls")},
                            [(0, {"web": 1}), (20, {"web": 1, "nulls": 1})])
    counts = []
    for workers in (1, 2):
        with shmloader.ShmLoader(mix, tok, B, T, num_workers=workers, device="cpu", timeout=60) as loader:
            counts.append(len(_until_error(loader, "mixture source 'nulls': a whole epoch held no document")))
    assert counts[0] == counts[1] >= 20


def test_a_token_cache_serves_a_mixture(mixdata, tmp_path):
    root, files, tok = mixdata
    want, _ = expected(files, tok, mixture(root), 40)
    misses = []
    for _ in range(2):  # an empty cache (a small source's second epoch already hits it), then what it kept
        with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, device="cpu", cache_dir=tmp_path) as loader:
            got = take(loader, 40)
            misses.append(loader.stats()["cache_misses"])
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert misses[0] > 10 and misses[1] < misses[0] / 4, misses


def raw(loader, n):
    """n batches as one array each (inputs, then targets): for either packing."""
    return [np.concatenate([x.numpy().ravel(), y.numpy().ravel()]) for x, y in itertools.islice(loader, n)]


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_another_ranks_state_resumes_this_rank_exactly(mixdata, packing):
    """nanochat saves rank 0's state and hands it to every rank: rank 1 replays its own mixed
    stream to the state's batch count, and goes on as its own state would have it."""
    root, files, tok = mixdata
    opts = dict(packing=packing, buffer_size=64, tokenizer_batch_size=16, device="cpu", world_size=2)
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=1, rank=0, **opts) as loader:
        raw(loader, 37)
        state = json.loads(json.dumps(loader.state_dict()))
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, rank=1, **opts) as loader:
        own = raw(loader, 37)
        own_state = loader.state_dict()
        want = raw(loader, 15)
    assert own and json.loads(own_state["mixture"]["point"]) != json.loads(state["mixture"]["point"])
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, rank=1, resume_state=state, **opts) as loader:
        located = loader.state_dict()
        got = raw(loader, 15)
    assert json.loads(located["mixture"]["point"]) == json.loads(own_state["mixture"]["point"])
    assert {k: located[k] for k in ("position", "batch")} == \
        {k: own_state[k] for k in ("position", "batch")}
    assert all(np.array_equal(a, b) for a, b in zip(got, want)) and len(got) == 15


def test_another_ranks_state_of_a_changed_mixture_is_refused(mixdata):
    root, files, tok = mixdata
    opts = dict(device="cpu", world_size=2, num_workers=1)
    with shmloader.ShmLoader(mixture(root), tok, B, T, rank=0, **opts) as loader:
        take(loader, 5)
        state = loader.state_dict()
    other = mixture(root, {"web": 0.2, "code": 0.4, "math": 0.4})
    with pytest.warns(UserWarning, match="weights differ"):
        loader = shmloader.ShmLoader(other, tok, B, T, rank=0, resume_state=state, **opts)
    with loader:
        take(loader, 5)
        later = loader.state_dict()
    with pytest.raises(ValueError, match="rank 0's, of a run whose mixture changed at batch 5"):
        shmloader.ShmLoader(other, tok, B, T, rank=1, resume_state=later, **opts)
    with pytest.raises(ValueError, match="mixture changed at a resume .*or is not this loader's"):
        shmloader.ShmLoader(other, tok, B, T, rank=1, resume_state=state, **opts)
    # another B or T is no change of the mixture: its states are replayed a shape at a time
    # (tests/loader/test_mixture_reshaped.py)
