"""Progress of long work a user waits on: what is done, of what total, at what rate, and the time left.

Who uses it: the replays a resume runs before its first batch (resume.py: another rank's
place, found by a count-only run, and every old rank's at a change of world size; the count
itself is procs/children.py `_count`, fed by the coordinator's `Progress` once a second) and
shmloader/tools/pretokenize.py. A replay takes seconds on a small run and minutes on a large one, and
the trainer shows nothing else meanwhile.

The rule:
- `Meter` (pure arithmetic over `(now, done)` readings): the rate is what was done since the
  meter began over the seconds since then, and the time left is what remains at that rate
  (unknown until something is done). A count that goes back (a lost coordinator counts again
  from the start: procs/run.py) begins the meter again there.
- `Report` says it where the user looks:
  - on a terminal (`bar=True` and the stream is a tty): a tqdm bar, which shows the same done,
    total, rate and time left;
  - otherwise one line per reading worth saying: the first once the work has run `FIRST_S`
    (work shorter than that says only its end), then one each `EVERY_S` (but `FIRST_S` after a
    line that could not say the time left yet: nothing was done, the work slow to begin; the
    user hears the time left once it is known, not ten seconds later), then the end's line
    ("done: 40 batches in 3.2 s"). Each line is whole and greppable: "<label>: 12 of 40
    batches (30%), 3.1 batches/s, about 9 s left".
  - `emit(level, text)` writes a line. The loader's lines go to the "shmloader" logger at
    INFO when that logger shows INFO, else at WARNING, so that Python's default logging
    (WARNING, no handler) shows them; `loud=False` (every rank but one: they replay the same
    work side by side) keeps them at INFO.
"""
import logging
import sys
from typing import Callable, NamedTuple

FIRST_S = 1.0   # a line once the work has run this long
EVERY_S = 10.0  # then one line per this many seconds


class Reading(NamedTuple):
    """What a `Meter` says at one moment."""
    done: int
    total: int
    rate: float             # units per second since the meter began (0: nothing done yet)
    left_s: float | None    # seconds left at that rate (None: not known yet)
    elapsed_s: float        # seconds since the work began (not since a restart of the meter)


class Meter:
    """Done of total, the rate and the time left, from `(now, done)` readings."""

    def __init__(self, total: int, began: float):
        self.total, self.began = total, began
        self._since, self._base, self.done = began, 0, 0

    def update(self, now: float, done: int, total: int | None = None) -> Reading:
        if total is not None:
            self.total = total
        if done < self.done:  # counting again from the start
            self._since, self._base = now, done
        self.done = done
        span, gained = now - self._since, done - self._base
        rate = gained / span if span > 0 and gained > 0 else 0.0
        left = max(self.total - done, 0) / rate if rate > 0 else None
        return Reading(done, self.total, rate, left, now - self.began)


def duration(seconds: float) -> str:
    """'0.4 s', '45 s', '3 min 20 s', '2 h 05 min'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def line(label: str, r: Reading, unit: str, extra: str = "") -> str:
    """'<label>: 12 of 40 batches (30%), 3.1 batches/s, about 9 s left[; extra]'."""
    share = f" ({100 * r.done / r.total:.0f}%)" if r.total else ""
    pace = (f", {_rate(r.rate)} {unit}/s, about {duration(r.left_s)} left" if r.left_s is not None
            else f", {duration(r.elapsed_s)} so far, the time left not known yet")
    return f"{label}: {r.done} of {r.total} {unit}{share}{pace}" + (f"; {extra}" if extra else "")


def _rate(rate: float) -> str:
    return f"{rate:.1f}" if rate < 100 else f"{rate:,.0f}"


def log_emitter(logger: logging.Logger, loud: bool = True) -> Callable[[int, str], None]:
    """`emit` for a logger: INFO when it shows INFO; else, `loud`, WARNING (the default level)."""
    def emit(level: int, text: str):
        shown = logging.INFO if logger.isEnabledFor(logging.INFO) or not loud else level
        logger.log(shown, text)
    return emit


class Report:
    """One piece of long work's progress, shown as the module says. `update(now, done[, total,
    extra])` as readings come; `finish(now, text)` once, with what the work found."""

    def __init__(self, label: str, total: int, unit: str, began: float, emit: Callable[[int, str], None],
                 bar: bool = False, stream=None):
        self.label, self.unit, self.emit = label, unit, emit
        self.meter = Meter(total, began)
        self._next_line = began + FIRST_S
        stream = stream if stream is not None else sys.stderr
        self._bar = _tqdm(label, total, unit, stream) if bar and _isatty(stream) else None

    def update(self, now: float, done: int, total: int | None = None, extra: str = ""):
        r = self.meter.update(now, done, total)
        if self._bar is not None:
            self._bar.total = r.total
            self._bar.update(r.done - self._bar.n)
            if extra:
                self._bar.set_postfix_str(extra, refresh=False)
            return
        if now >= self._next_line:
            self._next_line = now + (EVERY_S if r.left_s is not None else FIRST_S)
            self.emit(logging.WARNING, line(self.label, r, self.unit, extra))

    def finish(self, now: float, text: str = ""):
        """The end's line: 'label: done, 40 batches in 3.2 s[; text]'."""
        if self._bar is not None:
            self._bar.update(self.meter.total - self._bar.n)
            self._bar.close()
            self._bar = None
        self.emit(logging.WARNING, f"{self.label}: done, {self.meter.total} {self.unit} in "
                                   f"{duration(now - self.meter.began)}" + (f"; {text}" if text else ""))

    def close(self):
        """Without `finish` (the work failed): the bar, if any, is put away."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _tqdm(label: str, total: int, unit: str, stream):
    from tqdm import tqdm
    return tqdm(total=total, desc=label, unit=unit, file=stream, leave=True, mininterval=0.5, smoothing=0.0,
                dynamic_ncols=True)
