"""data/source.py: listing data files (directory, glob, list, file:// URI, nanochat's default
directory), the train/val split, and Reader reading rows and naming the file and row
group of every bad input (no text column, non-string text, truncated, not parquet, missing,
corrupt data page, invalid UTF-8). All data lives in tmp_path."""

import ast
import os
import re
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shmloader.errors import DataError
from shmloader.data.source import Reader, list_files, split_files
from shmloader.demo import corpus


def write(path, texts, row_group_size=None, schema=None):
    table = pa.table({"text": texts}) if schema is None else pa.table(texts, schema=schema)
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def test_list_files_directory_sorted_and_parquet_only(tmp_path):
    for name in ["b.parquet", "a.parquet", "c.parquet", "notes.txt", "a.parquet.tmp"]:
        (tmp_path / name).write_bytes(b"x")
    got = list_files(tmp_path)
    assert got == [os.path.join(str(tmp_path), n) for n in ["a.parquet", "b.parquet", "c.parquet"]]
    assert list_files(str(tmp_path)) == got


def test_list_files_glob_and_list(tmp_path):
    for name in ["s2.parquet", "s10.parquet", "s1.parquet", "t1.parquet"]:
        (tmp_path / name).write_bytes(b"x")
    got = list_files(str(tmp_path / "s*.parquet"))
    assert [os.path.basename(f) for f in got] == ["s1.parquet", "s10.parquet", "s2.parquet"]
    paths = [str(tmp_path / n) for n in ["t1.parquet", "s2.parquet", "s1.parquet"]]
    assert list_files(paths) == sorted(paths)
    assert list_files([tmp_path / "s1.parquet"]) == [str(tmp_path / "s1.parquet")]


def test_a_path_that_exists_is_never_a_glob(tmp_path):
    """`set[1]/` beside `set1/`: a name with `*?[` that exists is that file or directory (a glob
    read `set[1]/shard_00002.parquet` as set1's, another data set, and found no shard in
    `br[ack]et/`); a glob is a path by which nothing exists, its existing leading part literal."""
    def shards(name, n=3):
        (tmp_path / name).mkdir()
        return [write(tmp_path / name / f"shard_{i:05d}.parquet", [f"{name} {i}"]) for i in range(n)]

    bracket, plain, odd = shards("set[1]"), shards("set1"), shards("br[ack]et", 2)
    star = shards("a*b", 2)
    assert list_files(bracket[2]) == [bracket[2]]
    assert list_files(str(tmp_path / "set[1]")) == bracket and list_files(tmp_path / "set[1]") == bracket
    assert list_files(str(tmp_path / "br[ack]et")) == odd
    assert list_files(str(tmp_path / "a*b")) == star and list_files("file://" + star[1]) == [star[1]]
    assert list_files(str(tmp_path / "set[1]" / "*.parquet")) == bracket  # the existing directory, then a glob
    assert list_files(str(tmp_path / "set?" / "*.parquet")) == plain  # nothing by that name: a glob
    assert list_files(str(tmp_path / "set[12]" / "shard_0000[01].parquet")) == plain[:2]
    assert list_files([bracket[2], plain[0], odd[1]]) == sorted([bracket[2], plain[0], odd[1]])  # a list's entries
    with pytest.raises(DataError, match=r"no data files match .*set\[2\].*read as a glob"):
        list_files(str(tmp_path / "set[2]" / "shard_00000.parquet"))


def test_list_files_local_file_uris(tmp_path):
    for name in ["b.parquet", "a.parquet"]:
        (tmp_path / name).write_bytes(b"x")
    expected = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert list_files("file://" + str(tmp_path)) == expected
    assert list_files(["file://" + p for p in reversed(expected)]) == expected


def test_list_files_single_file(tmp_path):
    path = write(tmp_path / "one.parquet", ["a"])
    assert list_files(path) == [path]


def test_list_files_missing_dir(tmp_path):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(DataError, match=re.escape(str(missing))):
        list_files(missing)


def test_list_files_dir_without_parquet(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(DataError, match="parquet"):
        list_files(tmp_path)
    with pytest.raises(DataError):
        list_files(str(tmp_path / "*.parquet"))
    with pytest.raises(DataError):
        list_files([])


def test_list_files_default_is_nanochat_base_data(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))
    with pytest.raises(DataError, match=re.escape(os.path.join(str(tmp_path), "base_data"))):
        list_files(None)
    corpus.write_shards(["a", "b", "c"], tmp_path / "base_data", num_files=2)
    assert [os.path.basename(f) for f in list_files(None)] == ["shard_00000.parquet", "shard_00001.parquet"]


