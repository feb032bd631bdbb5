"""state.py's envelope with one source's part (sourcestate.py): round trip of the resume state, the refusals named in words, another rank's state,
new batch shapes, appended files, nanochat-format states, and the digest."""

import itertools
from types import SimpleNamespace
import json
import zlib
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader.data.catalogue import TOKEN_IDS
from shmloader.data.order import nanochat_position
from shmloader.position import Position, RowGroup
from shmloader import state as statemod
from shmloader.sourcestate import Files, buffer_runs, decode_runs, digest, encode_buffer, encode_runs
from shmloader.state import EXACT, VERSION, AtSource, Change, Loader, Locate, Writer, start
from shmloader.data.catalogue import file_list

FILES = file_list([f"/data/shard_{i:05d}.parquet" for i in range(3)], [1000, 2000, 3000])
CONFIG = {"split": "train", "packing": "concat", "tokenizer": "0123456789abcdef"}


def loader(rank=1, world=2, B=4, T=16, files=FILES, config=CONFIG, **kw) -> Loader:
    return Loader(dict(config), [list(f) for f in files], rank, world, B, T, **kw)


def check(state, lo: Loader):
    return statemod.check(state, lo, Files())


def make_state(lo: Loader, resume, position: Position, batch: int, buffer=None, check=None, read=None) -> dict:
    """The state loader `lo`, started or resumed at `resume`, writes at `position` after `batch`
    batches (the one `Writer` with one source's part, the files in the state's numbering)."""
    mark = SimpleNamespace(position=position, buffer=buffer, batch=batch, read=None if read is None else RowGroup(*read))
    return Writer(lo, resume, Files()).state(mark, check)


def saved(rank=1, world=2, epoch=2, file=1, rg=3, doc=5, skip=7, batch=40, buffer=None, **kw) -> dict:
    """A state as the loader saves it, through JSON as nanochat stores it."""
    lo = loader(rank, world, **kw)
    state = make_state(lo, start(lo, AtSource()), Position(epoch, file, rg, doc, skip), batch, buffer)
    return json.loads(json.dumps(state))


def quiet_check(state, lo):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return check(state, lo)


# ------------------------------------------------------------------ round trip

def test_round_trip():
    state = saved()
    assert state["version"] == VERSION and state["batch"] == 40
    assert (state["pq_idx"], state["rg_idx"], state["epoch"]) == (1, 3, 2)  # nanochat's keys
    r = quiet_check(state, loader())
    assert (r.position, r.batch, r.shapes, r.origin, r.step) == (Position(2, 1, 3, 5, 7), 40,
                                                                        [[0, 4, 16]], None, EXACT)


@settings(deadline=None)
@given(world=st.integers(1, 8), data=st.data(), epoch=st.integers(1, 10**6),
       stride=st.integers(0, 10**4), doc=st.integers(0, 10**6), skip=st.integers(0, 10**9),
       batch=st.integers(0, 10**9))
def test_round_trip_property(world, data, epoch, stride, doc, skip, batch):
    rank = data.draw(st.integers(0, world - 1))
    file = data.draw(st.integers(0, len(FILES) - 1))
    rg = stride * world + rank
    r = quiet_check(saved(rank, world, epoch, file, rg, doc, skip, batch), loader(rank, world))
    assert (r.position, r.batch) == (Position(epoch, file, rg, doc, skip), batch)


def test_a_state_does_not_change_the_writers_fields():
    lo = loader()
    writer = Writer(lo, start(lo, AtSource()), Files())
    before = json.dumps(writer._base, sort_keys=True)
    writer.state(SimpleNamespace(position=Position(1, 0, 0, 0, 0), buffer=[[1, 0, 0, 0, 2]], batch=0, read=None))
    assert json.dumps(writer._base, sort_keys=True) == before


