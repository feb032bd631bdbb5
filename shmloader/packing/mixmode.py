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

import numpy as np

from ..data.mixture import Mixer
from ..data.order import RAMP
from ..position import Position
from .base import MAX_IN_FLIGHT, Complete, Mode
from .concat import ConcatMode, ConcatSequencer, Copies, Where
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
        self.seq = MixSequencer(window, run.layout.n_slots, skip)
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
        pick = self.feed.pick_now()
        if pick is None:
            return False
        if pick.needed:  # past the hold budget: only the mix can free it, and the mix waits for this
            return sum(1 for w, _ in self._in_flight.values() if w == worker) < MAX_IN_FLIGHT
        return super().can_take(worker)

    def take(self, worker: int, piece):
        super().take(worker, piece)
        self.feed.moved()

    # ---- counts, runs and batches

    def counted(self, msg):
        self.feed.moved()
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
        for stretch in self.stream.stretches():
            self.seq.add(stretch)
            for source, piece in stretch.used_up():
                self.feed.used_up(source, piece)
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
        """Every run's segments placed now, one `Copies` message per worker."""
        placed = self.seq.placements()
        if not placed:
            return
        segments = np.concatenate([seg for seg, _ in placed])
        done = [index for _, indices in placed for index in indices]
        pieces, at = np.unique(segments[:, 0], return_inverse=True)
        workers = np.array([self.owner[i] for i in pieces.tolist()], dtype=np.int64)[at]
        batches, at = np.unique(segments[:, 1], return_inverse=True)
        segments[:, 2] = np.array([take_slot(k) for k in batches.tolist()], dtype=np.int64)[at]
        by_worker = {w: ([], []) for w in np.unique(workers).tolist()}
        for index in done:
            by_worker.setdefault(self.owner[index], ([], []))[1].append(index)
        for w, (_, finished) in by_worker.items():
            mine = segments[workers == w]
            for index in finished:
                self._written_out(w, index)
                del self.owner[index]
            yield w, Copies(mine, tuple(finished))

    def holding(self, worker: int, orders) -> dict:
        """Every piece `worker` owns (not fully placed) or was sent an order for: whole."""
        out = Mode.holding(self, worker, orders)
        out.update((i, None) for i, w in self.owner.items() if w == worker)
        out.update((index, None) for order in orders for index in self.spec_pieces(order))
        return out

    @staticmethod
    def spec_pieces(order) -> set:
        """The pieces a `Copies` order reads or drops."""
        return set(order.segments[:, 0].tolist()) | set(order.done)

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


class _Span:
    """A `Stretch` of runs sequenced from stream position `start`: each run's start and end in
    the stream, how far it was placed, and how many of its runs are placed whole."""

    __slots__ = ("stretch", "start", "starts", "ends", "end", "placed", "done_runs", "done_sent", "docs_before")

    def __init__(self, stretch, start: int, docs_before: int):
        self.stretch, self.start, self.docs_before = stretch, start, docs_before
        tokens = stretch.arrays.tokens
        self.ends = start + np.cumsum(tokens)
        self.starts = self.ends - tokens
        self.end = int(self.ends[-1])
        self.placed = start       # stream position up to which segments were issued
        self.done_runs = 0        # its runs before this are placed whole (their pieces' done sent)
        self.done_sent = False


class MixSequencer(ConcatSequencer):
    """`ConcatSequencer` placing a mixture's runs a `Stretch` at a time, by arrays: a stretch is
    placed like a piece (its segments cut at its runs' ends and at the batches' ends), and a
    batch's end names the run it falls in (`Where.run`, a `Run` made when asked)."""

    def add(self, stretch):
        """Sequence a stretch of runs next."""
        span = _Span(stretch, self.next_start, self._docs)
        self._docs += int(stretch.arrays.docs.sum())
        self._seq.append(span)
        self.next_start = span.end

    def placements(self) -> list:
        """New write orders `(segments, done)`: segments `(piece, batch, 0, batch_offset,
        piece_offset, n)` a row (the slot is the mode's to fill in) and the pieces with no
        further tokens to place. Batches below `book.limit` may be written."""
        limit = self.book.limit * self.window
        out = []
        for s in self._seq:
            if s.done_sent:
                continue
            end = s.end
            lo, hi = max(s.placed, 0), min(end, limit)
            if hi <= lo < end:
                break  # the slots this stretch needs next are still in use
            segments = self._cut(s, lo, hi) if hi > lo else np.zeros((0, 6), dtype=np.int64)
            s.placed = max(s.placed, hi)
            s.done_sent = s.placed >= end
            done_runs = int(np.searchsorted(s.ends, s.placed, side="right"))
            st, a = s.stretch, s.stretch.arrays
            ended = np.flatnonzero(a.last[s.done_runs:done_runs]) + s.done_runs
            s.done_runs = done_runs
            done = [st.rows[a.which[i]].piece.index for i in ended.tolist()]
            if len(segments) or done:
                out.append((segments, done))
            if not s.done_sent:
                break
        return out

    def _cut(self, s: _Span, lo: int, hi: int) -> np.ndarray:
        """The segments of stream positions `[lo, hi)` of span `s`: one a run and a batch."""
        w, st, a = self.window, s.stretch, s.stretch.arrays
        first, stop = np.searchsorted(s.ends, lo, side="right"), np.searchsorted(s.starts, hi, side="left")
        cuts = np.unique(np.concatenate(([lo, hi], s.starts[first + 1:stop], np.arange(lo // w + 1, (hi - 1) // w + 1) * w)))
        at, n = cuts[:-1], np.diff(cuts)
        run = np.searchsorted(s.ends, at, side="right")        # the run holding each segment's first token
        k = at // w
        pieces = np.array([r.piece.index for r in st.rows], dtype=np.int64)[a.which[run]]
        out = np.column_stack((pieces, k, np.zeros_like(k), at - k * w, a.base[run] + at - s.starts[run], n))
        while self._opened <= k[-1]:  # segments go out in stream order: each batch's first one
            self.book.expect(self._opened, w)
            self._opened += 1
        return out

    def _position_after(self, k: int):
        """Where batch k ends, noting how many documents of the run began by then (`docs_at`)."""
        pos = (k + 1) * self.window
        for s in self._seq:
            if s.start <= pos < s.end:
                break
        else:
            if self.finished and pos == self.next_start:  # the last batch of a stream that ended
                self.docs_at[k] = self._docs
                return Where(-1, 0, 0)
            return None
        st, a = s.stretch, s.stretch.arrays
        i = int(np.searchsorted(s.ends, pos, side="right"))  # the run holding token pos
        rows, lo = st.rows[a.which[i]], int(a.row_lo[i])
        at = int(a.base[i]) + pos - int(s.starts[i])         # in the piece
        row = int(np.searchsorted(rows.before, at, side="right")) - 1
        skip = at - int(rows.before[row])
        self.docs_at[k] = (s.docs_before + int(a.docs[:i].sum()) + int(rows.docs_before[row] - rows.docs_before[lo])
                           + (1 if skip else 0))
        run = st.run(i)
        return Where(run.piece.index, row - lo, skip, run)