def test_split_files():
    files = ["a", "b", "c"]
    assert split_files(files, "train") == ["a", "b"]
    assert split_files(files, "val") == ["c"]
    assert split_files(["a", "b"], "train") == ["a"]
    assert split_files(["a"], "val") == ["a"]
    assert split_files(files, "all") == files and split_files(["a"], "all") == ["a"]
    with pytest.raises(DataError, match="2 files.*split='all'"):
        split_files(["a"], "train")
    with pytest.raises(ValueError, match="split must be one of 'train' .*'val' .*'all' \\(every file\\), got 'test'"):
        split_files(files, "test")


def test_the_config_accepts_the_splits_source_knows():
    from shmloader import config
    from shmloader.data import source

    assert config.SPLITS == tuple(source.SPLITS)


def test_text_bytes_are_each_row_group_s_text_size(tmp_path):
    """The footer's column sizes order row groups by their text: a row group of one 50,000-
    character document outweighs one of 100 short ones (pieces are cut by them: data/order.py)."""
    docs = ["x" * 50_000] + ["short text"] * 100 + ["y" * 30] * 3
    (path,) = corpus.write_shards(docs, tmp_path, num_files=1, row_group_size=[1, 100, 3])
    src = Reader([str(path)])
    sizes = src.text_bytes(0)
    assert src.row_counts(0) == [1, 100, 3] and len(sizes) == 3
    for size, text in zip(sizes, (50_000, 1_000, 90)):
        assert text <= size <= text + 4 * 100 + 200, sizes  # the text, plus lengths and headers
    no_text = tmp_path / "other.parquet"
    pq.write_table(pa.table({"body": ["a", "b"]}), no_text)
    assert Reader([str(no_text)]).text_bytes(0) == [0]


def test_a_mixture_keeps_two_files_open_a_source(tmp_path, monkeypatch):
    """A mixture's processes read its sources in turn, each in its own file: 2 open files a
    source, so that 3 sources of 2 files each, read in turn, open each file once (4 closed and
    reopened a footer at nearly every piece)."""
    from shmloader.data.source import KEEP_OPEN
    from shmloader.data.sources import keep_open
    paths = [write(tmp_path / f"{i}.parquet", ["a", "b", "c", "d"], row_group_size=1) for i in range(6)]
    opened = []
    real = pq.ParquetFile
    monkeypatch.setattr(pq, "ParquetFile", lambda path, **kw: opened.append(path) or real(path, **kw))
    assert KEEP_OPEN == 4 and keep_open(1) == 4 and keep_open(3) == 6
    for keep, times in ((KEEP_OPEN, 4 * 6), (keep_open(3), 6)):
        opened.clear()
        src = Reader(paths, keep_open=keep)
        for rg in range(4):
            for f in range(6):  # every source's two files in turn
                assert src.read_texts(f, rg, 0, 1) == [["a", "b", "c", "d"][rg]]
        assert len(opened) == times


def test_parquet_source_reads_rows_with_nulls(tmp_path):
    docs = ["d0", None, "d2", "", "d4", "d5", "d6"]
    (path,) = corpus.write_shards(docs, tmp_path, num_files=1, row_group_size=[3, 4])
    src = Reader([str(path)])
    assert src.row_counts(0) == [3, 4]
    assert src.read_texts(0, 0, 0, 3) == ["d0", None, "d2"]
    assert src.read_texts(0, 1, 1, 3) == ["d4", "d5"]
    assert src.read_texts(0, 0, 2, 3) == ["d2"]  # back to an earlier row group
    assert src.read_texts(0, 1, 0, 4) == ["", "d4", "d5", "d6"]


def test_parquet_source_large_string_is_fine(tmp_path):
    schema = pa.schema([("text", pa.large_string())])
    path = write(tmp_path / "l.parquet", {"text": ["x", "y"]}, schema=schema)
    assert Reader([path]).read_texts(0, 0, 0, 2) == ["x", "y"]


def test_no_text_column_names_file_and_row_group(tmp_path):
    path = str(tmp_path / "notext.parquet")
    pq.write_table(pa.table({"content": ["a", "b", "c"]}), path, row_group_size=1)
    src = Reader([path])
    assert src.row_counts(0) == [1, 1, 1]
    with pytest.raises(DataError) as ei:
        src.read_texts(0, 2, 0, 1)
    msg = str(ei.value)
    assert path in msg and "row group 2" in msg and "'text'" in msg and "content" in msg


def test_int_text_column_is_a_data_error(tmp_path):
    path = str(tmp_path / "ints.parquet")
    pq.write_table(pa.table({"text": [1, 2, 3]}), path, row_group_size=2)
    with pytest.raises(DataError) as ei:
        Reader([path]).read_texts(0, 1, 0, 1)
    msg = str(ei.value)
    assert path in msg and "row group 1" in msg and "int64" in msg and "string" in msg


