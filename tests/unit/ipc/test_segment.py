"""ipc/segment.py in this process: the ring's SharedMemory, created and attached out of
Python's resource tracker, sharing one memory; creator_pid, sweep_stale keeping this
process's ring, and the clear ShmLoaderError when /dev/shm is too small or read-only. Every segment created here
is unlinked in a finally block. (A dead creator's segment swept, and the resource tracker of
a killed trainer with children: tests/loader/test_segment.py.)"""

import errno
import os
import re
from multiprocessing import shared_memory

import numpy as np
import pytest

from shmloader.errors import ShmLoaderError
from shmloader.ipc import segment as segmod
from shmloader.ipc.ring import LAYOUT_VERSION, MAGIC, WORKER_FIELDS, Counter, RingLayout, WorkerCol
from shmloader.ipc.segment import PREFIX, SHM_DIR, Attached, creator_pid, sweep_stale

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs /dev/shm (Linux)")


def own_segments():
    return {n for n in os.listdir(SHM_DIR) if creator_pid(n) == os.getpid()}


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
        assert not ring.stats.any() and not ring.counters.any()
        assert (ring.workers[:, WorkerCol.PIECE] == -1).all() and not ring.workers[:, WorkerCol.PID].any()  # no worker yet
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
        assert np.array_equal(ring.workers[1], row) and ring.workers[0].tolist() == [0, -1] + [0] * (len(row) - 2)
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

def test_sweep_stale_keeps_a_ring_of_this_process():
    segment, ring = segmod.create(RingLayout(1, 8, 1))
    try:
        assert segment.name not in sweep_stale()
        assert segment.name in os.listdir(SHM_DIR)
    finally:
        ring.release_views()
        segment.unlink()


# ------------------------------------------------------------------ too small or read-only /dev/shm

def _enospc(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_reserve_names_mib_needed_and_free(monkeypatch):
    monkeypatch.setattr(segmod.os, "posix_fallocate", _enospc)
    with pytest.raises(ShmLoaderError) as ei:
        segmod._reserve(0, 300 * 2**20)
    msg = str(ei.value)
    assert "300.0 MiB (314,572,800 bytes)" in msg and "bytes) are free" in msg and SHM_DIR in msg
    assert "--shm-size" in msg and "lower B, T or n_slots" in msg, msg
    assert isinstance(ei.value.__cause__, OSError) and ei.value.__cause__.errno == errno.ENOSPC


def test_create_cleans_up_when_reservation_fails(monkeypatch):
    before = own_segments()
    monkeypatch.setattr(segmod.os, "posix_fallocate", _enospc)
    lay = RingLayout(4, 2**18, 2)  # 8 MiB of slots
    with pytest.raises(ShmLoaderError, match="MiB"):
        segmod.create(lay)
    assert own_segments() == before  # nothing left behind in /dev/shm


@pytest.mark.parametrize("code, says", [(errno.EROFS, r"/dev/shm is read-only \(Read-only file system\): mount a "
                                                      r"writable tmpfs there \(docker: --tmpfs /dev/shm or --shm-size"),
                                        (errno.ENOSPC, r"but only [\d.]+ MiB \([\d,]+ bytes\) are free \(No space "
                                                       r"left on device\): enlarge /dev/shm .*docker: --shm-size"),
                                        (errno.EACCES, r"may not create files there \(Permission denied\)")])
def test_a_dev_shm_that_refuses_the_segment_is_a_shmloader_error(monkeypatch, code, says):
    """Creating the segment itself refused (a read-only /dev/shm: EROFS; full: ENOSPC; not
    this user's: EACCES): a ShmLoaderError naming /dev/shm, the size asked and what to do,
    raised from the OSError (it was a bare `OSError [Errno 30]`), and nothing left behind."""
    def refuse(name, create=False, size=0):
        assert create
        raise OSError(code, os.strerror(code), f"/{name}")

    before = own_segments()
    monkeypatch.setattr(segmod, "open_shared", refuse)
    lay = RingLayout(4, 2**18, 2)
    with pytest.raises(ShmLoaderError, match=says) as ei:
        segmod.create(lay)
    msg = str(ei.value)
    assert msg.startswith(f"shmloader needs {lay.nbytes / 2**20:.1f} MiB ({lay.nbytes:,} bytes) of shared memory "
                          f"in {SHM_DIR} for its ring"), msg
    assert isinstance(ei.value.__cause__, OSError) and ei.value.__cause__.errno == code
    assert own_segments() == before


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
