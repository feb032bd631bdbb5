"""`stats()` and `log_every`: every figure checked against arithmetic on the data.

Data: `helpers.position_documents` read with `IntTokenizer` (3 files; nulls at known rows,
some empty documents). Counters are compared once the loader has settled (the trainer stops
consuming; the ring fills; the coordinator stops reading): the pieces read are then a prefix
of the canonical document sequence (epochs repeating), so `tokens_read`, `docs_read` and
`nulls` must equal the totals of some prefix of it, at least as long as what was delivered.
Best fit: `tokens_cropped` equals the scan oracle's (`plan_batch_scan`) over the
batches planned so far, and `cropped_fraction` is cropped / (placed + cropped).
(Importing shmloader configures no logging: tests/unit/test_observability.py.)
"""
import itertools
import logging
import re
import time
import warnings

import numpy as np
import pytest

import shmloader
from shmloader import profiling
from tests.oracle import plan_batch_scan
from shmloader.demo import corpus
from tests import helpers, oracle

B, T = 2, 16
W = B * T + 1
BASE_KEYS = {"batches", "wait_s", "num_workers", "epoch", "tokens_delivered", "docs_delivered"}
RUN_KEYS = {"tokens_read", "docs_read", "nulls", "tokens_per_s", "ring_ready", "ring_slots",
            "workers", "bad_row_groups_skipped", "pieces"}


def _lengths(n=150):
    """Tokens per document (without BOS); None = null row (every 9th), 0 = empty (every 16th)."""
    return [None if i % 9 == 4 else 0 if i % 16 == 7 else (i * 11) % 37 + 1 for i in range(n)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("obs_data")
    paths = corpus.write_shards(helpers.position_documents(_lengths()), root, num_files=3,
                                row_group_size=[12, 7, 19])
    return root, [str(p) for p in paths]


def _sequence(files, skip_rgs=()) -> list:
    """One epoch of the canonical sequence (rank 0 of 1): token count incl. BOS, or None (null)."""
    tok = helpers.IntTokenizer()
    return [None if text is None else 1 + len(tok.encode(text))
            for (_, f, g, _), text in oracle.documents(files, epochs=1) if (f, g) not in skip_rgs]


def _prefix_matching(seq, stats, at_least_tokens) -> int:
    """The length (in documents) of a prefix of the repeated sequence whose tokens, live
    documents and nulls equal the loader's counters; fails if none does."""
    tokens = docs = nulls = 0
    for i, n in enumerate(itertools.cycle(seq)):
        if (tokens, docs, nulls) == (stats["tokens_read"], stats["docs_read"], stats["nulls"]) \
                and tokens >= at_least_tokens:
            return i
        if tokens > stats["tokens_read"]:
            break
        if n is None:
            nulls += 1
        else:
            tokens, docs = tokens + n, docs + 1
    pytest.fail(f"counters {({k: stats[k] for k in ('tokens_read', 'docs_read', 'nulls')})} are not "
                f"the totals of any prefix of the canonical sequence covering {at_least_tokens} tokens")


def _settled(loader, timeout=15.0, still=3) -> dict:
    """stats() once its counters stay the same over `still` reads 0.3 s apart (the readahead
    has stopped: the ring is full and every worker holds its quota of pieces)."""
    deadline = time.monotonic() + timeout
    keys = ("tokens_read", "docs_read", "nulls", "pieces", "tokens_cropped")
    seen = []
    while time.monotonic() < deadline:
        s = loader.stats()
        seen.append(tuple(s.get(k) for k in keys) + (tuple(w["tokens"] for w in s["workers"]),))
        if len(seen) >= still and len(set(seen[-still:])) == 1:
            return s
        time.sleep(0.3)
    pytest.fail("loader counters never settled")


def _loader(data, split="train", **kw):
    root, _ = data
    kw.setdefault("num_workers", 2)
    return shmloader.ShmLoader(str(root), helpers.IntTokenizer(), B, T, split, device="cpu",
                               timeout=60, **kw)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_counters_are_a_prefix_of_the_data(data, num_workers):
    _, paths = data
    seq = _sequence(paths[:-1])
    n_nulls = sum(n is None for n in seq)
    assert n_nulls >= 5 and any(n == 1 for n in seq), "the data should hold nulls and empty documents"
    with _loader(data, num_workers=num_workers, n_slots=3) as loader:
        before = loader.stats()
        assert set(before) >= BASE_KEYS and before["batches"] == 0
        n = sum(n or 0 for n in seq) // W + 2  # past the end of the first epoch
        for _ in itertools.islice(loader, n):
            pass
        s = _settled(loader)
        pids = [p.pid for p in loader.debug().workers]
    assert set(s) >= BASE_KEYS | RUN_KEYS
    assert s["batches"] == n
    _prefix_matching(seq, s, at_least_tokens=n * W)
    assert s["nulls"] >= n_nulls, "a whole epoch was read: every null row was counted"
    assert s["tokens_per_s"] > 0 and s["wait_s"] > 0
    assert s["ring_slots"] == 3 and 0 <= s["ring_ready"] <= 3
    assert s["bad_row_groups_skipped"] == 0 and s["pieces"] > 0
    assert len(s["workers"]) == num_workers
    assert [w["pid"] for w in s["workers"]] == pids
    assert all(w["tokens"] > 0 and w["tokens_per_s"] > 0 for w in s["workers"])
    assert sum(w["tokens"] for w in s["workers"]) == s["tokens_read"]


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_delivered_counts_what_the_batches_hold_and_read_counts_the_read_ahead(data, packing):
    """`tokens_delivered` / `docs_delivered` are what the returned batches hold (IntTokenizer:
    BOS is the only 0, and every document in a batch starts with its BOS: concat's windows
    are disjoint, best fit places document prefixes); `tokens_read` / `docs_read` run ahead.
    Across a load_state_dict (a new run of the children) the delivered counts carry on."""
    kw = dict(packing="bos_bestfit", buffer_size=5, tokenizer_batch_size=3) if packing == "bos_bestfit" else {}
    with _loader(data, **kw) as loader:
        bos = 0
        for i, (x, y) in enumerate(itertools.islice(loader, 30)):
            if packing == "concat":  # the window: the inputs, then the last target
                held = np.concatenate([x.numpy().reshape(-1), y.numpy().reshape(-1)[-1:]])
            else:  # the (B, T+1) rows
                held = np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1)
            bos += int((held == 0).sum())
            if i == 14:
                loader.load_state_dict(loader.state_dict())  # same stream, new children
        s = _settled(loader)
    assert s["batches"] == 30 and s["tokens_delivered"] == 30 * B * T
    assert s["docs_delivered"] == bos > 30, (s["docs_delivered"], bos)
    assert s["docs_read"] > s["docs_delivered"] - 15 and s["tokens_read"] > 0


