"""The training process's hold on its children: watch them, take each batch, stop them.

Runs in the training process only. `start_children` creates the ring (after sweeping
segments of dead runs) and starts the coordinator and workers (start.py). `Children` is
what the trainer holds of them: `next_batch` takes the next announced batch from the ring's
header (NOTE [slot handover]) or waits for it, with a timeout, on the coordinator's doorbell,
its pipe and every child's sentinel; a death or a reported error is raised naming the
process, its pid, its signal or traceback, and the piece it was on. `Children.shutdown`
unlinks the ring's name, closes the alive pipe (every child exits on its EOF), unmaps the
ring, and joins with a 2 s deadline and kills what is left, there or (`wait=False`, a dropped
loader) in the reaper's thread (reaper.py). Each of the trainer's pipe ends and doorbells is
closed there once, by its `close()`, never by the collector (procs/lifecycle.py "Drop").
A count-only run to its answer is locate.py's.
"""
import functools
import logging
import multiprocessing.process
import os
import signal
import time
from dataclasses import dataclass, field, replace
from multiprocessing import reduction
from multiprocessing.connection import wait

from .. import errors
from ..data import formats
from ..ipc import ring as ringmod
from ..ipc import segment as segmod
from ..ipc.handover import Announcement, Doorbell, TrainerEnd
from ..ipc.protocol import Ended, Error, Listener, Opened, Released, Replace, Warn
from ..ipc.ring import WorkerCol
from ..ipc.signals import pid_alive
from . import precedence
from .heal import Held
from .reaper import REAPER, Dropped, close_each, finish
from .stall import Stall, Watch
from .start import booting, respawn_worker, spawn

class ChildLost(errors.WorkerError):
    """A child died, or made no progress for `stall_s` s while the trainer waited and was
    killed here (`stalled_s`); `held`: `Held` of what the worker was on, or None; `worker`: its
    index when it was a worker and the coordinator lives (it can be replaced alone), else None.
    The loader heals it (procs/run.py) or raises it as a `WorkerError`."""

    def __init__(self, text: str, pid: int, held=None, stalled_s: float | None = None, worker: int | None = None):
        super().__init__(text)
        self.pid, self.held, self.stalled_s, self.worker = pid, held, stalled_s, worker


class ChildrenReleased(Exception):
    """The coordinator and workers exited after an idle release (`Released`): the loader
    starts new ones from its state (NOTE [ring protocol] 7)."""


SHUTDOWN_S = 2.0
ERROR_GRACE_S = 1.0
DEATHS_S = 0.01  # what a death waits for others at the same moment (and, killed, an error it caused)
MESSAGE_WAIT_S = 1.0
LIVENESS_CHECK_S = 0.5