def test_truncated_file_is_a_data_error_naming_it(tmp_path):
    good = corpus.write_shards([f"doc {i}" for i in range(200)], tmp_path, num_files=1,
                               row_group_size=50)[0]
    data = good.read_bytes()
    bad = tmp_path / "truncated.parquet"
    bad.write_bytes(data[: len(data) // 2])
    src = Reader([str(good), str(bad)])
    assert src.row_counts(0) == [50, 50, 50, 50]
    with pytest.raises(DataError, match=re.escape(str(bad))):
        src.row_counts(1)
    with pytest.raises(DataError, match=re.escape(str(bad))):
        Reader([str(bad)]).read_texts(0, 0, 0, 1)


def test_non_parquet_file_is_a_data_error_naming_it(tmp_path):
    bad = tmp_path / "junk.parquet"
    bad.write_text("this is not parquet\n" * 100)
    with pytest.raises(DataError, match=re.escape(str(bad))):
        Reader([str(bad)]).row_counts(0)
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=re.escape(str(empty))):
        Reader([str(empty)]).row_counts(0)


def test_missing_file_is_a_data_error_naming_it(tmp_path):
    gone = tmp_path / "gone.parquet"
    with pytest.raises(DataError, match=re.escape(str(gone))):
        Reader([str(gone)]).row_counts(0)


def test_corrupt_data_page_is_a_data_error_naming_file_and_row_group(tmp_path):
    # footer intact, the bytes of the data pages overwritten: opening works, reading fails
    path = tmp_path / "pages.parquet"
    texts = [f"document number {i} " * 20 for i in range(100)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=50, compression="snappy")
    md = pq.ParquetFile(path).metadata
    col = md.row_group(1).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    raw = bytearray(path.read_bytes())
    raw[start:start + col.total_compressed_size] = b"\xff" * col.total_compressed_size
    path.write_bytes(bytes(raw))
    src = Reader([str(path)])
    assert src.read_texts(0, 0, 0, 2) == texts[:2]  # row group 0 is intact
    with pytest.raises(DataError) as ei:
        src.read_texts(0, 1, 0, 1)
    assert str(path) in str(ei.value) and "row group 1" in str(ei.value)


def test_invalid_utf8_is_a_data_error_naming_file_and_row_group(tmp_path):
    path = str(tmp_path / "bad_utf8.parquet")
    offsets = pa.py_buffer(np.array([0, 2, 4], dtype=np.int32).tobytes())
    arr = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"ok\xff\xfe")])
    pq.write_table(pa.table({"text": arr}), path)
    src = Reader([path])
    assert src.read_texts(0, 0, 0, 1) == ["ok"]
    with pytest.raises(DataError) as ei:
        src.read_texts(0, 0, 0, 2)
    assert path in str(ei.value) and "row group 0" in str(ei.value) and "UTF-8" in str(ei.value)


def _hf_layouts(tmp_path):
    """A saved Dataset (datasets 5.2.0's save_to_disk), a DatasetDict of two of them, a cache directory."""
    from tests import formats_data
    saved = formats_data.write_hf_saved(str(tmp_path / "saved"), [["a 1", "a 2"], ["b 1"], ["c 1"]])
    for split in ("train", "validation"):
        formats_data.write_hf_saved(str(tmp_path / "dd" / split), [[f"{split} 1"]])
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "validation"]}')
    return saved


@pytest.mark.parametrize("remote", [False, True])
def test_a_hugging_face_saved_dataset_reads_its_data_files_never_its_metadata(tmp_path, remote):
    """issue 51: state.json and dataset_info.json were read as JSON Lines (the run failed at the end
    of the Arrow data; split="train" made state.json the val file)."""
    import pyarrow.fs as pafs
    fs = pafs.LocalFileSystem() if remote else None  # an explicit filesystem lists as a remote one
    saved = _hf_layouts(tmp_path)
    got = list_files(str(tmp_path / "saved"), fs)
    assert got == saved and [os.path.basename(f) for f in split_files(got, "val")] == ["data-00002-of-00003.arrow"]
    train = tmp_path / "dd" / "train"
    assert list_files(str(train), fs) == [str(train / "data-00000-of-00001.arrow")]
    with pytest.raises(DataError, match=r"dd: a Hugging Face DatasetDict saved by save_to_disk \(dataset_dict\.json, "
                                        r"splits train, validation\).*give one split's directory, e\.g\. "
                                        r"data='.*dd/train'"):
        list_files(str(tmp_path / "dd"), fs)
    os.remove(saved[1])
    with pytest.raises(DataError, match=r"saved: state\.json lists 3 data file\(s\), 1 not in the directory "
                                        r"\(\['data-00001-of-00003\.arrow'\]\): the save is incomplete"):
        list_files(str(tmp_path / "saved"), fs)


