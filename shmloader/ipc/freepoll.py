"""How long the coordinator waits before it looks at the free log again while every slot is
held (NOTE [slot handover] in ipc/handover.py).

Then the trainer is the bottleneck: a freed slot refilled at once or a few batches later costs
it nothing while the ring still holds batches, but every look costs a wake-up of the
coordinator, and every free it finds a write order, a wake-up of a worker and its answer. At a
trainer's pace, looking every 10 ms, those turns were most of the coordinator's CPU: 920 µs a
batch for concat (B=8, T=1024, a batch every 20 ms, 2 cores), where it takes 115-160 µs a batch
as fast as it goes (docs/benchmarks.md, "The loader's processes at a trainer's pace").

So `FreePoll.wait_s` is the time the trainer takes to free `gather` slots at its recent pace
(`gap_s`, a moving average of the time per free between looks that found frees), less one
free's (`EARLY`: a step that runs long, or a look that wakes late, does not make the trainer
ring), at least `FREE_POLL_S` and at most twice the last wait (one look's gap, e.g. the first,
cannot stretch it far): a look finds several frees, and their write orders go out together.
A look that found nothing doubles the wait, up to `FREE_POLL_MAX_S` (a trainer away, e.g. an
evaluation: a few wake-ups a second); a time between looks that found frees longer than
`PAUSE_S` is a pause, not the pace (the frees after an evaluation do not slow the looks). What
bounds how long a free waits is the trainer's side: it rings the coordinator when `gather + 1`
frees (half the ring) wait unseen, and before it blocks, so a trainer that speeds up is never
left waiting for a look.
"""

FREE_POLL_S = 0.01      # the shortest wait between looks while every slot is held
FREE_POLL_MAX_S = 1.0   # the longest: the coordinator loop's usual wait (procs/stall.py)
PACE_WEIGHT = 0.5       # the newest look's time per free, in the moving average
EARLY = 1.0             # a look comes this many frees' time before the `gather`-th is due (jitter)
PAUSE_S = 2 * FREE_POLL_MAX_S  # a longer time between looks that found frees is a pause, not the pace


class FreePoll:
    """`found(n, now)` after each look at the free log that found `n` frees (n > 0),
    `none_found()` after a look that found none at the end of a wait (nothing woke the
    coordinator: no free came meanwhile); `wait_s` is the next wait."""

    def __init__(self, gather: int):
        self.gather = max(1, gather)    # frees a look should find at the trainer's pace
        self.gap_s = None               # the trainer's recent seconds per free
        self.wait_s = FREE_POLL_S
        self._last = None               # when a look last found frees

    def found(self, n: int, now: float):
        if self._last is not None and now - self._last <= PAUSE_S:
            gap = (now - self._last) / n
            self.gap_s = gap if self.gap_s is None else self.gap_s + PACE_WEIGHT * (gap - self.gap_s)
        self._last = now
        pace = max(FREE_POLL_S, (self.gap_s or 0.0) * (self.gather - EARLY))
        self.wait_s = min(pace, 2 * self.wait_s, FREE_POLL_MAX_S)  # one look's gap cannot stretch it far

    def none_found(self):
        self.wait_s = min(2 * self.wait_s, FREE_POLL_MAX_S)
