"""Best fit's chunks of a run's stream, the sequencer's part (`bestfit.BestFitSequencer.chunks`)
that packing/mixbestfit.py's `mix_sequencer` and `source_sequencer` choose; pure.

The documents a run's stream gives enter best fit's planner a *chunk* at a time (packing/
mixbestfit.py's module docstring says which documents a chunk holds). Every run's chunks take
a resumed buffer's pieces in the sequencer's own order (`_Pulled.ordered`: counted into it in
index order, rebuilding its planner) and the others from the stream: a mix of several's
(`MixChunks`: the documents the mix picks when a plan asks), or a stream that passes one
source's pieces whole (`PassingChunks`: one source's run, its `mixone.Passing`, and a
pass-through's mix, its `OneStream`), which numbers what passes in its order and hands it to its
*cut*, a part chosen once: `RowCut` (one source's) or `DocumentCut` (a pass-through's); the two
differ in where a chunk ends and when a piece is cut (docs/design.md "The one pipeline", step 4,
"One source's best-fit pieces pass").
"""
from __future__ import annotations

from collections import deque

import numpy as np

from .bestfit import Chunks
from .mix import first_end_of
from .mixruns import Rows


class _Pulled(Chunks):
    """Best fit's chunks of a run's stream (`MixChunks`, `PassingChunks`): its counted pieces, the
    resumed buffer's in the sequencer's own order (`ordered`), the others the stream's, cut into
    chunks from what the stream takes, each piece's first id kept until the stream used it up
    (`bases`)."""

    def __init__(self, stream, chunk_docs: int, start, used, n_prefix: int):
        """`start`: where the run starts (a `MixPoint` or None; one source's `(epoch, file, rg, doc)`);
        `used(source, piece)`: each piece of the stream whose last document goes into a chunk (None:
        one source's, whose feed has no read-ahead to free);
        `n_prefix`: the resumed buffer's pieces (`ordered`)."""
        super().__init__(chunk_docs, start)
        self.stream, self._used, self._n_prefix = stream, used, n_prefix
        self._bases = {}              # piece index -> the id of its row 0 (the mix's pieces)
        self.rows = 0                 # rows (documents and nulls) the mix took into chunks
        self.counted_rows = 0         # rows of the mix's pieces counted
        self._pending = []            # (ids, lengths) of the chunk being formed
        self._pending_docs = 0
        self._end = None              # where the chunk being formed ends so far
        self.dry = False              # the mix ended and its every document is in a chunk a plan took

    def ordered(self, index: int) -> bool:
        """Whether piece `index` is of the sequencer's own order, the resumed buffer's
        (`0..n_prefix-1`): counted into it in index order (`seq.in_order`), one that cannot be
        read held until the sequencer needs it (the mode's `stops`); the others are the stream's
        (a counted piece is the feed's, one that cannot be read the stream's). The one place that
        says it: `arrive` and the mode (`MixBestFitMode.counted`, `failed`) ask it."""
        return index < self._n_prefix

    def arrive(self, seq, piece, owner: int, lengths: np.ndarray):
        """A counted piece of `seq` (a `BestFitSequencer`): the resumed buffer's into its own
        order (`seq.in_order`), the stream's as the chunks take it (`_took`)."""
        if self.ordered(piece.index):
            seq.in_order(piece, owner, lengths)
        else:
            self._took(seq, piece, owner, lengths)

    def _took(self, seq, piece, owner: int, lengths: np.ndarray):
        """A counted piece of the mix: numbered as it comes, for the stream to take (`_more`)."""
        self._bases[piece.index], _ = seq.number(piece, owner, lengths)
        self.counted_rows += len(lengths)

    def unnumbered(self) -> dict:
        """`{index: (piece, owner, lengths)}` of the stream's counted pieces not numbered yet
        (`BestFitSequencer.unplaced`): a mix's are numbered as they come."""
        return {}

    def unread(self) -> int:
        """Rows counted and not yet taken into a chunk (the read-ahead cap counts them)."""
        return self.counted_rows - self.rows

    def _drained(self) -> bool:
        return self.stream.finished is not None

    def news(self):
        """A plan that ran out waits for the mix to change (`MixStream.version`: a count, a source
        that ends, the end, a piece that cannot be read): tried again at every turn, it ran out
        again about once a batch."""
        return self.stream.version

    def _queue_pending(self) -> bool:
        """The documents gathered since the last chunk (`_pending`), as the next chunk, ending at
        `_end` (one stretch's or piece's, the usual chunk, as they are)."""
        if len(self._pending) == 1:
            ids, lengths = self._pending[0]
        else:
            ids = np.concatenate([i for i, _ in self._pending])
            lengths = np.concatenate([n for _, n in self._pending])
        self._queue.append((ids, lengths, self._end))
        self.docs += len(ids)
        self._pending, self._pending_docs = [], 0
        return True

    def _ran_out(self):
        # after the mix ended the planner placed what its buffer held; a row it cannot fill ends it
        self.dry = self.stream.finished is not None