def test_a_datasets_cache_directory_leaves_out_map_outputs_and_wants_one_split(tmp_path):
    """A `load_dataset(cache_dir=)` directory: `<builder>-<split>.arrow`, dataset_info.json and
    `.map()`'s `cache-<hash>.arrow` (a derived table): its split's files only, with a notice."""
    import json
    from tests import formats_data
    d = tmp_path / "cache"
    for name in ("json-train-00000-of-00002.arrow", "json-train-00001-of-00002.arrow", "cache-365548b7c51ff164.arrow"):
        formats_data.write(str(d / name), ["x 1"], "arrow-stream")
    (d / "dataset_info.json").write_text(json.dumps({"builder_name": "json", "splits": {"train": {"name": "train"}}}))
    with pytest.warns(UserWarning, match=r"left out cache-365548b7c51ff164\.arrow"):
        got = list_files(str(d))
    assert [os.path.basename(f) for f in got] == ["json-train-00000-of-00002.arrow", "json-train-00001-of-00002.arrow"]
    formats_data.write(str(d / "json-test.arrow"), ["y 1"], "arrow-stream")
    (d / "dataset_info.json").write_text(json.dumps({"splits": {"train": {}, "test": {}}}))
    with pytest.raises(DataError, match=r"cache directory with files of 2 splits \(test, train\); read one split by a "
                                        r"glob of its files, e.g. data='.*cache/\*-train\*\.arrow'"):
        list_files(str(d))
    assert [os.path.basename(f) for f in list_files(str(d / "*-train*.arrow"))] == [os.path.basename(f) for f in got]


def test_a_remote_datasets_cache_directory_of_two_splits_is_told_the_list_of_one_splits_files(tmp_path):
    """A remote path is never a glob: the cache directory's refusal says the list of the train
    split's files, and that list, followed, reads them (it said a glob, which a URI refuses)."""
    import json
    import pyarrow.fs as pafs
    from tests import formats_data
    fs, d = pafs.LocalFileSystem(), tmp_path / "cache"
    for name in ("json-train-00000-of-00002.arrow", "json-train-00001-of-00002.arrow", "json-test.arrow"):
        formats_data.write(str(d / name), ["x 1"], "arrow-stream")
    (d / "dataset_info.json").write_text(json.dumps({"splits": {"train": {}, "test": {}}}))
    advice = r"read one split by the list of its files, e\.g\. data=(\[.*\])"
    with pytest.raises(DataError, match=r"cache directory with files of 2 splits \(test, train\); " + advice) as refused:
        list_files(str(d), fs)
    told = ast.literal_eval(re.search(advice, str(refused.value)).group(1))
    assert [os.path.basename(f) for f in list_files(told, fs)] == ["json-train-00000-of-00002.arrow",
                                                                  "json-train-00001-of-00002.arrow"]


@pytest.mark.parametrize("remote", [False, True])
def test_hub_shards_of_several_splits_in_one_directory_are_refused_saying_which_glob(tmp_path, remote):
    """A Hugging Face Hub repository's `data/` (`push_to_hub`: `<split>-0000N-of-0000M[-<hash>].parquet`)
    given as a directory was one corpus: `split="train"` read every file but the last by name,
    `test-*` first, so the run trained on the test split and validated on `validation-*`."""
    import pyarrow.fs as pafs
    fs = pafs.LocalFileSystem() if remote else None
    d = tmp_path / "data"
    d.mkdir()
    for name in ("test-00000-of-00001-9f1c2a.parquet", "train-00000-of-00002-3b7d0e.parquet",
                 "train-00001-of-00002-3b7d0e.parquet", "validation-00000-of-00001-c41a55.parquet"):
        write(d / name, ["x"])
    advice = (r"read one split by the list of its files, e\.g\. data=(\[.*\]) with split='all'" if remote else
              r"read one split by a glob of its files, e\.g\. data=('.*data/train-\*\.parquet') with split='all'")
    with pytest.raises(DataError, match=r"data: Hugging Face Hub shards of 3 splits \(test, train, validation\).*"
                                        r"the other splits' too\); " + advice) as refused:
        list_files(str(d), fs)
    train = list_files(str(d / "train-*.parquet"))
    told = ast.literal_eval(re.search(advice, str(refused.value)).group(1))
    assert list_files(told, fs) == train  # the advice, followed, reads the train split (a remote list: never a glob)
    assert [os.path.basename(f) for f in train] == ["train-00000-of-00002-3b7d0e.parquet",
                                                   "train-00001-of-00002-3b7d0e.parquet"]
    for f in (d / "test-00000-of-00001-9f1c2a.parquet", d / "validation-00000-of-00001-c41a55.parquet"):
        f.unlink()
    assert list_files(str(d), fs) == [str(d / os.path.basename(f)) for f in train]  # one split: read as it is
    cfg = tmp_path / "cfg"  # a config's name before the split's, as the Hub's parquet conversion names them
    cfg.mkdir()
    for name in ("wikitext-103-raw-v1-test-00000-of-00001.parquet", "wikitext-103-raw-v1-train-00000-of-00001.parquet"):
        write(cfg / name, ["x"])
    name = "wikitext-103-raw-v1-train-00000-of-00001" if remote else "wikitext-103-raw-v1-train-*"
    with pytest.raises(DataError, match=rf"2 splits \(test, train\).*data=\[?'.*cfg/{re.escape(name)}\.parquet'"):
        list_files(str(cfg), fs)
    write(d / "de-00000-of-00001.parquet", ["y"])  # shards of other names (languages): one corpus
    assert [os.path.basename(f) for f in list_files(str(d), fs)] == ["de-00000-of-00001.parquet"] + [
        os.path.basename(f) for f in train]