def test_a_resume_state_that_is_a_path_or_a_checkpoint_of_every_rank_says_this_rank_s_key():
    """A path given as bytes or a `pathlib.Path` was "must be a dict, got PosixPath" alone (the
    hint was for str only); a checkpoint with one key a rank named the first key ('loader_rank0')
    to every rank; the keyword said was `resume_state=` alone (nanochat's is `resume_state_dict=`)."""
    import pathlib
    for given in (b"/ckpt/loader.json", pathlib.Path("/ckpt/loader.json")):
        with pytest.raises(ValueError, match=rf"must be a dict, got {type(given).__name__}: a path or JSON text is "
                                             r"not read; pass the dict"):
            check(given, loader())
    by_rank = {"step": 3, **{f"loader_rank{r}": saved(rank=r) for r in range(3)}}
    for rank in range(3):
        with pytest.raises(ValueError, match=rf"under 'loader_rank{rank}': pass that state, resume_state=checkpoint"
                                             rf"\['loader_rank{rank}'\] \(nanochat's drop-in: resume_state_dict="):
            check(by_rank, loader(rank=rank, world=3))
    by_state = {"a": saved(rank=1), "b": saved(rank=0)}  # keys without a number: by the state's own rank
    with pytest.raises(ValueError, match=r"under 'b': pass that state"):
        check(by_state, loader(rank=0, world=2))
    by_name = {f"dl{r}": {"pq_idx": 0, "rg_idx": 5 - r} for r in range(2)}  # nanochat's keys carry no rank: by the name
    with pytest.raises(ValueError, match=r"under 'dl1': pass that state"):
        check(by_name, loader(rank=1, world=2))
    nanochat = {f"dl{r}": {"pq_idx": 0, "rg_idx": r} for r in (10, 11)}  # neither by its rank nor by its name
    with pytest.raises(ValueError, match=r"holding 2 loader states \(under 'dl10', 'dl11'\): pass this rank's "
                                         r"\(rank 1\) as resume_state= \(nanochat's drop-in: resume_state_dict=\)"):
        check(nanochat, loader())


def test_a_fresh_start_is_given_its_kind_s_place():
    """`start(loader)` gave one source's `AtSource` when not told, silently wrong for a mixture
    (whose `AtMix` holds its mixer's state): `at` is required."""
    with pytest.raises(TypeError, match="at"):
        start(loader())
    assert start(loader(), statemod.AtMix()).at == statemod.AtMix()


# ------------------------------------------------------------------ config mismatches

@pytest.mark.parametrize("key,value", [("split", "val"), ("packing", "bos_bestfit")])
def test_each_config_mismatch_is_named(key, value):
    with pytest.raises(ValueError) as ei:
        check(saved(), loader(config=dict(CONFIG, **{key: value})))
    msg = str(ei.value)
    assert f"{key}: state has {CONFIG[key]!r}, loader has {value!r}" in msg
    assert [k for k in CONFIG if k != key and f"{k}:" in msg] == []


def test_tokenizer_mismatch_is_said_in_words():
    with pytest.raises(ValueError, match="saved with another tokenizer"):
        check(saved(), loader(config=dict(CONFIG, tokenizer="fedcba9876543210")))


