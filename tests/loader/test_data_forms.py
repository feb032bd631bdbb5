"""Data in the forms users have it (docs/contract.md §2, §4): any string-like `text` column,
a bad schema warned of early and by name (and raised where the run reaches it), directories
and dot-files that only look like shards, and a `cache_dir` that cannot be one, refused in the
caller's process.

Every stream is checked against the oracle (tests/oracle.py) on token = position data.
"""
import itertools
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shmloader
from tests import helpers, oracle
from tests.helpers import loader_children, shm_segments, window_of

B, T = 2, 16


def shards(root, lengths, num_files=4, rg=8) -> list[str]:
    return helpers.position_shards(root, lengths, num_files, rg)


def loader(data, **kw):
    kw.setdefault("num_workers", 2)
    return shmloader.ShmLoader(data if isinstance(data, list) else str(data), helpers.IntTokenizer(), B, T,
                               kw.pop("split", "train"), device="cpu",
                               timeout=30, **kw)


def expected(files, n):
    tok = helpers.IntTokenizer()
    return [w for w, _ in itertools.islice(oracle.concat_windows(files, tok.encode, 0, B, T), n)]


def rewrite_text_as(path, kind):
    """Rewrite `path` with its `text` column as a dictionary or string_view column (same rows,
    same row groups)."""
    pf = pq.ParquetFile(path)
    sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
    texts = pf.read(columns=["text"]).column("text").to_pylist()
    column = pa.array(texts).dictionary_encode() if kind == "dictionary" else pa.array(texts, pa.string_view())
    table = pa.table({"text": column})
    with pq.ParquetWriter(path, table.schema) as w:
        at = 0
        for n in sizes:
            w.write_table(table.slice(at, n), row_group_size=n)
            at += n


@pytest.mark.parametrize("kind", ["dictionary", "string_view"])
def test_any_string_like_text_column_is_read_as_text(tmp_path, kind):
    paths = shards(tmp_path, [(i * 7) % 23 for i in range(200)])
    for p in paths:
        rewrite_text_as(p, kind)
    assert str(pq.ParquetFile(paths[0]).schema_arrow.field("text").type).startswith(kind[:6])
    want = expected(paths[:-1], 20)
    with loader(tmp_path) as ld:
        got = [window_of(*next(ld)) for _ in range(20)]
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def _int_text(path):
    rows = pq.ParquetFile(path).metadata.num_rows
    pq.write_table(pa.table({"text": list(range(rows))}), path, row_group_size=8)


def test_a_bad_schema_far_into_the_run_is_reported_early_by_name(tmp_path):
    """The bad file is the last train file, ~100 batches into the stream: the coordinator's
    check of every footer warns of it, by name, within the first batches, and next() raises it
    where the run reaches the file (the first batch whose next token is the file's), after the
    oracle's batches before it (docs/contract.md §4)."""
    paths = shards(tmp_path, [5] * 1000, num_files=5)
    _int_text(paths[3])
    reach = (sum(1 for _ in oracle.documents(paths[:3], epochs=1)) * 6 - 1) // (B * T + 1)
    assert reach > 100
    got, early = [], None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with loader(tmp_path) as ld:
            with pytest.raises(shmloader.DataError) as ei:
                for k in range(reach + 1):
                    got.append(window_of(*next(ld)))
                    if k == 30:
                        early = [str(w.message) for w in caught]
    assert any(paths[3] in w and "int64" in w and "checked ahead" in w for w in early), early
    msg = str(ei.value)
    assert paths[3] in msg and "int64" in msg and "row group" in msg and "worker" in msg, msg
    assert len(got) == reach, f"raised after {len(got)} batches; the run reaches the file at {reach}"
    assert all(np.array_equal(g, w) for g, w in zip(got, expected(paths[:3], reach)))


def test_a_bad_schema_is_still_skipped_when_asked(tmp_path):
    paths = shards(tmp_path, [5] * 400, num_files=5)
    _int_text(paths[2])
    want = expected([paths[0], paths[1], paths[3]], 60)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with loader(tmp_path, on_bad_row_group="skip") as ld:
            got = [window_of(*next(ld)) for _ in range(60)]
    assert all(np.array_equal(g, w) for g, w in zip(got, want)), "the stream is not the one without the file"
    assert any(paths[2] in str(w.message) for w in caught)


