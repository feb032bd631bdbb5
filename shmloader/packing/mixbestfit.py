"""Best fit over a mixture: the coordinator's mode when a best-fit run reads several sources.

The mixed stream (packing/mix.py: documents of every source interleaved by the mixing rule)
enters best fit's planner (packing/planner.py) a *chunk* at a time, as one source's does: a
chunk is the documents the mix picks (nulls are no documents), in any sources, up to the first
that ends one of its source's own chunks (rows `[k·c, (k+1)·c)` of its row group or shuffled
window, c = `tokenizer_batch_size`: its source's next document is in another of them;
packing/mix.py `ends_chunk`), and `c` documents at most. A mixture of one source so has one
source's chunks, plans and batches; with several, a chunk ends at whichever source's chunk ends
first (a chunk of two sources that alternate holds about half of each one's). The chunks
never span a piece of a source (its pieces end at whole chunks: data/order.py
`cut_pieces(aligned=)`) and depend on the sources' rows and lengths only. A run resumed from a
state of version 5 or 6 keeps that version's rule, the next `c` documents the mix picks, across
row groups (data/mixrules.py). The mix picks a chunk's documents when the planner asks for it (a
top-up before a placement, `MixChunks`), not before: so a schedule's stage applies to the documents that enter
the buffer from its first batch's plan on (a stage changes what enters; the buffer's ~1000
documents of the old weights are placed over the next batches). Chunks depend on the document
lengths only, so the plans are the same for any number of workers and any timing; a plan that
runs out of counted documents is undone and retried with the same chunks (the mix never
takes a document back), as for one source.

A mixture of one source that is a pass-through (packing/mixone.py `passes`) has no stream: its
chunks are cut from its counted pieces where the stream would cut them (`PassingChunks`), the
mixer told what each takes, the rest as above; the same chunks, points and buffers
(tests/unit/packing/test_mixone.py).

Pieces go out as packing/mixfeed.py says, within best fit's read-ahead cap on documents not yet
in the buffer (and past it for the source the mix waits for). A document's id is its piece's
base (pieces numbered in the order they are counted) plus its row; the worker holding a piece
keeps its documents until each is placed (packing/bestfit.py `write`).

Where a mixed best fit stands after batch k (`MixBuffer`): the `MixPoint` after the last chunk
its plans took (every source's next document, the mixer's state there; skip 0) and the buffer,
its documents by source, file (numbered within the source), row group and row, in arrival order.
Both are the state's `mixture.point`, one JSON text (`"buffer"` beside the point's keys, its runs
as best fit's buffer text of six values a run: `buffer_text`, `buffer_entries`); the batch's slot
carries them packed (`packed_buffer`: the point's values and the runs' bytes, marshalled), the
trainer making the text only when a state asks (packing/mixtext.py). A resume, a heal or an
idle release reads the buffer's documents first (pieces `0..n-1`, `order.buffer_pieces`),
rebuilds the planner from them, then goes on mixing from the point. A source left out at a resume whose documents are in the buffer is
refused (`buffer_runs`: its files are not listed any more). A piece that cannot be read stops
the mix where it needs the piece (packing/mix.py; one of the resumed buffer's, where the buffer
waits for it, as for one source): its error is said once a plan ran out there and every batch
planned is announced.
"""
from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from ..data import mixrules
from ..data.mixture import Mixer
from ..data.order import buffer_pieces, ramp_for
from .base import MAX_IN_FLIGHT, Complete, Mode
from .bestfit import BestFitMode, BestFitSequencer, Chunks, PieceTable, read_ahead_cap
from .mix import MixPoint, MixStream, first_end_of
from .mixruns import Rows, sources_at
from .mixfeed import MixFeed, Said, start_points
from .mixone import OneStream, passes
from .mixtext import packed_with_buffer, point_with_buffer_text
from .runs import decode, narrow


class MixBuffer(NamedTuple):
    """Where a mixed best fit stands after a batch: the mix's point after the last chunk planned,
    and the buffer as runs `[source, epoch, file, rg, row, count]` (the source's index in the
    sorted order of the first files of `lo`, the file numbered within it; `MixPieceTable.local_runs`)."""
    point: MixPoint
    runs: np.ndarray


