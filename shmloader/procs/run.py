"""The training process's runs of its children: one start, its delivery, and the next one.

A *run* (`Run`) is one start of the coordinator and the workers over a new ring
(children.py), with the delivery that turns the ring's slots into the caller's batches (the
loader's `deliver`: delivery.py). `Runs` keeps one going for a loader:

- a run starts when a batch is first asked for (a loader never read starts nothing), from
  the `RunArgs` the loader began it with (`begin`: a fresh start, or where a resume plan
  says);
- `take(mark, timeout)` returns the next batch's `Announcement`, best fit's buffer text copied
  out of its slot; `deliver(ann, shape)` makes it the caller's tensors and gives the progress
  after it (`Mark`), which the loader keeps for the batch it returns; a concat run's first
  batches are made by the trainer while its children start (its `HeadStart`,
  procs/headstart.py: slot `HEAD_SLOT`, delivered from its own row), and the ring's copies of
  them are compared and freed when they come;
- when the children are gone, the next run starts from `mark`, the progress after the last
  batch returned, exactly as a resume would (in this run's numbering of the files, nothing
  checked again), so the stream and its states go on byte for byte: after an idle release
  (`ChildrenReleased`, NOTE [ring protocol] 7) and after a death or stall (`ChildLost`) that
  heal.py allows (the budget, the poison rule); one it does not allow is raised.

Each restart is logged and counted (`heals`, `idle_releases`). Lent batches keep the old
ring's mapping; on CUDA the delivery's `close()` waits for copies in flight before the ring
goes. A restart asks that /dev/shm hold a second ring while the caller holds a batch of the
first.
"""
import contextlib
import dataclasses
import json
import logging
import threading
import time
from typing import NamedTuple

from ..data import formats
from ..data.engine import name as engine_name
from ..errors import LoaderClosed, WorkerError, warn
from ..ipc.handover import Announcement
from ..ipc.ring import STATS_FIELDS, Counter, RingLayout, WorkerCol
from ..ipc.signals import sigint_blocked
from ..packing.mixbestfit import buffer_entries
from ..packing.runs import BufferText
from ..position import Position, RowGroup
from . import heal, precedence
from .headstart import HeadStart, begin
from .children import ChildLost, ChildrenReleased, Children, start_children
from .start import booting


HEAD_SLOT = -1  # the slot of a batch the trainer made itself (`HeadStart`)
FORKED_AWAY = []  # in a forked child: the parent's deliveries, kept (their CUDA memory must not be freed there)
_new = tuple.__new__  # a NamedTuple made from a tuple: no Python frame (hot path)


class Mark(NamedTuple):
    """The progress after the last batch returned: where the next batch starts."""
    batch: int                    # batches of the whole run before it (a state's "batch")
    position: Position
    buffer: BufferText | None     # a buffered packing's buffer there (a concat mixture's point: `mixtext.Packed`)
    docs: int = 0                 # documents delivered before it, by this loader
    read: RowGroup | None = None  # the row group the last batch's reading ended in (its nanochat
    #                               keys); None: none read yet, the position's


@dataclasses.dataclass(frozen=True)
class Debug:
    """`ShmLoader.debug()`: the running children (multiprocessing `Process` objects), the ring's
    /dev/shm name and views, and the delivery (delivery.py) in use."""
    coordinator: object
    workers: list
    segment: str
    ring: object
    delivery: object


@dataclasses.dataclass
class Run:
    """One start of the children, with its delivery."""
    children: Children
    delivery: object
    first: int                    # the state's batch count at the run's batch 0
    docs_before: int              # documents the loader delivered before it
    head: HeadStart | None = None  # its first batches made by the trainer while the children start

    def stats(self, config) -> dict:
        """What this run's processes have read, from the ring's header: counters, each worker's."""
        ring, kids = self.children.ring, self.children
        values = dict(zip(STATS_FIELDS, (int(v) for v in ring.stats)))
        out = {"tokens_read": values["tokens"], "docs_read": values["docs"], "nulls": values["nulls"],
               "pieces": values["pieces"], "bad_row_groups_skipped": values["skipped_rg"],
               "cache_hits": values["cache_hits"], "cache_misses": values["cache_misses"],
               "tokens_per_s": values["tokens"] / max(time.monotonic() - kids.started_at, 1e-9),
               "ring_ready": self.ready(), "ring_slots": config.n_slots, "epoch": values["epoch"],
               "workers": [_worker_stats(r) for r in ring.workers]}
        out.update(config.spec.stats(values))
        return out

    def ready(self) -> int:
        """Batches the ring holds ready that `next()` has not returned (those below what the head
        start handed out are not counted: they are taken and dropped)."""
        handover = self.children.handover
        if self.head is None or not self.head.given:
            return self.children.ready_batches()
        return max(handover.announced() - max(handover.taken, self.head.given), 0)


