"""The head start (procs/headstart.py), as the client sees it: a concat loader's first batches
are made in the training process while its workers start, and nothing the caller gets differs
from what the workers make: the same batches, positions and states (every key), from a fresh
start, a resume in the middle of a document, another rank, a tokenizer file; a run it cannot
make gets none; a difference from the workers' batch is an error; bad data is the workers' to
report, as without it."""
import itertools
import os
import shutil

import numpy as np
import pytest

import shmloader
from shmloader.ipc.ring import Counter
from tests import helpers

pytestmark = pytest.mark.usefixtures("watchdog")


def take(loader, n):
    """`n` batches (every tensor copied) and the state after each."""
    out = []
    for _ in range(n):
        batch = next(loader)
        out.append((tuple(t.clone() for t in batch), loader.state_dict()))
    return out


ATTEMPTS = 5  # loaders built, at most, until one's first batches were made here (`made_here`)


def made_here(attempt, want: int = 1):
    """Call `attempt()` (it builds a loader, reads it, checks what it read, and returns the
    batches the head start made, `stats()["head_batches"]`) until they are at least `want`, at
    most `ATTEMPTS` times. Whether a run's first batches are made here is a race the head
    start's rule decides (procs/headstart.py `wanted`: only while the ring has announced none and
    the coordinator has queued no message): a trainer held off the cores for ~50 ms between
    starting its children and its first next() finds the coordinator's first messages queued,
    and the ring delivers from batch 0, correctly (on 2 cores beside 3 busy loops, 1 run of this
    file in 20 lost a head start so)."""
    got = []
    while len(got) < ATTEMPTS and (not got or got[-1] < want):
        got.append(attempt())
    assert got[-1] >= want, f"the head start made {got} batches in {ATTEMPTS} loaders, wanted {want}"


def torch_equal(a, b) -> bool:
    return np.array_equal(a.numpy(), b.numpy())


def same(a, b):
    assert len(a) == len(b)
    for k, ((x, sx), (y, sy)) in enumerate(zip(a, b)):
        assert all(np.array_equal(p.numpy(), q.numpy()) for p, q in zip(x, y)), f"batch {k} differs"
        assert sx == sy, f"the state after batch {k} differs: {sx} != {sy}"


@pytest.mark.parametrize("B, T, split, positions", [(2, 16, "train", False), (1, 300, "train", True),
                                                    (4, 7, "val", True), (3, 64, "train", False)])
def test_the_first_batches_are_made_here_and_equal_the_workers(synth, B, T, split, positions):
    with synth.loader(B, T, split, positions=positions, head_start=False) as alone:
        want = take(alone, 12)
        assert alone.stats()["head_batches"] == 0
    windows, _ = synth.expected(12, B, T, split)

    def attempt() -> int:
        with synth.loader(B, T, split, positions=positions) as loader:
            got = take(loader, 12)
            stats = loader.stats()
        same(got, want)
        assert all(np.array_equal(np.concatenate([x.numpy().ravel(), y.numpy().ravel()[-1:]]), w)
                   for ((x, y, *_), _), w in zip(got, windows))
        return stats["head_batches"]

    made_here(attempt)  # else the first batch came from the workers


def test_another_rank_and_a_resume_inside_a_document(synth):
    B, T = 2, 50
    with synth.loader(B, T, rank=1, world_size=2, head_start=False) as alone:
        want = take(alone, 10)
    state = want[3][1]  # after batch 3: inside a document
    assert state["position"][4] > 0, "the resume does not start inside a document"

    def attempt(resume, n) -> int:
        with synth.loader(B, T, rank=1, world_size=2, resume_state=resume) as loader:
            same(take(loader, n), want[10 - n:])
            return loader.stats()["head_batches"]

    made_here(lambda: attempt(None, 10))
    made_here(lambda: attempt(state, 6))


def test_a_tokenizer_file_gets_one_and_a_tokenizer_object_none(synth, synth_tokenizer_pkl, posdata):
    def attempt() -> int:
        with shmloader.ShmLoader(str(synth.root), str(synth_tokenizer_pkl), 2, 16, device="cpu", num_workers=2) as a:
            next(a)
            assert a.stats()["head_batches"] <= 1
            return a.stats()["head_batches"]

    made_here(attempt)
    with posdata.loader(2, 16) as b:  # an object with encode(): its definition may be slow
        next(b)
        assert b.stats()["head_batches"] == 0
    with synth.loader(2, 16, packing="bos_bestfit", buffer_size=8, tokenizer_batch_size=4) as c:
        next(c)
        assert c.stats()["head_batches"] == 0


