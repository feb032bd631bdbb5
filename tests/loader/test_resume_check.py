"""A resume that checks itself (docs/contract.md §3): a state carries the check of the batch it
resumes at, and the resumed loader compares its first batch with it. Data changed where the
files' names, sizes and parquet footers cannot show it (text rewritten in place, byte for byte
as long, uncompressed and without statistics, so that even the footer is the same) is a
ValueError at the first batch, naming the batch, for both packings and for token = position
data as for ordinary text through a BPE tokenizer; unchanged data resumes with the check
passing, whatever the number of workers, and the states stay the same in every run."""
import itertools
import json
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shmloader
from shmloader import nanochat
from shmloader.data import source
from tests import helpers
from tests.helpers import window_of

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 2, 16
PACKINGS = ("concat", "bos_bestfit")


def plain_shards(root, docs, num_files=3, rg=8) -> list[str]:
    """`docs` as `num_files` parquet files of row groups of `rg`, stored plainly (no compression,
    no dictionary, no statistics): a file's bytes then depend on its texts' lengths only, apart
    from the text itself, so text of the same lengths gives a file of the same size and footer."""
    root.mkdir(parents=True, exist_ok=True)
    per = -(-len(docs) // num_files)
    paths = []
    for i in range(num_files):
        path = str(root / f"shard_{i:05d}.parquet")
        pq.write_table(pa.table({"text": pa.array(docs[i * per:(i + 1) * per], pa.string())}), path,
                       row_group_size=rg, compression="none", use_dictionary=False, write_statistics=False)
        paths.append(path)
    return paths


def rewrite_in_place(path: str, change):
    """Rewrite `path` with each text replaced by `change(text)` (of the same length), plainly:
    same name, same size, same footer; only the text differs."""
    texts = pq.read_table(path).column("text").to_pylist()
    changed = [t if t is None else change(t) for t in texts]
    assert [None if t is None else len(t) for t in changed] == [None if t is None else len(t) for t in texts]
    assert changed != texts
    before = source.footer_digests([path])
    rows = pq.ParquetFile(path).metadata.row_group(0).num_rows
    pq.write_table(pa.table({"text": pa.array(changed, pa.string())}), path, row_group_size=rows,
                   compression="none", use_dictionary=False, write_statistics=False)
    assert source.footer_digests([path]) == before, "the footer changed: the file check would see it"


def shift_digits(text: str) -> str:
    """Every digit d as d+1 (9 as 1): numbers of the same width, other tokens."""
    return text.translate(str.maketrans("0123456789", "1234567891"))


def rotate_letters(text: str) -> str:
    return "".join(chr((ord(c) - 97 + 1) % 26 + 97) if "a" <= c <= "z" else c for c in text)


def int_loader(data, packing, **kw):
    kw.setdefault("num_workers", 2)
    return shmloader.ShmLoader(str(data), helpers.IntTokenizer(), B, T, packing=packing, device="cpu",
                               timeout=30, buffer_size=12, **kw)


def take(loader, n) -> list:
    """The batches' tokens: concat's window, best fit's (B, T+1) rows."""
    if loader.packing == "concat":
        return [window_of(x, y) for x, y in itertools.islice(loader, n)]
    return [np.concatenate([x.numpy(), y[:, -1:].numpy()], axis=1) for x, y in itertools.islice(loader, n)]


@pytest.fixture(scope="module")
def position_docs():
    return helpers.position_documents(helpers.position_lengths(seed=5, n=240, files=3))


def test_the_check_names_a_nested_file_as_the_state_does(tmp_path, position_docs):
    """Where two directories hold files of one name (FineWeb's dumps), the mismatch names the
    file by its path below the data's root, as the state does, not by a basename two files share."""
    half = len(position_docs) // 2
    a = plain_shards(tmp_path / "dump-a", position_docs[:half], num_files=2)
    plain_shards(tmp_path / "dump-b", position_docs[half:], num_files=2)
    data = tmp_path / "*" / "*.parquet"
    with int_loader(data, "concat") as ld:
        take(ld, 3)
        state = json.loads(json.dumps(ld.state_dict()))
    assert [f[0] for f in state["files"]][:1] == ["dump-a/shard_00000.parquet"], state["files"]
    rewrite_in_place(a[0], shift_digits)
    with int_loader(data, "concat", resume_state=state) as resumed:
        with pytest.raises(ValueError, match=r"resume check: the batch this loader resumed at, batch 3 "
                                             r"\(epoch 1, dump-a/shard_00000.parquet, row group"):
            next(resumed)


@pytest.mark.parametrize("packing", PACKINGS)
def test_a_file_rewritten_with_the_same_footer_is_caught_at_the_first_batch(tmp_path, position_docs, packing):
    paths = plain_shards(tmp_path, position_docs)
    with int_loader(tmp_path, packing) as ld:
        take(ld, 9)
        state = json.loads(json.dumps(ld.state_dict()))
    assert state["pq_idx"] == 0 and len(state["check"]) == 8, state
    rewrite_in_place(paths[0], shift_digits)  # the file the resumed batch reads, footer and all alike
    resumed = int_loader(tmp_path, packing, resume_state=state)  # the file check passes: it cannot see it
    with pytest.raises(ValueError, match=r"resume check: the batch this loader resumed at, batch 9 "
                                         r"\(epoch 1, shard_00000.parquet, row group \d+, row \d+.*"
                                         r"is not the one the state was saved before"):
        next(resumed)
    with pytest.raises(shmloader.LoaderClosed):
        next(resumed)


def test_a_rewritten_file_is_caught_with_a_bpe_tokenizer_too(tmp_path, enc):
    """Ordinary text through a trained BPE tokenizer, best fit: the rewritten text tokenizes
    into other tokens and other counts; the check sees it."""
    docs = [" ".join(["the loader reads shards"] * (1 + i % 7)) + f" doc{i}" for i in range(120)]
    paths = plain_shards(tmp_path, docs)
    kw = dict(packing="bos_bestfit", device="cpu", num_workers=2, timeout=30, buffer_size=16)
    with shmloader.ShmLoader(str(tmp_path), enc, 4, 32, **kw) as ld:
        take(ld, 3)
        state = ld.state_dict()
    rewrite_in_place(paths[0], rotate_letters)
    with shmloader.ShmLoader(str(tmp_path), enc, 4, 32, resume_state=state, **kw) as ld:
        with pytest.raises(ValueError, match="resume check"):
            next(ld)


@pytest.mark.parametrize("packing", PACKINGS)
def test_unchanged_data_resumes_with_the_check_passing(tmp_path, position_docs, packing):
    """The check holds at every resume point, with another number of workers, and the states
    of the resumed run are the uninterrupted run's (check included)."""
    plain_shards(tmp_path, position_docs)
    with int_loader(tmp_path, packing, num_workers=2) as ld:
        initial = ld.state_dict()
        windows, states = [], []
        for _ in range(30):
            windows += take(ld, 1)
            states.append(ld.state_dict())
    assert initial["check"] is None  # before the first batch: nothing to know it from
    assert all(len(s["check"]) == 8 for s in states)
    assert len({s["check"] for s in states}) > 25  # the batches' own checks, not one value
    for k in (0, 6, 17, 28):
        with int_loader(tmp_path, packing, num_workers=3, resume_state=states[k]) as ld:
            assert ld.state_dict() == states[k]  # before its first batch: the state it was given
            got = take(ld, 30 - k - 1)
            assert ld.state_dict() == states[-1]
        assert all(np.array_equal(a, b) for a, b in zip(got, windows[k + 1:]))


def test_a_state_taken_before_the_next_batch_is_made_waits_for_it(tmp_path, position_docs):
    """A worker slower than the trainer (2 ms a document) and a ring of 2 slots: when
    state_dict() asks, the batch the state resumes at is mostly not made yet, so it waits
    for it; the states and the stream are those of a fast run."""
    plain_shards(tmp_path, position_docs)
    with int_loader(tmp_path, "concat") as ld:
        want, want_states = [], []
        for x, y in itertools.islice(ld, 12):
            want.append(window_of(x, y))
            want_states.append(ld.state_dict())
    slow = shmloader.ShmLoader(str(tmp_path), helpers.SlowTokenizer(0.002), B, T, device="cpu", timeout=30,
                               num_workers=1, n_slots=2)
    got, states, waits = [], [], []
    with slow:
        for x, y in itertools.islice(slow, 12):
            got.append(window_of(x, y))
            del x, y  # its slot goes back: the next batch can be made only now
            t0 = time.perf_counter()
            states.append(slow.state_dict())
            waits.append(time.perf_counter() - t0)
    drop = lambda s: {k: v for k, v in s.items() if k != "config"}  # noqa: E731 (another tokenizer's name)
    assert all(np.array_equal(a, b) for a, b in zip(got, want)) and list(map(drop, states)) == list(map(drop, want_states))
    assert max(waits) > 0.005, f"state_dict() never waited for a batch: {waits}"


def test_another_shape_resumes_without_a_check(tmp_path, position_docs):
    """With another T the batch at the position is another one: it is not compared, and the
    state holds no check until a batch of the new shape was made (another rank's state, which
    names rank 0's batch, is tests/unit/test_state.py's)."""
    plain_shards(tmp_path, position_docs)
    with int_loader(tmp_path, "concat") as ld:
        take(ld, 5)
        state = ld.state_dict()
    with pytest.warns(UserWarning, match="another batch shape"):
        other = shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), B, T + 3, device="cpu", timeout=30,
                                    num_workers=2, resume_state=state)
    with other:
        assert other.state_dict()["check"] is None
        next(other)
        assert len(other.state_dict()["check"]) == 8


