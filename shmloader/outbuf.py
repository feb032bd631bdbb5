"""CPU output windows that are reused once the caller lets go of them (trainer process).

A CPU batch must stay valid after later `next()` calls. It is normally lent from its ring
slot (loader_procs.Children.lend); while the caller holds `n_slots // 2` lent batches (and
on a device that is neither the CPU nor a pinned CUDA device), a batch is instead copied out
of its slot (and the slot freed at once) into a window the caller owns. Allocating a fresh
256 KiB window per batch costs page faults on every batch; instead a window returns to a
small pool when the last tensor viewing it is freed (a `weakref.finalize` on a per-batch
numpy view that only the tensor holds), so the steady state `x, y = next(loader)` loop
alternates between two windows and never faults. Windows a caller keeps are simply not
reused. The copy is numpy's single-threaded one: torch's copy of more than 32768 elements
goes parallel and spins OpenMP threads against the workers for milliseconds.
"""
import weakref

import numpy as np
import torch


class OutputPool:
    def __init__(self, window: int, keep: int = 4):
        self.window, self.keep = window, keep
        self._free = []

    def copy_out(self, src: np.ndarray) -> torch.Tensor:
        buf = self._free.pop() if self._free else np.empty(self.window, dtype=np.int64)
        np.copyto(buf, src)
        view = buf[:]  # held only by the tensor: its death returns buf to the pool
        weakref.finalize(view, self._give_back, buf)
        return torch.from_numpy(view)

    def _give_back(self, buf: np.ndarray):
        if len(self._free) < self.keep:
            self._free.append(buf)
