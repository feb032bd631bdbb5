"""CPU output windows that are reused once the caller lets go of them (trainer process).

A CPU batch must stay valid after later `next()` calls. It is normally lent from its ring
slot (loader_procs.Children.lend); while the caller holds `n_slots // 2` lent batches (and
on a device that is neither the CPU nor a pinned CUDA device), a batch is instead copied out
of its slot (and the slot freed at once) into a window the caller owns. Allocating a fresh
256 KiB window per batch costs page faults on every batch; instead a window returns to a
small pool when the last tensor viewing it is freed (a weak reference to a per-batch numpy
view that only the tensor holds, whose callback is a C `deque.append`, so that no Python code
runs in it: see `Children.lend`), so the steady state `x, y = next(loader)` loop cycles
through a few windows and never faults. Windows a caller keeps are simply not reused. The
copy is numpy's single-threaded one: torch's copy of more than 32768 elements goes parallel
and spins OpenMP threads against the workers for milliseconds.
"""
import weakref
from collections import deque

import numpy as np
import torch


class OutputPool:
    def __init__(self, window: int, keep: int = 4):
        self.window, self.keep = window, keep
        self._free = []
        self._out = {}             # id(weakref) -> (weakref, window) lent to the caller
        self._returned = deque()   # weakrefs whose view died: their windows may be reused

    def copy_out(self, src: np.ndarray) -> torch.Tensor:
        while self._returned:
            _, buf = self._out.pop(id(self._returned.popleft()))
            if len(self._free) < self.keep:
                self._free.append(buf)
        buf = self._free.pop() if self._free else np.empty(self.window, dtype=np.int64)
        np.copyto(buf, src)
        view = buf[:]  # held only by the tensor: its death queues buf for reuse
        ref = weakref.ref(view, self._returned.append)
        self._out[id(ref)] = (ref, buf)
        return torch.from_numpy(view)
