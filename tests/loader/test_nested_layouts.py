"""Everyone's nested layouts, read as a client reads them: files of one name in several
directories (docs/contract.md §3, "How a state names files").

- FineWeb / FineWeb-Edu: `data/CC-MAIN-2013-20/000_00000.parquet`, `data/CC-MAIN-2013-48/000_00000.parquet`,
  ..., given as the glob `data/*/*.parquet`;
- DCLM: `global-shard_01_of_02/local-shard_0_of_02/shard_00000000_processed.jsonl.zst`, the same
  names in every local shard, given as a list of paths (in no order) or a `**` glob.

Their batches are the batches of the same files copied into one directory under names of their
own in the same order (`flat`: the loader's naming plays no part there), and, for one rank, the
tokens of the files in the sorted order of their full paths (`tokens_of`); a state names each
file by its path below the data's root, goes through JSON and resumes exactly with another
worker count and at another world size; a dump that arrives between runs, sorting among the
others, is read as added shards are; a Mixture's source may be such a glob. A shard whose name
a file of another directory already has, arriving after a state named its files by their
basenames, makes the state's resume refused in words (`data/catalogue.py` `renamed`), never read
as another file's.
"""
import json
import os
import shutil
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shmloader
from shmloader.data import source
from shmloader.data.catalogue import renamed
from shmloader.errors import DataError
from tests import formats_data, helpers
from tests.helpers import window_of
from tests.loader.test_growing_data import tokens_of

pytestmark = [pytest.mark.usefixtures("watchdog"),
              pytest.mark.filterwarnings("ignore::shmloader.cores.CoresWarning")]  # num_workers=3 on 2 cores
B, T = 2, 16
W = B * T + 1
DUMPS = ("CC-MAIN-2013-20", "CC-MAIN-2014-10")  # sorted; CC-MAIN-2013-48 arrives between them


def texts(i: int, n_docs: int = 30) -> list:
    """File `i`'s documents: tokens of its own range."""
    return [" ".join(str(1_000_000 * (i + 1) + row * 100 + k) for k in range(row % 7 + 1)) for row in range(n_docs)]


def fineweb(root, dumps=DUMPS, per_dump: int = 2) -> list:
    """`root/<dump>/000_0000j.parquet`, every dump the same names, each file's tokens its own."""
    paths = []
    for dump in dumps:
        os.makedirs(root / dump, exist_ok=True)
        for j in range(per_dump):
            path = root / dump / f"000_{j:05d}.parquet"
            pq.write_table(pa.table({"text": texts(int(dump[-7:].replace("-", "")) * 10 + j)}), path,
                           row_group_size=8)
            paths.append(str(path))
    return paths


def dclm(root) -> list:
    """DCLM's nesting: 2 global shards x 2 local shards x 2 files of the same two names, JSON Lines
    in zstd, 1100 lines (2 units) each."""
    paths = []
    for g in (1, 2):
        for local in (0, 1):
            for s in (0, 1):
                where = root / f"global-shard_{g:02d}_of_02" / f"local-shard_{local}_of_02"
                i = g * 100 + local * 10 + s
                paths.append(formats_data.write(str(where / f"shard_{s:08d}_processed.jsonl.zst"),
                                                texts(i, 1100), "jsonl.zst"))
    return paths


def flat(paths, where) -> str:
    """`paths` copied into one directory `where`, named apart in their sorted order."""
    os.makedirs(where)
    for n, path in enumerate(sorted(paths)):
        shutil.copyfile(path, os.path.join(where, f"{n:03d}_{os.path.basename(path)}"))
    return str(where)


def loader(data, split="train", **kw):
    kw.setdefault("num_workers", 2)
    return shmloader.ShmLoader(data, helpers.IntTokenizer(), B, T, split, device="cpu", timeout=30, **kw)


def take(ld, n: int) -> list:
    """`n` batches as windows (concat: inputs and targets checked to be one window)."""
    return [window_of(*next(ld)) for _ in range(n)]


def rows(ld, n: int) -> list:
    """`n` batches as inputs then targets (best fit's rows are no one window)."""
    return [np.concatenate([x.reshape(-1).numpy(), y.reshape(-1).numpy()]) for x, y in (next(ld) for _ in range(n))]


def same(got, want):
    assert len(got) == len(want)
    for j, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"batch {j}"


def windows(tokens, n: int) -> list:
    return [np.array(tokens[j * W:(j + 1) * W]) for j in range(n)]


def json_state(ld) -> dict:
    return json.loads(json.dumps(ld.state_dict()))


