"""procs/idle.py, the idle release's rule, on a simulated clock: a trainer's takes and gives
back (a lent batch is given back at the first `next()` after the caller dropped it; a copied
one at once), the counters it writes (with or without a head start: procs/headstart.py), and a
coordinator that looks at them every `TURN_S` (or only from a later time: a forkserver that
boots). The rule must decide the same with and without the head start."""
from shmloader.procs.idle import IDLE_GAPS, HeadCounters, IdleRule

TURN_S = 0.01


class Trainer:
    """A caller and the counters its `next()`s write. `head`: the first `head` batches are the
    head start's (HEAD, HEAD_BACK, HEAD_GAP_US, timed by the trainer), the ring's copies of
    them freed when `next()` first comes to the ring; the rest are the ring's (their frees
    logged). `keep`: how many of its last batches the caller holds (1: `x, y = next(it)`; 0: it
    drops each at once)."""

    def __init__(self, head: int = 0, keep: int = 1):
        self.head, self.keep = head, keep
        self.taken = 0                 # batches returned to the caller
        self.dropped = []              # dropped by the caller, not given back yet
        self.held = []                 # held by the caller
        self.freed = []                # the free log since the coordinator's last look
        self.ring_taken = 0            # Counter.TAKEN
        self.head_taken = self.head_back = 0
        self.head_gap, self._head_back_at = 0.0, None

    def next(self, now: float):
        self._give_back(now)           # delivery.reclaim / HeadStart.back, at the start of next()
        k = self.taken
        if k < self.head:
            self.head_taken += 1
        else:
            if k == self.head and self.head:     # the ring's copies of the head start's batches
                self.freed += range(self.head)
                self.ring_taken += self.head
            self.ring_taken += 1
        self.taken += 1
        self.held.append(k)
        while len(self.held) > self.keep:
            self.dropped.append(self.held.pop(0))

    def _give_back(self, now: float):
        back, self.dropped = self.dropped, []
        heads = [k for k in back if k < self.head]
        self.freed += [k for k in back if k >= self.head]
        if heads:
            if self._head_back_at is not None:
                self.head_gap = max(self.head_gap, now - self._head_back_at)
            self.head_back, self._head_back_at = self.head_back + len(heads), now

    def look(self) -> tuple:
        """What the coordinator reads at a turn: (freed, TAKEN, HeadCounters)."""
        freed, self.freed = self.freed, []
        return freed, self.ring_taken, HeadCounters(self.head_taken, self.head_back, self.head_gap)


def run(trainer: Trainer, reads: list, idle_s: float, end: float, watch_from: float = 0.0) -> list:
    """The times at which the rule releases: `reads` are the times of the trainer's `next()`s; the
    coordinator turns every TURN_S from `watch_from`; a release starts a new rule (a new run's
    coordinator) and the trainer a new run at its next read (a new head start, if any)."""
    releases, rule, now, reads = [], IdleRule(idle_s, watch_from), 0.0, sorted(reads)
    while now < end:
        while reads and reads[0] <= now:
            trainer.next(reads.pop(0))
        if now >= watch_from:
            freed, taken, head = trainer.look()
            if rule.turn(now, freed, taken, head, False, lambda: True) is not None:
                releases.append(now)
                rule = IdleRule(idle_s, now)
                trainer = Trainer(trainer.head, trainer.keep)
        now = round(now + TURN_S, 6)
    return releases


def bursts(n: int, size: int = 3, pause_s: float = 0.45, step_s: float = 0.001) -> list:
    """The times of `n` bursts of `size` reads `step_s` apart, `pause_s` between bursts."""
    out, t = [], 0.0
    for _ in range(n):
        for _ in range(size):
            out.append(round(t, 6))
            t += step_s
        t += pause_s
    return out


