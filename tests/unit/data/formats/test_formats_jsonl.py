"""formats/jsonl.py: units of 1024 lines, the same for plain, .gz and .zst; reads of any span;
blank lines are nulls; a last line without its newline counts; bad lines name file and line;
token ids; the identity digest; a remote filesystem reads as a local one."""
import json
import re

import numpy as np
import pyarrow as pa
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


def _mixed(tmp_path, at: int, n: int) -> str:
    """Text on every line but `at` (1-based), which holds token ids; a leading bad line and a null."""
    lines = [b"{not json", b'{"text": null}'] + [json.dumps({"text": f"{i} {i}"}).encode() for i in range(3, n + 1)]
    lines[at - 1] = json.dumps({"text": [at, at]}).encode()
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


@pytest.mark.parametrize("at", [4, LINES + 2])
def test_a_file_s_column_is_of_one_kind_whatever_the_pieces(tmp_path, at):
    """issue 51: the kind was checked within a piece, so a piece of one line (max_piece_docs=1)
    or a unit boundary between text and ids read both. Now the file's first value fixes it
    (read from the start, bad and null lines passed over) and the same line fails in every cut."""
    path = _mixed(tmp_path, at, LINES + 5)
    f = JsonLines(path)
    assert f.kind("text") == formats.TEXT
    want = rf"a\.jsonl: line {at}: 'text' is list, expected text \(a string\) like the file's first value \(line 3\)"
    for lo, hi in [(at - 1, at), (at - 3, at + 2), (at - 1, at + 1)]:
        unit = lo // LINES
        with pytest.raises(DataError, match=want):
            JsonLines(path).read(unit, lo - unit * LINES, hi - unit * LINES, "text")
    assert f.read(0, 2, 3, "text") == ["3 3"] and f.read(0, 1, 2, "text") == [None]  # a piece after the bad line
    with pytest.raises(DataError, match=r"line 1 is not JSON"):
        f.read(0, 0, 2, "text")


@pytest.mark.parametrize("head_chunk", [5, 64 << 10])
def test_a_file_s_kind_is_its_first_value_s(tmp_path, monkeypatch, head_chunk):
    from shmloader.data.formats import jsonl
    monkeypatch.setattr(jsonl, "HEAD_CHUNK", head_chunk)  # lines across the reads' chunks
    (tmp_path / "a.jsonl").write_text('{"ids": null}\n\n{"ids": [1, 2]}\n{"ids": "x"}\n')
    (tmp_path / "b.jsonl").write_text('{"ids": null}\n{"other": 1}\n')
    assert JsonLines(str(tmp_path / "a.jsonl"))._kind("ids") == (formats.TOKENS, 3)
    assert JsonLines(str(tmp_path / "b.jsonl")).kind("ids") is None
    with pytest.raises(DataError, match=r"a\.jsonl: line 4: 'ids' is str, expected token ids \(a list of integers\) "
                                        r"like the file's first value \(line 3\)"):
        JsonLines(str(tmp_path / "a.jsonl")).read(0, 3, 4, "ids")


@pytest.mark.parametrize("ids,match", [
    ([1, 1.9], r"element 1 is 1\.9 \(a JSON number with a fraction or exponent\)"),
    ([1.0], r"element 0 is 1\.0 \(a JSON number"),
    (["7"], r'element 0 is "7" \(a JSON string\)'),
    ([3, True], r"element 1 is true \(a JSON boolean\)"),
    ([2, None], r"element 1 is a null"),
    ([[1, 2]], r"element 0 is \[1, 2\] \(a JSON list\)"),
    ([1, 1 << 64], r"token id 18446744073709551616 is outside the tokenizer's vocabulary \[0, 9\)"),
])
def test_token_ids_that_are_not_integers_are_errors_not_coerced(tmp_path, ids, match):
    """issue 51: [1.9, "7", true, 2.5] was read as [1, 7, 1, 2]."""
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"ids": [1, 2]}) + "\n" + json.dumps({"ids": ids}) + "\n")
    with pytest.raises(DataError, match=r"a\.jsonl: line 2: " + ("token ids must be a list of integers, but "
                                                                 if "outside" not in match else "") + match):
        JsonLines(str(path)).read(0, 0, 2, "ids", n_vocab=9)