# ---------------------------------------------------------------- the naming rule


def test_names_are_basenames_where_they_are_unique_and_paths_below_the_root_where_not(tmp_path):
    """`source.file_names`, the one rule: basenames where no two files share one (every state
    written before it); else each file's path below a glob's existing leading part, or a list's
    common directory (a remote list alike, with "/")."""
    assert source.file_names(["/d/x/a.parquet", "/d/y/b.parquet"], "/d/*/*.parquet") == ["a.parquet", "b.parquet"]
    assert source.file_names(["/d/x/a.parquet", "/d/y/a.parquet"], "/nowhere/*/a.parquet") == \
        ["x/a.parquet", "y/a.parquet"]  # no glob head exists: the common directory
    data = tmp_path / "d"
    (data / "x" / "deep").mkdir(parents=True)
    nested = [str(data / "x" / "deep" / "a.parquet"), str(data / "x" / "deep" / "b.parquet"),
              str(data / "y" / "a.parquet")]
    assert source.file_names(nested, str(data / "*" / "**" / "*.parquet")) == \
        ["x/deep/a.parquet", "x/deep/b.parquet", "y/a.parquet"]  # every file once there is a collision
    assert source.file_names(nested, nested) == ["x/deep/a.parquet", "x/deep/b.parquet", "y/a.parquet"]
    assert source.file_names(["bucket/c/x/a.jsonl", "bucket/c/y/a.jsonl"], ["s3://bucket/c/x/a.jsonl"]) == \
        ["x/a.jsonl", "y/a.jsonl"]
    assert source.file_names(["a.parquet", "sub/a.parquet"]) == ["a.parquet", "sub/a.parquet"]  # no common dir


def test_a_state_name_that_only_ends_a_loader_name_is_refused_not_matched():
    """`catalogue.renamed`: the one check behind a late namesake and a list moved below another
    common directory; names the loader has, or that end none of its names, pass (a gone file is
    the file checks' to say)."""
    now = source.file_names(["/r/q/A/x.parquet", "/r/q/B/x.parquet", "/r/s/A/x.parquet"])
    assert now == ["q/A/x.parquet", "q/B/x.parquet", "s/A/x.parquet"]
    renamed(["q/A/x.parquet", "gone.parquet"], now)
    for saved in (["A/x.parquet"], ["x.parquet"]):
        with pytest.raises(ValueError, match=rf"^resume state names file {saved[0]}, and this loader has no file of "
                                             r"that name but [23] whose path ends with it \(q/A/x\.parquet, "):
            renamed(saved, now)


# ---------------------------------------------------------------- FineWeb's dumps


def test_a_fineweb_glob_reads_every_dumps_files_in_the_order_of_their_paths(tmp_path):
    """Six files, three names, one glob: the batches are the files' tokens in the order of their
    full paths (train: all but the last; val: the last file, named by its path below `data/`)."""
    paths = fineweb(tmp_path / "data", DUMPS + ("CC-MAIN-2015-06",))
    glob = str(tmp_path / "data" / "*" / "*.parquet")
    train = sorted(paths)[:-1]
    want = tokens_of(train)
    n = len(want) // W
    with loader(glob) as ld:
        same(take(ld, n), windows(want, n))
        state = ld.state_dict()
    names = [os.path.relpath(p, tmp_path / "data") for p in train]
    assert [f[0] for f in state["files"]] == names and names[1] == "CC-MAIN-2013-20/000_00001.parquet"
    assert state["val"] == "CC-MAIN-2015-06/000_00001.parquet"
    with loader(glob, "val") as ld:
        same(take(ld, 2), windows(tokens_of(sorted(paths)[-1:]), 2))
        assert [f[0] for f in ld.state_dict()["files"]] == ["CC-MAIN-2015-06/000_00001.parquet"]


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_fineweb_state_resumes_exactly_through_json_with_other_workers(tmp_path, packing):
    glob = str(tmp_path / "data" / "*" / "*.parquet")
    fineweb(tmp_path / "data")
    kw = dict(packing=packing) if packing == "concat" else dict(packing=packing, buffer_size=6)
    with loader(glob, num_workers=2, **kw) as ld:
        rows(ld, 7)
        state = json_state(ld)
        follow = rows(ld, 12)
    assert state["files"][0][0] == "CC-MAIN-2013-20/000_00000.parquet"
    with loader(glob, num_workers=3, resume_state=state, **kw) as ld:
        same(rows(ld, 12), follow)
    with loader(glob, num_workers=1, resume_state=state, **kw) as ld:
        same(rows(ld, 12), follow)


