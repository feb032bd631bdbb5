"""ipc/segment.py across processes: sweep_stale unlinks the segment of a creator that has
exited (and keeps a live one's and foreign names), and the resource tracker that a killed
trainer's children shared never unlinks nor reports its segment. Every segment created here
is unlinked in a finally block. (The segment in one process: tests/unit/test_segment.py.)"""

import os
import subprocess
import sys

import pytest

from shmloader.ipc import segment as segmod
from shmloader.ipc.segment import PREFIX, SHM_DIR, sweep_stale
from shmloader.ipc.signals import pid_alive

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs /dev/shm (Linux)")


def dead_pid():
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not pid_alive(p.pid)
    return p.pid


def test_sweep_stale_unlinks_dead_and_keeps_live():
    dead = dead_pid()
    stale = f"{PREFIX}{dead}_deadbeef"
    live = f"{PREFIX}{os.getpid()}_livelive"
    foreign = f"psm_{dead}_notours"  # not a shmloader name: never touched
    paths = [os.path.join(SHM_DIR, n) for n in (stale, live, foreign)]
    try:
        for p in paths:
            with open(p, "wb") as f:
                f.write(b"\0" * 64)
        swept = sweep_stale()
        assert stale in swept
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
    # the tracker keeps stderr open until it exits: run() returns after its report, if any
    proc = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=60)
    name = proc.stdout.strip()
    assert proc.returncode == -9 and name.startswith(PREFIX), (proc.returncode, proc.stdout, proc.stderr)
    try:
        assert name in os.listdir(SHM_DIR), "the resource tracker unlinked the killed trainer's segment"
        assert proc.stderr == "", proc.stderr
    finally:
        segmod.Segment(name).unlink()
