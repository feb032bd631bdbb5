"""state.py: round trip of the resume state, the named refusals, nanochat-format states,
the rank-mismatch warning, and the data fingerprint."""

import json
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader.plan import Cursor, nanochat_cursor
from shmloader.state import VERSION, base_state, buffer_runs, check, data_fingerprint, make_state

FILES = [f"/data/shard_{i:05d}.parquet" for i in range(4)]
CONFIG = {"B": 4, "T": 16, "split": "train", "packing": "concat",
          "data": data_fingerprint(FILES), "tokenizer": "0123456789abcdef"}


def saved(rank=1, world=2, config=CONFIG, epoch=2, file=1, rg=3, doc=5, skip=7):
    """A state as the loader saves it, through JSON as nanochat stores it."""
    state = make_state(base_state(config, rank, world), epoch, file, rg, doc, skip)
    return json.loads(json.dumps(state))


# ------------------------------------------------------------------ round trip

def test_round_trip():
    state = saved()
    assert state["version"] == VERSION
    assert (state["pq_idx"], state["rg_idx"], state["epoch"]) == (1, 3, 2)  # nanochat's keys
    assert check(state, CONFIG, rank=1, world=2, n_files=3) == (Cursor(2, 1, 3, 5), 7)


@settings(deadline=None)
@given(world=st.integers(1, 8), data=st.data(), epoch=st.integers(1, 10**6),
       n_files=st.integers(1, 1000), stride=st.integers(0, 10**4),
       doc=st.integers(0, 10**6), skip=st.integers(0, 10**9))
def test_round_trip_property(world, data, epoch, n_files, stride, doc, skip):
    rank = data.draw(st.integers(0, world - 1))
    file = data.draw(st.integers(0, n_files - 1))
    rg = stride * world + rank
    state = saved(rank, world, CONFIG, epoch, file, rg, doc, skip)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check(state, dict(CONFIG), rank, world, n_files) == (Cursor(epoch, file, rg, doc), skip)


def test_make_state_does_not_mutate_base():
    base = base_state(CONFIG, 0, 1)
    before = json.dumps(base, sort_keys=True)
    make_state(base, 1, 0, 0, 0, 0)
    assert json.dumps(base, sort_keys=True) == before


# ------------------------------------------------------------------ config mismatches

@pytest.mark.parametrize("key,value", [("B", 8), ("T", 32), ("split", "val"),
                                       ("packing", "bos_bestfit"),
                                       ("data", data_fingerprint(FILES[:3])),
                                       ("tokenizer", "fedcba9876543210")])
def test_each_config_mismatch_is_named(key, value):
    loader = dict(CONFIG, **{key: value})
    with pytest.raises(ValueError) as ei:
        check(saved(), loader, rank=1, world=2, n_files=3)
    msg = str(ei.value)
    assert key in msg and repr(value) in msg and repr(CONFIG[key]) in msg
    others = [k for k in CONFIG if k != key and f"{k}:" in msg]
    assert others == [], f"unchanged fields named: {others}"


def test_world_size_mismatch_is_named():
    with pytest.raises(ValueError, match="world_size") as ei:
        check(saved(rank=1, world=2), CONFIG, rank=1, world=4, n_files=3)
    assert "2" in str(ei.value) and "4" in str(ei.value)


def test_several_mismatches_are_all_named():
    loader = dict(CONFIG, B=2, T=64, tokenizer="ffff")
    with pytest.raises(ValueError) as ei:
        check(saved(), loader, rank=1, world=3, n_files=3)
    msg = str(ei.value)
    for name in ("B:", "T:", "tokenizer:", "world_size:"):
        assert name in msg, name
    assert "split:" not in msg and "packing:" not in msg and "data:" not in msg


def test_config_key_missing_from_loader_or_state_is_named():
    state = saved()
    state["config"]["extra_knob"] = 3
    with pytest.raises(ValueError, match="extra_knob"):
        check(state, CONFIG, 1, 2, 3)
    state = saved(config={k: v for k, v in CONFIG.items() if k != "packing"})
    with pytest.raises(ValueError, match="packing"):
        check(state, CONFIG, 1, 2, 3)


def test_config_not_a_dict_is_refused():
    state = saved()
    state["config"] = "B=4"
    with pytest.raises(ValueError, match="config"):
        check(state, CONFIG, 1, 2, 3)


# ------------------------------------------------------------------ version, type

