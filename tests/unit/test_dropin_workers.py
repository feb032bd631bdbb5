"""nanochat's `tokenizer_threads` as worker processes (shmloader/nanochat.py): at most the cores
the training process may run on, unless `num_workers` says how many."""
import os
import re

import pytest

from shmloader import nanochat


@pytest.mark.parametrize("threads, cores, want", [(4, 2, 2), (4, 8, 4), (1, 2, 1), (4, 1, 1), (6, 6, 6)])
def test_tokenizer_threads_are_capped_at_the_cores(monkeypatch, threads, cores, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert nanochat._workers(threads, None) == want


def test_num_workers_is_taken_as_given(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert nanochat._workers(4, 3) == 3
    assert nanochat._workers(4, 8) == 8


@pytest.mark.parametrize("bad", [0, -1, "4", True, 2.0])
def test_a_bad_thread_count_is_refused_naming_tokenizer_threads(monkeypatch, bad):
    """It was refused as "num_workers must be a positive integer", a keyword the caller never passed."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    with pytest.raises(ValueError, match=r"tokenizer_threads must be a positive integer .*got " + re.escape(repr(bad))):
        nanochat.tokenizing_distributed_data_loader_with_state(2, 16, "train", tokenizer_threads=bad, device="cpu",
                                                               data="/nonexistent", tokenizer="gpt2")


def test_a_numpy_thread_count_is_capped_at_the_cores_too(monkeypatch):
    """np.int64(4) is a count: capped as 4 is (it went to the loader uncapped)."""
    import numpy as np
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert nanochat._workers(np.int64(4), None) == 2
