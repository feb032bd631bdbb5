"""The coordinator process: plans pieces, hands them out, sequences tokens, announces batches.

It sees token *counts* only: the canonical order (`data.order.iter_pieces`) and the packing's
sequencing mode (`RunArgs.modes`: the packing's or a mixture's, and its count-only mode for a
count-only run, as kinds.py gives them; `packing.base.Mode` is their interface) decide where every token lands, so the stream is the
same for any number of workers and any timing. New pieces go to a worker the mode lets take
one (so memory stays bounded whatever the trainer's pace) and picks (`Mode.pick`: a row
group's slices to the worker that read it when the loads allow, else the least loaded).
Follows NOTE [ring protocol] (ipc/protocol.py); every wait has a timeout, and the alive pipe ends
the loop when the trainer closes the loader or dies; an idle release (`_check_idle`, its rule in
procs/idle.py) ends it when the trainer has been away long enough. Never imports torch or a
tokenizer.

A worker that dies is replaced (the trainer starts a new one at its index and passes its pipe
here, `Replace`), and nothing else stops: meanwhile its orders wait (`_queued`) and it gets no
new piece; the new worker is given again every piece the mode says the old one held
(`Mode.holding`: given and not counted, or counted with rows still to write), the counted
ones (`_redoing`) to keep just those rows; their counts are not counted twice; and each
order the old one had not acknowledged goes out again once the pieces it reads are there
(an order half carried out writes the same tokens to the same places again). Workers
acknowledge every order in order (`Written`, one for the orders each look at their pipe finds),
so the orders not acknowledged are known.

Bad data ahead of the stream is not raised when it is found: a worker that cannot read a piece
says so (`Failed`) and goes on, and an order that cannot be read on (a file whose footer cannot
be read) stops at the piece that would have come next; the mode holds the error until its
stream needs that piece and every batch before it is announced (`Mode.failed`, packing/base.py
`Stops`), so that `next()` raises it at the same batch whatever the workers and the timing.
The files' schemas are checked ahead on a thread (`SchemaCheck`), and a bad one is warned of at
once, naming it: it is raised when the run reaches it.
"""
import dataclasses
import itertools
import os
import time
from collections import deque
from multiprocessing import reduction
from multiprocessing.connection import Connection

import numpy as np

from ..data import elastic
from ..data import shuffle as shufflemod
from ..data import units as unitsmod
from ..data.order import cut_pieces, iter_pieces
from ..data.source import Reader, SchemaCheck, read_or_skip
from ..errors import DataError
from ..ipc import ring as ringmod
from ..ipc import segment as segmod
from ..ipc.handover import CoordinatorEnd
from ..ipc.inbox import Inbox
from ..ipc.outbox import Outbox
from ..ipc.protocol import (Counted, Error, Failed, Listener, Opened, Ready, Released, Replace, RunArgs, Skipped, Stop,
                            Task, Warn, Written)
from ..ipc.ring import Counter, Stat
from ..ipc.signals import ignore_sigint
from ..packing.base import InOrder, SlotMap
from . import heal
from .idle import HeadCounters, IdleRule
from .stall import beat_every

ERROR_FLUSH_S = 2.0
GIVEN_PRUNE = 4096  # pieces remembered for a replacement before those no worker holds are dropped
READY_WAIT_S = 2.0  # a worker not Ready this long after its start is given pieces anyway


class _Release(Exception):
    """The trainer has been away long enough: the coordinator exits (NOTE [ring protocol] 7)."""


