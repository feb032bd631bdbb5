"""The trainer's CUDA bookkeeping, run on the CPU with a stand-in for the CUDA runtime.

tests/loader/test_cuda.py checks the real thing and is skipped without a GPU; this module runs the
same code path of `ShmLoader.__next__` (pinned ring, two device buffers, one event per copy,
slots freed only once their event has completed, events synchronised and the ring unpinned
at close) everywhere. The stand-in: the "device buffers" are CPU tensors, the copy is a CPU
copy, and each event completes only when the test (or the loader's own `synchronize()`)
says so, so a slot freed before its copy "ran" is caught.
"""
import contextlib
import os

import numpy as np
import pytest
import torch

from shmloader import delivery
from shmloader.ipc.handover import TrainerEnd
from tests.helpers import window_of

pytestmark = pytest.mark.usefixtures("watchdog")
CPU_MAKE = delivery.make  # before any test replaces it


class FakeEvent:
    made = []

    def __init__(self, blocking=False):
        self.done = False
        FakeEvent.made.append(self)

    def record(self, stream=None):
        self.recorded = True

    def query(self) -> bool:
        return self.done

    def synchronize(self):
        self.done = True


class FakeCudart:
    def __init__(self):
        self.unregistered = []

    def cudaHostUnregister(self, ptr):
        self.unregistered.append(ptr)
        return 0


@pytest.fixture
def fake_cuda(monkeypatch):
    cudart = FakeCudart()
    FakeEvent.made = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)

    def fake_pin(slots, device):  # what cudaHostRegister does, recorded
        cudart.ring_ptr = slots.ctypes.data

    monkeypatch.setattr(delivery, "pin", fake_pin)
    # the pinned delivery on a CPU loader: its "device buffers" are CPU tensors
    monkeypatch.setattr(delivery, "make", lambda device, slots, free, lend_cap, pinning=None:
                        delivery.PinnedCopy(slots, free, torch.device("cpu")))
    return cudart


def test_slots_are_freed_only_after_their_copy_completed(synth, fake_cuda, monkeypatch):
    B, T, n = 2, 32, 40
    want_w, _ = synth.expected(n, B, T, "train")
    freed = []
    real_free = TrainerEnd.free

    def checked_free(end, k):  # batch k's copy recorded the k-th event
        assert FakeEvent.made[k].done, f"batch {k}: its slot freed before its copy completed"
        freed.append(k)
        real_free(end, k)

    monkeypatch.setattr(TrainerEnd, "free", checked_free)
    with synth.loader(B, T, "train", n_slots=2, num_workers=2, timeout=20, head_start=False) as loader:
        got, buffers = [], set()
        for k in range(n):
            inputs, targets = next(loader)
            got.append(window_of(inputs, targets))
            buffers.add(inputs.data_ptr())
            assert type(loader.debug().delivery) is delivery.PinnedCopy, "a pinned loader lent a slot"
            if k % 3 == 0:  # the "GPU" finishes some copies by itself; the rest wait for synchronize()
                FakeEvent.made[k].done = True
        assert len(buffers) == 2, "batches did not alternate between two device buffers"
        assert loader.debug().delivery.inflight, "no copy was left in flight: the close path below is untested"
        assert len(FakeEvent.made) == n
    assert all(np.array_equal(g, w) for g, w in zip(got, want_w))
    assert freed == sorted(freed) and len(freed) >= n - 2
    assert all(e.done for e in FakeEvent.made), "close() did not wait for the copies in flight"
    assert fake_cuda.unregistered == [fake_cuda.ring_ptr], "close() did not unpin the ring"


def test_the_head_starts_batches_are_copied_and_the_rings_copies_of_them_freed_without_one(synth, fake_cuda,
                                                                                           monkeypatch):
    """With the head start, the first batches come from the trainer's own rows (copied to the
    device, never a ring slot), and the ring's batches of the same numbers are freed without a
    copy; every later slot still only after its copy completed."""
    B, T, n = 2, 32, 30
    want_w, _ = synth.expected(n, B, T, "train")
    copied, freed = {}, []
    real_batch, real_free = delivery.PinnedCopy.batch, TrainerEnd.free

    def batch(self, k, slot, shape):
        out = real_batch(self, k, slot, shape)
        copied[k] = FakeEvent.made[-1]
        return out

    def checked_free(end, k):
        assert k not in copied or copied[k].done, f"batch {k}: its slot freed before its copy completed"
        freed.append(k)
        real_free(end, k)

    monkeypatch.setattr(delivery.PinnedCopy, "batch", batch)
    monkeypatch.setattr(TrainerEnd, "free", checked_free)
    with synth.loader(B, T, "train", n_slots=3, num_workers=2, timeout=20) as loader:
        got = []
        for k in range(n):
            inputs, targets = next(loader)
            got.append(window_of(inputs, targets))
            if k % 2 == 0 and k in copied:
                copied[k].done = True
        head = loader.stats()["head_batches"]
    assert head >= 1 and all(k not in copied for k in range(head)), "a head start's batch went through a slot"
    assert all(np.array_equal(g, w) for g, w in zip(got, want_w))
    assert freed[:head] == list(range(head)), "the ring's copies of the head start's batches were not freed first"


