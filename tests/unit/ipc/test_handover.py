"""The slot handover through the ring's header (ipc/handover.py, NOTE [slot handover]), in one
process: both ends run over one ring (a bytearray) and real eventfds; a simulation drives a
coordinator (a SlotMap, batches announced in order) and a trainer that frees lent batches in
any order, checking every record it takes. (A doorbell handed to a child process, and the
handover as a trainer runs: tests/loader/test_handover.py.)
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader.delivery import Lending, Shape
from shmloader.ipc.freepoll import EARLY, FREE_POLL_MAX_S, FREE_POLL_S
from shmloader.ipc.handover import Announcement, CoordinatorEnd, Doorbell, TrainerEnd, header_only
from shmloader.ipc.ring import Counter, Ring, RingLayout
from shmloader.packing.base import SlotMap
from shmloader.position import Position, RowGroup


def ends(n_slots: int, header: bool = True):
    lay = RingLayout(n_slots, 4, 1)
    ring = Ring(bytearray(lay.nbytes), lay, "test")
    ready, kick = Doorbell(), Doorbell()
    return ring, ready, kick, TrainerEnd(ring, ready, kick, header), CoordinatorEnd(ring, ready, kick, header)


def test_doorbell_counts_rings_and_never_blocks():
    bell = Doorbell()
    try:
        assert bell.clear() == 0
        for _ in range(3):
            bell.ring()
        assert bell.clear() == 3 and bell.clear() == 0
    finally:
        bell.close()
    bell.close()  # twice is fine


def test_announced_batches_are_taken_in_order_with_their_records():
    ring, ready, kick, trainer, coord = ends(3)
    assert trainer.take() is None
    coord.announce(0, 2, Position(0, 1, 2, 3, 4), 7, 0xFFFFFFFF, RowGroup(0, 0, 5))
    coord.announce(1, 0, Position(1, 0, 0, 5), 9)  # best fit's position: skip 0; no check given: 0
    first = trainer.take()
    assert first == Announcement(0, 2, Position(0, 1, 2, 3, 4), 7, 0xFFFFFFFF, read=RowGroup(0, 0, 5))
    assert (first.buffer, first.waited) == (None, 0.0)  # the run fills them in (procs/run.py)
    # no row group given: the position's (best fit's reading ends where its position is)
    assert trainer.take() == Announcement(1, 0, Position(1, 0, 0, 5, 0), 9, 0, read=RowGroup(1, 0, 0))
    assert trainer.take() is None
    assert ready.clear() == 2  # one ring per announcement


def test_a_record_of_another_batch_is_an_error():
    ring, ready, kick, trainer, coord = ends(2)
    coord.announce(0, 0, Position(0, 0, 0, 0, 0), 1)
    ring.records[0, 0] = 5
    with pytest.raises(RuntimeError, match="holds batch 5, expected batch 0"):
        trainer.take()


def test_frees_reach_the_coordinator_in_log_order_and_kick_only_at_half_the_ring():
    ring, ready, kick, trainer, coord = ends(8)
    for k in (2, 0, 1):
        trainer.free(k)
    assert kick.clear() == 0  # 3 unseen of 8: no kick
    trainer.free(3)
    assert kick.clear() == 1  # 4 unseen: half the ring waits
    assert coord.freed() == [2, 0, 1, 3] and ring.counters[Counter.FREES_SEEN] == 4
    assert coord.freed() == []
    trainer.free(4)
    assert kick.clear() == 0


def test_the_free_poll_backs_off_while_nothing_is_freed():
    ring, ready, kick, trainer, coord = ends(4)
    assert coord.wait_s(False, 1.0) == 1.0  # a free slot: no polling
    assert coord.wait_s(True, 1.0) == FREE_POLL_S
    for _ in range(3):  # waits that nothing woke, and looks that found no free
        coord.timed_out()
        assert coord.freed() == []
    assert coord.wait_s(True, 1.0) == 8 * FREE_POLL_S
    assert coord.freed() == [] and coord.wait_s(True, 1.0) == 8 * FREE_POLL_S  # a turn a message woke: no back-off
    for _ in range(10):
        coord.timed_out()
        coord.freed()
    assert coord.wait_s(True, 1.0) == 1.0 == FREE_POLL_MAX_S  # never longer than the loop's usual wait
    trainer.free(0)
    coord.timed_out()
    assert coord.freed() == [0] and coord.wait_s(True, 1.0) == FREE_POLL_S  # found: no pace known yet


def test_the_free_poll_waits_for_the_frees_just_short_of_a_kick_at_the_trainers_pace(monkeypatch):
    """A ring of 8: the trainer kicks at 4 unseen frees, so at its pace a look comes `EARLY`
    frees' time before the third is due, and finds the ones before it together."""
    clock = [100.0]
    monkeypatch.setattr("shmloader.ipc.handover.time.monotonic", lambda: clock[0])
    ring, ready, kick, trainer, coord = ends(8)
    k, found = 0, []
    for _ in range(30):  # a free every 20 ms, the coordinator looking when told
        clock[0] += coord.wait_s(True, 1.0)
        while k < round((clock[0] - 100.0) / 0.02, 9):
            trainer.free(k % 8)
            k += 1
        coord.timed_out()
        found.append(len(coord.freed()))
    assert coord.wait_s(True, 1.0) == pytest.approx((3 - EARLY) * 0.02, rel=0.25)
    assert kick.clear() == 0  # never 4 unseen of 8: every look came before a kick was due
    settled = found[10:]
    assert max(settled) <= 3 and sum(settled) / len(settled) >= 3 - EARLY - 0.5  # several frees a look