def test_a_state_json_of_ones_own_is_no_hugging_face_directory(tmp_path):
    """Only `state.json` with `_data_files` (or dataset_info.json, dataset_dict.json) marks one."""
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "state.json").write_text('{"version": 6}\n')
    assert [os.path.basename(f) for f in list_files(str(tmp_path))] == ["a.jsonl", "state.json"]


def test_a_readers_kind_of_a_file_is_its_columns_or_unknown_where_it_cannot_say(tmp_path):
    """`Reader.kind`, the token cache's key (data/cache.py `File.of`): token ids or text as the
    file's schema says; unknown where the file cannot be opened, lacks the column, or its first
    lines say nothing (a JSON Lines file of nulls first: the review found it keyed as text, the
    key of token ids before their BOS rule), never an error on the way to the cache, and the
    cache keys unknown as not text."""
    ids, text, bad = tmp_path / "ids.parquet", tmp_path / "text.parquet", tmp_path / "bad.parquet"
    pq.write_table(pa.table({"ids": pa.array([[1, 2]], pa.list_(pa.int64()))}), ids)
    pq.write_table(pa.table({"content": ["x"]}), text)
    bad.write_bytes(b"not parquet")
    nulls = tmp_path / "nulls.jsonl"
    nulls.write_text('{"ids": null}\n' * 1100 + '{"ids": [5, 1, 2]}\n' * 10)
    reader = Reader([str(ids), str(text), str(bad), str(ids), str(nulls)], columns=["ids", "content", "ids", "other", "ids"])
    assert [reader.kind(f) for f in range(5)] == ["tokens", "text", "unknown", "unknown", "unknown"]
    from shmloader.data import cache
    assert cache.identity(str(nulls), column="ids", kind="unknown") == cache.identity(str(nulls), column="ids", kind="tokens")
    assert cache.identity(str(nulls), column="ids", kind="unknown") != cache.identity(str(nulls), column="ids")


def test_a_list_of_directories_or_globs_says_what_to_pass_instead(tmp_path):
    """A list's entries are files: a directory in it, a glob (not expanded in a list) or a
    missing file is each named for what it is, with what to pass instead. It was "list the
    parquet shards themselves" for all three, also to a user of JSON Lines."""
    for d in ("web", "code"):
        (tmp_path / d).mkdir()
        corpus.write_shards(["a b", "c"], tmp_path / d, num_files=1)
    with pytest.raises(DataError) as got:
        list_files([str(tmp_path / "web"), str(tmp_path / "code")])
    msg = str(got.value)
    assert "2 path(s) that are not files" in msg and "/web (a directory)" in msg and "list the data files" in msg
    assert f"a glob over the directories, data='{tmp_path}/*/*.parquet'" in msg and "a shmloader.Mixture" in msg
    assert "parquet shards" not in msg
    with pytest.raises(DataError, match=r"web/\*\.jsonl \(a glob, which a list does not expand: pass it alone as "
                                        r"data=, or glob\.glob\(\) it\); list the data files"):
        list_files([str(tmp_path / "web" / "*.jsonl")])
    with pytest.raises(DataError, match=r"gone\.parquet \(no such file\); list the data files"):
        list_files([str(tmp_path / "gone.parquet")])