def test_state_dict_waits_for_another_threads_next(tmp_path, position_docs):
    """state_dict() from a second thread while the first is inside next() is served after it
    (one at a time), and gives the state after the batch that next() returned."""
    plain_shards(tmp_path, position_docs)
    with int_loader(tmp_path, "concat") as ref:
        take(ref, 4)
        want = ref.state_dict()
    with int_loader(tmp_path, "concat") as ld:
        take(ld, 3)
        got = {}
        with ld._lock:  # the first thread is inside next()
            t = threading.Thread(target=lambda: got.setdefault("state", ld.state_dict()))
            t.start()
            t.join(0.3)
            assert t.is_alive(), "state_dict() did not wait for next()"
            ld._next()
        t.join(10)
    assert got["state"] == want


def test_the_nanochat_drop_in_yields_checked_states(tmp_path, position_docs):
    """nanochat's loop: the state yielded with each batch resumes at that batch, and carries
    that batch's check; resuming from it passes the check and yields that batch again."""
    plain_shards(tmp_path, position_docs)
    opts = dict(data=str(tmp_path), device="cpu", num_workers=2, tokenizer=helpers.IntTokenizer(), timeout=30)
    gen = nanochat.tokenizing_distributed_data_loader_with_state(B, T, "train", **opts)
    got = [(window_of(x, y), s) for (x, y, s) in itertools.islice(gen, 8)]
    gen.close()
    window, state = got[5]
    assert len(state["check"]) == 8
    again = nanochat.tokenizing_distributed_data_loader_with_state(B, T, "train", resume_state_dict=state, **opts)
    x, y, s = next(again)
    again.close()
    assert np.array_equal(window_of(x, y), window) and s == state


