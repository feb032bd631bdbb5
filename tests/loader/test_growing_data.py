"""A data set that grows while a run trains, as nanochat's downloader (4 processes, so shards
land out of order) leaves it (docs/contract.md §3): a shard that arrives anywhere in the sort
order after a save is accepted, read after the state's files in the epoch in progress and in its
sorted place from the next epoch on; a new last shard, which turns the old val file into
training data, says so in words, and the val split refuses a state of another val file.

Each file's documents hold tokens of their own range (file i: 1_000_000 * (i + 1) + row * 100 +
k), so the expected stream is built here from the files in the expected order, independently
of the loader's order logic."""
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shmloader
from tests import helpers
from tests.helpers import window_of

B, T = 2, 16
W = B * T + 1


def write_file(path, i, n_docs=30, rg=8):
    docs = [" ".join(str(1_000_000 * (i + 1) + row * 100 + k) for k in range(row % 7 + 1)) for row in range(n_docs)]
    pq.write_table(pa.table({"text": docs}), path, row_group_size=rg)


def tokens_of(paths) -> list:
    out = []
    for path in paths:
        for text in pq.read_table(path).column("text").to_pylist():
            out += [0] + [int(t) for t in text.split()]
    return out


def loader(data, split="train", **kw):
    return shmloader.ShmLoader(str(data), helpers.IntTokenizer(), B, T, split, device="cpu", num_workers=2,
                               timeout=30, **kw)


@pytest.mark.parametrize("state_from,where", [("state_dict", "before_gap"), ("drop_in", "before_gap"),
                                              ("state_dict", "past_gap"), ("drop_in", "epoch_2")])
def test_a_shard_that_lands_inside_the_sort_order_is_read_after_the_states(tmp_path, state_from, where):
    """Saved in shard 1 (before where shard 2 lands), in shard 3 (past it: such states were
    refused) or in the second epoch (refused too)."""
    data = tmp_path / "data"
    data.mkdir()
    names = [f"shard_{i:05d}.parquet" for i in range(5)]  # shard 4 is the val file
    for i in (0, 1, 3, 4):  # shard 2 is still downloading
        write_file(data / names[i], i)
    first_epoch = tokens_of([data / names[i] for i in (0, 1, 3)])
    into = {"before_gap": len(tokens_of([data / names[0]])),
            "past_gap": len(tokens_of([data / names[i] for i in (0, 1)])),
            "epoch_2": len(first_epoch) + len(tokens_of([data / names[0]]))}[where]
    k = into // W + 2  # the save
    if state_from == "state_dict":
        with loader(data) as ld:
            for _ in range(k):
                next(ld)
            state = ld.state_dict()
        offset = k * W
    else:
        gen = shmloader.tokenizing_distributed_data_loader_with_state(B, T, "train", device="cpu", data=str(data),
                                                                       tokenizer=helpers.IntTokenizer(), num_workers=2)
        for _ in range(k):
            _, _, state = next(gen)  # resumes AT the batch it came with
        gen.close()
        offset = (k - 1) * W
    assert (state["epoch"], state["pq_idx"]) == {"before_gap": (1, 1), "past_gap": (1, 2), "epoch_2": (2, 1)}[where]
    write_file(data / names[2], 2)  # shard 2 lands
    every = [data / names[i] for i in range(4)]
    epoch_rest = (first_epoch * 2)[offset:len(first_epoch) * (1 + (offset >= len(first_epoch)))]
    want = epoch_rest + tokens_of([data / names[2]]) + tokens_of(every) * 3
    n = len(want) // W - 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with loader(data, resume_state=state) as ld:
            got = [window_of(*next(ld)) for _ in range(n)]
            later = ld.state_dict()
    added = [str(w.message) for w in caught if "added to the split" in str(w.message)]
    assert len(added) == 1 and "1 file(s)" in added[0] and names[2] in added[0], added
    for j, g in enumerate(got):
        assert np.array_equal(g, np.array(want[j * W:(j + 1) * W])), f"resumed batch {j}"
    # a state of the later epochs names the files in their sorted order, and resumes exactly
    assert later["epoch"] > 1 and [f[0] for f in later["files"]] == names[:4]
    with loader(data, resume_state=later) as ld:
        again = window_of(*next(ld))
    assert np.array_equal(again, np.array(want[n * W:(n + 1) * W]))


def test_a_new_last_shard_says_the_val_file_changed(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):
        write_file(data / f"shard_{i:05d}.parquet", i)
    with loader(data) as ld:
        next(ld)
        train_state = ld.state_dict()
    with loader(data, "val") as ld:
        next(ld)
        val_state = ld.state_dict()
    assert train_state["val"] == val_state["val"] == "shard_00003.parquet"
    write_file(data / "shard_00004.parquet", 4)  # a new last shard: the old val file is training data now
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader(data, resume_state=train_state).close()
    said = [str(w.message) for w in caught if "val file" in str(w.message)]
    assert len(said) == 1 and "was shard_00003.parquet" in said[0] and "is shard_00004.parquet now" in said[0] \
        and "training data" in said[0], [str(w.message) for w in caught]
    with pytest.raises(ValueError, match=r"val split read shard_00003\.parquet; this loader's val file is "
                                         r"shard_00004\.parquet"):
        loader(data, "val", resume_state=val_state)


