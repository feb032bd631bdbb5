"""Who is stalled while the trainer waits (procs/children.py `_Progress`), on a ring in memory:
a worker holding a piece whose beat stands still for the limit; not one that beats, nor an
idle one; the coordinator when no worker holds a piece and it announces and counts nothing;
every stand-still counted from its last sign of progress."""
from shmloader.ipc import ring as ringmod
from shmloader.ipc.ring import Counter, RingLayout, Stat, WorkerCol
from shmloader.procs.children import _Progress


def ring(n_workers=3):
    lay = RingLayout(2, 4, n_workers)
    r = ringmod.Ring(bytearray(lay.nbytes), lay, "x")
    r.workers[:, WorkerCol.PIECE] = -1
    return r


def test_a_worker_holding_a_piece_without_a_beat_is_stalled_at_the_limit():
    r = ring()
    r.workers[1, WorkerCol.PIECE] = 7
    r.workers[2, WorkerCol.PIECE] = 8
    watch = _Progress(r, now=0.0)
    for t in (1.0, 2.0, 3.0):
        r.workers[2, WorkerCol.BEAT] += 1          # worker 2 makes progress
        assert watch.stalled(t, limit=5.0) is None
    assert watch.stalled(4.9, limit=5.0) is None
    assert watch.stalled(5.0, limit=5.0) == ([1], 5.0)
    r.workers[1, WorkerCol.BEAT] += 1              # a beat resets a clock
    r.workers[2, WorkerCol.BEAT] += 1
    assert watch.stalled(9.0, limit=5.0) is None
    assert watch.stalled(13.9, limit=5.0) is None
    assert watch.stalled(14.0, limit=5.0) == ([1, 2], 5.0)

def test_an_idle_worker_is_not_stalled_but_a_silent_coordinator_is():
    r = ring()
    watch = _Progress(r, now=0.0)
    assert watch.stalled(3.0, limit=5.0) is None
    r.counters[Counter.ANNOUNCED] += 1             # the coordinator announced a batch
    assert watch.stalled(4.0, limit=5.0) is None
    assert watch.stalled(8.9, limit=5.0) is None
    assert watch.stalled(9.0, limit=5.0) == ([], 5.0)
    r.stats[Stat.PIECES] += 1                      # it counted a piece
    assert watch.stalled(10.0, limit=5.0) is None


def test_the_coordinator_is_not_blamed_while_a_worker_holds_a_piece():
    r = ring(1)
    r.workers[0, WorkerCol.PIECE] = 3
    watch = _Progress(r, now=0.0)
    for t in range(1, 20):
        r.workers[0, WorkerCol.BEAT] += 1
        assert watch.stalled(float(t), limit=5.0) is None
    r.workers[0, WorkerCol.PIECE] = -1             # done: now the coordinator owes the batch
    assert watch.stalled(23.0, limit=5.0) is None
    assert watch.stalled(24.0, limit=5.0) == ([], 5.0)
