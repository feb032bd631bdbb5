"""CPU output windows that are reused once the caller lets go of them (trainer process).

A CPU batch must stay valid after later `next()` calls. It is normally lent from its ring
slot (`delivery.Lending`); while the caller holds `n_slots // 2` lent batches (and
on a device that is neither the CPU nor a pinned CUDA device), a batch is instead copied out
of its slot (and the slot freed at once) into a window the caller owns. Allocating a fresh
256 KiB window per batch costs page faults on every batch; instead a window returns to a
small pool when the last tensor viewing it is freed (a weak reference to a per-batch numpy
view that only the tensor holds: `Returns`, which `delivery.Lending` uses for ring slots
too), so the steady state `x, y = next(loader)` loop cycles
through a few windows and never faults. Windows a caller keeps are simply not reused. The
copy is numpy's single-threaded one: torch's copy of more than 32768 elements goes parallel
and spins OpenMP threads against the workers for milliseconds.
"""
import weakref
from collections import deque

import numpy as np
import torch


class Returns:
    """Things handed out with a numpy view that only the caller's tensors hold, back once
    that view dies. The weak reference's callback is `deque.append`, a C function: it runs
    no Python code, so it is safe from any thread and inside the garbage collector, and a
    signal (Ctrl-C) can never land inside it, where Python would print the KeyboardInterrupt
    and drop it. `collect` (called by the trainer at its next `next()`) returns them."""

    def __init__(self):
        self._out = {}           # id(weakref) -> (weakref, item), out with the caller
        self._dead = deque()     # weakrefs whose view died, not yet collected

    def __len__(self) -> int:
        """Items out, including those whose view died since the last `collect`."""
        return len(self._out)

    @property
    def pending(self) -> int:
        """Items whose view died since the last `collect`."""
        return len(self._dead)

    def hand_out(self, view: np.ndarray, item):
        ref = weakref.ref(view, self._dead.append)
        self._out[id(ref)] = (ref, item)

    def collect(self) -> list:
        out = []
        while self._dead:
            out.append(self._out.pop(id(self._dead.popleft()))[1])
        return out


class OutputPool:
    def __init__(self, window: int, keep: int = 4):
        self.window, self.keep = window, keep
        self._free = []
        self._out = Returns()   # windows lent to the caller

    def copy_out(self, src: np.ndarray) -> torch.Tensor:
        for buf in self._out.collect():
            if len(self._free) < self.keep:
                self._free.append(buf)
        buf = self._free.pop() if self._free else np.empty(self.window, dtype=np.int64)
        np.copyto(buf, src)
        view = buf[:]  # held only by the tensor: its death returns buf
        self._out.hand_out(view, buf)
        return torch.from_numpy(view)