def test_a_path_beginning_with_a_tilde_is_told_to_be_expanded(tmp_path, monkeypatch):
    """`~/data` (pyarrow's readers expand it, shmloader does not) was "data directory ~/data does
    not exist", which it does under the home directory: each path that is not found says that a
    leading ~ is not expanded here and what to pass."""
    monkeypatch.setenv("HOME", str(tmp_path))
    corpus.write_shards(["a b", "c"], tmp_path / "data", num_files=1)
    hint = r"begins with ~, which is not expanded here: pass os\.path\.expanduser\('~/data.*'\)"
    for data in ("~/data", "~/data/*.parquet", ["~/data/shard_00000.parquet"]):
        with pytest.raises(DataError, match=hint):
            list_files(data)
    from shmloader.data.tokenizer import resolve
    with pytest.raises(FileNotFoundError, match=r"tokenizer not found at ~/tok\.pkl \(~/tok\.pkl begins with ~"):
        resolve("~/tok.pkl")


def test_a_remote_listing_that_fails_in_the_filesystem_s_transport_is_a_data_error_naming_the_uri(tmp_path):
    """`hf://datasets/...` (pyarrow's fsspec Hugging Face filesystem) without network raised the
    transport's own `httpcore.ConnectError`, naming neither the data nor what to check; a glob of a
    remote path (as pandas and DuckDB take `hf://.../*.parquet`) was "not found" alone."""
    import pyarrow.fs as pafs
    pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    class Offline(MemoryFileSystem):  # an fsspec filesystem whose transport fails, as hf:// offline
        protocol = "hf"

        def info(self, path, **kwargs):
            raise RuntimeError("[Errno -2] Name or service not known")

    offline = pafs.PyFileSystem(pafs.FSSpecHandler(Offline()))
    with pytest.raises(DataError, match=r"hf://datasets/org/corpus: cannot list it on py::fsspec\+hf \(RuntimeError: "
                                        r"\[Errno -2\] Name or service not known\); check the endpoint, the network"):
        list_files("hf://datasets/org/corpus", offline)
    write(tmp_path / "a.parquet", ["x"])
    with pytest.raises(DataError, match=r"not found on local: check the bucket and prefix \(a remote path is never a "
                                        r"glob: give the directory, or a list of its files\)"):
        list_files(str(tmp_path / "*.parquet"), pafs.LocalFileSystem())


def test_split_val_over_a_held_out_set_s_files_warns_that_it_reads_the_last_alone():
    """A separate validation directory (or a Hub download's `validation-*` shards) given with
    `split="val"`, as a user names it, read its last file alone, silently: nanochat's val split is
    the last file of the one directory."""
    import warnings
    for files, named in ((["/d/validation/a.parquet", "/d/validation/b.parquet"], "/d/validation"),
                         (["/d/data/validation-00000-of-00002.parquet", "/d/data/validation-00001-of-00002.parquet"],
                          "the 'validation' split")):
        with pytest.warns(UserWarning, match=rf"split='val' reads the last of the 2 files of {re.escape(named)} "
                                             rf"\({os.path.basename(files[-1])}\).*pass split='all'"):
            assert split_files(files, "val") == files[-1:]
        assert split_files(files, "all") == files
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert split_files(["/d/shards/s0.parquet", "/d/shards/s1.parquet"], "val") == ["/d/shards/s1.parquet"]
        assert split_files(["/d/test/s0.parquet"], "val") == ["/d/test/s0.parquet"]


@pytest.mark.parametrize("splits, refused", [
    (("train_sft", "test_sft"), True), (("train", "validation_matched", "test_matched"), True),
    (("TRAIN", "TEST"), True), (("train", "validation"), True),
    (("en", "eval"), False), (("docs", "unit-test"), False), (("en", "de"), False)])
def test_hub_splits_are_held_out_by_their_kind_beside_a_train_split(splits, refused):
    """`test_sft` beside `train_sft` (an SFT repository), `validation_matched`/`test_matched` (MNLI)
    and `TRAIN`/`TEST` were read as one corpus (held out only by an exact lower-case name); subsets
    `en` beside `eval`, `docs` beside `unit-test` (`test` by the Hub's `<config>-<split>` reading)
    were refused though no train split is among them."""
    from shmloader.data import hfdir
    names = [f"{split}-0000{i}-of-00002.parquet" for split in splits for i in range(2)]
    if refused:
        pick = next(s for s in splits if s.lower().startswith("train"))
        with pytest.raises(DataError, match=rf"shards of {len(splits)} splits .*data='d/{pick}-\*\.parquet'"):
            hfdir.one_hub_split("d", names, remote=False)
    else:
        hfdir.one_hub_split("d", names, remote=False)
    for split in splits:  # one split's own files: held out by the same rule
        named = hfdir.held_out([f"d/{split}-0000{i}-of-00002.parquet" for i in range(2)])
        assert (named == f"the {split.split('-')[-1]!r} split") == (hfdir.split_kind(split.split('-')[-1])
                                                                  in hfdir.HELD_OUT), (split, named)
    assert hfdir.held_out(["d/test_sft-00000-of-00002.parquet", "d/test_sft-00001-of-00002.parquet"]) == \
        "the 'test_sft' split"
    assert hfdir.held_out(["d/TEST-00000-of-00002.parquet", "d/TEST-00001-of-00002.parquet"]) == "the 'TEST' split"