def _pieces(cfg, run, source: Reader, report_bad, opened, order=None):
    """`pieces(ramp, cap, first_index)`: the canonical order's pieces from `run.start`'s position; a bad
    file is skipped (`report_bad((file, None), text)`) or raises, as `on_bad_row_group` says;
    `opened(f)` once a file's footer is read. A shuffled run's order is over every file's units:
    the trainer's row counts (`run.counts`, read for the stream's first position) stand for
    each file's footer until a unit of it is cut (`unit_bytes` reads it then), so that no
    footer is read twice before the first batch. `order`: the run's shuffled order
    (`shuffle.of_run`; a mixture's orders each of its source's pieces by its own)."""
    known = run.counts if run.start.at.order_plans is None else None  # given for one source's shuffled stream only

    def read_counts(f: int) -> list[int]:
        counts = read_or_skip(lambda: source.row_counts(f), cfg.on_bad_row_group,
                              lambda text: report_bad((f, None), text), "file")
        if counts is None:
            return []
        opened(f)
        return counts

    def row_counts(f: int) -> list[int]:
        return list(known[f]) if known is not None and known[f] else read_counts(f)

    def unit_bytes(f: int) -> list[int]:
        if known is not None and (now := read_counts(f)) != list(known[f]):
            raise DataError(f"{run.files[f]} changed while the run read it: {len(now)} units of "
                            f"{sum(now)} rows, not the {len(known[f])} of {sum(known[f])} the run planned "
                            f"with (a data file must not be rewritten under a running loader; resume from "
                            f"a saved state once it is written)")
        return source.text_bytes(f)

    def own(lo: int):
        """The `Shuffle` of the source whose files begin at the run's file `lo` (None: the files' order)."""
        return None if order is None else order.of(lo).order

    def pieces(ramp, cap, first_index, files=None, start=None, plan=None, later=None):
        """The order's pieces; `files=(lo, n)`, `start`: of files `[lo, lo + n)` alone (a
        mixture's source), from `start` (numbered within them), in the run's numbering, its files
        in `later`'s order after `later.after` (files added among its own at the resume); `plan`:
        the source's elastic plan, whose first step keeps `start.skip` (a source's document cut
        at a change of world size, each source's own); a shuffled source is in its own
        order (`own`) with a plan or without; a source's pieces end at whole units of
        their step (`aligned`: best fit's chunks, packing/mix.py)."""
        if files is not None:
            lo, n = files
            counts, text = (lambda f: row_counts(lo + f)), (lambda f: source.text_bytes(lo + f))
            shuffle = own(lo)
            if plan is None:
                steps = iter_pieces(counts, n, run.rank, run.world, start, max_docs=cap, ramp=ramp,
                                    first_index=first_index, later=later, row_bytes=text,
                                    max_bytes=cfg.max_piece_bytes, unit=cfg.piece_unit, shuffle=shuffle, aligned=True)
            else:
                assert later is None, "files added at a change of world size, or to a run that began at one (refused)"
                units = elastic.steps(plan, run.rank, run.world, counts, n, start, shuffle=shuffle)
                if start.skip:  # the unit `start` is in begins at its document, the tokens before it dropped
                    first = next(units)
                    units = itertools.chain([first._replace(skip=start.skip)], units)
                steps = cut_pieces(units, cap, ramp, first_index, text, cfg.max_piece_bytes, cfg.piece_unit,
                                   aligned=True)
            return (p.from_file(lo) for p in steps)
        at, position = run.start.at, run.start.position  # one source's: a `SourceStart`
        if at.plan is None:
            return iter_pieces(row_counts, len(run.files), run.rank, run.world, position,
                               max_docs=cap, ramp=ramp, first_index=first_index, later=at.later,
                               row_bytes=unit_bytes, max_bytes=cfg.max_piece_bytes, unit=cfg.piece_unit,
                               shuffle=own(0))
        steps = elastic.steps(at.plan, run.rank, run.world, row_counts, len(run.files), position, at.later,
                              shuffle=own(0))
        return cut_pieces(steps, cap, ramp, first_index, source.text_bytes, cfg.max_piece_bytes, cfg.piece_unit)
    pieces.row_counts = row_counts
    return pieces


def _with_firsts(run, order, row_counts):
    """`run` that begins each shuffled source its start does not place (`placed`) at its share's
    first unit (`with_firsts`: a mixture's `MixStart.firsts`; one source's start places it, so
    it is `run` as it is; `row_counts`: the run's files', as its order reads them)."""
    at = run.start.at
    firsts = order.firsts(at.placed, row_counts, run.rank, run.world)
    return dataclasses.replace(run, start=dataclasses.replace(run.start, at=at.with_firsts(firsts)))


