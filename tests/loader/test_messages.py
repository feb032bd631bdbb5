"""Errors and warnings say what is wrong, in the caller's process, at the caller's line
(docs/contract.md §3, §4): a bad RANK, a nanochat state of other files, warnings raised through
the drop-in functions."""
import os
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import shmloader
from tests.helpers import loader_children, shm_segments

B, T = 2, 16


def test_a_rank_that_is_not_a_number_is_named(posdata, monkeypatch):
    monkeypatch.setenv("RANK", "abc")
    with pytest.raises(ValueError, match=r"RANK='abc' is not an integer"):
        posdata.loader(B, T)
    assert loader_children() == [] and shm_segments() == []


def test_a_nanochat_state_past_its_files_row_groups_is_refused(posdata):
    n = pq.ParquetFile(posdata.paths[1]).metadata.num_row_groups
    with pytest.raises(ValueError, match=rf"'rg_idx' is 999, but .*shard_00001.parquet .* has {n} row groups"):
        posdata.loader(B, T, resume_state={"pq_idx": 1, "rg_idx": 999, "epoch": 1})
    with posdata.loader(B, T, resume_state={"pq_idx": 1, "rg_idx": n - 1, "epoch": 1}) as ok:
        next(ok)


def test_warnings_through_the_drop_ins_point_at_the_callers_line(posdata):
    with posdata.loader(B, T) as loader:
        next(loader)
        state = loader.state_dict()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gen = shmloader.tokenizing_distributed_data_loader_with_state(
            B, 2 * T, "train", device="cpu", resume_state_dict=state, data=str(posdata.root),
            tokenizer=posdata.tokenizer, num_workers=1)
        next(gen)
        gen.close()
    shape = [w for w in caught if "another batch shape" in str(w.message)]
    assert shape and all(w.filename == __file__ for w in shape), [(w.filename, w.lineno) for w in caught]


def test_more_workers_than_cores_is_warned_at_construction(synth, monkeypatch):
    """num_workers above the usable cores: one CoresWarning naming both, before anything
    starts; within the cores: none."""
    from shmloader import cores

    monkeypatch.setattr(cores, "usable", lambda: 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        synth.loader(2, 16, "train", num_workers=2).close()
        synth.loader(2, 16, "train", num_workers=3).close()
    said = [w for w in caught if issubclass(w.category, cores.CoresWarning)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert "num_workers=3" in str(said[0].message) and "2 cores" in str(said[0].message)
    assert not said[0].filename.startswith(str(Path(shmloader.__file__).parent))  # the caller's line


def test_the_default_workers_are_the_machines_share_and_say_nothing(synth, monkeypatch):
    """No num_workers: as many workers as this rank's share of the cores, at most 4, and no
    CoresWarning; with 8 ranks on the machine, the share is an eighth."""
    from shmloader import cores

    monkeypatch.setattr(cores, "usable", lambda: 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", cores.CoresWarning)
        with synth.loader(2, 16, "train", num_workers=None) as loader:
            assert loader.num_workers == 2
            next(loader)
            assert len(loader.stats()["workers"]) == 2
    monkeypatch.setattr(cores, "usable", lambda: 16)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    with synth.loader(2, 16, "train", num_workers=None) as loader:
        assert loader.num_workers == 2