def test_another_world_size_is_a_change_the_loader_makes_a_plan_of():
    """A state of world size 2 at a loader of 4: the saved rank, its position and buffer, for
    the loader to find the other old ranks' and share out the rest (data/elastic.py)."""
    r = quiet_check(saved(rank=1, world=2), loader(rank=3, world=4))
    assert isinstance(r.step, Change) and (r.step.world, r.step.rank, r.step.position) == (2, 1, (2, 1, 3, 5, 7))
    assert (r.batch, r.check, r.at.plan, r.step.parent) == (40, None, None, None)
    with pytest.raises(ValueError, match="not a row group of rank 1 of 2"):
        check(saved(rank=1, world=2, rg=4), loader(rank=0, world=3))
    with pytest.warns(UserWarning, match="resuming as nanochat does"):
        r = check(saved(rank=1, world=2), loader(rank=2, world=3, other_rank="nanochat"))
    assert (r.step, r.position, r.origin) == (EXACT, nanochat_position(1, 3, 2, 2, 3), {"pq_idx": 1, "rg_idx": 3, "epoch": 2})
    more = FILES + file_list(["/data/shard_00003.parquet"], [10])
    with pytest.raises(ValueError, match="a change of world size needs the files the state was saved with"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check(saved(rank=1, world=2), loader(rank=0, world=3, files=more))


def test_several_mismatches_are_all_named():
    with pytest.raises(ValueError) as ei:
        check(saved(), loader(world=3, config=dict(CONFIG, split="val", tokenizer="ffff")))
    msg = str(ei.value)
    for name in ("split:", "tokenizer:"):
        assert name in msg, name
    assert "packing:" not in msg


def test_config_key_missing_from_loader_or_state_is_named():
    state = saved(config=dict(CONFIG, extra_knob=3))
    with pytest.raises(ValueError, match="extra_knob"):
        check(state, loader())
    state = saved(config={k: v for k, v in CONFIG.items() if k != "packing"})
    with pytest.raises(ValueError, match="packing"):
        check(state, loader())


def test_a_token_id_state_saved_before_the_bos_rule_is_refused_in_words():
    """A loader of token ids says in its fingerprint that ids already beginning with BOS get no
    second (data/catalogue.py `TOKEN_IDS`); a state without it was saved when they read [BOS, BOS, ...]: refused,
    naming that cause and what to do, not resumed one token off (nor named as another mismatch).
    A text loader's fingerprint is as it was, and a state of token ids with it resumes."""
    assert TOKEN_IDS == {"token_ids": "own BOS kept"}
    ids = dict(CONFIG, column="ids") | TOKEN_IDS
    old = saved(config=dict(CONFIG, column="ids"))  # the state before the rule: its config without the marker
    with pytest.raises(ValueError) as ei:
        check(old, loader(config=ids))
    msg = str(ei.value)
    assert "a second one ([BOS, BOS, ...]" in msg and "one token off" in msg and "without this state" in msg
    assert "loader has" not in msg and "column" not in msg
    r = quiet_check(saved(config=ids), loader(config=ids))
    assert r.position == Position(2, 1, 3, 5, 7)


# ------------------------------------------------------------------ new batch shape

@pytest.mark.parametrize("B,T,words", [(2, 16, "B: state has 4, loader has 2"),
                                       (4, 32, "T: state has 16, loader has 32"),
                                       (8, 8, "B: state has 4, loader has 8, T: state has 16, loader has 8")])
def test_new_batch_shape_continues_from_the_same_place_with_a_warning(B, T, words):
    with pytest.warns(UserWarning, match=words):
        r = check(saved(), loader(B=B, T=T))
    assert (r.position, r.batch) == (Position(2, 1, 3, 5, 7), 40)
    assert r.shapes == [[0, 4, 16], [40, B, T]]


def test_a_second_new_shape_at_the_same_batch_replaces_the_first():
    lo = loader(B=2)
    with pytest.warns(UserWarning):
        r = check(saved(), lo)
    state = json.loads(json.dumps(make_state(lo, r, Position(2, 1, 3, 5, 7), 40)))
    with pytest.warns(UserWarning, match="B: state has 2, loader has 3"):
        assert check(state, loader(B=3)).shapes == [[0, 4, 16], [40, 3, 16]]


@pytest.mark.parametrize("shapes", [[], [[1, 4, 16]], [[0, 4, 16], [50, 2, 16]], [[0, 4]], [[0, 0, 16]],
                                    [[0, 4, 16], [0, 2, 16]], "4x16", [[0, 4, 16.0]]])
def test_bad_shapes_are_refused(shapes):
    with pytest.raises(ValueError, match="shapes"):
        check(dict(saved(), shapes=shapes), loader())


# ------------------------------------------------------------------ files

def test_appended_files_are_accepted_with_a_warning_naming_them():
    more = FILES + file_list(["/data/shard_00003.parquet", "/data/shard_00004.parquet"], [10, 20])
    with pytest.warns(UserWarning, match=r"2 file\(s\) added .*shard_00003\.parquet, shard_00004\.parquet"):
        r = check(saved(), loader(files=more))
    assert r.position == Position(2, 1, 3, 5, 7) and r.n_files == 3


@pytest.mark.parametrize("epoch,file,index,refused", [
    (1, 1, 0, True), (1, 1, 1, True), (1, 1, 2, False),   # epoch 1: after the position, a warning
    (2, 0, 2, True)])                                       # later epochs have read every file
def test_a_changed_file_at_or_before_the_position_is_refused_naming_it(epoch, file, index, refused):
    files = [list(f) for f in FILES]
    files[index][1] += 1
    state = saved(epoch=epoch, file=file)
    name = f"shard_{index:05d}.parquet"
    words = rf"file {index}: state has {name} \({FILES[index][1]:,} bytes\), loader has {name} " \
            rf"\({FILES[index][1] + 1:,} bytes\)"
    if refused:
        with pytest.raises(ValueError, match=words):
            check(state, loader(files=files))
    else:
        with pytest.warns(UserWarning, match=words):
            check(state, loader(files=files))


def test_a_missing_file_is_named():
    with pytest.raises(ValueError, match=r"file 2: state has shard_00002\.parquet \(3,000 bytes\), loader has no file"):
        check(saved(), loader(files=FILES[:2]))


def test_moved_files_resume():
    moved = file_list([f"/elsewhere/x/shard_{i:05d}.parquet" for i in range(3)], [1000, 2000, 3000])
    assert quiet_check(saved(), loader(files=moved)).position == Position(2, 1, 3, 5, 7)


# ------------------------------------------------------------------ version, type, fields

@pytest.mark.parametrize("version", [0, 1, 8, "3", "5", None])
def test_version_mismatch_is_refused(version):
    with pytest.raises(ValueError, match="version"):
        check(dict(saved(), version=version), loader())


@pytest.mark.parametrize("state", [None, [], "pq_idx=1", 3, (("pq_idx", 0),)])
def test_non_dict_is_refused(state):
    with pytest.raises(ValueError, match="dict"):
        check(state, loader())


@pytest.mark.parametrize("field,value", [
    ("epoch", 0), ("epoch", -1), ("epoch", "2"), ("epoch", True), ("epoch", 1.0),
    ("pq_idx", -1), ("pq_idx", "1"), ("pq_idx", False), ("pq_idx", None),
    ("rg_idx", -2), ("rg_idx", True), ("rg_idx", 3.0),
    ("position", [2, 1, 3, -1, 7]), ("position", [2, 1, 3, "5", 7]), ("position", [2, 1, 3, True, 7]),
    ("position", [2, 1, 3, 5, -7]), ("position", [0, 1, 3, 5, 7]), ("position", [2, 1, 3, 5]),
    ("position", None), ("position", "2:1:3:5:7"),
    ("batch", -1), ("batch", "3"), ("batch", None),
    ("rank", -1), ("rank", "1"), ("rank", True)])
def test_bad_position_field_is_refused_naming_it(field, value):
    with pytest.raises(ValueError) as ei:
        check(dict(saved(), **{field: value}), loader())
    assert repr(field) in str(ei.value)


@pytest.mark.parametrize("field", ["epoch", "pq_idx", "rg_idx", "position", "batch", "rank",
                                   "config", "files", "shapes"])
def test_missing_field_is_refused_naming_it(field):
    state = saved()
    del state[field]
    with pytest.raises(ValueError, match=field):
        check(state, loader())


def test_pq_idx_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"'position' \(file\) is 3"):
        check(saved(file=3), loader())


