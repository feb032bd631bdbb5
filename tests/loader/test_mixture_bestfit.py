"""Best fit over a Mixture, read as a client reads it: the three sources of test_mixture.py
(each runs out and starts its next epoch alone), B=8, T=256, a buffer of 64 documents taken in
chunks of 16, against the single-process oracle (tests/oracle.py `mixed_bestfit_rows`: the mixing
rule's documents in chunks, planned by nanochat's scans); shares by token weight; the same
batches with 1, 2 and 3 workers; states that resume exactly, with other weights; a schedule;
a worker and the coordinator killed; the drop-in; an end, and the batches placed after it resumed
and healed; what is refused."""
import itertools
import json
import os
import signal
import warnings

import numpy as np
import pytest

import shmloader
from shmloader.data.mixture import Mixer
from shmloader.packing.mixbestfit import buffer_entries
from tests import oracle
from tests.cases import cross
from tests.loader.test_bestfit_stream import rows_of
from tests.loader.test_mixture import SHAPES, WEIGHTS, mixdata, mixture  # noqa: F401 (a fixture)

B, T = 8, 256
BUFFER, CHUNK = 64, 16
FIT = dict(packing="bos_bestfit", buffer_size=BUFFER, tokenizer_batch_size=CHUNK, device="cpu")


def expected(files, tok, mix, n, point=None, batch=0, names=None, placed=None):
    """The oracle's first `n` (rows, buffer) (from `point` at `batch`), and the documents it read;
    `placed`: a dict the tokens placed of each source are added to."""
    read = []
    rows = oracle.mixed_bestfit_rows({k: files[k] for k in (names or files)}, tok.encode_ordinary,
                                     tok.encode_single_token("<|bos|>"), mix, B, T, BUFFER, CHUNK,
                                     point=point, batch=batch, log=read, placed=placed)
    return list(itertools.islice(rows, n)), read


def take(loader, n):
    """n batches: their rows, and the state after each."""
    rows, states = [], []
    for x, y in itertools.islice(loader, n):
        rows.append(rows_of(x, y, B, T))
        states.append(loader.state_dict())
    assert len(rows) == n > 0
    return rows, states


def same(got, want):
    return len(got) == len(want) > 0 and all(np.array_equal(a, b) for a, (b, _) in zip(got, want))


def buffer_of(state):
    return buffer_entries(json.loads(state["mixture"]["point"]))


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_mixed_best_fit_is_the_oracle_whatever_the_workers(mixdata, workers):
    root, files, tok = mixdata
    placed = {}
    want, read = expected(files, tok, mixture(root), 120, placed=placed)
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=workers, **FIT) as loader:
        got, states = take(loader, 120)
        stats = loader.stats()
    assert same(got, want), workers
    assert [buffer_of(s) for s in states[::17]] == [b for _, b in want[::17]]
    assert stats["tokens_cropped"] > 0 and stats["sources"]
    total = 120 * B * (T + 1)
    for name, w in WEIGHTS.items():  # as delivered in the rows: the mix makes up for what best fit crops
        assert abs(placed[name] / total - w) < 0.03, (name, placed)
        assert abs(stats["sources"][name]["share"] - w) < 0.03, (name, stats["sources"])
    assert stats["sources"]["math"]["epoch"] >= 2  # the small source ran out, alone


def test_a_state_resumes_exactly_with_any_workers(mixdata):
    root, files, tok = mixdata
    want, _ = expected(files, tok, mixture(root), 110)
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, **FIT) as loader:
        _, states = take(loader, 90)
    for k in (1, 17, 63, 90):
        state = json.loads(json.dumps(states[k - 1]))  # a checkpoint holds it as JSON
        assert buffer_of(state)
        with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=1 + k % 3, resume_state=state, **FIT) as loader:
            got, _ = take(loader, 20)
        assert same(got, want[k:k + 20]), k