def test_before_blocking_clears_the_ready_bell_and_kicks_only_for_unseen_frees():
    ring, ready, kick, trainer, coord = ends(8)
    ready.ring()
    trainer.before_blocking()
    assert ready.clear() == 0 and kick.clear() == 0
    trainer.free(0)
    trainer.before_blocking()
    assert kick.clear() == 1
    coord.freed()
    trainer.before_blocking()
    assert kick.clear() == 0


def test_syscall_path_takes_only_what_the_doorbells_ordered():
    ring, ready, kick, trainer, coord = ends(4, header=False)
    ring.records[0] = (0, 1, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0)
    ring.counters[Counter.ANNOUNCED] = 1  # in the header, but not rung: not taken
    assert trainer.take() is None
    ready.ring()
    assert trainer.take() == Announcement(0, 1, Position(0, 0, 0, 0, 0), 3, 0, read=RowGroup(0, 0, 0))
    trainer.free(0)  # every free rings
    ring.free_log[1], ring.counters[Counter.FREES] = 7, 2  # logged, not rung: not taken
    assert coord.freed() == []
    coord.kicked_now()
    assert coord.freed() == [0]


def test_messages_are_counted():
    ring, ready, kick, trainer, coord = ends(2)
    coord.message_queued()
    coord.message_queued()
    assert trainer.pending_messages() == 2
    trainer.messages_read += 1
    assert trainer.pending_messages() == 1


def test_handover_env(monkeypatch):
    monkeypatch.setenv("SHMLOADER_HANDOVER", "syscall")
    assert header_only() is False
    monkeypatch.setenv("SHMLOADER_HANDOVER", "header")
    assert header_only() is True
    monkeypatch.setenv("SHMLOADER_HANDOVER", "fast")
    with pytest.raises(ValueError, match="SHMLOADER_HANDOVER"):
        header_only()


@settings(deadline=None, max_examples=60)
@given(n_slots=st.integers(2, 6), seed=st.integers(0, 10**6), header=st.booleans())
def test_simulated_run_takes_every_batch_once_in_order(n_slots, seed, header):
    """A coordinator writes batches into the slots the SlotMap gives and announces them in
    order; a trainer takes them, holds up to n_slots - 1 (lent batches), frees them in random
    order. Every record taken is the batch expected, in the slot the coordinator chose, and no
    record is overwritten before it was taken."""
    rng = random.Random(seed)
    ring, ready, kick, trainer, coord = ends(n_slots, header)
    slots, held, slot_of = SlotMap(n_slots), [], {}
    written = taken = 0
    for _ in range(400):
        if not header:
            coord.kicked_now()
        for k in coord.freed():
            slots.release(k)
        if not slots.full and rng.random() < 0.6:
            s = slots.take_slot(written)
            slot_of[written] = s
            ring.slots[s] = written
            coord.announce(written, s, Position(written, 0, 0, 0, 0), written, 7 * written)
            written += 1
        if rng.random() < 0.5 and (got := trainer.take()) is not None:
            assert (got.batch, got.slot, got.position.epoch, got.docs, got.check) == (
                taken, slot_of[taken], taken, taken, 7 * taken)
            assert np.all(ring.slots[got.slot] == got.batch)
            held.append(got.batch)
            taken += 1
        if held and (len(held) >= n_slots - 1 or rng.random() < 0.4):
            trainer.free(held.pop(rng.randrange(len(held))))
    assert taken > 0


# ------------------------------------------------------------------ lent CPU batches (delivery.Lending)