def test_row_group_of_another_rank_is_refused():
    with pytest.raises(ValueError, match=r"'position' \(row group\) is 4"):
        check(saved(rank=1, world=2, rg=4), loader())


@pytest.mark.parametrize("origin", ["x", {"pq_idx": 0}, {"pq_idx": 0, "rg_idx": 0, "doc": 1},
                                    {"pq_idx": 9, "rg_idx": 0}])
def test_bad_origin_is_refused(origin):
    with pytest.raises(ValueError, match="origin|pq_idx|rg_idx"):
        check(dict(saved(), origin=origin), loader())


# ------------------------------------------------------------------ another rank's state

def test_another_ranks_state_is_located_from_this_ranks_origin():
    r = quiet_check(saved(rank=0, world=4, epoch=3, file=2, rg=8, doc=11, skip=99, batch=7),
                    loader(rank=3, world=4))
    assert r.step == Locate() and (r.position, r.batch, r.shapes) == (Position(1, 0, 3, 0), 7, [[0, 4, 16]])


def test_another_ranks_state_from_a_nanochat_origin_locates_from_its_own_nanochat_cursor():
    state = saved(rank=0, world=4)
    state["origin"] = {"pq_idx": 1, "rg_idx": 5, "epoch": 2}
    from shmloader.sourcestate import digest
    state["digest"] = digest(state)
    r = quiet_check(state, loader(rank=3, world=4))
    assert r.step == Locate() and r.position == nanochat_position(1, 5, 2, rank=3, world=4) == Position(2, 1, 11, 0)