@pytest.fixture
def refused_cuda(monkeypatch):
    """The CUDA path where cudaHostRegister refuses the ring (some container runtimes do): the
    staging buffers are plain CPU tensors, the events `FakeEvent`s, the "device" the CPU."""
    FakeEvent.made = []
    tries = []

    def refuse(slots, device):
        tries.append(slots.ctypes.data)
        raise delivery.PinRefused("cudaHostRegister of the ring failed with CUDA error 801 (operation not supported)")

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(delivery, "pin", refuse)
    monkeypatch.setattr(delivery, "pinned_empty", lambda n: torch.empty(n, dtype=torch.int64))
    real_make = delivery.make
    monkeypatch.setattr(delivery, "make", lambda device, slots, free, lend_cap, pinning=None:
                        real_make(torch.device("cuda"), slots, free, lend_cap, pinning)
                        if pinning is not None else pytest.fail("the loader passed no Pinning"))
    monkeypatch.setattr(delivery.StagedCopy, "__init__", _staged_on_cpu(delivery.StagedCopy.__init__))
    return tries


class _NumpyWith:
    """numpy, with some of its functions replaced (`copyto=...`), for one module's `np`."""

    def __init__(self, **replaced):
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(np, name)


def _staged_on_cpu(real_init):
    def init(self, slots, free, device):
        real_init(self, slots, free, torch.device("cpu"))
    return init


def test_a_refused_cudahostregister_stages_batches_with_one_warning_and_the_same_bytes(synth, refused_cuda,
                                                                                      monkeypatch):
    """cudaHostRegister refused: no crash; one warning for the loader, though a resume starts a
    second ring (which is not offered to cudaHostRegister again); every batch equals the CPU
    stream; each slot is freed as soon as its batch is copied out of it, and a staging buffer is
    written again only after the event of its last copy has completed."""
    B, T, n, n_slots = 2, 32, 40, 3
    want_w, _ = synth.expected(n + 10, B, T, "train")
    written = []          # (batch, the event of the staging buffer's last copy was done when it was written)
    freed, current = [], {}
    real_batch, real_free = delivery.StagedCopy.batch, TrainerEnd.free

    def batch(self, k, slot, shape):
        current.update(delivery=self, k=k)
        out = real_batch(self, k, slot, shape)
        assert freed and freed[-1] == k, f"batch {k}: its slot was not freed once copied out"
        return out

    def copyto(dst, src, **kw):  # the delivery module's numpy: a write into a staging buffer is seen
        staged = current.get("delivery")
        if staged is not None and any(dst is buf for buf in staged._staging_np):
            i = next(j for j, buf in enumerate(staged._staging_np) if dst is buf)
            event = staged.events[i]
            written.append((current["k"], event is None or event.done))
        return np.copyto(dst, src, **kw)

    def checked_free(end, k):
        freed.append(k)
        real_free(end, k)

    monkeypatch.setattr(delivery, "np", _NumpyWith(copyto=copyto))
    monkeypatch.setattr(delivery.StagedCopy, "batch", batch)
    monkeypatch.setattr(TrainerEnd, "free", checked_free)
    with pytest.warns(UserWarning) as caught:
        with synth.loader(B, T, "train", n_slots=n_slots, num_workers=2, timeout=20, head_start=False) as loader:
            got, buffers, saved = [], set(), None
            for k in range(n):
                inputs, targets = next(loader)
                got.append(window_of(inputs, targets))
                buffers.add(inputs.data_ptr())
                assert type(loader.debug().delivery) is delivery.StagedCopy
                assert not loader.debug().delivery.pinned
                if k == 19:
                    saved = loader.state_dict()
            loader.load_state_dict(saved)  # a new run, a new ring
            again = [window_of(*next(loader)) for _ in range(10)]
            events = list(loader.debug().delivery.events)
    ours = [w for w in caught if "cudaHostRegister" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "staging" in str(ours[0].message) and "error 801" in str(ours[0].message)
    assert len(refused_cuda) == 1, "the second ring was offered to cudaHostRegister again"
    assert all(np.array_equal(g, w) for g, w in zip(got, want_w))
    assert all(np.array_equal(g, w) for g, w in zip(again, want_w[20:30]))
    assert len(buffers) == 2, "batches did not alternate between two device buffers"
    late = [k for k, done in written if not done]
    assert len(written) == n + 10 and not late, f"staging buffers written before their last copy completed: {late}"
    assert sum(1 for k, _ in written if k >= n_slots) > 0, "no staging buffer was reused: the gate is untested"
    assert all(e is None or e.done for e in events), "close() did not wait for the copies in flight"


def test_without_pinned_memory_either_batches_are_copied_from_pageable_memory_with_one_warning(
        synth, refused_cuda, monkeypatch):
    def no_pinned_memory(n):
        raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")

    monkeypatch.setattr(delivery, "pinned_empty", no_pinned_memory)
    monkeypatch.setattr(delivery.CopyOut, "__init__", _staged_on_cpu(delivery.CopyOut.__init__))
    B, T, n = 2, 32, 20
    want_w, _ = synth.expected(n + 5, B, T, "train")
    with pytest.warns(UserWarning) as caught:
        with synth.loader(B, T, "train", n_slots=3, num_workers=2, timeout=20, head_start=False) as loader:
            got = [window_of(*next(loader)) for _ in range(n)]
            assert type(loader.debug().delivery) is delivery.CopyOut
            loader.load_state_dict(loader.state_dict())  # a second ring: no second try, no second word
            got += [window_of(*next(loader)) for _ in range(5)]
    said = [str(w.message) for w in caught if "cudaHostRegister" in str(w.message)]
    assert len(said) == 1 and "pageable memory" in said[0] and "out of memory" in said[0], said
    assert len(refused_cuda) == 1
    assert all(np.array_equal(g, w) for g, w in zip(got, want_w))


@pytest.mark.parametrize("rc, raised", [(801, delivery.PinRefused), (712, delivery.PinRefused),
                                        (999, delivery.DeviceError)])
def test_only_a_refusal_of_the_memory_is_a_refusal(monkeypatch, rc, raised):
    """cudaHostRegister's refusals (not supported, already registered, ...) become PinRefused,
    with the runtime's last error cleared; any other error (the device's) is a DeviceError."""
    cleared = []

    class Cudart:
        def cudaHostRegister(self, ptr, size, flags):
            return rc

        def cudaGetErrorString(self, code):
            return f"error {code}"

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart())
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(delivery, "_clear_last_error", cleared.append)
    with pytest.raises(raised, match=f"CUDA error {rc} \\(error {rc}\\)"):
        delivery.pin(np.zeros((2, 8), dtype=np.int64), torch.device("cuda", 0))
    assert len(cleared) == (raised is delivery.PinRefused)