def test_best_fit_resumes_exactly_across_a_reordered_epoch(tmp_path):
    """Best fit's state holds its buffer as runs of file indices: in the epochs after a
    reordered one they name the sorted order's files, and a state taken there resumes
    exactly."""
    data = tmp_path / "data"
    data.mkdir()
    names = [f"shard_{i:05d}.parquet" for i in range(5)]
    for i in (0, 1, 3, 4):
        write_file(data / names[i], i, n_docs=60)
    kw = dict(packing="bos_bestfit", buffer_size=6, tokenizer_batch_size=3)
    with loader(data, **kw) as ld:
        for _ in range(4):
            next(ld)
        state = ld.state_dict()
    write_file(data / names[2], 2, n_docs=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with loader(data, resume_state=state, **kw) as ld:
            while ld.state_dict()["epoch"] < 3:
                next(ld)
            later = ld.state_dict()
            follow = [next(ld) for _ in range(8)]
        assert later["buffer"] and [f[0] for f in later["files"]] == names[:4]
        with loader(data, resume_state=later, **kw) as again:
            for x, y in follow:
                gx, gy = next(again)
                assert np.array_equal(gx.numpy(), x.numpy()) and np.array_equal(gy.numpy(), y.numpy())


@pytest.mark.parametrize("restart", ["heal", "idle_release"])
def test_a_restart_in_the_epoch_after_a_reordered_one_reads_the_sorted_order(tmp_path, restart):
    """Resumed in epoch 1 with shard 2 arrived inside the sort order (epoch 1: 0, 1, 3, then 2;
    epoch 2 on: 0, 1, 2, 3), then restarted in epoch 2 (a worker killed and healed, or the
    processes released while idle): the restart goes on in epoch 2's sorted order, and a state
    taken after it names the files in that order and resumes exactly."""
    data = tmp_path / "data"
    data.mkdir()
    names = [f"shard_{i:05d}.parquet" for i in range(5)]
    for i in (0, 1, 3, 4):
        write_file(data / names[i], i)
    first_epoch = tokens_of([data / names[i] for i in (0, 1, 3)])
    k = len(tokens_of([data / names[0]])) // W + 2
    with loader(data) as ld:
        for _ in range(k):
            next(ld)
        state = ld.state_dict()
    write_file(data / names[2], 2)
    every = [data / names[i] for i in range(4)]
    want = first_epoch[k * W:] + tokens_of([data / names[2]]) + tokens_of(every) * 3
    at = (len(first_epoch) - k * W + len(tokens_of([data / names[2]]))) // W + 3  # into epoch 2
    n = len(want) // W - 1
    options = {"idle_release_s": 0.3} if restart == "idle_release" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with loader(data, resume_state=state, n_slots=2, **options) as ld:
            got = [window_of(*next(ld)) for _ in range(at)]
            assert ld.state_dict()["epoch"] == 2
            helpers.heal_or_release(ld, restart)
            got += [window_of(*next(ld)) for _ in range(n - at)]
            counted = ld.stats()["heals" if restart == "heal" else "idle_releases"]
            later = ld.state_dict()
    assert counted == 1
    for j, g in enumerate(got):
        assert np.array_equal(g, np.array(want[j * W:(j + 1) * W])), f"resumed batch {j}"
    assert [f[0] for f in later["files"]] == names[:4]
    with loader(data, resume_state=later) as ld:
        assert np.array_equal(window_of(*next(ld)), np.array(want[n * W:(n + 1) * W]))


@pytest.mark.parametrize("kind", ["source", "mixture_of_one"])
def test_nanochat_keys_after_a_reordering_resume_number_the_sorted_files(tmp_path, kind):
    """A loader resumed once from a state with a shard added among its files (so it read them
    reordered: 0, 1, 3, then 2), then given nanochat's keys, reads the file the keys name in
    the sorted order, as a fresh loader does: the reused one read shard 3 for `pq_idx` 2."""
    data = tmp_path / "data"
    data.mkdir()
    names = [f"shard_{i:05d}.parquet" for i in range(5)]
    for i in (0, 1, 3, 4):
        write_file(data / names[i], i)
    data_of = shmloader.Mixture({"x": str(data)}, {"x": 1}) if kind == "mixture_of_one" else str(data)

    def of():
        return shmloader.ShmLoader(data_of, helpers.IntTokenizer(), B, T, "train", device="cpu", num_workers=2,
                                   timeout=30)

    with of() as ld:
        for _ in range(3):
            next(ld)
        state = ld.state_dict()
    write_file(data / names[2], 2)
    keys = {"epoch": 1, "pq_idx": 2, "rg_idx": 1}
    with of() as fresh:
        fresh.load_state_dict(keys)
        want = [window_of(*next(fresh)) for _ in range(4)]
    assert want[0][1] // 1_000_000 == 3  # shard 2's tokens (file i: 1_000_000 * (i + 1) + ...)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the added shard, said
        with of() as ld:
            ld.load_state_dict(state)
            next(ld)
            ld.load_state_dict(keys)
            got = [window_of(*next(ld)) for _ in range(4)]
    for j, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"batch {j}"
