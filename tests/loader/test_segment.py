"""ipc/segment.py across processes: sweep_stale unlinks the segment of a creator that has
exited, judged by the creator's lock on it (so also across PID namespaces that share
/dev/shm), and keeps a live one's, one being created, and foreign names; the resource tracker
that a killed trainer's children shared never unlinks nor reports its segment. Every segment
created here is unlinked in a finally block. (The segment in one process:
tests/unit/ipc/test_segment.py.)"""

import fcntl
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from shmloader.ipc import segment as segmod
from shmloader.ipc.ring import MAGIC
from shmloader.ipc.segment import PREFIX, SHM_DIR, sweep_stale
from shmloader.ipc.signals import pid_alive
from tests import helpers

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs /dev/shm (Linux)")


def dead_pid():
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not pid_alive(p.pid)
    return p.pid


def _write_ring(path: str, version: int, age_s: float = 0.0):
    """A file that looks like a ring of layout `version` (0: no header yet), `age_s` old."""
    head = np.zeros(8, dtype=np.int64)
    if version:
        head[:2] = (MAGIC, version)
    with open(path, "wb") as f:
        f.write(head.tobytes())
    if age_s:
        os.utime(path, (time.time() - age_s, time.time() - age_s))


def test_sweep_stale_unlinks_dead_and_keeps_live():
    """Rings of the layout before creators held a lock (3) are judged by their creator's pid."""
    dead = dead_pid()
    stale = f"{PREFIX}{dead}_deadbeef"
    live = f"{PREFIX}{os.getpid()}_livelive"
    foreign = f"psm_{dead}_notours"  # not a shmloader name: never touched
    paths = [os.path.join(SHM_DIR, n) for n in (stale, live, foreign)]
    try:
        for p in paths:
            _write_ring(p, version=3)
        swept = sweep_stale()  # (a loader of another process may sweep the stale one first)
        assert live not in swept and foreign not in swept
        left = set(os.listdir(SHM_DIR))
        assert stale not in left and live in left and foreign in left
    finally:
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)


TRACKER_SCRIPT = """
import multiprocessing as mp, os, signal, sys
from shmloader.ipc import segment as segmod
from shmloader.ipc.ring import RingLayout

LAYOUT = RingLayout(2, 8, 1)

def attach(name):
    segmod.Attached(name, LAYOUT).close()

if __name__ == "__main__":
    segment, ring = segmod.create(LAYOUT)
    ctx = mp.get_context(sys.argv[1])
    kids = [ctx.Process(target=attach, args=(segment.name,)) for _ in range(4)]
    for p in kids:
        p.start()
    for p in kids:
        p.join()
    assert all(p.exitcode == 0 for p in kids), [p.exitcode for p in kids]
    if os.fork() == 0:
        # a holder of the creator's lock (and of nothing else: the tracker must see the trainer
        # die), so that a loader of a test run side by side does not sweep the segment before
        # the test has looked; it exits when the test closes its stdin
        os.closerange(3, segment.lock_fd)
        os.closerange(segment.lock_fd + 1, 1 << 16)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        os.read(0, 1)
        os._exit(0)
    print(segment.name, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_resource_tracker_never_holds_the_segment(tmp_path, method):
    """A trainer that created a segment, with children that attached it side by side (they
    share its resource tracker), is SIGKILLed: the tracker, which outlives it, neither unlinks
    the segment nor prints about it (a leak warning, or a traceback from an unregister it did
    not expect)."""
    script = tmp_path / "trainer.py"
    script.write_text(TRACKER_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), method], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    name = ""
    try:
        name = proc.stdout.readline().strip()
        assert proc.wait(timeout=60) == -9 and name.startswith(PREFIX), (proc.returncode, name)
        time.sleep(1.0)  # the tracker sees the trainer's end (its pipe's EOF) and would act now
        present = name in os.listdir(SHM_DIR)
    finally:
        proc.stdin.close()  # the holder exits
        # the tracker keeps stderr open until it exits: this returns after its report, if any
        stderr = proc.stderr.read()
        if name:
            segmod.Segment(name).unlink()
    assert present, "the resource tracker unlinked the killed trainer's segment"
    assert stderr == "", stderr


def test_sweep_judges_a_locked_layout_by_its_lock_not_its_pid():
    """From layout 4 the creator's lock decides, whatever its pid says here (in another PID
    namespace the pid means nothing): an unlocked ring is swept even under a live pid's name, a
    locked one kept even under a dead pid's; a file without a header yet (being created) is
    kept until it is `UNBORN_S` old."""
    dead = dead_pid()
    names = {"unlocked_live_pid": f"{PREFIX}{os.getpid()}_unlocked", "locked_dead_pid": f"{PREFIX}{dead}_locked",
             "unborn_young": f"{PREFIX}{dead}_young", "unborn_old": f"{PREFIX}{dead}_oldold"}
    paths = {k: os.path.join(SHM_DIR, n) for k, n in names.items()}
    holder = None
    try:
        _write_ring(paths["unlocked_live_pid"], version=segmod.LOCKED_SINCE)
        _write_ring(paths["locked_dead_pid"], version=segmod.LOCKED_SINCE)
        _write_ring(paths["unborn_young"], version=0)
        _write_ring(paths["unborn_old"], version=0, age_s=segmod.UNBORN_S + 5)
        holder = os.open(paths["locked_dead_pid"], os.O_RDONLY)
        fcntl.flock(holder, fcntl.LOCK_EX)  # as a live creator in another namespace holds it
        swept = set(sweep_stale())  # (a loader of another process may sweep some first: what is left counts)
        assert not swept & {names["locked_dead_pid"], names["unborn_young"]}
        left = set(os.listdir(SHM_DIR))
        assert names["locked_dead_pid"] in left and names["unborn_young"] in left
        assert not left & {names["unlocked_live_pid"], names["unborn_old"]}
        os.close(holder)  # the creator dies: the kernel drops its lock
        holder = None
        sweep_stale()
        assert names["locked_dead_pid"] not in os.listdir(SHM_DIR)
    finally:
        if holder is not None:
            os.close(holder)
        for p in paths.values():
            if os.path.exists(p):
                os.unlink(p)


def test_a_loaders_segment_is_locked_by_its_trainer_until_it_is_closed(synth):
    with synth.loader(2, 16, num_workers=1) as loader:
        next(loader)
        name = loader.debug().segment
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        assert name not in sweep_stale()


NAMESPACE_TRAINER = """
import sys
import shmloader
from tests.helpers import IntTokenizer