@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_version_mismatch_is_refused(version):
    state = dict(saved(), version=version)
    with pytest.raises(ValueError, match="version"):
        check(state, CONFIG, 1, 2, 3)


@pytest.mark.parametrize("state", [None, [], "pq_idx=1", 3, (("pq_idx", 0),)])
def test_non_dict_is_refused(state):
    with pytest.raises(ValueError, match="dict"):
        check(state, CONFIG, 0, 1, 3)


# ------------------------------------------------------------------ position fields

@pytest.mark.parametrize("field,value", [
    ("epoch", 0), ("epoch", -1), ("epoch", "2"), ("epoch", True), ("epoch", 1.0),
    ("pq_idx", -1), ("pq_idx", "1"), ("pq_idx", False), ("pq_idx", None),
    ("rg_idx", -2), ("rg_idx", True), ("rg_idx", 3.0),
    ("doc_idx", -1), ("doc_idx", "5"), ("doc_idx", True),
    ("skip", -7), ("skip", True), ("skip", "7"),
    ("rank", -1), ("rank", "1"), ("rank", True)])
def test_bad_position_field_is_refused_naming_it(field, value):
    state = dict(saved(), **{field: value})
    with pytest.raises(ValueError) as ei:
        check(state, CONFIG, 1, 2, 3)
    assert repr(field) in str(ei.value)


@pytest.mark.parametrize("field", ["epoch", "pq_idx", "rg_idx", "doc_idx", "skip", "rank"])
def test_missing_position_field_is_refused_naming_it(field):
    state = saved()
    del state[field]
    with pytest.raises(ValueError, match=field):
        check(state, CONFIG, 1, 2, 3)


def test_pq_idx_out_of_range_is_refused():
    with pytest.raises(ValueError, match="pq_idx"):
        check(saved(file=3), CONFIG, 1, 2, n_files=3)
    assert check(saved(file=2), CONFIG, 1, 2, n_files=3)[0].file == 2


def test_row_group_of_another_rank_is_refused():
    with pytest.raises(ValueError, match="rg_idx"):
        check(saved(rank=1, world=2, rg=4), CONFIG, 1, 2, 3)


# ------------------------------------------------------------------ rank mismatch

def test_state_of_another_rank_warns_and_resumes_as_nanochat():
    state = saved(rank=0, world=4, epoch=3, file=2, rg=8, doc=11, skip=99)
    with pytest.warns(UserWarning, match="rank 0"):
        cursor, skip = check(state, CONFIG, rank=3, world=4, n_files=3)
    assert skip == 0
    assert cursor == nanochat_cursor(2, 8, 3, rank=3, world=4) == Cursor(3, 2, 15, 0)


def test_same_rank_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check(saved(rank=0, world=4, rg=8), CONFIG, rank=0, world=4, n_files=3)


# ------------------------------------------------------------------ nanochat states