def test_ring_ready_fills_when_the_trainer_pauses(data):
    with _loader(data, n_slots=4) as loader:
        next(loader)  # dropped at once, but its slot is freed by the next next()
        deadline = time.monotonic() + 10
        while loader.stats()["ring_ready"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        assert loader.stats()["ring_ready"] == 3, "every other slot should be ready after a pause"
        assert loader.stats()["ring_slots"] == 4
        waited = loader.stats()["wait_s"]
        next(loader)  # ready: no wait added
        assert loader.stats()["wait_s"] == waited


def test_epoch_advances_when_the_val_split_wraps(data):
    _, paths = data
    epoch_tokens = sum(n or 0 for n in _sequence(paths[-1:]))
    with _loader(data, split="val", n_slots=2, num_workers=1) as loader:
        next(loader)
        assert loader.state_dict()["epoch"] == 1 and loader.stats()["epoch"] >= 1
        epochs = []
        for k in range(2, 3 * epoch_tokens // W + 2):
            next(loader)
            epochs.append((k * W, loader.state_dict()["epoch"], loader.stats()["epoch"]))
    assert epochs[-1][1] >= 3, "the run should wrap the val split at least twice"
    for delivered, state_epoch, stats_epoch in epochs:
        assert state_epoch == delivered // epoch_tokens + 1
        # stats() may report the epoch of a batch already announced, at most n_slots ahead
        assert state_epoch <= stats_epoch <= (delivered + 2 * W) // epoch_tokens + 1


def _chunks(files, chunk_docs):
    """nanochat's tokenizer batches: up to chunk_docs consecutive rows of one row group."""
    tok = helpers.IntTokenizer()
    key, rows = None, []
    for (e, f, g, _), text in oracle.documents(files):
        if rows and ((e, f, g) != key or len(rows) == chunk_docs):
            yield rows
            rows = []
        key = (e, f, g)
        rows.append(None if text is None else 1 + len(tok.encode(text)))
    yield rows


def _oracle_cropped(files, n_batches, buffer_size, chunk_docs) -> list:
    """Cumulative cropped tokens after each of the first n_batches best-fit batches."""
    chunks, next_id = _chunks(files, chunk_docs), itertools.count()

    def next_chunk():
        lengths = [n for n in next(chunks) if n is not None]
        return np.array([next(next_id) for _ in lengths], dtype=np.int64), np.array(lengths, dtype=np.int64)

    buffer, total, out = [], 0, []
    for _ in range(n_batches):
        total += plan_batch_scan(buffer, next_chunk, B, T + 1, buffer_size).n_cropped
        out.append(total)
    return out


def test_bestfit_cropped_fraction_matches_oracle(data):
    _, paths = data
    n, slots = 6, 3
    with _loader(data, packing="bos_bestfit", buffer_size=8, tokenizer_batch_size=4, n_slots=slots) as loader:
        for _ in itertools.islice(loader, n):
            pass
        s = _settled(loader)
    cumulative = _oracle_cropped(paths[:-1], n + slots, 8, 4)
    assert cumulative[n - 1] > 0, "the data should make best fit crop"
    assert 0 < s["cropped_fraction"] < 1
    # the coordinator has planned between n (delivered) and n + slots batches
    placed = B * (T + 1)
    fits = [k for k in range(n, n + slots + 1)
            if s["tokens_cropped"] == cumulative[k - 1]
            and s["cropped_fraction"] == pytest.approx(cumulative[k - 1] / (cumulative[k - 1] + k * placed))]
    assert fits, (f"tokens_cropped {s['tokens_cropped']} / fraction {s['cropped_fraction']} match no "
                  f"oracle prefix: {[(k, cumulative[k - 1]) for k in range(n, n + slots + 1)]}")


def test_concat_has_no_cropped_fraction(data):
    with _loader(data) as loader:
        next(loader)
        assert "cropped_fraction" not in loader.stats()


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_bad_row_groups_skipped_counts_each_once(tmp_path, packing):
    lengths = _lengths(90)
    paths = [str(p) for p in corpus.write_shards(helpers.position_documents(lengths), tmp_path,
                                                num_files=2, row_group_size=[12, 7, 19])]
    seq = _sequence(paths[:1], skip_rgs={(0, 1)})
    helpers.corrupt_row_group(paths[0], 1)
    epoch_tokens = sum(n or 0 for n in seq)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), B, T, "train", device="cpu",
                                 num_workers=1, n_slots=2, on_bad_row_group="skip", timeout=60,
                                 packing=packing, buffer_size=8, tokenizer_batch_size=4) as loader:
            n = 2 * epoch_tokens // W + 1  # into the second epoch: the bad row group comes round again
            for _ in itertools.islice(loader, n):
                pass
            s = _settled(loader)
    assert s["bad_row_groups_skipped"] == 1
    _prefix_matching(seq, s, at_least_tokens=n * W)
    assert any("row group 1" in str(w.message) for w in caught), [str(w.message) for w in caught]


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_log_every_logs_one_line_per_n_batches(data, caplog, packing):
    caplog.set_level(logging.INFO, logger="shmloader")
    with _loader(data, packing=packing, log_every=3, buffer_size=8, tokenizer_batch_size=4) as loader:
        for _ in itertools.islice(loader, 7):
            pass
    records = [r for r in caplog.records if r.name == "shmloader"]
    assert [r.levelno for r in records] == [logging.INFO] * 3
    start, *messages = [r.getMessage() for r in records]
    assert start.startswith("batch 1: shmloader start-up: the first batch came "), start
    assert messages[0].startswith("batch 3:") and messages[1].startswith("batch 6:"), messages
    assert all("tokens/s" in m for m in messages)
    assert all(("cropped" in m) == (packing == "bos_bestfit") for m in messages)


