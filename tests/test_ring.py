"""ring.py: layout arithmetic, create/attach sharing one memory, a zeroed ring is FREE,
creator_pid, sweep_stale, and the clear OSError when /dev/shm is too small.
Every segment created here is unlinked in a finally block."""

import errno
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader import ring as ringmod
from shmloader.ring import (ALIGN, FIXED_WORDS, LAYOUT_VERSION, MAGIC, PREFIX, RECORD_FIELDS,
                            SHM_DIR, STATS_FIELDS, WORKER_FIELDS, Attached, Counter, RingLayout,
                            SlotState, creator_pid, sweep_stale)

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="needs /dev/shm (Linux)")


def own_segments():
    return {n for n in os.listdir(SHM_DIR) if creator_pid(n) == os.getpid()}


def dead_pid():
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not ringmod.pid_alive(p.pid)
    return p.pid


# ------------------------------------------------------------------ layout

PER_SLOT = 1 + len(RECORD_FIELDS) + 1   # its state, its announcement record, its free-log entry


@settings(deadline=None)
@given(n_slots=st.integers(1, 64), window=st.integers(1, 10**6), n_workers=st.integers(0, 256))
def test_layout_sizes_and_alignment(n_slots, window, n_workers):
    lay = RingLayout(n_slots, window, n_workers)
    assert FIXED_WORDS == 5 + len(STATS_FIELDS) + len(Counter)
    assert lay.header_words == FIXED_WORDS + n_slots * PER_SLOT + n_workers * len(WORKER_FIELDS)
    assert lay.slots_offset % ALIGN == 0 and ALIGN == 4096
    assert lay.header_words * 8 <= lay.slots_offset < lay.header_words * 8 + ALIGN
    assert lay.nbytes == lay.slots_offset + n_slots * window * 8


def test_views_tile_the_header():
    """Every header view is where the layout says, and together they cover it exactly once."""
    lay = RingLayout(3, 5, 2)
    ring = ringmod.Ring(bytearray(lay.nbytes), lay, "x")
    views = [ring.header[:5], ring.stats, ring.counters, ring.slot_states, ring.workers,
             ring.records, ring.free_log]
    for i, v in enumerate(views):
        v[...] = i + 1
    assert ring.header.tolist() == [i + 1 for i, v in enumerate(views) for _ in range(v.size)]
    assert ring.records.shape == (3, len(RECORD_FIELDS)) and ring.free_log.shape == (3,)


def test_layout_examples():
    assert RingLayout(4, 100, 2).slots_offset == 4096
    # headers that end exactly at a page boundary or one word short of it, then a worker more
    per_worker = len(WORKER_FIELDS)
    for pages in (1, 2, 5):
        words = pages * 512
        found = [(s, (words - short - FIXED_WORDS - s * PER_SLOT) // per_worker)
                 for short in (0, 1) for s in range(1, 9)
                 if (words - short - FIXED_WORDS - s * PER_SLOT) % per_worker == 0]
        assert found
        for n_slots, n_workers in found:
            assert RingLayout(n_slots, 10, n_workers).header_words in (words, words - 1)
            assert RingLayout(n_slots, 10, n_workers).slots_offset == pages * 4096
            assert RingLayout(n_slots, 10, n_workers + 1).slots_offset == (pages + 1) * 4096
    fits = (512 - FIXED_WORDS - PER_SLOT) // per_worker   # workers whose rows fit one page with 1 slot
    assert RingLayout(1, 1, fits).slots_offset == 4096
    assert RingLayout(1, 1, fits + 1).slots_offset == 8192


def test_slot_state_zero_is_free():
    assert SlotState.FREE == 0 and SlotState(0) is SlotState.FREE
    assert sorted(s.value for s in SlotState) == [0, 1, 2, 3]


# ------------------------------------------------------------------ create / attach

def test_create_attach_share_memory():
    lay = RingLayout(n_slots=3, window=17, n_workers=2)
    segment, ring = ringmod.create(lay)
    att = None
    try:
        assert segment.name.startswith(PREFIX) and len(segment.name) < 30
        assert creator_pid(segment.name) == os.getpid()
        assert os.path.getsize(os.path.join(SHM_DIR, segment.name)) >= lay.nbytes
        assert list(ring.header[:5]) == [MAGIC, LAYOUT_VERSION, 3, 17, 2]
        # a fresh ring: zeroed counters, every slot FREE, zeroed worker rows
        assert not ring.stats.any() and not ring.workers.any()
        assert [SlotState(s) for s in ring.slot_states] == [SlotState.FREE] * 3
        assert ring.slots.shape == (3, 17) and ring.slots.dtype == np.int64
        assert ring.workers.shape == (2, len(WORKER_FIELDS))

        att = Attached(segment.name, lay)
        other = att.ring
        # creator writes, attached reads
        ring.slots[1] = np.arange(17) * 3 - 5
        ring.slot_states[2] = SlotState.READY
        ring.stats[0] = 12345
        assert np.array_equal(other.slots[1], np.arange(17) * 3 - 5)
        assert other.slot_states[2] == SlotState.READY and other.stats[0] == 12345
        # attached writes, creator reads
        other.slots[2, -1] = -(2**62)
        row = np.arange(len(WORKER_FIELDS)) + 111
        other.workers[1] = row
        other.slot_states[0] = SlotState.FILLING
        assert ring.slots[2, -1] == -(2**62)
        assert np.array_equal(ring.workers[1], row) and not ring.workers[0].any()
        assert ring.slot_states[0] == SlotState.FILLING
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
    segment, ring = ringmod.create(lay)
    try:
        ring.header[0] = 0
        with pytest.raises(RuntimeError, match=re.escape(segment.name)):
            Attached(segment.name, lay)
    finally:
        ring.release_views()
        segment.unlink()


def test_new_names_are_unique_short_and_carry_the_pid():
    names = {ringmod.new_name() for _ in range(200)}
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
    segment, ring = ringmod.create(RingLayout(1, 8, 1))
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
    monkeypatch.setattr(ringmod.os, "posix_fallocate", _enospc)
    with pytest.raises(OSError) as ei:
        ringmod._reserve(0, 300 * 2**20)
    msg = str(ei.value)
    assert ei.value.errno == errno.ENOSPC
    assert "300.0 MiB" in msg and "MiB are free" in msg and SHM_DIR in msg
    assert isinstance(ei.value.__cause__, OSError)


def test_create_cleans_up_when_reservation_fails(monkeypatch):
    before = own_segments()
    monkeypatch.setattr(ringmod.os, "posix_fallocate", _enospc)
    lay = RingLayout(4, 2**18, 2)  # 8 MiB of slots
    with pytest.raises(OSError, match="MiB"):
        ringmod.create(lay)
    assert own_segments() == before  # nothing left behind in /dev/shm


def test_reserve_really_reserves():
    # without the monkeypatch a normal size succeeds and the file has the full size
    segment, ring = ringmod.create(RingLayout(2, 1000, 1))
    try:
        st_ = os.stat(os.path.join(SHM_DIR, segment.name))
        assert st_.st_blocks * 512 >= ring.layout.nbytes
    finally:
        ring.release_views()
        segment.unlink()