BUFFER_RUN = ("source", "epoch", "file", "rg", "row", "count")  # a point's buffer run's values, in order


def buffer_entries(point: dict | None) -> list:
    """The buffer of a mixed best fit's point (its JSON's `"buffer"`: `{"sources": [names],
    "runs": text}`, the text as best fit's buffer text (packing/runs.py) of six values a run:
    the source's index in `sources`, epoch, file numbered within the source, row group, row,
    count) as `[source, epoch, file, rg, row, count]` runs; a malformed one is a ValueError."""
    value = (point or {}).get("buffer")
    if value is None:
        return []
    try:
        names, text = list(value["sources"]), value["runs"]
        runs = decode(text, per_run=len(BUFFER_RUN), field="mixture.point.buffer")[2].tolist()
        out = [[names[r[0]], *r[1:]] for r in runs]
    except (KeyError, TypeError, IndexError, AttributeError):
        raise ValueError(f"the mixture's buffer in the state is malformed: {str(value)[:80]!r} is not "
                         "{'sources': [names], 'runs': text of [source, epoch, file, rg, row, count] runs}") from None
    if any(r[5] < 1 for r in out):
        raise ValueError("the mixture's buffer in the state has an empty run")
    return out


def buffer_runs(point: dict | None, lo_of: dict) -> list:
    """The buffer of a mixed best fit's point (`buffer_entries`) as `[epoch, file, rg, row, count]`
    runs in the run's numbering (`lo_of`: each source's first file there). A malformed buffer,
    or one holding documents of a source not read now, is a ValueError naming it."""
    out = []
    for name, epoch, file, rg, row, count in buffer_entries(point):
        if name not in lo_of:
            raise ValueError(f"the state's best-fit buffer holds documents of mixture source {name!r}, which this "
                             "loader's mixture does not read: leaving out a source whose documents are in the "
                             "buffer is not built yet (keep it, with weight 0)")
        out.append([epoch, file + lo_of[name], rg, row, count])
    return out


class MixPieceTable(PieceTable):
    """`PieceTable` of a mixture's pieces: also each piece's source (its index in the sorted order
    of the first files of `lo`, each source's first file in the run's numbering), for a buffer's
    runs by source (`local_runs`) and a plan's tokens by source (`tokens_by_source`). A piece's
    leading values are made once whenever a piece comes or goes, not once a document (a batch's
    ~1000 buffered documents are ~1000 runs when the sources alternate)."""

    def __init__(self, lo: dict):
        super().__init__()
        self._firsts = np.array(sorted(lo.values()), dtype=np.int64)
        self._made = None             # the table's arrays the values below were made from
        self._lead = self._offsets = self._sources = None

    def _mix_tables(self):
        """`(bases, lead, offsets, sources)`: each live piece's first document id, its
        `[source, epoch, file within the source, rg, 0, 0]`, `doc_start - base` and source."""
        arrays = self._tables()
        if arrays is not self._made:
            _, _, table, _ = arrays
            sources = np.searchsorted(self._firsts, table[:, 1], side="right") - 1
            lead = np.zeros((len(table), 6), dtype=np.int64)  # a run's six values, row and count to fill
            lead[:, 0] = sources
            lead[:, 1] = table[:, 0]
            np.subtract(table[:, 1], self._firsts[sources], out=lead[:, 2])
            lead[:, 3] = table[:, 2]
            self._made, self._lead, self._offsets, self._sources = arrays, lead, table[:, 3].copy(), sources
        return arrays[0], self._lead, self._offsets, self._sources

    def local_runs(self, ids: np.ndarray) -> np.ndarray:
        """Documents `ids` (in arrival order) as runs `[source, epoch, file, rg, row, count]`, the
        file numbered within its source: `runs(ids)` (a run goes on while the next document is
        the next row of the same row group, also into another piece) with each run's leading
        values its piece's (`_mix_tables`), gathered only at the runs' starts."""
        n = len(ids)
        if not n:
            return np.zeros((0, 6), dtype=np.int64)
        bases, lead, offsets, _ = self._mix_tables()
        at = bases.searchsorted(ids, side="right")
        at -= 1
        rows = offsets.take(at)
        rows += ids
        new = np.empty(n, dtype=bool)
        new[0] = True
        np.not_equal(rows[1:], rows[:-1] + 1, out=new[1:])
        goes_on = np.flatnonzero(~new)  # few: a buffer's documents are mostly runs of one
        seam = goes_on[at.take(goes_on) != at.take(goes_on - 1)]  # the next row, in another piece
        if len(seam):
            new[seam] = (lead[at[seam]] != lead[at[seam - 1]]).any(axis=1)  # the same source, file and rg
        starts = np.flatnonzero(new)
        out = lead.take(at.take(starts), axis=0)
        out[:, 4] = rows.take(starts)
        np.subtract(starts[1:], starts[:-1], out=out[:-1, 5])
        out[-1, 5] = n - starts[-1]
        return out

    def tokens_by_source(self, ids: np.ndarray, tokens: np.ndarray) -> list:
        """The sum of `tokens` of documents `ids` by source, a Python int a source."""
        if len(self._firsts) == 1:  # every document is the one source's
            return [int(tokens.sum())]
        bases, _, _, sources = self._mix_tables()
        which = sources.take(bases.searchsorted(ids, side="right") - 1)
        return np.bincount(which, weights=tokens, minlength=len(self._firsts)).astype(np.int64).tolist()


