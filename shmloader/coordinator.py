"""The coordinator process: plans pieces, hands them out, sequences tokens, announces batches.

It sees token *counts* only: the canonical order (`plan.iter_pieces`) and a sequencer
(`packing.ConcatSequencer` for concat, `bestfit_seq.BestFitSequencer` for best fit) decide
where every token lands, so the stream is the same for any number of workers and any
timing. New pieces go to the least-loaded worker; a worker's load is bounded (concat: pieces
not yet fully placed; best fit: pieces not yet counted, plus a global cap on documents waiting
to enter the buffer), so memory stays bounded whatever the trainer's pace.
Follows NOTE [ring protocol] in docs/design.md; every wait has a timeout, and the alive pipe
ends the loop when the trainer closes the loader or dies. Never imports torch or a tokenizer.
"""
import itertools
import os
import queue
import select
import signal
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np

from . import ring as ringmod
from .bestfit_seq import BestFitSequencer
from .errors import DataError
from .locate import BestFitLocator, ConcatLocator
from .packing import ConcatSequencer, SlotMap
from .plan import Cursor, buffer_pieces, iter_pieces, ramp_for, RAMP
from .ring import RingLayout, SlotState
from .source import ParquetSource

MAX_PIECES_PER_WORKER = 3
ERROR_FLUSH_S = 2.0
WAIT_S = 1.0
PROGRESS_S = 1.0


@dataclass(frozen=True)
class CoordinatorArgs:
    files: list
    rank: int
    world: int
    start: Cursor
    skip: int
    ring_name: str
    layout: RingLayout
    max_piece_docs: int
    packing: str = "concat"
    B: int = 0
    T: int = 0
    buffer_size: int = 0
    chunk_docs: int = 0
    buffer_runs: tuple = ()
    on_bad_row_group: str = "raise"
    filesystem: object = None
    locate: tuple | None = None   # (shapes, batch): a count-only run that finds a position


class _Stop(Exception):
    pass


