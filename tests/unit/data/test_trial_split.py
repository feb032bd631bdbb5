"""The adversarial new-user trial (December 2026): split='train' (the default) over the files of
one named split, a Hub download's `train-0000N-of-0000M` shards (a data set with a train split
alone) or a `train/` directory, left its last shard out as nanochat's val file without a word:
a 2-shard download trained on half of it. It is said, with split='all' to read every file; a
held-out set's files (validation/, `validation-*` shards) trained on say so too. nanochat's own
`shard_NNNNN.parquet` directory says nothing."""
import os
import re
import warnings

import pytest

from shmloader.data.source import split_files


@pytest.mark.parametrize("files, named", [
    (["/d/data/train-00000-of-00002.parquet", "/d/data/train-00001-of-00002.parquet"], "the 'train' split"),
    (["/d/fw/train/000_00000.parquet", "/d/fw/train/000_00001.parquet", "/d/fw/train/001_00000.parquet"], "/d/fw/train"),
    (["/d/validation/a.jsonl", "/d/validation/b.jsonl"], "/d/validation"),
])
def test_split_train_over_one_named_split_says_it_leaves_out_the_last_file(files, named):
    with pytest.warns(UserWarning, match=rf"split='train' reads every file but the last of the {len(files)} files of "
                                         rf"{re.escape(named)}: {re.escape(os.path.basename(files[-1]))} is left out "
                                         rf"as nanochat's val file .*pass split='all'"):
        assert split_files(files, "train") == files[:-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert split_files(files, "all") == files


def test_split_train_over_nanochat_shards_says_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        files = [f"/d/base_data/shard_{i:05d}.parquet" for i in range(3)]
        assert split_files(files, "train") == files[:-1]
        assert split_files(["/d/x/a-00000-of-00002.jsonl", "/d/x/b.jsonl"], "train") == ["/d/x/a-00000-of-00002.jsonl"]
