"""How a ring slot becomes the caller's batch (training process): one interface, four ways.

Every delivery's `batch(k, slot, shape)` gets batch k in `slot` and returns `(inputs, targets)`,
int64 tensors where `shape` (a `Shape`: B, T, where targets start in the slot's row) says, and
`(inputs, targets, positions)` when the row holds positions too (`Shape.positions_at`: after
the window, ipc/ring.py), which the caller may keep, and gives the slot back to the workers
(`free(k)`, the free log of NOTE [slot handover]) only once nothing reads it any more. A slot
is one row (`slots` here is the ring's `rows`: tokens, then positions), so positions cost a
third view on the CPU and nothing more on CUDA (the same one copy, B*T words longer):

- `Lending` (CPU): the batch IS the slot, lent without a copy. Each slot has two numpy views
  made once, inputs and targets (and positions); a batch is `torch.from_numpy` of each (after a
  busy training step, when code and data are cold, torch's view operations cost several
  times a `from_numpy`). Each tensor's storage holds one reference to its view for as long
  as any tensor viewing it lives, so the slot is back at the first `reclaim()` that finds
  every view's reference count down to the delivery's own: nothing runs when the caller
  drops a batch (no callback that a Ctrl-C could land in), from any thread. A batch stays
  valid for as long as the caller holds it. While `lend_cap` lent batches are held, further
  batches are copied out (`OutputPool`) and their slots freed at once, so a caller keeping
  batches never takes every slot from the workers.
- `PinnedCopy` (CUDA): the ring is page-locked once (`cudaHostRegister`, portable, on the
  loader's device); each batch is one non-blocking copy on the current stream into one of
  two device buffers (valid until the second `next()` after it), and the slot is freed once
  a CUDA event recorded after that copy has completed.
- `StagedCopy` (CUDA, where `cudaHostRegister` of the ring is refused: some container
  runtimes refuse to page-lock a shared mapping): each batch is copied on the CPU into one
  of as many pinned staging buffers (torch's own page-locked allocations) as the ring has
  slots, its slot freed at once, then copied to the device as above; a staging buffer is
  written again only once the event of its last copy has completed. One CPU copy of the
  batch more than `PinnedCopy`. `make` tries to pin each ring of a loader until one refusal
  (`Pinning`), warns once, and stages from then on.
- `CopyOut` (CUDA without pinned memory at all): copied out of the slot, freed at once, then
  `.to(device)`. No other device is taken (`device_of`).

A batch the trainer made itself (procs/headstart.py, the head start) is delivered from its own
row (`made`), never a slot: lent on the CPU as a slot is (it counts toward `lend_cap`), copied
on any other device; `made_back()` counts those the caller has let go of (a copied one at once),
which an idle release counts as given back, as it counts the freed slots (procs/idle.py).

`reclaim(wait)` frees what came back (`wait`: also wait for copies in flight, before the
loader blocks for a batch); `close()` waits for copies in flight and unpins.
"""
import sys
import weakref
from collections import deque
from typing import NamedTuple

import numpy as np
import torch

from . import errors, profiling
from .errors import DeviceError

CUDA_HOST_REGISTER_PORTABLE = 1


class Shape(NamedTuple):
    """Where a batch lies in its slot's row: B rows of T tokens, inputs from 0, targets from
    `targets_at`, positions from `positions_at` (None: the batch has none)."""
    B: int
    T: int
    targets_at: int
    positions_at: int | None = None

    @classmethod
    def of(cls, config) -> "Shape":
        """A loader's (`LoaderConfig`): the targets where its packing's spec puts them, the
        positions after the window when it writes them."""
        return cls(config.B, config.T, config.spec.targets_at(config.B, config.T),
                   config.window if config.positions else None)


def split(row: torch.Tensor, shape: Shape) -> tuple:
    """`(inputs, targets)`, or `(inputs, targets, positions)`, of a slot's 1-D row: one
    strided view each."""
    B, T, y_at, p_at = shape
    x, y = row.as_strided((B, T), (T, 1), 0), row.as_strided((B, T), (T, 1), y_at)
    return (x, y) if p_at is None else (x, y, row.as_strided((B, T), (T, 1), p_at))