@dataclass(eq=False)  # hashed by identity (procs/precedence.py keeps weak sets of runs)
class Children:
    segment: segmod.Segment
    ring: ringmod.Ring
    conn: object = None
    alive_w: object = None
    alive_r: object = None      # kept for a worker that replaces a dead one
    config: object = None       # the run's LoaderConfig and RunArgs (a replaced worker gets them)
    args: object = None
    coordinator: object = None
    workers: list = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    files: list = field(default_factory=list)
    next_check: float = 0.0
    stall_s: float = 0.0        # a child making no progress this long while next() waits is killed (0: never)
    ready: Doorbell = None      # the slot handover's doorbells (ipc/handover.py)
    kick: Doorbell = None
    handover: TrainerEnd = None
    opened: list = field(default_factory=list)  # `Opened` messages not yet taken by the loader
    ended: str | None = None    # the stream has ended (`Ended`): why, raised once no batch is left
    failed: Error | None = None  # an error a child reported: raised at once, and again at every next() after
    untaken: object = None      # the first batch's announcement, taken from the ring by a next() that a
    #                             Ctrl-C ended before it returned it: the next next() returns it
    start: object = None        # start.py `Start`: the children from their making to their start (later, by a
    #                             thread, while the forkserver boots), or their drop if the run stops first
    _watch: Listener = None     # every child's sentinel
    _blocked: Listener = None   # what a trainer waiting for a batch waits on

    @property
    def starting(self) -> bool:
        """Some child is not started yet, or a start by a thread has not been waited for
        (`wait_started`): the start's `Phase` (start.py) is MADE, LATER or RAN."""
        return self.start is not None and self.start.pending

    @property
    def made_only(self) -> bool:
        """The children are made and not started yet (MADE or LATER)."""
        return self.start is not None and self.start.waiting

    def note_started(self):
        self.started_at = time.monotonic()

    def wait_started(self, timeout: float):
        """Return once the children are started (start.py `Start.wait`)."""
        if self.start is not None:
            self.start.wait(timeout)

    @property
    def procs(self) -> list:
        return [p for p in (self.coordinator, *self.workers) if p is not None]

    @property
    def sentinels(self) -> list:
        return [p.sentinel for p in self.procs]

    def next_batch(self, delivery, timeout: float) -> Announcement:
        """The next batch's announcement. A ready one is taken from the ring's header without a
        system call (NOTE [slot handover]); otherwise, once the copies in flight are done, the
        trainer blocks on the coordinator's doorbell, its pipe and every child's sentinel, for
        at most `timeout` s (then `LoaderTimeout`), and its `waited` says for how long.
        `delivery` gives back the slots the caller let go of first. The run's first batch, or
        an error before it, ends the other loaders' giving way (precedence.py)."""
        got, self.untaken = self.untaken, None
        if got is not None:  # taken by a call a Ctrl-C ended: this one returns it
            return got
        try:
            got = self._next_batch(delivery, timeout)
        finally:  # a Ctrl-C between the take and this still ends the start
            if got is None:
                precedence.PRECEDENCE.failed(self)  # a first batch that did not come: nobody waits for it
            elif got.batch == 0:
                try:
                    precedence.PRECEDENCE.started(self)
                except BaseException:  # a Ctrl-C in there: the batch is taken from the ring, and kept
                    self.untaken = got
                    raise
        return got

    def _next_batch(self, delivery, timeout: float) -> Announcement:
        if self.failed is not None:  # not a batch the ring still holds, nor the reporter's exit taken for a death
            _raise_reported(self.failed)
        delivery.reclaim()
        now = time.monotonic()
        if now >= self.next_check:  # a poll per batch is measurable; twice a second is enough
            self.next_check = now + LIVENESS_CHECK_S
            self.check_alive()
        handover = self.handover
        got = handover.take() if handover.pending_messages() <= 0 else self._take()
        if got is not None:
            return got
        handover.waiting(True)  # the coordinator never releases the children while the trainer waits
        from .. import profiling  # the trainer's (torch): here, never in a worker's imports; a blocked path
        try:
            with profiling.named(profiling.WAIT):  # a range of its own in a torch.profiler trace
                return self._wait_for_batch(delivery, timeout)
        finally:
            handover.waiting(False)

    def _wait_for_batch(self, delivery, timeout: float) -> Announcement:
        started = time.monotonic()
        deadline = started + timeout
        delivery.reclaim(wait=True)  # before blocking: copies in flight hold slots
        look_s = min(1.0, self.stall_s or 1.0)
        watch = Watch(self.ring, time.monotonic(), look_s)
        while True:
            delivery.reclaim()  # batches let go of in another thread meanwhile
            self.handover.before_blocking()
            got = self._take()
            if got is not None:
                return got._replace(waited=time.monotonic() - started)
            self._wait(min(look_s, max(deadline - time.monotonic(), 0)))
            if self.stall_s:
                stall = watch.stalled(time.monotonic(), self.stall_s)
                if stall is not None:
                    self.kill_stalled(stall)
            if time.monotonic() >= deadline:
                raise errors.LoaderTimeout(
                    f"no batch within {timeout:.0f} s although every loader process is alive; "
                    f"{self.describe_all()}; raise timeout= if row groups are huge")

    def _take(self) -> "Announcement | None":
        """The next batch's announcement if it is made, else None; first the messages the
        coordinator queued before it (a warning is warned, an error raised)."""
        while self.handover.pending_messages() > 0:
            if not self.conn.poll(MESSAGE_WAIT_S):  # queued a moment ago; or the sender died
                self.check_alive()
                break
            self.read_message()
        got = self.handover.take()
        if got is None and self.ended is not None:  # every batch of an ended stream was taken
            raise errors.DataError(self.ended)
        return got

    def read_message(self):
        """Read one message from the coordinator's pipe: warn a warning, raise an error."""
        self.handover.messages_read += 1
        self.read(())

    def read(self, kinds=()):
        """The coordinator's next message of one of `kinds`; None after a warning (it is
        warned); an error it reports is raised."""
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            sentinels = self.sentinels  # none once a close() in another thread has joined them
            self.raise_death(wait(sentinels, timeout=ERROR_GRACE_S) if sentinels else [])
            raise errors.WorkerError("the coordinator closed its pipe without an error") from None
        if isinstance(msg, kinds):
            return msg
        if self._kept(msg):
            return None
        if isinstance(msg, Released):
            raise ChildrenReleased(msg.idle_s)
        self.failed = msg
        _raise_reported(msg)

    def _kept(self, msg) -> bool:
        """Take in a message that is neither an error nor a release: a warning is warned, a
        file's identity and the stream's end kept. False for any other."""
        if isinstance(msg, Warn):
            if msg.info:
                logging.getLogger("shmloader").info("%s", msg.text)
            else:
                errors.warn(f"shmloader: {msg.text}")
            return True
        if isinstance(msg, Opened):
            self.opened.append(msg)  # the loader takes them into its states (ShmLoader._learn)
            return True
        if isinstance(msg, Ended):
            self.ended = msg.text
            return True
        return False

    def ready_batches(self) -> int:
        """Batches announced and not yet taken by `next()`."""
        return self.handover.announced() - self.handover.taken

    def _wait(self, timeout: float):
        """Block until the coordinator rings, writes to its pipe, or a child exits, or for
        `timeout` s; reads a message, raises a death. The caller clears the doorbell first
        (`TrainerEnd.before_blocking`) and calls `_take()` between that and this wait."""
        if self._blocked is None:
            self._blocked = Listener([self.conn, self.ready, *self.sentinels])
        ready = self._blocked.wait(timeout)
        if self.conn in ready:
            self.read_message()
        elif any(r is not self.ready for r in ready):
            self.check_alive()

    def check_alive(self):
        """Raise if a child has exited: one poll over the sentinels, no selector built."""
        if self._watch is None:
            self._watch = Listener(self.sentinels)
        dead = self._watch.wait(0)
        if dead:
            self.raise_death(dead)

    def raise_death(self, dead):
        """Raise the best account of a death: an error a process reported before exiting
        (it may wait behind queued batches), else the process killed by a signal or failing,
        workers before the coordinator (which exits cleanly when a worker's pipe breaks)."""
        time.sleep(DEATHS_S)  # let deaths that happen together all show
        gone = self._gone(dead)
        for p in gone:
            p.join(timeout=0.05)
        self._raise_if_forkserver_died(gone)
        # a process that raised reports its error and then exits; one killed by a signal cannot
        killed = gone and all(p.exitcode is not None and p.exitcode < 0 for p in gone)
        msg = self._pending_error(DEATHS_S if killed else ERROR_GRACE_S)
        if isinstance(msg, Released):  # not a death: an idle release
            raise ChildrenReleased(msg.idle_s)
        if msg is not None:
            self.failed = msg
            _raise_reported(msg)
        if gone and all(p.exitcode == 0 for p in gone):
            gone = self._gone(self._cause_of_clean_exits(gone))
        for p in gone:
            p.join(timeout=ERROR_GRACE_S)
        if gone:
            worst = min(gone, key=lambda p: (p.exitcode == 0, p is self.coordinator, p.exitcode is None))
            alone = worst in self.workers and self.coordinator not in gone and self.coordinator.exitcode is None
            raise ChildLost(f"{self._describe(worst)} died: {_exit_text(worst.exitcode)}", worst.pid,
                            self._held(worst), worker=self.workers.index(worst) if alone else None)

    def _gone(self, dead) -> list:
        return [p for p in self.procs if p.sentinel in dead or p.exitcode is not None]

    def _cause_of_clean_exits(self, gone: list) -> list:
        """The sentinels of the processes that died after waiting up to ERROR_GRACE_S for one of
        the living: a child exits cleanly only because another died (a worker when the
        coordinator's pipe breaks, the coordinator when a worker's does), and a killed process's
        exit can show after the clean exit it caused (the forkserver reports it; on a loaded
        machine, late)."""
        living = [p.sentinel for p in self.procs if p not in gone]
        return wait(living, timeout=ERROR_GRACE_S) if living else []

    def _raise_if_forkserver_died(self, gone: list):
        """A child started by the forkserver whose sentinel closed while it lives: the server died
        (its children are watched through it). They are killed, and the loss named as the
        server's (a restart starts a new server)."""
        orphans = [p for p in gone if p.exitcode == 255 and pid_alive(p.pid)]
        if not orphans:
            return
        for p in self.procs:
            if pid_alive(p.pid):
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        raise ChildLost(f"the forkserver that started this loader's processes died (they were alive, "
                        f"pids {', '.join(str(p.pid) for p in orphans)}, but could no longer be watched, and "
                        f"were stopped)", orphans[0].pid)

    def kill_stalled(self, stall: Stall):
        """Kill the stalled children and raise `ChildLost` naming the first, what it held and
        how long it stood still."""
        procs = [self.workers[i] for i in stall.workers] if stall.workers else [self.coordinator]
        stalled_s = stall.seconds
        text = (f"{self._describe(procs[0])} made no progress for {stalled_s:.1f} s while the trainer waited "
                f"for a batch (stall_s={self.stall_s:g}); killed")
        held = self._held(procs[0])
        for p in procs:
            try:
                p.kill()
            except (OSError, ValueError):
                pass
        raise ChildLost(text, procs[0].pid, held, stalled_s, worker=stall.workers[0] if stall.workers else None)

    def blame(self, lost: ChildLost) -> ChildLost:
        """`lost`, or the coordinator's loss when a worker's was seen and the coordinator is gone
        too (its workers exit on its pipe's end, and on a loaded machine one's exit can show before
        the coordinator's): nothing the worker held is then suspect (procs/heal.py's poison rule),
        and only a start of every process heals it."""
        if lost.worker is None or self.coordinator.is_alive():
            return lost
        return ChildLost(f"{lost}, and the coordinator (pid {self.coordinator.pid}) is gone: "
                         f"{_exit_text(self.coordinator.exitcode)}", self.coordinator.pid)

    def replace_worker(self, i: int, poisoned: tuple, suspects: tuple) -> bool:
        """Worker `i` died: start a new one at its index and pass its pipe's end to the
        coordinator (`Replace`), which gives it again what the old one held (coordinator.py);
        the other processes and the ring go on. `poisoned`, `suspects`: procs/heal.py's spans.
        False: the coordinator is gone too (its workers exit on its pipe's end, and one of them
        may be seen dead first), so only a start of every process heals it."""
        old = self.workers[i]
        old.join(timeout=ERROR_GRACE_S)
        if old.exitcode is None:
            old.kill()
            old.join(timeout=ERROR_GRACE_S)
        if old.exitcode is not None:
            old.close()
        # its row shows the dead one's last beat: 0 until the new one beats, since a worker that
        # has not started is never blamed for standing still (stall.py; on a loaded machine a
        # replacement takes seconds to start, and the trainer waits for what it is given again)
        self.ring.workers[i, WorkerCol.BEAT] = 0
        self.args = replace(self.args, poisoned=poisoned, suspects=suspects)
        end = respawn_worker(self, self.config, self.args, i)
        self._watch = self._blocked = None  # the sentinels changed
        try:
            self.conn.send(Replace(i, poisoned, suspects))
            reduction.send_handle(self.conn, end.fileno(), self.coordinator.pid)
        except (BrokenPipeError, ConnectionResetError):
            return False
        finally:
            end.close()
        return True

    def _held(self, p) -> "Held | None":
        """The piece worker `p` is on, or None."""
        if p is self.coordinator or p not in self.workers:
            return None
        row = self.ring.workers[self.workers.index(p)]
        piece, f, rg, doc = (int(v) for v in row[WorkerCol.PIECE:WorkerCol.DOC + 1])
        if piece < 0:
            return None
        return Held(self.files[f], rg, doc, int(row[WorkerCol.END]), int(row[WorkerCol.EPOCH]), f,
                    int(row[WorkerCol.RUN]), int(row[WorkerCol.RUN_END]))

    def _pending_error(self, grace: float):
        deadline = time.monotonic() + grace
        while True:
            try:
                if not self.conn.poll(max(deadline - time.monotonic(), 0)):
                    return None
                msg = self.conn.recv()
            except (EOFError, OSError):
                return None
            self.handover.messages_read += 1  # counted as read: a worker's replacement goes on with this pipe
            if isinstance(msg, (Error, Released)):
                return msg
            self._kept(msg)  # not dropped: an `Opened` read here still reaches the loader's states

    def _describe(self, p) -> str:
        if p is self.coordinator:
            return f"the coordinator (pid {p.pid}){_stopped_text(p.pid)}"
        i = self.workers.index(p)
        return f"worker {i} (pid {p.pid}){_stopped_text(p.pid)}{self._piece_text(i)}"

    def _piece_text(self, i: int) -> str:
        piece, f, rg, doc = (int(v) for v in self.ring.workers[i, WorkerCol.PIECE:WorkerCol.DOC + 1])
        if piece < 0:
            return " while idle"
        end = int(self.ring.workers[i, WorkerCol.END])
        return f" while reading {self.files[f]}, {formats.docs_of_unit(self.files[f], rg, doc, end - 1)}"

    def describe_all(self) -> str:
        """Every child, what it is doing, and whether it is stopped (SIGSTOP, a debugger)."""
        return "; ".join(self._describe(p) for p in self.procs)

    def shutdown(self, wait: bool = True):
        """Unlink the segment's name first (a coordinator that finds it gone knows the loader
        was closed, and one that finds it there that the trainer died: `ring.unlink_orphan`),
        then let the children go and unmap the ring; join them (kill what is left) and close
        their pipes here, or, `wait=False`, in the reaper's thread (reaper.py)."""
        precedence.PRECEDENCE.stopped(self)
        self.segment.unlink()
        if self.start is not None:
            self.start.drop(SHUTDOWN_S)  # a start under way ends first
        if self.alive_w is not None:
            self.alive_w.close()
        started = [p for p in self.procs if p.pid is not None]
        pipes = [c for c in (self.conn, self.ready, self.kick, self.alive_r) if c is not None]
        dropped = Dropped(started, time.monotonic() + SHUTDOWN_S, functools.partial(close_each, pipes))
        if wait:  # as before the reaper: a next() in another thread sees the children exit, then the unmap
            finish(dropped)
            for p in started:
                if p.exitcode is not None:
                    p.close()
            self._release_memory()
        else:
            self._release_memory()
            REAPER.reap(dropped)
        self.coordinator, self.workers = None, []

    def forget(self):
        """In a process forked from the trainer: let go of the trainer's children and ring
        without touching them. multiprocessing's exit handler would terminate the processes it
        believes its own (the trainer's workers), and this process's copies of the alive pipe's
        write end and of the ring's lock would keep the children and the next sweep from seeing
        the trainer die; the mapping stays for the lent batches this copy of the caller holds."""
        for p in self.procs:
            multiprocessing.process._children.discard(p)  # noqa: SLF001 (the set its exit handler reads)
        close_each(c for c in (self.alive_w, self.alive_r, self.conn, self.ready, self.kick) if c is not None)
        self.alive_w = self.alive_r = self.conn = self.ready = self.kick = None
        if self.start is not None:
            self.start.forget()  # its thread is the parent's
        self.segment.forget()
        self.coordinator, self.workers = None, []

    def _release_memory(self):
        mapping = self.ring.buf
        if self.handover is not None:
            self.handover.release()
        self.ring.release_views()
        try:
            mapping.close()
        except BufferError:
            pass  # the caller still holds lent batches: unmapped when the last one is freed


