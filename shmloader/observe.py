"""What the trainer saw lately: interval figures from cumulative counters, pure arithmetic.

The rule: a figure of `stats()` that says "lately" covers the wall time from the previous
reading of the same `Interval` (the caller's previous `stats()`, or the loader's start) to
this one, and is the difference of two readings of cumulative counters divided by that time:

- `wait_share` = (seconds `next()` blocked for a batch, now - then) / interval, in [0, 1];
- `tokens_per_s` = (tokens delivered by `next()`, now - then) / interval;
- a worker's busy share = (its reading-and-tokenizing seconds, now - then) / interval,
  clamped to [0, 1]: a worker adds its busy time when it finishes a piece (ipc/ring.py
  `WorkerCol.BUSY_US`), so over an interval shorter than a piece the share is lumpy (0, then
  more than the truth). A worker whose pid changed (replaced, or a new run of the children)
  counts its whole busy time as the interval's.

Reading the counters costs the trainer nothing per batch: `next()` only adds its wait to a
float (as it did before), and a reading is a clock read (vDSO, no system call) and the ring's
header. Nothing here touches a process, a clock or shared memory: the loader passes readings
in (report.py `Report`), the tests pass made-up ones (tests/unit/test_observe.py).
"""
from typing import NamedTuple


class Reading(NamedTuple):
    """Cumulative counters at one moment (`at`: `time.monotonic()`)."""
    at: float
    wait_s: float                 # seconds next() blocked for a batch, since the loader began
    tokens: int                   # tokens delivered by next(), since the loader began
    worker_pids: tuple = ()       # worker i's pid (0: none yet)
    worker_busy_s: tuple = ()     # worker i's reading-and-tokenizing seconds, since it started


class Figures(NamedTuple):
    """One interval's figures (`Interval.step`)."""
    interval_s: float
    wait_share: float             # share of the interval next() blocked for a batch
    tokens_per_s: float           # tokens delivered per second over the interval
    worker_busy: tuple            # worker i's busy share of the interval, in [0, 1]


class Interval:
    """Figures since the previous reading: `step(reading)` returns the interval's `Figures` and
    makes `reading` the start of the next interval."""

    def __init__(self, start: Reading):
        self.last = start

    def step(self, now: Reading) -> Figures:
        then, self.last = self.last, now
        span = now.at - then.at
        if span <= 0:  # two readings at the same tick: nothing to say about an empty interval
            return Figures(0.0, 0.0, 0.0, tuple(0.0 for _ in now.worker_busy_s))
        waited = max(now.wait_s - then.wait_s, 0.0)
        old = dict(zip(then.worker_pids, then.worker_busy_s))
        busy = tuple(_share(b - old[p] if p in old and b >= old[p] else b, span)
                     for p, b in zip(now.worker_pids, now.worker_busy_s))
        return Figures(span, min(waited / span, 1.0), max(now.tokens - then.tokens, 0) / span, busy)


def _share(seconds: float, span: float) -> float:
    return min(max(seconds / span, 0.0), 1.0)


def busiest_idlest(busy: tuple) -> tuple:
    """`(busiest, idlest)`: the highest and lowest busy share, `(i, share)` each (None without workers)."""
    if not busy:
        return None, None
    ranked = sorted(enumerate(busy), key=lambda x: x[1])
    return ranked[-1], ranked[0]
