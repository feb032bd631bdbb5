"""The head start of a mixture of one source (procs/headstart.py, packing/mixmode.py
`MixConcatMode.head_start`), as the client sees it: `ShmLoader(Mixture({"x": d}, {"x": 1}))`
with concat, whose mix passes its source's pieces whole (packing/mixone.py `passes`), gets its
first batches made in the training process as `ShmLoader(d)` does, and nothing the caller gets
differs from what the workers make: the same batches and states (every key, the mix's point
among them) as `head_start=False`, fresh and resumed (inside a document, and from a state of a
batch the head start made), in the files' order and shuffled, 1-3 workers, another rank; a point
that differs from the workers' is an error; an idle release after its batches goes on from their
point; bad data is the workers' to report. A mixture whose mix is no pass-through (two sources)
gets none, and reads as before."""
import json
import re
import shutil

import pytest

import shmloader
from tests import helpers
from tests.loader.test_headstart import made_here, same, take

pytestmark = pytest.mark.usefixtures("watchdog")


def one(synth, **source):
    return shmloader.Mixture({"x": shmloader.Source(str(synth.root), **source) if source else str(synth.root)},
                             {"x": 1})


SHUFFLED = dict(shuffle=True, seed=3, shuffle_window=30)


def loader(synth, data, B, T, **kw):
    kw.setdefault("num_workers", 2)
    return shmloader.ShmLoader(data, synth.tokenizer, B, T, device="cpu", **kw)


@pytest.mark.parametrize("kw", [{}, SHUFFLED], ids=["files-order", "shuffled"])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_mixture_of_one_gets_a_head_start_and_the_workers_batches_and_states(synth, workers, kw):
    B, T, n = 2, 16, 12
    with loader(synth, one(synth), B, T, num_workers=workers, head_start=False, **kw) as alone:
        want = take(alone, n)
        assert alone.stats()["head_batches"] == 0
    assert json.loads(want[-1][1]["mixture"]["point"])["mixer"]["totals"]["x"][1] > 0  # documents counted
    with loader(synth, str(synth.root), B, T, num_workers=workers, head_start=False, **kw) as plain:
        source = take(plain, n)
    assert all(all(a.equal(b) for a, b in zip(x, y)) for (x, _), (y, _) in zip(source, want)), \
        "a mixture of one is not its source's stream"

    def attempt() -> int:
        with loader(synth, one(synth), B, T, num_workers=workers, **kw) as mixed:
            got = take(mixed, n)
            made = mixed.stats()["head_batches"]
        same(got, want)
        return made

    made_here(attempt, 2)


@pytest.mark.parametrize("shuffled", [{}, SHUFFLED], ids=["files-order", "shuffled"])
def test_resumed_inside_a_document_on_another_rank_and_from_a_head_start_batchs_state(synth, shuffled):
    B, T, n = 2, 50, 10
    kw = dict(rank=1, world_size=2, **shuffled)
    with loader(synth, one(synth), B, T, head_start=False, **kw) as alone:
        want = take(alone, n)
    state = want[3][1]
    assert state["position"][4] > 0, "the resume does not start inside a document"
    heads = {}

    def attempt(resume, k) -> int:
        with loader(synth, one(synth), B, T, resume_state=resume, **kw) as mixed:
            got = take(mixed, n - k)
            heads[k] = got
            made = mixed.stats()["head_batches"]
        same(got, want[k:])
        return made

    made_here(lambda: attempt(None, 0), 2)
    made_here(lambda: attempt(state, 4), 2)
    # the state after batch 0 of a run whose first batches the head start made resumes exactly
    made_here(lambda: attempt(heads[0][0][1], 1), 1)


def test_a_point_that_differs_from_the_workers_is_an_error(synth, monkeypatch):
    from shmloader.packing import mixone

    real = mixone.OneStream.at

    def at(self, position, end, begun):  # the trainer's copy only: the coordinator's is another process
        got = real(self, position, end, begun)
        return got._replace(documents=got.documents + 1)

    monkeypatch.setattr(mixone.OneStream, "at", at)

    def attempt() -> int:
        with loader(synth, one(synth), 2, 16, num_workers=1) as mixed:
            try:
                for _ in range(20):
                    next(mixed)
            except shmloader.ShmLoaderError as exc:
                assert "differs from the one the training process made" in str(exc)
                assert "its state is" in str(exc)
                return 1
            assert mixed.stats()["head_batches"] == 0, "a batch made here was not compared"
            return 0

    made_here(attempt)


def test_a_mixture_that_mixes_gets_none(synth):
    """Two sources: the stream decides each document (no pass-through): it reads as without a
    head start."""
    mixture = shmloader.Mixture({"x": str(synth.root), "y": str(synth.root)}, {"x": 1, "y": 1})
    runs = {}
    for head_start in (True, False):
        with loader(synth, mixture, 2, 16, head_start=head_start) as mixed:
            runs[head_start] = take(mixed, 8)
            assert mixed.stats()["head_batches"] == 0
    same(runs[True], runs[False])


@pytest.mark.parametrize("footer", [False, True], ids=["row-group", "footer"])
def test_bad_data_of_a_shuffled_mixture_of_one_is_the_workers_to_report(synth, tmp_path, footer):
    """A row group that cannot be read, or a footer (the head start cannot find the source's
    first window), ends the head start quietly: the loader raises what it raises without it
    (or, skipping, reads the same batches)."""
    root = tmp_path / "bad"
    shutil.copytree(synth.root, root)
    first = sorted(root.iterdir())[0]
    if footer:
        first.write_bytes(first.read_bytes()[:-100])
    else:
        helpers.corrupt_row_group(first, 0)
    mixture = shmloader.Mixture({"x": str(root)}, {"x": 1})
    errors = {}
    for head_start in (True, False):
        with loader(synth, mixture, 2, 16, head_start=head_start, **SHUFFLED) as mixed:
            with pytest.raises(shmloader.DataError) as info:
                for _ in range(5000):  # (its row group comes within the first epoch)
                    next(mixed)
            errors[head_start] = re.sub(r"(worker|pid) \d+", r"\1", str(info.value))  # which worker: the timing's
            assert first.name in errors[head_start]
    assert errors[True] == errors[False]


def test_an_idle_release_within_the_head_starts_batches_goes_on_from_their_point(synth):
    """A mixture of one read for 3 batches made here, then left: its processes exit after
    `idle_release_s` and start again from the point the head start made (`Runs.restart`: the
    mixer's counts and the source's place from the last batch's state), the stream and states
    as without the head start."""
    with loader(synth, one(synth), 2, 16, head_start=False) as alone:
        want = take(alone, 9)

    def attempt() -> int:
        with loader(synth, one(synth), 2, 16, idle_release_s=0.2) as mixed:
            got = take(mixed, 3)
            made = mixed.stats()["head_batches"]
            d = mixed.debug()
            pids = [d.coordinator.pid, *(p.pid for p in d.workers)]
            del d
            gone = helpers.wait_gone(pids, 10.0)
            got += take(mixed, 6)
            releases = mixed.stats()["idle_releases"]
        same(got, want)
        assert gone == [] and releases == 1, f"children alive after 10 s idle: {gone}"
        return made

    made_here(attempt, 3)
