"""The coordinator's looks at the free log while every slot is held (ipc/freepoll.py): at the
trainer's pace a look finds the frees just short of the trainer's kick; a pause backs the
looks off and does not slow them once the trainer is back; the bounds hold."""
import pytest

from shmloader.ipc.freepoll import EARLY, FREE_POLL_MAX_S, FREE_POLL_S, FreePoll


def run(poll: FreePoll, now: float, until: float, step_s: float, freed_upto: int) -> tuple:
    """The coordinator looking when `poll` says, a trainer freeing a slot every `step_s` from
    `now` on; returns (the time, the frees so far) at the first look past `until`, and the
    frees each look found."""
    found = []
    while now < until:
        now += poll.wait_s
        due = int(round(now / step_s, 9))
        n, freed_upto = due - freed_upto, due
        if n:
            poll.found(n, now)
        else:
            poll.none_found()
        found.append(n)
    return now, freed_upto, found


@pytest.mark.parametrize("gather", [1, 3, 7])
@pytest.mark.parametrize("step_s", [0.004, 0.02, 0.15])
def test_at_a_steady_pace_a_look_finds_gather_frees(gather, step_s):
    poll = FreePoll(gather)
    now, freed, found = run(poll, 0.0, max(3.0, 30 * gather * step_s), step_s, 0)
    want = (gather - EARLY) * step_s
    settled = found[len(found) // 2:]
    if want >= FREE_POLL_S:  # (a ring of 2 or 3, gather 1, kicks at every free anyway)
        assert poll.wait_s == pytest.approx(min(want, FREE_POLL_MAX_S), rel=0.25)
        assert max(settled) <= gather  # never the kick's gather + 1
    if FREE_POLL_S <= want <= FREE_POLL_MAX_S:  # neither the floor nor the cap: several at a look
        assert sum(settled) / len(settled) == pytest.approx(gather - EARLY, abs=0.5)


def test_a_pause_backs_the_looks_off_and_does_not_slow_them_after():
    poll = FreePoll(3)
    now, freed, _ = run(poll, 0.0, 1.0, 0.02, 0)
    assert poll.wait_s == pytest.approx((3 - EARLY) * 0.02, rel=0.25)
    before = poll.wait_s
    waits = []
    for _ in range(8):  # an evaluation: no frees for ~30 s
        poll.none_found()
        waits.append(poll.wait_s)
    assert waits[:4] == pytest.approx([2 * before, 4 * before, 8 * before, 16 * before])
    assert waits[-1] == FREE_POLL_MAX_S
    gap = poll.gap_s
    poll.found(4, now + 30.0)  # back: its kick (half a ring of 8)
    assert poll.gap_s == gap and poll.wait_s == pytest.approx(before)  # the pause is not a gap


def test_the_pace_follows_a_trainer_that_slows_down_or_speeds_up():
    poll = FreePoll(3)
    now, freed, _ = run(poll, 0.0, 1.0, 0.02, 0)
    now, freed, _ = run(poll, now, now + 2.0, 0.1, int(now / 0.1))
    assert poll.wait_s == pytest.approx((3 - EARLY) * 0.1, rel=0.25)
    now, freed, _ = run(poll, now, now + 1.0, 0.01, int(now / 0.01))
    assert poll.wait_s == pytest.approx((3 - EARLY) * 0.01, rel=0.25)


def test_bounds():
    poll = FreePoll(0)
    assert poll.gather == 1 and poll.wait_s == FREE_POLL_S
    poll.found(1, 10.0)
    poll.found(1000, 10.001)  # a burst: microseconds a free
    assert poll.wait_s == FREE_POLL_S
    slow, waits = FreePoll(3), []
    for i in range(10):  # a free every 0.9 s
        slow.found(1, 0.9 * i)
        waits.append(slow.wait_s)
    assert waits[:4] == pytest.approx([0.01, 0.02, 0.04, 0.08])  # at most twice the last wait
    assert waits[-1] == FREE_POLL_MAX_S  # 2 x 0.9 s, but at most the loop's usual wait
