"""The split's files as a loader knows them (data/catalogue.py), on parquet files in a tmp dir:
names and sizes; a resume's order (the state's files first, new ones after) for its epoch and
the sorted order after it, with states numbering the files as their epoch orders them; footers
learnt from the coordinator (a change warned of, the list replaced, never edited); footers a
state knows taken for the same files; states list footers only up to their position."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shmloader.data.catalogue import Catalogue, Listing, described_files, file_list, listing
from shmloader.data.order import Later
from shmloader.errors import DataError
from shmloader.ipc.protocol import Opened


@pytest.fixture
def data(tmp_path):
    for i, n in enumerate((3, 5, 2, 4)):
        pq.write_table(pa.table({"text": [f"doc {j}" for j in range(n)]}), tmp_path / f"shard_{i:05d}.parquet",
                       row_group_size=2)
    return tmp_path


def test_the_split_its_identities_and_the_val_file(data):
    train, val = Catalogue(str(data), "train"), Catalogue(str(data), "val")
    assert [f[0] for f in train.files] == [f"shard_{i:05d}.parquet" for i in range(3)]
    assert all(f[1] > 0 and f[2] is None for f in train.files)
    assert train.val == val.val == "shard_00003.parquet" and len(val.paths) == 1
    assert train.row_counts(1) == [2, 2, 1] and train.later is None


def test_one_file_is_no_train_split(tmp_path):
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "only.parquet")
    with pytest.raises(DataError, match="at least 2 files"):
        Catalogue(str(tmp_path), "train")


def test_a_resume_reads_its_epoch_in_the_states_order_and_then_the_sorted_one(data):
    cat = Catalogue(str(data), "train")
    cat.reorder([0, 2, 1])  # file 1 arrived after the save: read last in the epoch in progress
    cat.begin(3)
    assert [os.path.basename(p) for p in cat.paths] == ["shard_00000.parquet", "shard_00002.parquet",
                                                        "shard_00001.parquet"]
    assert cat.later == Later(3, (0, 2, 1))  # from epoch 4 on: sorted (run index 2 is shard 1)
    pq_idx, files, renumber = cat.described(3, 1)  # epoch 3: the run's order is the state's
    assert (pq_idx, renumber) == (1, None) and [f[0] for f in files][1] == "shard_00002.parquet"
    pq_idx, files, renumber = cat.described(4, 1)  # epoch 4: sorted, so shard 2 is file 2
    assert pq_idx == 2 and [f[0] for f in files] == [f"shard_{i:05d}.parquet" for i in range(3)]
    assert np.array_equal(renumber, [0, 2, 1])
    cat.begin(5)  # a later resume in epoch 5 starts a new reordered epoch
    assert cat.described(5, 1)[0] == 1


def test_a_files_number_in_a_state_is_describeds_without_its_list(data):
    """`numbered` (a state's nanochat keys, asked with every batch) says the `pq_idx` that
    `described` says, in every epoch of a reordered run, and leaves `described`'s kept answer."""
    cat = Catalogue(str(data), "train")
    cat.reorder([0, 2, 1])
    cat.begin(3)
    kept = cat.described(3, 0)[1]
    assert [cat.numbered(e, f) for e in (3, 4) for f in range(3)] == [0, 1, 2, 0, 2, 1]
    assert cat.described(3, 0)[1] is kept
    assert all(cat.numbered(e, f) == cat.described(e, f)[0] for e in (3, 4, 5) for f in range(3))


def test_learnt_footers_replace_the_list_and_a_change_is_warned_of(data):
    cat = Catalogue(str(data), "train")
    before = cat.files
    said = []
    cat.learn([Opened(0, before[0][1], "f0")], said.append)
    assert cat.files[0][2] == "f0" and before[0][2] is None and said == []  # replaced, not edited
    cat.learn([Opened(0, before[0][1] + 1, "f0b")], said.append)
    assert len(said) == 1 and "changed since this loader first knew it" in said[0]


def test_footers_a_state_knows_are_kept_for_files_of_the_same_name_and_size(data):
    cat = Catalogue(str(data), "train")
    name, size, _ = cat.files[1]
    cat.with_footers([[name, size, "known"], [cat.files[2][0], cat.files[2][1] + 1, "resized"], ["x", 1, "y"]])
    assert [f[2] for f in cat.files] == [None, "known", None]


def test_a_state_lists_footers_up_to_its_position_in_epoch_1():
    files = [["a", 1, "fa"], ["b", 2, "fb"], ["c", 3, "fc"]]
    assert described_files(files, 1, 0) == [["a", 1, "fa"], ["b", 2, None], ["c", 3, None]]
    assert described_files(files, 2, 0) is files and described_files(files, 1, 2) == files


def test_file_list_keeps_names_and_marks_unknown_sizes():
    assert file_list(["/x/a.parquet", "s3://b/c.parquet"], [10, None]) == [["a.parquet", 10, None],
                                                                           ["c.parquet", -1, None]]


def test_listing_is_the_states_files_then_the_new_ones():
    """The one order rule of a resume (one source's and a mixture's source's): the state's files
    still there in the state's order, then the new ones in the loader's order; a file gone is
    named by its index in the state."""
    f = {name: [name, 1, None] for name in "abcdef"}
    saved = [f["a"], f["d"], f["b"], ["z", 1, None]]
    now = [f["a"], f["b"], f["c"], f["d"], f["e"]]
    assert listing(saved, now) == Listing(order=[0, 3, 1, 2, 4], added=[2, 4], gone=[3])
    assert listing(now, now) == Listing(order=[0, 1, 2, 3, 4], added=[], gone=[])


def test_reads_token_ids_as_the_first_file_that_says_its_kind(tmp_path):
    """What a state's `token_ids` marker follows (state.py `token_ids_marker`): the column's kind
    in the split's first file that says it (an unreadable file, or a JSON Lines file without a
    value in its first lines, says nothing); text, and a column of another name, are not ids."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.parquet").write_bytes(b"not parquet")
    (d / "b.jsonl").write_text('{"ids": null}\n')
    pq.write_table(pa.table({"ids": pa.array([[1, 2]], pa.list_(pa.int32())), "text": ["x"]}), d / "c.parquet")
    pq.write_table(pa.table({"ids": pa.array([[3]], pa.list_(pa.int32()))}), d / "d.parquet")
    assert Catalogue(str(d), "all", column="ids").reads_token_ids() is True
    assert Catalogue(str(d), "all", column="text").reads_token_ids() is False
    assert Catalogue(str(d), "val", column="ids").reads_token_ids() is True
    (d / "b.jsonl").write_text('{"ids": "text"}\n')
    assert Catalogue(str(d), "all", column="ids").reads_token_ids() is False