def buffer_text(where: MixBuffer, lo: dict) -> str:
    """Where a mixed best fit stands as the state's JSON text: the point's keys (`mixtext.point_text`)
    and `"buffer"` (`buffer_entries` reads it), made with numpy: a batch's ~1000 buffered
    documents, a run each when the sources alternate, would cost a millisecond as JSON lists."""
    return point_with_buffer_text(where.point, lo, *_buffer_values(where.runs, lo))


def packed_buffer(where: MixBuffer, lo: dict) -> tuple:
    """`buffer_text` as a slot carries it: packed (`mixtext.packed_with_buffer`; the trainer makes
    the text when a state asks), or the text and its crc."""
    return packed_with_buffer(where.point, lo, *_buffer_values(where.runs, lo))


def _buffer_values(runs: np.ndarray, lo: dict) -> tuple:
    """`(names, width, raw)`: the sources' names in the order of their first files (a run's
    first value indexes them), and the runs' width and bytes (`runs.narrow`; "" and b"" for none)."""
    names = [name for _, name in sorted((first, name) for name, first in lo.items())]
    if not len(runs):
        return names, "", b""
    width, values = narrow(runs)
    return names, width, values.tobytes()


class MixChunks(Chunks):
    """The mixed stream as best fit's chunks: the next documents the mix picks up to the first
    that ends one of its source's chunks (a stream made with `chunk`: packing/mix.py
    `ends_chunk`), `chunk_docs` at most (version 6's rule, a stream without `chunk`: the next
    `chunk_docs`, data/mixrules.py), made when a plan asks for one (`_more`); each chunk's end is
    where the mix stands after it (`last_end`: `(run, row)` for `point_at`, after the last chunk a
    plan took)."""

    def __init__(self, stream: MixStream, chunk_docs: int, ids_of, start):
        """`ids_of(stretch)`: `(ids, lengths)` of the stretch's documents (`mixruns.Stretch`);
        `start`: the `MixPoint` the run starts from, or None."""
        super().__init__(chunk_docs, start)
        self.stream, self._ids_of = stream, ids_of
        self.rows = 0                 # rows (documents and nulls) the mix took into chunks
        self._pending = []            # (ids, lengths) of the chunk being formed
        self._pending_docs = 0
        self._end = None              # where the chunk being formed ends so far
        self.dry = False              # the mix ended and its every document is in a chunk a plan took

    def _more(self) -> bool:
        """One more chunk into the queue; False while the mix waits for a count (or has ended)."""
        while self._pending_docs < self.chunk_docs:
            stretches = self.stream.stretches(self.chunk_docs - self._pending_docs)
            for stretch in stretches:
                ids, lengths = self._ids_of(stretch)
                self.rows += stretch.rows_covered()
                if len(ids):  # a stretch with documents ends with a run of one (a block's last pick)
                    self._pending.append((ids, lengths))
                    self._pending_docs += len(ids)
                    run = stretch.last_run()
                    self._end = (run, run.row_hi)
            if self.stream.chunk_ended:
                break  # its last document ends one of its source's chunks
            if not stretches:
                if self.stream.finished is None or not self._pending_docs:
                    return False
                break  # the mix ended: its last documents are a shorter chunk
        return _queued(self)

    def _drained(self) -> bool:
        return self.stream.finished is not None

    def news(self):
        """A plan that ran out waits for the mix to change (`MixStream.version`: a count, a source
        that ends, the end, a piece that cannot be read): tried again at every turn, it ran out
        again about once a batch."""
        return self.stream.version

    def _ran_out(self):
        # after the mix ended the planner placed what its buffer held; a row it cannot fill ends it
        self.dry = self.stream.finished is not None