class Lending:
    def __init__(self, slots: np.ndarray, free, lend_cap: int):
        self.slots, self.free, self.lend_cap = slots, free, lend_cap
        self.lent = {}                         # slot -> batch, lent to the caller
        self.outputs = OutputPool(slots.shape[1])
        self._views = None                     # slot -> (inputs, targets[, positions]) numpy views, made once
        self._own = 0                          # the reference count of a view nobody else holds
        self._made = Returns()                 # the rows of `made` batches lent to the caller
        self._made_out = self._made_back = 0   # of those, lent and not seen back; seen back (or copied)

    def batch(self, k: int, slot: int, shape: Shape) -> tuple:
        if len(self.lent) + self._made_out >= self.lend_cap:
            window = self.outputs.copy_out(self.slots[slot])
            self.free(k)
            return split(window, shape)
        if self._views is None:
            self._make_views(shape)
        views = self._views[slot]
        self.lent[slot] = k
        if len(views) == 2:
            return torch.from_numpy(views[0]), torch.from_numpy(views[1])
        return torch.from_numpy(views[0]), torch.from_numpy(views[1]), torch.from_numpy(views[2])

    def made(self, row: np.ndarray, shape: Shape) -> tuple:
        """A batch the trainer made itself (procs/headstart.py) in `row`, which the caller keeps:
        lent as a slot is (through a view of its own, whose death is its return), or copied out
        and back at once while `lend_cap` batches are lent."""
        if len(self.lent) + self._made_out >= self.lend_cap:
            self._made_back += 1
            return split(self.outputs.copy_out(row), shape)
        view = row[:]
        self._made.hand_out(view, None)
        self._made_out += 1
        return split(torch.from_numpy(view), shape)

    def made_back(self) -> int:
        """How many of the batches `made` handed out the caller has let go of."""
        if self._made_out:
            n = len(self._made.collect())
            self._made_out, self._made_back = self._made_out - n, self._made_back + n
        return self._made_back

    def _make_views(self, shape: Shape):
        B, T, y_at, p_at = shape
        n = B * T
        self._views = [(row[:n].reshape(B, T), row[y_at:y_at + n].reshape(B, T))
                       + (() if p_at is None else (row[p_at:p_at + n].reshape(B, T),)) for row in self.slots]
        # a view's reference count while no tensor holds it, measured with the same expression
        # as `reclaim` (the list's tuple and getrefcount's argument)
        self._own = sys.getrefcount(self._views[0][0])

    def reclaim(self, wait: bool = False):
        if self._made_out:  # made batches let go of make room under the cap
            self.made_back()
        if self.lent:
            own, views, refs = self._own, self._views, sys.getrefcount
            if len(views[0]) == 2:
                back = [s for s in self.lent if refs(views[s][0]) <= own and refs(views[s][1]) <= own]
            else:
                back = [s for s in self.lent
                        if refs(views[s][0]) <= own and refs(views[s][1]) <= own and refs(views[s][2]) <= own]
            for slot in back:
                self.free(self.lent.pop(slot))

    def close(self):
        """The views go with the delivery; a batch the caller keeps keeps its own view (and the
        ring's mapping) alive."""
        self._views = None


class CopiesMade:
    """A delivery to a device: a batch the trainer made itself is copied there from its own
    (pageable) row, a few batches a run, and is back at once."""
    _made_back = 0

    def made(self, row: np.ndarray, shape: Shape) -> tuple:
        self._made_back += 1
        return split(torch.from_numpy(row).to(self.device), shape)

    def made_back(self) -> int:
        return self._made_back


class CopyOut(CopiesMade):
    def __init__(self, slots: np.ndarray, free, device: torch.device):
        self.slots, self.free, self.device = slots, free, device
        self.outputs = OutputPool(slots.shape[1])

    def batch(self, k: int, slot: int, shape: Shape) -> tuple:
        window = self.outputs.copy_out(self.slots[slot])
        self.free(k)
        return split(window.to(self.device), shape)

    def reclaim(self, wait: bool = False):
        pass

    def close(self):
        pass


