"""Concat over a mixture: the coordinator's mode when a run reads several sources.

Every source has its own canonical order of pieces (its range of the run's files, its row
groups by rank, its epochs, from its own position: `RunArgs.mixture`). Pieces are handed out
from the source the mix waits for first (`MixStream.waiting_for`: its next document is not
counted yet; such a piece goes out even to a worker at its hold budget, so the mix never waits
on a budget that only the mix can free), then from the source furthest behind in read-ahead
(text bytes of its pieces not yet used up, over its weight); never from a source that does not
take part now (weight 0) or has read its `max_epochs`. Counted pieces go to the `MixStream`,
whose runs the concat sequencer places in the order they come (`ConcatSequencer.append`); a
piece's tokens go once its last run is placed. After each batch, the `MixPoint` there travels
in the batch's slot (its buffer area) as JSON: the state's `mixture.point`, and where a heal
or an idle release starts again.

What is said once: a schedule's stage that begins (logged), a source that ends (warned).
A mix that ends (every source with a weight has read its `max_epochs`, or the mix waits for a
source that read a whole epoch and most of another without a document) stops taking documents
there: every complete batch before is placed and announced, then `Ended` tells the trainer
why, which it raises as a `DataError` once it has taken them (the partial last batch is not
made). So the batches before the end are the same whatever the workers and the timing.
"""
from __future__ import annotations

import dataclasses
import json
import zlib
from typing import NamedTuple

from ..data.mixture import Mixer
from ..data.order import RAMP
from ..ipc.protocol import Ended, Warn
from ..position import Position
from .base import MAX_IN_FLIGHT, Complete, Mode
from .concat import ConcatMode, ConcatSequencer, Places
from .mix import MixPoint, MixStream, point_at


def start_points(mix, rank: int) -> tuple:
    """`(point or None, every source's start)` of a mixture's run: the sources it reads in the
    run's numbering of the files, those it does not (a state's, left out) as the state has them."""
    point = MixPoint.from_json(mix.point) if mix.point is not None else None
    starts = dict(point.sources) if point is not None else {}
    for r in mix.ranges:
        p = starts.get(r.name, Position(1, 0, rank, 0))
        starts[r.name] = p._replace(file=p.file + r.lo)
    return point, starts


class _Next(NamedTuple):
    """The source whose piece goes out next; `needed`: the mix waits for its next document and
    none of its pieces is being read."""
    source: str
    needed: bool


