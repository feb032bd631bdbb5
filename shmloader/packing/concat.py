"""Concat packing (nanochat's original loader): where every token of every piece lands, from
token counts alone.

The documents' tokens (`[BOS] + tokens`, one document after another in canonical order) form
one stream; batch k is the window of stream positions `[k*W, (k+1)*W)`, `W = B*T + 1`; its
inputs are the window's first B*T tokens and its targets the last B*T (docs/contract.md §2).
`ConcatSequencer` is pure bookkeeping over integers: it assigns each piece its stream offset
(piece i starts where piece i-1 ends, so the order of arrival cannot change the stream), cuts
each piece into per-batch segments once the batch may be written (at most `n_slots` batches
are written and not yet freed, `base.BatchBook`), and maps a stream position back to
(piece, document, token) for the resume state. Positions below zero are the tokens a resumed
run skips: they are never placed. Work per piece is O(batches it spans); per batch O(1).

The coordinator's view of it is concat's mode (`base.Mode`: packing/mixmode.py, `MixConcatMode`
over a mixture, `SourceConcatMode` over one source, the same code); a worker keeps a counted piece's
tokens as one array (`Held`, with its rows' lengths) and copies the segments a `Place` order names
(`write`), and with positions writes theirs beside them (packing/positions.py);
`ConcatLocator` finds the position at a batch count from document lengths (a rank given
another rank's state); `PACKING` is the spec the rest of the loader reads. See NOTE [ring
protocol] in ipc/protocol.py.
"""
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from ..position import Position, RowGroup
from .base import BatchBook, Found, InOrder, Packing
from .positions import fill_segment


class Place(NamedTuple):
    """Coordinator -> worker: copy these segments of piece `piece`'s tokens into the slots."""
    piece: int
    segments: list                 # [(batch, slot, batch_offset, piece_offset, n)]
    done: bool                     # the piece has no further tokens to place


class Copies(NamedTuple):
    """Coordinator -> worker: segments of several pieces' tokens in one message, as one array (a
    mixture's runs, placed by arrays: packing/mixmode.py), acknowledged by one `Written`: row
    `(piece, batch, slot, batch_offset, piece_offset, n)` a segment, in stream order; then the
    pieces in `done` have no further tokens to place."""
    segments: np.ndarray           # (n, 6) int64
    done: tuple

    def __reduce__(self):  # its segments as raw bytes: a third of the time to pickle an array
        return _copies, (self.segments.tobytes(), self.done)

    def counts(self) -> list:
        """`(batch, tokens)` the order writes, a batch each, in the batches' order."""
        seg = self.segments
        if not len(seg):
            return []
        k = seg[:, 1]
        opens = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))  # in stream order: a batch's
        batches = k[opens].tolist()                                       # segments follow each other
        if any(b <= a for a, b in zip(batches, batches[1:])):  # not in stream order: by batch
            batches, at = np.unique(k, return_inverse=True)
            return list(zip(batches.tolist(), np.bincount(at, weights=seg[:, 5]).astype(np.int64).tolist()))
        return list(zip(batches, np.add.reduceat(seg[:, 5], opens).tolist()))


@dataclass
class _Seq:
    index: int
    start: int
    cum_ends: np.ndarray  # end offset (relative to start) of each document row of the piece (a run's: a list)
    docs_before: int      # documents (non-null rows) of the pieces sequenced before this one
    end: int              # the stream position after its last token
    placed: int = field(default=0)  # stream position up to which segments were issued
    done_sent: bool = field(default=False)
    base: int = 0         # a run of a piece (a mixture, packing/mix.py): its first token's offset in the piece
    last: bool = True     # ... and whether the piece's tokens can go once it is placed
    tag: object = None    # ... and the run itself

    def docs_to(self, row: int) -> int:
        """Documents (non-null rows) among its rows before `row`."""
        return int(np.count_nonzero(np.diff(np.asarray(self.cum_ends[:row]), prepend=0))) if row else 0


