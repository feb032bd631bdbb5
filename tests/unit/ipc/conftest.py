"""What the ipc tests share: a pipe's two ends, closed after the test."""
import multiprocessing as mp

import pytest


@pytest.fixture
def pipe():
    mine, theirs = mp.Pipe()
    yield mine, theirs
    for conn in (mine, theirs):
        if not conn.closed:
            conn.close()
