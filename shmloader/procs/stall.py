"""Who is stalled while the trainer waits for a batch (training process; procs/children.py
watches with it). A child that makes no progress for `stall_s` seconds while `next()` waits is
killed and healed (procs/heal.py).

Progress is a beat in the ring's header: each worker bumps its row's `WorkerCol.BEAT` at every
piece, between runs of documents and once a second while idle (not while one long document is
inside an engine call: an engine stuck on it is a stall); the coordinator bumps `Stat.BEAT` at
every turn of its loop, at least once a second. A started worker whose beat stands still for
the limit is stalled, idle too (a stopped idle worker never begins the task sent to it); one
that has not beaten yet (beat 0, still starting; a dead worker's replacement is given 0 when
it is started: children.py `replace_worker`) is not blamed. The trainer looks every
`look_s` (at most a second, and at most `stall_s`); a gap between two looks longer than
`look_s` plus `PAUSE_SLACK_S` is the trainer's own pause (Ctrl-Z of the whole process group, a
debugger, a suspended VM), which stopped the children too: every clock starts again. Pure over
a ring's views: no processes.
"""
from typing import NamedTuple

from ..ipc import ring as ringmod
from ..ipc.ring import WorkerCol


BEAT_S = 1.0  # an idle child beats at least this often


def beat_every(cfg) -> float:
    """How often an idle child (a worker without a task, the coordinator's loop) beats: once a
    second, and 4 times per `stall_s` when that is shorter, so that an idle child never looks
    stalled."""
    return min(BEAT_S, cfg.stall_s / 4) if cfg.stall_s else BEAT_S


class Stall(NamedTuple):
    """Who stood still, and for how long: `workers` (their indices), or [] for the coordinator."""
    workers: list
    seconds: float


class Watch:
    """Who has stood still since when, made when the trainer starts to wait and asked at each
    look (`stalled`)."""

    PAUSE_SLACK_S = 0.5  # a look this much later than due: the trainer itself was stopped

    def __init__(self, ring: ringmod.Ring, now: float, look_s: float = 1.0):
        self.ring, self.looked, self.look_s = ring, now, look_s
        self.beats = [(int(b), now) for b in ring.workers[:, WorkerCol.BEAT]]
        self.coordinator = (int(ring.stats[ringmod.Stat.BEAT]), now)

    def stalled(self, now: float, limit: float) -> "Stall | None":
        """The workers stalled `limit` s or more, else the coordinator if it is, else None."""
        if now - self.looked > self.look_s + self.PAUSE_SLACK_S:
            self.__init__(self.ring, now, self.look_s)
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
