"""The adversarial new-user trial (December 2026): what a state's file check tells a user about
a file that is not parquet. A JSON Lines file rewritten in place with its name and size kept is
refused at resume, and the words say what was compared, the digest of its first and last
64 KiB, not "its parquet footer" (which a JSON Lines file does not have)."""
import json

import pytest

import shmloader
from shmloader.data import formats
from tests import helpers

B, T = 2, 16


def loader(data, **kw):
    return shmloader.ShmLoader(shmloader.Source(str(data), column="content"), helpers.IntTokenizer(), B, T,
                               num_workers=1, device="cpu", timeout=30, **kw)


def test_a_json_lines_file_rewritten_with_its_size_is_named_by_what_its_digest_is_of(tmp_path):
    for name, start in (("a.jsonl", 1), ("b.jsonl", 5000)):  # b: the val file
        lines = [json.dumps({"content": " ".join([str(start + i)] * 5), "id": i}) for i in range(200)]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    with loader(tmp_path) as ld:
        for _ in range(5):
            next(ld)
        state = ld.state_dict()
    path = tmp_path / "a.jsonl"
    raw = bytearray(path.read_bytes())
    raw[raw.index(b'"1 1 1 1 1"') + 1] = ord("2")  # the first document, before the position: same size
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"file 0: a\.jsonl was rewritten with the same name and size "
                                         r"\(the digest of its first and last 64 KiB was [0-9a-f]+, it is") as got:
        loader(tmp_path, resume_state=state)
    assert "parquet" not in str(got.value), got.value


def test_each_format_says_what_its_identity_digest_is_of():
    assert formats.identity_of("x/shard_00000.parquet") == "its parquet footer"
    for name in ("code.jsonl", "code.jsonl.zst", "dump.json.gz", "data-00000-of-00001.arrow", "t.feather"):
        assert formats.identity_of(name) == "the digest of its first and last 64 KiB", name
