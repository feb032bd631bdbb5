"""The slot handover (ipc/handover.py, NOTE [slot handover]) across processes: a doorbell pickled
for a child (spawn) is a duplicate of the same eventfd; then, as a trainer runs (a step of
busy work between calls, `tools/syscalls.py` with strace on its main thread): `next()` on
ready batches makes no system call, amortised, while the system-call path (the one for
machines without x86's store order) makes at least one per batch and gives the same stream.
(Both ends in one process, and the simulated run: tests/unit/ipc/test_handover.py.)
"""
from __future__ import annotations

import numpy as np
import pytest

from shmloader.ipc.handover import Doorbell
from tools import syscalls
from tests.helpers import window_of


def test_doorbell_pickles_for_a_child_as_a_duplicate():
    import multiprocessing

    bell = Doorbell()
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_ring_three_times, args=(bell,))
    try:
        p.start()
        p.join(30)
        assert p.exitcode == 0
        assert bell.clear() == 3
    finally:
        bell.close()


def _ring_three_times(bell):
    for _ in range(3):
        bell.ring()


# ------------------------------------------------------------------ as a trainer runs

@pytest.mark.parametrize("workers", [1, 3])
def test_syscall_path_gives_the_same_stream(synth, monkeypatch, workers):
    """Concat through the system-call path equals the oracle, over more than an epoch."""
    B, T, n = 2, 32, 400
    expected, _ = synth.expected(n, B, T, "train")
    monkeypatch.setenv("SHMLOADER_HANDOVER", "syscall")
    with synth.loader(B, T, "train", num_workers=workers, n_slots=3) as loader:
        for k, want in enumerate(expected):
            assert np.array_equal(window_of(*next(loader)), want), f"batch {k}"


def test_syscall_path_best_fit_equals_the_header_path(synth, monkeypatch):
    def run(path):
        monkeypatch.setenv("SHMLOADER_HANDOVER", path)
        with synth.loader(2, 32, "train", packing="bos_bestfit", num_workers=2) as loader:
            out = [np.concatenate([x.reshape(-1).numpy(), y.reshape(-1).numpy()]) for x, y in
                   (next(loader) for _ in range(150))]
            return out, loader.state_dict()
    a, state_a = run("header")
    b, state_b = run("syscall")
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and state_a == state_b


needs_strace = pytest.mark.skipif(not syscalls.available(), reason="needs strace")


@needs_strace
@pytest.mark.slow  # a rate measured at the machine's load: failed five tries in a default suite at load 14-20
@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_next_on_ready_batches_makes_no_system_call(synth, synth_tokenizer_pkl, packing):
    """150 steps of 10 ms busy work (a training step), then next() and stats(): the workers keep
    ahead, and next() with stats() makes at most 0.1 system calls per call (stats() none) (the liveness poll, twice a second;
    a kick when half the ring waits for the coordinator to notice its frees). Both allowed calls
    grow on a loaded machine (the run takes longer; a coordinator short of CPU notices frees
    late: at load 6-7, 1 run of 4 made 16 kicks and 10 polls, 0.17 a call), so the run is tried
    up to five times: one that meets the bound shows the path; a system call per next() (1.0,
    `test_the_syscall_path_is_counted`) fails all five. A measurement by nature (the workers
    must keep ahead of the trainer's 10 ms steps), it is in the slow suite: in a default suite on
    2 cores at load 14-20 all five tries failed (issue 50)."""
    tries = []
    for _ in range(5):
        r = syscalls.trace_next(str(synth.root), str(synth_tokenizer_pkl), B=2, T=64, n=150, spin_ms=10,
                                num_workers=2, packing=packing, env={"SHMLOADER_HANDOVER": "header"})
        tries.append({k: v for k, v in r.items() if k != "calls"})
        if r["not_ready"] <= 5 and r["per_next"] <= 0.1:
            return
    raise AssertionError(f"next() made more than 0.1 system calls a call, or found its batch not ready, in 5 "
                         f"runs: {tries}")


@needs_strace
def test_the_syscall_path_is_counted(synth, synth_tokenizer_pkl):
    """The instrument sees system calls when next() makes them: on the path for machines
    without x86's store order, every batch's free rings the coordinator."""
    r = syscalls.trace_next(str(synth.root), str(synth_tokenizer_pkl), B=2, T=64, n=100, spin_ms=3,
                            num_workers=2, env={"SHMLOADER_HANDOVER": "syscall"})
    assert r["per_next"] >= 1.0, r
    assert r["by_name"].get("write", 0) >= 95, r


# ------------------------------------------------------------------ what next() costs after a busy step

@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_next_on_a_lent_batch_calls_no_torch_operation(synth, packing):
    """After a training step (code and data cold) a torch view operation (`view`,
    `as_strided`, indexing) costs several times a `torch.from_numpy`: a lent CPU batch is two
    `from_numpy` of views made once per slot, and next() calls no torch operation besides
    (a TorchFunctionMode sees every one). The batch is still the slot's memory."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Seen(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    B, T = 2, 32
    with synth.loader(B, T, "train", packing=packing, num_workers=1, n_slots=6, head_start=False) as loader:
        x, y = next(loader)  # started
        slots = loader.debug().ring.slots
        for _ in range(5):
            with Seen() as seen:
                x, y = next(loader)
            assert seen.calls == [], f"next() called torch operations {seen.calls}"
            assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.int64
            assert slots.ctypes.data <= x.data_ptr() < slots.ctypes.data + slots.nbytes, "the batch was copied"