def _worker_stats(row) -> dict:
    busy = row[WorkerCol.BUSY_US]
    return {"pid": int(row[WorkerCol.PID]), "tokens": int(row[WorkerCol.TOKENS]),
            "tokenized": int(row[WorkerCol.TOKENIZED]), "busy_s": int(busy) / 1e6,
            "tokens_per_s": float(row[WorkerCol.TOKENS] / (busy / 1e6)) if busy else 0.0,
            "engine": engine_name(int(row[WorkerCol.ENGINE]))}



def mix_text_bytes(mix, at, buffer_docs: int = 0) -> int:
    """The most bytes a mixture's place can take as JSON (`mix`: its `MixArgs`; `at`: its start,
    a `MixStart`): per source its name, a position and the mixer's counts (numbers up to 20 digits),
    with room to spare; and a best-fit buffer of `buffer_docs` documents (more at first if the
    place's own holds more), a run each at most."""
    names = {r.name for r in mix.ranges} | at.placed
    width = max(len(json.dumps(name)) for name in names)
    if buffer_docs:
        buffer_docs += sum(r[5] for r in buffer_entries(at.point))
    return 1024 + sum(400 + len(json.dumps(name)) for name in names) + buffer_docs * (width + 110)

class Runs:
    def __init__(self, config, deliver, on_opened, rank: int, kind):
        """`deliver(rows, free)`: the delivery for a new ring's slots (`Ring.rows`); `on_opened(msgs)`: the files
        the coordinator read (`Opened`), for the loader's catalogue; `kind`: what the loader reads
        (kinds.py: whether a slot carries its state's text, the room it needs, a restart's arguments)."""
        self.config, self._deliver, self._on_opened, self.rank, self._kind = config, deliver, on_opened, rank, kind
        self.run = None
        self.closed = None  # why the loader was closed (`close`), else None
        # the lifecycle lock: a run starts, restarts, has a worker replaced or stops under it, and
        # `close()` from another thread takes it too, so a close never races with a start
        self._lock = threading.RLock()
        self._args, self._first, self._docs = None, 0, 0
        self.budget, self.poison = heal.Budget(config.max_restarts), heal.PoisonMemory(shuffled=kind.shuffled(config))
        self.heals = self.idle_releases = 0
        self.head_batches = 0  # batches the trainer made itself (procs/headstart.py), over every run
        self._slot_buffer = kind.slot_buffer(config)  # a batch's slot carries its state's text: copied out

    def begin(self, args, first: int, docs: int = 0):
        """The next run starts from `args` (`RunArgs`: its start, buffer, files), its batch 0
        being the state's batch `first`; the running one, if any, stops."""
        with self._lock:
            self._args, self._first, self._docs = args, first, docs
            self.stop()

    def take(self, mark: Mark, timeout: float) -> Announcement:
        """The next batch's announcement, starting the children first when none run; a lost
        worker is replaced, a lost coordinator (or an idle release) starts every child again
        from `mark`. A close from another thread meanwhile: `LoaderClosed`."""
        waited = 0.0
        while True:
            run = self.run
            if run is None or self.closed is not None:
                run = self._running()
            if run.head is not None and run.head.given > run.head.given_back:
                self._head_back(run)
            began = time.monotonic()
            if run.head is not None and not run.head.over and (ann := self._head_start(run, mark)) is not None:
                return ann
            if run.children.starting:  # the head start is over
                self._wait_started(run, mark, timeout)
            try:
                ann = run.children.next_batch(run.delivery, timeout)
                while run.head is not None and ann.batch < run.head.given:  # made here already: the same
                    run.head.compare(ann, None if self._slot_buffer is None else self._slot_buffer(run.children.ring,
                                                                                                   ann.slot))
                    run.children.handover.free(ann.batch)
                    ann = run.children.next_batch(run.delivery, timeout)
            except BaseException as exc:
                # closed by another thread while this one waited; a SystemExit or KeyboardInterrupt is
                # the caller's own (a signal handler's that closed the loader first) and goes on as it is
                if self.closed is not None and isinstance(exc, Exception):
                    raise LoaderClosed(self.closed) from None
                if not isinstance(exc, (ChildrenReleased, ChildLost)):
                    raise
                gone = exc.with_traceback(None)  # its frames (and its context's) hold the old ring's views:
                gone.__context__ = gone.__cause__ = None  # kept, they would keep the ring mapped
            else:
                return self._taken(run, ann, waited)
            waited += time.monotonic() - began
            del run  # nothing here may keep the old ring mapped through a restart
            if isinstance(gone, ChildLost):
                self._heal(gone, mark)
            else:
                self._released(gone.args[0], mark)

    def _head_start(self, run: Run, mark: Mark) -> "Announcement | None":
        """The run's next batch made by the trainer (procs/headstart.py), while its rule says so
        (`MOST` more once its children, started late while the forkserver booted, are started)."""
        head, handover, began = run.head, run.children.handover, time.monotonic()
        if head.until is None and not run.children.made_only:
            head.started()
        made = head.make() if head.wanted(handover.announced(), handover.pending_messages()) else None
        if head.opened:
            self._on_opened(head.take_opened())
        if made is None:
            return None
        if made.batch == 0:  # the trainer has its first batch: the other loaders go on (precedence.py)
            precedence.PRECEDENCE.started(run.children)
        return Announcement(made.batch, HEAD_SLOT, made.position, made.docs, made.check, made.buffer,
                            waited=time.monotonic() - began, read=made.read)

    def start_now(self, mark: "Mark | None"):
        """Wait until the running run's children are started, if they are started late (the
        forkserver booting); `mark`: the progress after the last batch returned."""
        with self._lock:
            run = self.run
            if run is not None and self.closed is None and run.children.starting:
                self._wait_started(run, mark, self.config.timeout)

    def debug(self, mark: "Mark | None", start: bool) -> "Debug | None":
        """What runs now (`ShmLoader.debug`), its children started first when `start`."""
        if start:
            self.start_now(mark)
        if self.run is None:
            return None
        kids = self.run.children
        return Debug(kids.coordinator, list(kids.workers), kids.segment.name, kids.ring, self.run.delivery)

    def _wait_started(self, run: Run, mark: "Mark | None", timeout: float):
        """Wait for the run's children, started by a thread once the forkserver has booted
        (start.py `Start.later`), or start them here; the head start then makes `MOST` more
        batches at most (`_head_start` sees them started). A start that failed with any of them unstarted stops the run (the next
        one starts from `mark`), and what it raised is raised."""
        with self._lock:
            if self.closed is not None or run is not self.run:
                raise LoaderClosed(self.closed or "this ShmLoader was closed")
            try:
                run.children.wait_started(timeout)
            finally:  # a Ctrl-C is raised once all are started (start.py `_start`): the run goes on
                if run.children.made_only or any(p.pid is None for p in run.children.procs):
                    self.restart(mark) if mark is not None else self.stop()

    def _running(self) -> Run:
        with self._lock:
            if self.closed is not None:
                raise LoaderClosed(self.closed)
            if self.run is None:
                self._start()
            return self.run

    def _taken(self, run: Run, ann: Announcement, waited: float) -> Announcement:
        with self._lock:
            if self.closed is not None or run is not self.run:
                raise LoaderClosed(self.closed or "this ShmLoader was closed")
            if run.children.opened:  # files the coordinator has read (first, or again after a change)
                opened, run.children.opened = run.children.opened, []
                self._on_opened(opened)
            if self._slot_buffer is not None:  # copied out before the slot can be freed (hot path)
                buffer = self._slot_buffer(run.children.ring, ann.slot)
                ann = _new(Announcement, (*ann[:5], buffer, ann.waited, ann.read))
            return ann._replace(waited=ann.waited + waited) if waited else ann

    def deliver(self, ann: Announcement, shape: tuple) -> tuple:
        """`(batch, mark)`: announcement `ann` as the caller's tensors, and the progress after it.
        One call per batch on the trainer's hot path: its tuples are made without a Python
        constructor (`_new`)."""
        with self._lock:
            run = self.run
            if self.closed is not None or run is None:
                raise LoaderClosed(self.closed or "this ShmLoader was closed")
            if ann.slot == HEAD_SLOT:
                batch = run.delivery.made(run.head.row(ann.batch), shape)
                run.head.handed(ann.batch)  # only now (a Ctrl-C before: the next next() returns it)
                self.head_batches += 1
                run.children.ring.counters[Counter.HEAD] = run.head.given  # taken, for an idle release
                self._head_back(run)  # one copied (to a device, or past the lending cap) is back at once
            else:
                batch = run.delivery.batch(ann.batch, ann.slot, shape)
            return batch, _new(Mark, (run.first + ann.batch + 1, ann.position, ann.buffer, run.docs_before + ann.docs,
                                      ann.read))

    @staticmethod
    def _head_back(run: Run):
        """Tell the coordinator how many of the head start's batches the caller has let go of
        (`Counter.HEAD_BACK`), and the longest gap between them (`HEAD_GAP_US`, first): for an
        idle release they are given back then (procs/idle.py)."""
        head, counters = run.head, run.children.ring.counters
        head.back(run.delivery.made_back())
        counters[Counter.HEAD_GAP_US] = int(head.longest_gap * 1e6)
        counters[Counter.HEAD_BACK] = head.given_back

    def restart(self, mark: Mark) -> int:
        """Stop the children; the next run starts at `mark`. Returns its batch count."""
        self.begin(self._kind.restarted(self._args, mark), mark.batch, mark.docs)
        return mark.batch

    def stop(self, wait: bool = True):
        """Stop the running children, if any; the delivery first (copies in flight read the ring).
        `wait=False`: their processes are joined in the reaper's thread (children.py `shutdown`)."""
        with self._lock:
            run, self.run = self.run, None
            if run is None:
                return
            try:
                run.delivery.close()
            finally:
                run.children.shutdown(wait)

    def close(self, why: str, wait: bool = True):
        """No run starts again (`take` raises `LoaderClosed(why)`, also in a thread waiting in it
        now); the running one stops. Without `wait` (a drop: no join to interrupt), a Ctrl-C is
        held until the stop is whole, so that no half-stopped run is left behind."""
        with self._lock, (contextlib.nullcontext() if wait else sigint_blocked()):
            self.closed = why
            self.stop(wait)

    def forget(self):
        """In a process forked from the trainer: let go of the trainer's run without touching it."""
        self._lock = threading.RLock()  # another thread of the parent may have held it
        run, self.run = self.run, None
        if run is not None:
            run.children.forget()
            FORKED_AWAY.append(run.delivery)  # never freed here: freeing its CUDA memory would call CUDA

    def _start(self):
        c, args = self.config, self._args
        # a buffer can hold one run per document: the packing's most, or more at first, after an elastic
        # resume gave this rank several old ranks' buffers (the planner refills only below its size)
        runs = args.start.at.docs_as_runs + c.tokenizer_batch_size if c.max_runs else 0
        runs = max(runs, self._kind.text_runs(args, c))  # room for a mixture's place (JSON), in 80-byte runs
        layout = RingLayout(c.n_slots, c.window, c.num_workers, max(c.max_runs, runs), positions=c.positions_words)
        poisoned, suspects = self.poison.spans(args.files)
        args = dataclasses.replace(args, layout=layout, poisoned=poisoned, suspects=suspects)
        where = begin(c, args)  # None: no head start
        head = HeadStart(c, args, where, booting(c.start_method)) if where is not None else None
        children = start_children(c, layout, args, head.prepare if head is not None else None)
        try:
            delivery = self._deliver(children.ring.rows, children.handover.free)  # tokens, then positions
        except BaseException:
            children.shutdown()
            raise
        self.run = Run(children, delivery, self._first, self._docs, head)

    def _heal(self, lost: ChildLost, mark: Mark):
        """Heal `lost` (a death or a stall) unless heal.py says no (then a `WorkerError`): a
        worker is replaced, anything else starts every process again from `mark`."""
        with self._lock:
            if self.closed is not None:
                raise LoaderClosed(self.closed)
            run = self.run
            lost = run.children.blame(lost) if run is not None else lost
            used = self.allow(lost, mark.position)
            if (lost.worker is not None and run is not None
                    and run.children.replace_worker(lost.worker, *self.poison.spans(run.children.files))):
                how = f"worker {lost.worker} is replaced, the other processes go on"
            else:  # the coordinator, or a worker and the coordinator with it
                how = f"every loader process starts again at batch {self.restart(mark)}"
            self._log_heal(lost, used, how)

    def heal_count(self, lost: ChildLost, paths: list) -> tuple:
        """A count-only run (resume.py's replay, over `paths`) lost a child: allowed as a heal is,
        or raised. Returns the poisoned and suspect spans for its new worker."""
        used = self.allow(lost, Position(0, 0, 0, 0))  # a replay passes nothing: a second loss in a suspect is poison
        self._log_heal(lost, used, "the count goes on" if lost.worker is not None else "the count starts again")
        return self.poison.spans(paths)

    def _log_heal(self, lost: ChildLost, used: int, how: str):
        logging.getLogger("shmloader").warning(
            "rank %d: %s%s; heal %d of max_restarts=%d in %.0f minutes: %s", self.rank, str(lost),
            _held_text(lost.held, self.poison.shuffled), used, self.config.max_restarts, heal.WINDOW_S / 60, how)

    def allow(self, lost: ChildLost, at) -> int:
        """Count a heal of `lost` (the stream standing at `at`), or raise the `WorkerError` heal.py
        says (the budget spent, a poison pill not skipped); returns the heals in the window."""
        with self._lock:
            c, now, held = self.config, time.monotonic(), lost.held
            if self.budget.spent(now):
                spent = "" if not c.max_restarts else (
                    f" (the loader healed {self.budget.used} deaths or stalls in the last "
                    f"{heal.WINDOW_S / 60:.0f} minutes: max_restarts={c.max_restarts} is spent)")
                raise WorkerError(f"{lost}{_held_text(held, self.poison.shuffled)}{spent}") from None
            if held is not None and (poison := self.poison.lost(held, at)) is not None:
                done, why = _poison_words(held)
                if c.on_bad_row_group != "skip":
                    slow = (f"; if it is only slow to read or to tokenize, raise stall_s (now {c.stall_s:g} s)"
                            if lost.stalled_s is not None else "")
                    raise WorkerError(
                        f"{lost}: {poison} was being {done} at two deaths or stalls of a worker ({why}): fix or "
                        f"remove it, or pass on_bad_row_group='skip' to skip it{slow}") from None
                self.poison.skip(poison)
                warn(f"shmloader: skipping {poison}: it was being {done} at two deaths or stalls of a worker "
                     f"(on_bad_row_group='skip'); the rest of {formats.place_of(poison.path, poison.rg)} is read")
            self.heals += 1
            return self.budget.spend(now)

    def _released(self, idle_s: float, mark: Mark):
        """The children exited after `idle_s` s without a batch taken (`idle_release_s`)."""
        with self._lock:
            if self.closed is not None:
                raise LoaderClosed(self.closed)
            self.idle_releases += 1
            logging.getLogger("shmloader").info(
                "rank %d: the loader's processes exited after %.1f s without a batch taken (idle_release_s=%g); "
                "starting them again at batch %d", self.rank, idle_s, self.config.idle_release_s, self.restart(mark))


def _poison_words(held) -> tuple:
    """What the worker was doing with a poison at its second loss, and what that says: read
    (`Held.reading`: the piece's text was being read, before any of it reached the engine) or
    tokenized (a run of documents inside the engine)."""
    if held.reading:
        return "read", ("reading it kills or hangs the worker: a row group that crashes its reader, or one too "
                        "large for the worker's memory, killed by the OOM killer each time")
    return "tokenized", "it kills or hangs the worker or its tokenizer"


def _held_text(held, shuffled: bool) -> str:
    if held is None:
        return ""
    where = "reading them" if held.reading else f"in the engine: {held.run}-{held.run_end - 1} of the piece"
    place = formats.docs_of_unit(held.path, held.rg, held.doc, held.end - 1, ordered=not shuffled)
    return f"; it was on {held.path}, {place} ({where})"