def test_a_batch_that_differs_from_the_workers_is_an_error(synth, monkeypatch):
    from shmloader.packing import headstart

    monkeypatch.setattr(headstart, "batch_check", lambda window: 12345)

    def attempt() -> int:
        with synth.loader(2, 16, num_workers=1) as loader:
            try:
                for _ in range(20):
                    next(loader)
            except shmloader.ShmLoaderError as exc:
                assert "differs from the one the training process made" in str(exc)
                assert loader.stats()["head_batches"] >= 1
                return 1
            assert loader.stats()["head_batches"] == 0, "a batch made here was not compared"
            return 0

    made_here(attempt)


def test_a_bad_row_group_is_the_workers_to_report(synth, tmp_path):
    root = tmp_path / "bad"
    shutil.copytree(synth.root, root)
    first = sorted(root.iterdir())[0]
    helpers.corrupt_row_group(first, 0)
    for head_start in (True, False):
        with shmloader.ShmLoader(str(root), synth.tokenizer, 2, 16, device="cpu", num_workers=2,
                                 head_start=head_start) as loader:
            with pytest.raises(shmloader.DataError, match="row group 0 cannot be read") as info:
                next(loader)
            assert first.name in str(info.value)
    runs = {}
    for head_start in (True, False):
        with shmloader.ShmLoader(str(root), synth.tokenizer, 2, 16, device="cpu", num_workers=2,
                                 on_bad_row_group="skip", head_start=head_start) as loader:
            with pytest.warns(UserWarning, match="row group 0"):
                runs[head_start] = take(loader, 6)
    same(runs[True], runs[False])


def test_the_running_loader_goes_on_once_the_new_ones_first_batch_is_made(synth):
    """nanochat's evaluations: a val loader built while the train loader runs pauses it only
    until its first batch, here the one the training process made."""
    with synth.loader(2, 16) as train:
        next(train)

        def attempt() -> int:
            with synth.loader(2, 16, "val") as val:
                next(val)
                made = val.stats()["head_batches"]
                assert int(train.debug().ring.counters[Counter.YIELD_UNTIL]) == 0, "the train loader still waits"
                next(train)
                for _ in range(5):
                    next(val)
            return made

        for _ in range(3):
            made_here(attempt)


@pytest.mark.parametrize("n", [1, 3, 4])
def test_a_loader_left_within_its_head_start_batches_is_released(synth, n):
    """An evaluation's loader read for `n` <= 4 batches (all made here) and then left: its
    processes exit after `idle_release_s` as a workers-only loader's do (they never did: the
    ring's copies of those batches are freed only when next() comes to the ring, and the
    coordinator counted only frees), and the stream goes on exactly after it."""
    with synth.loader(2, 16, head_start=False) as alone:
        want = take(alone, n + 6)

    def attempt() -> int:
        with synth.loader(2, 16, idle_release_s=0.2) as loader:
            got = take(loader, n)
            made = loader.stats()["head_batches"]  # (state_dict() looks one batch ahead)
            d = loader.debug()
            pids = [d.coordinator.pid, *(p.pid for p in d.workers)]
            del d
            gone = helpers.wait_gone(pids, 10.0) if n >= 3 else None
            got += take(loader, 6)
            releases = loader.stats()["idle_releases"]
        same(got, want)
        if n >= 3:  # 3 batches taken, 2 of them given back: as a workers-only loader's 2 frees
            assert gone == [] and releases == 1, f"{n} batches taken: children alive after 10 s idle: {gone}"
        return made

    made_here(attempt, n)