def _queued(chunks) -> bool:
    """The documents `chunks` (a `MixChunks` or `PassingChunks`) gathered since its last chunk, as
    its next chunk, ending at its `_end` (one stretch's or piece's, the usual chunk, as they are)."""
    if len(chunks._pending) == 1:
        ids, lengths = chunks._pending[0]
    else:
        ids = np.concatenate([i for i, _ in chunks._pending])
        lengths = np.concatenate([n for _, n in chunks._pending])
    chunks._queue.append((ids, lengths, chunks._end))
    chunks.docs += len(ids)
    chunks._pending, chunks._pending_docs = [], 0
    return True


class _Head:
    """A counted piece the pass-through takes chunks from: its `Rows` (as the stream reads it:
    its documents' rows `live`, the row after each past the nulls `after`, the mixer's count of
    the tokens before each, `rule(cap)`), the next document (`q`, an index into `live`) and the
    first row not taken (`covered`)."""

    __slots__ = ("rows", "before", "q", "covered")

    def __init__(self, piece, lengths: np.ndarray, cap: int):
        self.rows = Rows(piece, lengths)
        self.before = self.rows.rule(cap)[1]
        self.q = self.covered = 0


class PassingChunks(Chunks):
    """`MixChunks` of a pass-through (packing/mixone.py): its one source's counted pieces, in its
    order, cut where the stream cuts them (packing/mix.py: after the first document that ends one
    of its source's chunks, `first_end_of`, and `chunk_docs` at most; version 6's rule without
    `chunk`), the mixer told what it took a piece's part at a time, as the stream tells it a
    block (the same counts, so the same settled state), the chunk's end where the stream's last
    run ends (the row after its last document past the nulls); a piece's `Rows`, as the stream
    reads it, but no block or stretch."""

    def __init__(self, stream, chunk_docs: int, chunk, cap: int, bases: dict, used, start):
        """`chunk`: best fit's chunk rule (`mixrules.chunk`), None for version 6's; `cap`: the
        mixer counts a document's tokens up to it; `bases`: each counted piece's first id, dropped
        once the piece is used up; `used(source, piece)`: it is."""
        super().__init__(chunk_docs, start)
        self.stream, self.chunk, self.cap, self._bases, self._used = stream, chunk, cap, bases, used
        self.rows = 0                 # rows (documents and nulls) taken into chunks
        self._heads = deque()
        self._pending, self._pending_docs = [], 0
        self._end = None
        self.dry = False
        stream.holding = self._holding

    def _holding(self) -> bool:
        """Whether a counted piece has a document not taken (the mix does not wait then)."""
        return self._head() is not None

    def _head(self):
        """The first counted piece with a document not taken; those without one are used up."""
        heads = self._heads
        for piece, lengths in self.stream.passed():
            heads.append(_Head(piece, lengths, self.cap))
        while heads:
            head = heads[0]
            if head.q < len(head.rows.live):
                return head
            heads.popleft()
            self.stream.version += 1
            self._use_up(head)
        return None

    def _use_up(self, head: _Head):
        """`head`'s piece is used up (its rows not taken counted as taken)."""
        rows = head.rows
        self.rows += len(rows.lengths) - head.covered
        del self._bases[rows.piece.index]
        self._used(self.stream.name, rows.piece)

    def _more(self) -> bool:
        """One more chunk into the queue; False while the mix waits for a count (or has ended)."""
        while self._pending_docs < self.chunk_docs:
            head = self._head()
            if head is None:
                if self.stream.finished is None or self.stream.stopped is not None or not self._pending_docs:
                    return False
                break  # the mix ended: its last documents are a shorter chunk
            if self._take(head, self.chunk_docs - self._pending_docs):
                break  # its last document ends one of its source's chunks
        return _queued(self)

    def _take(self, head: _Head, limit: int) -> bool:
        """`head`'s next documents into the chunk, `limit` at most, to the first that ends a chunk
        (whether one did)."""
        q, rows = head.q, head.rows
        live, after, piece = rows.live, rows.after, rows.piece
        m = min(limit, len(live) - q)
        ended = False
        if self.chunk is not None:  # as the stream cuts one head's picks
            j = first_end_of(rows, int(live[q]), after[q:q + m], self.chunk)
            if j < m:
                m, ended = j + 1, True
        taken = live[q:q + m]
        self._pending.append((taken + self._bases[piece.index], rows.lengths[taken]))
        self._pending_docs += m
        covered = int(after[q + m - 1])
        self.rows += covered - head.covered
        self._end = self.stream.took(piece, int(head.before[q + m] - head.before[q]), m, covered)
        head.q, head.covered = q + m, covered
        if covered == len(rows.lengths):  # its last document: the piece is used up with it
            self._heads.popleft()
            self._use_up(head)
        return ended

    def _drained(self) -> bool:
        return self.stream.finished is not None

    def news(self):
        return self.stream.version

    def _ran_out(self):
        self.dry = self.stream.finished is not None


