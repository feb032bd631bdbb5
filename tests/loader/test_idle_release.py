"""Idle release (`idle_release_s`, NOTE [ring protocol] 7 in ipc/protocol.py): a loader the
trainer stops reading (an evaluation's loader between evaluations) lets its coordinator and
workers exit, and its next `next()` starts new ones from its state. As the client sees it:
the processes are gone while it is away, the batches it still holds stay valid, and the
stream and its states are those of a loader that was never released (both packings, 1 and 3
workers), also after several releases; a trainer whose steps are slow is never released."""
import itertools
import time

import numpy as np
import pytest

from tests.helpers import pid_alive, wait_gone

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 2, 48
OPTS = {"concat": {}, "bos_bestfit": {"buffer_size": 12, "tokenizer_batch_size": 4}}


def children(loader) -> list[int]:
    d = loader.debug()
    return [d.coordinator.pid, *(p.pid for p in d.workers)]


def tokens(inputs, targets) -> np.ndarray:
    """A batch's inputs then targets, copied (best fit's rows do not overlap as concat's do)."""
    return np.concatenate([inputs.numpy().ravel(), targets.numpy().ravel()])


def take(it, n, loader, hold=False):
    """`n` batches as (tokens copied, the lent tensors if `hold` else None, state after it)."""
    out = []
    for inputs, targets in itertools.islice(it, n):
        out.append((tokens(inputs, targets), (inputs, targets) if hold else None, loader.state_dict()))
    assert len(out) == n
    return out


def reference(ds, packing, n):
    with ds.loader(B, T, packing=packing, num_workers=2, idle_release_s=0, **OPTS[packing]) as loader:
        got = take(iter(loader), n, loader)
    return [w for w, _, _ in got], [s for _, _, s in got]


# each packing and each worker count by default (two pairs of four), the other two pairs in the slow suite
@pytest.mark.parametrize("num_workers, packing", [
    (1, "concat"), (3, "bos_bestfit"),
    pytest.param(3, "concat", marks=pytest.mark.slow), pytest.param(1, "bos_bestfit", marks=pytest.mark.slow)])
def test_an_idle_loader_gives_its_processes_back_and_goes_on_exactly(synth, packing, num_workers):
    want_w, want_s = reference(synth, packing, 36)
    with synth.loader(B, T, packing=packing, num_workers=num_workers, idle_release_s=0.3,
                      **OPTS[packing]) as loader:
        it = iter(loader)
        got = take(it, 6, loader, hold=True)
        for cycle in range(2):            # away twice: each time every child exits
            pids = children(loader)
            assert wait_gone(pids, 10.0) == [], f"cycle {cycle}: children still alive after 10 s idle"
            held = got[-1]                 # the caller still holds lent batches of the old ring
            assert np.array_equal(tokens(*held[1]), held[0]), "a lent batch changed after the release"
            assert loader.state_dict() == held[2], "the state moved while the loader was away"
            got += take(it, 15, loader, hold=True)  # new children, the same stream
            assert not set(children(loader)) & set(pids)
        assert loader.stats()["idle_releases"] == 2
    assert all(np.array_equal(w, x) for (w, _, _), x in zip(got, want_w)), "stream != uninterrupted run"
    assert [s for _, _, s in got] == want_s, "states != uninterrupted run"


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_state_taken_after_a_release_resumes_exactly(synth, packing):
    want_w, _ = reference(synth, packing, 30)
    with synth.loader(B, T, packing=packing, idle_release_s=0.3, **OPTS[packing]) as loader:
        it = iter(loader)
        take(it, 5, loader)
        assert wait_gone(children(loader), 10.0) == []
        state = take(it, 7, loader)[-1][2]
    with synth.loader(B, T, packing=packing, num_workers=3, resume_state=state, **OPTS[packing]) as loader:
        rest = take(iter(loader), 18, loader)
    assert all(np.array_equal(w, x) for (w, _, _), x in zip(rest, want_w[12:]))


def test_a_trainer_with_slow_steps_is_not_released(synth):
    """Gaps between batches longer than idle_release_s are the trainer's pace, not its absence:
    a release waits for 10 times the longest gap seen."""
    with synth.loader(B, T, idle_release_s=0.2) as loader:
        it = iter(loader)
        next(it)
        pids = children(loader)
        for _ in range(6):
            time.sleep(0.35)
            next(it)
        assert all(pid_alive(p) for p in pids) and children(loader) == pids
        assert loader.stats()["idle_releases"] == 0


def test_idle_release_zero_never_releases(synth):
    with synth.loader(B, T, idle_release_s=0) as loader:
        it = iter(loader)
        next(it)
        pids = children(loader)
        time.sleep(1.5)
        assert all(pid_alive(p) for p in pids)
        next(it)
        assert children(loader) == pids and loader.stats()["idle_releases"] == 0


@pytest.mark.slow  # the coordinator times the frees it sees at its turns: a gap it sees merged is lost
@pytest.mark.parametrize("head_start", [True, False])
def test_a_reader_in_bursts_that_keeps_its_last_batch_is_not_released(synth, head_start):
    """Issue 49, item 5: a val loader read in bursts of 3 with 0.45 s pauses, keeping its last
    batch (`x, y = next(it)`), `idle_release_s=0.15`: it has given back 1 batch in its first
    pause, and its pause is a gap of 0.45 s at its next burst, 10 of which it never stays away.
    With the head start it was released in 28 of 30 pauses, restarting its processes each time
    (its batches but the last counted as given back at once, with no gap; procs/idle.py)."""
    with synth.loader(B, T, split="val", idle_release_s=0.15, head_start=head_start) as loader:
        it = iter(loader)
        for _ in range(8):
            for _ in range(3):
                x, y = next(it)
            time.sleep(0.45)
        assert loader.stats()["idle_releases"] == 0
        assert loader.stats()["head_batches"] >= (3 if head_start else 0)