def test_log_every_zero_logs_nothing(data, caplog):
    caplog.set_level(logging.DEBUG, logger="shmloader")
    with _loader(data) as loader:
        for _ in itertools.islice(loader, 5):
            pass
    assert [r for r in caplog.records if r.name.startswith("shmloader")] == []


# ---- what the trainer saw lately (observe.py): the wait share, the ring's fill, the profiler ----

def test_a_consumer_faster_than_its_worker_waits_most_of_the_time(data):
    """One slow worker (5 ms a document), no step between batches: next() blocks for most of the wall time."""
    root, _ = data
    with shmloader.ShmLoader(str(root), helpers.SlowTokenizer(0.005), B, T, "train", device="cpu",
                             num_workers=1, n_slots=2, timeout=60) as loader:
        next(loader)
        loader.stats()  # the interval starts after start-up
        for _ in itertools.islice(loader, 20):
            pass
        s = loader.stats()
    assert s["batches"] == 21 and s["interval_s"] > 0
    assert s["wait_share"] >= 0.5, s
    assert s["delivered_tokens_per_s"] == pytest.approx(20 * B * T / s["interval_s"])
    assert 0 <= s["last_wait_s"] <= s["wait_s"]
    assert len(s["workers"]) == 1 and 0 <= s["workers"][0]["busy_share"] <= 1


