"""torch profiler ranges: while a profiler records, `next()` is the range `shmloader.next` and
its block for a batch not yet made the range `shmloader.wait` inside it, so data waits show
in `torch.profiler` traces and the views read from them (TensorBoard, Perfetto). On CUDA the
batch's non-blocking copy is issued inside `shmloader.copy` (within `shmloader.next`); with
CUDA activities recorded, the copy itself is the trace's host-to-device memcpy it launches.

The rule: no profiler, no cost but one check per `next()` (`active()`: a C call that reads
a flag, ~0.1 us, no system call); `record_function` is entered only while one records.
"""
import contextlib

import torch

NEXT, WAIT, COPY = "shmloader.next", "shmloader.wait", "shmloader.copy"

try:
    from torch._C._autograd import _profiler_enabled as active  # whether a profiler records now
except ImportError:  # another torch: the Python flag autograd's profiler keeps
    def active() -> bool:
        return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False))


def named(name: str):
    """`record_function(name)` while a profiler records, else a context that does nothing."""
    return torch.profiler.record_function(name) if active() else contextlib.nullcontext()