def test_a_fineweb_glob_on_two_ranks_and_resumed_at_another_world_size_is_the_flat_copys(tmp_path):
    """Each rank's batches, and a state of world size 2 resumed at world size 1 (elastic), are
    those of the same files named apart in one directory."""
    paths = fineweb(tmp_path / "data")
    glob, copy = str(tmp_path / "data" / "*" / "*.parquet"), flat(paths, tmp_path / "flat")
    states, got = {}, {}
    for data in (glob, copy):
        for rank in (0, 1):
            with loader(data, rank=rank, world_size=2) as ld:
                got[data, rank] = take(ld, 4)
                if rank == 0:
                    states[data] = json_state(ld)
    for rank in (0, 1):
        same(got[glob, rank], got[copy, rank])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the change of world size is said
        resumed = {}
        for data in (glob, copy):
            with loader(data, resume_state=states[data]) as ld:
                resumed[data] = take(ld, 8)
    same(resumed[glob], resumed[copy])


def test_a_dump_that_arrives_between_runs_is_read_as_added_shards_are(tmp_path):
    """Saved in epoch 1 with dumps 2013-20 and 2014-10; 2013-48 lands between them: its files are
    read after the state's in the epoch in progress, named in the warning by their paths below
    `data/`, and in their sorted place from the next epoch on; a state of that epoch resumes
    exactly."""
    data = tmp_path / "data"
    old = sorted(fineweb(data))
    glob = str(data / "*" / "*.parquet")
    first_epoch = tokens_of(old[:-1])
    k = len(tokens_of(old[:1])) // W + 2  # the save: in the state's second file
    with loader(glob) as ld:
        take(ld, k)
        state = json_state(ld)
    assert (state["epoch"], state["pq_idx"]) == (1, 1)
    new = sorted(fineweb(data, ("CC-MAIN-2013-48",)))
    every = sorted(old + new)[:-1]
    want = first_epoch[k * W:] + tokens_of(new) + tokens_of(every) * 2
    n = len(want) // W - 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with loader(glob, resume_state=state) as ld:
            got = take(ld, n)
            later = ld.state_dict()
    added = [str(w.message) for w in caught if "added to the split" in str(w.message)]
    assert len(added) == 1 and "2 file(s)" in added[0] and "CC-MAIN-2013-48/000_00000.parquet" in added[0], added
    same(got, windows(want, n))
    assert later["epoch"] > 1 and [f[0] for f in later["files"]] == [os.path.relpath(p, data) for p in every]
    with loader(glob, resume_state=later) as ld:
        same(take(ld, 1), [np.array(want[n * W:(n + 1) * W])])


def test_a_mixtures_source_may_be_a_fineweb_glob(tmp_path):
    """Mixture({"web": glob, "code": directory}) gives the batches of its flat copy's, and its
    state resumes exactly through JSON with other workers."""
    paths = fineweb(tmp_path / "data")
    code = tmp_path / "code"
    code.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"text": texts(900 + i)}), code / f"shard_{i:05d}.parquet", row_group_size=8)
    glob, copy = str(tmp_path / "data" / "*" / "*.parquet"), flat(paths, tmp_path / "flat")
    weights = {"web": 2, "code": 1}
    with loader(shmloader.Mixture({"web": copy, "code": str(code)}, weights)) as ld:
        want = take(ld, 16)
    with loader(shmloader.Mixture({"web": glob, "code": str(code)}, weights)) as ld:
        same(take(ld, 6), want[:6])
        state = json_state(ld)
    names = [f[0] for f in state["mixture"]["sources"]["web"]["files"]]
    assert names[:2] == ["CC-MAIN-2013-20/000_00000.parquet", "CC-MAIN-2013-20/000_00001.parquet"], names
    with loader(shmloader.Mixture({"web": glob, "code": str(code)}, weights), num_workers=3,
                resume_state=state) as ld:
        same(take(ld, 10), want[6:])


# ---------------------------------------------------------------- DCLM's shards