class PinnedCopy(CopiesMade):
    def __init__(self, slots: np.ndarray, free, device: torch.device):
        self.slots, self.free, self.device = slots, free, device
        self.slot_tensors = torch.from_numpy(slots)
        self.inflight = deque()                # (k, event), in copy order
        pin(slots, device)
        self.pinned = True
        self.device_bufs = [torch.empty(slots.shape[1], dtype=torch.int64, device=device) for _ in range(2)]

    def batch(self, k: int, slot: int, shape: Shape) -> tuple:
        window = self.device_bufs[k & 1]
        with profiling.named(profiling.COPY):  # the copy's issue, inside shmloader.next, in a trace
            window.copy_(self.slot_tensors[slot], non_blocking=True)
            event = torch.cuda.Event(blocking=True)  # synchronize() sleeps instead of spinning
            event.record(torch.cuda.current_stream(self.device))
        self.inflight.append((k, event))
        return split(window, shape)

    def reclaim(self, wait: bool = False):
        while self.inflight and (wait or self.inflight[0][1].query()):
            k, event = self.inflight.popleft()
            event.synchronize()
            self.free(k)

    def close(self):
        """Wait for the copies in flight (their slots are not freed: the run is over), unpin."""
        for _, event in self.inflight:
            event.synchronize()
        self.inflight.clear()
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.slots.ctypes.data)
            self.pinned = False
        self.slot_tensors, self.device_bufs = None, []


class StagedCopy(CopiesMade):
    """`PinnedCopy` for a ring that could not be pinned: through pinned staging buffers."""

    pinned = False

    def __init__(self, slots: np.ndarray, free, device: torch.device):
        self.slots, self.free, self.device = slots, free, device
        n, row = slots.shape
        block = pinned_empty(n * row)  # one allocation: torch rounds each up to a power of two
        self.staging = [block[i * row:(i + 1) * row] for i in range(n)]
        self._staging_np = [buf.numpy() for buf in self.staging]
        self.events = [None] * len(slots)      # each staging buffer's last copy
        self.device_bufs = [torch.empty(slots.shape[1], dtype=torch.int64, device=device) for _ in range(2)]

    def batch(self, k: int, slot: int, shape: Shape) -> tuple:
        i = k % len(self.staging)
        if self.events[i] is not None:
            self.events[i].synchronize()       # its copy of batch k - len(staging) has run
        np.copyto(self._staging_np[i], self.slots[slot])
        self.free(k)
        window = self.device_bufs[k & 1]
        with profiling.named(profiling.COPY):
            window.copy_(self.staging[i], non_blocking=True)
            event = torch.cuda.Event(blocking=True)
            event.record(torch.cuda.current_stream(self.device))
        self.events[i] = event
        return split(window, shape)

    def reclaim(self, wait: bool = False):
        pass

    def close(self):
        """Wait for the copies in flight: the staging buffers go with the delivery."""
        for event in self.events:
            if event is not None:
                event.synchronize()
        self.events, self.staging, self._staging_np, self.device_bufs = [], [], [], []


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

    def hand_out(self, view: np.ndarray, item):
        ref = weakref.ref(view, self._dead.append)
        self._out[id(ref)] = (ref, item)

    def collect(self) -> list:
        out = []
        while self._dead:
            out.append(self._out.pop(id(self._dead.popleft()))[1])
        return out


class OutputPool:
    """CPU windows a batch is copied into, reused once the caller lets go of them.

    A fresh window per batch would page-fault on every batch; instead a window returns to a
    small pool when the last tensor viewing it is freed (`Returns`, over a per-batch numpy
    view that only the tensor holds), so a steady `x, y = next(loader)` loop cycles through a
    few windows. Windows a caller keeps are simply not reused. The copy is numpy's
    single-threaded one: torch's copy of more than 32768 elements goes parallel and spins
    OpenMP threads against the workers."""

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


def pinned_empty(n: int) -> torch.Tensor:
    """n int64 words of torch's page-locked host memory (a staging buffer)."""
    return torch.empty(n, dtype=torch.int64, pin_memory=True)


class PinRefused(RuntimeError):
    """cudaHostRegister refused to page-lock the ring (the message says with which error)."""


# cudaHostRegister's answers that mean "not this memory, not here": invalid value, out of memory,
# already registered, not permitted, not supported. Any other error is the device's, not a refusal.
REFUSALS = {1, 2, 712, 800, 801}


def pin(slots: np.ndarray, device: torch.device):
    """Page-lock the ring once, for every CUDA context (portable), on the loader's device."""
    with torch.cuda.device(device):
        rc = int(torch.cuda.cudart().cudaHostRegister(slots.ctypes.data, slots.nbytes,
                                                      CUDA_HOST_REGISTER_PORTABLE))
    if rc == 0:
        return
    what = f"cudaHostRegister of the {slots.nbytes:,} byte ring failed with CUDA error {rc} ({_error_string(rc)})"
    if rc not in REFUSALS:
        raise DeviceError(f"{what} on {device}")
    _clear_last_error(device)
    raise PinRefused(what)


