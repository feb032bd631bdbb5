"""nanochat's default data directory (`data=None`): `$NANOCHAT_BASE_DIR/base_data_climbmix`,
else the older `base_data` with an upgrade notice on stderr from rank 0 of the train split
only; neither is a `DataError` naming both. Each directory holds different tokens
(`IntTokenizer`: climbmix documents are numbers from 1000, base_data ones from 5000), so a
batch shows which directory was read.
"""
import os
import re

import numpy as np
import pytest

import shmloader
from shmloader.errors import DataError
from shmloader.data.source import CLIMBMIX_DIR, LEGACY_DIR
from shmloader.demo import corpus
from tests import helpers

pytestmark = pytest.mark.usefixtures("watchdog")

B, T = 2, 8
FIRST = {CLIMBMIX_DIR: 1000, LEGACY_DIR: 5000}


def write(base, name):
    """Three shards of 40 documents of 6 tokens whose numbers start at FIRST[name], one
    row group of 10 documents after another (so rank 1 of 2 has row groups too)."""
    docs = helpers.position_documents([6] * 120, start=FIRST[name])
    paths = corpus.write_shards(docs, base / name, num_files=3, row_group_size=10)
    (base / name / "shard_00099.parquet.tmp").write_bytes(b"a partial download")  # skipped
    return paths


def loader(split="train", rank=0, **kw):
    return shmloader.ShmLoader(None, helpers.IntTokenizer(), B, T, split, num_workers=1, device="cpu",
                               rank=rank, world_size=2, **kw)


def read_from(base, name, split="train"):
    """The loader's files are those of base/name and its first batch holds their tokens."""
    with loader(split) as ld:
        assert [os.path.dirname(f) for f in ld.files] == [str(base / name)] * len(ld.files)
        assert not any(f.endswith(".tmp") for f in ld.files)
        x, y = next(ld)
        tokens = np.concatenate([x.numpy().ravel(), y.numpy().ravel()])
    words = tokens[tokens != 0]  # without BOS
    assert len(words) and ((words >= FIRST[name]) & (words < FIRST[name] + 1000)).all(), tokens


NOTICE = re.compile(r"falling back.*python -m nanochat\.dataset -n 170", re.S)


@pytest.fixture
def base(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))
    return tmp_path


def test_climbmix_only(base, capfd):
    write(base, CLIMBMIX_DIR)
    read_from(base, CLIMBMIX_DIR)
    assert "falling back" not in capfd.readouterr().err


def test_legacy_only_falls_back_with_a_notice_on_rank_0_train(base, capfd):
    write(base, LEGACY_DIR)
    read_from(base, LEGACY_DIR)
    err = capfd.readouterr().err
    assert NOTICE.search(err), err
    assert err.count("falling back") == 1, err
    assert str(base / CLIMBMIX_DIR) in err and str(base / LEGACY_DIR) in err, err
    assert "scripts.tok_train" in err, err
    for split, rank in (("val", 0), ("train", 1)):
        with loader(split, rank) as ld:
            assert all(f.startswith(str(base / LEGACY_DIR) + os.sep) for f in ld.files)
        assert "falling back" not in capfd.readouterr().err, (split, rank)


def test_nanochat_drop_in_reads_the_fallback_too(base, capfd):
    write(base, LEGACY_DIR)
    gen = shmloader.tokenizing_distributed_data_loader(B, T, "val", 1, device="cpu",
                                                       tokenizer=helpers.IntTokenizer())
    x, _ = next(gen)
    gen.close()
    words = x.numpy()[x.numpy() != 0]
    assert ((words >= 5000) & (words < 6000)).all()
    assert "falling back" not in capfd.readouterr().err  # val: no notice


def test_both_reads_climbmix(base, capfd):
    write(base, CLIMBMIX_DIR)
    write(base, LEGACY_DIR)
    read_from(base, CLIMBMIX_DIR)
    assert "falling back" not in capfd.readouterr().err


def test_empty_climbmix_dir_is_not_a_fallback(base, capfd):
    """nanochat falls back only when the directory does not exist."""
    write(base, LEGACY_DIR)
    (base / CLIMBMIX_DIR).mkdir()
    with pytest.raises(DataError, match=re.escape(f"no data files in {base / CLIMBMIX_DIR}")):
        loader()
    assert "falling back" not in capfd.readouterr().err


def test_neither_names_both_directories(base, capfd):
    with pytest.raises(DataError) as info:
        loader()
    msg = str(info.value)
    assert str(base / CLIMBMIX_DIR) in msg and str(base / LEGACY_DIR) in msg, msg
    assert "data=" in msg and "NANOCHAT_BASE_DIR" in msg, msg
    assert "falling back" not in capfd.readouterr().err
