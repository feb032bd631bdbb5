"""Whether a lost child is healed: the restart budget and the poison rule. Pure.

A child that dies, or stalls while `next()` waits, is healed (procs/run.py): every child starts
again from the progress after the last batch returned, and the stream goes on exactly. Not
when:
- **the budget is spent** (`Budget`): `max_restarts` heals within `WINDOW_S` (an hour) are
  allowed; the next loss is an error naming the budget. `max_restarts=0`: the first loss is
  the error (it names the process, pid, signal, file and row group);
- **it is a poison pill** (`PoisonMemory`): the loader remembers the last piece lost in each
  row group. A loss in a row group whose remembered piece the stream has not passed since (the
  next batch starts before the piece's end: it was never read whole since) is not chance but
  a document that kills or hangs its worker: an error naming the file and row group, or with
  `on_bad_row_group="skip"` the row group is skipped by every later run (`poisoned`). Random
  deaths far apart never look like one: the piece in flight at a death is at most a ring or a
  piece ahead of delivery.
"""
from typing import NamedTuple

WINDOW_S = 3600.0  # max_restarts counts the heals within this window


class Held(NamedTuple):
    """The piece a worker held when it died or stalled: documents `[doc, end)` of row group
    `rg` of file `file` (`path`) in `epoch`, the file numbered as the run numbers it."""
    path: str
    rg: int
    doc: int
    end: int
    epoch: int
    file: int


class Budget:
    """At most `max_restarts` heals within `window_s` seconds."""

    def __init__(self, max_restarts: int, window_s: float = WINDOW_S):
        self.max_restarts, self.window_s = max_restarts, window_s
        self._times = []  # of the heals within the window

    def spent(self, now: float) -> bool:
        """Whether one more heal at `now` is past the budget."""
        self._times = [t for t in self._times if now - t < self.window_s]
        return len(self._times) >= self.max_restarts

    def spend(self, now: float) -> int:
        """Count a heal at `now`; returns the heals within the window, this one included."""
        self._times.append(now)
        return len(self._times)

    @property
    def used(self) -> int:
        return len(self._times)


class PoisonMemory:
    """The last piece lost in each row group, and the row groups found to be poison."""

    def __init__(self):
        self._lost = {}         # (path, rg) -> the last `Held` lost in it
        self.poisoned = set()   # (path, rg) skipped by every later run (on_bad_row_group="skip")

    def lost(self, held: Held, at) -> bool:
        """A worker was lost holding `held` while the stream stood at `at` (the position after the
        last batch returned: epoch, file, rg, doc, ...); True when it is a poison pill."""
        key = (held.path, held.rg)
        before = self._lost.get(key)
        self._lost[key] = held
        return before is not None and not passed(before, at)

    def skip(self, held: Held):
        self.poisoned.add((held.path, held.rg))

    def in_files(self, paths: list) -> tuple:
        """The poisoned row groups as `(file index in paths, rg)`, for a run's `RunArgs.poisoned`."""
        index = {p: i for i, p in enumerate(paths)}
        return tuple((index[p], rg) for p, rg in sorted(self.poisoned) if p in index)


def passed(held: Held, at) -> bool:
    """Whether the stream at `at` has gone past the end of piece `held` (best fit: its buffer has
    taken all of it), so the piece has been read whole since it was lost."""
    return (at[0], at[1], at[2], at[3]) >= (held.epoch, held.file, held.rg, held.end)
