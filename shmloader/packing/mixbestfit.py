"""Best fit's one mode (`MixBestFitMode`), over a mixture or one source (`SourceBestFitMode`: the
same mode made of one source's parts, its only code its `__init__`; packing/bestfit.py says how one
source's chunks are cut, its table and its sink, `where_one_source_stands`). Below: a mixture's.

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
pieces pass whole (`OneStream`) and its chunks are cut from what passes where the stream would
cut them (`PassingChunks` with `DocumentCut`), the mixer told what each takes, the rest as
above; the same chunks, points and buffers (tests/unit/packing/test_mixone.py). One source's run
is the same path: its pieces counted into a `mixone.Passing` by its feed (`mixfeed.OrderFeed`, as
concat's one source's) and cut from what passes by the same `PassingChunks`, only its cut its own
(`RowCut`: every `tokenizer_batch_size` rows a chunk, the nulls' empty ones too, each ending at its
rows' end, so its states stay those of before; docs/design.md "The one pipeline", step 4, says
which bytes the two cuts differ in); a piece of its order that cannot be read stops its
`Passing` and is said by `Said`, as concat's.

The mode and its sequencer (`bestfit.BestFitSequencer`) are one for every kind of run: what
differs is their parts, chosen once where they are made (`mix_sequencer`: a mixture's chunks,
`MixPieceTable` and `MixSink`; `source_sequencer`: one source's `PassingChunks` with `RowCut`,
`PieceTable` and `bestfit.where_one_source_stands`; `MixBestFitMode._begin`: the stream, the feed,
what a worker may take, `PickFirst` or `CapAlone`, and the slot's sink; which pieces are the
sequencer's own order, the resumed buffer's, is its chunks' to say, packing/mixchunks.py), with no
flag tested in them; tests/unit/packing/test_bestfit_replay.py checks their every output against
main's two modes before they became one.

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
rebuilds the planner from them, then goes on mixing from the point. A source left out at a
resume whose documents are in the buffer is refused (`buffer_runs`: its files are not listed
any more). A piece that cannot be read stops the mix where it needs the piece (packing/mix.py;
one of the resumed buffer's, where the buffer waits for it, as for one source): its error is
said once a plan ran out there and every batch planned is announced.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from ..data import mixrules
from ..data.mixture import Mixer
from ..data.order import buffer_pieces, ramp_for
from ..ipc.protocol import Ended
from ..ipc.ring import Stat
from .base import MAX_IN_FLIGHT, Complete, Mode
from . import bestfit
from .bestfit import BestFitSequencer, PieceTable, placement_rows, read_ahead_cap
from .mix import MixPoint, MixStream
from .mixruns import sources_at
from .mixchunks import DocumentCut, MixChunks, PassingChunks, RowCut
from .mixfeed import MixFeed, OrderFeed, Said, start_points
from .mixone import OneStream, Passing, passes
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


def source_sequencer(B: int, T: int, n_slots: int, buffer_size: int, chunk_docs: int, n_prefix: int,
                     start_doc_end: tuple, stream: Passing) -> BestFitSequencer:
    """Best fit's sequencer made of one source's parts: the pieces its `stream` passes (a
    `mixone.Passing`, its first piece `n_prefix`: the feed counts them into it, then the
    sequencer, `MixBestFitMode.counted`) cut by `RowCut` from `start_doc_end` (the position
    `(epoch, file, rg, doc)` the run starts from), a `PieceTable` and
    `bestfit.where_one_source_stands`."""
    chunks = PassingChunks(stream, chunk_docs, start_doc_end, None, n_prefix, RowCut)
    return BestFitSequencer(B, T, n_slots, buffer_size, n_prefix, chunks=chunks, table=PieceTable(),
                            sink=bestfit.where_one_source_stands)


def mix_sequencer(cfg, n_slots: int, n_prefix: int, stream, start: MixPoint | None, used, lo: dict,
                  chunk=None) -> BestFitSequencer:
    """Best fit's sequencer made of a mixture's parts: its chunks pulled from `stream` (a
    `MixStream`'s `MixChunks`; a pass-through's `OneStream`'s `PassingChunks`, its `DocumentCut`
    by `chunk`, `mixrules.chunk`'s), a `MixPieceTable` and the `MixSink`. `used(source, piece)`: each piece of
    the mix whose last run goes into a chunk; `lo`: each source's first file in the run's numbering."""
    if type(stream) is OneStream:  # a pass-through (packing/mixone.py): its pieces pass whole
        cut = DocumentCut(chunk, cfg.T + 1)
        chunks = PassingChunks(stream, cfg.tokenizer_batch_size, start, used, n_prefix, cut)
        stream.holding = functools.partial(cut.holding, chunks)  # what its `waiting_for` asks
    else:
        chunks = MixChunks(stream, cfg.tokenizer_batch_size, start, used, n_prefix)
    return BestFitSequencer(cfg.B, cfg.T, n_slots, cfg.buffer_size, n_prefix, chunks=chunks, table=MixPieceTable(lo),
                            sink=MixSink(stream, lo))


class MixSink:
    """A mixture's sink of best fit's sequencer (`BestFitSequencer`'s `sink`): the `Complete` of the
    batch just planned, its position and `MixBuffer`. The batch's tokens of each source settle the
    mixer's counts (`Mixer.settle`) and the next batch's stage begins (whenever the mix would enter
    it, before its first pick: so the point is the same for any timing); the point after the last
    chunk planned, its mixer's state now, and the buffer."""

    def __init__(self, stream, lo: dict):
        self.stream = stream
        self._names = [name for _, name in sorted((first, name) for name, first in lo.items())]
        self._at_end = (None, None)   # the last chunk's end a point was made at, and its sources there

    def __call__(self, seq: BestFitSequencer, plan) -> Complete:
        stream = self.stream
        stream.mixer.settle(dict(zip(self._names, seq.table.tokens_by_source(plan.doc_id, plan.n_tokens))))
        stream.enter(stream.batch_of(0) + 1)
        end = seq.chunks.last_end
        if type(end) is tuple:  # (run, row): the mixer's state there is replaced by its state now
            if end is not self._at_end[0]:  # a batch whose plan took no chunk ends where the last one did
                self._at_end = end, sources_at(*end)
            point = MixPoint(end[0].source, 0, self._at_end[1], stream.mixer.state())
        else:
            point = end._replace(mixer=stream.mixer.state())
        buffer = seq.table.local_runs(seq.planner.buffered_ids())
        return Complete(seq.planned, point.sources[point.source]._replace(skip=0), MixBuffer(point, buffer),
                        seq.docs_placed)


class MixBestFitMode(Mode):
    """Best fit's mode, over a mixture (the module docstring says how) or one source
    (`SourceBestFitMode`: the same code, made of one source's parts). Documents are placed one
    by one by the planner; a piece leaves its worker's load when counted, and a global cap
    bounds the documents waiting to enter the buffer (`read_ahead_cap`: also those counted that
    the mix has not taken; past it for the source the mix waits for). Its parts, chosen once
    where it is made (`_begin`): the sequencer (`mix_sequencer`'s; one source's
    `source_sequencer`'s), whose chunks say which pieces are its own order (`_Pulled.ordered`: a
    resumed buffer's, counted into it in order, one that cannot be read held by `stops` and said
    once every piece before it is in and the resumed buffer waits for it, and every batch planned
    is announced), the rest the feed's (counted into its stream first, then the chunks take what
    it passes or mixes; one that cannot be read held by the stream: `Said`, one source's too);
    the stream the feed asks, the feed, what a worker may take
    (`reads`: `PickFirst`, a mix's feed decides, its pick first; `CapAlone`, one source's: the
    read-ahead cap alone, and on past the pair within it) and the sink of a batch's slot
    (`buffer_of`)."""

    def __init__(self, cfg, run, n_workers: int, pieces):
        Mode.__init__(self, n_workers, cfg)
        mix, first_batch = run.mixture, run.start.batch
        point, starts = start_points(run)
        self._lo = lo = {r.name: r.lo for r in mix.ranges}  # each source's first file in the run's numbering
        if point is not None:
            mixer = Mixer.resume(mix.mixture, point.mixer, first_batch).mixer
            point = point._replace(sources=starts)  # in the run's numbering, as the points made here
        else:
            mixer = Mixer(mix.mixture, first_batch)
        chunk = mixrules.chunk(mix.rules, cfg.tokenizer_batch_size)
        if passes(run, mixer):  # one source, nothing to mix: chunks cut from its pieces (`PassingChunks`)
            stream = OneStream(mixer, starts, lo[mixer.mixture.names[0]], 0)
        else:
            # the mix picks a chunk when the planner asks for it: its stage is the batch being planned
            stream = MixStream(mixer, starts, lambda _: first_batch + self.seq.planned, cap=cfg.T + 1,
                               chunk=chunk)
        prefix = buffer_pieces(buffer_runs(run.start.at.point, lo), cfg.max_piece_docs)
        seq = mix_sequencer(cfg, run.layout.n_slots, len(prefix), stream, point,
                            lambda *used: self.feed.used_up(*used), lo, chunk)
        ramp, cap = ramp_for(cfg.tokenizer_batch_size, cfg.max_piece_docs, cfg.buffer_size)
        feed = MixFeed(run, stream, starts, pieces, ramp, cap, self._in_flight.keys, len(prefix))
        self._begin(cfg, seq=seq, stream=stream, feed=feed, prefix=prefix, reads=PickFirst,
                    sink=lambda done: packed_buffer(done.runs, lo))

    def _begin(self, cfg, *, seq: BestFitSequencer, stream, feed, prefix: list, reads, sink):
        """The mode over its parts: `seq` the sequencer (its chunks say which pieces are its own
        order, `_Pulled.ordered`: counted into it, one that cannot be read held by `stops`; the
        rest the feed's), `stream` what the feed asks and `Said` reads (a `MixStream`, a
        `OneStream`, one source's `Passing`), `feed` what hands pieces out after the resumed
        buffer's (`prefix`: re-read first), `reads` what a worker may take and whether it may read
        on past the pair (`PickFirst`, `CapAlone`), `sink` what a batch's slot carries for the
        state (`Mode.buffer_of`): a mixture's point and buffer, packed; one source's buffer runs
        as text (`base.encode_buffer`)."""
        self.seq, self.stream, self.feed, self.reads = seq, stream, feed, reads
        self.pieces = _chain(prefix, feed.feed())
        self.n_prefix = len(prefix)
        self.max_piece_docs = cfg.max_piece_docs
        self.cap = read_ahead_cap(cfg.buffer_size, cfg.max_piece_docs)
        self.assigned_docs = 0           # documents assigned, not counted
        self.said = Said(stream)
        self.buffer_of = sink

    def take(self, worker: int, piece):
        Mode.take(self, worker, piece)
        self.assigned_docs += piece.n_docs
        self.cap = read_ahead_cap(self.seq.buffer_size, self.max_piece_docs, piece.n_docs, self.cap)

    def can_take(self, worker: int) -> bool:
        """Whether `worker` may take a piece: its `reads`' rule (`PickFirst`, `CapAlone`)."""
        return self.reads.can_take(self, worker)

    def can_continue(self, worker: int) -> bool:
        """Whether `worker` may take the next slice of the row group it holds past the pair of
        pieces (packing/affinity.py): its `reads`' rule."""
        return self.reads.can_continue(self, worker)

    def _within_cap(self, worker: int, pair: bool = True) -> bool:
        """Best fit's read-ahead cap over the documents not yet in the buffer (also those the mix
        has not taken), past it only while a plan waits for documents and none is being tokenized
        (a batch of many short documents can need more than the cap); then `Mode._room`'s rule
        (`pair`: at most the pair of pieces in flight, as `Mode.can_take`)."""
        return self._reading_ahead() and self._room(worker, pair)

    def _reading_ahead(self) -> bool:
        seq = self.seq
        waiting = seq.chunks.docs + seq.backlog_docs + seq.chunks.unread() + self.assigned_docs
        return waiting < self.cap or (seq.starved and not self.assigned_docs)

    def counted(self, msg):
        w, piece = self.owner.pop(msg.piece), self.specs.pop(msg.piece)
        self._counted_by(w, piece, 0)
        self.assigned_docs -= piece.n_docs
        if self.seq.chunks.ordered(piece.index):  # the resumed buffer's
            self.seq.counted(piece, w, msg.lengths)
        else:  # the feed's: into its stream, then the sequencer's chunks take what the stream passed
            self.feed.counted(piece.index, piece, msg.lengths)
            self.seq.counted(piece, w, msg.lengths)
            self.feed.flow()
        return piece

    def failed(self, index: int, error) -> bool:
        self._forget(index)
        if self.seq.chunks.ordered(index):  # the sequencer's own order's: held until it needs the piece
            self.stops.add(index, error)
            return True
        return self.feed.failed(index, error)

    def _forget(self, index: int):
        piece = Mode._forget(self, index)
        if piece is not None:
            self.assigned_docs -= piece.n_docs
        return piece

    def messages(self):
        seq = self.seq
        error = self.stops.due(self.stops.first() == seq.next_index and seq.stuck()
                               and seq.book.announced >= seq.planned)
        if error is not None:
            yield Ended(error.head)
        over = seq.chunks.dry or (self.stream.stopped is not None and seq.starved)
        yield from self.said.messages(over and seq.book.announced >= seq.planned)

    def freed(self, batch: int):
        self.seq.freed(batch)

    def orders(self, take_slot):
        for k, by_worker in self.seq.plan():
            slot = take_slot(k)
            for w, placements in by_worker.items():
                yield w, bestfit.Rows(k, slot, placements)  # a write order (mixruns' `Rows` are a piece's rows)

    def written(self, counts):
        self.seq.written(counts)

    def holding(self, worker: int, orders) -> dict:
        """The pieces `worker` was given and not counted (whole), and of the counted ones it owns
        the rows not yet placed and those of the orders it has not acknowledged."""
        out = Mode.holding(self, worker, orders)
        out.update(self.seq.unplaced(worker))
        for order in orders:
            for index, row, *_ in placement_rows(order.placements):
                out.setdefault(index, set()).add(row)
        return out

    def ready(self) -> list[Complete]:
        return self.seq.ready()

    def stats(self):
        row_tokens = self.seq.B * self.seq.row_len
        return (Stat.CROPPED, self.seq.tokens_cropped), (Stat.PLACED, self.seq.planned * row_tokens)


class SourceBestFitMode(MixBestFitMode):
    """Best fit's mode over one source's run (kinds.py `OneSource`): the same mode made of one
    source's parts. The resumed buffer's pieces are the sequencer's own order; its run's order
    (the coordinator's `pieces` from the run's start, with its elastic plan, its files added and
    its shuffle) is handed out by `mixfeed.OrderFeed` and counted into a `mixone.Passing` (as
    concat's one source's), whose pieces, as they pass in order, one source's chunks number and cut
    (`PassingChunks` with `RowCut`: consecutive ids are consecutive rows, packing/bestfit.py); a
    piece that cannot be read stops the `Passing` and is said by `Said`. Its pick is never
    asked: the read-ahead cap alone decides what a worker may take and a worker may read on past
    the pair within it (`CapAlone`). Its batches carry the buffer's runs (`Mode.buffer_of`)."""

    def __init__(self, cfg, run, n_workers: int, pieces):
        Mode.__init__(self, n_workers, cfg)
        prefix = buffer_pieces(run.start.at.runs, cfg.max_piece_docs)
        ramp, cap = ramp_for(cfg.tokenizer_batch_size, cfg.max_piece_docs, cfg.buffer_size)
        s = run.start.position
        one = Passing(first=len(prefix))  # the run's order after the resumed buffer's pieces
        seq = source_sequencer(cfg.B, cfg.T, run.layout.n_slots, cfg.buffer_size, cfg.tokenizer_batch_size,
                               len(prefix), (s.epoch, s.file, s.rg, s.doc), one)
        self._begin(cfg, seq=seq, stream=one, feed=OrderFeed(pieces(ramp, cap, len(prefix)), one), prefix=prefix,
                    reads=CapAlone, sink=self.buffer_of)


class PickFirst:
    """What a worker may take in a mixture's best fit (`MixBestFitMode.reads`): once the resumed
    buffer's pieces are out, the feed's pick first (none: nothing; one the mix waits for: up to
    `MAX_IN_FLIGHT` pieces in flight, past the read-ahead cap), else within the cap
    (`_within_cap`); no slice past the pair (`Mode.can_continue`)."""

    @staticmethod
    def can_take(mode: MixBestFitMode, worker: int) -> bool:
        if mode.pieces.handed >= mode.n_prefix:  # the resumed buffer's pieces are out: the feed's
            pick = mode.feed.pick_now()
            if pick is None:
                return False
            if pick.needed:
                return sum(1 for w, _ in mode._in_flight.values() if w == worker) < MAX_IN_FLIGHT
        return mode._within_cap(worker)

    @staticmethod
    def can_continue(mode: MixBestFitMode, worker: int) -> bool:
        return False


class CapAlone:
    """What a worker may take in one source's best fit (`SourceBestFitMode.reads`): the read-ahead
    cap alone decides (its feed is its order: nothing to weigh, no pick is needed, so it is not
    asked), and a worker may take the next slice of the row group it holds past the pair within
    the same cap (packing/affinity.py)."""

    @staticmethod
    def can_take(mode: MixBestFitMode, worker: int) -> bool:
        return mode._within_cap(worker)

    @staticmethod
    def can_continue(mode: MixBestFitMode, worker: int) -> bool:
        return mode._within_cap(worker, pair=False)


class BestFitPlace:
    """A mixture's count-only place of best fit (packing/mixcount.py, `count_place` in
    `packing.MODES`): the point and buffer after batch `batch - 1` of the count, planned as a
    live run plans (`mix_sequencer`'s, chunks picked when a plan asks), a batch at a time;
    its stream and its resumed buffer's pieces (`prefix`, re-read first) as `MixBestFitMode`'s."""

    def __init__(self, count, used):
        """`count`: a `mixcount.Count`; `used(source, piece)`: a piece whose last run went into a chunk."""
        cfg, run, point, lo, first_batch = count.cfg, count.run, count.point, count.lo, count.first_batch
        self.stream = MixStream(count.mixer, count.starts, lambda _: first_batch + self.seq.planned, cap=count.T + 1,
                                chunk=mixrules.chunk(run.mixture.rules, cfg.tokenizer_batch_size))
        self.prefix = buffer_pieces(buffer_runs(run.start.at.point, lo), cfg.max_piece_docs)
        self.cap = ramp_for(cfg.tokenizer_batch_size, cfg.max_piece_docs)[1]  # whole chunks
        place = SimpleNamespace(B=count.B, T=count.T, buffer_size=cfg.buffer_size,
                                tokenizer_batch_size=cfg.tokenizer_batch_size)
        self.seq = mix_sequencer(place, 1, len(self.prefix), self.stream,
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