def test_another_ranks_state_with_other_rank_nanochat_warns_and_resumes_as_nanochat():
    state = saved(rank=0, world=4, epoch=3, file=2, rg=8, doc=11, skip=99)
    with pytest.warns(UserWarning, match="rank 0"):
        r = check(state, loader(rank=3, world=4, other_rank="nanochat"))
    assert r.step == EXACT and (r.position.skip, r.batch) == (0, 0)
    assert r.position == nanochat_position(2, 8, 3, rank=3, world=4) == Position(3, 2, 15, 0)
    assert r.origin == {"pq_idx": 2, "rg_idx": 8, "epoch": 3}


# ------------------------------------------------------------------ nanochat states

@pytest.mark.parametrize("state,rank,world,expected", [
    ({"pq_idx": 1, "rg_idx": 5}, 1, 2, Position(1, 1, 7, 0)),
    ({"pq_idx": 0, "rg_idx": 0}, 0, 1, Position(1, 0, 1, 0)),
    ({"pq_idx": 2, "rg_idx": 3, "epoch": 4}, 0, 4, Position(4, 2, 4, 0)),
    ({"pq_idx": 2, "rg_idx": 3, "epoch": 4}, 3, 4, Position(4, 2, 7, 0)),
])
def test_nanochat_state_resumes_as_nanochat_and_is_the_origin(state, rank, world, expected):
    r = quiet_check(json.loads(json.dumps(state)), loader(rank, world))
    assert (r.position, r.batch, r.step) == (expected, 0, EXACT)
    assert r.origin == {"epoch": 1, **state}


@pytest.mark.parametrize("extra", ["doc_idx", "skip", "config", "rank", "B"])
def test_versionless_state_with_unknown_field_is_refused(extra):
    with pytest.raises(ValueError, match=extra):
        check({"pq_idx": 0, "rg_idx": 0, "epoch": 1, extra: 0}, loader())


@pytest.mark.parametrize("field,value", [("pq_idx", -1), ("pq_idx", "0"), ("pq_idx", True),
                                         ("rg_idx", -1), ("rg_idx", None), ("rg_idx", False),
                                         ("epoch", 0), ("epoch", "1"), ("epoch", True)])
def test_versionless_bad_field_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=field):
        check(dict({"pq_idx": 0, "rg_idx": 0, "epoch": 1}, **{field: value}), loader())


def test_versionless_missing_rg_idx_or_pq_idx_or_out_of_range_is_refused():
    with pytest.raises(ValueError, match="rg_idx"):
        check({"pq_idx": 0}, loader())
    with pytest.raises(ValueError, match="pq_idx"):
        check({"rg_idx": 0}, loader())
    with pytest.raises(ValueError, match="pq_idx"):
        check({"pq_idx": 3, "rg_idx": 0}, loader())


# ------------------------------------------------------------------ best-fit buffer runs, digest

def test_buffer_runs_round_trip():
    runs = [[1, 0, 2, 5, 3], [2, 2, 0, 0, 1]]
    state = saved(buffer=runs)
    assert state["buffer"] == "u1:" + bytes([1, 0, 2, 5, 3, 2, 2, 0, 0, 1]).hex()  # the text, as documented
    assert buffer_runs(json.loads(json.dumps(state)), n_files=3) == runs
    assert saved(buffer=[])["buffer"] == "" and buffer_runs(saved(buffer=[]), n_files=3) == []


@settings(deadline=None, max_examples=60)
@given(st.lists(st.lists(st.integers(0, 2**63 - 1), min_size=5, max_size=5), max_size=12))
def test_buffer_text_round_trips_every_width(runs):
    text = encode_runs(runs)
    assert decode_runs(text).tolist() == runs
    top = max((v for run in runs for v in run), default=0)
    width = next(w for w, limit in ((1, 0xFF), (2, 0xFFFF), (4, 0xFFFFFFFF), (8, 2**63 - 1)) if top <= limit)
    assert text == "" if not runs else text.startswith(f"u{width}:") and len(text) == 3 + 2 * 5 * width * len(runs)


@pytest.mark.parametrize("top,width", [(0, 1), (255, 1), (256, 2), (65535, 2), (65536, 4), (2**32 - 1, 4),
                                       (2**32, 8), (2**63 - 1, 8)])
def test_buffer_text_width_at_each_boundary(top, width):
    runs = [[1, 0, 7, 3, 2], [1, 2, top, 0, 1]]
    text = encode_runs(runs)
    assert text.startswith(f"u{width}:") and decode_runs(text).tolist() == runs


