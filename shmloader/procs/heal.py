"""Whether a lost child is healed: the restart budget and the poison rule. Pure.

A child that dies, or stalls while `next()` waits, is healed (procs/run.py): a worker is
replaced and its work done again, the coordinator and the other workers going on; a lost
coordinator restarts every process from the progress after the last batch returned. Either
way the stream goes on exactly. Not when:
- **the budget is spent** (`Budget`): `max_restarts` heals within `WINDOW_S` (an hour) are
  allowed; the next loss is an error naming the budget. `max_restarts=0`: the first loss is
  the error (it names the process, pid, signal, file, row group and documents);
- **it is a poison pill** (`PoisonMemory`). A loss is located to the run of documents inside
  the engine at that moment (`Held.run`..`run_end`, from the worker's status row), or to its
  piece while the piece was being read (`Held.reading`). That becomes a *suspect*, whose
  documents every worker told of it tokenizes one per engine call (`suspects`). A later loss
  in the engine on a single document inside a suspect of the same epoch (the replacement's
  read of the lost piece) that the stream has not passed since is no chance: that document
  kills or hangs its worker; so is a second loss while reading the same piece in the same
  epoch (its row group kills the reader). Then an error naming the file, row group and rows,
  or with `on_bad_row_group="skip"` just those rows are skipped by every worker from then on
  (`poisoned`: read as nulls), and the rest of the row group is read. Losses anywhere else are
  chance, healed within the budget: unrelated kills far apart never meet in a suspect, whose
  documents are tokenized one at a time only just after its loss.

Both are kept as documents `[lo, hi)` of their row group *as the epoch they were found in
orders them* (`Poison.epoch`, `Span.epoch`). In the files' order that is every epoch's; in a
shuffled order (data/shuffle.py) they are documents of a window, in another window and order
each epoch, and `spans_in` moves them to the order of the piece a worker is given: the
poisoned document is skipped in every epoch, and no other. A shuffled stream's place says nothing of whether a
unit was passed (its units are not in file order): a suspect is passed there once the
stream is in a later epoch, or past it in its own unit (`PoisonMemory(shuffled=True)`).
"""
from typing import NamedTuple

from ..data.formats import place_of  # the file's format's words (a JSON Lines file's lines)
from ..ipc.protocol import Span

WINDOW_S = 3600.0  # max_restarts counts the heals within this window


class Held(NamedTuple):
    """What a worker held when it died or stalled: the piece, documents `[doc, end)` of row
    group `rg` of file `file` (`path`) in `epoch`, the file numbered as the run numbers it;
    and the documents `[run, run_end)` inside the engine then (-1: the piece was being read)."""
    path: str
    rg: int
    doc: int
    end: int
    epoch: int
    file: int
    run: int
    run_end: int

    @property
    def reading(self) -> bool:
        return self.run < 0

    @property
    def span(self) -> tuple:
        """The documents it was on: the run in the engine, or the piece being read."""
        return (self.doc, self.end) if self.reading else (self.run, self.run_end)


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


class Poison(NamedTuple):
    """Rows `[lo, hi)` of row group `rg` of `path` kill or hang a worker every time: documents
    `[lo, hi)` as epoch `epoch` orders them (`shuffled`: in the shuffled order of that epoch of
    the window whose first row group that is, data/shuffle.py; else its rows, and `epoch` 0)."""
    path: str
    rg: int
    lo: int
    hi: int
    epoch: int = 0
    shuffled: bool = False

    def __str__(self) -> str:
        if self.shuffled:
            rows = f"document {self.lo}" if self.hi - self.lo == 1 else f"documents {self.lo}-{self.hi - 1}"
            return (f"{self.path}, the shuffled window of {place_of(self.path, self.rg)} in epoch {self.epoch}, "
                    f"its {rows}")
        return f"{self.path}, {place_of(self.path, self.rg, self.lo, self.hi - 1)}"


class PoisonMemory:
    """The runs of documents lost and not passed since (suspects), and the poisoned ones."""

    def __init__(self, shuffled: bool = False):
        self.shuffled = shuffled  # a shuffled order: places are not in file order (module docstring)
        self._suspects = {}     # (path, rg) -> [Held, ...]
        self.poisoned = set()   # `Poison`s skipped by every worker from then on (on_bad_row_group="skip")

    def lost(self, held: Held, at) -> "Poison | None":
        """A worker was lost holding `held` while the stream stood at `at` (the position after
        the last batch returned: epoch, file, rg, doc, ...): the `Poison` it shows, or None
        (chance: `held`'s run is a suspect from now on)."""
        key, (lo, hi) = (held.path, held.rg), held.span
        earlier = [h for h in self._suspects.get(key, []) if not passed(h, at, self.shuffled)]
        # the replacement reads the lost piece again in its epoch; the same rows in another epoch
        # are another read (best fit counts epochs ahead of the stream on a small corpus)
        again = [h for h in earlier if h.epoch == held.epoch]
        if held.reading:
            inside = [h for h in again if h.reading and h.span == (lo, hi)]
        else:
            inside = [h for h in again if h.span[0] <= lo and hi <= h.span[1]] if hi - lo == 1 else []
        if inside:
            self._suspects[key] = [h for h in earlier if h not in inside]
            return Poison(held.path, held.rg, lo, hi, self._epoch(held), self.shuffled)
        self._suspects[key] = earlier + [held]
        return None

    def _epoch(self, held: Held) -> int:
        """The epoch whose order `held`'s documents count in: its own when shuffled, else 0 (any)."""
        return held.epoch if self.shuffled else 0

    def skip(self, poison: Poison):
        self.poisoned.add(poison)

    @property
    def rows_skipped(self) -> int:
        return sum(p.hi - p.lo for p in self.poisoned)

    def spans(self, paths: list) -> tuple:
        """`(poisoned, suspects)` as `Span`s in a run's numbering of the files (`paths`)."""
        index = {p: i for i, p in enumerate(paths)}
        poisoned = tuple(Span(index[p.path], p.rg, p.lo, p.hi, p.epoch) for p in sorted(self.poisoned)
                         if p.path in index)
        suspects = tuple(Span(index[h.path], h.rg, *h.span, self._epoch(h)) for (path, _), held in sorted(self._suspects.items())
                         if path in index for h in held)
        return poisoned, suspects


def passed(held: Held, at, shuffled: bool = False) -> bool:
    """Whether the stream at `at` has gone past the end of what `held` was on (best fit: its
    buffer has taken all of it), so those documents have been read whole since it was lost.
    Shuffled: a later epoch, or past it in its own unit (units are not in file order)."""
    if shuffled:
        return at[0] > held.epoch or ((at[0], at[1], at[2]) == (held.epoch, held.file, held.rg)
                                      and at[3] >= held.span[1])
    return (at[0], at[1], at[2], at[3]) >= (held.epoch, held.file, held.rg, held.span[1])


def spans_in(piece, spans, windows) -> tuple:
    """The documents `(lo, hi)` of `spans` (`Span`s: poisoned or suspect) in `piece`'s row group,
    as `piece`'s epoch orders them: with `windows` (a shuffled order's `shuffle.Windows`) those
    of any window whose rows are in `piece`'s window, moved from each span's epoch and window to
    the piece's (`Windows.moved`); else as they are."""
    if windows is None:
        return tuple((s.lo, s.hi) for s in spans if (s.file, s.rg) == (piece.file, piece.rg))
    if not spans:
        return ()
    return tuple(windows.moved(piece, [(s.epoch, s.file, s.rg, s.lo, s.hi) for s in spans]))
