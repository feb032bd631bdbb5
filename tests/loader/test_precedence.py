"""A loader that starts while another of the same training process runs has the cores until its
first batch (procs/precedence.py): nanochat's pattern, a val loader built at every evaluation
while the train loader runs. As the client sees it: the running loader's workers tokenize
nothing while the new one starts, go on once its first batch is taken (or it failed), are
never taken for stalled meanwhile, and both streams are the ones each loader yields alone."""
import itertools
import threading
import time

import numpy as np
import pytest

from shmloader import errors
from shmloader.ipc.ring import Counter, WorkerCol
from shmloader.procs import precedence
from tests import helpers
from tests.helpers import SlowTokenizer, SpinTokenizer

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 2, 16


def word(loader) -> int:
    return int(loader.debug().ring.counters[Counter.YIELD_UNTIL])


def tokens_made(loader) -> int:
    return int(loader.debug().ring.workers[:, WorkerCol.TOKENS].sum())


def windows(loader, n) -> list:
    """`n` batches, inputs then targets, copied (best fit's rows do not overlap as concat's do)."""
    return [np.concatenate([x.numpy().ravel(), y.numpy().ravel()]) for x, y in itertools.islice(loader, n)]


def loader(ds, tokenizer, split="train", **kw):
    import shmloader

    return shmloader.ShmLoader(str(ds.root), tokenizer, B, T, split, device="cpu", num_workers=2, **kw)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_starting_loader_pauses_the_running_one_until_its_first_batch(posdata, packing):
    opts = {"concat": {}, "bos_bestfit": {"buffer_size": 8, "tokenizer_batch_size": 4}}[packing]
    with posdata.loader(B, T, packing=packing, **opts) as alone:
        want_train = windows(alone, 30)
    with posdata.loader(B, T, "val", packing=packing, **opts) as alone:
        want_val = windows(alone, 3)
    # the train loader's workers spend CPU on every document (so their CPU time shows whether
    # they tokenize); the val loader's first piece takes ~1 s of sleeps (30 ms a document)
    with loader(posdata, SpinTokenizer(0.002), packing=packing, **opts) as train, \
            loader(posdata, SlowTokenizer(0.03), "val", packing=packing, **opts) as val:
        got_train = windows(train, 1)
        assert word(train) == 0, "a loader alone gives way to nobody"
        ring, pids = train.debug().ring, [p.pid for p in train.debug().workers]
        seen, done = [], threading.Event()

        def watch():  # what the train loader's ring and workers do while the val loader starts
            while not done.is_set():
                seen.append((int(ring.counters[Counter.YIELD_UNTIL]), precedence.now_us(), time.monotonic(),
                             sum(helpers.cpu_seconds(p) for p in pids),
                             any(int(r) >= 0 for r in ring.workers[:, WorkerCol.PIECE])))
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            got_val = windows(val, 1)
        finally:
            done.set()
            watcher.join()
        paused = [s for s in seen if s[0]]
        assert paused, "the train loader's workers were never asked to give way"
        assert all(now < w <= now + precedence.YIELD_S * 1e6 for w, now, *_ in paused)
        # a worker gives way between runs of documents: past the runs in progress (a whole piece
        # here, <= 64 documents of 2 ms), it holds its next piece (PIECE set) and spends no CPU
        later = [s for s in paused if s[2] >= paused[0][2] + 0.3]
        assert len(later) >= 20, f"the pause lasted {paused[-1][2] - paused[0][2]:.2f} s only"
        assert later[0][4], "no train worker held a piece while it gave way: the test shows nothing"
        wall, cpu = later[-1][2] - later[0][2], later[-1][3] - later[0][3]
        assert cpu < 0.25 * wall, f"the train loader's workers used {cpu:.2f} s of CPU in {wall:.2f} s of pause"
        assert word(train) == 0, "the pause outlived the val loader's first batch"
        got_val += windows(val, 2)
        got_train += windows(train, 29)
    for got, want, name in ((got_train, want_train, "train"), (got_val, want_val, "val")):
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert np.array_equal(g, w), f"{name} batch {i} differs from the loader's alone"


def test_giving_way_is_not_a_stall_and_ends_at_its_deadline(posdata):
    """A trainer that waits on a paused loader (another thread started one) gets its batch once
    the pause ends, without a heal, with a stall limit shorter than the pause."""
    with loader(posdata, SlowTokenizer(0.002), stall_s=1.5, n_slots=4) as paused:
        next(paused)
        ring = paused.debug().ring
        deadline = precedence.now_us() + 3_000_000
        ring.counters[Counter.YIELD_UNTIL] = deadline  # as a start would
        time.sleep(0.3)  # a run in progress ends, then they give way
        made = tokens_made(paused)
        time.sleep(0.5)
        assert tokens_made(paused) == made, "workers tokenized while asked to give way"
        while tokens_made(paused) == made:  # past what the ring and the workers held: waits for the pause's end
            next(paused)
            assert precedence.now_us() < deadline + 5_000_000, "workers still gave way 5 s after the deadline"
        assert precedence.now_us() >= deadline, "workers went on before the deadline"
        assert paused.stats()["heals"] == 0, "a worker giving way was taken for stalled"


def test_a_starting_loader_that_fails_lets_the_running_one_go_on(posdata, tmp_path):
    paths = helpers.position_shards(tmp_path / "bad", [5] * 60, num_files=3, rg=10)
    helpers.corrupt_row_group(paths[0], 0)
    import shmloader

    with posdata.loader(B, T) as train:
        windows(train, 1)
        with shmloader.ShmLoader(str(tmp_path / "bad"), posdata.tokenizer, B, T, device="cpu",
                                 num_workers=2) as bad:
            with pytest.raises(errors.DataError, match="row group 0 cannot be read"):
                next(bad)
            assert word(train) == 0, "a first batch that failed left the running loader paused"
        assert len(windows(train, 20)) == 20


def test_a_ctrl_c_as_the_first_batch_ends_the_start_loses_no_batch(posdata, monkeypatch):
    """A Ctrl-C inside the first `next()` after its batch was taken from the ring (while the other
    loaders are told to go on: `PRECEDENCE.started`): the next `next()` returns that batch, not
    the one after it (the head start off, so that the first batch comes from the ring)."""
    import shmloader

    def batches(interrupt: bool):
        with shmloader.ShmLoader(str(posdata.root), posdata.tokenizer, 2, 32, num_workers=2, device="cpu",
                                 head_start=False) as loader:
            if interrupt:
                real, calls = precedence.PRECEDENCE.started, []

                def interrupted(children):
                    if not calls:
                        calls.append(children)
                        raise KeyboardInterrupt
                    return real(children)

                monkeypatch.setattr(precedence.PRECEDENCE, "started", interrupted)
                with pytest.raises(KeyboardInterrupt):
                    next(loader)
                monkeypatch.undo()
                assert calls, "the interrupt never happened: vacuous"
            return [x.numpy().copy() for x, _ in itertools.islice(loader, 3)]

    want, got = batches(False), batches(True)
    assert all(np.array_equal(w, g) for w, g in zip(want, got)) and len(got) == 3
