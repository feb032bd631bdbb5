"""A mixture's files (data/sources.py) and its state's checks (mixstate.py), without processes."""
import json
import re
from types import SimpleNamespace

import pytest

from shmloader import mixstate
from shmloader.data.mixture import Mixture
from shmloader.data.sources import Sources
from shmloader.demo import corpus
from shmloader.errors import DataError
from shmloader.position import Position


@pytest.fixture
def three(tmp_path):
    for name, files in (("web", 3), ("code", 4), ("math", 2)):
        corpus.write_shards([f"{name} {i}" for i in range(12)], tmp_path / name, num_files=files, row_group_size=2)
    return tmp_path


def test_every_source_is_split_alone_and_numbered_in_one_list(three):
    sources = Sources(Mixture({n: str(three / n) for n in ("web", "code", "math")}, {"web": 1}), "train")
    assert [(r.name, r.lo, r.hi) for r in sources.ranges.values()] == [("code", 0, 3), ("math", 3, 4), ("web", 4, 6)]
    assert [p.split("/")[-2] for p in sources.paths] == ["code"] * 3 + ["math"] + ["web"] * 2
    assert sources.val == {"code": "shard_00003.parquet", "math": "shard_00001.parquet", "web": "shard_00002.parquet"}
    assert sources.source_of(4).name == "web" and sources.local(Position(2, 5, 1, 3)) == Position(2, 1, 1, 3)
    assert sources.to_run("math", Position(1, 0, 0)) == Position(1, 3, 0)
    val = Sources(Mixture({n: str(three / n) for n in ("web", "code")}, {"web": 1}), "val")
    assert [p.split("/")[-2:] for p in val.paths] == [["code", "shard_00003.parquet"], ["web", "shard_00002.parquet"]]


def test_a_source_without_files_is_named(three, tmp_path):
    (tmp_path / "none").mkdir()
    with pytest.raises(DataError, match="mixture source 'none'"):
        Sources(Mixture({"web": str(three / "web"), "none": str(tmp_path / "none")}, {"web": 1}), "train")


def test_a_hub_download_of_several_splits_as_a_source_is_refused_saying_what_works_in_a_mixture(three, tmp_path):
    """The refusal said "with split='all'" in a Mixture too, where `split` applies to every source:
    the other sources then read their val files. It says to give the source its train files."""
    hub = tmp_path / "hub"
    for split, n in (("train", 3), ("test", 1)):
        for i in range(n):
            corpus.write_shards([f"{split} {i}"] * 2, hub / f"tmp{split}{i}", num_files=1, row_group_size=2)
            (hub / f"tmp{split}{i}" / "shard_00000.parquet").rename(hub / f"{split}-{i:05d}-of-{n:05d}.parquet")
    with pytest.raises(DataError, match=r"mixture source 'hub': .*Hub shards of 2 splits \(test, train\).*"
                                        r"data='(.*hub/train-\*\.parquet)' \(in a Mixture, split= applies to every "
                                        r"source: split='all' would read the other sources' val files too") as refused:
        Sources(Mixture({"web": str(three / "web"), "hub": str(hub)}, {"web": 1}), "train")
    assert "with split='all'" not in str(refused.value)
    told = re.search(r"data='(.*?)'", str(refused.value)).group(1)
    sources = Sources(Mixture({"web": str(three / "web"), "hub": told}, {"web": 1}), "train")  # the advice, taken
    assert [p.split("/")[-1] for p in sources.paths if "/hub/" in p] == ["train-00000-of-00003.parquet",
                                                                         "train-00001-of-00003.parquet"]


def test_a_source_named_with_glob_characters_is_that_directory(three, tmp_path):
    """A source `code[1]/` beside `code1/` is read as itself (as `data=`, data/source.py), not as
    a glob that matches `code1/`."""
    corpus.write_shards([f"other {i}" for i in range(12)], tmp_path / "code1", num_files=2, row_group_size=2)
    (three / "code").rename(tmp_path / "code[1]")
    sources = Sources(Mixture({"web": str(three / "web"), "code": str(tmp_path / "code[1]")}, {"web": 1}), "train")
    assert [p.split("/")[-2] for p in sources.paths] == ["code[1]"] * 3 + ["web"] * 2


def test_what_a_mixture_refuses():
    with pytest.raises(ValueError, match="only for now .*'packed' over a mixture"):
        mixstate.refuse(SimpleNamespace(packing="packed", cache_dir=None))  # a packing with no mixture mode
    for packing in ("concat", "bos_bestfit"):
        mixstate.refuse(SimpleNamespace(packing=packing, cache_dir="/tmp/x"))  # a token cache serves a mixture


