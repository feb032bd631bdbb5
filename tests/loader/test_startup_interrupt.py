"""Ctrl-C at any moment of a loader's start-up and first `next()` (procs/start.py `_start`,
coordinator_main, worker_main, segment.create): a trainer script, in a session of its own,
builds a loader (its process's first, so multiprocessing's forkserver starts too) and takes
batches; SIGINT goes to its whole process group, as a terminal's Ctrl-C does, at delays
spread over start-up, timed from a marker the script prints just before it builds the
loader. Each time the trainer, and only the trainer, gets KeyboardInterrupt (it exits with
code 42), nothing prints a traceback or an error, and no process of the group and no
/dev/shm segment of the trainer is left.

The windows of start-up this covers (timed on a 2-core machine): the forkserver's preloads
(~100-400 ms after the marker), a child's bootstrap before it ignores SIGINT, a child
attaching the segment after the trainer already unlinked it, and the resource tracker's start
inside the segment's creation (where a segment could be left behind). (A child attaching
after the trainer is gone, in this process: tests/unit/ipc/test_startup_interrupt.py.)
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from shmloader.demo import corpus
from tests import helpers
from tests.helpers import live_processes, pid_alive, shm_segments

pytestmark = pytest.mark.usefixtures("watchdog")

DELAYS_MS = [0, 25, 50, 75, 100, 150, 200, 275, 350, 450]
QUICK_DELAYS_MS = [0, 100, 275]  # the default suite's (its 10 minutes): before, in and after start-up; all with -m slow
INTERRUPTED = 42

TRAINER = textwrap.dedent("""
    import signal, sys
    # Ctrl-C as in a terminal's foreground: a test run from a background job inherits SIGINT
    # ignored, and Python then raises no KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from shmloader import ShmLoader
    from tests import helpers

    try:
        print("start", flush=True)  # inside: a SIGINT at once can land before the next line
        with ShmLoader(sys.argv[1], helpers.IntTokenizer(), 2, 16, "train", num_workers=2,
                       device="cpu") as loader:
            while True:
                next(loader)
    except KeyboardInterrupt:
        sys.exit(%d)
""" % INTERRUPTED)


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (the trainer's children keep its group even
    when they outlive it)."""
    return [pid for pid, fields in live_processes() if int(fields[2]) == pgid]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("interrupt")
    corpus.write_shards(helpers.position_documents([20] * 300), root, num_files=3, row_group_size=30)
    return root


def interrupt_at(data, delay_ms: int):
    """Run the trainer, Ctrl-C its group `delay_ms` after its marker; return what is wrong."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(helpers.REPO_ROOT),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(data)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "start", proc.communicate(timeout=20)[1]
        time.sleep(delay_ms / 1000)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    deadline = time.monotonic() + 3
    while (group_members(proc.pid) or shm_segments(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    left, segs = group_members(proc.pid), shm_segments(proc.pid)
    for pid in left:  # do not leave them to later tests
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    for name in segs:
        os.unlink(os.path.join("/dev/shm", name))
    wrong = []
    if proc.returncode != INTERRUPTED:
        wrong.append(f"exit code {proc.returncode}, not {INTERRUPTED}")
    if "Traceback" in err or "Error" in err:
        wrong.append("stderr:\n" + err)
    if left:
        wrong.append(f"processes left in its group: {left}")
    if segs:
        wrong.append(f"segments left: {segs}")
    return wrong


@pytest.mark.deadline(300)  # a hang is each delay's own 20 s (`interrupt_at`); 10 starts at load 14 took over 60 s
@pytest.mark.parametrize("delays", [QUICK_DELAYS_MS, pytest.param(DELAYS_MS, marks=pytest.mark.slow)],
                         ids=["quick", "all"])
def test_ctrl_c_during_startup_and_first_next(data, delays):
    failures = {}
    for delay in delays:
        wrong = interrupt_at(data, delay)
        if wrong:
            failures[delay] = wrong
    assert not failures, "\n".join(f"SIGINT at {d} ms: " + "; ".join(w) for d, w in failures.items())
