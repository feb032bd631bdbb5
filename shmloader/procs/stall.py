"""Who is stalled while the trainer waits for a batch (training process; procs/children.py
watches with it). A child that makes no progress for `stall_s` seconds while `next()` waits is
killed and healed (procs/heal.py).

Progress is a beat in the ring's header: each worker bumps its row's `WorkerCol.BEAT` at every
piece, between runs of documents and once a second while idle (not while one long document is
inside an engine call: an engine stuck on it is a stall); the coordinator bumps `Stat.BEAT` at
every turn of its loop, at least once a second. A started worker whose beat stands still for
the limit is stalled, idle too (a stopped idle worker never begins the task sent to it); one
that has not beaten yet (beat 0, still starting) is not blamed; a gap of more than `PAUSE_S`
between two looks is the trainer's own pause (Ctrl-Z, a debugger, a suspended VM), and every
clock starts again. Pure over a ring's views: no processes.
"""
from typing import NamedTuple

from ..ipc import ring as ringmod
from ..ipc.ring import WorkerCol


class Stall(NamedTuple):
    """Who stood still, and for how long: `workers` (their indices), or [] for the coordinator."""
    workers: list
    seconds: float


class Watch:
    """Who has stood still since when, made when the trainer starts to wait and asked at each
    look (`stalled`)."""

    PAUSE_S = 3.0  # the trainer looks at least once a second while it waits

    def __init__(self, ring: ringmod.Ring, now: float):
        self.ring, self.looked = ring, now
        self.beats = [(int(b), now) for b in ring.workers[:, WorkerCol.BEAT]]
        self.coordinator = (int(ring.stats[ringmod.Stat.BEAT]), now)

    def stalled(self, now: float, limit: float) -> "Stall | None":
        """The workers stalled `limit` s or more, else the coordinator if it is, else None."""
        if now - self.looked > self.PAUSE_S:
            self.__init__(self.ring, now)
            return None
        self.looked = now
        rows, stuck, longest = self.ring.workers, [], 0.0
        for i, (beat, since) in enumerate(self.beats):
            now_beat = int(rows[i, WorkerCol.BEAT])
            if now_beat != beat or now_beat == 0:  # 0: not started yet (a timeout covers that)
                self.beats[i] = (now_beat, now)
            elif now - since >= limit:
                stuck.append(i)
                longest = max(longest, now - since)
        if stuck:
            return Stall(stuck, longest)
        beat, since = self.coordinator
        if int(self.ring.stats[ringmod.Stat.BEAT]) != beat:
            self.coordinator = (int(self.ring.stats[ringmod.Stat.BEAT]), now)
        elif now - since >= limit:
            return Stall([], now - since)
        return None