def test_a_state_is_checked_before_anything_is_read(three):
    from shmloader import state as statemod

    mix = Mixture({n: str(three / n) for n in ("web", "code")}, {"web": 1, "code": 1})
    sources = Sources(mix, "train")
    identity = statemod.Loader({"split": "train", "packing": "concat"}, sources.files, 0, 1, 8, 16)
    resume = statemod.start(identity, statemod.AtMix())
    point = {"source": "web", "skip": 3, "sources": {"web": [1, 0, 0, 1], "code": [1, 0, 1, 0]},
             "mixer": {"mixture": mix.digest, "stage": 0, "stage_batch": 0, "counted": {"web": 9, "code": 8},
                       "totals": {"web": [9, 2, 1], "code": [8, 2, 1]}, "ended": []}}
    mark = SimpleNamespace(buffer=mixstate.point_text(point), batch=7, position=Position(1, 3, 0, 1, 3),
                           read=None)
    part = mixstate.Mixed(sources)
    state = statemod.Writer(identity, resume, part).state(mark, 0xABC)
    assert [state["position"][i] for i in (1, 3, 4)] == [0, 1, 3]
    back = statemod.check(json.loads(json.dumps(state)), identity, part)
    assert back.position == Position(1, 3, 0, 1, 3) and back.batch == 7 and back.check == 0xABC and back.at.point == point
    edited = dict(state, batch=8)
    with pytest.raises(ValueError, match="'digest' is .*, but its fields give"):
        statemod.check(edited, identity, part)
    other = statemod.Loader(identity.fingerprint, sources.files, 1, 2, 8, 16)
    with pytest.raises(ValueError, match="places cannot be replayed"):  # a point without `since`: not known
        statemod.check(state, other, part)
    moved = json.loads(json.dumps(state))
    moved["mixture"]["sources"]["web"]["files"][0][1] += 1
    with pytest.raises(ValueError, match="mixture source 'web': file shard_00000.parquet changed"):
        statemod.check(moved, identity, part)
    with pytest.raises(ValueError, match="resume state is of one source"):
        statemod.check({k: v for k, v in state.items() if k != "mixture"}, identity, part)
    unversioned = {k: v for k, v in json.loads(json.dumps(state)).items() if k != "version"}
    with pytest.raises(ValueError, match="no 'version': a mixture's state has one"):
        statemod.check(unversioned, identity, part)  # not read as nanochat's keys, nor let through


def test_a_source_with_files_added_among_its_own_is_reordered_as_one_source(three):
    """The state listed code's files 0 and 2 (of 3 now: file 1 landed after the save), code stood
    in its epoch 2: it reads 0, 2, then 1 in epoch 2 and its sorted order from epoch 3 on; a
    position, a point and best fit's buffer runs are numbered as code's epoch orders its files
    (the run's order within it in epoch 2, the sorted one after), the other sources' as ever."""
    from shmloader import mixchecks
    from shmloader.packing.mixbestfit import buffer_entries
    from shmloader.packing.runs import BufferText

    sources = Sources(Mixture({n: str(three / n) for n in ("web", "code")}, {"web": 1, "code": 1}), "train")
    code = sources.source_files("code")
    saved = {"code": {"files": [code[0], code[2]]}, "web": {"files": sources.source_files("web")}}
    listed = mixchecks.check_sources(saved, sources)
    assert listed.added == {"code": ["shard_00001.parquet"]} and listed.orders == {"code": [0, 2, 1], "web": [0, 1]}
    sources.reorder(listed.orders, {"code": 2, "web": 1})
    assert [p.split("/")[-1] for p in sources.paths[:3]] == ["shard_00000.parquet", "shard_00002.parquet",
                                                             "shard_00001.parquet"]
    assert [f[0] for f in sources.source_files("code")] == ["shard_00000.parquet", "shard_00002.parquet",
                                                            "shard_00001.parquet"]
    assert list(sources.laters) == ["code"] and sources.laters["code"].after == 2
    assert [f[0] for f in sources.files_at("code", 3)] == [f[0] for f in code]
    for epoch, run, local in ((2, 1, 1), (3, 1, 2), (3, 2, 1), (3, 0, 0)):  # shard 2 is file 1 of epoch 2, 2 after
        assert sources.local(Position(epoch, run, 0, 4)) == Position(epoch, local, 0, 4)
        assert sources.to_run("code", Position(epoch, local, 0, 4)) == Position(epoch, run, 0, 4)
    assert sources.local(Position(3, 4, 1, 0)) == Position(3, 1, 1, 0)  # web: as ever
    point = {"source": "code", "skip": 0, "sources": {"code": [3, 1, 0, 4], "web": [1, 1, 0, 0]}, "mixer": {},
             "buffer": mixstate._buffer([["code", 2, 1, 0, 0, 2], ["web", 1, 0, 0, 1, 1], ["code", 3, 2, 0, 0, 1]],
                                        ["code", "web"])}
    text = mixstate.point_text(point)
    state = json.loads(mixstate.numbered(BufferText(*text), sources).text)
    assert state["sources"] == {"code": [3, 2, 0, 4], "web": [1, 1, 0, 0]}
    assert buffer_entries(state) == [["code", 2, 2, 0, 0, 2], ["web", 1, 0, 0, 1, 1], ["code", 3, 1, 0, 0, 1]]
    point["sources"]["code"][0] = 2  # in its reordered epoch: the run's numbering is the state's
    assert mixstate.numbered(mixstate.point_text(point), sources) == mixstate.point_text(point)


def test_a_source_reordered_before_its_epoch_is_known_reads_its_order_until_begun(three):
    """Another rank's state: code's files are reordered for the replay (no `Later`: the state's
    files, then the new one, in every epoch), and once the replay found code's epoch (`begun`), it
    reads its sorted order from the next one on, as when the epoch was known at once."""
    from shmloader import mixchecks

    sources = Sources(Mixture({n: str(three / n) for n in ("web", "code")}, {"web": 1, "code": 1}), "train")
    code = sources.source_files("code")
    listed = mixchecks.check_sources({"code": {"files": [code[0], code[2]]}}, sources)
    sources.reorder({"code": listed.orders["code"]}, None)
    assert [f[0] for f in sources.source_files("code")] == [code[i][0] for i in (0, 2, 1)]
    assert sources.laters == {} and sources.to_run("code", Position(5, 1, 0, 0)) == Position(5, 1, 0, 0)
    sources.begun({"code": 3})
    assert sources.laters["code"].after == 3
    assert [f[0] for f in sources.files_at("code", 3)] == [code[i][0] for i in (0, 2, 1)]
    assert [f[0] for f in sources.files_at("code", 4)] == [f[0] for f in code]