class _Coordinator:
    def __init__(self, cfg, args: RunArgs, trainer, workers, alive, ring: ringmod.Ring, bells):
        self.args, self.trainer, self.workers, self.alive, self.ring = args, trainer, workers, alive, ring
        self.cfg = cfg
        self.to_trainer = Outbox(trainer)
        ready, self.kick, header_only = bells
        self.handover = CoordinatorEnd(ring, ready, self.kick, header_only)
        mode, count = args.modes  # the packing's, or the mixture's (kinds.py): counted (another rank's state) or packed
        kind = count if args.start.locate else mode
        fs = args.filesystem.open() if args.filesystem is not None else None
        self.source, self.told = Reader(args.files, fs, args.columns, keep_open=args.keep_open), {}  # told: file -> identity sent
        self.order = shufflemod.of_run(cfg, args)  # None: the files' order
        pieces = _pieces(cfg, args, self.source, self._report_bad, self._opened, self.order)
        self._row_counts = pieces.row_counts
        self.windows = (None if self.order is None  # a shuffled window's members: procs/heal.py, `_task`
                        else shufflemod.Windows(self.order, pieces.row_counts, args.world,
                                                   args.start.at.order_plans))
        if self.order is not None:  # each shuffled source the start does not place begins at its first unit
            args = self.args = _with_firsts(args, self.order, pieces.row_counts)
        self.mode = kind(cfg, args, len(workers), pieces)
        # a bad file is warned of when found, ahead of the run, and raised when reached (skipped ones
        # are skipped when reached)
        self.schema = (SchemaCheck(args.files, fs, args.rank, args.start.position.file, args.columns)
                       if cfg.on_bad_row_group == "raise" else None)
        self.next_piece = 0       # the index of the next piece handed out
        self._ahead = None        # that piece, taken from the order, while no worker it may go to may take it
        self.planned_out = False  # the order could not be read on: no piece goes out again
        self.slots = SlotMap(args.layout.n_slots)
        self.outboxes = [Outbox(conn) for conn in workers]
        self.inboxes = [Inbox(conn) for conn in workers]  # each read takes every message the pipe holds
        self.listening = Listener([trainer, alive, self.kick, *workers])
        self.spec = cfg.spec
        self.wait_s = beat_every(cfg)  # the loop turns (and beats) at least this often
        self.poisoned, self.suspects = args.poisoned, args.suspects  # procs/heal.py: the trainer's word
        self.dead = set()                             # workers whose pipe closed, not yet replaced
        now = time.monotonic()
        self.starting = dict.fromkeys(range(len(workers)), now)  # workers not Ready yet, since when
        self._unacked = [deque() for _ in workers]    # orders sent to each worker, not acknowledged
        self._queued = [deque() for _ in workers]     # orders held back while it is replaced
        self._redoing = [set() for _ in workers]      # pieces its replacement tokenizes again
        self._given = {}                              # piece index -> the Piece, while a worker may hold it
        self.docs_seen = 0
        self._barren, self._n_units = set(), None  # shuffled: units read while no document was (`_check_not_empty`)
        self._unchecked = InOrder()  # counted pieces' (epoch, documents), in stream order
        self.skipped_rows = {}    # piece index -> rows skipped with its bad row group
        self.bad_row_groups = set()
        self.idle = IdleRule(0.0 if args.start.locate else cfg.idle_release_s, time.monotonic())
        self._from_worker = {Ready: lambda msg, w: self.starting.pop(w, None), Counted: self._counted,
                             Written: self._written,
                             Skipped: lambda msg, w: self._row_group_skipped(msg), Failed: self._failed,
                             Error: lambda msg, w: self.tell(msg), Warn: lambda msg, w: self.tell(msg)}
        self._from_trainer = {Replace: self._replaced}

    def run(self):
        self.ring.stats[Stat.EPOCH] = self.args.start.position.epoch
        while True:
            self.ring.stats[Stat.BEAT] += 1  # alive and turning (children.py: a stall)
            if self.schema is not None and (bad := self.schema.found()) is not None:
                self.schema = None
                self.tell(Warn(f"{bad}; found ahead: next() raises it when the run reaches that file"))
            freed = self.handover.freed()
            for k in freed:  # in any order
                self.slots.release(k)
                self.mode.freed(k)
            self._check_idle(freed)
            self._dispatch()   # plans first, so that _assign sees whether a plan starves
            self._announce()
            for msg in self.mode.messages():
                self.tell(msg)
            self._assign()
            # holding no free slot, look at the free log often (NOTE [slot handover])
            ready = self.listening.wait(self.handover.wait_s(self.slots.full, self.wait_s))
            if not ready:
                self.handover.timed_out()
            for conn in ready:
                if conn is self.alive:
                    raise Stop
                if conn is self.kick:
                    self.handover.kicked_now()
                elif conn is self.trainer or conn in self.workers:  # not a dead worker's pipe that
                    self._receive(conn)  # a Replace just before it in `ready` took out (what it sent is redone)

    def _check_idle(self, freed: list):
        """Release the processes (`_Release`) when the trainer is away (procs/idle.py's rule),
        given the batches `freed` this turn and the trainer's counters. A rule that never
        releases (`idle_release_s=0`, the train split's default) is not asked: its reads of the
        ring's counters cost ~10 us a batch (docs/benchmarks.md, "Best fit's coordinator, by part")."""
        if self.idle.never:
            return
        counters = self.ring.counters
        head = HeadCounters(int(counters[Counter.HEAD]), int(counters[Counter.HEAD_BACK]),
                            int(counters[Counter.HEAD_GAP_US]) / 1e6)
        away = self.idle.turn(time.monotonic(), freed, int(counters[Counter.TAKEN]), head,
                              bool(counters[Counter.WAITING]), self._all_ready)
        if away is not None:
            raise _Release(away)

    def _all_ready(self) -> bool:
        """Every slot holds a batch announced and not given back: the trainer waits for none."""
        return int(self.ring.counters[Counter.ANNOUNCED]) - self.handover.seen >= self.args.layout.n_slots

    def tell(self, msg):
        """A message for the trainer's pipe (counted in the header first, so that the trainer
        reads it before the batches announced after it)."""
        self.handover.message_queued()
        self.to_trainer.send(msg)

    def _receive(self, conn):
        """A message from the trainer, or every message a worker's pipe holds (`Inbox`), in order."""
        w = next((i for i, c in enumerate(self.workers) if c is conn), None)
        try:
            msgs = [conn.recv()] if w is None else self.inboxes[w].read()
        except (EOFError, ConnectionResetError):  # reset: it exited with our messages unread
            if conn is self.trainer:
                raise Stop from None
            self._lost(w)  # the trainer sees its sentinel, and replaces it or stops everything
            return
        for msg in msgs:
            handler = (self._from_trainer if w is None else self._from_worker).get(type(msg))
            if handler is None:
                raise RuntimeError(f"coordinator: unknown message {msg!r}")
            handler(msg) if w is None else handler(msg, w)

    def _counted(self, msg: Counted, w: int):
        if msg.piece in self._redoing[w]:  # a replacement holds again what was counted
            self._redoing[w].discard(msg.piece)
            self._flush(w)
            return
        live = self._count_stats(msg, self.skipped_rows.pop(msg.piece, 0))
        self._check_not_empty(self.mode.counted(msg), live)

    def _failed(self, msg: Failed, w: int):
        """Worker `w` could not read piece `msg.piece` (a `DataError`): the mode holds the error
        until its stream needs the piece. One it had counted before (done again for a replacement)
        is owed now: raised at once, as one the mode cannot hold."""
        held = (msg.piece not in self._redoing[w] and self.mode.uncounted(msg.piece)
                and self.mode.failed(msg.piece, msg.error))
        if not held:
            self.tell(msg.error)

    def _written(self, msg: Written, w: int):
        unacked = self._unacked[w]
        for _ in range(msg.orders):
            unacked.popleft()
        self.mode.written(msg.counts)

    def _order(self, w: int, order):
        """Send a write order, or hold it back while `w` is replaced (in order, behind the others)."""
        redoing = self._redoing[w]  # (the order's pieces only looked at while `w`'s replacement redoes some)
        if w in self.dead or self._queued[w] or (redoing and redoing.intersection(self.spec.order_pieces(order))):
            self._queued[w].append(order)
        else:
            self._unacked[w].append(order)
            self.outboxes[w].send(order)

    def _flush(self, w: int):
        """Send the orders held back for `w` whose pieces it holds again, in order."""
        queued = self._queued[w]
        while queued and w not in self.dead and not self._redoing[w].intersection(self.spec.order_pieces(queued[0])):
            order = queued.popleft()
            self._unacked[w].append(order)
            self.outboxes[w].send(order)

    def _lost(self, w: int):
        """Worker `w`'s pipe closed: it died. Its orders not acknowledged wait for its replacement."""
        if w in self.dead:
            return
        self.dead.add(w)
        self.listening.remove(self.workers[w])
        self._queued[w] = self._unacked[w] + self._queued[w]
        self._unacked[w] = deque()
        self._redoing[w] = set()

    def _replaced(self, msg: Replace):
        """A new worker takes `msg.worker`'s place (its pipe's end comes next on the trainer's pipe):
        it is given again what the old one held, and the orders held back follow."""
        conn = Connection(reduction.recv_handle(self.trainer))
        w = msg.worker
        self._lost(w)  # if its pipe's end has not been seen yet
        self.poisoned, self.suspects = msg.poisoned, msg.suspects
        self.outboxes[w].close()  # the old pipe's: its thread ends
        self.workers[w], self.outboxes[w], self.inboxes[w] = conn, Outbox(conn), Inbox(conn)
        self.listening.add(conn)
        self.dead.discard(w)
        self.starting[w] = time.monotonic()  # what the old one held goes out below; new pieces once Ready
        holding = self.mode.holding(w, list(self._queued[w]))
        for index in sorted(holding):
            piece, rows = self._given[index], holding[index]
            if self.mode.uncounted(index):
                self.outboxes[w].send(self._task(piece))
            else:  # counted: the same lengths again, its rows still to write kept (no skip: counted as they were)
                self._redoing[w].add(index)
                self.outboxes[w].send(self._task(piece, rows=None if rows is None else tuple(sorted(rows)),
                                                 fresh=False))
        self._flush(w)

    def _task(self, piece, rows=None, fresh: bool = True) -> Task:
        """The task of `piece`, with the rows of its row group skipped as poison and those
        tokenized a document at a time (suspects: procs/heal.py)."""
        if self.windows is not None:
            piece = self.windows.filled(piece)  # a window's members, for the worker to read
        here = lambda spans: heal.spans_in(piece, spans, self.windows)  # noqa: E731
        return Task(piece, self.mode.keep, self.told.get(piece.file, (None, None))[1], rows,
                    here(self.poisoned) if fresh else (), here(self.suspects))

    def _check_not_empty(self, piece, live: int):
        """A whole epoch without a document would loop forever: an error, judged in stream
        order (pieces are counted in any order) so that it never depends on timing. Shuffled,
        a rank's share of an epoch may hold no document by chance (a corpus of mostly empty
        row groups), so there the error waits until it has read every unit of the split."""
        for _, (epoch, n, members) in self._unchecked.add(piece.index, (piece.epoch, live, piece.members)):
            self.docs_seen += n
            if self.docs_seen:
                continue
            if self.order is None:
                if epoch >= self.args.start.position.epoch + 2:  # what data/units.py refuses where footers say it
                    raise unitsmod.barren_error(self.args.rank, len(self.args.files))
                continue
            self._barren.update((m.file, m.unit) for m in members)
            if len(self._barren) >= self._units():
                raise unitsmod.barren_shuffled_error(self.args.rank, len(self.args.files),
                                                  epoch - self.args.start.position.epoch + 1)

    def _units(self) -> int:
        """The units (row groups) of the run's files, counted once."""
        if self._n_units is None:
            self._n_units = sum(len(self._row_counts(f)) for f in range(len(self.args.files)))
        return self._n_units

    def _count_stats(self, msg: Counted, skipped_rows: int) -> int:
        stats, lengths = self.ring.stats, msg.lengths
        live = int(np.count_nonzero(lengths))
        if msg.cache_hit is not None:
            stats[Stat.CACHE_HITS if msg.cache_hit else Stat.CACHE_MISSES] += 1
        stats[Stat.TOKENS] += int(lengths.sum())
        stats[Stat.DOCS] += live
        stats[Stat.NULLS] += len(lengths) - live - skipped_rows
        stats[Stat.PIECES] += 1
        return live

    def _row_group_skipped(self, msg: Skipped):
        """A worker skipped the piece's bad row group; its rows are not nulls."""
        i = msg.piece.index
        self.skipped_rows[i] = self.skipped_rows.get(i, 0) + (msg.piece.n_docs if msg.rows is None else msg.rows)
        self._report_bad(msg.unit or (msg.piece.file, msg.piece.rg), msg.text)

    def _opened(self, f: int):
        """File f's footer was read: the trainer learns its identity (before the batches that
        come from it), again whenever it has changed since."""
        if (msg := Opened.if_new(self.told, f, self.source.identity(f))) is not None:
            self.tell(msg)

    def _report_bad(self, key: tuple, text: str):
        """Count a bad row group (or a whole bad file, `(file, None)`) and warn, once each."""
        if key not in self.bad_row_groups:
            self.bad_row_groups.add(key)
            self.ring.stats[Stat.SKIPPED_RG] = len(self.bad_row_groups)
            self.tell(Warn(text))

    def _assign(self):
        """Hand out pieces in order to the workers the mode picks (`Mode.pick`: a row group's
        slices to the workers that read it, else the least loaded; packing/affinity.py) among
        Ready ones (NOTE [ring protocol] 2), or any after `READY_WAIT_S` (one stuck starting up
        then holds a piece, and its stall or the timeout is seen as before). The next piece is
        taken from the order once a worker may take one (`_ahead` until one is picked)."""
        mode, now = self.mode, time.monotonic()
        unready = {w for w, since in self.starting.items() if now - since < READY_WAIT_S}
        while not self.planned_out:
            # asked at every turn of the loop (best fit's workers mostly may not take one, its
            # read-ahead at its cap): nothing more is asked of the mode while none may
            live = (w for w in range(len(self.workers)) if w not in self.dead and w not in unready)
            try:
                i, piece = mode.hand_out(live, self._ahead)
            except DataError as exc:  # a file of the order cannot be read: the stream stops at the piece
                self.planned_out = True   # that would come next, or (a mode that cannot hold it) raised now
                if not mode.failed(self.next_piece, Error.of(f"coordinator (pid {os.getpid()})", exc)):
                    raise
                return
            if i is None:
                self._ahead = piece
                return
            self._ahead = None
            self.next_piece = piece.index + 1
            self._given[piece.index] = piece
            if len(self._given) > GIVEN_PRUNE:
                self._prune_given()
            self.outboxes[i].send(self._task(piece))

    def _prune_given(self):
        """Keep the pieces some worker may still have to be given again."""
        keep = set()
        for w in range(len(self.workers)):
            keep.update(self.mode.holding(w, list(self._unacked[w]) + list(self._queued[w])))
        self._given = {i: p for i, p in self._given.items() if i in keep}

    def _dispatch(self):
        for w, msg in self.mode.orders(self.slots.take_slot):
            self._order(w, msg)

    def _announce(self):
        for done in self.mode.ready():
            slot = self.slots.slot_of(done.batch)  # it has been written, so it holds a slot
            buffer = self.mode.buffer_of(done)  # best fit's buffer, a mixture's place: in the slot, as the state's text
            if buffer is not None:
                self.ring.write_buffer(slot, *buffer)
            self.ring.stats[Stat.EPOCH] = done.position.epoch
            self.handover.announce(done.batch, slot, done.position, done.docs,
                                   ringmod.batch_check(self.ring.slots[slot]), done.read)
        for stat, value in self.mode.stats():
            self.ring.stats[stat] = value