class MixConcatMode(ConcatMode):
    """Concat placing a mixture's runs (the module docstring says how pieces are handed out)."""

    def __init__(self, cfg, run, n_workers: int, pieces):
        Mode.__init__(self, n_workers, cfg, run.layout.window, run.layout.n_slots)
        mix, window = run.mixture, run.layout.window
        point, starts = start_points(mix, run.rank)
        # the document the next token is in comes first, its tokens before the point dropped (not if its
        # source is left out now: then the mix starts at a document's start)
        first = point.source if point is not None and point.skip and point.source in self._read(mix) else None
        skip = point.skip if first is not None else 0
        self.seq = ConcatSequencer(window, run.layout.n_slots, skip)
        if point is not None:
            mixer = Mixer.resume(mix.mixture, point.mixer, mix.first_batch).mixer
        else:
            mixer = Mixer(mix.mixture, mix.first_batch)
        self.stream = MixStream(mixer, starts, lambda tokens: mix.first_batch + (tokens - skip) // window, first)
        self._orders, self._seqs, self._src = {}, {}, {}     # per source: its pieces; piece index -> (source, seq)
        self._ahead = {}                                      # per source: text bytes (+1 a piece) not used up
        self._max_epochs = mix.mixture.max_epochs
        self._docs, self._epoch0 = {}, {}                     # per source: documents counted, first epoch
        for r in mix.ranges:
            if r.name in mix.mixture.names:  # a source the state has and this mixture does not: not read
                local = starts[r.name]._replace(file=starts[r.name].file - r.lo)
                self._orders[r.name] = pieces(RAMP, cfg.max_piece_docs, 0, files=(r.lo, r.hi - r.lo), start=local)
                self._seqs[r.name], self._ahead[r.name] = 0, 0
                self._docs[r.name], self._epoch0[r.name] = 0, local.epoch
        self._lo = {r.name: r.lo for r in mix.ranges}          # each source's first file in the run's numbering
        self._said = 0                                        # notes of the stream told
        self._peeked, self._barren, self._ended = {}, {}, False  # per source: its next piece; why it has no document
        self._index = 0
        self.pieces = self._feed()

    @staticmethod
    def _read(mix) -> set:
        return {r.name for r in mix.ranges}

    # ---- handing out pieces

    def _pick(self) -> "_Next | None":
        """The source whose next piece goes out next (that piece peeked), or None."""
        while self.stream.finished is None:
            waiting = [n for n in self.stream.waiting_for() if n in self._orders]
            name = next((n for n in waiting if not any(self._src[i][0] == n for i in self._in_flight)), None)
            needed = name is not None
            if name is None:
                shares = self.stream.mixer.shares()
                live = [n for n in shares if n in self._orders]
                name = min(live, key=lambda n: (self._ahead[n] / shares[n], n)) if live else None
            if name is None:
                return None
            if self._peek(name) is not None:
                return _Next(name, needed)
            self._flow()  # its order has ended: the mix may go on, or end
        return None

    def _peek(self, name: str):
        """Source `name`'s next piece, or None once its order has ended (`max_epochs`)."""
        piece = self._peeked.get(name)
        if piece is None:
            piece = next(self._orders[name])
            if name in self._max_epochs and piece.epoch > self._max_epochs[name]:
                self.stream.exhausted(name, self._seqs[name])
                del self._orders[name]
                return None
            self._peeked[name] = piece
        return piece

    def can_take(self, worker: int) -> bool:
        pick = self._pick()
        if pick is None:
            return False
        if pick.needed:  # past the hold budget: only the mix can free it, and the mix waits for this
            return sum(1 for w, _ in self._in_flight.values() if w == worker) < MAX_IN_FLIGHT
        return super().can_take(worker)

    def _feed(self):
        while True:
            pick = self._pick()
            if pick is None:  # `can_take` said there was one
                raise RuntimeError("mixture: a piece was asked for while none may go out")
            name = pick.source
            piece = self._peeked.pop(name)
            piece = dataclasses.replace(piece, index=self._index)  # numbered in the order pieces go out
            self._src[self._index] = (name, self._seqs[name])
            self._seqs[name] += 1
            self._ahead[name] += piece.text_bytes + 1
            self._index += 1
            yield piece

    # ---- counts, runs and batches

    def counted(self, msg):
        piece = self.specs.pop(msg.piece)
        name, seq = self._src[msg.piece]
        self._counted_by(self.owner[msg.piece], piece, int(msg.lengths.sum()))
        self._check_docs(name, piece, msg.lengths)
        self.stream.counted(name, seq, piece, msg.lengths)
        self._flow()
        return piece

    def _flow(self):
        """The runs the mix can make now, into the sequencer; a mix that waits for a source
        without documents, or has nothing left to read, ends (`Ended` once its batches are out)."""
        if self.stream.finished is None:
            barren = [n for n in self.stream.waiting_for() if n in self._barren]
            if barren:
                self.stream.finish(self._barren[barren[0]])
        for run in self.stream.runs():
            self.seq.append(run.piece.index, run.lengths, run.base, run.last, tag=run)
            if run.last:
                del self._src[run.piece.index]
                if run.source in self._ahead:
                    self._ahead[run.source] -= run.piece.text_bytes + 1
        if self.stream.finished is not None:
            self.seq.finished = True

    def _check_docs(self, name: str, piece, lengths):
        self._docs[name] += int((lengths > 0).sum())
        if self._docs[name] == 0 and piece.epoch >= self._epoch0[name] + 2:
            self._barren.setdefault(name, f"mixture source {name!r}: a whole epoch held no document with text (all "
                                          "null or no rows); the mix cannot go on without it (give it weight 0, or "
                                          "leave it out)")

    def ready(self):
        out = []
        for k, where in self.seq.ready():
            if where.piece < 0:  # the end of a mix that ended
                point = self.stream.end_point()
                out.append(Complete(k, point.sources[self.stream.names[0]], point, self.seq.docs_at.pop(k)))
                continue
            run = where.run
            row = run.row_lo + where.row
            p = run.piece
            out.append(Complete(k, Position(p.epoch, p.file, p.rg, p.doc_start + row, where.skip),
                                point_at(run, row, where.skip), self.seq.docs_at.pop(k)))
        return out

    def orders(self, take_slot):
        """Every run's segments placed now, one `Places` message per worker."""
        by_worker = {}
        for w, place in super().orders(take_slot):
            by_worker.setdefault(w, []).append(place)
        for w, places in by_worker.items():
            yield w, Places(tuple(places))

    def holding(self, worker: int, orders) -> dict:
        """Every piece `worker` owns (not fully placed) or was sent an order for: whole."""
        out = Mode.holding(self, worker, orders)
        out.update((i, None) for i, w in self.owner.items() if w == worker)
        out.update((place.piece, None) for order in orders for place in order.orders)
        return out

    def buffer_of(self, done: Complete):
        """The `MixPoint` after the batch, as the state's JSON text (files numbered within each
        source) and its crc32."""
        point = done.runs
        local = {n: p._replace(file=p.file - self._lo[n]) if n in self._lo else p for n, p in point.sources.items()}
        text = json.dumps(point._replace(sources=local).to_json(), separators=(",", ":"), sort_keys=True)
        return text, zlib.crc32(text.encode())

    def messages(self):
        notes = self.stream.notes
        for text in notes[self._said:]:
            yield Warn(text, info=text.startswith("mixture: stage"))
        self._said = len(notes)
        seq = self.seq
        if seq.finished and not self._ended and seq.book.announced >= max(seq.next_start, 0) // seq.window:
            self._ended = True  # every complete batch is out: the trainer raises this once it took them
            yield Ended(self.stream.finished)