def _error_string(rc: int) -> str:
    try:
        return torch.cuda.cudart().cudaGetErrorString(rc)
    except Exception:  # noqa: BLE001 (a message only)
        return "no description"


def _clear_last_error(device: torch.device):
    """Reset the CUDA runtime's last error, which a refused cudaHostRegister leaves set: torch's
    check after its next kernel launch would otherwise raise it, far from here. A throwaway
    launch here has torch's check read it (cudaGetLastError, which resets it), and it is dropped."""
    try:
        torch.zeros(1, device=device).add_(1)
    except RuntimeError:
        pass


class Pinning:
    """A loader's way of putting batches on its CUDA device, kept across its runs (rings): pin
    the ring (`PinnedCopy`) until cudaHostRegister refuses, then pinned staging buffers
    (`StagedCopy`), and without pinned memory at all pageable copies (`CopyOut`). Each step down
    is taken once and said once; a later ring starts where the last one ended."""

    def __init__(self):
        self.way = PinnedCopy
        self.refused = None  # cudaHostRegister's answer, in words

    def delivery(self, slots: np.ndarray, free, device: torch.device):
        how = None  # the step down taken by this ring, to be said
        if self.way is PinnedCopy:
            try:
                return PinnedCopy(slots, free, device)
            except PinRefused as exc:
                self.way, self.refused = StagedCopy, str(exc)
                how = f"batches reach {device} through pinned staging buffers instead (one CPU copy of each batch more)"
        if self.way is StagedCopy:
            try:
                out = StagedCopy(slots, free, device)
            except RuntimeError as exc:  # no page-locked memory either
                self.way = CopyOut
                how = (f"pinned staging buffers could not be allocated either ({type(exc).__name__}: {exc}); "
                       f"batches are copied to {device} from pageable memory (each copy waits for the device)")
            else:
                self._say(how)
                return out
        self._say(how)
        return CopyOut(slots, free, device)

    def _say(self, how: str | None):
        if how is not None:
            errors.warn(f"shmloader: {self.refused}; {how}")


DEVICES = "\"cpu\", \"cuda\", \"cuda:N\", an int N (cuda:N) or a torch.device of type cpu or cuda"


def device_of(device) -> torch.device:
    """`device` as a torch.device with its index, checked before anything starts: "cpu",
    "cuda", "cuda:N", an int N (cuda:N, as torch on a CUDA machine) or a torch.device of those
    types; any other is a DeviceError saying which are supported (a batch can be moved with
    `.to()`). A CUDA device this torch cannot use is a DeviceError that says to pass
    device="cpu" (torch's own is an AssertionError, raised later)."""
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise DeviceError(f"device={device}: a CUDA device's index is 0 or more; pass {DEVICES}")
        device = torch.device("cuda", device)
    elif isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as exc:
            raise DeviceError(f"device={device!r} is not a device torch knows ({exc}); pass {DEVICES}") from exc
    elif not isinstance(device, torch.device):
        raise DeviceError(f"device={device!r} ({type(device).__name__}): expected {DEVICES}")
    if device.type not in ("cpu", "cuda"):
        raise DeviceError(f"device={str(device)!r}: shmloader delivers batches on the CPU or a CUDA device "
                          f"only ({DEVICES}); pass device=\"cpu\" and move each batch with "
                          f"inputs.to({str(device)!r})")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is a CPU build" if torch.version.cuda is None
                   else "no CUDA device is visible (CUDA_VISIBLE_DEVICES, the driver?)")
            raise DeviceError(f"device={str(device)!r}, but {why} (torch {torch.__version__}); "
                              f"pass device=\"cpu\" to load on the CPU")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= (count := torch.cuda.device_count()):
            raise DeviceError(f"device={str(device)!r}, but {count} CUDA device{'s are' if count != 1 else ' is'} "
                              f"visible (cuda:0 to cuda:{count - 1}); pass one of them")
    return device


def make(device: torch.device, slots: np.ndarray, free, lend_cap: int, pinning: Pinning | None = None):
    """The delivery for `device`, cpu or cuda (`device_of`; `pinning`: the loader's, kept
    across its rings)."""
    if device.type == "cpu":
        return Lending(slots, free, lend_cap)
    return (pinning or Pinning()).delivery(slots, free, device)
