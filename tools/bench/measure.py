"""Timing, CPU and memory measurements the topics share.

- CPU time: `cpu_s()` is this process's user + system time (getrusage RUSAGE_SELF, all
  threads); `cpu_of(pids)` other processes' from /proc/<pid>/stat (utime + stime);
  `machine_busy_s()` every core's non-idle time from /proc/stat (the kernel's too).
- `busy_work(s, buf)`: a training step's compute without a system call (numpy passes over a
  1 MiB buffer and Python bytecode, never a sleep), so that what follows it meets cold caches
  as a step leaves them.
- `gil_work(units)`: pure Python that holds the GIL (no numpy, no system call), a fixed
  amount of it: what kernel launches and optimizer bookkeeping cost a trainer's CPU, so that
  whatever takes the core or the GIL from it makes it longer; `gil_units(seconds)` sizes it.
- `first_batch_s(make)`: wall seconds from building a loader to its first batch.
- Memory: a loader's workers' and coordinator's peak RSS (VmHWM), and `tree_memory()`, the
  resident memory of this process and all its descendants (RSS summed and PSS).
The loader's processes are found through `loader.debug()` (its `.workers`, `.coordinator`).
"""
from __future__ import annotations

import os
import sys
import time


def cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_of(pids) -> float:
    """User + system CPU seconds of these processes, from /proc."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds all cores spent on anything but idling and waiting for I/O (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def busy_work(seconds: float, buf) -> None:
    """Keep this thread on the CPU for `seconds` without a system call: numpy passes over `buf`
    (1 MiB: the caches get refilled) and Python bytecode, never a sleep."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        buf += 1.0
        sum(range(200))


GIL_UNIT = range(200)


def gil_work(units: int) -> None:
    """`units` units of pure Python bytecode: the GIL held throughout (another thread gets it only
    at the interpreter's switch interval), no system call, no allocation the collector tracks."""
    for _ in range(units):
        sum(GIL_UNIT)


def gil_units(seconds: float, trials: int = 7) -> int:
    """How many `gil_work` units take `seconds` on this core: the fastest of `trials` timings."""
    n = 2000
    best = min(_timed(gil_work, n) for _ in range(trials))
    return max(1, round(seconds / best * n))


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def first_batch_s(make) -> float:
    """Seconds from `make()` (a loader) to its first batch; the loader is closed after."""
    started = time.perf_counter()
    it = make()
    try:
        next(it)
        return time.perf_counter() - started
    finally:
        it.close()


def bar(desc: str, iterable=None):
    """A progress bar on stderr (none when stderr is not a terminal)."""
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, unit="batch", leave=False, disable=None, mininterval=0.5, file=sys.stderr)


def loader_pids(loader) -> tuple[list[int], list[int]]:
    """`(worker pids, [coordinator pid])` of a shmloader loader; `([], [])` for anything else
    (the baseline is a generator)."""
    procs = loader.debug() if hasattr(loader, "debug") else None
    if procs is None:
        return [], []
    return [p.pid for p in procs.workers], [procs.coordinator.pid]


def process_peaks(loader) -> dict:
    """Peak RSS (VmHWM, MiB) of a loader's largest worker and of its coordinator."""
    workers, coordinator = loader_pids(loader)
    if not workers:
        return {}
    peaks = [p for p in map(vm_hwm_mib, workers) if p is not None]
    return {"worker_peak_rss_mib": max(peaks) if peaks else None,
            "coordinator_peak_rss_mib": vm_hwm_mib(coordinator[0])}


def vm_hwm_mib(pid: int):
    kib = _status_kib(pid, "VmHWM")
    return None if kib is None else kib / 1024


def _status_kib(pid: int, field: str, path: str = "status"):
    try:
        with open(f"/proc/{pid}/{path}") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith(field + ":"))
    except (OSError, StopIteration, ValueError):
        return None


def _descendants(root: int) -> list[int]:
    """`root`'s descendant processes, from /proc (parent pids)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def tree_memory(root: int | None = None) -> dict:
    """Resident memory of `root` (this process) and all its descendants, in MiB: the sum of
    their RSS (pages shared between them, the ring's included, counted in each) and of their
    PSS (shared pages split between their users, from smaps_rollup), and how many processes."""
    root = os.getpid() if root is None else root
    pids = [root] + _descendants(root)
    rss = [_status_kib(p, "VmRSS") for p in pids]
    pss = [_status_kib(p, "Pss", "smaps_rollup") for p in pids]
    mib = lambda xs: sum(x for x in xs if x is not None) / 1024  # noqa: E731
    return {"processes": sum(r is not None for r in rss), "rss_mib": mib(rss),
            "pss_mib": mib(pss) if None not in pss else None, "trainer_rss_mib": (rss[0] or 0) / 1024}