def test_a_slow_consumer_waits_little_and_finds_the_ring_full(data):
    """A consumer slower than the workers (each step begins once the ring has refilled: waited
    for, not a fixed sleep, which a loaded machine's workers overran) finds every batch ready:
    next() does not wait, and the ring shows the batches ready less the one the caller holds."""
    with _loader(data, n_slots=4) as loader:
        next(loader)
        ready, waits = [], []
        for _ in range(15):
            deadline = time.monotonic() + 30  # a hang guard: the workers refill 3 slots in ms
            while loader.stats()["ready"] < 3:
                assert time.monotonic() < deadline, "the ring did not refill in 30 s"
                time.sleep(0.01)
            next(loader)
            s = loader.stats()
            ready.append(s["ready"])
            waits.append(s["last_wait_s"])
    assert s["ring_slots"] == 4 and s["wait_share"] <= 0.02, s
    assert waits == [0.0] * 15, waits
    assert min(ready) >= s["ring_slots"] - 2 and max(ready) <= s["ring_slots"] - 1, ready  # the caller holds one


def test_log_every_line_names_the_interval_figures(data, caplog):
    caplog.set_level(logging.INFO, logger="shmloader")
    with _loader(data, log_every=4) as loader:
        for _ in itertools.islice(loader, 8):
            pass
        caller = loader.stats()
    lines = [r.getMessage() for r in caplog.records if r.name == "shmloader" and "shmloader interval" in r.getMessage()]
    assert len(lines) == 2, lines
    for line in lines:
        assert "shmloader interval" in line and "tokens/s delivered" in line, line
        assert re.search(r"wait share \d+\.\d%", line) and re.search(r"ring \d/8 ready", line), line
        assert re.search(r"busiest worker \d \d+% busy, idlest worker \d \d+%", line), line
        # each worker's engine (an IntTokenizer's), "-" for one that has not finished a run of documents yet
        assert re.search(r", engines (object|-) \| (object|-); loader \d+-\d+ \(train\)$", line), line
    assert "engines object" in lines[-1] or "| object" in lines[-1], lines[-1]
    # the log keeps its own interval: the caller's first stats() still runs from the loader's start
    assert caller["interval_s"] > float(re.search(r"interval ([\d.]+) s", lines[1]).group(1)) - 0.05


def test_the_start_up_is_reported_once_and_apart_from_the_intervals(data, caplog):
    """The first interval line covers batches 2 to 4, not the processes' start: its interval is
    at most the wall time since the loader was made less the start-up the first line reports."""
    caplog.set_level(logging.INFO, logger="shmloader")
    made = time.monotonic()
    with _loader(data, log_every=4) as loader:
        for _ in itertools.islice(loader, 4):
            pass
        wall = time.monotonic() - made
    lines = [r.getMessage() for r in caplog.records if r.name == "shmloader"]
    assert len(lines) == 2 and "shmloader interval" in lines[1], lines
    m = re.fullmatch(r"batch 1: shmloader start-up: the first batch came ([\d.]+) s after the loader was made "
                     r"\(([\d.]+) s of it waited in next\(\)\), 2 workers; the interval lines count from here; "
                     r"loader \d+-\d+ \(train\)", lines[0])
    assert m, lines[0]
    start_up, waited = float(m[1]), float(m[2])
    assert 0 < waited <= start_up + 0.01 and start_up <= wall + 0.005  # printed to 0.01 s
    interval = float(re.search(r"interval ([\d.]+) s", lines[1]).group(1))
    assert interval <= wall - start_up + 0.05, (interval, wall, start_up)


def test_next_is_a_range_in_a_torch_profiler_trace(data):
    torch = pytest.importorskip("torch")
    with _loader(data) as loader:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in itertools.islice(loader, 5):  # the first waits for the start
                pass
        names = [e.name for e in prof.events()]
    assert names.count("shmloader.next") == 5 and "shmloader.wait" in names, sorted(set(names))
    nexts = [e for e in prof.events() if e.name == "shmloader.next"]
    waits = [e for e in prof.events() if e.name == "shmloader.wait"]
    assert all(any(n.time_range.start <= w.time_range.start and w.time_range.end <= n.time_range.end
                   for n in nexts) for w in waits), "a wait lies inside a next()"
    assert not profiling.active()  # no profiler now: next() enters no range


@pytest.mark.parametrize("with_state", [True, False])
def test_a_nanochat_dropin_generator_answers_stats(data, with_state):
    root, _ = data
    make = (shmloader.tokenizing_distributed_data_loader_with_state if with_state
            else shmloader.tokenizing_distributed_data_loader)
    gen = make(B, T, "train", 2, device="cpu", data=str(root), tokenizer=helpers.IntTokenizer(), timeout=60)
    assert isinstance(gen.loader, shmloader.ShmLoader)
    for item in itertools.islice(gen, 6):
        assert len(item) == (3 if with_state else 2)
    assert len(next(gen)) == (3 if with_state else 2)
    s = gen.stats()
    assert s["batches"] == 7 and s["wait_share"] > 0 and s["ring_slots"] == 8
    gen.close()
    assert gen.loader._closed
    with pytest.raises(StopIteration):
        next(gen)