class Where(NamedTuple):
    """Where a batch ends: the next token is token `skip` of row `row` of piece `piece`; `run`,
    the mixture's run that row is in (its row counts from the run's first), else None; `last`,
    the piece its last token is in (another one only when the batch ends with a document).
    Piece -1: the end of a stream that ended (`ConcatSequencer.finished`)."""
    piece: int
    row: int
    skip: int
    run: object = None
    last: int = -1


class ConcatSequencer:
    """Bookkeeping for one run. Call `counted`, `freed`, `written`; read `placements`, `ready`."""

    def __init__(self, window: int, n_slots: int, skip: int = 0):
        self.window = window
        self.book = BatchBook(n_slots)
        self.next_start = -skip   # stream position where the next sequenced piece begins
        self._counted = InOrder()  # counted pieces' cumulative lengths, sequenced in index order
        self.docs_at = {}         # batch -> documents of the run begun by its end, until read
        self._docs = -1 if skip else 0  # documents sequenced; one begun before the start is not
        #                                 the run's (its BOS is at a negative position)
        self._seq = deque()       # sequenced pieces still needed for placement or positions
        self.finished = False     # no piece or run comes after those sequenced (a mixture that ended)
        self._opened = 0          # batches < _opened have had a segment issued

    @property
    def next_index(self) -> int:
        """The next piece index to sequence."""
        return self._counted.next

    def counted(self, index: int, lengths: np.ndarray):
        """Piece `index` was tokenized: `lengths[i]` tokens for its i-th row (0 for a null)."""
        for i, lengths in self._counted.add(index, lengths):
            self.append(i, lengths)

    def passed(self, index: int, lengths: np.ndarray):
        """Piece `index`, the next of the order, was counted (`counted` for a caller that keeps the
        order itself: a `mixone.Passing`'s pieces come in it)."""
        self._counted.next = index + 1
        self.append(index, lengths)

    def append(self, index: int, lengths: np.ndarray, base: int = 0, last: bool = True, tag=None):
        """Sequence rows of piece `index` next, `lengths[i]` tokens each: the whole piece, or
        (a mixture's `Run`, `tag`) those of its tokens from `base`, `last` if no more follow."""
        if type(lengths) is list:  # a mixture's run: a few documents, cheaper as Python ints
            cum = list(accumulate(lengths))
            docs = len(lengths) - lengths.count(0)
        else:
            cum = np.cumsum(lengths, dtype=np.int64)
            docs = int(np.count_nonzero(lengths))
        end = self.next_start + (int(cum[-1]) if len(cum) else 0)
        s = _Seq(index, self.next_start, cum, self._docs, end, placed=self.next_start, base=base, last=last, tag=tag)
        self._docs += docs
        self._seq.append(s)
        self.next_start = s.end

    def freed(self, batch: int):
        """The trainer gave back batch `batch` (batches come back in any order)."""
        self.book.freed()

    def placements(self) -> list[tuple[int, list[tuple[int, int, int, int]], bool]]:
        """New write orders `(piece, [(batch, batch_offset, piece_offset, n), ...], done)`;
        `done` means the piece has no further tokens to place (a run's piece: its last run).
        Batches below `book.limit` may be written."""
        limit = self.book.limit * self.window
        orders = []
        for s in self._seq:
            if s.done_sent:
                continue
            end = s.end
            lo, hi = max(s.placed, 0), min(end, limit)
            if hi <= lo < end:
                break  # the slots this piece needs next are still in use
            segs = self._segments(s.start - s.base, lo, hi) if hi > lo else []
            s.placed = max(s.placed, hi)
            s.done_sent = s.placed >= end
            orders.append((s.index, segs, s.done_sent and s.last))
            if not s.done_sent:
                break
        return orders

    def _segments(self, start: int, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
        segs = batch_segments(start, lo, hi, self.window)
        if segs:
            last, w = segs[-1][0], self.window
            while self._opened <= last:  # segments go out in stream order: each batch's first one
                self.book.expect(self._opened, w)
                self._opened += 1
        return segs

    def written(self, batches: list[tuple[int, int]]):
        """A worker finished writing `n` tokens of batch `k` for each `(k, n)`."""
        self.book.written(batches)

    def ready(self) -> list[tuple[int, Where]]:
        """Batches now complete, in order, each with the position of the next token:
        `(batch, Where)`. A batch waits until the piece holding the token after it
        is sequenced, so that its position is the same in every run."""
        out = self.book.ready(self._position_after)
        self._prune()
        return out

    def _position_after(self, k: int):
        """Where batch k ends, noting how many documents of the run began by then (`docs_at`,
        before the pieces it needs can be pruned)."""
        pos = (k + 1) * self.window
        found = self._find(pos)
        if found is None:
            if self.finished and pos == self.next_start:  # the last batch of a stream that ended
                self.docs_at[k] = self._docs
                return Where(-1, 0, 0)
            return None
        s, row, skip = found
        self.docs_at[k] = s.docs_before + s.docs_to(row) + (1 if skip else 0)
        last = s if skip else (self._find(pos - 1) or (s,))[0]  # kept: it ends after the last announced
        return Where(s.index, row, skip, s.tag, last.index)

    def _find(self, pos: int):
        for s in self._seq:
            if s.start <= pos < s.end:
                rel = pos - s.start
                row = int(np.searchsorted(s.cum_ends, rel, side="right"))
                row_start = int(s.cum_ends[row - 1]) if row else 0
                return s, row, rel - row_start
        return None

    def complete_before(self) -> int:
        """How many batches the pieces sequenced so far make: those whose tokens and the token
        after them (where the position after the batch is) all lie before `next_start`; once
        `finished`, also the last one, which ends there."""
        end = max(self.next_start, 0) if self.finished else max(self.next_start - 1, 0)
        return end // self.window

    def oldest_live(self) -> int:
        """The smallest piece index the sequencer may still need."""
        return self._seq[0].index if self._seq else self.next_index

    def _prune(self):
        keep_from = self.book.announced * self.window
        while self._seq and self._seq[0].done_sent and self._seq[0].end <= keep_from:
            self._seq.popleft()


def batch_segments(start: int, lo: int, hi: int, window: int) -> list:
    """Stream positions `[lo, hi)` of tokens that begin at stream position `start` (`start <= lo`),
    cut at the batches' ends (every `window` positions): `(batch, batch_offset, offset from
    start, n)` a segment."""
    segs = []
    while lo < hi:
        k = lo // window
        n = min(hi, (k + 1) * window) - lo
        segs.append((k, lo - k * window, lo - start, n))
        lo += n
    return segs


def row_group_of(piece) -> RowGroup:
    """The row group `piece` (a `data.order.Piece`) is a slice of."""
    return RowGroup(piece.epoch, piece.file, piece.rg)


def position_at(piece, where: Where) -> Position:
    """The canonical position `where` (a batch's end, `ConcatSequencer.ready`) names in `piece`."""
    row = where.row
    skip = where.skip + (piece.skip if row == 0 else 0)  # its first row lacks the tokens it skipped
    return Position(piece.epoch, piece.file, piece.rg, piece.doc_start + row, skip)


def concat_tokens(shapes: list, batch: int) -> int:
    """Stream tokens before batch `batch` of a run with these [first batch, B, T] shapes."""
    total = 0
    for i, (first, B, T) in enumerate(shapes):
        end = shapes[i + 1][0] if i + 1 < len(shapes) else batch
        total += max(min(end, batch) - first, 0) * (B * T + 1)
    return total


class ConcatLocator:
    def __init__(self, shapes: list, batch: int, start, first: int = 0, skip: int = 0):
        """Replays batches `first` to `batch` from `start`, `skip` tokens into its document."""
        self.target, self.consumed = concat_tokens(shapes, batch) - concat_tokens(shapes, first), -skip
        self.total = batch - first
        self.result = Found(Position(start.epoch, start.file, start.rg, start.doc, skip), []) if self.target == 0 else None

    @property
    def done_batches(self) -> int:
        """Progress, in batches of the current shape (approximate across shapes)."""
        per = max(self.target // max(self.total, 1), 1)
        return min(self.consumed // per, self.total)

    def feed(self, piece, lengths: np.ndarray):
        if self.result is not None:
            return
        cum = np.cumsum(lengths, dtype=np.int64)
        rel = self.target - self.consumed
        if len(cum) and rel < cum[-1]:
            row = int(np.searchsorted(cum, rel, side="right"))
            skip = rel - (int(cum[row - 1]) if row else 0)
            skip += piece.skip if row == 0 else 0
            self.result = Found(Position(piece.epoch, piece.file, piece.rg, piece.doc_start + row, int(skip)), [])
        self.consumed += int(cum[-1]) if len(cum) else 0


def _locator(cfg, run) -> tuple:
    start = run.start
    return (ConcatLocator(start.locate.shapes, start.locate.until, start.position, start.batch, start.position.skip),
            cfg.max_piece_docs)


@dataclass(frozen=True)
class Held:
    """What a worker keeps of a counted piece until `Place` has copied it: its tokens end to
    end, its rows' lengths and how many tokens into its document its first row starts (an
    elastic resume's piece), so that it can say each token's position (`ends`: made on the
    first call, by a run with positions only)."""
    tokens: np.ndarray
    lengths: np.ndarray
    first: int

    @cached_property
    def ends(self) -> np.ndarray:
        """Each row's end in `tokens` (cumulative lengths)."""
        return np.cumsum(self.lengths)


def _keep(tokens: np.ndarray, lengths: np.ndarray, first: int = 0):
    """A worker keeps a counted piece's tokens as one array, until `Place` has copied them."""
    return Held(tokens, lengths, first) if len(tokens) else None


def write(slots: np.ndarray, held: dict, order: Place, B: int, T: int, positions: np.ndarray | None = None) -> list:
    """A worker copies the segments of one piece's token stream, and with `positions` (the
    ring's positions areas) those of its inputs' tokens (packing/positions.py); drops the
    piece when `done` (`Copies`: several pieces' segments, then the pieces done)."""
    if type(order) is Copies:
        return _copy(slots, held, order, B * T, positions)
    kept, counts, inputs = held.get(order.piece), [], B * T
    for k, slot, off, src, n in order.segments:
        slots[slot, off:off + n] = kept.tokens[src:src + n]
        if positions is not None and off < inputs:  # the window's last token is a target only
            fill_segment(positions[slot, off:min(off + n, inputs)], kept.ends, kept.first, src)
        counts.append((k, n))
    if order.done:
        held.pop(order.piece, None)  # a piece without tokens was never held
    return counts


def _copies(segments: bytes, done: tuple) -> Copies:
    """A `Copies` from its pickle (`Copies.__reduce__`)."""
    return Copies(np.frombuffer(segments, dtype=np.int64).reshape(-1, 6), done)


def _copy(slots: np.ndarray, held: dict, order: Copies, inputs: int, positions: np.ndarray | None) -> list:
    """A mixture's order: some hundred segments a batch (a run a document when the sources
    alternate), so each one's copy is a slice of its slot's row (taken once), not of `slots`."""
    rows = {}
    for index, _, slot, off, src, n in order.segments.tolist():
        kept, row = held[index], rows.get(slot)
        if row is None:
            row = rows[slot] = slots[slot]
        row[off:off + n] = kept.tokens[src:src + n]
        if positions is not None and off < inputs:  # the window's last token is a target only
            fill_segment(positions[slot, off:min(off + n, inputs)], kept.ends, kept.first, src)
    for index in order.done:
        held.pop(index, None)  # a piece without tokens was never held
    return order.counts()


PACKING = Packing(
    name="concat", locator=_locator, order=Place, keep=_keep, write=write,
    order_pieces=lambda order: (set(order.segments[:, 0].tolist()) | set(order.done)) if type(order) is Copies
    else (order.piece,),
    orders=(Copies,),
    window=lambda B, T: B * T + 1,     # the window's inputs and targets overlap by all but a token
    targets_at=lambda B, T: 1,
    stats=lambda counters: {})