def coordinator_main(cfg, args: RunArgs, trainer, workers, alive, bells):
    """`bells`: the slot handover's `(ready, kick, header_only)` (ipc/handover.py)."""
    ignore_sigint()
    attached = coordinator = None
    try:
        attached = segmod.attach_unless_gone(args.ring_name, args.layout, alive.poll)
        if attached is None:
            return
        if parts_path := os.environ.get("SHMLOADER_COORDINATOR_PARTS"):
            from . import parts  # a bench's instrument (tools/bench/coordinator_parts.py), before the loop is made
            parts.install(parts_path)
        coordinator = _Coordinator(cfg, args, trainer, list(workers), alive, attached.ring, bells)
        coordinator.run()
    except Stop:  # the trainer closed the loader or is gone (a worker's reset is its EOF)
        segmod.unlink_orphan(args.ring_name)
    except _Release as idle:  # the workers exit on this pipe's EOF; the trainer keeps the ring
        coordinator.tell(Released(float(idle.args[0])))
        coordinator.to_trainer.flush(timeout=ERROR_FLUSH_S)
    except BaseException as exc:
        report = Error.of(f"coordinator (pid {os.getpid()})", exc)
        if coordinator is None:
            trainer.send(report)
        else:  # through the outbox: one writer per pipe, and after what it already queued
            coordinator.tell(report)
            coordinator.to_trainer.flush(timeout=ERROR_FLUSH_S)
    finally:
        if attached is not None:
            attached.close()
