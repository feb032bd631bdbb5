"""ipc/ring.py: the layout's arithmetic, views that tile the header, and a zeroed segment that
is a valid, empty ring (in memory: no shared memory here; tests/unit/ipc/test_segment.py has that)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader.ipc import ring as ringmod
from shmloader.ipc.handover import CoordinatorEnd, Doorbell, TrainerEnd
from shmloader.ipc.ring import ALIGN, FIXED_WORDS, RECORD_FIELDS, STATS_FIELDS, WORKER_FIELDS, Counter, RingLayout

PER_SLOT = len(RECORD_FIELDS) + 1   # its announcement record, its free-log entry


@settings(deadline=None)
@given(n_slots=st.integers(1, 64), window=st.integers(1, 10**6), n_workers=st.integers(0, 256))
def test_layout_sizes_and_alignment(n_slots, window, n_workers):
    lay = RingLayout(n_slots, window, n_workers)
    assert FIXED_WORDS == 5 + len(STATS_FIELDS) + len(Counter)
    assert lay.header_words == FIXED_WORDS + n_slots * PER_SLOT + n_workers * len(WORKER_FIELDS)
    assert lay.slots_offset % ALIGN == 0 and ALIGN == 4096
    assert lay.header_words * 8 <= lay.slots_offset < lay.header_words * 8 + ALIGN
    assert lay.nbytes == lay.slots_offset + n_slots * window * 8


def test_positions_follow_each_slots_window_in_its_row():
    """With positions, a slot's row is its window then B*T positions; the buffer areas follow
    the rows; without, the row is the window."""
    lay = RingLayout(3, 9, 2, max_runs=1, positions=8)
    assert lay.row_words == 17 and lay.buffer_offset == lay.slots_offset + 3 * 17 * 8
    ring = ringmod.Ring(bytearray(lay.nbytes), lay, "x")
    for s in range(3):
        ring.slots[s] = 100 * s + np.arange(9)
        ring.positions[s] = -(100 * s + np.arange(8))
    assert ring.rows[1].tolist() == list(range(100, 109)) + [-p for p in range(100, 108)]
    ring.write_buffer(2, "u8:1", 7)
    assert ring.rows[2, -1] == -207 and ring.buffer_of(2) == ("u8:1", 7)
    plain = ringmod.Ring(bytearray(RingLayout(3, 9, 2).nbytes), RingLayout(3, 9, 2), "y")
    assert plain.positions is None and plain.slots is plain.rows and plain.slots.shape == (3, 9)


def test_views_tile_the_header():
    """Every header view is where the layout says, and together they cover it exactly once."""
    lay = RingLayout(3, 5, 2)
    ring = ringmod.Ring(bytearray(lay.nbytes), lay, "x")
    views = [ring.header[:5], ring.stats, ring.counters, ring.workers, ring.records, ring.free_log]
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
                 for short in (0, 1) for s in range(1, 12)
                 if (words - short - FIXED_WORDS - s * PER_SLOT) % per_worker == 0]
        assert found
        for n_slots, n_workers in found:
            assert RingLayout(n_slots, 10, n_workers).header_words in (words, words - 1)
            assert RingLayout(n_slots, 10, n_workers).slots_offset == pages * 4096
            assert RingLayout(n_slots, 10, n_workers + 1).slots_offset == (pages + 1) * 4096
    fits = (512 - FIXED_WORDS - PER_SLOT) // per_worker   # workers whose rows fit one page with 1 slot
    assert RingLayout(1, 1, fits).slots_offset == 4096
    assert RingLayout(1, 1, fits + 1).slots_offset == 8192


def test_a_zeroed_ring_is_valid_and_empty():
    """Zeroed bytes are an empty ring once initialised: no batch announced, no free logged, no
    message queued; the layout check accepts it, and refuses another layout or version."""
    lay = RingLayout(3, 5, 2)
    ring = ringmod.Ring(bytearray(lay.nbytes), lay, "x")
    assert not ring.is_valid()
    ring.initialise()
    assert ring.is_valid()
    bells = [Doorbell(), Doorbell()]
    try:
        trainer, coord = TrainerEnd(ring, *bells, header=True), CoordinatorEnd(ring, *bells, header=True)
        assert trainer.take() is None and trainer.pending_messages() == 0 and trainer.announced() == 0
        assert coord.freed() == []
    finally:
        for b in bells:
            b.close()
    assert not ringmod.Ring(ring.buf, RingLayout(3, 4, 2), "x").is_valid()  # another window
    ring.header[1] += 1  # another layout version
    assert not ring.is_valid()


def test_a_slots_buffer_area_holds_the_longest_text_and_no_more():
    """Best fit's buffer goes through the slot as its state text and crc: every slot's area
    holds the text of `max_runs` runs of the widest values, each slot its own, and a longer
    text is refused instead of overwriting the next slot."""
    from shmloader.packing.runs import encode_buffer

    lay = RingLayout(3, 5, 2, max_runs=4)
    ring = ringmod.Ring(bytearray(lay.nbytes), lay, "x")
    widest = encode_buffer([[2**63 - 1] * 5] * 4)
    ring.write_buffer(0, *widest)
    ring.write_buffer(1, "u1:0102030405", 7)
    ring.write_buffer(2, "", 0)
    assert ring.buffer_of(0) == widest and ring.buffer_of(1) == ("u1:0102030405", 7)
    assert ring.buffer_of(2) == ("", 0)
    with pytest.raises(ValueError, match="does not fit"):
        ring.write_buffer(1, *encode_buffer([[2**63 - 1] * 5] * 5))
    assert ring.buffer_of(0) == widest and ring.buffer_of(2) == ("", 0)
    assert lay.nbytes == lay.buffer_offset + 3 * lay.buffer_bytes and RingLayout(3, 5, 2).buffer_bytes == 0