def test_a_reader_in_bursts_that_keeps_its_last_batch_is_never_released_with_or_without_a_head_start():
    """Issue 49, item 5: bursts of 3, 0.45 s apart, `idle_release_s=0.15`: one batch is given
    back in the first pause, and the pause is a gap of 0.45 s at the next burst, so 10 of it is
    never reached. With the head start each head-start batch but the last counted as given back
    when the next was taken, with no gap: released in every pause."""
    reads = bursts(30)
    assert run(Trainer(head=0), reads, 0.15, reads[-1] + 1.0) == []
    for head in (1, 3, 4):
        assert run(Trainer(head=head), reads, 0.15, reads[-1] + 1.0) == [], f"head start of {head}"


def test_the_head_starts_gaps_count_when_the_coordinator_was_not_there_to_see_them():
    """A forkserver that boots starts the coordinator late: by its first look the caller has
    given back 4 of the head start's 6 batches, one burst apart, which it sees at one turn. The
    trainer timed them (HEAD_GAP_US)."""
    reads = bursts(10)
    assert run(Trainer(head=6), reads, 0.15, reads[-1] + 1.0, watch_from=reads[6] + 0.05) == []


def test_the_ring_copies_of_the_head_starts_batches_are_not_given_back():
    """A caller that keeps what it took gives back nothing; the ring's copies of the head
    start's batches, freed when `next()` first comes to the ring, are not its batches."""
    trainer = Trainer(head=2, keep=3)
    reads = [0.0, 0.001, 0.002]            # the third comes from the ring: copies 0 and 1 freed
    trainer.next(reads[0])
    trainer.next(reads[1])
    trainer.next(reads[2])
    freed, taken, head = trainer.look()
    assert freed == [0, 1] and (taken, head.taken, head.given_back) == (3, 2, 0)
    rule = IdleRule(0.1, 0.0)
    assert [rule.turn(t, freed if t == 0.01 else [], taken, head, False, lambda: True) for t in (0.01, 5.0)] \
        == [None, None]
    assert rule.given_back == 0


def test_a_loader_left_within_its_head_start_batches_is_released():
    """Read 3 batches (dropping each), all made by the head start, then left: 2 given back a
    moment apart, so it is released once idle_release_s has passed (it was kept for ever when
    only the ring's frees counted)."""
    releases = run(Trainer(head=4, keep=0), [0.0, 0.001, 0.002], 0.2, 2.0)
    assert len(releases) == 1 and 0.2 < releases[0] < 0.25


def test_a_trainer_with_slow_steps_is_not_released():
    """Gaps longer than idle_release_s are its pace: a release waits for 10 of the longest."""
    for head in (0, 4):
        reads = [0.35 * i for i in range(12)]
        assert run(Trainer(head=head), reads, 0.2, reads[-1] + 0.3) == []
        left = run(Trainer(head=head), reads, 0.2, reads[-1] + IDLE_GAPS * 0.35 + 0.5)
        assert len(left) == 1 and left[0] > reads[-1] + IDLE_GAPS * (0.35 - TURN_S)


def test_not_before_two_batches_are_given_back_nor_while_waiting_nor_with_zero():
    rule = IdleRule(0.1, 0.0)
    nothing = HeadCounters(0, 0, 0.0)
    rule.turn(0.0, [0], 1, nothing, False, lambda: True)
    assert rule.turn(5.0, [], 1, nothing, False, lambda: True) is None        # 1 given back
    rule.turn(5.0, [1], 2, nothing, False, lambda: True)
    assert rule.turn(5.05, [], 2, nothing, True, lambda: True) is None        # waiting in next()
    assert rule.turn(60.0, [], 2, nothing, False, lambda: False) is None      # a slot not ready
    assert rule.turn(60.0, [], 2, nothing, False, lambda: True) is not None
    never = IdleRule(0.0, 0.0)
    for t, k in ((0.0, 0), (0.01, 1)):
        never.turn(t, [k], k + 1, nothing, False, lambda: True)
    assert never.turn(1e6, [], 2, nothing, False, lambda: True) is None
