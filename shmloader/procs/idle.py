"""The idle release's rule (`idle_release_s`, NOTE [ring protocol] 7): when the trainer is away
from a loader long enough that its processes exit (the coordinator asks at every turn of its
loop; procs/run.py starts them again at the next `next()`). Pure: the ring's counters and the
clock in, a decision out.

The trainer is away, and the processes exit, when for `idle_release_s` s, and for `IDLE_GAPS`
(10) times the longest gap between the batches it gave back so far, it has neither taken a
batch nor given one back, is not waiting in `next()` (`Counter.WAITING`), and every slot holds
a batch announced to it. Not before it has given back 2 batches: the gaps count from the first
(its first step may be long, a compile; a restarted run knows nothing of the one before). A
trainer that waited in `next()` for a slow piece and then takes a burst of batches is here all
along.

A batch is *given back* when the caller lets go of it, which is when the ring's slot is freed
(delivery.py: a lent batch at the first `next()` after the caller dropped it, a copied one at
once); the coordinator sees the frees at its turns and times the gaps between them. The head
start's batches (procs/headstart.py) are given back the same way, and the trainer, which sees
it at its `next()`s, counts them (`Counter.HEAD_BACK`) and times the gaps between them
(`Counter.HEAD_GAP_US`): the coordinator starts after the first of them, later still while a
forkserver boots, and may see several at one turn. The ring's copies of those batches (below
`Counter.HEAD`, taken and freed when `next()` first comes to the ring) are not the caller's and
do not count. So the head start changes nothing here: a caller that reads 3 batches, keeps the
last one and pauses 0.45 s has given back 1 batch in its first pause and a gap of 0.45 s at its
next burst (with `idle_release_s=0.15`: never released, with or without a head start; with a
head start it was released in 28 of 30 pauses while every head-start batch but the last counted
as given back at once, with no gap).
"""
from typing import NamedTuple

IDLE_GAPS = 10  # a release waits at least this many times the longest gap between batches given back


class HeadCounters(NamedTuple):
    """What the trainer says of its head start's batches (ring.Counter)."""
    taken: int          # HEAD: batches the trainer made itself and returned (0..taken-1)
    given_back: int     # HEAD_BACK: of those, the ones the caller has let go of
    longest_gap: float  # HEAD_GAP_US / 1e6: the longest gap between those, in seconds


class IdleRule:
    """One run's idle rule: `turn(...)` at every turn of the coordinator's loop says whether
    the processes exit now."""

    def __init__(self, idle_s: float, now: float):
        """`idle_s`: `idle_release_s` (0: never); `now`: the run's start (time.monotonic())."""
        self.idle_s = idle_s
        self.never = not idle_s  # 0: the rule never releases, and is not asked (procs/coordinator.py)
        self.given_back = 0          # batches the caller gave back: the ring's and the head start's
        self._ring_back = 0          # of them, the ring's (frees of batches at or above HEAD)
        self._last_back = None       # when the last of them was seen
        self.longest_gap = 0.0       # the longest gap between them, from the first
        self._taken, self._last_here = 0, now  # batches taken (ring and head start), and when last here

    def turn(self, now: float, freed: list, taken: int, head: HeadCounters, waiting: bool,
             all_ready) -> "float | None":
        """The seconds the trainer has been away, if the processes exit now; else None.

        `freed`: the batches whose slots were freed since the last turn; `taken`: the ring's
        `Counter.TAKEN`; `head`: the head start's counters; `waiting`: `Counter.WAITING`;
        `all_ready()`: whether every slot holds a batch announced and not given back (asked
        last: it reads the ring)."""
        taken += head.taken
        if taken != self._taken or waiting:
            self._taken, self._last_here = taken, now
        self._ring_back += sum(1 for k in freed if k >= head.taken)  # below: a head-start batch's ring copy
        given_back = self._ring_back + head.given_back
        self.longest_gap = max(self.longest_gap, head.longest_gap)
        if given_back != self.given_back:
            if self._last_back is not None:
                self.longest_gap = max(self.longest_gap, now - self._last_back)
            self.given_back, self._last_back = given_back, now
            return None
        if self.never or self.given_back < 2 or not all_ready():
            return None
        away = now - max(self._last_back, self._last_here)
        return away if away > max(self.idle_s, IDLE_GAPS * self.longest_gap) else None