@pytest.mark.parametrize("state,rank,world,expected", [
    ({"pq_idx": 1, "rg_idx": 5}, 1, 2, Cursor(1, 1, 7, 0)),
    ({"pq_idx": 0, "rg_idx": 0}, 0, 1, Cursor(1, 0, 1, 0)),
    ({"pq_idx": 2, "rg_idx": 3, "epoch": 4}, 0, 4, Cursor(4, 2, 4, 0)),
    ({"pq_idx": 2, "rg_idx": 3, "epoch": 4}, 3, 4, Cursor(4, 2, 7, 0)),
])
def test_nanochat_state_resumes_as_nanochat(state, rank, world, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cursor, skip = check(json.loads(json.dumps(state)), CONFIG, rank, world, n_files=3)
    assert (cursor, skip) == (expected, 0)
    assert cursor == nanochat_cursor(state["pq_idx"], state["rg_idx"], state.get("epoch", 1), rank, world)


@pytest.mark.parametrize("extra", ["doc_idx", "skip", "config", "rank", "B"])
def test_versionless_state_with_unknown_field_is_refused(extra):
    with pytest.raises(ValueError, match=extra):
        check({"pq_idx": 0, "rg_idx": 0, "epoch": 1, extra: 0}, CONFIG, 0, 1, 3)


@pytest.mark.parametrize("field,value", [("pq_idx", -1), ("pq_idx", "0"), ("pq_idx", True),
                                         ("rg_idx", -1), ("rg_idx", None), ("rg_idx", False),
                                         ("epoch", 0), ("epoch", "1"), ("epoch", True)])
def test_versionless_bad_field_is_refused_naming_it(field, value):
    state = dict({"pq_idx": 0, "rg_idx": 0, "epoch": 1}, **{field: value})
    with pytest.raises(ValueError, match=field):
        check(state, CONFIG, 0, 1, 3)


def test_versionless_missing_rg_idx_or_pq_idx_is_refused():
    with pytest.raises(ValueError, match="rg_idx"):
        check({"pq_idx": 0}, CONFIG, 0, 1, 3)
    with pytest.raises(ValueError, match="pq_idx"):
        check({"rg_idx": 0}, CONFIG, 0, 1, 3)


def test_versionless_pq_idx_out_of_range_is_refused():
    with pytest.raises(ValueError, match="pq_idx"):
        check({"pq_idx": 3, "rg_idx": 0}, CONFIG, 0, 1, n_files=3)


# ------------------------------------------------------------------ data fingerprint

def test_data_fingerprint_depends_on_names_not_directories():
    a = data_fingerprint(["/mnt/a/shard_00000.parquet", "/mnt/a/shard_00001.parquet"])
    b = data_fingerprint(["rel/shard_00000.parquet", "/tmp/x/y/shard_00001.parquet"])
    c = data_fingerprint(["C:\\data\\shard_00000.parquet", "D:\\shard_00001.parquet"])
    assert a == b == c
    assert a != data_fingerprint(["/mnt/a/shard_00000.parquet", "/mnt/a/shard_00002.parquet"])
    assert a != data_fingerprint(["/mnt/a/shard_00000.parquet"])
    assert a != data_fingerprint(["/mnt/a/shard_00001.parquet", "/mnt/a/shard_00000.parquet"])
    assert isinstance(a, str) and json.loads(json.dumps(a)) == a


# ------------------------------------------------------------------ best-fit buffer runs

def test_buffer_runs_round_trip():
    runs = [[1, 0, 2, 5, 3], [2, 2, 0, 0, 1]]
    state = json.loads(json.dumps(dict(saved(), buffer=runs)))
    assert buffer_runs(state, n_files=3) == runs
    assert buffer_runs(dict(saved(), buffer=[]), n_files=3) == []


@pytest.mark.parametrize("buffer", [None, "[]", {"runs": []}, 5])
def test_buffer_runs_not_a_list_is_refused(buffer):
    state = saved()
    if buffer is not None:
        state["buffer"] = buffer
    with pytest.raises(ValueError, match="buffer"):
        buffer_runs(state, n_files=3)


@pytest.mark.parametrize("run", [
    [1, 0, 0, 0], [1, 0, 0, 0, 1, 1], (1, 0, 0, 0, 1), "1,0,0,0,1",
    [0, 0, 0, 0, 1],        # epoch 0
    [1, 3, 0, 0, 1],        # file out of range
    [1, 0, 0, 0, 0],        # empty run
    [1, -1, 0, 0, 1], [1, 0, -1, 0, 1], [1, 0, 0, -1, 1],
    [True, 0, 0, 0, 1], [1, 0, 0, 0, True], [1, 0, 0.0, 0, 1], [1, 0, "0", 0, 1]])
def test_buffer_runs_bad_run_is_refused(run):
    state = dict(saved(), buffer=[[1, 0, 0, 0, 2], run])
    with pytest.raises(ValueError, match="buffer"):
        buffer_runs(state, n_files=3)


def test_a_state_mixing_two_ranks_is_refused_naming_the_digest():
    """What DCP gives back when every rank saved its loader under one key: fields of both."""
    mixed = saved(rank=1, doc=5)
    mixed["doc_idx"] = saved(rank=0, rg=2, doc=9)["doc_idx"]
    with pytest.raises(ValueError, match="digest") as ei:
        check(mixed, CONFIG, rank=1, world=2, n_files=3)
    assert "loader_rank" in str(ei.value)


def test_the_digest_covers_the_buffer():
    runs = [[1, 0, 2, 10, 3], [1, 1, 0, 0, 4]]
    state = json.loads(json.dumps(make_state(base_state(CONFIG, 1, 2), 2, 1, 3, 5, 0, runs)))
    check(state, CONFIG, rank=1, world=2, n_files=3)  # consistent: accepted
    state["buffer"][1][4] = 5
    with pytest.raises(ValueError, match="digest"):
        check(state, CONFIG, rank=1, world=2, n_files=3)