def test_a_forked_child_keeps_the_parents_staged_delivery(synth, refused_cuda):
    """In a child forked from the trainer the parent's delivery is kept, never freed: freeing
    its pinned staging memory would call CUDA there (torch's host allocator records events)."""
    from shmloader.procs import run

    with pytest.warns(UserWarning, match="cudaHostRegister"):
        with synth.loader(2, 32, "train", n_slots=3, num_workers=2, timeout=20, head_start=False) as loader:
            next(loader)
            staged = loader.debug().delivery
            assert type(staged) is delivery.StagedCopy
            child = os.fork()
            if child == 0:  # the fork handler has made the loader forget its run
                os._exit(0 if any(d is staged for d in run.FORKED_AWAY) else 7)
            _, status = os.waitpid(child, 0)
            next(loader)  # the parent's loader goes on
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child let go of the parent's delivery"


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_staged_batches_with_positions_equal_the_cpu_loaders(synth, refused_cuda, monkeypatch, packing):
    """Through the staging buffers a slot's whole row travels: tokens, then positions, in either
    packing's window (best fit's is 2*B*T)."""
    B, T, n = 2, 32, 30
    kw = {"packing": packing, "positions": True, "num_workers": 2, "timeout": 20, "head_start": False}
    with pytest.warns(UserWarning, match="cudaHostRegister"):
        with synth.loader(B, T, "train", **kw) as loader:
            got = [tuple(t.clone() for t in next(loader)) for _ in range(n)]
            assert type(loader.debug().delivery) is delivery.StagedCopy
    monkeypatch.setattr(delivery, "make", CPU_MAKE)  # the reference: the CPU loader's own delivery
    with synth.loader(B, T, "train", **kw) as cpu:
        want = [tuple(t.clone() for t in next(cpu)) for _ in range(n)]
        assert type(cpu.debug().delivery) is delivery.Lending
    assert sum(int((w[2] == 0).sum()) for w in want) >= 5  # documents start inside the batches
    for k, (g, w) in enumerate(zip(got, want)):
        assert all(torch.equal(a, b) for a, b in zip(g, w)), f"batch {k} ({packing}) differs through staging"