class MixBestFitSequencer(BestFitSequencer):
    """`BestFitSequencer` whose chunks come from a mixture's stream (`MixChunks`)."""

    def __init__(self, cfg, n_slots: int, n_prefix: int, stream, start: MixPoint | None, used,
                 lo: dict, chunk=None):
        """`stream`: a `MixStream`, or a pass-through's `OneStream` (its chunks `PassingChunks`, cut by
        `chunk`, `mixrules.chunk`'s); `used(source, piece)`: each piece of the mix whose last run
        goes into a chunk; `lo`: each source's first file in the run's numbering."""
        super().__init__(cfg.B, cfg.T, n_slots, cfg.buffer_size, cfg.tokenizer_batch_size, n_prefix, (0, 0, 0, 0))
        self._used = used
        self.table = MixPieceTable(lo)
        self._names = [name for _, name in sorted((first, name) for name, first in lo.items())]
        self._bases = {}              # piece index -> the id of its row 0 (the mix's pieces)
        if type(stream) is OneStream:  # a pass-through (packing/mixone.py): no stream to take chunks from
            self.chunks = PassingChunks(stream, cfg.tokenizer_batch_size, chunk, cfg.T + 1, self._bases, used, start)
        else:
            self.chunks = MixChunks(stream, cfg.tokenizer_batch_size, self._ids_of, start)
        self.counted_rows = 0         # rows of the mix's pieces counted
        self._at_end = (None, None)   # the last chunk's end a point was made at, and its sources there

    def counted(self, piece, owner: int, lengths: np.ndarray):
        if piece.index < self.n_prefix:  # the resumed buffer: in order, as one source's
            super().counted(piece, owner, lengths)
            return
        self._bases[piece.index], _ = self._number(piece, owner, np.asarray(lengths, dtype=np.int64))
        self.counted_rows += len(lengths)

    def _ids_of(self, stretch) -> tuple:
        """The ids and lengths of a stretch's documents, in stream order (a document's id: its
        piece's base and its row)."""
        which, rows, lengths = stretch.documents()
        if len(stretch.rows) == 1:  # one piece's documents (a mixture of one's): one base
            ids = rows + self._bases[stretch.rows[0].piece.index]
        else:
            ids = np.array([self._bases[r.piece.index] for r in stretch.rows], dtype=np.int64)[which] + rows
        for source, piece in stretch.used_up():
            del self._bases[piece.index]
            self._used(source, piece)
        return ids, lengths

    def _complete(self, plan) -> Complete:
        """The batch's tokens of each source settle the mixer's counts (`Mixer.settle`) and the
        next batch's stage begins (whenever the mix would enter it, before its first pick: so the
        point is the same for any timing); the point after the last chunk planned, its mixer's
        state now, and the buffer."""
        stream = self.chunks.stream
        stream.mixer.settle(self._placed(plan))
        stream.enter(stream.batch_of(0) + 1)
        end = self.chunks.last_end
        if type(end) is tuple:  # (run, row): the mixer's state there is replaced by its state now
            if end is not self._at_end[0]:  # a batch whose plan took no chunk ends where the last one did
                self._at_end = end, sources_at(*end)
            point = MixPoint(end[0].source, 0, self._at_end[1], stream.mixer.state())
        else:
            point = end._replace(mixer=stream.mixer.state())
        buffer = self.table.local_runs(self.planner.buffered_ids())
        return Complete(self.planned, point.sources[point.source]._replace(skip=0), MixBuffer(point, buffer),
                        self.docs_placed)

    def _placed(self, plan) -> dict:
        """`{source: tokens}` the plan places in rows."""
        return dict(zip(self._names, self.table.tokens_by_source(plan.doc_id, plan.n_tokens)))


