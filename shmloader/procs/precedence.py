"""A loader that is starting has the cores until its first batch: the training process's other
loaders' workers give way to it.

nanochat builds a new val loader at every evaluation while its train loader is running. On a
machine whose cores the workers fill, the train loader's workers (still filling their ring and
their read-ahead after the step-0 batch) took half the cores from the val loader's first batch,
and the first evaluation came later than with nanochat's own loader (docs/benchmarks.md,
"First batch: nanochat's evaluations"). Meanwhile the trainer is blocked in that first
batch (`next()` starts a loader's children and waits for it), so pausing the others costs it
nothing.

The rule, in the training process (`Precedence`, one per process: `PRECEDENCE`):
- a run is *starting* from when its children are started until the trainer takes its first
  batch, or it stops (closed, failed, released); then it is *running*, or gone;
- while any run of this process is starting, every running run's ring carries a deadline
  (`ring.Counter.YIELD_UNTIL`: CLOCK_MONOTONIC microseconds, system-wide, so the children
  read the trainer's clock) until which its workers tokenize nothing (`pause_left_us`, read by
  procs/worker.py's `_give_way`) and begin no fast engine's build: they keep answering the
  coordinator's messages and beating, so the stream, the write orders and the stall watch are
  untouched;
- starting runs never pause each other (two loaders started together share the cores);
- the word is cleared when the last starting run takes its first batch, fails or stops (and
  at any of these once no starting run is left, e.g. one the garbage collector took), and
  `YIELD_S` from the start that began a pause bounds it whatever happens to the trainer (a
  first batch that takes longer lets the others go on; a start during a pause does not
  extend it).
A run that only finds a position (`locate_position`) does not pause anything. Other training
processes (other ranks) are never paused: the registry is per process.
"""
import threading
import time
import weakref

from ..ipc.ring import Counter

YIELD_S = 5.0  # the longest pause a starting run asks of the others


def now_us() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock of `YIELD_UNTIL` (the same in every process)."""
    return time.monotonic_ns() // 1000


def pause_left_us(counters) -> int:
    """The worker's side: microseconds its run still gives way, read from its ring's `counters`
    (0: no pause, or one whose deadline passed). While it is not 0 a worker tokenizes nothing
    and begins nothing that can wait (a fast engine's build)."""
    until = int(counters[Counter.YIELD_UNTIL])
    return max(until - now_us(), 0) if until else 0


class Precedence:
    """The runs of one training process, starting and running; writes every running run's
    `YIELD_UNTIL`. A run is anything with a `ring` whose `counters` view is a numpy array (None
    once unmapped)."""

    def __init__(self):
        # re-entrant: a loader freed by the garbage collector (it runs at any allocation, in any
        # thread, also inside these methods) closes here, and `stopped` takes the lock again
        self._lock = threading.RLock()
        self._starting = weakref.WeakSet()
        self._running = weakref.WeakSet()
        self._until = 0  # the deadline the running runs carry (0: none)

    def starting(self, run):
        """`run`'s children are started: the running ones give way until its first batch."""
        with self._lock:
            self._starting.add(run)
            now = now_us()
            # a pause in force keeps its deadline: at most YIELD_S from the start that began it
            self._write(self._until if self._until > now else now + int(YIELD_S * 1e6))

    def started(self, run):
        """`run`'s first batch was taken: it runs, and gives way to the next one that starts."""
        with self._lock:
            was_starting = run in self._starting
            self._starting.discard(run)
            self._running.add(run)  # also a run whose first wait failed (a timeout) and was retried
            if self._starting:  # another one is still starting: this one gives way too
                _set(run, self._until)
            elif was_starting or self._until:
                self._write(0)

    def failed(self, run):
        """Waiting for a batch of `run` raised (an error, a timeout, Ctrl-C): if it was starting,
        nobody waits for its first batch now; a running run stays running."""
        with self._lock:
            self._starting.discard(run)
            if not self._starting and self._until:
                self._write(0)

    def stopped(self, run):
        """`run` stops (before its ring is unmapped)."""
        with self._lock:
            self._starting.discard(run)
            self._running.discard(run)
            if not self._starting and self._until:
                self._write(0)

    def is_starting(self, run) -> bool:
        return run in self._starting

    def _write(self, until: int):
        self._until = until
        for run in list(self._running):
            _set(run, until)


def _set(run, until: int):
    counters = run.ring.counters
    if counters is not None:
        counters[Counter.YIELD_UNTIL] = until


PRECEDENCE = Precedence()


def forget():
    """In a child forked from the trainer (`os.fork()`): the trainer's runs are not this
    process's (and the lock may have been held by another of its threads)."""
    global PRECEDENCE
    PRECEDENCE = Precedence()
