"""The coordinator process: plans pieces, hands them out, sequences tokens, announces batches.

It sees token *counts* only: the canonical order (`plan.iter_pieces`) and the sequencer
(`packing.ConcatSequencer`) decide where every token lands, so the stream is the same for any
number of workers and any timing. Each worker holds at most `MAX_PIECES_PER_WORKER` pieces
that are assigned but not yet fully placed; new pieces go to the least-loaded worker.
Follows NOTE [ring protocol] in docs/design.md; every wait has a timeout and the alive pipe
ends the loop when the trainer closes the loader or dies. Never imports torch or a tokenizer.
"""
import os
import signal
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait

import numpy as np

from . import ring as ringmod
from .errors import DataError
from .packing import ConcatSequencer
from .plan import Cursor, iter_pieces
from .ring import RingLayout, SlotState
from .source import ParquetSource

MAX_PIECES_PER_WORKER = 3
WAIT_S = 1.0


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


class _Stop(Exception):
    pass


class _Coordinator:
    def __init__(self, args: CoordinatorArgs, trainer, workers, alive, ring: ringmod.Ring):
        self.args, self.trainer, self.workers, self.alive, self.ring = args, trainer, workers, alive, ring
        source = ParquetSource(args.files)
        self.pieces = iter_pieces(source.row_counts, len(args.files), args.rank, args.world,
                                  args.start, max_docs=args.max_piece_docs)
        self.seq = ConcatSequencer(args.layout.window, args.layout.n_slots, args.skip)
        self.specs = {}                       # live piece index -> Piece
        self.owner = {}                       # piece index -> worker index
        self.load = [0] * len(workers)        # pieces per worker, assigned and not fully placed
        self.listening = [trainer, alive, *workers]

    def run(self):
        self.ring.stats[5] = self.args.start.epoch
        while True:
            self._assign()
            self._dispatch()
            self._announce()
            for conn in wait(self.listening, timeout=WAIT_S):
                if conn is self.alive:
                    raise _Stop
                self._receive(conn)

    def _receive(self, conn):
        try:
            msg = conn.recv()
        except EOFError:
            if conn is self.trainer:
                raise _Stop
            self.listening.remove(conn)  # the trainer sees its sentinel and reports the death
            return
        if conn is self.trainer:
            self.seq.freed(msg[1])
        elif msg[0] == "counted":
            self._counted(msg[1], msg[2])
        elif msg[0] == "written":
            self.seq.written(msg[2])
        elif msg[0] == "error":
            self.trainer.send(msg)
        else:
            raise RuntimeError(f"coordinator: unknown message {msg[0]!r}")

    def _counted(self, index: int, lengths: np.ndarray):
        stats = self.ring.stats
        stats[0] += int(lengths.sum())
        stats[1] += int(np.count_nonzero(lengths))
        stats[2] += int(len(lengths) - np.count_nonzero(lengths))
        stats[3] += 1
        self.seq.counted(index, lengths)
        last = self.specs.get(self.seq.next_index - 1)
        if last is not None and self.seq.next_start <= -self.args.skip and last.epoch >= self.args.start.epoch + 2:
            raise DataError(f"rank {self.args.rank}: a whole epoch over {len(self.args.files)} files "
                            f"held no document with text (all null or no rows)")

    def _assign(self):
        while True:
            i = min(range(len(self.load)), key=self.load.__getitem__)
            if self.load[i] >= MAX_PIECES_PER_WORKER:
                return
            piece = next(self.pieces)
            self.specs[piece.index] = piece
            self.owner[piece.index] = i
            self.load[i] += 1
            self.workers[i].send(("task", piece))

    def _dispatch(self):
        for index, segments, done in self.seq.placements():
            w = self.owner[index]
            for k, _, _, _ in segments:
                self.ring.slot_states[k % self.args.layout.n_slots] = SlotState.FILLING
            self.workers[w].send(("place", index, segments, done))
            if done:
                self.load[w] -= 1
                del self.owner[index]

    def _announce(self):
        ready = self.seq.ready()
        for k, (index, row, skip) in ready:
            p = self.specs[index]
            self.ring.slot_states[k % self.args.layout.n_slots] = SlotState.READY
            self.ring.stats[5] = p.epoch
            self.trainer.send(("batch", k, (p.epoch, p.file, p.rg, p.doc_start + row, skip)))
        if ready:
            oldest = min(self.owner, default=self.seq.next_index)
            live = self.seq.oldest_live()
            for index in [i for i in self.specs if i < min(oldest, live)]:
                del self.specs[index]


def coordinator_main(args: CoordinatorArgs, trainer, workers, alive):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    attached = ringmod.Attached(args.ring_name, args.layout)
    try:
        _Coordinator(args, trainer, list(workers), alive, attached.ring).run()
    except (_Stop, BrokenPipeError, ConnectionResetError):
        pass
    except BaseException as exc:
        kind = "data" if isinstance(exc, DataError) else "crash"
        head = f"coordinator (pid {os.getpid()}): {type(exc).__name__}: {exc}"
        try:
            trainer.send(("error", kind, head, traceback.format_exc()))
        except OSError:
            pass
    finally:
        attached.close()