class MixBestFitMode(BestFitMode):
    """Best fit over a mixture (the module docstring says how)."""

    def __init__(self, cfg, run, n_workers: int, pieces):
        Mode.__init__(self, n_workers, cfg)
        mix = run.mixture
        point, starts = start_points(mix, run.rank)
        self._lo = {r.name: r.lo for r in mix.ranges}
        if point is not None:
            mixer = Mixer.resume(mix.mixture, point.mixer, mix.first_batch).mixer
            point = point._replace(sources=starts)  # in the run's numbering, as the points made here
        else:
            mixer = Mixer(mix.mixture, mix.first_batch)
        chunk = mixrules.chunk(mix.rules, cfg.tokenizer_batch_size)
        if passes(mix, mixer):  # one source, nothing to mix: chunks cut from its pieces (`PassingChunks`)
            self.stream = OneStream(mixer, starts, self._lo[mixer.mixture.names[0]], 0)
        else:
            # the mix picks a chunk when the planner asks for it: its stage is the batch being planned
            self.stream = MixStream(mixer, starts, lambda _: mix.first_batch + self.seq.planned, cap=cfg.T + 1,
                                    chunk=chunk)
        prefix = buffer_pieces(buffer_runs(mix.point, self._lo), cfg.max_piece_docs)
        self.seq = MixBestFitSequencer(cfg, run.layout.n_slots, len(prefix), self.stream, point,
                                       lambda *used: self.feed.used_up(*used), self._lo, chunk)
        ramp, cap = ramp_for(cfg.tokenizer_batch_size, cfg.max_piece_docs, cfg.buffer_size)
        self.feed = MixFeed(mix, self.stream, starts, pieces, ramp, cap, self._in_flight.keys, len(prefix))
        self.pieces = _chain(prefix, self.feed.feed())
        self.n_prefix = len(prefix)
        self.max_piece_docs = cfg.max_piece_docs
        self.cap = read_ahead_cap(cfg.buffer_size, cfg.max_piece_docs)
        self.assigned_docs = 0
        self.said = Said(self.stream)

    def can_take(self, worker: int) -> bool:
        """Best fit's read-ahead cap over the documents not yet in the buffer (also those the mix
        has not taken), past it for the source the mix waits for."""
        if self.pieces.handed >= self.n_prefix:  # the resumed buffer's pieces are out: the mix's
            pick = self.feed.pick_now()
            if pick is None:
                return False
            if pick.needed:
                return sum(1 for w, _ in self._in_flight.values() if w == worker) < MAX_IN_FLIGHT
        seq = self.seq
        waiting = seq.chunks.docs + seq.backlog_docs + seq.counted_rows - seq.chunks.rows + self.assigned_docs
        return Mode.can_take(self, worker) and (waiting < self.cap or (seq.starved and not self.assigned_docs))

    can_continue = Mode.can_continue  # no slices past the pair: the mix's feed decides what may be read ahead

    def failed(self, index: int, error) -> bool:
        if index < self.n_prefix:  # the resumed buffer's: in order, as for one source
            return BestFitMode.failed(self, index, error)
        self._forget(index)
        return self.feed.failed(index, error)

    def counted(self, msg):
        piece = BestFitMode.counted(self, msg)
        if piece.index >= self.n_prefix:
            self.feed.counted(piece.index, piece, msg.lengths)
            self.feed.flow()
        return piece

    def buffer_of(self, done: Complete):
        """The point and the buffer after the batch, packed (`packed_buffer`: the trainer makes the
        state's text from them when a state asks)."""
        return packed_buffer(done.runs, self._lo)

    def messages(self):
        seq = self.seq
        yield from BestFitMode.messages(self)  # a piece of the resumed buffer that cannot be read
        over = seq.chunks.dry or (self.stream.stopped is not None and seq.starved)
        yield from self.said.messages(over and seq.book.announced >= seq.planned)