@pytest.mark.parametrize("run", [[0, 0, 0, 0, 1], [1, 3, 0, 0, 1], [1, 0, 0, 0, 0]])
def test_buffer_runs_bad_run_is_refused(run):
    with pytest.raises(ValueError, match="buffer"):
        buffer_runs(saved(buffer=[[1, 0, 0, 0, 2], run]), n_files=3)


@pytest.mark.parametrize("text", ["u3:0100000001", "0100000001", "u1:010000000", "u1:0100000001ff",
                                  "u1:01 00000001", "u1:0100000G01", "u1:01000000Ff", "u1:", "u8:" + "ff" * 40,
                                  "u2:0100"])
def test_a_malformed_buffer_text_is_refused(text):
    with pytest.raises(ValueError, match="buffer"):
        buffer_runs(dict(saved(), buffer=text), n_files=3)


@pytest.mark.parametrize("buffer", [[[1, 0, 0, 0, 2]], 5, {"runs": ""}])
def test_a_version_4_buffer_that_is_not_text_is_refused(buffer):
    lo = loader(config=dict(CONFIG, packing="bos_bestfit"), buffered=True)
    with pytest.raises(ValueError, match="buffer"):
        check(dict(saved(skip=0, config=dict(CONFIG, packing="bos_bestfit")), buffer=buffer), lo)


def as_version_5(state: dict) -> dict:
    """`state` as versions 2 to 5 held it: the position in its fields (`epoch`, `pq_idx`, `rg_idx`,
    `doc_idx`, `skip`), not a list, and no nanochat keys of their own; its digest not remade."""
    state = dict(state, version=5)
    epoch, file, rg, doc, skip = state.pop("position")
    state.update(epoch=epoch, pq_idx=file, rg_idx=rg, doc_idx=doc, skip=skip)
    return state


def test_a_version_5_state_is_read():
    state = as_version_5(saved())
    state["digest"] = digest(state)
    r = quiet_check(state, loader())
    assert (r.position, r.batch, r.check) == (Position(2, 1, 3, 5, 7), 40, None)
    assert r.read == RowGroup(2, 1, 3)  # its position's: a version 5 state has no keys of its own
    with pytest.raises(ValueError, match="digest"):
        check(dict(state, doc_idx=6), loader())


def test_a_version_6_state_of_one_source_is_read_as_this_versions():
    """The version after 6 changed a mixture's states only (data/mixrules.py): one source's of version 6,
    its digest as saved, resumes as the same state of this version."""
    lo = loader()
    state = json.loads(json.dumps(make_state(lo, start(lo, AtSource()), Position(2, 1, 3, 5, 7), 40, read=(1, 2, 5))))
    old = dict(state, version=6)
    assert state["version"] == VERSION != 6
    assert quiet_check(old, lo) == quiet_check(state, lo)
    with pytest.raises(ValueError, match="digest"):
        check(dict(old, position=[2, 1, 3, 6, 7]), lo)


def test_nanochat_keys_are_the_last_batch_reading_and_not_the_position():
    """Version 6: nanochat's keys say the row group the last batch's reading ended in (here an
    earlier row group of this rank), the position stays where the next batch starts; a loader
    resumes at the position, and the keys come back as the run's first `read`."""
    lo = loader()
    state = json.loads(json.dumps(make_state(lo, start(lo, AtSource()), Position(2, 1, 3, 0, 0), 40,
                                             read=(1, 2, 5))))
    assert (state["epoch"], state["pq_idx"], state["rg_idx"], state["position"]) == (1, 2, 5, [2, 1, 3, 0, 0])
    r = quiet_check(state, lo)
    assert (r.position, r.read) == (Position(2, 1, 3, 0, 0), RowGroup(1, 2, 5))
    # the keys are not the position: the digest does not cover them, and editing them moves nothing
    assert quiet_check(dict(state, pq_idx=0, rg_idx=1), lo).position == Position(2, 1, 3, 0, 0)
    with pytest.raises(ValueError, match="digest"):
        check(dict(state, position=[2, 1, 3, 1, 0]), lo)


def v3_state(runs, **kw) -> dict:
    """A version 3 state as shmloader saved it before version 4: best fit's buffer as a list of
    runs, and the digest over their int64 bytes."""
    state = as_version_5(saved(skip=0, config=dict(CONFIG, packing="bos_bestfit"), **kw))
    state.update(version=3, buffer=runs)
    state["digest"] = digest(state, np.asarray(runs, dtype=np.int64).reshape(-1, 5).tobytes())
    return json.loads(json.dumps(state))


