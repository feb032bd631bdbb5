"""Concat over a mixture: the coordinator's mode when a run reads several sources.

Every source has its own canonical order of pieces (its range of the run's files, its row
groups by rank, its epochs, from its own position: `RunArgs.mixture`). Pieces are handed out
as packing/mixfeed.py says (the source the mix waits for first, even to a worker at its hold
budget; then the one furthest behind in read-ahead for its weight). Counted pieces go to the `MixStream`,
whose runs the concat sequencer places in the order they come (`ConcatSequencer.append`); a
piece's tokens go once its last run is placed. After each batch, the `MixPoint` there travels
in the batch's slot (its buffer area) as JSON: the state's `mixture.point`, and where a heal
or an idle release starts again.

What is said once: a schedule's stage that begins (logged), a source that ends (warned).
A mix that ends (every source with a weight has read its `max_epochs`, or the mix waits for a
source that read a whole epoch and most of another without a document) stops taking documents
there: every complete batch before is placed and announced, then `Ended` tells the trainer
why, which it raises as a `DataError` once it has taken them (the partial last batch is not
made). So the batches before the end are the same whatever the workers and the timing. A mix
that stops at a piece that cannot be read (packing/mix.py) says its error the same way, once
the batches that do not need it (nor the token after them) are announced.
"""
from __future__ import annotations

import json
import zlib

from ..data.mixture import Mixer
from ..data.order import RAMP
from ..position import Position
from .base import MAX_IN_FLIGHT, Complete, Mode
from .concat import ConcatMode, ConcatSequencer, Places
from .mix import MixStream, point_at
from .mixfeed import MixFeed, Said, start_points


class MixConcatMode(ConcatMode):
    """Concat placing a mixture's runs (the module docstring says how pieces are handed out)."""

    def __init__(self, cfg, run, n_workers: int, pieces):
        Mode.__init__(self, n_workers, cfg, run.layout.window, run.layout.n_slots)
        mix, window = run.mixture, run.layout.window
        point, starts = start_points(mix, run.rank)
        # the document the next token is in comes first, its tokens before the point dropped (not if its
        # source is left out now: then the mix starts at a document's start)
        first = point.source if point is not None and point.skip and point.source in _read(mix) else None
        skip = point.skip if first is not None else 0
        self.seq = ConcatSequencer(window, run.layout.n_slots, skip)
        if point is not None:
            mixer = Mixer.resume(mix.mixture, point.mixer, mix.first_batch).mixer
        else:
            mixer = Mixer(mix.mixture, mix.first_batch)
        self.stream = MixStream(mixer, starts, lambda tokens: mix.first_batch + (tokens - skip) // window, first)
        self.feed = MixFeed(mix, self.stream, starts, pieces, RAMP, cfg.max_piece_docs, self._in_flight.keys,
                            stopping=self._flow)
        self._lo = {r.name: r.lo for r in mix.ranges}          # each source's first file in the run's numbering
        self.said = Said(self.stream)
        self.pieces = self.feed.feed()
        self._flow()  # a state saved at the mix's end starts over (`Mixer.over`): it ends before any piece

    def can_take(self, worker: int) -> bool:
        pick = self.feed.pick()
        if pick is None:
            return False
        if pick.needed:  # past the hold budget: only the mix can free it, and the mix waits for this
            return sum(1 for w, _ in self._in_flight.values() if w == worker) < MAX_IN_FLIGHT
        return super().can_take(worker)

    # ---- counts, runs and batches

    def counted(self, msg):
        piece = self.specs.pop(msg.piece)
        self._counted_by(self.owner[msg.piece], piece, int(msg.lengths.sum()))
        self.feed.counted(msg.piece, piece, msg.lengths)
        self._flow()
        return piece

    def failed(self, index: int, error) -> bool:
        self._forget(index)
        if not self.feed.failed(index, error):
            return False
        self._flow()
        return True

    def _flow(self):
        """The runs the mix can make now, into the sequencer; a mix that waits for a source
        without documents, or has nothing left to read, ends (`Ended` once its batches are out)."""
        self.feed.flow()
        for run in self.stream.runs():
            self.seq.append(run.piece.index, run.lengths, run.base, run.last, tag=run)
            self.feed.used(run)
        if self.stream.finished is not None:
            self.seq.finished = True

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
            skip = where.skip + (p.skip if row == 0 else 0)  # a piece's first row lacks the tokens it skipped
            out.append(Complete(k, Position(p.epoch, p.file, p.rg, p.doc_start + row, skip),
                                point_at(run, row, skip), self.seq.docs_at.pop(k)))
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
        """The `MixPoint` after the batch, as the state's JSON text and its crc32."""
        text = point_text(done.runs, self._lo)
        return text, zlib.crc32(text.encode())

    def messages(self):
        seq = self.seq
        over = seq.finished or self.stream.stopped is not None
        return self.said.messages(over and seq.book.announced >= seq.complete_before())


def point_json(point, lo: dict) -> dict:
    """A `MixPoint` (in the run's numbering of the files) as the state's JSON, files numbered
    within each source (`lo`: each source's first file in the run's numbering)."""
    local = {n: p._replace(file=p.file - lo[n]) if n in lo else p for n, p in point.sources.items()}
    return point._replace(sources=local).to_json()


def point_text(point, lo: dict, **more) -> str:
    """`point_json` and the keys `more`, as compact JSON text."""
    return json.dumps({**point_json(point, lo), **more}, separators=(",", ":"), sort_keys=True)


def _read(mix) -> set:
    """The sources a run reads (a state's left-out ones are not)."""
    return {r.name for r in mix.ranges}