def test_split_val_warns_of_a_held_out_directory_only_where_its_name_says_so():
    """The warning fired for any directory named test/, dev/ or eval/ (`/home/u/test/shard_*.parquet`,
    a user's own scratch directory): only validation/, valid/ and val/ say a held-out set."""
    import warnings
    for where in ("/home/u/test", "/home/u/dev", "/home/u/eval"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert split_files([f"{where}/shard_0.parquet", f"{where}/shard_1.parquet"], "val") == \
                [f"{where}/shard_1.parquet"]
    with pytest.warns(UserWarning, match=r"split='val' reads the last of the 2 files of /d/valid "):
        split_files(["/d/valid/a.parquet", "/d/valid/b.parquet"], "val")


# ----------------------------------------------------------------
# split='train' (the default) over the files of one named split, a Hub download's
# `train-0000N-of-0000M` shards (a data set with a train split alone) or a `train/` directory,
# left its last shard out as nanochat's val file without a word: a 2-shard download trained on
# half of it. It is said, with split='all' to read every file; a held-out set's files
# (validation/, `validation-*` shards) trained on say so too. nanochat's own `shard_NNNNN.parquet`
# directory says nothing.

@pytest.mark.parametrize("files, named, held", [
    (["/d/data/train-00000-of-00002.parquet", "/d/data/train-00001-of-00002.parquet"], "the 'train' split", False),
    (["/d/fw/train/000_00000.parquet", "/d/fw/train/000_00001.parquet", "/d/fw/train/001_00000.parquet"], "/d/fw/train",
     False),
    (["/d/validation/a.jsonl", "/d/validation/b.jsonl"], "/d/validation", True),
    (["/d/data/test-00000-of-00002.parquet", "/d/data/test-00001-of-00002.parquet"], "the 'test' split", True),
    (["/d/x/validation-00000-of-00002.parquet", "/d/x/validation-00001-of-00002.parquet"], "the 'validation' split",
     True),
    # files named by a held-out split alone, not numbered as the Hub numbers them: read as one corpus, unsaid
    (["/d/x/val-00000.parquet", "/d/x/val-00001.parquet", "/d/x/val-00002.parquet"], "the 'val' split", True),
    (["/d/x/validation_0.jsonl.zst", "/d/x/validation_1.jsonl.zst"], "the 'validation' split", True),
    (["/d/x/test.arrow", "/d/x/test_1.arrow"], "the 'test' split", True),
    (["/d/x/train-0.parquet", "/d/x/train-1.parquet"], "the 'train' split", False),
])
def test_split_train_over_one_named_split_says_it_leaves_out_the_last_file(files, named, held):
    """A held-out set's files (`validation/`, `test-*`, `validation-*`) trained on are said to be
    a held-out set's, not only told split='all'."""
    said = ("these are a held-out set's files, not a training set's \\(to train, give a training set's files as "
            "data=\\); " if held else "")
    with pytest.warns(UserWarning, match=rf"split='train' reads every file but the last of the {len(files)} files of "
                                         rf"{re.escape(named)}: {said}{re.escape(os.path.basename(files[-1]))} is "
                                         rf"left out as nanochat's val file .*pass split='all'") as got:
        assert split_files(files, "train") == files[:-1]
    assert ("held-out" in str(got[0].message)) == held
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert split_files(files, "all") == files


@pytest.mark.parametrize("files", [
    [f"/d/saved/data-0000{i}-of-00002.arrow" for i in range(2)],  # `Dataset.save_to_disk`'s: no split's name
    [f"/d/hub/en-0000{i}-of-00002.parquet" for i in range(2)],    # a subset's shards, not a split's
])
def test_split_train_over_shards_whose_name_is_no_split_names_none(files):
    """`data-0000N-of-0000M.arrow` was warned of as "the 'data' split" and `en-*` as "the 'en'
    split": only names `hfdir.split_kind` knows (train, held out) name a split."""
    from shmloader.data import hfdir
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert split_files(files, "train") == files[:-1]
    assert hfdir.named_split(files) is None and hfdir.held_out(files) is None


def test_split_train_over_nanochat_shards_says_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        files = [f"/d/base_data/shard_{i:05d}.parquet" for i in range(3)]
        assert split_files(files, "train") == files[:-1]
        assert split_files(["/d/x/a-00000-of-00002.jsonl", "/d/x/b.jsonl"], "train") == ["/d/x/a-00000-of-00002.jsonl"]


def test_one_held_out_file_for_split_train_is_refused_in_words_that_say_what_to_do():
    """nanochat's val shard alone (FineWeb-Edu-100B's last, shard_01822.parquet), or one file
    named by a held-out split: split='train' was refused with "pass split='all'", which trains
    on it; now the error says it is a held-out set's and to give the training files."""
    for path, named in (("/d/nc/shard_01822.parquet", "nanochat's val shard"), ("/d/x/val.parquet", "the 'val' split")):
        with pytest.raises(DataError, match=rf"found 1: .*these are {named}.*a held-out set's, not a training set's: "
                                            rf"give the training files as data="):
            split_files([path], "train")
    with pytest.raises(DataError, match=r"for a directory that is one split, pass split='all'"):
        split_files(["/d/x/shard_00000.parquet"], "train")


def test_names_that_are_no_split_say_nothing():
    """nanochat's own shards (its last among others), save_to_disk's data-*, a subset's en-*,
    words that merely begin like a split (`values-0`, `testing_1`): nothing said."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for names in (("shard_01821.parquet", "shard_01822.parquet"), ("data-00000-of-00002.arrow", "data-00001-of-00002.arrow"),
                      ("en-00000.parquet", "en-00001.parquet"), ("values-0.parquet", "values-1.parquet"),
                      ("testing_1.jsonl", "testing_2.jsonl"), ("val-a.parquet", "val-b.parquet")):
            files = [f"/d/x/{n}" for n in names]
            assert split_files(files, "train") == files[:-1], names


@pytest.mark.parametrize("names, refused", [
    (("train.parquet", "test.parquet"), ("test", "train")),
    (("train_0.jsonl", "train_1.jsonl", "val_0.jsonl"), ("train", "val")),
    (("TRAIN.parquet", "validation.parquet", "test.parquet"), ("TRAIN", "test", "validation")),
    (("train-00000-of-00001.parquet", "test.parquet"), ("test", "train")),
    (("training.parquet", "test.parquet"), ("test", "training")),
    (("Training_0.jsonl", "dev_0.jsonl"), ("Training", "dev")),
    (("train.parquet",), None), (("test.parquet", "shard_00000.parquet"), None),
    (("en.parquet", "de.parquet"), None), (("data-0.parquet", "test.parquet"), None)])
def test_files_named_by_their_splits_beside_a_train_split_are_refused(tmp_path, names, refused):
    """`train.parquet` beside `test.parquet` (a `Dataset.to_parquet` per split) was read as one
    corpus: split='train' trained on test.parquet (it sorts first) and validated on train.parquet,
    silently (`training.parquet` beside `test.parquet` still was, until `hfdir.TRAIN_NAMES`); only
    Hub shards of several splits were refused. Now any files named by their splits,
    a train split's among them, are refused with the list of the train split's files, which,
    followed, reads them alone; files of no train split, or of no split, are one corpus as before."""
    d = tmp_path / "data"
    d.mkdir()
    for name in names:
        if name.endswith(".parquet"):
            write(d / name, [name])
        else:
            (d / name).write_text('{"text": "%s"}\n' % name)
    if refused is None:
        assert [os.path.basename(f) for f in list_files(str(d))] == sorted(names)
        return
    with pytest.raises(DataError, match=rf"data: .* of {len(refused)} splits(, as their names say,)? "
                                        rf"\({', '.join(refused)}\); .*"
                                        r"read one split by the list of its files, e\.g\. data=(\[.*\]) with "
                                        r"split='all'") as told:
        list_files(str(d))
    picked = ast.literal_eval(re.search(r"data=(\[.*?\])", str(told.value)).group(1))
    assert sorted(os.path.basename(f) for f in list_files(picked)) == sorted(
        n for n in names if n.lower().startswith("train")), picked


def test_the_refusal_lists_every_train_split_of_a_suffix(tmp_path):
    """`train_en` and `train_de` beside `test_en`: the advice named `train_de` alone."""
    d = tmp_path / "data"
    d.mkdir()
    for name in ("train_en.parquet", "train_de.parquet", "test_en.parquet"):
        write(d / name, [name])
    with pytest.raises(DataError, match=r"data=(\[.*\])") as told:
        list_files(str(d))
    picked = ast.literal_eval(re.search(r"data=(\[.*?\])", str(told.value)).group(1))
    assert sorted(os.path.basename(f) for f in picked) == ["train_de.parquet", "train_en.parquet"]
