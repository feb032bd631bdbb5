"""formats/arrow.py: the IPC file and stream formats told apart by their first bytes; a unit
is a record batch; string and token-id columns; a bad column names the file; the digest."""
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from shmloader.data import formats
from shmloader.data.formats import TEXT, TOKENS, Ids
from shmloader.data.formats.arrow import ArrowIPC
from shmloader.errors import DataError
from tests import formats_data

DOCS = [f"doc {i}" if i % 5 else None for i in range(2100)]


@pytest.mark.parametrize("fmt", ["arrow", "arrow-stream"])
def test_file_and_stream_format_read_alike(tmp_path, fmt):
    path = formats_data.write(str(tmp_path / "a.arrow"), DOCS, fmt)
    assert (open(path, "rb").read(6) == b"ARROW1") == (fmt == "arrow")
    for f in (formats.open_file(path), ArrowIPC(path, pafs.LocalFileSystem())):
        assert f.rows() == [1024, 1024, 52] and f.n_units() == 3 and f.kind("text") == TEXT
        assert f.read(1, 2, 6, "text") == DOCS[1026:1030]
        assert all(b > 0 for b in f.unit_bytes("text")) and f.unit_bytes("nope") == [0, 0, 0]
    assert len(formats.digest_of(path)) == 16


def test_token_ids_and_bad_columns(tmp_path):
    table = pa.table({"ids": pa.array([[1, 2], None, [3]], pa.list_(pa.int16())), "n": [1, 2, 3]})
    path = str(tmp_path / "a.feather")
    with pa.ipc.new_file(path, table.schema) as w:
        w.write_table(table)
    f = ArrowIPC(path)
    assert f.kind("ids") == TOKENS
    got = f.read(0, 0, 3, "ids", n_vocab=4)
    assert isinstance(got, Ids) and [None if g is None else g.tolist() for g in got] == [[1, 2], None, [3]]
    with pytest.raises(DataError, match=r"a\.feather: record batch 0, row 2: token id 3 is outside"):
        f.read(0, 0, 3, "ids", n_vocab=3)
    with pytest.raises(DataError, match=r"a\.feather: record batch 0: column 'n' is int64, expected text"):
        f.read(0, 0, 3, "n")
    with pytest.raises(DataError, match=r"a\.feather: no 'text' column \(columns: \['ids', 'n'\]\)"):
        f.kind("text")


def test_not_arrow_is_named(tmp_path):
    path = tmp_path / "a.arrow"
    path.write_bytes(b"not arrow at all, not even close")
    with pytest.raises(DataError, match=r"a\.arrow: not a readable Arrow IPC file"):
        ArrowIPC(str(path))


def test_may_hold_is_what_each_batch_header_says(tmp_path):
    import pyarrow as pa
    from shmloader.data.formats.arrow import ArrowIPC

    schema = pa.schema([("text", pa.string())])
    path = str(tmp_path / "s.arrow")
    with pa.ipc.new_stream(path, schema) as w:
        for rows in (["a", None], [], [None, None], [""]):
            w.write_batch(pa.record_batch([pa.array(rows, pa.string())], schema=schema))
    assert ArrowIPC(path).may_hold("text") == [True, False, False, True]
