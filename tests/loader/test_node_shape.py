"""A GPU node's shape on this machine (issue 53's users): one rank of several with many more
workers than cores (16 on 2), shuffled, with document positions, both packings. Its batches
equal the same rank's with one worker, byte for byte, also across a SIGKILL of the worker that
is busiest, and a state saved at 16 workers resumes exactly at 3. The suite's other oracles
run 1 to 4 workers; /tmp/node's scripts (the node helper's report) ran the rest of the shape:
torchrun of 2 and 3 ranks, elastic resumes 2 -> 3 -> 2, mixtures, kills of a rank and Ctrl-C."""
import hashlib
import itertools
import os
import signal
import time
import warnings

import pytest

import shmloader
from shmloader.cores import CoresWarning
from shmloader.demo import corpus
from tests import helpers
from tests.helpers import wait_clean

pytestmark = [pytest.mark.usefixtures("watchdog"), pytest.mark.slow]
B, T = 2, 32
N, SAVE, KILL = 90, 40, 25
OPTS = {"concat": {}, "bos_bestfit": {"buffer_size": 24, "tokenizer_batch_size": 4}}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("node_data")
    lengths = [(i * 37) % 53 + (0 if i % 17 else 120) for i in range(600)]  # a long one every 17
    corpus.write_shards(helpers.position_documents(lengths), root, num_files=4, row_group_size=[9, 30, 4, 17])
    return root


def digest(batch) -> str:
    h = hashlib.sha256()
    for t in batch:
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def busiest(loader) -> int:
    """The pid of the worker that used the most CPU in the last 50 ms."""
    pids = [w.pid for w in loader.debug().workers]
    before = {p: helpers.cpu_seconds(p) for p in pids}
    time.sleep(0.05)
    return max(pids, key=lambda p: (helpers.cpu_seconds(p) - before[p], before[p]))


def run(root, packing, workers, n=N, kill=None, save=None, resume=None):
    """rank 1 of 2's first `n` batches' digests (and its state after `save` batches)."""
    out, state = [], None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoresWarning)  # the point: more workers than cores
        loader = shmloader.ShmLoader(str(root), helpers.IntTokenizer(), B, T, "train", device="cpu",
                                     num_workers=workers, rank=1, world_size=2, shuffle=True, seed=5,
                                     shuffle_window=16, positions=True, packing=packing, timeout=60,
                                     resume_state=resume, **OPTS[packing])
    with loader:
        it = iter(loader)
        for i in range(n):
            if i == kill:
                os.kill(busiest(loader), signal.SIGKILL)
            out.append(digest(next(it)))
            if i + 1 == save:
                state = loader.state_dict()
        heals = loader.stats()["heals"]
        pid = os.getpid()
    assert wait_clean(5.0, pid) == ([], []), "children or /dev/shm segments left"
    return out, state, heals


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_sixteen_workers_on_two_cores_equal_one_worker_across_a_kill_and_a_resume_at_three(data, packing):
    want, _, _ = run(data, packing, 1)
    got, state, heals = run(data, packing, 16, kill=KILL, save=SAVE)
    assert heals == 1
    assert got == want, f"first differing batch {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"
    resumed, _, _ = run(data, packing, 3, n=N - SAVE, resume=state)
    assert resumed == want[SAVE:]