@pytest.mark.parametrize("indent", [2, None])
@pytest.mark.parametrize("name", ["docs.json", "docs.json.gz"])
def test_a_json_array_says_it_is_not_json_lines_when_first_read(tmp_path, indent, name):
    """What json.dump(list) writes: named as such when the file is first read (its lines counted,
    or its kind looked up), with how to convert it."""
    docs = [{"text": f"{i} {i}"} for i in range(5)]
    path = tmp_path / name
    data = ("\n " + json.dumps(docs, indent=indent)).encode()
    if name.endswith(".gz"):
        import gzip
        data = gzip.compress(data)
    path.write_bytes(data)
    want = (r"docs\.json(\.gz)?: the file is one JSON array \(its first character is '\['\), not JSON Lines \(one "
            r"JSON object a line\); convert it, e\.g\. `jq -c '\.\[\]' docs\.json(\.gz)? > docs\.jsonl`")
    with pytest.raises(DataError, match=want):
        JsonLines(str(path)).rows()
    with pytest.raises(DataError, match=want.replace(": the", ": unit 0: the")):
        JsonLines(str(path)).kind("text", "unit 0: ")


def test_a_zstd_window_past_the_decoder_s_limit_is_named_not_called_corrupt(tmp_path):
    """issue 51: `zstd --long=31` output (valid zstd) was "corrupt or truncated: re-download". A
    frame written by hand: a 2 GiB window (window descriptor 21 << 3) and one raw block."""
    import struct
    data = b'{"text": "1 2"}\n'
    frame = b"\x28\xb5\x2f\xfd" + bytes([0x00, 21 << 3]) + struct.pack("<I", len(data) << 3 | 1)[:3] + data
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(frame)
    with pytest.raises(DataError, match=r"a\.jsonl\.zst: cannot be read as zstd \(.*\): it was compressed with a "
                                        r"window over the decoder's limit \(zstd --long.*recompress it without --long"):
        JsonLines(str(path)).rows()


def _gzip(data):
    import gzip
    return gzip.compress(data)


def _zstd(data):
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as f:
        f.write(data)
    return sink.getvalue().to_pybytes()


def _parquet(data):
    import pyarrow.parquet as pq
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"text": ["a b"]}), sink)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.json", "docs.jsonl.gz"])
@pytest.mark.parametrize("kind,what,named", [(_gzip, "gzip-compressed data", ".jsonl.gz"),
                                             (_zstd, "zstd-compressed data", ".jsonl.zst"),
                                             (_parquet, "a Parquet file", ".parquet")])
def test_a_file_of_another_format_under_a_json_lines_name_says_which_when_first_read(tmp_path, name, kind, what, named):
    """A gzip file saved as `docs.jsonl` (a download that kept the server's encoding), zstd or
    parquet: each was "line 1 is not JSON ('utf-8' codec can't decode byte 0x8b ...)" from a
    worker; it is named by its first bytes when the file is first read (as a JSON array is),
    with the name that reads it."""
    data = kind(b'{"text": "a b"}\n')
    if name.endswith(".gz"):
        data = _gzip(data)  # its content is compressed once more
    path = tmp_path / name
    path.write_bytes(data)
    want = rf"{name}: (unit 0: )?the file{' decompressed' if name.endswith('.gz') else ''} is {what} " \
           rf"\(its first bytes\), not JSON Lines"
    with pytest.raises(DataError, match=want + r".*" + (re.escape(f"docs{named}") if not name.endswith(".gz") else "")):
        JsonLines(str(path)).rows()
    with pytest.raises(DataError, match=want):
        JsonLines(str(path)).kind("text", "unit 0: ")


