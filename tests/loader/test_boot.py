"""A process's first loader while the forkserver boots (procs/headstart.py, start.py `booting`),
as a training script meets it: its children are made and left unstarted while the server
imports its preloads (stretched here by `tests.slow_preload`), the trainer makes the batches
meanwhile, and the children start at the first `next()` after the server says it has booted.
Each script runs in a fresh process (tests/scripts/first_loader.py), so that its loader is
really its process's first; this suite's own processes have a booted server (conftest.py).

What must hold: the first batch does not wait for the server; every batch, position and state
equals a loader's whose children started at once (in this process), on two shapes of data,
1 and 3 workers, a fast consumer that runs past the head start's most and a slow one; a state
saved before the children started resumes exactly; a loader dropped before they started
leaves nothing."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from shmloader.demo import corpus
from shmloader.procs import headstart
from tests import helpers
from tests.helpers import SCRIPTS

pytestmark = pytest.mark.usefixtures("watchdog")


@pytest.fixture(scope="module")
def skewed(tmp_path_factory, small_texts, enc):
    """Row groups of 1 to 300 documents, documents of 0 to ~20K characters."""
    from tests.loader.test_skewed_shards import SIZES, skewed_docs
    root = tmp_path_factory.mktemp("skewed_boot")
    docs = skewed_docs("\n".join(small_texts), 600)
    paths = corpus.write_shards(docs, root, num_files=3, row_group_size=SIZES)
    return helpers.Dataset(root, paths, enc, enc.encode_ordinary, enc.encode_single_token("<|bos|>"), docs)


def first_loader(ds, tmp_path, B, T, n, boot_s, *extra):
    pkl = corpus.save_tokenizer(ds.tokenizer, tmp_path / "tok")
    env = dict(os.environ, SLOW_PRELOAD_S=str(boot_s))
    run = subprocess.run([sys.executable, str(SCRIPTS / "first_loader.py"), str(ds.root), str(pkl), str(B), str(T),
                          str(n), *map(str, extra)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def reference(ds, B, T, n, state=None, **kw):
    """`n` batches (windows, positions) and states of a loader whose children start at once."""
    out = []
    with ds.loader(B, T, **kw) as loader:
        if state is not None:
            loader.load_state_dict(state)
        for _ in range(n):
            x, y, *pos = next(loader)
            out.append((np.concatenate([x.numpy().ravel(), y.numpy().ravel()[-1:]]).tolist(),
                        pos[0].numpy().ravel().tolist() if pos else None, loader.state_dict()))
        assert loader.stats()["head_batches"] <= headstart.MOST
    return out


def same(got, want):
    for k, (rec, (window, positions, state)) in enumerate(zip(got["batches"], want)):
        assert rec["window"] == window, f"batch {k} differs"
        assert rec.get("positions") == positions, f"batch {k}'s positions differ"
        assert rec["state"] == state, f"the state after batch {k} differs"
    assert len(got["batches"]) == len(want)


@pytest.mark.parametrize("data, B, T, workers", [
    ("synth", 2, 16, 2),
    pytest.param("skewed", 4, 128, 1, marks=pytest.mark.slow),  # a fresh process each: ~7 s
    pytest.param("skewed", 2, 64, 3, marks=pytest.mark.slow)])
def test_a_fast_consumer_gets_the_stream_whole_while_the_forkserver_boots(request, tmp_path, data, B, T, workers):
    ds, n = request.getfixturevalue(data), headstart.BOOTING_MOST + 12
    got = first_loader(ds, tmp_path, B, T, n, 1.5, "--workers", workers, "--positions")
    same(got, reference(ds, B, T, n, num_workers=workers, positions=True))
    assert not got["batches"][0]["started"], "the first batch waited for the forkserver"
    made_here = sum(not r["started"] for r in got["batches"])
    assert made_here == headstart.BOOTING_MOST, (
        f"{made_here} batches came before the children started: the head start stops at BOOTING_MOST "
        f"while the server boots (1.5 s here)")
    assert got["first_s"] < 1.0, f"the first batch took {got['first_s']:.2f} s: it waited for the server"
    assert all(got["pids"]) and got["head_batches"] >= headstart.BOOTING_MOST


@pytest.mark.slow  # a race with the load: at load 14-20 the boot outlasted BOOTING_MOST steps of 0.25 s (issue 50)
@pytest.mark.parametrize("moved", [True, False], ids=["moved-tempdir", "tempdir"])
def test_a_trainer_at_its_pace_starts_the_children_once_the_server_has_booted(synth, tmp_path, moved):
    """At a trainer's pace the children start once the server has booted, before the head start's
    most. With `tempfile.tempdir` set by the training script or not (the scripts of the other
    tests here leave it): the server, whose own is /tmp, finds the trainer's directory through the
    lock file it holds open (forkready.py). Both in the slow suite: the server's boot must end
    within BOOTING_MOST steps of 0.25 s, which a loaded machine outlasts (issue 50)."""
    import shutil
    import tempfile
    B, T, n = 2, 16, 20
    mine = tempfile.mkdtemp(prefix="shb", dir="/tmp")  # short: the server's socket goes in it (AF_UNIX paths are short)
    try:
        got = first_loader(synth, tmp_path, B, T, n, 0.6, "--step-s", 0.25, *(("--tempdir", mine) if moved else ()))
    finally:
        shutil.rmtree(mine, ignore_errors=True)
    same(got, reference(synth, B, T, n))
    started = [r["started"] for r in got["batches"]]
    first = started.index(True)
    assert 1 <= first < headstart.BOOTING_MOST and all(started[first:]), started
    assert got["head_batches"] <= first + headstart.MOST, "the head start went on past MOST once they started"


def test_the_children_start_and_fill_the_ring_during_a_long_first_step(synth, tmp_path):
    """base_train takes its first batch, then compiles its model for its first step: the
    workers start once the server has booted, with no `next()`, and fill the ring meanwhile."""
    B, T, n = 2, 16, 12
    got = first_loader(synth, tmp_path, B, T, n, 0.5, "--pause-s", 8.0, "--pause-until-ready")
    same(got, reference(synth, B, T, n))
    assert not got["started_at_first"]
    assert got["after_pause"]["started"] and got["after_pause"]["ring_ready"] > 0, got["after_pause"]


def test_a_server_killed_while_it_boots_costs_a_new_boot_not_the_wait_for_its_word(synth, tmp_path):
    """The server dies before it has booted (an OOM kill, a SIGTERM to the process group): the
    starter sees it dead and starts the children through a new server, at once; it waited
    for a marker that never came (start.BOOT_S) before. BOOT_S is 400 s here, so that waiting
    for the marker runs past first_loader's 120 s timeout (a wall-clock bound of 20 s against
    30 s failed at load 20: the whole script took 23 s)."""
    B, T, n = 2, 16, 30
    got = first_loader(synth, tmp_path, B, T, n, 1.5, "--kill-server", "--boot-s", 400)
    same(got, reference(synth, B, T, n))


@pytest.mark.slow  # two fresh trainer processes (4.7 CPU-s) racing a stretched boot: it ran past its 60 s deadline at load 14 twice (issue 50)
def test_a_state_saved_before_the_children_started_resumes_exactly(synth, tmp_path):
    B, T = 2, 16
    got = first_loader(synth, tmp_path, B, T, 5, 1.0)
    assert not got["batches"][2]["started"]
    state = got["batches"][2]["state"]
    (tmp_path / "state.json").write_text(json.dumps(state))
    again = first_loader(synth, tmp_path, B, T, 20, 1.0, "--resume", tmp_path / "state.json", "--workers", 3)
    same(again, reference(synth, B, T, 20, state=state))


def test_a_loader_dropped_before_its_children_started_leaves_nothing(synth, tmp_path):
    got = first_loader(synth, tmp_path, 2, 16, 10, 1.5, "--drop-at", 3)
    assert got["unstarted_at_drop"] == 2 and not got["segment_left"]
    assert helpers.wait_clean(2.0) == ([], [])


def test_once_started_the_head_start_makes_at_most_most_more(synth, monkeypatch):
    """In this process (its server booted), a server said to boot until the 3rd batch is taken:
    the children start then, in the background, and a consumer as fast as it goes gets at most
    MOST more batches made here once it sees them started, however soon the ring has one."""
    import threading

    from shmloader.procs import children, run, start
    booted = threading.Event()
    B, T, n = 2, 16, 40
    want = reference(synth, B, T, n)
    # each module that asks: the run's (the head start's most), the children's (made, left
    # unstarted) and the starter thread's (start.py `Start.later` starts them once it says
    # booted: with the real, booted server it started them at once, and they were seen
    # started at the 1st-3rd batch, whichever their start ended before)
    for module in (children, run, start):
        monkeypatch.setattr(module, "booting", lambda start_method: not booted.is_set())
    got, started = [], []
    with synth.loader(B, T) as loader:
        for k in range(n):
            x, y = next(loader)
            got.append(np.concatenate([x.numpy().ravel(), y.numpy().ravel()[-1:]]).tolist())
            started.append(all(p.pid is not None for p in loader.debug(start=False).workers))
            if k == 2:  # "booted": the starter starts them within its next look; the consumer sees them
                booted.set()
                deadline = time.monotonic() + 10
                while any(p.pid is None for p in loader.debug(start=False).workers) and time.monotonic() < deadline:
                    time.sleep(0.005)
        head = loader.stats()["head_batches"]
    assert got == [w for w, _, _ in want]
    assert started == [False] * 3 + [True] * (n - 3), started
    assert 3 <= head <= 3 + headstart.MOST, f"{head} batches made here: the head start went on past MOST"


def test_a_trainer_killed_before_its_children_started_leaves_no_segment(synth, tmp_path):
    """SIGKILL during the boot, the children never started (no coordinator to unlink the ring
    for a dead trainer): the server, once booted and alone, sweeps it as it exits."""
    import signal
    pkl = corpus.save_tokenizer(synth.tokenizer, tmp_path / "tok")
    env = dict(os.environ, SLOW_PRELOAD_S="1.5")
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "first_loader.py"), str(synth.root), str(pkl), "2", "16",
                             "5", "--pause-s", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 30
        while not helpers.shm_segments(proc.pid) and time.monotonic() < deadline:  # its first run has its ring
            time.sleep(0.01)
        assert helpers.shm_segments(proc.pid), "the trainer made no ring"
        time.sleep(0.3)  # its first batch made, the server still booting (1.5 s)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(10)
    assert helpers.wait_no_segment(proc.pid, 10.0) == [], "the killed trainer's ring was left in /dev/shm"