def test_a_state_can_still_be_saved_when_the_next_batch_fails_or_the_loader_closed(tmp_path, position_docs):
    """The look-ahead never costs the state: a corrupt row group after the last good batch
    (`on_bad_row_group="raise"`) makes state_dict() give the state after that batch without a
    check, the next next() raises the error, and the state resumes exactly on repaired data;
    after close() state_dict() gives the last state too."""
    paths = plain_shards(tmp_path, position_docs, rg=8)
    with int_loader(tmp_path, "concat", num_workers=1) as ref:
        want = take(ref, 120)
    good = open(paths[1], "rb").read()
    helpers.corrupt_row_group(paths[1], 3)  # the second file: the error comes after many good batches
    ld = int_loader(tmp_path, "concat", num_workers=1, max_restarts=0, n_slots=2)
    got = []
    try:
        with pytest.raises(shmloader.DataError, match="row group 3"):
            for x, y in ld:
                got.append(window_of(x, y))
        assert 0 < len(got) < 120 and all(np.array_equal(a, b) for a, b in zip(got, want))
        state = ld.state_dict()  # after the last good batch
        assert state["check"] is None and state["batch"] == len(got)
    finally:
        ld.close()
    assert ld.state_dict() == state  # closed: the same state, no error
    open(paths[1], "wb").write(good)
    with int_loader(tmp_path, "concat", resume_state=state) as again:
        assert all(np.array_equal(a, b) for a, b in zip(take(again, 120 - len(got)), want[len(got):]))


def test_state_dict_inside_next_gives_the_last_state_at_once(tmp_path, position_docs):
    """A signal handler that saves a state while its thread is inside next() (a preemption
    notice) must not wait for next()'s lock: it gets the state after the last batch returned."""
    plain_shards(tmp_path, position_docs)
    with int_loader(tmp_path, "concat") as ld:
        take(ld, 4)
        want = {k: v for k, v in ld.state_dict().items() if k not in ("check", "digest")}
        ld._state = None  # as inside the next next(), before it returns
        with ld._lock:
            ld._inside = threading.get_ident()
            t0 = time.perf_counter()
            got = ld.state_dict()
            ld._inside = None
        assert time.perf_counter() - t0 < 1.0
    assert got["check"] is None and {k: v for k, v in got.items() if k not in ("check", "digest")} == want