class MixChunks(_Pulled):
    """The mixed stream as best fit's chunks: the next documents the mix picks up to the first
    that ends one of its source's chunks (a stream made with `chunk`: packing/mix.py
    `ends_chunk`), `chunk_docs` at most (version 6's rule, a stream without `chunk`: the next
    `chunk_docs`, data/mixrules.py), made when a plan asks for one (`_more`); each chunk's end is
    where the mix stands after it (`last_end`: `(run, row)` for `point_at`, after the last chunk a
    plan took)."""

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
        return self._queue_pending()

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


class PassingChunks(_Pulled):
    """Best fit's chunks of a stream that passes one source's counted pieces whole, in its order
    (packing/mixone.py `Passing`: one source's run, `OneStream`: a pass-through's mix): what passes
    is numbered in that order (once the resumed buffer is whole: consecutive ids are consecutive
    rows, `PieceTable.numbered_runs`) and cut into chunks by its `cut`, a rule chosen once where
    the chunks are made: `RowCut` (one source's: every `chunk_docs` rows of a piece a chunk, the
    nulls' empty ones too, cut as the piece passes, each ending at its rows' end) or
    `DocumentCut` (a pass-through's: the documents up to the first that ends one of its source's
    chunks, cut when a plan asks, the mixer told what each takes, each ending past its last
    document's nulls, as the mixed stream cuts them). The two cuts cannot be one without
    changing one's bytes: docs/design.md "The one pipeline", step 4, "One source's best-fit
    pieces pass", says which."""

    def __init__(self, stream, chunk_docs: int, start, used, n_prefix: int, cut):
        """`cut`: `RowCut`, or a `DocumentCut` (its chunk rule and the mixer's cap)."""
        super().__init__(stream, chunk_docs, start, used, n_prefix)
        self.cut = cut
        self._counted = {}            # index -> (piece, owner, lengths): counted, not numbered yet
        self._passed = []             # (piece, lengths) passed in order, not numbered yet
        self.pieces_numbered = 0      # pieces passed and numbered (`news`)

    def arrive(self, seq, piece, owner: int, lengths: np.ndarray):
        """A counted piece: the resumed buffer's into the sequencer's order, the stream's kept until
        it passes (the feed counted it into the stream first: `MixBestFitMode.counted`); then what
        passed is taken (`flow`)."""
        if self.ordered(piece.index):
            seq.in_order(piece, owner, lengths)
        else:
            self._counted[piece.index] = (piece, owner, lengths)
            self.counted_rows += len(lengths)
        self.flow(seq)

    def flow(self, seq):
        """What the stream passed since asked, to the cut (`cut.passed`); once the resumed buffer is
        whole (its pieces numbered first), numbered in its order and cut (`cut.numbered`)."""
        cut, passed = self.cut, self._passed
        for piece, lengths in self.stream.passed():
            passed.append((piece, lengths))
            cut.passed(self, piece, lengths)
        if passed and seq.next_index >= self._n_prefix:
            counted = self._counted
            for piece, lengths in passed:
                _, owner, _ = counted.pop(piece.index)
                base, live = seq.number(piece, owner, lengths)
                cut.numbered(self, piece, base, lengths, live)
            self.pieces_numbered += len(passed)
            passed.clear()

    def news(self):
        """A plan that ran out waits for a piece to pass (its documents are cut into chunks, now or
        when a plan asks) or the mix to end (its last chunk a shorter one): the pieces numbered,
        and the end (not every count: a piece that waits for an earlier one makes no chunk)."""
        return self.pieces_numbered, self.stream.finished

    def unnumbered(self) -> dict:
        """`{index: (piece, owner, lengths)}` of the pieces counted and not numbered yet (the
        sequencer's `unplaced` reads them)."""
        return self._counted

    def _more(self) -> bool:
        return self.cut.more(self)