def test_a_version_3_state_with_a_list_buffer_is_read():
    runs = [[1, 0, 2, 10, 3], [1, 1, 0, 0, 300]]
    lo = loader(config=dict(CONFIG, packing="bos_bestfit"), buffered=True)
    assert quiet_check(v3_state(runs), lo).at.runs == runs
    edited = v3_state(runs)
    edited["buffer"][1][4] = 5
    with pytest.raises(ValueError, match="digest"):
        check(edited, lo)


def test_a_state_mixing_two_ranks_is_refused_naming_the_digest():
    """What DCP gives back when every rank saved its loader under one key: fields of both."""
    mixed = saved(rank=1, doc=5)
    mixed["position"] = saved(rank=0, rg=2, doc=9)["position"]
    with pytest.raises(ValueError, match="digest") as ei:
        check(mixed, loader())
    assert "loader_rank" in str(ei.value)


@pytest.mark.parametrize("field,value", [("batch", 41), ("shapes", [[0, 4, 8]]),
                                         ("origin", {"pq_idx": 0, "rg_idx": 1})])
def test_the_digest_covers_batch_shapes_and_origin(field, value):
    with pytest.raises(ValueError, match="digest"):
        check(dict(saved(), **{field: value}), loader())


def test_the_digest_covers_the_buffer():
    runs = [[1, 0, 2, 10, 3], [1, 1, 0, 0, 4]]
    state = saved(skip=0, buffer=runs, config=dict(CONFIG, packing="bos_bestfit"))
    lo = loader(config=dict(CONFIG, packing="bos_bestfit"), buffered=True)
    assert quiet_check(state, lo).at.runs == runs
    other = saved(skip=0, buffer=[[1, 0, 2, 10, 3], [1, 1, 0, 0, 5]], config=dict(CONFIG, packing="bos_bestfit"))
    for edit in (other["buffer"], "u2:" + bytes.fromhex(state["buffer"][3:]).hex(), ""):
        with pytest.raises(ValueError, match="digest"):
            check(dict(state, buffer=edit), lo)


def test_the_check_travels_to_the_resume_and_the_digest_covers_it():
    state = json.loads(json.dumps(make_state(loader(), start(loader(), AtSource()), Position(2, 1, 3, 5, 7), 40,
                                             check=0x0BADF00D)))
    assert state["check"] == "0badf00d" and quiet_check(state, loader()).check == 0x0BADF00D
    assert saved()["check"] is None and quiet_check(saved(), loader()).check is None
    with pytest.raises(ValueError, match="digest"):
        check(dict(state, check="0badf00e"), loader())


@pytest.mark.parametrize("value", ["0BADF00D", "badf00d", 12, "0badf00dd", "0xbadf00"])
def test_a_malformed_check_is_refused(value):
    state = dict(saved(), check=value)
    state["digest"] = digest(state)
    with pytest.raises(ValueError, match="'check' must be None or 8 lowercase hex digits"):
        check(state, loader())


def test_another_shape_rank_or_file_list_resumes_without_the_check():
    """The batch at the position is another one (another B or T, files new to the state), or
    not this rank's: there is nothing to compare, so the resume carries no check."""
    state = json.loads(json.dumps(make_state(loader(), start(loader(), AtSource()), Position(2, 1, 3, 5, 7), 40, check=7)))
    with pytest.warns(UserWarning, match="another batch shape"):
        assert check(state, loader(T=8)).check is None
    more = FILES + file_list(["/data/shard_00003.parquet"], [10])
    with pytest.warns(UserWarning, match="added to the split"):
        assert check(state, loader(files=more)).check is None
    assert check(state, loader(rank=0)).check is None  # another rank's: located, not compared
    first = json.loads(json.dumps(make_state(loader(), start(loader(), AtSource()), Position(1, 1, 3, 5, 7), 40, check=7)))
    later = [list(f) for f in FILES]
    later[2][1] += 1  # a file after the position (file 1, epoch 1) changed: read as it is now, so not compared
    with pytest.warns(UserWarning, match="after its position changed"):
        assert check(first, loader(files=later)).check is None
    assert quiet_check(first, loader()).check == 7