def test_a_dclm_list_of_nested_jsonl_zst_reads_as_its_flat_copy_and_resumes(tmp_path):
    """Eight files of two names, listed in no order: the flat copy's batches on one rank and on
    rank 1 of 2; a state through JSON resumes exactly with one worker, and at world size 1."""
    paths = dclm(tmp_path / "dclm")
    listed = list(reversed(paths))
    copy = flat(paths, tmp_path / "flat")
    for kw in ({}, dict(rank=1, world_size=2)):
        with loader(copy, **kw) as ld:
            want = take(ld, 10)
        with loader(listed, **kw) as ld:
            same(take(ld, 4), want[:4])
            state = json_state(ld)
        assert state["files"][1][0] == "global-shard_01_of_02/local-shard_0_of_02/shard_00000001_processed.jsonl.zst"
        assert state["val"] == "global-shard_02_of_02/local-shard_1_of_02/shard_00000001_processed.jsonl.zst"
        with loader(listed, num_workers=1, resume_state=state, **kw) as ld:
            same(take(ld, 6), want[4:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the change of world size is said
        with loader(listed, resume_state=state) as ld:
            got = take(ld, 5)
        with loader(copy, rank=1, world_size=2) as ld:
            take(ld, 4)
            flat_state = json_state(ld)
        with loader(copy, resume_state=flat_state) as ld:
            same(got, take(ld, 5))


def test_a_recursive_glob_reads_dclm_and_a_directory_of_directories_says_to_pass_one(tmp_path):
    """`**` is every depth (Python's recursive glob): the same files as the list. A directory whose
    files are all in its subdirectories is a DataError that suggests a glob."""
    paths = dclm(tmp_path / "dclm")
    assert source.list_files(str(tmp_path / "dclm" / "**" / "*.jsonl.zst")) == sorted(paths)
    assert source.list_files(str(tmp_path / "dclm" / "*" / "*" / "*.jsonl.zst")) == sorted(paths)
    with loader(str(tmp_path / "dclm" / "**" / "*.jsonl.zst"), split="val") as ld:
        assert ld.state_dict()["files"][0][0] == \
            "global-shard_02_of_02/local-shard_1_of_02/shard_00000001_processed.jsonl.zst"
    with pytest.raises(DataError, match=r"no data files in .*dclm .*its data files are in its subdirectories "
                                        r"\(e\.g\. .*shard_00000000_processed\.jsonl\.zst\): pass a glob, "
                                        r"data='.*dclm/\*/\*/\*\.jsonl\.zst' \(that depth\) or "
                                        r"'.*dclm/\*\*/\*\.jsonl\.zst' \(every depth\)"):
        loader(str(tmp_path / "dclm"))


def test_the_same_nested_file_listed_twice_is_still_refused(tmp_path):
    paths = fineweb(tmp_path / "data")
    again = os.path.join(tmp_path, "data", "CC-MAIN-2013-20", ".", "000_00000.parquet")
    with pytest.raises(ValueError, match=r"data lists .*CC-MAIN-2013-20/\./000_00000\.parquet twice"):
        loader(paths + [again])


# ---------------------------------------------------------------- a late namesake


def test_a_namesake_arriving_after_the_save_makes_its_resume_refused_in_words(tmp_path):
    """One dump: the state names its files by their basenames. A second dump of the same names
    arrives: every file is named by its path below `data/` now, and the state cannot say which
    `000_00000.parquet` it read: its resume is refused saying so (one source, its val split and a
    Mixture's source alike), not read as another file's; with the new dump moved aside it
    resumes exactly."""
    data = tmp_path / "data"
    fineweb(data, DUMPS[:1], per_dump=3)
    glob = str(data / "*" / "*.parquet")
    mix = shmloader.Mixture({"web": glob, "other": glob.replace("*/*", "CC-MAIN-2013-20/*")}, {"web": 1, "other": 1})
    states = {}
    for key, data_, split in (("train", glob, "train"), ("val", glob, "val"), ("mix", mix, "train")):
        with loader(data_, split) as ld:
            take(ld, 2)
            states[key] = json_state(ld)
            if key == "train":
                follow = take(ld, 4)
    assert [f[0] for f in states["train"]["files"]] == ["000_00000.parquet", "000_00001.parquet"]
    assert states["val"]["val"] == "000_00002.parquet"
    fineweb(data, DUMPS[1:], per_dump=3)
    words = (r"resume state names file 000_0000\d\.parquet, and this loader has no file of that name but [12] whose "
             r"path ends with it \((CC-MAIN-2013-20/000_0000\d\.parquet, )?CC-MAIN-2014-10/000_0000\d\.parquet\): "
             r"files of one name lie in several of the data's directories now, .*cannot say which of them it read")
    for key, data_, split in (("train", glob, "train"), ("val", glob, "val"), ("mix", mix, "train")):
        with pytest.raises(ValueError, match=("^mixture source 'web': " if key == "mix" else "^") + words):
            loader(data_, split, resume_state=states[key])
    shutil.move(str(data / DUMPS[1]), str(tmp_path / "aside"))
    with loader(glob, resume_state=states["train"]) as ld:
        same(take(ld, 4), follow)