@pytest.mark.parametrize("name,kind,what,named", [
    ("docs.jsonl.gz", _zstd, "zstd-compressed data", "docs.jsonl.zst"),
    ("docs.jsonl.zst", _gzip, "gzip-compressed data", "docs.jsonl.gz"),
    ("docs.jsonl.gz", bytes, "not compressed", "docs.jsonl"),
], ids=["zstd-as-gz", "gzip-as-zst", "plain-as-gz"])
def test_a_compressed_name_on_other_bytes_says_what_they_are(tmp_path, name, kind, what, named):
    """A .gz that is zstd data (or the reverse, or plain JSON Lines) was "cannot be read as gzip
    (...); the file is corrupt or truncated: re-download or rewrite it"; it is named by its first
    bytes, with the name that reads it."""
    path = tmp_path / name
    path.write_bytes(kind(b'{"text": "a b"}\n'))
    with pytest.raises(DataError, match=rf"{re.escape(name)}: cannot be read as (gzip|zstd): the file is {what} \(its "
                                        rf"first bytes\); name it {re.escape(named)} to read it as that"):
        JsonLines(str(path)).rows()


@pytest.mark.parametrize("name,fmt", [("A.JSONL.ZST", "jsonl.zst"), ("b.Json.Gz", "jsonl.gz")])
def test_a_compressed_file_named_in_capitals_is_decompressed(tmp_path, name, fmt):
    """The registry takes names in any case (`A.JSONL.ZST` is JSON Lines), but the codec was found
    by the lower-case suffix only: the compressed bytes were read as text ("line 1 is not
    JSON")."""
    path = formats_data.write(str(tmp_path / name), ["x y", None, "z"], fmt)
    f = formats.open_file(path)
    assert isinstance(f, JsonLines) and f.rows() == [3] and f.read(0, 0, 3, "text") == ["x y", None, "z"]


def test_a_place_in_a_json_lines_file_is_named_by_its_lines():
    """Messages name a place as its format words it (`formats.place_of`): a JSON Lines file's
    lines, counted from 1 (unit 2, row 2 is line 2051), never a "row group"; a parquet file's
    row group and row; an Arrow file's record batch."""
    assert formats.place_of("a.jsonl.zst", 2, 2) == f"line {2 * LINES + 3}"
    assert formats.place_of("a.jsonl", 2, 0, 951) == f"lines {2 * LINES + 1}-{2 * LINES + 952}"
    assert formats.place_of("a.json.gz", 1) == f"lines {LINES + 1}-{2 * LINES}"
    assert formats.place_of("a.parquet", 3, 5) == "row group 3, row 5"
    assert formats.place_of("a.parquet", 3, 5, 9) == "row group 3, rows 5-9"
    assert formats.place_of("a.arrow", 3) == "record batch 3"
    assert formats.units_of(["a.jsonl", "b.jsonl.zst"]) == f"units of {LINES} lines"
    assert formats.units_of(["a.parquet"]) == "row groups" and formats.units_of(["a.parquet", "b.jsonl"]) == "units"


def test_documents_of_a_unit_in_the_order_read_claim_no_rows():
    """A shuffled window's piece is its first unit and documents numbered in the window's order:
    as rows they named lines the file does not have ("c.jsonl, lines 1009-2032" of a 2,000-line
    file, the poison on another file); in the order read they name the unit and the numbers, and
    in the files' order the rows as `place_of` does."""
    from shmloader.data.formats import docs_of_unit, place_of
    assert docs_of_unit("c.jsonl", 0, 1008, 2031) == "lines 1-1024, documents 1008-2031 in the order read"
    assert docs_of_unit("c.parquet", 2, 5) == "row group 2, document 5 in the order read"
    assert docs_of_unit("c.jsonl", 1, 0, 975, ordered=True) == place_of("c.jsonl", 1, 0, 975) == "lines 1025-2000"