class BestFitPlace:
    """A mixture's count-only place of best fit (packing/mixcount.py, `count_place` in
    `packing.MODES`): the point and buffer after batch `batch - 1` of the count, planned as a
    live run plans (`MixBestFitSequencer`, chunks picked when a plan asks), a batch at a time;
    its stream and its resumed buffer's pieces (`prefix`, re-read first) as `MixBestFitMode`'s."""

    def __init__(self, count, used):
        """`count`: a `mixcount.Count`; `used(source, piece)`: a piece whose last run went into a chunk."""
        cfg, mix, point, lo, first_batch = count.cfg, count.mix, count.point, count.lo, count.first_batch
        self.stream = MixStream(count.mixer, count.starts, lambda _: first_batch + self.seq.planned, cap=count.T + 1,
                                chunk=mixrules.chunk(mix.rules, cfg.tokenizer_batch_size))
        self.prefix = buffer_pieces(buffer_runs(mix.point, lo), cfg.max_piece_docs)
        self.cap = ramp_for(cfg.tokenizer_batch_size, cfg.max_piece_docs)[1]  # whole chunks
        place = SimpleNamespace(B=count.B, T=count.T, buffer_size=cfg.buffer_size,
                                tokenizer_batch_size=cfg.tokenizer_batch_size)
        self.seq = MixBestFitSequencer(place, 1, len(self.prefix), self.stream,
                                       point._replace(sources=count.starts) if point is not None else None, used, lo)
        self.batch = self.total = count.batch
        self._lo = lo
        self.result = None                    # the `Complete` of batch `batch - 1`, once planned

    @property
    def done_batches(self) -> int:
        return self.seq.planned

    def wants(self) -> bool:
        return self.result is None

    def counted(self, piece, lengths):
        self.seq.counted(piece, -1, lengths)

    def flow(self):
        seq = self.seq
        while self.result is None and seq.planned < self.batch:
            if not seq.plan():
                return
            done = seq._positions.pop(seq.planned - 1)
            seq.freed(seq.planned - 1)
            if seq.planned == self.batch:
                self.result = done

    def located(self) -> tuple:
        """`(position, the point's JSON text with the buffer)` of the `Located` answer."""
        return tuple(self.result.position), buffer_text(self.result.runs, self._lo)


class _chain:
    """The resumed buffer's pieces, then the mix's; `handed`: how many went out."""

    def __init__(self, first: list, then):
        self._first, self._then, self.handed = first, then, 0

    def __iter__(self):
        return self

    def __next__(self):
        self.handed += 1
        if self.handed <= len(self._first):
            return self._first[self.handed - 1]
        return next(self._then)
