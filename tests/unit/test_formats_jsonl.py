"""formats/jsonl.py: units of 1024 lines, the same for plain, .gz and .zst; reads of any span;
blank lines are nulls; a last line without its newline counts; bad lines name file and line;
token ids; the identity digest; a remote filesystem reads as a local one."""
import json

import numpy as np
import pyarrow.fs as pafs
import pytest

from shmloader.data import formats
from shmloader.data.formats import Ids
from shmloader.data.formats.jsonl import LINES, JsonLines
from shmloader.errors import DataError
from tests import formats_data

DOCS = [f"document {i} " + "x" * (i % 37) if i % 97 else None for i in range(2500)]


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "jsonl.zst"])
def test_units_and_reads_are_the_same_for_every_compression(tmp_path, fmt):
    path = formats_data.write(str(tmp_path / f"a{formats_data.SUFFIX[fmt]}"), DOCS, fmt)
    f = formats.open_file(path)
    assert isinstance(f, JsonLines) and f.rows() == [LINES, LINES, 2500 - 2 * LINES]
    assert all(b > 0 for b in f.unit_bytes("text"))
    assert f.read(0, 0, 5, "text") == DOCS[:5]
    assert f.read(2, 3, 10, "text") == DOCS[2 * LINES + 3:2 * LINES + 10]
    assert f.read(1, 0, LINES, "text") == DOCS[LINES:2 * LINES]  # forward, then
    assert f.read(0, 90, 100, "text") == DOCS[90:100]  # back: a compressed file starts again
    assert f.read(0, 96, 98, "text")[1] is None  # a null value


def test_blank_lines_are_nulls_and_a_last_line_without_newline_counts(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "a"}\n\n  \r\n{"text": "b"}\n{"text": "c"}')
    f = JsonLines(str(path))
    assert f.rows() == [5] and f.read(0, 0, 5, "text") == ["a", None, None, "b", "c"]


@pytest.mark.parametrize("line,match", [
    (b"{not json", r"a\.jsonl: line 2 is not JSON"),
    (b'{"title": "x"}', r"a\.jsonl: line 2 has no 'text' field \(found \['title'\]\)"),
    (b'["a list"]', r"a\.jsonl: line 2 has no 'text' field \(found a JSON list\)"),
    (b'{"text": 5}', r"a\.jsonl: line 2: 'text' is int, expected a string"),
    (b'{"text": [1, 2]}', r"a\.jsonl: line 2: 'text' is list, expected text"),
])
def test_a_bad_line_is_a_data_error_naming_file_and_line(tmp_path, line, match):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "a"}\n' + line + b'\n{"text": "c"}\n')
    with pytest.raises(DataError, match=match):
        JsonLines(str(path)).read(0, 0, 3, "text")


def test_token_ids_are_ids_checked_against_the_vocabulary(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(json.dumps({"ids": v}) for v in ([1, 2, 3], None, [], [7])) + "\n")
    got = JsonLines(str(path)).read(0, 0, 4, "ids", n_vocab=8)
    assert isinstance(got, Ids) and [None if g is None else g.tolist() for g in got] == [[1, 2, 3], None, [], [7]]
    with pytest.raises(DataError, match=r"a\.jsonl: line 4: token id 7 is outside the tokenizer's vocabulary \[0, 7\)"):
        JsonLines(str(path)).read(0, 0, 4, "ids", n_vocab=7)


def test_the_digest_sees_a_rewrite_and_not_a_copy(tmp_path):
    a = formats_data.write(str(tmp_path / "a.jsonl.zst"), DOCS, "jsonl.zst")
    b = formats_data.write(str(tmp_path / "b.jsonl.zst"), DOCS, "jsonl.zst")
    c = formats_data.write(str(tmp_path / "c.jsonl.zst"), DOCS[:-1] + ["other"], "jsonl.zst")
    assert formats.digest_of(a) == formats.digest_of(b) != formats.digest_of(c)


def test_a_corrupt_compressed_file_is_named(tmp_path):
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"PAR1 not zstd at all")
    with pytest.raises(DataError, match=r"a\.jsonl\.zst: cannot be read as zstd"):
        JsonLines(str(path)).rows()


def test_a_pyarrow_filesystem_reads_as_local(tmp_path):
    path = formats_data.write(str(tmp_path / "a.jsonl.gz"), DOCS, "jsonl.gz")
    local, remote = JsonLines(path), JsonLines(path, pafs.LocalFileSystem())
    assert local.rows() == remote.rows() and local.digest() == remote.digest()
    assert remote.read(1, 5, 9, "text") == DOCS[LINES + 5:LINES + 9]
    plain = formats_data.write(str(tmp_path / "a.jsonl"), DOCS, "jsonl")
    assert JsonLines(plain, pafs.LocalFileSystem()).read(2, 0, 3, "text") == DOCS[2 * LINES:2 * LINES + 3]
    assert np.array_equal(JsonLines(plain)._lines(), JsonLines(plain, pafs.LocalFileSystem())._lines())