with shmloader.ShmLoader(sys.argv[1], IntTokenizer(), 2, 16, num_workers=1, device="cpu", n_slots=2) as loader:
    next(loader)
    print(loader.debug().segment, flush=True)
    sys.stdin.readline()  # the other namespace has swept
    for _ in range(200):
        next(loader)
    print("ok", flush=True)
"""
SWEEP = "import json, os, shmloader.ipc.segment as s; print(json.dumps([os.getpid(), s.sweep_stale()]))"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_loader_in_another_pid_namespace_never_unlinks_a_live_ring(posdata, tmp_path):
    """Two loaders share one /dev/shm (a private tmpfs, so the machine's is untouched) from two
    PID namespaces, as containers started with --ipc=host do: the second one's start-up sweep
    cannot see the first trainer's pid, and must leave its live ring alone; the first keeps
    reading its batches. With pids alone (layout 3), that sweep unlinked the ring."""
    import json

    script = tmp_path / "trainer.py"
    script.write_text(NAMESPACE_TRAINER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(helpers.REPO_ROOT), os.environ.get("PYTHONPATH")])))
    outer = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} {script} {posdata.root}"
    with subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", outer],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as first:
        try:
            name = first.stdout.readline().strip()
            assert name.startswith(PREFIX), first.stderr.read()
            # in the first one's mount namespace (its /dev/shm), a new PID namespace
            second = subprocess.run(["nsenter", f"--target={first.pid}", "--mount", "--", "unshare", "--pid",
                                     "--fork", "--mount-proc", sys.executable, "-c", SWEEP],
                                    capture_output=True, text=True, env=env, timeout=60)
            assert second.returncode == 0, second.stderr
            pid, swept = json.loads(second.stdout)
            assert pid == 1, "the sweep did not run in a PID namespace of its own"
            assert name not in swept, f"the other PID namespace swept a live ring: {swept}"
            first.stdin.write("go\n")
            first.stdin.flush()
            assert first.stdout.readline().strip() == "ok", first.stderr.read()
        finally:
            if first.poll() is None:
                first.kill()