def test_new_weights_at_a_resume_keep_the_buffer_and_go_on_with_every_source(mixdata):
    root, files, tok = mixdata
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, **FIT) as loader:
        _, states = take(loader, 40)
    state = states[-1]
    other = {"web": 0.1, "code": 0.2, "math": 0.7}
    point = json.loads(state["mixture"]["point"])
    placed = {}
    want, read = expected(files, tok, mixture(root, other), 100, point=point, batch=40, placed=placed)
    with pytest.warns(UserWarning, match="weights differ"):
        loader = shmloader.ShmLoader(mixture(root, other), tok, B, T, num_workers=2, resume_state=state, **FIT)
    with loader:
        got, _ = take(loader, 100)
    assert same(got, want)
    for name, w in other.items():  # what is delivered follows the new weights
        assert abs(placed[name] / sum(placed.values()) - w) < 0.03, (name, placed)
    for name in SHAPES:  # every source goes on from the document where it stood, in its own order
        at = tuple(point["sources"][name])
        own = [m for m, text in itertools.islice(oracle.documents(files[name]), 3000) if text is not None]
        after = [m for s, _, m in read if s == name][:300]
        i = next(i for i, m in enumerate(own) if m >= at)
        assert len(after) > 5 and after == own[i:i + len(after)], name


def test_a_schedule_changes_what_enters_the_buffer_from_its_first_batch(mixdata, caplog):
    root, files, tok = mixdata
    schedule = [(0, {"web": 0.7, "code": 0.3}), (50, {"web": 0.2, "math": 0.8})]
    mix = mixture(root, schedule)
    want, _ = expected(files, tok, mix, 110)
    with caplog.at_level("INFO", logger="shmloader"):
        with shmloader.ShmLoader(mix, tok, B, T, num_workers=2, **FIT) as loader:
            got, states = take(loader, 110)
    assert same(got, want)
    assert [r.message for r in caplog.records if "stage from batch 50" in r.message]
    totals = [json.loads(s["mixture"]["point"])["mixer"]["totals"] for s in states]

    def share(lo, hi):  # of the tokens the mix took while batches lo..hi-1 were planned
        took = {n: totals[hi - 1][n][0] - (totals[lo - 1][n][0] if lo else 0) for n in SHAPES}
        return {n: v / sum(took.values()) for n, v in took.items()}
    for (lo, hi), weights in (((0, 50), schedule[0][1]), ((50, 110), schedule[1][1])):
        got_share = share(lo, hi)
        for name in SHAPES:
            assert abs(got_share[name] - weights.get(name, 0)) < 0.03, (name, lo, got_share)


def test_a_killed_worker_and_coordinator_change_no_batch(mixdata):
    root, files, tok = mixdata
    want, _ = expected(files, tok, mixture(root), 80)
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=2, **FIT) as loader:
        got, _ = take(loader, 30)
        os.kill(loader.debug().workers[0].pid, signal.SIGKILL)
        got += take(loader, 25)[0]
        os.kill(loader.debug().coordinator.pid, signal.SIGKILL)
        got += take(loader, 25)[0]
        assert loader.stats()["heals"] == 2
    assert same(got, want)


def test_the_bestfit_dropin_takes_a_mixture_in_nanochats_loop(mixdata):
    root, files, tok = mixdata
    want, _ = expected(files, tok, mixture(root), 30)
    fit = shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit
    gen = fit(tok, B, T, "train", tokenizer_batch_size=CHUNK, device="cpu", buffer_size=BUFFER, data=mixture(root),
              num_workers=2)
    got, saved = [], None
    for step, (x, y, state) in enumerate(itertools.islice(gen, 20)):
        got.append(rows_of(x, y, B, T))
        if step == 13:
            saved = json.loads(json.dumps(state))
    gen.close()
    assert same(got, want[:20])
    again = fit(tok, B, T, "train", tokenizer_batch_size=CHUNK, device="cpu", buffer_size=BUFFER, data=mixture(root),
                num_workers=1, resume_state_dict=saved)
    resumed = [rows_of(x, y, B, T) for x, y, _ in itertools.islice(again, 16)]
    again.close()
    assert same(resumed, want[13:29])


