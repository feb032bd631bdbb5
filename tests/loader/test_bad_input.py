"""Bad input (docs/contract.md §4), through the public API: each case raises a specific
exception in the calling process, naming the file (and the row group where there is one),
quickly, never a hang (a loader `timeout=` turns a hang into the wrong exception, and the
watchdog fails the test after 60 s); afterwards nothing is left running (conftest `no_leaks`).

Bad data the loader's processes find far ahead of the stream (a corrupt row group, an
unreadable file, a bad schema) is raised by the first next() that needs it: the same batch in
every run, with 1 or 3 workers, any ring, with or without the head start, both packings and a
mixture, after the batches of the same files without the problem.

Null documents are skipped and counted, an empty document is exactly [BOS], and with
`on_bad_row_group="skip"` a corrupt row group is skipped with a warning naming the file, the
stream is the oracle's over the data without it, and resume across the skip is exact.
Documents are `helpers.position_documents` read with `IntTokenizer` (BOS = 0), so the
expected stream is built by hand: the concatenation of `[0] + ids` of every non-null row.

(tests/unit/data/test_source.py checks `Reader` and tests/unit/data/test_tokenizers.py
`tokenizer.resolve` on their own; here the same inputs go through `ShmLoader` and its
processes. The coordinator's empty-epoch check on its own: tests/unit/procs/test_bad_input.py.)
"""
import itertools
import json
import os
import re
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import shmloader
from shmloader.demo import corpus
from tests import helpers
from tests.cases import cross
from tests.helpers import loader_children, position_of, shm_segments

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 2, 8
W = B * T + 1
RAISE_S = 15.0  # an error must come within this many seconds of the call (the first includes the start; under the loaders' timeout, 20 s)


def make_loader(data, tokenizer=None, split="train", **kw):
    kw.setdefault("num_workers", 2)
    kw.setdefault("device", "cpu")
    kw.setdefault("timeout", 20)
    return shmloader.ShmLoader(str(data), tokenizer or helpers.IntTokenizer(), kw.pop("B", B),
                               kw.pop("T", T), split, **kw)


def first_error(loader, limit_batches=10_000):
    """next() until it raises; the exception, after checking it came within RAISE_S."""
    started = time.monotonic()
    with loader:
        for k in range(limit_batches):
            try:
                next(loader)
            except Exception as exc:  # noqa: BLE001 - the caller checks the type
                took = time.monotonic() - started
                assert took < RAISE_S, f"the error took {took:.1f} s: {exc}"
                return exc
            assert time.monotonic() - started < RAISE_S, f"no error within {RAISE_S} s ({k + 1} batches)"
    pytest.fail(f"no error in {limit_batches} batches")


def good_shards(root, n_docs=120, num_files=3, rg=10, length=5):
    os.makedirs(root, exist_ok=True)
    docs = helpers.position_documents([length] * n_docs)
    return [str(p) for p in corpus.write_shards(docs, root, num_files=num_files, row_group_size=rg)]


def assert_started_nothing():
    assert loader_children() == [] and shm_segments() == [], "a refused loader started processes"


# ---------------------------------------------------------------- found at the call

def test_missing_data_dir(tmp_path):
    gone = tmp_path / "no_such_dir"
    with pytest.raises(shmloader.DataError, match=re.escape(str(gone))):
        make_loader(gone)
    with pytest.raises(shmloader.DataError, match=re.escape(str(gone))):  # nanochat's call
        shmloader.tokenizing_distributed_data_loader(B, T, "train", device="cpu", data=str(gone),
                                                     tokenizer=helpers.IntTokenizer())
    assert_started_nothing()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0, torch.device("cuda", 1), "default"])
def test_cuda_without_cuda_says_pass_cpu_before_anything_else(tmp_path, device):
    """device="cuda" (ShmLoader's and nanochat's default) on a torch without CUDA: shmloader's
    own DeviceError naming device="cpu", raised first (the data directory here does not even
    exist), not torch's AssertionError from deep inside."""
    gone = str(tmp_path / "no_such_dir")
    kw = {} if device == "default" else {"device": device}
    with pytest.raises(shmloader.DeviceError, match=r"pass device=\"cpu\"") as ei:
        shmloader.ShmLoader(gone, helpers.IntTokenizer(), B, T, **kw)
    assert "cuda" in str(ei.value)
    with pytest.raises(shmloader.DeviceError, match=r"pass device=\"cpu\""):  # nanochat's call
        shmloader.tokenizing_distributed_data_loader(B, T, "train", data=gone, tokenizer=helpers.IntTokenizer())
    assert_started_nothing()


@pytest.mark.parametrize("device", ["mps", "xpu", "hpu", "meta", torch.device("mps"), "xla:0", "gpu", -1, 1.0,
                                    None, True])