def lending(n_slots=4, B=2, T=3, lend_cap=2):
    """A Lending over n_slots concat windows of B*T+1 tokens (slot s holds s*100 + position)."""
    slots = np.arange(n_slots)[:, None] * 100 + np.arange(B * T + 1)[None, :]
    freed = []
    return Lending(slots, freed.append, lend_cap), freed, Shape(B, T, 1)


@pytest.mark.parametrize("keep", ["nothing", "inputs", "targets", "a view", "a numpy array", "the storage",
                                  "a list holding both"])
def test_a_lent_slot_comes_back_only_once_no_tensor_views_it(keep):
    lend, freed, shape = lending()
    x, y = lend.batch(7, 2, shape)
    assert x.tolist() == [[200, 201, 202], [203, 204, 205]] and y.tolist() == [[201, 202, 203], [204, 205, 206]]
    kept = {"nothing": None, "inputs": x, "targets": y, "a view": y[1, 1:], "a numpy array": x.numpy(),
            "the storage": y.untyped_storage(), "a list holding both": [x, y]}[keep]
    del x, y
    lend.reclaim()
    if keep == "nothing":
        assert freed == [7] and not lend.lent
        return
    assert freed == [] and lend.lent == {2: 7}, f"a slot came back while {keep} of its batch lives"
    del kept
    lend.reclaim()
    assert freed == [7] and not lend.lent


def test_a_batch_dropped_in_another_thread_comes_back_at_the_next_reclaim():
    import threading

    lend, freed, shape = lending()
    box = [lend.batch(3, 1, shape)]
    thread = threading.Thread(target=box.clear)
    thread.start()
    thread.join()
    lend.reclaim()
    assert freed == [3]


def test_past_the_lend_cap_batches_are_copies_freed_at_once():
    lend, freed, shape = lending(lend_cap=2)
    held = [lend.batch(0, 0, shape), lend.batch(1, 1, shape)]
    x, y = lend.batch(2, 3, shape)
    assert freed == [2] and x.tolist() == [[300, 301, 302], [303, 304, 305]]
    assert x.data_ptr() != lend.slots[3].ctypes.data, "a batch past the cap was lent, not copied"
    del held
    lend.reclaim()
    assert sorted(freed) == [0, 1, 2]
    x2, _ = lend.batch(4, 0, shape)
    assert x2.data_ptr() == lend.slots[0].ctypes.data  # lent again


def test_a_batch_made_by_the_head_start_is_lent_and_back_once_no_tensor_views_it():
    """The head start's batches (procs/headstart.py) come from their own rows: lent as slots
    are, counted toward the cap, and `made_back()` says how many the caller let go of (an idle
    release counts them as given back: procs/idle.py); past the cap, copied and back at once."""
    lend, freed, shape = lending(lend_cap=2)
    rows = [np.arange(7) + 1000 * (k + 1) for k in range(2)]
    ax, ay = lend.made(rows[0], shape)
    assert ax.data_ptr() == rows[0].ctypes.data and lend.made_back() == 0
    b = lend.batch(0, 0, shape)                 # one made and one slot lent: the cap
    c = lend.made(rows[1], shape)               # past it: a copy, back at once
    assert c[0].data_ptr() != rows[1].ctypes.data and c[1].tolist() == [[2001, 2002, 2003], [2004, 2005, 2006]]
    assert lend.made_back() == 1
    x, _ = lend.batch(1, 1, shape)
    assert freed == [1] and x.data_ptr() != lend.slots[1].ctypes.data, "past the cap (a made batch held) but lent"
    del ax
    assert lend.made_back() == 1, "back while its targets live"
    del ay
    lend.reclaim()
    assert lend.made_back() == 2 and freed == [1]
    y, _ = lend.batch(2, 2, shape)              # under the cap again: lent
    assert y.data_ptr() == lend.slots[2].ctypes.data
    del b, y, _
    lend.reclaim()
    assert sorted(freed) == [0, 1, 2]


def test_lending_makes_no_view_per_batch():
    """A batch is two `torch.from_numpy` of views made once per slot (after a busy step torch's
    view operations are what next() costs); the tensors are the slot's memory."""
    lend, freed, shape = lending()
    views = None
    for k in range(6):
        x, y = lend.batch(k, k % 2, shape)
        if views is None:
            views = [id(v) for pair in lend._views for v in pair]  # ids: a reference would hold the slot
        assert x.data_ptr() == lend.slots[k % 2].ctypes.data and y.data_ptr() == x.data_ptr() + 8
        del x, y
        lend.reclaim()
    assert [id(v) for pair in lend._views for v in pair] == views and freed == list(range(6))
