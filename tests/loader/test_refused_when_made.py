"""What a client trips over, refused when the loader is made, before any process starts:

- a rank with no unit of its data (a parquet row group, an Arrow record batch, 1024 lines of
  JSON Lines), one source or a mixture's, in the files' order or shuffled: a 1-unit train
  split on 2 ranks, and a 2-unit one resumed on 3 ranks from a state of 2 (data/units.py), in
  the coordinator's words; the ranks that have one still read;
- a rank whose units hold no document (every one empty or all null), where the footers say so
  (parquet's row counts and null counts, an Arrow batch's header: data/units.py), in the
  coordinator's words, in the files' order and shuffled (the split's units all so); where they
  cannot say it (JSON Lines, a parquet file written without statistics) the coordinator still
  says it at the first `next()`;
- a file listed twice in a data list, a plain loader's or a mixture's source (a state knows a
  file by its name: a mixture's resume and a change of world size need each once), pointing to
  a `Mixture`'s weights for reading a source more often; the same file spelled two ways too.
"""
import itertools
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shmloader
from tests import formats_data, helpers

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 2, 8
SHUFFLED = dict(shuffle=True, seed=1, shuffle_window=4)
WORDS = "use fewer ranks or write files with more row groups (a unit is a parquet row group"


def texts(n: int, first: int = 1) -> list:
    return [f"{first + i} {first + i} 7 8 9" for i in range(n)]


def one_unit(root, fmt: str) -> str:
    """A split whose train file is one unit (and its val file)."""
    formats_data.write_set(str(root), [texts(5), texts(3, 100)], fmt)
    return str(root)


def two_units(root) -> str:
    """A split whose train file is two parquet row groups (and its val file)."""
    os.makedirs(root)
    for i in range(2):
        pq.write_table(pa.table({"text": texts(10, 100 * i)}), os.path.join(root, f"s{i}.parquet"), row_group_size=5)
    return str(root)


def loader(data, **kw):
    kw.setdefault("num_workers", 1)
    return shmloader.ShmLoader(data, helpers.IntTokenizer(), B, T, device="cpu", timeout=20, **kw)


def started_nothing():
    return helpers.loader_children() == [] and helpers.shm_segments() == []


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("kw", [{}, SHUFFLED], ids=["files-order", "shuffled"])
@pytest.mark.parametrize("mixed", [False, True], ids=["one-source", "mixture"])
def test_a_rank_without_a_unit_is_refused_when_the_loader_is_made(tmp_path, fmt, kw, mixed):
    small = one_unit(tmp_path / "small", fmt)
    data = shmloader.Mixture({"big": two_units(tmp_path / "big"), "small": small}, {"big": 1, "small": 1}) \
        if mixed else small
    named = "mixture source 'small': " if mixed else ""
    what = "unit of the shuffled order" if kw else "row group in any of the 1 files"
    with pytest.raises(shmloader.DataError, match=f"^{named}rank 1 of 2 has no {what}") as info:
        loader(data, rank=1, world_size=2, **kw)
    assert WORDS in str(info.value) and "1024 lines of JSON Lines" in str(info.value)
    assert started_nothing()
    with loader(data, rank=0, world_size=2, **kw) as ok:  # rank 0 has the unit
        assert len(list(itertools.islice(ok, 3))) == 3


def test_a_source_no_stage_weighs_is_not_read_and_not_refused(tmp_path):
    """A weight of 0 in every stage: the source is never drawn (until a resume weighs it)."""
    mix = shmloader.Mixture({"big": two_units(tmp_path / "big"), "small": one_unit(tmp_path / "small", "jsonl")},
                            {"big": 1, "small": 0})
    with loader(mix, rank=1, world_size=2) as ok:
        assert len(list(itertools.islice(ok, 3))) == 3


@pytest.mark.parametrize("kw", [{}, SHUFFLED], ids=["files-order", "shuffled"])
def test_a_state_of_two_ranks_resumed_on_three_refuses_the_rank_without_a_unit_when_made(tmp_path, kw):
    """A train file of 2 row groups: rank 2 of 3 has none, in the epochs after the old ranks'
    rest too; it is told so when made with the state, not after reading the rest."""
    data = two_units(tmp_path / "data")
    with loader(data, rank=0, world_size=2, **kw) as old:
        next(old)
        state = old.state_dict()
    with pytest.raises(shmloader.DataError, match=r"^rank 2 of 3 has no ") as info:
        loader(data, rank=2, world_size=3, resume_state=state, **kw)
    assert WORDS in str(info.value)
    assert started_nothing()
    for rank in (0, 1):
        with loader(data, rank=rank, world_size=3, resume_state=state, **kw) as ok:
            assert len(list(itertools.islice(ok, 12))) == 12  # through an epoch's end