@pytest.mark.parametrize("where, at", [("delivery", 0), ("delivery", 2), ("precedence", 0)])
def test_a_ctrl_c_while_a_head_start_batch_is_handed_out_loses_nothing(synth, monkeypatch, where, at):
    """A KeyboardInterrupt inside next() after the head start made batch `at` (while it becomes
    the caller's tensors; or, batch 0, while the other loaders are told the first batch is
    made): the next next() returns that batch, and the stream and states are those of an
    uninterrupted run (an adversarial trial's Ctrl-C lost a batch in 7 of 180 first calls)."""
    from shmloader import delivery
    from shmloader.procs import precedence

    with synth.loader(2, 16, head_start=False) as alone:
        want = take(alone, 8)
    owner, name = (delivery.Lending, "made") if where == "delivery" else (type(precedence.PRECEDENCE), "started")
    calls, real = [], getattr(owner, name)

    def interrupted(self, *a):
        calls.append(a)
        if len(calls) == at + 1:
            raise KeyboardInterrupt
        return real(self, *a)

    monkeypatch.setattr(owner, name, interrupted)

    def attempt() -> int:
        calls.clear()
        with synth.loader(2, 16) as loader:
            got = take(loader, at)
            try:
                next(loader)
            except KeyboardInterrupt:
                if int(loader.debug().ring.counters[Counter.TAKEN]):  # from the ring: the race lost (`made_here`)
                    return 0
            else:  # the ring delivered batch `at`: the head start lost its race
                return 0
            got += take(loader, 8 - at)
            made = loader.stats()["head_batches"]
        assert len(calls) >= at + 2, "the interrupt was not where the test puts it"
        same(got, want)
        return made

    made_here(attempt, at + 1)


def test_many_loaders_leave_nothing_behind(synth):
    """With the garbage collector off, as base_train runs: a head start holds no cycle that
    would keep its files open after its loader."""
    import gc

    fds = None
    gc.collect()
    gc.disable()
    try:
        for i in range(6):
            def attempt() -> int:
                with synth.loader(2, 16, "val") as val:
                    for _ in itertools.islice(val, 2):
                        pass
                    return val.stats()["head_batches"]

            made_here(attempt)
            now = len(os.listdir("/proc/self/fd"))
            fds = now if fds is None else fds
            assert now <= fds, f"loader {i}: {now} descriptors open, {fds} after the first"
    finally:
        gc.enable()


def test_nanochats_loop_on_another_rank_after_a_shard_was_added(synth, tmp_path):
    """As nanochat calls it: the drop-in's prefetch-and-save loop; rank 0's saved state given to
    rank 1 of 2 (its own position found exactly), after a shard was added to the data set. The
    batches and the states it yields are the workers' own, head start or not."""
    from shmloader import nanochat

    root = tmp_path / "data"
    shutil.copytree(synth.root, root)
    opts = dict(data=str(root), tokenizer=synth.tokenizer, device="cpu", num_workers=2)
    gen = nanochat.tokenizing_distributed_data_loader_with_state(2, 24, "train", **opts, rank=0, world_size=2)
    saved = [next(gen)[2] for _ in range(7)][-1]
    gen.close()
    shutil.copy(sorted(root.iterdir())[-1], root / "shard_00099.parquet")  # a new last file
    runs = {}

    def run(head_start) -> int:
        with pytest.warns(UserWarning, match="added"):
            gen = nanochat.tokenizing_distributed_data_loader_with_state(
                2, 24, "train", **opts, rank=1, world_size=2, resume_state_dict=saved, head_start=head_start)
        runs[head_start] = [(x.clone(), y.clone(), state) for x, y, state in itertools.islice(gen, 10)]
        made = gen.stats()["head_batches"]
        gen.close()
        return made

    def attempt() -> int:
        made = run(True)
        for k, (a, b) in enumerate(zip(runs[True], runs[False])):
            assert torch_equal(a[0], b[0]) and torch_equal(a[1], b[1]), f"batch {k} differs"
            assert a[2] == b[2], f"the state yielded with batch {k} differs"
        return made

    assert run(False) == 0
    made_here(attempt)


def test_a_file_of_nulls_is_the_workers_to_report(tmp_path, synth_tokenizer):
    """A head start that finds no batch in a whole pass over the files ends (it never reads
    on for ever, before the children even start); the coordinator says what is wrong, as
    without it."""
    from shmloader.demo import corpus

    corpus.write_shards([None] * 40, tmp_path, num_files=2, row_group_size=10)
    for head_start in (True, False):
        with shmloader.ShmLoader(str(tmp_path), synth_tokenizer, 2, 16, device="cpu", num_workers=2,
                                 head_start=head_start, timeout=30) as loader:
            with pytest.raises(shmloader.DataError) as info:
                next(loader)
            assert loader.stats()["head_batches"] == 0
        assert "held no document with text" in str(info.value), str(info.value)