@pytest.mark.parametrize("workers", [1, 2])
def test_a_mixture_whose_sources_all_end_gives_every_batch_then_says_so(mixdata, workers):
    root, files, tok = mixdata
    mix = mixture(root, {"code": 1, "math": 1}, names=["code", "math"], max_epochs={"code": 2, "math": 5})
    want, _ = expected(files, tok, mix, 10**6, names=["code", "math"])
    got = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sources' ends (test_mixture.py checks the words)
        with shmloader.ShmLoader(mix, tok, B, T, num_workers=workers, timeout=60, **FIT) as loader:
            with pytest.raises(shmloader.DataError, match="has ended .*nothing is left to read"):
                for x, y in loader:
                    got.append(rows_of(x, y, B, T))
            with pytest.raises(shmloader.DataError, match="nothing is left to read"):
                next(loader)
    assert len(got) == len(want) > 5
    assert same(got, want)


def test_what_a_mixed_best_fit_refuses(mixdata):
    root, files, tok = mixdata
    with shmloader.ShmLoader(mixture(root), tok, B, T, num_workers=1, **FIT) as loader:
        _, states = take(loader, 3)
    state = states[-1]
    assert any(r[0] == "math" for r in buffer_of(state))
    two = mixture(root, {"web": 0.6, "code": 0.4}, names=["web", "code"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="buffer holds documents of mixture source 'math'.*keep it, with weight 0"):
            shmloader.ShmLoader(two, tok, B, T, resume_state=state, **FIT)
    with pytest.raises(ValueError, match="fingerprint|packing"):  # a concat mixture's state
        shmloader.ShmLoader(mixture(root), tok, B, T, device="cpu", resume_state=state)


def _to_the_end(loader):
    """Every batch's rows and the state after it, until the end; the end's words."""
    rows, states = [], []
    with pytest.raises(shmloader.DataError, match="nothing is left to read") as info:
        for x, y in loader:
            rows.append(rows_of(x, y, B, T))
            states.append(loader.state_dict())
    with pytest.raises(shmloader.DataError, match="nothing is left to read"):  # and again
        next(loader)
    return rows, states, str(info.value)


ENDS = {  # a mixture whose sources all read their max_epochs; one whose stage's do, a stage after it
    "max_epochs": ({"code": 1, "math": 1}, {"code": 2, "math": 5}),
    "stage": ([(0, {"code": 1, "math": 1}), (6, {"math": 1}), (8, {"code": 1})], {"math": 1}),
}


# default: each end and each worker count once; the other two with -m slow
@pytest.mark.parametrize("end,workers", cross(sorted(ENDS), [1, 3], default={"max_epochs-1", "stage-3"}))
def test_the_last_batches_after_a_mixture_ended_resume_and_heal_exactly(mixdata, end, workers):
    """Once the mix has ended best fit still places its buffer: a state of any of those last
    batches resumes them exactly (then the same end), and a coordinator killed there heals."""
    root, files, tok = mixdata
    weights, max_epochs = ENDS[end]
    mix = mixture(root, weights, names=["code", "math"], max_epochs=max_epochs)
    fit = dict(FIT, num_workers=workers, timeout=60, n_slots=2)
    want, _ = expected(files, tok, mix, 10**6, names=["code", "math"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sources' ends (test_mixture.py checks the words)
        with shmloader.ShmLoader(mix, tok, B, T, **fit) as loader:
            got, states, said = _to_the_end(loader)
        assert same(got, want)
        over = [k for k, s in enumerate(states, 1)
                if Mixer.resume(mix, json.loads(s["mixture"]["point"])["mixer"], k).mixer.over()]
        assert len(over) >= 4 and over == list(range(over[0], len(got) + 1)), over  # from the buffer alone
        for k in [over[0] - 1, *over]:
            with shmloader.ShmLoader(mix, tok, B, T, resume_state=states[k - 1], **fit) as loader:
                rows, _, again = _to_the_end(loader)
            assert again == said and len(rows) == len(want) - k, k  # the last state's run ends at once
            assert all(np.array_equal(a, b) for a, (b, _) in zip(rows, want[k:])), k
        for k in over[:-3]:  # more batches left than the ring holds: the trainer waits, sees the death
            with shmloader.ShmLoader(mix, tok, B, T, **fit) as loader:
                rows = [rows_of(x, y, B, T) for x, y in itertools.islice(loader, k)]
                os.kill(loader.debug().coordinator.pid, signal.SIGKILL)
                more, _, again = _to_the_end(loader)
                assert loader.stats()["heals"] == 1, k
            assert again == said and same(rows + more, want), k
