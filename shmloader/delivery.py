"""How a ring slot becomes the caller's batch (training process): one interface, three ways.

Every delivery gets `(k, slot)` for batch k, returns the batch's window as a 1-D int64 tensor
the caller may keep, and gives the slot back to the workers (`free(k, slot)`, the loader's
message to the coordinator) only once nothing reads it any more:

- `Lending` (CPU): the window IS the slot, lent without a copy. The slot comes back at the
  first `reclaim()` after the last tensor viewing it is freed (`outbuf.Returns`: a C
  callback, safe from any thread and from Ctrl-C), so a batch stays valid for as long as the
  caller holds it. While `lend_cap` lent batches are held, further batches are copied out
  (`outbuf.OutputPool`) and their slots freed at once, so a caller keeping batches never
  takes every slot from the workers.
- `PinnedCopy` (CUDA): the ring is page-locked once (`cudaHostRegister`, portable, on the
  loader's device); each batch is one non-blocking copy on the current stream into one of
  two device buffers (valid until the second `next()` after it), and the slot is freed once
  a CUDA event recorded after that copy has completed.
- `CopyOut` (any other device): copied out of the slot, freed at once, then `.to(device)`.

`reclaim(wait)` frees what came back (`wait`: also wait for copies in flight, before the
loader blocks for a batch); `close()` waits for copies in flight and unpins.
"""
from collections import deque

import numpy as np
import torch

from .outbuf import OutputPool, Returns

CUDA_HOST_REGISTER_PORTABLE = 1


class Lending:
    def __init__(self, slots: np.ndarray, free, lend_cap: int):
        self.slots, self.free, self.lend_cap = slots, free, lend_cap
        self.lent = Returns()                  # (k, slot) lent to the caller
        self.outputs = OutputPool(slots.shape[1])

    def deliver(self, k: int, slot: int) -> torch.Tensor:
        if len(self.lent) >= self.lend_cap:
            window = self.outputs.copy_out(self.slots[slot])
            self.free(k, slot)
            return window
        view = self.slots[slot]
        self.lent.hand_out(view, (k, slot))
        return torch.from_numpy(view)

    def reclaim(self, wait: bool = False):
        for k, slot in self.lent.collect():
            self.free(k, slot)

    def close(self):
        pass


class CopyOut:
    def __init__(self, slots: np.ndarray, free, device: torch.device):
        self.slots, self.free, self.device = slots, free, device
        self.outputs = OutputPool(slots.shape[1])

    def deliver(self, k: int, slot: int) -> torch.Tensor:
        window = self.outputs.copy_out(self.slots[slot])
        self.free(k, slot)
        return window.to(self.device)

    def reclaim(self, wait: bool = False):
        pass

    def close(self):
        pass


class PinnedCopy:
    def __init__(self, slots: np.ndarray, free, device: torch.device):
        self.slots, self.free, self.device = slots, free, device
        self.slot_tensors = torch.from_numpy(slots)
        self.inflight = deque()                # (k, slot, event), in copy order
        pin(slots, device)
        self.pinned = True
        self.device_bufs = [torch.empty(slots.shape[1], dtype=torch.int64, device=device) for _ in range(2)]

    def deliver(self, k: int, slot: int) -> torch.Tensor:
        window = self.device_bufs[k & 1]
        window.copy_(self.slot_tensors[slot], non_blocking=True)
        event = torch.cuda.Event(blocking=True)  # synchronize() sleeps instead of spinning
        event.record(torch.cuda.current_stream(self.device))
        self.inflight.append((k, slot, event))
        return window

    def reclaim(self, wait: bool = False):
        while self.inflight and (wait or self.inflight[0][2].query()):
            k, slot, event = self.inflight.popleft()
            event.synchronize()
            self.free(k, slot)

    def close(self):
        """Wait for the copies in flight (their slots are not freed: the run is over), unpin."""
        for *_, event in self.inflight:
            event.synchronize()
        self.inflight.clear()
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.slots.ctypes.data)
            self.pinned = False
        self.slot_tensors, self.device_bufs = None, []


def pin(slots: np.ndarray, device: torch.device):
    """Page-lock the ring once, for every CUDA context (portable), on the loader's device."""
    with torch.cuda.device(device):
        rc = torch.cuda.cudart().cudaHostRegister(slots.ctypes.data, slots.nbytes,
                                                  CUDA_HOST_REGISTER_PORTABLE)
    if int(rc) != 0:
        raise RuntimeError(f"cudaHostRegister of the {slots.nbytes} byte ring failed with CUDA error {rc}")


def make(device: torch.device, slots: np.ndarray, free, lend_cap: int):
    """The delivery for `device`."""
    if device.type == "cpu":
        return Lending(slots, free, lend_cap)
    if device.type == "cuda":
        return PinnedCopy(slots, free, device)
    return CopyOut(slots, free, device)