def test_a_device_shmloader_cannot_deliver_on_is_refused_when_made(tmp_path, device):
    """Any device but cpu and cuda (an int N is cuda:N) is a DeviceError at the call, naming the
    supported ones, before the data is read or a process started: "mps", "xpu", "hpu" failed at
    the first next() with torch's errors once the children ran, "meta" gave tensors without
    data, and an unknown name or device=0 without CUDA was torch's RuntimeError."""
    good_shards(tmp_path)
    with pytest.raises(shmloader.DeviceError, match=r'"cpu", "cuda", "cuda:N", an int N') as ei:
        make_loader(tmp_path, device=device)
    if isinstance(device, (str, torch.device)) and str(device) not in ("gpu",):
        assert f"device={str(device)!r}" in str(ei.value) and ".to(" in str(ei.value), ei.value
    assert_started_nothing()


def test_an_int_device_is_that_cuda_device(monkeypatch):
    """device=N is cuda:N, as torch on a CUDA machine; an index past the visible devices is a
    DeviceError at the call (here torch's CUDA is stubbed: 2 devices)."""
    from shmloader import delivery

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert delivery.device_of(0) == torch.device("cuda", 0) and delivery.device_of(1) == torch.device("cuda", 1)
    assert delivery.device_of("cuda") == torch.device("cuda", 1)  # the current device, as before
    assert delivery.device_of(torch.device("cuda", 0)) == torch.device("cuda", 0)
    for past in (2, "cuda:2", torch.device("cuda", 5)):
        with pytest.raises(shmloader.DeviceError, match=r"2 CUDA devices are visible \(cuda:0 to cuda:1\)"):
            delivery.device_of(past)
    assert delivery.device_of("cpu") == torch.device("cpu")


def test_dir_without_parquet(tmp_path):
    (tmp_path / "notes.txt").write_text("no shards here")
    (tmp_path / "data.parquet.tmp").write_bytes(b"")
    with pytest.raises(shmloader.DataError, match=re.escape(str(tmp_path))) as info:
        make_loader(tmp_path)
    assert "parquet" in str(info.value)
    assert_started_nothing()


def test_train_split_with_one_file(tmp_path):
    (path,) = good_shards(tmp_path, num_files=1)
    with pytest.raises(shmloader.DataError, match=re.escape(path)) as info:
        make_loader(tmp_path, split="train")
    assert "'train'" in str(info.value) and "2 files" in str(info.value)
    with make_loader(tmp_path, split="val") as loader:  # the same file is a fine val split
        next(loader)
    assert_started_nothing()


def test_missing_tokenizer_path(tmp_path):
    good_shards(tmp_path / "data")
    gone = tmp_path / "tok" / "tokenizer.pkl"
    with pytest.raises(FileNotFoundError, match=re.escape(str(gone))):
        make_loader(tmp_path / "data", tokenizer=str(gone))
    assert_started_nothing()


@pytest.mark.parametrize("content", [b"", b"garbage, not a pickle", b"\x80\x04\x95\xff\xff"],
                         ids=["empty", "text", "cut-pickle"])
def test_corrupt_tokenizer_pkl(tmp_path, content):
    good_shards(tmp_path / "data")
    bad = tmp_path / "tokenizer.pkl"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        make_loader(tmp_path / "data", tokenizer=str(bad))
    assert_started_nothing()