def barren(root, fmt: str, statistics: bool = True) -> str:
    """A split whose train file's units 1 and 3 (rank 1 of 2's) are empty and all null, units 0
    and 2 documents (and its val file)."""
    os.makedirs(root)
    groups = [texts(3), [], texts(3, 50), [None, None]]
    schema = pa.schema([("text", pa.string())])
    for name, units in (("a", groups), ("b", [texts(2, 90)])):
        tables = [pa.table({"text": pa.array(rows, pa.string())}) for rows in units]
        path = os.path.join(root, f"{name}.{'parquet' if fmt == 'parquet' else 'arrow'}")
        if fmt == "parquet":
            with pq.ParquetWriter(path, schema, write_statistics=statistics) as w:
                for t in tables:
                    w.write_table(t)
        else:
            with pa.ipc.new_stream(path, schema) as w:
                for t in tables:
                    w.write_batch(pa.RecordBatch.from_pylist(t.to_pylist(), schema))
    return str(root)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_a_rank_whose_units_hold_no_document_is_refused_when_made(tmp_path, fmt):
    data = barren(tmp_path / "d", fmt)
    words = r"^rank 1: a whole epoch over 1 files held no document with text \(all null or no rows\)"
    with pytest.raises(shmloader.DataError, match=words):
        loader(data, rank=1, world_size=2)
    assert started_nothing()
    with loader(data, rank=0, world_size=2) as ok:  # rank 0's units hold documents
        assert len(list(itertools.islice(ok, 3))) == 3
    with loader(data, rank=1, world_size=2, **SHUFFLED) as ok:  # shuffled, rank 1 reads units 0 and 2 too
        assert len(list(itertools.islice(ok, 3))) == 3


def test_a_split_of_no_document_read_shuffled_is_refused_when_made(tmp_path):
    os.makedirs(tmp_path / "d")
    for name in ("a", "b", "c"):
        pq.write_table(pa.table({"text": pa.array([None] * 4, pa.string())}), tmp_path / "d" / f"{name}.parquet",
                       row_group_size=2)
    with pytest.raises(shmloader.DataError, match=r"^rank 0: every row group of the 2 files, read shuffled, held no "
                                                  r"document with text \(all null or no rows\)"):
        loader(str(tmp_path / "d"), **SHUFFLED)
    assert started_nothing()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet-without-statistics"])
def test_where_the_files_cannot_say_it_the_coordinator_does(tmp_path, fmt):
    if fmt == "jsonl":
        data = str(tmp_path / "d")
        formats_data.write_set(data, [[None] * 5, texts(2)], "jsonl")
    else:
        data = barren(tmp_path / "d", "parquet", statistics=False)
    with loader(data, rank=1 if fmt != "jsonl" else 0, world_size=2 if fmt != "jsonl" else 1) as ld:
        with pytest.raises(shmloader.DataError, match=r"a whole epoch over 1 files held no document with text"):
            next(ld)


def test_a_file_listed_twice_is_refused_naming_it_and_the_mixtures_weights(tmp_path):
    data = two_units(tmp_path / "data")
    a, b = (os.path.join(data, f"s{i}.parquet") for i in range(2))
    for listed in ([a, a, b], [a, os.path.join(data, ".", "s0.parquet"), b]):
        with pytest.raises(ValueError, match=r"^data lists .*s0\.parquet twice: .*larger weight in a shmloader\.Mixture"):
            loader(listed)
    other = two_units(tmp_path / "other")
    with pytest.raises(ValueError, match=r"^mixture source 'x': data lists .*s0\.parquet twice: .*shmloader\.Mixture"):
        loader(shmloader.Mixture({"x": [a, a, b], "y": other}, {"x": 2, "y": 1}))
    assert started_nothing()
    with loader(shmloader.Mixture({"x": [a, b], "y": other}, {"x": 2, "y": 1})) as ok:  # upweighted by its weight
        assert len(list(itertools.islice(ok, 3))) == 3


def test_two_files_of_one_name_are_read_named_by_their_paths(tmp_path):
    """x/s0.parquet and y/s0.parquet, listed or globbed: two files, which a state names by their
    paths below the data's root (tests/loader/test_nested_layouts.py reads such layouts); the
    same file listed twice stays refused (above)."""
    x, y = two_units(tmp_path / "x"), two_units(tmp_path / "y")
    xs, ys = (sorted(os.path.join(d, f) for f in os.listdir(d)) for d in (x, y))
    for data in ([*ys, *xs], str(tmp_path / "*" / "s*.parquet")):
        with loader(data) as ok:
            assert len(list(itertools.islice(ok, 3))) == 3
            state = ok.state_dict()
        assert [f[0] for f in state["files"]] == ["x/s0.parquet", "x/s1.parquet", "y/s0.parquet"]
        assert state["val"] == "y/s1.parquet"
