"""mixkeys.py: nanochat's keys of a mixture, over a fake of `Sources` (two files a source, the
second source's first file the run's file 2)."""
from types import SimpleNamespace

import pytest

from shmloader import mixkeys
from shmloader.position import Position, RowGroup


def sources(*names):
    lo = {name: 2 * i for i, name in enumerate(names)}
    return SimpleNamespace(
        names=tuple(names),
        local=lambda p: p._replace(file=p.file - max(v for v in lo.values() if v <= p.file)),
        to_run=lambda name, p: p._replace(file=p.file + lo[name]),
        source_files=lambda name: [["a.parquet", 1, None], ["b.parquet", 1, None]])


def mark(read):
    return SimpleNamespace(read=read, position=Position(1, 3, 4, 5, 6))


def test_one_sources_keys_are_the_row_group_its_reading_ended_in_several_the_positions():
    here = Position(1, 1, 4, 5, 6)  # the position, numbered within its source
    assert mixkeys.of_mark(sources("x"), mark(RowGroup(1, 1, 3)), here) == (1, 1, 3)
    assert mixkeys.of_mark(sources("x"), mark(None), here) == (1, 1, 4)  # before any batch
    assert mixkeys.of_mark(sources("x", "y"), mark(RowGroup(1, 3, 3)), here) == (1, 1, 4)


def test_a_resumed_runs_first_keys_are_its_states_over_the_same_one_source():
    state = {"epoch": 2, "pq_idx": 1, "rg_idx": 7, "mixture": {"sources": {"y": {}}}}
    assert mixkeys.read_of(sources("y"), state) == RowGroup(2, 1, 7)
    assert mixkeys.read_of(sources("x"), state) is None  # the state's keys are another source's
    assert mixkeys.read_of(sources("x", "y"), dict(state, mixture={"sources": {"x": {}, "y": {}}})) is None


def test_only_a_state_of_this_one_source_gives_its_keys():
    """`of_one_source` decides `read_of` and `other_rank="nanochat"` (mixstate.py): a state of
    sources x and y whose next token is y's says y's row group, never x's."""
    assert mixkeys.of_one_source(sources("x"), {"mixture": {"sources": {"x": {}}}})
    assert not mixkeys.of_one_source(sources("x"), {"mixture": {"sources": {"x": {}, "y": {}}}})
    assert not mixkeys.of_one_source(sources("x"), {"mixture": {"sources": {"y": {}}}})
    assert not mixkeys.of_one_source(sources("x", "y"), {"mixture": {"sources": {"x": {}, "y": {}}}})


def test_an_origin_is_a_one_source_runs_and_checked():
    assert mixkeys.origin(sources("x"), {"origin": None}) is None
    keys = {"pq_idx": 1, "rg_idx": 2, "epoch": 1}
    assert mixkeys.origin(sources("x"), {"origin": keys}) == keys
    with pytest.raises(ValueError, match="only a mixture of one source begins there"):
        mixkeys.origin(sources("x", "y"), {"origin": keys})
    with pytest.raises(ValueError, match="'pq_idx' is 2 but the split has 2 files"):
        mixkeys.origin(sources("x"), {"origin": dict(keys, pq_idx=2)})
