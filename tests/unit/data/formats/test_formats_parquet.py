"""formats/parquet.py and the registry (formats/__init__.py): a unit is a row group; any column
by name, text or token ids; the footer digest; formats found by file name, longest suffix first;
a directory lists every format and skips partial downloads."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shmloader.data import formats
from shmloader.data.formats import TEXT, TOKENS, Ids
from shmloader.data.formats.parquet import Parquet
from shmloader.data.source import Reader, list_files
from shmloader.errors import DataError
from tests import formats_data


def test_a_row_group_is_a_unit_in_any_column(tmp_path):
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"content": ["a", "b", None, "d"], "ids": [[1], [2, 3], None, []]}), path,
                   row_group_size=3)
    f = formats.open_file(path)
    assert isinstance(f, Parquet) and f.rows() == [3, 1] and f.n_units() == 2
    assert f.kind("content") == TEXT and f.kind("ids") == TOKENS
    assert f.read(0, 1, 3, "content") == ["b", None] and f.read(1, 0, 1, "content") == ["d"]
    ids = f.read(0, 0, 3, "ids", n_vocab=10)
    assert isinstance(ids, Ids) and [None if i is None else i.tolist() for i in ids] == [[1], [2, 3], None]
    assert f.unit_bytes("content")[0] > 0 and f.unit_bytes("text") == [0, 0]
    with pytest.raises(DataError, match=r"a\.parquet: row group 0: no 'text' column \(columns: \['content', 'ids'\]\)"):
        f.read(0, 0, 1, "text")


@pytest.mark.parametrize("name,fmt", [("a.parquet", "parquet"), ("a.jsonl", "jsonl"), ("a.json.gz", "jsonl"),
                                      ("a.JSONL.ZST", "jsonl"), ("a.arrow", "arrow"), ("a.feather", "arrow")])
def test_the_registry_finds_formats_by_name(name, fmt):
    assert formats.format_name(name) == fmt and formats.is_data_file(name)


@pytest.mark.parametrize("name", ["a.parquet.tmp", "a.jsonl.zst.tmp", "a.txt", "a.csv"])
def test_other_names_are_no_data_files(name):
    assert not formats.is_data_file(name)
    with pytest.raises(DataError, match=r"not a data file this loader reads \(by its name: \.parquet, "):
        formats.format_of(name)


def test_a_directory_of_mixed_formats_lists_every_one_and_reads_each_as_named(tmp_path):
    docs = ["x y", "z"]
    paths = [formats_data.write(str(tmp_path / f"s{i}{sfx}"), docs, fmt)
             for i, (fmt, sfx) in enumerate([("parquet", ".parquet"), ("jsonl.zst", ".jsonl.zst"),
                                             ("arrow", ".arrow")])]
    (tmp_path / "s9.jsonl.zst.tmp").write_bytes(b"partial")
    assert list_files(str(tmp_path)) == paths
    reader = Reader(paths)
    assert [reader.read_texts(f, 0, 0, 2) for f in range(3)] == [docs] * 3
    assert [reader.row_counts(f) for f in range(3)] == [[2]] * 3
    assert len({reader.identity(f)[1] for f in range(3)}) == 3


def test_a_null_inside_token_ids_names_its_row_without_a_numpy_warning(tmp_path):
    """issue 51: [5, null, 5] was "token id -9223372036854775808 is outside ... [0, None)" after a
    numpy RuntimeWarning; a null row stays a null document, and a slice sees only its rows."""
    import warnings
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"ids": pa.array([[1, 2], None, [5, None, 5], [3]], pa.list_(pa.int32()))}), path)
    f = Parquet(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError, match=r"a\.parquet: row group 0, row 2: a null inside its token ids \(element 1\)"
                                            r"; token ids must all be integers"):
            f.read(0, 0, 4, "ids", n_vocab=10)
        with pytest.raises(DataError, match=r"row group 0, row 2: a null inside"):
            f.read(0, 2, 3, "ids")
        got = f.read(0, 0, 2, "ids", n_vocab=10)
        assert [None if g is None else g.tolist() for g in got] == [[1, 2], None]
        assert f.read(0, 3, 4, "ids", n_vocab=10)[0].tolist() == [3]


def test_token_ids_past_int64_and_without_a_vocabulary_size_read_as_they_are(tmp_path):
    """uint64 ids of 2^63 or more were read as negative; with no vocabulary size the message said
    "[0, None)"."""
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"ids": pa.array([[1], [2, (1 << 64) - 1]], pa.list_(pa.uint64())),
                             "neg": pa.array([[1], [-3]], pa.list_(pa.int64()))}), path)
    with pytest.raises(DataError, match=r"row 1: token id 18446744073709551615 is outside the tokenizer's "
                                        r"vocabulary \[0, 10\)"):
        Parquet(path).read(0, 0, 2, "ids", n_vocab=10)
    with pytest.raises(DataError, match=r"row 1: token id 18446744073709551615 is past any vocabulary"):
        Parquet(path).read(0, 0, 2, "ids")
    with pytest.raises(DataError, match=r"row 1: token id -3 is negative, expected ids in \[0, the tokenizer's "
                                        r"vocabulary size\)") as err:
        Parquet(path).read(0, 0, 2, "neg")
    assert "None" not in str(err.value)


def test_may_hold_is_what_the_footer_says(tmp_path):
    """No rows or a text column null in every row: False; a list column (its null count is of
    its ids) or a footer without statistics: True, not known without reading."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from shmloader.data.formats.parquet import Parquet

    groups = [["a", None], [], [None, None], [""]]
    for stats, want in ((True, [True, False, False, True]), (False, [True, False, True, True])):
        path = str(tmp_path / f"t{stats}.parquet")
        with pq.ParquetWriter(path, pa.schema([("text", pa.string()), ("ids", pa.list_(pa.int32()))]),
                              write_statistics=stats) as w:
            for rows in groups:
                w.write_table(pa.table({"text": pa.array(rows, pa.string()),
                                        "ids": pa.array([None] * len(rows), pa.list_(pa.int32()))}))
        assert Parquet(path).may_hold("text") == want
        assert Parquet(path).may_hold("ids") == [True, False, True, True]


