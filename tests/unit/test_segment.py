"""ipc/segment.py: the ring's SharedMemory, created and attached out of Python's resource
tracker, sharing one memory; creator_pid, sweep_stale, and the clear OSError when /dev/shm is
too small. Every segment created here is unlinked in a finally block."""

import errno
import os
import re
import subprocess
import sys
from multiprocessing import shared_memory

import numpy as np
import pytest

from shmloader.ipc import segment as segmod
from shmloader.ipc.ring import LAYOUT_VERSION, MAGIC, WORKER_FIELDS, Counter, RingLayout
from shmloader.ipc.segment import PREFIX, SHM_DIR, Attached, creator_pid, sweep_stale
from shmloader.ipc.signals import pid_alive

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs /dev/shm (Linux)")


def own_segments():
    return {n for n in os.listdir(SHM_DIR) if creator_pid(n) == os.getpid()}


def dead_pid():
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not pid_alive(p.pid)
    return p.pid


# ------------------------------------------------------------------ create / attach

def test_create_attach_share_memory():
    lay = RingLayout(n_slots=3, window=17, n_workers=2)
    segment, ring = segmod.create(lay)
    att = None
    try:
        assert segment.name.startswith(PREFIX) and len(segment.name) < 30
        assert creator_pid(segment.name) == os.getpid()
        assert os.path.getsize(os.path.join(SHM_DIR, segment.name)) >= lay.nbytes
        assert list(ring.header[:5]) == [MAGIC, LAYOUT_VERSION, 3, 17, 2]
        # a fresh ring: zeroed counters, logs and worker rows
        assert not ring.stats.any() and not ring.counters.any() and not ring.workers.any()
        assert not ring.records.any() and not ring.free_log.any()
        assert ring.slots.shape == (3, 17) and ring.slots.dtype == np.int64
        assert ring.workers.shape == (2, len(WORKER_FIELDS))

        att = Attached(segment.name, lay)
        other = att.ring
        # creator writes, attached reads
        ring.slots[1] = np.arange(17) * 3 - 5
        ring.counters[Counter.ANNOUNCED] = 2
        ring.stats[0] = 12345
        assert np.array_equal(other.slots[1], np.arange(17) * 3 - 5)
        assert other.counters[Counter.ANNOUNCED] == 2 and other.stats[0] == 12345
        # attached writes, creator reads
        other.slots[2, -1] = -(2**62)
        row = np.arange(len(WORKER_FIELDS)) + 111
        other.workers[1] = row
        other.free_log[0] = 7
        assert ring.slots[2, -1] == -(2**62)
        assert np.array_equal(ring.workers[1], row) and not ring.workers[0].any()
        assert ring.free_log[0] == 7
        # the regions do not overlap: slot 0 untouched by header writes
        assert not ring.slots[0].any()
    finally:
        if att is not None:
            att.close()
        ring.release_views()
        segment.unlink()
    assert segment.name not in os.listdir(SHM_DIR)


def test_attach_refuses_a_segment_that_is_not_a_ring():
    lay = RingLayout(1, 4, 1)
    segment, ring = segmod.create(lay)
    try:
        ring.header[0] = 0
        with pytest.raises(RuntimeError, match=re.escape(segment.name)):
            Attached(segment.name, lay)
    finally:
        ring.release_views()
        segment.unlink()


def test_new_names_are_unique_short_and_carry_the_pid():
    names = {segmod.new_name() for _ in range(200)}
    assert len(names) == 200
    assert all(len(n) < 30 and creator_pid(n) == os.getpid() for n in names)


# ------------------------------------------------------------------ creator_pid

@pytest.mark.parametrize("name,pid", [
    ("shml_1234_abcd", 1234), ("shml_7_0f0f0f0f", 7), ("shml_42", 42),
    ("shml_x12_ab", None), ("shml__ab", None), ("shml_-3_ab", None), ("shml_", None),
    ("psm_1234_ab", None), ("xshml_1234_ab", None), ("sem.shml_1_a", None), ("", None)])
def test_creator_pid(name, pid):
    assert creator_pid(name) == pid


# ------------------------------------------------------------------ sweep_stale

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


def test_sweep_stale_keeps_a_ring_of_this_process():
    segment, ring = segmod.create(RingLayout(1, 8, 1))
    try:
        assert segment.name not in sweep_stale()
        assert segment.name in os.listdir(SHM_DIR)
    finally:
        ring.release_views()
        segment.unlink()


# ------------------------------------------------------------------ too small /dev/shm

def _enospc(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_reserve_names_mib_needed_and_free(monkeypatch):
    monkeypatch.setattr(segmod.os, "posix_fallocate", _enospc)
    with pytest.raises(OSError) as ei:
        segmod._reserve(0, 300 * 2**20)
    msg = str(ei.value)
    assert ei.value.errno == errno.ENOSPC
    assert "300.0 MiB" in msg and "MiB are free" in msg and SHM_DIR in msg
    assert isinstance(ei.value.__cause__, OSError)


def test_create_cleans_up_when_reservation_fails(monkeypatch):
    before = own_segments()
    monkeypatch.setattr(segmod.os, "posix_fallocate", _enospc)
    lay = RingLayout(4, 2**18, 2)  # 8 MiB of slots
    with pytest.raises(OSError, match="MiB"):
        segmod.create(lay)
    assert own_segments() == before  # nothing left behind in /dev/shm


def test_reserve_really_reserves():
    # without the monkeypatch a normal size succeeds and the file has the full size
    segment, ring = segmod.create(RingLayout(2, 1000, 1))
    try:
        st_ = os.stat(os.path.join(SHM_DIR, segment.name))
        assert st_.st_blocks * 512 >= ring.layout.nbytes
    finally:
        ring.release_views()
        segment.unlink()


# ------------------------------------------------------------------ SharedMemory, untracked

def test_the_ring_is_a_shared_memory_the_trainer_creates_and_children_attach(monkeypatch):
    opened = []

    class Spy(shared_memory.SharedMemory):
        def __init__(self, name=None, create=False, size=0, **kw):
            opened.append((name, create, size))
            super().__init__(name, create=create, size=size, **kw)

    monkeypatch.setattr(segmod.shared_memory, "SharedMemory", Spy)
    lay = RingLayout(2, 8, 1)
    segment, ring = segmod.create(lay)
    try:
        assert opened == [(segment.name, True, lay.nbytes)]
        att = Attached(segment.name, lay)
        assert opened[1:] == [(segment.name, False, 0)]
        att.close()
    finally:
        ring.release_views()
        segment.unlink()


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