def test_directories_and_dot_files_named_parquet_are_not_shards(tmp_path):
    """A Spark-style `x.parquet/` directory sorted after the last shard would have become the
    val file, and the intended val shard trained on."""
    paths = shards(tmp_path / "data", [(i * 5) % 17 for i in range(160)])
    spark = tmp_path / "data" / "zz_part.parquet"
    spark.mkdir()
    pq.write_table(pa.table({"text": ["1 2 3"]}), spark / "part-0000.parquet")
    (tmp_path / "data" / ".zz_partial.parquet").write_bytes(b"not yet")
    for data in (tmp_path / "data", str(tmp_path / "data" / "*.parquet")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ld = loader(data, split="val")
        notice = [w for w in caught if "left out" in str(w.message)]
        assert len(notice) == 1 and "zz_part.parquet/ (a directory)" in str(notice[0].message), notice
        if not isinstance(data, str):  # a glob never matches a dot-file
            assert ".zz_partial.parquet (a dot-file)" in str(notice[0].message)
        assert notice[0].filename == __file__, "the notice points at shmloader, not at the caller's line"
        with ld:
            assert ld.files == paths[-1:]
            got = window_of(*next(ld))
        assert np.array_equal(got, expected(paths[-1:], 1)[0])
    with pytest.raises(shmloader.DataError, match="not files"):
        loader([*paths, str(spark)])


def test_a_directory_named_with_glob_characters_is_read_as_itself(tmp_path):
    """`set[1]/` beside `set1/`, another data set: `set[1]`, a file in it, a list of its files
    and a mixture's source are each read as the path they name, never as a glob matching set1."""
    paths = shards(tmp_path / "set[1]", [(i * 5) % 17 for i in range(160)])
    other = shards(tmp_path / "set1", [3] * 160)
    mixture = shmloader.Mixture({"a": str(tmp_path / "set[1]"), "b": str(tmp_path / "set1")}, {"a": 1, "b": 1})
    for data in (tmp_path / "set[1]", paths[-1], paths[1:]):
        with loader(data, split="val") as ld:
            assert ld.files == paths[-1:], data
    with shmloader.ShmLoader(mixture, helpers.IntTokenizer(), B, T, "val", device="cpu") as ld:
        assert ld.files == [paths[-1], other[-1]], ld.files
    with loader(tmp_path / "set[1]") as ld:
        got = [window_of(*next(ld)) for _ in range(3)]
    assert all(np.array_equal(g, w) for g, w in zip(got, expected(paths[:-1], 3)))


def test_cache_dir_that_cannot_be_a_directory_is_refused_at_construction(tmp_path):
    shards(tmp_path / "data", [5] * 40)
    a_file = tmp_path / "cache"
    a_file.write_text("x")
    for bad in (a_file, a_file / "sub"):
        with pytest.raises(ValueError, match="cache_dir .* (is a file|lies under a file)"):
            loader(tmp_path / "data", cache_dir=bad)
    assert loader_children() == [] and shm_segments() == [], "a refused loader started processes"
    missing = tmp_path / "new" / "cache"
    with loader(tmp_path / "data", cache_dir=missing, num_workers=1) as ld:
        next(ld)
    assert missing.is_dir()


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_long_document_in_a_later_piece_keeps_the_stream(tmp_path, packing):
    """A 100,000-token document (~590K characters, encoded beside the worker's loop) in the
    third piece of a run, with 2 workers: the stream is the oracle's, both packings."""
    lengths = [(i * 7) % 19 for i in range(300)]
    lengths[60] = 100_000
    paths = shards(tmp_path, lengths, num_files=3, rg=128)
    tok = helpers.IntTokenizer()
    n = 12
    with loader(tmp_path, packing=packing, buffer_size=8, tokenizer_batch_size=4) as ld:
        got = [next(ld) for _ in range(n)]
    if packing == "concat":
        assert all(np.array_equal(window_of(*b), w) for b, w in zip(got, expected(paths[:-1], n)))
    else:
        rows = [r for r, _ in itertools.islice(oracle.bestfit_rows(paths[:-1], tok.encode, 0, B, T, buffer_size=8,
                                                                   chunk_docs=4), n)]
        for (x, y), r in zip(got, rows):
            assert np.array_equal(x.numpy(), r[:, :-1]) and np.array_equal(y.numpy(), r[:, 1:])


def test_split_all_reads_every_file_and_resumes_exactly(tmp_path):
    """split="all": every file of the directory (one that is already a split), the last one
    too; a state names no val file, resumes exactly with another worker count; a directory
    of one file is a split "all" (split "train" refuses it, naming "all")."""
    lengths = [(i * 7) % 17 for i in range(160)]
    files = shards(tmp_path / "d", lengths)
    want = expected(files, 40)
    with loader(tmp_path / "d", split="all", num_workers=3) as ld:
        assert ld.files == files
        got = [window_of(x, y) for x, y in itertools.islice(ld, 20)]
        state = ld.state_dict()
    assert state["val"] is None and state["config"]["split"] == "all"
    with loader(tmp_path / "d", split="all", num_workers=1, resume_state=state) as ld:
        got += [window_of(x, y) for x, y in itertools.islice(ld, 20)]
    assert len(got) == 40 and all(np.array_equal(g, w) for g, w in zip(got, want))
    assert sum(len(w) for w in want) > sum(length + 1 for length in lengths[:120]), \
        "the compared windows reach the last file"
    with pytest.raises(ValueError, match="split"):  # another split's state is refused
        loader(tmp_path / "d", split="train", resume_state=state).close()
    one = shards(tmp_path / "one", lengths[:40], num_files=1)
    with pytest.raises(shmloader.DataError, match="split='all'"):
        loader(tmp_path / "one")
    with loader(tmp_path / "one", split="all") as ld:
        assert np.array_equal(window_of(*next(ld)), expected(one, 1)[0])