def _stopped_text(pid: int) -> str:
    """" (stopped)" when the process is stopped (its state in /proc is T or t), else ""."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return " (stopped: SIGSTOP or a debugger holds it)" if state in ("T", "t") else ""


def _exit_text(code) -> str:
    if code is None:
        return "it did not exit"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def _raise_reported(msg: Error):
    if msg.kind == "data":
        raise errors.DataError(msg.head)
    raise errors.WorkerError(f"{msg.head}\n--- traceback in that process ---\n{msg.trace}")


def start_children(config, layout: ringmod.RingLayout, cargs, first=None) -> Children:
    """Start a run's coordinator and workers over a new ring (for a run that only finds a
    position, `cargs.start.locate` is set: see locate.py); `first()`, if given, runs once the
    other loaders give way and before the children start (the head start's first batch). When
    it made one and the process's forkserver is still booting, the children are made and
    started by a thread once it has booted (`kids.start`, start.py `Start.later`): the
    caller waits for them with `wait_started` before it waits for a batch."""
    segmod.sweep_stale()
    segment, ring = segmod.create(layout)
    kids = Children(segment, ring)
    kids.files, kids.config, kids.args = cargs.files, config, replace(cargs, ring_name=segment.name)
    kids.stall_s = float(config.stall_s) if config.max_restarts else 0.0  # 0 heals: a stall is a timeout
    try:
        if cargs.start.locate is None:  # the trainer's other loaders give way until its first batch
            precedence.PRECEDENCE.starting(kids)
        made = first() if first is not None else False
        later = made and booting(config.start_method)
        spawn(kids, config, kids.args, now=not later)
        if later:
            kids.start.later()
    except BaseException:
        kids.shutdown()
        raise
    return kids