class RowCut:
    """One source's cut (`PassingChunks.cut`): each piece, as it passes and is numbered, cut at once
    into chunks of `chunk_docs` rows from its first (`Chunks.add`: the nulls left out, a chunk of
    nulls alone an empty chunk), each ending at its rows' end; nothing made when a plan asks."""

    @staticmethod
    def passed(chunks: PassingChunks, piece, lengths: np.ndarray):
        pass

    @staticmethod
    def numbered(chunks: PassingChunks, piece, base: int, lengths: np.ndarray, live: np.ndarray):
        chunks.add(piece, base, lengths, live)
        chunks.rows += len(lengths)  # (one source's feed has no read-ahead to free: no `used`)

    @staticmethod
    def more(chunks: PassingChunks) -> bool:
        return False


class DocumentCut:
    """A pass-through's cut (`PassingChunks.cut`): its one source's counted pieces, in its order,
    cut where the mixed stream cuts them (packing/mix.py: after the first document that ends one
    of its source's chunks, `first_end_of`, and `chunk_docs` at most; version 6's rule without
    `chunk`) when a plan asks, the mixer told what it took a piece's part at a time, as the stream
    tells it a block (the same counts, so the same settled state), the chunk's end where the
    stream's last run ends (the row after its last document past the nulls); a piece's `Rows`,
    as the stream reads it, but no block or stretch."""

    def __init__(self, chunk, cap: int):
        """`chunk`: best fit's chunk rule (`mixrules.chunk`), None for version 6's; `cap`: the
        mixer counts a document's tokens up to it."""
        self.chunk, self.cap = chunk, cap
        self._heads = deque()

    def passed(self, chunks: PassingChunks, piece, lengths: np.ndarray):
        self._heads.append(_Head(piece, lengths, self.cap))

    @staticmethod
    def numbered(chunks: PassingChunks, piece, base: int, lengths: np.ndarray, live: np.ndarray):
        if len(live):  # (one without a document is used up before any plan asks)
            chunks._bases[piece.index] = base

    def holding(self, chunks: PassingChunks) -> bool:
        """Whether a piece passed has a document not taken (the mix does not wait then): the
        pass-through's `OneStream.waiting_for` asks it (packing/mixbestfit.py `mix_sequencer`
        sets its `holding`)."""
        return self._head(chunks) is not None

    def _head(self, chunks: PassingChunks):
        """The first piece passed with a document not taken; those without one are used up."""
        heads = self._heads
        while heads:
            head = heads[0]
            if head.q < len(head.rows.live):
                return head
            heads.popleft()
            chunks.stream.version += 1
            self._use_up(chunks, head)
        return None

    @staticmethod
    def _use_up(chunks: PassingChunks, head: _Head):
        """`head`'s piece is used up (its rows not taken counted as taken)."""
        rows = head.rows
        chunks.rows += len(rows.lengths) - head.covered
        chunks._bases.pop(rows.piece.index, None)
        chunks._used(chunks.stream.name, rows.piece)

    def more(self, chunks: PassingChunks) -> bool:
        """One more chunk into the queue; False while the mix waits for a count (or has ended)."""
        while chunks._pending_docs < chunks.chunk_docs:
            head = self._head(chunks)
            if head is None:
                if chunks.stream.finished is None or chunks.stream.stopped is not None or not chunks._pending_docs:
                    return False
                break  # the mix ended: its last documents are a shorter chunk
            if self._take(chunks, head, chunks.chunk_docs - chunks._pending_docs):
                break  # its last document ends one of its source's chunks
        return chunks._queue_pending()

    def _take(self, chunks: PassingChunks, head: _Head, limit: int) -> bool:
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
        chunks._pending.append((taken + chunks._bases[piece.index], rows.lengths[taken]))
        chunks._pending_docs += m
        covered = int(after[q + m - 1])
        chunks.rows += covered - head.covered
        chunks._end = chunks.stream.took(piece, int(head.before[q + m] - head.before[q]), m, covered)
        head.q, head.covered = q + m, covered
        if covered == len(rows.lengths):  # its last document: the piece is used up with it
            self._heads.popleft()
            self._use_up(chunks, head)
        return ended