def test_at_a_change_of_world_size_every_saved_file_must_be_unchanged():
    """The other old ranks may have stood past this state's position, in files after its own."""
    later = [list(f) for f in FILES]
    later[2][1] += 1
    with pytest.raises(ValueError, match="file 2: state has shard_00002.parquet"):
        check(saved(rank=1, world=2), loader(rank=0, world=3, files=later))


def test_a_run_that_began_elastic_refuses_added_files():
    from shmloader.data.elastic import Plan
    from shmloader.state import AtSource, Resume

    plan = Plan.of(2, 40, [(1, 0, 0, 3, 0), (1, 1, 1, 0, 0)])
    lo = loader(rank=0, world=3)
    state = json.loads(json.dumps(make_state(lo, Resume(Position(1, 0, 0, 0), AtSource(plan=plan), shapes=[[0, 4, 16]]),
                                             Position(1, 1, 3, 5, 0), 41)))
    assert quiet_check(state, lo).at.plan == plan
    more = FILES + file_list(["/data/shard_00003.parquet"], [10])
    with pytest.raises(ValueError, match="files added to such a run are not supported yet"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check(state, loader(rank=0, world=3, files=more))
    with pytest.raises(ValueError, match="'elastic' is malformed or edited"):
        check(dict(state, elastic=dict(state["elastic"], batch=39)), lo)


def test_a_version_4_state_without_a_check_is_read():
    state = as_version_5(saved())
    del state["check"]
    state["version"] = 4
    state["digest"] = digest(state)
    r = quiet_check(state, loader())
    assert (r.position, r.check) == (Position(2, 1, 3, 5, 7), None)


def test_the_written_digest_is_the_checked_one():
    """The writer formats the digest's key itself (it runs with every batch): it must give what
    `digest`, which the check uses, gives, whatever the fields hold."""
    lo = loader()
    resume = start(lo, AtSource())
    resume.shapes, resume.origin = [[0, 4, 16], [7, 2, 16]], {"pq_idx": 1, "rg_idx": 3, "epoch": 2}
    for buffer, check_ in itertools.product((None, [], [[1, 2, 3, 4, 5]], np.array([[3, 0, 70000, 1, 2]])),
                                            (None, 0, 0xFFFFFFFF)):
        state = make_state(lo, resume, Position(3, 2, 9, 11, 0), 12345, buffer, check=check_)
        runs = state.get("buffer")
        prefix, raw = (runs[:2].encode(), bytes.fromhex(runs[3:])) if runs else (b"", b"")
        assert state["digest"] == digest(state, prefix + raw)


@settings(deadline=None, max_examples=40)
@given(st.lists(st.lists(st.integers(0, 2**63 - 1), min_size=5, max_size=5), max_size=12))
def test_a_state_from_the_coordinators_encoding_is_the_same_state(runs):
    """The coordinator hands the trainer best fit's buffer already encoded (`encode_buffer`:
    text and crc, through the slot); a state made from it is the one made from the runs,
    digest included."""
    lo = loader()
    encoded = encode_buffer(runs)
    assert encoded.text == encode_runs(runs)
    from_runs = make_state(lo, start(lo, AtSource()), Position(1, 0, 0, 0, 0), 7, runs)
    assert make_state(lo, start(lo, AtSource()), Position(1, 0, 0, 0, 0), 7, encoded) == from_runs
    spelled = encoded.text[:2].encode() + bytes.fromhex(encoded.text[3:]) if runs else b""
    assert encoded.crc == (zlib.crc32(spelled) if runs else 0)
    assert from_runs["digest"] == digest(from_runs, spelled)


def test_a_val_file_the_data_set_does_not_have_is_refused():
    """`val` names the data set's last file; one that is neither the val file nor a train file
    (an edited state, another data set) is refused, not warned of as a shard added."""
    state = saved(val="shard_00003.parquet")
    state["val"] = "shard_99999.parquet"
    with pytest.raises(ValueError, match=r"'val' is 'shard_99999.parquet', a file this data set does not have"):
        check(state, loader(val="shard_00003.parquet"))
    state["val"] = FILES[1][0]  # a train file now: a shard was added after it (a warning, tested above)
    with pytest.warns(UserWarning, match="is read as training data from here on"):
        check(state, loader(val="shard_00003.parquet"))