class _Outbox:
    """Messages to one peer (a worker or the trainer), sent by a thread of their own.

    The loop never blocks in a send: a worker blocked sending a long piece's lengths reads
    nothing, and if the loop then blocked sending it a large write order both would wait
    forever; a trainer away from next() stops reading announcements, and the loop would stop
    serving the workers. So the loop only queues and keeps reading every peer; this thread
    does the blocking send. A peer that is gone ends the thread (its death is reported by
    the trainer, or is the trainer's own)."""

    def __init__(self, conn):
        self.conn, self._queue = conn, queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="shmloader-outbox", daemon=True)
        self._thread.start()

    def send(self, msg):
        self._queue.put(msg)

    def flush(self, timeout: float):
        """Send what is queued (at most `timeout` seconds), then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self):
        while (msg := self._queue.get()) is not None:
            try:
                self.conn.send(msg)
            except OSError:
                return


class _Listener:
    """`multiprocessing.connection.wait` over a fixed set of pipes with one poll object kept
    for the whole run: `wait` builds and tears down a selector per call, which costs tens of
    microseconds several times per batch. A hung-up pipe reports ready, so its EOF is seen."""

    def __init__(self, conns):
        self._poll, self._by_fd = select.poll(), {}
        for conn in conns:
            self._by_fd[conn.fileno()] = conn
            self._poll.register(conn.fileno(), select.POLLIN)

    def wait(self, timeout: float) -> list:
        return [self._by_fd[fd] for fd, _ in self._poll.poll(timeout * 1000)]

    def remove(self, conn):
        self._poll.unregister(conn.fileno())
        del self._by_fd[conn.fileno()]


class _Concat:
    """Concat mode: pieces are placed by token offset; a piece is done when fully placed."""

    def __init__(self, args: CoordinatorArgs, n_workers: int, skip):
        self.seq = ConcatSequencer(args.layout.window, args.layout.n_slots, args.skip)
        self.pieces = _pieces(args, RAMP, args.max_piece_docs, 0, skip)
        self.load = [0] * n_workers
        self.owner, self.specs = {}, {}

    def take(self, worker: int, piece):
        self.owner[piece.index], self.specs[piece.index] = worker, piece
        self.load[worker] += 1

    def can_take(self, worker: int) -> bool:
        return self.load[worker] < MAX_PIECES_PER_WORKER

    def counted(self, index: int, lengths, cache_hit=None):
        self.seq.counted(index, lengths)
        return self.specs[index]

    def orders(self, slot_of):
        for index, segments, done in self.seq.placements():
            w = self.owner[index]
            if done:
                self.load[w] -= 1
                del self.owner[index]
            segments = [(k, slot_of(k), off, src, n) for k, off, src, n in segments]
            yield w, ("place", index, segments, done), [s for _, s, *_ in segments]

    def written(self, msg):
        self.seq.written(msg[2])

    def ready(self):
        out = []
        for k, (index, row, skip) in self.seq.ready():
            p = self.specs[index]
            out.append((k, (p.epoch, p.file, p.rg, p.doc_start + row, skip)))
        if out:
            keep = min(min(self.owner, default=self.seq.next_index), self.seq.oldest_live())
            for index in [i for i in self.specs if i < keep]:
                del self.specs[index]
        return out


class _BestFit:
    """Best-fit mode: documents are placed one by one by the planner."""

    def __init__(self, args: CoordinatorArgs, n_workers: int, skip):
        prefix = buffer_pieces(args.buffer_runs, args.max_piece_docs)
        ramp, cap = ramp_for(args.chunk_docs, args.max_piece_docs, args.buffer_size)
        self.pieces = itertools.chain(prefix, _pieces(args, ramp, cap, len(prefix), skip))
        s = args.start
        self.seq = BestFitSequencer(args.B, args.T, args.layout.n_slots, args.buffer_size,
                                    len(prefix), (s.epoch, s.file, s.rg, s.doc))
        self.args = args
        self.pending = self.load = [0] * n_workers   # pieces assigned, not counted
        self.assigned_docs = 0           # documents assigned, not counted
        self.owner, self.specs = {}, {}
        self.cropped_reported = 0

    def take(self, worker: int, piece):
        self.owner[piece.index], self.specs[piece.index] = worker, piece
        self.pending[worker] += 1
        self.assigned_docs += piece.n_docs

    def can_take(self, worker: int) -> bool:
        """Read ahead up to a cap on documents not yet in the buffer; past it only while a
        plan waits for documents and none is being tokenized (a batch of many short documents
        can need more than the cap)."""
        waiting = self.seq.queued_docs + self.seq.backlog_docs + self.assigned_docs
        cap = self.args.buffer_size + 2 * self.args.max_piece_docs
        return self.pending[worker] < 2 and (waiting < cap or (self.seq.starved and not self.assigned_docs))

    def counted(self, index: int, lengths, cache_hit=None):
        w, piece = self.owner.pop(index), self.specs.pop(index)
        self.pending[w] -= 1
        self.assigned_docs -= piece.n_docs
        self.seq.counted(piece, w, lengths, self.args.chunk_docs)
        return piece

    def orders(self, slot_of):
        for k, by_worker in self.seq.plan():
            for w, placements in by_worker.items():
                yield w, ("rows", k, slot_of(k), placements), [slot_of(k)]

    def written(self, msg):
        self.seq.written(msg[1])

    def ready(self):
        return self.seq.ready()


class _Count:
    """Count-only mode (locate.py): workers send document lengths and keep no tokens; the
    locator replays the batches over them in piece order. When it knows the position, the
    trainer gets `("located", position, runs, pieces tokenized, pieces from the cache)`
    (read-ahead included); meanwhile `("progress", done, total)` once
    a second."""

    def __init__(self, args: CoordinatorArgs, n_workers: int, skip):
        shapes, batch = args.locate
        if args.packing == "bos_bestfit":
            _, cap = ramp_for(args.chunk_docs, args.max_piece_docs)  # whole chunks
            self.locator = BestFitLocator(shapes, batch, args.start, args.buffer_size, args.chunk_docs)
        else:
            cap = args.max_piece_docs
            self.locator = ConcatLocator(shapes, batch, args.start)
        self.pieces = _pieces(args, (), cap, 0, skip)  # no ramp: nothing waits for a first batch
        self.pending = self.load = [0] * n_workers  # pieces assigned, not counted
        self.owner, self.specs, self._counted, self._next = {}, {}, {}, 0
        self.from_cache = [0, 0]  # pieces tokenized, pieces read from the token cache
        self._reported, self._next_progress = False, time.monotonic() + PROGRESS_S

    def take(self, worker: int, piece):
        self.owner[piece.index], self.specs[piece.index] = worker, piece
        self.pending[worker] += 1

    def can_take(self, worker: int) -> bool:
        return self.locator.result is None and self.pending[worker] < MAX_PIECES_PER_WORKER

    def counted(self, index: int, lengths, cache_hit=None):
        self.pending[self.owner.pop(index)] -= 1
        self._counted[index] = lengths
        self.from_cache[bool(cache_hit)] += 1
        piece = self.specs[index]
        while self._next in self._counted and self.locator.result is None:
            self.locator.feed(self.specs.pop(self._next), self._counted.pop(self._next))
            self._next += 1
        return piece

    def orders(self, slot_of):
        return ()

    def ready(self):
        return ()

    def messages(self):
        if self.locator.result is not None and not self._reported:
            self._reported = True
            yield ("located", *self.locator.result, *self.from_cache)
        elif not self._reported and time.monotonic() >= self._next_progress:
            self._next_progress = time.monotonic() + PROGRESS_S
            yield ("progress", self.locator.done_batches, self.locator.total)


def _pieces(args: CoordinatorArgs, ramp, cap, first_index, skip):
    source = ParquetSource(args.files, args.filesystem.open() if args.filesystem is not None else None)

    def row_counts(f: int) -> list[int]:
        try:
            return source.row_counts(f)
        except DataError as exc:
            if args.on_bad_row_group != "skip":
                raise
            skip((f, None), f"skipped a bad file: {exc}")
            return []

    return iter_pieces(row_counts, len(args.files), args.rank, args.world, args.start,
                       max_docs=cap, ramp=ramp, first_index=first_index)


class _Coordinator:
    def __init__(self, args: CoordinatorArgs, trainer, workers, alive, ring: ringmod.Ring):
        self.args, self.trainer, self.workers, self.alive, self.ring = args, trainer, workers, alive, ring
        self.to_trainer = _Outbox(trainer)
        kind = _Count if args.locate else _BestFit if args.packing == "bos_bestfit" else _Concat
        self.mode = kind(args, len(workers), self._skip_once)
        self.slots = SlotMap(args.layout.n_slots)
        self.outboxes = [_Outbox(conn) for conn in workers]
        self.listening = _Listener([trainer, alive, *workers])
        self.docs_seen = 0
        self._unchecked = {}      # counted pieces, by index, until their turn in stream order
        self._next_checked = 0
        self.skipped = {}  # piece index -> number of rows skipped with a bad row group
        self.bad_row_groups = set()

    def run(self):
        self.ring.stats[5] = self.args.start.epoch
        while True:
            self._dispatch()   # plans first, so that _assign sees whether a plan starves
            self._announce()
            for msg in getattr(self.mode, "messages", tuple)():
                self.to_trainer.send(msg)
            self._assign()
            for conn in self.listening.wait(WAIT_S):
                if conn is self.alive:
                    raise _Stop
                self._receive(conn)

    def _receive(self, conn):
        try:
            msg = conn.recv()
        except (EOFError, ConnectionResetError):  # reset: it exited with our messages unread
            if conn is self.trainer:
                raise _Stop from None
            self.listening.remove(conn)  # the trainer sees its sentinel and reports the death
            return
        if conn is self.trainer:  # ("free", k), in any order
            self.slots.release(msg[1])
            self.mode.seq.freed(msg[1])
        elif msg[0] == "skipped":
            self._skipped(msg[1], msg[2])
        elif msg[0] == "counted":
            live = self._count_stats(msg[2], self.skipped.pop(msg[1], 0), msg[3])
            piece = self.mode.counted(msg[1], msg[2], msg[3])
            self._check_not_empty(piece, live)
        elif msg[0] == "written":
            self.mode.written(msg)
        elif msg[0] in ("error", "warn"):
            self.to_trainer.send(msg)
        else:
            raise RuntimeError(f"coordinator: unknown message {msg[0]!r}")

    def _check_not_empty(self, piece, live: int):
        """A whole epoch without a document would loop forever: an error, judged in stream
        order (pieces are counted in any order) so that it never depends on timing."""
        self._unchecked[piece.index] = (piece.epoch, live)
        while self._next_checked in self._unchecked:
            epoch, n = self._unchecked.pop(self._next_checked)
            self._next_checked += 1
            self.docs_seen += n
            if self.docs_seen == 0 and epoch >= self.args.start.epoch + 2:
                raise DataError(f"rank {self.args.rank}: a whole epoch over {len(self.args.files)} "
                                f"files held no document with text (all null or no rows)")

    def _count_stats(self, lengths: np.ndarray, skipped_rows: int, cache_hit) -> int:
        stats, live = self.ring.stats, int(np.count_nonzero(lengths))
        if cache_hit is not None:
            stats[8 if cache_hit else 9] += 1
        stats[0] += int(lengths.sum())
        stats[1] += live
        stats[2] += len(lengths) - live - skipped_rows
        stats[3] += 1
        return live

    def _skipped(self, index: int, text: str):
        piece = self.mode.specs[index]
        self.skipped[index] = piece.n_docs
        self._skip_once((piece.file, piece.rg), text)

    def _skip_once(self, key: tuple, text: str):
        """Count a bad row group (or a whole bad file, `(file, None)`) and warn, once each."""
        if key not in self.bad_row_groups:
            self.bad_row_groups.add(key)
            self.ring.stats[6] = len(self.bad_row_groups)
            self.to_trainer.send(("warn", text))

    def _assign(self):
        while True:
            i = min(range(len(self.workers)), key=lambda w: (not self.mode.can_take(w), self.mode.load[w], w))
            if not self.mode.can_take(i):
                return
            piece = next(self.mode.pieces)
            self.mode.take(i, piece)
            self.outboxes[i].send(("task", piece))

    def _dispatch(self):
        for w, msg, slots in self.mode.orders(self.slots.slot):
            self.ring.slot_states[slots] = SlotState.FILLING
            self.outboxes[w].send(msg)

    def _announce(self):
        for k, pos in self.mode.ready():
            slot = self.slots.of(k)  # batch k has been written, so it holds a slot
            if self.args.packing == "bos_bestfit":  # the buffer travels in the slot, not the pipe
                pos, runs = pos
                self.ring.write_runs(slot, runs)
            self.ring.slot_states[slot] = SlotState.READY
            self.ring.stats[5] = pos[0]
            self.to_trainer.send(("batch", k, slot, pos))
        if isinstance(self.mode, _BestFit):
            self.ring.stats[4] = self.mode.seq.tokens_cropped
            self.ring.stats[7] = self.mode.seq.planned * self.args.B * (self.args.T + 1)


def coordinator_main(args: CoordinatorArgs, trainer, workers, alive):
    # Ctrl-C is the trainer's; started with SIGINT blocked (loader_procs._start),
    # so ignore it before unblocking it, which drops one that is pending
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    attached = coordinator = None
    try:
        attached = ringmod.attach_unless_gone(args.ring_name, args.layout, alive.poll)
        if attached is None:
            return
        coordinator = _Coordinator(args, trainer, list(workers), alive, attached.ring)
        coordinator.run()
    except _Stop:  # the trainer closed the loader or is gone (a worker's reset is its EOF)
        pass
    except BaseException as exc:
        kind = "data" if isinstance(exc, DataError) else "crash"
        head = f"coordinator (pid {os.getpid()}): {type(exc).__name__}: {exc}"
        report = ("error", kind, head, traceback.format_exc())
        if coordinator is None:
            trainer.send(report)
        else:  # through the outbox: one writer per pipe, and after what it already queued
            coordinator.to_trainer.send(report)
            coordinator.to_trainer.flush(timeout=ERROR_FLUSH_S)
    finally:
        if attached is not None:
            attached.close()