def test_half_a_tokenizer_pkl(tmp_path, synth_tokenizer_pkl):
    good_shards(tmp_path / "data")
    raw = synth_tokenizer_pkl.read_bytes()
    bad = tmp_path / "tokenizer.pkl"
    bad.write_bytes(raw[:len(raw) // 2])
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        make_loader(tmp_path / "data", tokenizer=str(bad))


BAD_ARGS = [("B", dict(B=0)), ("B", dict(B=-2)), ("B", dict(B=2.0)), ("B", dict(B=True)),
            ("T", dict(T=0)), ("T", dict(T="8")), ("split", dict(split="test")),
            ("split", dict(split="TRAIN")), ("num_workers", dict(num_workers=0)),
            ("num_workers", dict(num_workers=-1)), ("num_workers", dict(num_workers="2")),
            ("n_slots", dict(n_slots=1)), ("packing", dict(packing="bestfit")),
            ("timeout", dict(timeout=0)), ("rank", dict(rank=2, world_size=2)),
            ("on_bad_row_group", dict(on_bad_row_group="ignore"))]


@pytest.mark.parametrize("name,kw", BAD_ARGS, ids=[f"{n}={list(k.values())[0]!r}" for n, k in BAD_ARGS])
def test_argument_out_of_range(tmp_path, name, kw):
    good_shards(tmp_path)
    with pytest.raises(ValueError, match=rf"\b{name}\b") as info:
        make_loader(tmp_path, **kw)
    assert not isinstance(info.value, shmloader.DataError)
    assert_started_nothing()


@pytest.mark.parametrize("name,kw", [("B", dict(B=0)), ("T", dict(T=-1)), ("split", dict(split="test"))])
def test_nanochat_call_checks_arguments_at_the_call(tmp_path, name, kw):
    good_shards(tmp_path)
    args = dict(B=B, T=T, split="train")
    args.update(kw)
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        shmloader.tokenizing_distributed_data_loader_with_state(
            args["B"], args["T"], args["split"], device="cpu", data=str(tmp_path),
            tokenizer=helpers.IntTokenizer())
    assert_started_nothing()


def test_nanochat_call_refuses_zero_workers(tmp_path):
    good_shards(tmp_path)
    gen = None
    try:
        with pytest.raises(ValueError, match=r"\bnum_workers\b"):
            gen = shmloader.tokenizing_distributed_data_loader(B, T, "train", device="cpu", data=str(tmp_path),
                                                               tokenizer=helpers.IntTokenizer(),
                                                               num_workers=0)
    finally:
        if gen is not None:
            gen.close()


def test_rank_without_row_groups(tmp_path):
    """Known from the footers, so refused when the loader is made (data/units.py)."""
    good_shards(tmp_path, n_docs=60, num_files=3, rg=10)  # 2 row groups per file
    with pytest.raises(shmloader.DataError) as info:
        make_loader(tmp_path, rank=3, world_size=4)
    assert_started_nothing()
    msg = str(info.value)
    assert "rank 3 of 4" in msg and "row group" in msg and "fewer ranks" in msg, msg
    with make_loader(tmp_path, rank=1, world_size=4) as ok:  # rank 1 has row group 1 of each file
        next(ok)


# ---------------------------------------------------------------- found by the loader's processes

def _no_text(path):
    pq.write_table(pa.table({"content": ["1 2", "3"] * 20}), path, row_group_size=10)
    return ["'text'", "content"]


def _int_text(path):
    pq.write_table(pa.table({"text": list(range(40))}), path, row_group_size=10)
    return ["int64", "string"]


def _invalid_utf8(path):
    good = pa.array([f"{i} {i + 1}".encode() for i in range(40)], pa.binary())
    values = bytearray(good.buffers()[2].to_pybytes())
    values[-1:] = b"\xff"  # the last row of the last row group
    bad = pa.Array.from_buffers(pa.string(), len(good), [None, good.buffers()[1], pa.py_buffer(bytes(values))])
    pq.write_table(pa.table({"text": bad}), path, row_group_size=10)
    return ["UTF-8"]


def _corrupt_row_group(path, rg=1):
    """Overwrite the data pages of row group `rg` (the footer stays valid)."""
    helpers.write_snappy(path, helpers.position_documents([5] * 40), rows=10)
    helpers.corrupt_row_group(path, rg)
    return ["cannot be read"]


# (writer, row group named in the error; None: any, the whole file is bad): the bad file is
# train file 1, reached after file 0
COLUMN_CASES = {"no-text-column": (_no_text, None), "int-text-column": (_int_text, None),
                "invalid-utf8": (_invalid_utf8, 3), "corrupt-row-group": (_corrupt_row_group, 1)}


SCHEMA_CASES = ("no-text-column", "int-text-column")


@pytest.mark.parametrize("case", list(COLUMN_CASES))
def test_bad_column_or_row_group(tmp_path, case):
    write, rg = COLUMN_CASES[case]
    paths = good_shards(tmp_path, n_docs=60, num_files=3, rg=10)
    bad = str(tmp_path / "shard_00001.parquet")
    assert bad in paths
    words = write(bad)
    err = first_error(make_loader(tmp_path))
    assert type(err) is shmloader.DataError, f"{type(err).__name__}: {err}"
    msg = str(err)
    # a wrong schema is found ahead, from the file's footer, by the coordinator's check on a
    # thread of its own, or by a worker that got to the file first (20 documents a file here: a
    # loaded machine's worker can; test_a_bad_schema_far_ahead_is_found_before_a_worker_gets_there);
    # a bad row group when a worker reads it
    who = r"(coordinator|worker \d) \(pid \d+\)" if case in SCHEMA_CASES else r"worker \d \(pid \d+\)"
    assert re.search(who, msg), msg
    named = re.findall(r"row group (\d+)", msg)
    assert bad in msg and named and set(named) == {str(rg) if rg is not None else named[0]}, msg
    assert all(w in msg for w in words), msg


@pytest.mark.parametrize("case", SCHEMA_CASES)
def test_a_bad_schema_far_ahead_is_warned_of_at_once_and_raised_where_the_run_reaches_it(tmp_path, case):
    """The last train file's footer is bad, 2,000 documents (705 batches) ahead of the first
    batch: the coordinator's check ahead names it ("checked ahead") in a warning at once, long
    before the run reads it, and next() raises it at the first batch that needs the file (its
    next token is the file's first), after every batch before it."""
    paths = good_shards(tmp_path, n_docs=6000, num_files=3, rg=100)
    bad = paths[1]  # the last train file (the last file is val)
    words = COLUMN_CASES[case][0](bad)
    reach = (2000 * 6 - 1) // W  # 2,000 documents of [BOS] + 5 tokens in file 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with make_loader(tmp_path, n_slots=2) as loader:
            for k in range(reach):
                next(loader)
                if k == 50:
                    early = [str(w.message) for w in caught]
            with pytest.raises(shmloader.DataError) as info:
                next(loader)
    assert any(bad in w and "row group 0 (checked ahead)" in w and all(x in w for x in words) for w in early), early
    msg = str(info.value)
    assert re.search(r"worker \d \(pid \d+\)", msg) and bad in msg and all(w in msg for w in words), msg


def test_a_workers_error_is_not_lost_when_it_exits_with_orders_unread(tmp_path):
    """A worker that reports an error and exits leaves the coordinator's write orders unread,
    so the coordinator's next read of its pipe fails with ECONNRESET rather than EOF. The
    coordinator must still send the error on before it ends, so that next() raises it and not
    a bare "worker died: exit code 0". The timing lines up in about a quarter of runs, hence six."""
    for i in range(6):
        root = tmp_path / str(i)
        good_shards(root, n_docs=60, num_files=3, rg=10)
        _no_text(str(root / "shard_00001.parquet"))
        err = first_error(make_loader(root))
        assert type(err) is shmloader.DataError, f"run {i}: {type(err).__name__}: {err}"


def _truncated(path):
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[:len(raw) // 2])


def _not_parquet(path):
    open(path, "wb").write(np.random.default_rng(0).bytes(3000))


@pytest.mark.parametrize("which", [0, 1], ids=["first-file", "second-file"])
@pytest.mark.parametrize("damage", [_truncated, _not_parquet], ids=["truncated", "not-parquet"])
def test_unreadable_file(tmp_path, damage, which):
    paths = good_shards(tmp_path, n_docs=90, num_files=3, rg=10)
    damage(paths[which])
    err = first_error(make_loader(tmp_path))
    assert type(err) is shmloader.DataError, f"{type(err).__name__}: {err}"
    msg = str(err)
    assert paths[which] in msg and "not a readable parquet file" in msg, msg


# ---------------------------------------------------------------- bad data ahead: raised where it is needed
#
# The workers, and the coordinator planning the order, read ahead of the stream (a whole ring
# and more); bad data found there is raised by the first next() that needs it, the same batch in
# every run, with any number of workers and ring slots, after every good batch before it. Which
# batch that is comes from the same files without the problem: the first whose position after
# it (its state's) lies in the bad row group or file or past it (concat: its next token; best
# fit: the end of the last chunk its plan took into the buffer).

FAR_LENGTHS = [(i * 5) % 13 for i in range(600)]  # 3 files of 200 rows in row groups of 15; W = 17
FAR_RG = (1, 5)  # (train file, row group) of the bad row group: ~120 batches into the stream
FAR_RUNS = [(1, 2), (3, 32), (1, 32), (3, 2)]  # (workers, ring slots) of the runs over bad data


@pytest.fixture(scope="module")
def fardata(tmp_path_factory) -> dict:
    """The same files three times: "good", "row-group" (row group FAR_RG's pages overwritten: a
    worker finds it) and "file" (train file 1 cut in half: the coordinator cannot read its footer
    when it plans the order)."""
    out = {}
    docs = helpers.position_documents(FAR_LENGTHS)
    for name in ("good", "row-group", "file"):
        root = tmp_path_factory.mktemp(f"far_{name}")
        paths = [str(p) for p in corpus.write_shards(docs, root, num_files=3, row_group_size=15)]
        texts = pq.read_table(paths[1]).column("text").to_pylist()
        helpers.write_snappy(paths[1], texts, 15)  # pages that corrupt_row_group can overwrite
        if name == "row-group":
            helpers.corrupt_row_group(paths[1], FAR_RG[1])
        elif name == "file":
            _truncated(paths[1])
        out[name] = root, paths
    return out


def _window(x, y, packing="concat") -> np.ndarray:
    if packing == "concat":
        return np.concatenate([x.reshape(-1)[:1].numpy(), y.reshape(-1).numpy()])
    return np.concatenate([x.reshape(-1).numpy(), y.reshape(-1).numpy()])


def until_error(loader, packing="concat", limit=2000) -> tuple:
    """(the windows of the batches next() returned, the `DataError` it then raised), checking
    that the next next() raises it again."""
    got = []
    with loader:
        for _ in range(limit):
            try:
                x, y = next(loader)
            except shmloader.DataError as exc:
                with pytest.raises(shmloader.DataError) as again:
                    next(loader)
                assert str(again.value) == str(exc)
                return got, exc
            got.append(_window(x, y, packing))
    pytest.fail(f"no DataError in {limit} batches")


def needs_from(states: list, place: tuple) -> int:
    """The first batch whose state's position `(epoch, file, rg, doc)` is at `place` or past it."""
    return next(k for k, st in enumerate(states) if position_of(st)[:4] >= place)


# default: a row group in concat, a file in best fit; the other two with -m slow
@pytest.mark.parametrize("packing,damage", cross(["concat", "bos_bestfit"], ["row-group", "file"],
                                                 default={"concat-row-group", "bos_bestfit-file"}))
def test_bad_data_far_ahead_is_raised_at_the_batch_that_needs_it(fardata, packing, damage):
    """A corrupt row group (found by the worker that reads it) or an unreadable file (found by the
    coordinator when it reads the file's footer to plan the order) ~120 batches in: every run
    delivers the same batches as the good files up to the first that needs it, then raises the
    error there, naming who found it and where."""
    kw = dict(packing=packing, buffer_size=16, tokenizer_batch_size=4)
    good_root, _ = fardata["good"]
    with make_loader(good_root, num_workers=1, **kw) as loader:
        want, states = _batches(loader, 200, packing)
    place = (1, *FAR_RG, 0) if damage == "row-group" else (1, 1, 0, 0)
    n = needs_from(states, place)
    assert n > 50, n
    root, paths = fardata[damage]
    reached = []
    for workers, n_slots in FAR_RUNS:
        got, err = until_error(make_loader(root, num_workers=workers, n_slots=n_slots, **kw), packing)
        reached.append(len(got))
        for k, w in enumerate(got[:n]):
            assert np.array_equal(w, want[k]), f"{workers} workers: batch {k} differs from the good files'"
        msg = str(err)
        if damage == "row-group":
            where = rf"worker \d \(pid \d+\) on {re.escape(paths[1])}, row group {FAR_RG[1]}\b.*cannot be read"
        else:
            where = rf"coordinator \(pid \d+\): DataError: {re.escape(paths[1])}: not a readable parquet file"
        assert re.search(where, msg), msg
    assert reached == [n] * len(FAR_RUNS), f"raised after {reached} batches; the batch that needs it is {n}"


@pytest.fixture(scope="module")
def tikdata(tmp_path_factory, synth_tokenizer) -> dict:
    """Files a tiktoken tokenizer reads (so that a concat loader gets a head start), in row
    groups of 5 documents: "good", and a copy with row group `rg` of file 0 corrupt for each
    `rg` in (1, 6): in the batches the head start makes, and past them."""
    docs = corpus.synthetic_texts(300, seed=5, mean_words=12)
    out = {}
    for name in ("good", 1, 6):
        root = tmp_path_factory.mktemp(f"tik_{name}")
        paths = [str(p) for p in corpus.write_shards(docs, root, num_files=3, row_group_size=5)]
        if name != "good":
            helpers.corrupt_row_group(paths[0], name)
        out[name] = root, paths
    return out


@pytest.mark.parametrize("rg", [1, 6])
def test_bad_data_ahead_is_raised_at_the_same_batch_with_and_without_the_head_start(tikdata, synth_tokenizer, rg):
    """The training process makes a run's first batches itself while its workers start (the head
    start), reading the same data: its failure on the bad row group, and the workers' on it
    ahead of the stream, are raised at the batch that needs it, as without the head start."""
    def loader(root, **kw):
        return shmloader.ShmLoader(str(root), synth_tokenizer, 2, 16, device="cpu", timeout=20, **kw)

    with loader(tikdata["good"][0], num_workers=1, head_start=False) as good:
        want, states = _batches(good, 60)
    n = needs_from(states, (1, 0, rg, 0))
    assert 0 < n < 60, n
    root, paths = tikdata[rg]
    reached = []
    for head_start, workers in itertools.product((True, False), (1, 3)):
        ld = loader(root, num_workers=workers, head_start=head_start)
        got, err = until_error(ld)
        reached.append(len(got))
        assert (ld.stats()["head_batches"] > 0) == head_start
        assert all(np.array_equal(w, want[k]) for k, w in enumerate(got[:n])), f"head start {head_start}"
        assert paths[0] in str(err) and f"row group {rg} cannot be read" in str(err), str(err)
    assert reached == [n] * 4, f"raised after {reached} batches; the batch that needs it is {n}"


MIX_LENGTHS = {"a": [(i * 5) % 13 for i in range(300)], "b": [(i * 3) % 7 + 2 for i in range(300)]}
MIX_RG = 4  # of source "a"'s file 0: ~50 batches into the mixed stream


@pytest.fixture(scope="module")
def mixfar(tmp_path_factory) -> dict:
    """A mixture of two sources (3 files of 100 rows each, row groups of 15), "good", "row-group"
    with row group MIX_RG of source a's file 0 corrupt, and "file" with source a's train file 1
    cut in half (the coordinator cannot read its footer when it plans a's order)."""
    out = {}
    for name in ("good", "row-group", "file"):
        root = tmp_path_factory.mktemp(f"mixfar_{name}")
        for source, lengths in MIX_LENGTHS.items():
            os.makedirs(root / source)
            docs = helpers.position_documents(lengths)
            paths = [str(p) for p in corpus.write_shards(docs, root / source, num_files=3, row_group_size=15)]
            if source == "a":
                helpers.write_snappy(paths[0], pq.read_table(paths[0]).column("text").to_pylist(), 15)
                if name == "row-group":
                    helpers.corrupt_row_group(paths[0], MIX_RG)
                elif name == "file":
                    _truncated(paths[1])
        out[name] = root
    return out


# default: a row group in concat, a file in best fit; the other two with -m slow
@pytest.mark.parametrize("packing,damage", cross(["concat", "bos_bestfit"], ["row-group", "file"],
                                                 default={"concat-row-group", "bos_bestfit-file"}))
def test_a_mixtures_bad_data_ahead_is_raised_at_the_same_batch(mixfar, packing, damage):
    """The mix needs every source's next document to pick the next one: it stops where source a's
    next document is in the bad row group (found by the worker that reads it) or the unreadable
    file (found by the coordinator when it reads the footer to plan a's order), and the error
    comes after the batches before that, the same batch in every run, and again at every next()
    after it. Concat: the first batch whose state's point has a's next document there (its
    tokens, or the token after it, need that pick); best fit: from the first batch whose plan
    could take a chunk picked there to the first that took one of its documents. (The file's
    error was raised when the coordinator planned that far, 0-8 batches in over 4 runs, and the
    coordinator's exit taken for a death: a next() after it returned a batch, or healed.)"""
    def loader(root, workers, n_slots=8):
        mix = shmloader.Mixture({name: str(root / name) for name in MIX_LENGTHS}, {"a": 0.5, "b": 0.5})
        return shmloader.ShmLoader(mix, helpers.IntTokenizer(), B, T, device="cpu", timeout=20, packing=packing,
                                   buffer_size=16, tokenizer_batch_size=4, num_workers=workers, n_slots=n_slots)

    with loader(mixfar["good"], 1) as good:
        want, states = _batches(good, 150, packing)
    a_next = [tuple(json.loads(st["mixture"]["point"])["sources"]["a"]) for st in states]
    place = (1, 0, MIX_RG, 0) if damage == "row-group" else (1, 1, 0, 0)
    lo = next(k for k, p in enumerate(a_next) if p >= place)
    hi = next(k for k, p in enumerate(a_next) if p > place)
    assert 10 < lo <= hi < 150, (lo, hi)
    reached = []
    for workers, n_slots in FAR_RUNS:
        got, err = until_error(loader(mixfar[damage], workers, n_slots), packing)
        reached.append(len(got))
        assert all(np.array_equal(w, want[k]) for k, w in enumerate(got)), f"{workers} workers"
        if damage == "row-group":
            assert f"row group {MIX_RG} cannot be read" in str(err) and "shard_00000.parquet" in str(err), str(err)
        else:
            assert re.search(r"coordinator \(pid \d+\): DataError: mixture source 'a': .*shard_00001\.parquet: "
                             r"not a readable parquet file", str(err)), str(err)
    assert len(set(reached)) == 1, f"raised after {reached} batches"
    assert (reached[0] == lo) if packing == "concat" else (lo <= reached[0] <= hi), (reached, lo, hi)


# ---------------------------------------------------------------- nulls and empty documents

def stream_of(lengths, skip_rows=()) -> np.ndarray:
    """One epoch of `position_documents(lengths)` as IntTokenizer reads it, without rows in
    `skip_rows`: [0] + the document's positions, for each non-null row."""
    docs = helpers.position_documents(lengths)
    tok = helpers.IntTokenizer()
    parts = [tok.encode(d, prepend=0) for i, d in enumerate(docs) if d is not None and i not in skip_rows]
    return np.array(list(itertools.chain.from_iterable(parts)), dtype=np.int64)


def settled(loader, timeout=15.0) -> dict:
    """stats() once the read-ahead has stopped (the counters stay the same for 0.9 s)."""
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        s = loader.stats()
        seen.append((s["tokens_read"], s["docs_read"], s["nulls"]))
        if len(seen) >= 4 and len(set(seen[-4:])) == 1:
            return s
        time.sleep(0.3)
    pytest.fail("loader counters never settled")


def test_nulls_skipped_and_counted_empty_is_bos(tmp_path):
    # val file: row group 1 all null, a run of empty documents, a null first and last row
    lengths = ([None, 3, 0, 4] + [None] * 6 + [2, 0, 0, 0, 5, None, 1, 0]
               + [(i * 7) % 11 for i in range(40)] + [6, None])
    assert len(lengths) == 4 + 6 + 8 + 40 + 2
    docs = helpers.position_documents(lengths)
    good_shards(tmp_path / "d", num_files=1)
    os.rename(tmp_path / "d" / "shard_00000.parquet", tmp_path / "d" / "a.parquet")
    schema = pa.schema([("text", pa.string())])
    with pq.ParquetWriter(tmp_path / "d" / "b.parquet", schema) as w:  # the val split
        for lo, hi in ((0, 4), (4, 10), (10, 18), (18, 60)):
            w.write_table(pa.table({"text": docs[lo:hi]}, schema=schema))
    epoch = stream_of(lengths)
    n_nulls = lengths.count(None)
    assert n_nulls == 9 and lengths.count(0) >= 6
    # the hand-built stream: an empty document is its BOS alone, nulls leave no trace
    assert epoch[:10].tolist() == [0, 1, 2, 3, 0, 0, 6, 7, 8, 9]
    n = 3 * len(epoch) // W  # three epochs
    stream = np.tile(epoch, 4)
    with make_loader(tmp_path / "d", split="val", num_workers=2, n_slots=2) as loader:
        for k in range(n):
            x, y = next(loader)
            window = np.concatenate([x.reshape(-1)[:1].numpy(), y.reshape(-1).numpy()])
            assert np.array_equal(window, stream[k * W:(k + 1) * W]), f"batch {k} differs"
        s = settled(loader)
    rows = s["docs_read"] + s["nulls"]
    epochs_read, rest = divmod(rows, len(lengths))
    assert epochs_read >= 3, s
    assert s["nulls"] == epochs_read * n_nulls + lengths[:rest].count(None), s
    live = [n for n in lengths if n is not None]
    assert s["docs_read"] == epochs_read * len(live) + sum(n is not None for n in lengths[:rest]), s
    assert s["tokens_read"] == epochs_read * len(epoch) + sum(n + 1 for n in lengths[:rest] if n is not None)


# ---------------------------------------------------------------- on_bad_row_group="skip"

SKIP_LENGTHS = [(i * 5) % 13 for i in range(120)]  # file 0: rows 0-59 (row groups of 15), file 1: 60-119
BAD_RG = 1  # of file 0: rows 15-29


@pytest.fixture(scope="module")
def skipdata(tmp_path_factory):
    root = tmp_path_factory.mktemp("skipdata")
    docs = helpers.position_documents(SKIP_LENGTHS)
    paths = [str(p) for p in corpus.write_shards(docs, root, num_files=3, row_group_size=15)]
    _rewrite_corrupt(paths[0], docs[:40], BAD_RG)
    return root, paths


def _rewrite_corrupt(path: str, docs: list, rg: int, rows: int = 15):
    """Rewrite `path` with `docs` in row groups of `rows` and corrupt row group `rg`."""
    helpers.write_snappy(path, docs, rows)
    helpers.corrupt_row_group(path, rg)


def _skip_epoch(paths) -> np.ndarray:
    """The train epoch without row group BAD_RG of file 0 (file 0 holds rows 0-39, file 1 the
    next part of SKIP_LENGTHS as corpus.write_shards split it)."""
    n0 = pq.ParquetFile(paths[0]).metadata.num_rows
    n1 = pq.ParquetFile(paths[1]).metadata.num_rows
    assert n0 == 40
    lengths = SKIP_LENGTHS[:40] + SKIP_LENGTHS[40:40 + n1]
    docs = helpers.position_documents(SKIP_LENGTHS)
    assert pq.read_table(paths[1]).column("text").to_pylist() == docs[40:40 + n1]
    bad = set(range(15 * BAD_RG, 15 * BAD_RG + 15))
    return stream_of(lengths, skip_rows=bad)


def _batches(loader, n, packing="concat"):
    out, states = [], []
    for _ in range(n):
        x, y = next(loader)
        out.append(_window(x, y, packing))
        states.append(json.loads(json.dumps(loader.state_dict())))
    return out, states


def test_skip_bad_row_group_warns_counts_and_equals_oracle(skipdata):
    root, paths = skipdata
    epoch = _skip_epoch(paths)
    n = 2 * len(epoch) // W + 3  # into the third epoch: the bad row group comes round twice more
    stream = np.tile(epoch, 4)
    with pytest.warns(UserWarning) as caught:
        with make_loader(root, on_bad_row_group="skip", num_workers=2) as loader:
            windows, states = _batches(loader, n)
            s = settled(loader)
    texts = [str(w.message) for w in caught if "skipped a bad row group" in str(w.message)]
    assert len(texts) == 1, f"expected one warning for the one bad row group: {texts}"
    assert paths[0] in texts[0] and f"row group {BAD_RG}" in texts[0], texts[0]
    assert s["bad_row_groups_skipped"] == 1, s
    for k, w in enumerate(windows):
        assert np.array_equal(w, stream[k * W:(k + 1) * W]), f"batch {k} differs from the oracle"
    assert all(st["rg_idx"] != BAD_RG or st["pq_idx"] != 0 for st in states), "a state points into the bad rg"
    err = first_error(make_loader(root))  # the default still raises
    assert type(err) is shmloader.DataError and paths[0] in str(err) and f"row group {BAD_RG}" in str(err), err


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_skip_resume_is_exact_across_the_skip(skipdata, packing):
    root, paths = skipdata
    kw = dict(on_bad_row_group="skip", packing=packing, buffer_size=8, tokenizer_batch_size=4)
    n = 60
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with make_loader(root, num_workers=2, **kw) as loader:
            initial = json.loads(json.dumps(loader.state_dict()))
            windows, states = _batches(loader, n, packing)
    positions = [position_of(st) for st in states]
    # the last state before the stream passes the bad row group (file 0, rg 0 -> rg 2)
    before = max(k for k, p in enumerate(positions) if p[:3] == (1, 0, 0))
    assert positions[before + 1][:3] != (1, 0, 0) and before + 20 < n, positions[:before + 2]
    for k in (-1, before, before // 2):
        state = initial if k < 0 else states[k]
        with pytest.warns(UserWarning, match=re.escape(paths[0])):  # the skip happens again
            with make_loader(root, num_workers=1, resume_state=state, **kw) as resumed:
                got, got_states = _batches(resumed, n - k - 1, packing)
        for i, w in enumerate(got):
            assert np.array_equal(w, windows[k + 1 + i]), f"resumed after batch {k}: batch {k + 1 + i} differs"
        assert [position_of(st) for st in got_states] == positions[k + 1:]


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_sparse_data_is_not_mistaken_for_an_empty_epoch(tmp_path, packing):
    """Rank 1 of 2 sees mostly empty row groups and null rows: its epochs hold one document
    or two, and 3 workers count pieces in any order; the loader runs, it does not declare an
    epoch empty. (The ordering itself is checked deterministically below.)"""
    schema = pa.schema([("text", pa.string())])
    layouts = {"f0": [3, 0, 1, 4, 7], "f1": [2, 0, 5, 1], "f2": [4]}
    for name, sizes in layouts.items():
        with pq.ParquetWriter(tmp_path / f"{name}.parquet", schema) as w:
            for n in sizes:
                docs = [None] if n == 1 else [" ".join(str(i + 1) for i in range(j % 3)) for j in range(n)]
                w.write_table(pa.table({"text": pa.array(docs, pa.string())}, schema=schema),
                              row_group_size=max(n, 1))
    for _ in range(4):
        with shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), 2, 8, device="cpu", rank=1,
                                 world_size=2, num_workers=3, packing=packing, buffer_size=3,
                                 tokenizer_batch_size=2, timeout=30) as loader:
            batches = [x for _, (x, _) in zip(range(20), loader)]
        assert len(batches) == 20


def test_the_skip_warning_comes_before_the_batches_after_it(tmp_path):
    """Batches cross through the ring's header, warnings through a pipe (NOTE [slot handover]):
    a batch announced after the warning is returned only once the warning was raised, also
    while the workers keep ahead and next() never waits. The bad row group lies ~60 batches
    into the stream, so the trainer is taking ready batches when the skip happens."""
    docs = helpers.position_documents([(i * 5) % 13 for i in range(400)])
    paths = [str(p) for p in corpus.write_shards(docs, tmp_path, num_files=2, row_group_size=15)]
    bad = 10  # of file 0: rows 150-164
    _rewrite_corrupt(paths[0], docs[:200], bad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with make_loader(tmp_path, on_bad_row_group="skip", num_workers=1, n_slots=32) as loader:
            next(loader)
            time.sleep(0.5)  # the ring fills
            waited, past = loader.stats()["wait_s"], 0
            while past < 5:
                next(loader)
                warned = [w for w in caught if paths[0] in str(w.message)]
                epoch, pq_idx, rg = position_of(loader.state_dict())[:3]
                if (pq_idx, rg) > (0, bad) or epoch > 1:
                    past += 1
                    assert warned, "a batch past the skipped row group came before its warning"
                time.sleep(0.005)  # a training step: the worker keeps ahead
            assert loader.stats()["wait_s"] == waited, \
                "next() waited for a batch: the warning may have been read while waiting"