LIST_VIEWS = [getattr(pa, name) for name in ("ListViewArray", "LargeListViewArray")  # pyarrow >= 16
              if hasattr(pa, name)]


@pytest.mark.skipif(not LIST_VIEWS, reason="this pyarrow has no list_view type")
@pytest.mark.parametrize("kind", LIST_VIEWS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_token_ids_in_a_list_view_column_are_token_ids(tmp_path, kind, fmt):
    """A list_view of integers (pyarrow's other list layout, kept in a parquet file's arrow schema)
    is a list of integers: token ids, as the README's "any int list type" says. It was a
    DataError: "column 'ids' is list_view<element: int32>, expected ... token ids (a list of
    integers)". Rows out of order in its values, a null row and a slice read as their own rows
    (pyarrow 26's cast to a list, read from an Arrow file, dropped the last row's ids)."""
    rows = [[1, 2], None, [5, 6, 7], [], [3]]
    path = str(tmp_path / f"a.{fmt}")
    values = pa.array([5, 6, 7, 1, 2, 3], pa.int32())  # rows 0 and 2 swapped in the values
    view = kind.from_arrays([3, 0, 0, 0, 5], [2, 0, 3, 0, 1], values, mask=pa.array([False, True, False, False, False]))
    assert view.to_pylist() == rows
    table = pa.table({"ids": view})
    if fmt == "parquet":
        pq.write_table(table, path)
    else:
        import pyarrow.feather as feather
        feather.write_feather(table, path)
    f = formats.open_file(path)
    assert f.kind("ids") == TOKENS
    got = f.read(0, 0, 5, "ids", n_vocab=10)
    assert isinstance(got, Ids) and [None if g is None else g.tolist() for g in got] == rows
    assert [g.tolist() for g in f.read(0, 2, 4, "ids", n_vocab=10)] == [[5, 6, 7], []]
    with pytest.raises(DataError, match=r"row 2: token id 7 is outside the tokenizer's vocabulary \[0, 7\)"):
        f.read(0, 0, 5, "ids", n_vocab=7)
