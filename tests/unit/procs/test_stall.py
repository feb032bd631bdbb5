"""Who is stalled while the trainer waits (procs/stall.py `Watch`), on a ring in memory:
a started worker whose beat stands still for the limit, holding a piece or idle (a stopped
idle worker never begins the task sent to it); not one that beats, nor one that has not
started (beat 0); the coordinator when its own beat stands still; every stand-still counted from its last sign of
progress; and a pause of the trainer itself (a gap between two looks) blames nobody."""
from shmloader.ipc import ring as ringmod
from shmloader.ipc.ring import RingLayout, Stat, WorkerCol
from shmloader.procs.stall import Watch


def ring(n_workers=3):
    lay = RingLayout(2, 4, n_workers)
    r = ringmod.Ring(bytearray(lay.nbytes), lay, "x")
    r.initialise()
    return r


def look(watch, r, t0, t1, coordinator_beats=True):
    """Look every half second from t0 to t1 (the coordinator beating meanwhile unless told not
    to); the first non-None answer with its time, or None."""
    t = t0
    while t <= t1 + 1e-9:
        if coordinator_beats:
            r.stats[Stat.BEAT] += 1
        got = watch.stalled(t, limit=5.0)
        if got is not None:
            return t, got
        t += 0.5
    return None


def test_a_new_ring_has_no_worker_on_a_piece():
    r = ring()
    assert (r.workers[:, WorkerCol.PIECE] == -1).all()
    watch = Watch(r, now=0.0)
    assert look(watch, r, 0.5, 20.0) is None


def test_a_started_worker_without_a_beat_is_stalled_at_the_limit():
    r = ring()
    r.workers[1, WorkerCol.PIECE] = 7
    r.workers[1:, WorkerCol.BEAT] = 1              # workers 1 and 2 have started; 0 has not
    watch = Watch(r, now=0.0)
    for t in (1.0, 2.0, 3.0):
        r.workers[2, WorkerCol.BEAT] += 1          # worker 2 makes progress
        r.stats[Stat.BEAT] += 1
        assert watch.stalled(t, limit=5.0) is None
    assert look(watch, r, 3.5, 4.5) is None
    assert look(watch, r, 5.0, 5.0) == (5.0, ([1], 5.0))
    r.workers[1, WorkerCol.BEAT] += 1              # a beat resets a clock
    r.workers[2, WorkerCol.BEAT] += 1
    assert look(watch, r, 5.5, 10.0) is None
    assert look(watch, r, 10.5, 10.5) == (10.5, ([1, 2], 5.0))


def test_a_coordinator_whose_beat_stands_still_is_stalled():
    r = ring()
    watch = Watch(r, now=0.0)
    assert look(watch, r, 0.5, 10.0) is None       # beating: fine, however long
    assert look(watch, r, 10.5, 30.0, coordinator_beats=False) == (15.0, ([], 5.0))  # its last beat: t=10


def test_a_pause_of_the_trainer_blames_nobody():
    r = ring()
    r.workers[0, WorkerCol.PIECE], r.workers[0, WorkerCol.BEAT] = 1, 1
    watch = Watch(r, now=0.0)
    assert watch.stalled(1.0, limit=5.0) is None
    assert watch.stalled(60.0, limit=5.0) is None  # 59 s between two looks: the trainer was stopped
    assert look(watch, r, 60.5, 64.5) is None      # clocks start again at the resume
    assert look(watch, r, 65.0, 65.0) == (65.0, ([0], 5.0))


def test_a_pause_of_the_whole_process_group_is_not_a_stall():
    """stall_s = 1, looks every second: a Ctrl-Z of the whole group for 2 s (shorter than the
    old fixed 3 s rule) stops the children and the trainer alike; the late look restarts every
    clock, and no child is blamed."""
    r = ring()
    watch = Watch(r, now=0.0, look_s=1.0)
    r.workers[:, WorkerCol.BEAT] = 1
    r.stats[Stat.BEAT] += 1
    assert watch.stalled(1.0, limit=1.0) is None      # the first look sees every beat
    r.stats[Stat.BEAT] += 1
    assert watch.stalled(3.0, limit=1.0) is None      # 2 s late (the group was stopped): nobody
    r.stats[Stat.BEAT] += 1
    r.workers[:, WorkerCol.BEAT] += 1
    assert watch.stalled(4.0, limit=1.0) is None      # they beat again once resumed
    r.stats[Stat.BEAT] += 1
    assert watch.stalled(5.0, limit=1.0) == ([0, 1, 2], 1.0)  # a real stand-still still is one
