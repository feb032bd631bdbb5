"""The demo's data preparation and tools/profile_worker.py's sorting of samples, in this
process: the demo never overwrites data it did not write, and a py-spy profile's samples are
sorted by the worker code they are in. (The demo and the tools run as a user runs them:
tests/loader/test_tools.py.)
"""
import sys

import pytest

from shmloader.demo import prepare_data
from tests.helpers import REPO_ROOT

VOCAB = 512


def test_demo_never_overwrites_data_it_did_not_write(tmp_path):
    theirs = tmp_path / "base_data" / "shard_00000.parquet"  # e.g. --out-dir ~/.cache/nanochat
    theirs.parent.mkdir()
    theirs.write_bytes(b"not ours")
    with pytest.raises(ValueError, match="did not write"):
        prepare_data(tmp_path, VOCAB, log=lambda m: None)
    assert theirs.read_bytes() == b"not ours"


def test_profile_worker_sorts_samples_by_the_worker_code_they_are_in():
    sys.path.insert(0, str(REPO_ROOT / "tools"))
    try:
        import profile_worker
    finally:
        sys.path.pop(0)
    top = "worker_main (shmloader/procs/worker.py:67);_loop (shmloader/procs/worker.py:114)"
    tok = top + ";_tokenize (shmloader/procs/worker.py:250);encode_texts (shmloader/procs/worker.py:280)"
    raw = "\n".join([
        f"{tok};Engines.encode_batch (shmloader/data/engine.py:331);_fastokens.<locals>.batch (shmloader/data/engine.py:161);"
        f"pcre2_match_8 (fastokens/_native.abi3.so) 7",
        f"{tok};Engines.encode_batch (shmloader/data/engine.py:333);Check.batch (shmloader/data/engine.py:196);"
        f"Check._compare (shmloader/data/engine.py:210);<lambda> (shmloader/data/tokenizer.py:178) 2",
        f"{top};_tokenize (shmloader/procs/worker.py:245);ParquetSource.read_texts (shmloader/data/source.py:214);"
        f"ParquetSource._read_column (shmloader/data/source.py:234);read_row_group (pyarrow/parquet/core.py:489);"
        f"ZSTD_decompressSequences_bmi2 (pyarrow/libarrow.so) 3",
        f"{top};_tokenize (shmloader/procs/worker.py:245);ParquetSource.read_texts (shmloader/data/source.py:216);"
        f"unicode_decode_utf8 (libpython3.11.so) 1",
        f"{tok};_with_bos (shmloader/procs/worker.py:292) 4",
        f"{top};_handle (shmloader/procs/worker.py:160);write (shmloader/packing/concat.py:169) 5",
        f"{top};Listener.wait (shmloader/ipc/protocol.py:172);poll (libc.so.6) 6",
        f"{tok} 8",
    ])
    parts, total = profile_worker.classify(raw)
    assert total == 36 and parts == {
        "engine encode": 7, "sampled check (tiktoken) and its bookkeeping": 2, "reading: zstd decompression": 3,
        "reading: the rest (decode, to_pylist)": 1, "inserting BOS": 4, "copies into ring slots": 5,
        "messages and polls": 6, "other": 8}
    assert "engine encode" in profile_worker.report(parts, total) and "19.4%" in profile_worker.report(parts, total)
