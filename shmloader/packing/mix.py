"""A mixture's stream: counted pieces of several sources, interleaved document by document by
the mixing rule (data/mixture.py), as *runs* a packing places; pure.

Each source has its own canonical order of pieces (its files, its row groups by rank, its
epochs), counted in any order (`counted(source, seq, piece, lengths)`, `seq` its place in
its source's order). Whenever the next document of every source taking part is counted, the
`Mixer` picks the next document's source; consecutive documents of one piece picked in a row
(in one counting stage) form a `Run`: rows `[row_lo, row_hi)` of one piece, whose tokens are
`[base, base + tokens)` of what the worker holding that piece keeps. A packing places runs
in the order they come, as it places a single source's pieces (one run a piece). Null rows
(0 tokens) are no documents: they ride in the run before them, and a piece of nulls only is
one empty run, so that every piece ends with a run that says it is its `last`.

The rule is decided a *block* at a time: while every source's head piece stays and the stage
does not change, one call (`Mixer.picks`) decides every document up to the first head used up
(or the limit, or the stage's end), and the block's runs come out as one `Stretch` of arrays
(packing/mixruns.py), the runs a document at a time would make (`_take`, kept for a resumed
cut document; tests/unit/packing/test_mix_stream.py checks the two against each other). The
coordinator so does per block what it did per document: the rule about 0.35 µs a document, a
replay of concat's whole mode 2.2 µs a document against 8.3 before (docs/benchmarks.md
"Mixtures"). Where one source takes part (a mixture of one; or one left beside sources that
ended) the rule picks it every time, so its block is its head's next documents, to the piece's
end (concat: the whole counted piece, one run) or its chunk's end (best fit), taken as slices of
the head's arrays without the rule's loop (`_one_source`): the same picks, no work a document.
(A pass-through, concat or best fit, does not come here at all: its pieces pass whole,
packing/mixone.py `passes`.)

The stream depends on the sources' document lengths only (the rule sees nothing else), so it
is the same for any number of workers and any order of arrival. A piece that cannot be read
(`unreadable`) stops it where the rule needs that piece's next document (`stopped`: its
error), whichever source's turn it then is, so that too depends on the lengths only (a block
ends where a head is used up, so the stop is found between blocks, as between documents).
Best fit's stream (`chunk`) also stops after a document that ends one of its source's chunks
(`ends_chunk`: its source's next document is in other rows `[k·chunk, (k+1)·chunk)` of its row
group or window, or another piece), so that a chunk of the mix never spans one of a source's
(packing/mixbestfit.py). Where it stands before any document (`Run.at`: every source's next
document and the mixer's state before the run's first pick, made from its block when asked) is
what a state keeps; `point_at(run, row, skip)` is that inside a run: a resumed mix starts every
source at its document and the mixer from its state, and the document the next token is in
comes first (with a new mixture too: it is not skipped).
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Mapping

import numpy as np

from ..data.mixture import Mixer
from ..position import Position
from .base import InOrder
from .mixruns import Block, MixPoint, Rows, Stretch, place, point_at  # noqa: F401  (point_at: the stream's, for callers)


NO_LIMIT = 1 << 62  # picks a block may make when `stretches` has no limit


class _Head:
    """A counted piece at the head of its source: its `Rows`, and those not yet in a run."""

    __slots__ = ("rows", "row", "covered", "ran")

    def __init__(self, rows: Rows):
        self.rows = rows
        self.row = 0                      # the next row that may hold a document
        self.covered = 0                  # the first row not in a run (nulls before `row`)
        self.ran = False                  # a run of it was made

    @property
    def piece(self):
        return self.rows.piece

    def skip_nulls(self):
        sizes, row = self.rows.sizes, self.row
        while row < len(sizes) and not sizes[row]:
            row += 1
        self.row = row


class MixStream:
    """Runs of a mixture's documents, in stream order (the module docstring says how).

    `starts`: each source's first piece's position (the position a source reads next before
    its first piece is counted). `batch_of(tokens)`: the batch that the stream's token at
    `tokens` (from the run's start) lands in, for the schedule."""

    def __init__(self, mixer: Mixer, starts: Mapping[str, Position], batch_of: Callable[[int], int],
                 first: str | None = None, cap: int | None = None, chunk: int | None = None):
        """`cap`: the mixer counts a document's tokens up to it (best fit: a row); `chunk`: the
        runs stop after a document that ends one of its source's chunks (best fit's
        `tokenizer_batch_size`: `ends_chunk`)."""
        self.mixer, self.batch_of = mixer, batch_of
        self.cap, self.chunk = cap, chunk
        self.chunk_ended = False         # the last `stretches` stopped after a document that ends a chunk
        self.names = tuple(mixer.mixture.names)
        self._arrived = {name: InOrder() for name in self.names}
        self._queue = {name: deque() for name in self.names}
        self._next = dict(starts)        # every source's next document, when its queue is empty
        self._out = []                   # runs made, not yet handed out
        self._open = None                # the run being made: (source, head, point)
        self._exhausted = set()          # sources whose order has no piece left (max_epochs)
        self.first = first               # the source whose document must come first (a resumed cut one)
        self.tokens = 0                  # tokens of the runs made
        self.notes: list = []            # what the loader says: stages begun, sources ended
        self.finished = None             # why the mix has ended (nothing left to read), once it has
        self.stopped = None              # the error of a piece it needs and cannot read, once it does
        self._unreadable = {}            # source -> (seq, error) of the first of its pieces that cannot be read
        self._room = None                # documents `runs` may still take (None: no limit)
        self.version = 0                 # grows whenever what the mix waits for or takes may change
        self._waiting = (-1, [])         # `waiting_for`'s answer at a version

    def counted(self, source: str, seq: int, piece, lengths: np.ndarray):
        """Piece `seq` of `source`'s order was counted: `lengths[i]` tokens for its row i."""
        self.version += 1
        for _, (p, n) in self._arrived[source].add(seq, (piece, np.asarray(lengths, dtype=np.int64))):
            self._queue[source].append(_Head(Rows(p, n)))

    def exhausted(self, source: str, pieces: int):
        """`source`'s order ends after its `pieces` first pieces: once they are read it ends, and
        its weight goes to the others."""
        self.version += 1
        self._exhausted.add((source, pieces))

    def unreadable(self, source: str, seq: int, error):
        """Piece `seq` of `source`'s order cannot be read (`error`): the mix stops when it needs it."""
        known = self._unreadable.get(source)
        if known is None or seq < known[0]:
            self.version += 1  # a plan that ran out tries again: the mix may stop there
            self._unreadable[source] = (seq, error)

    def waiting_for(self) -> list:
        """The sources taking part whose next document is not counted yet: the mix waits for them.
        Kept until the version changes (a coordinator asks at every piece it hands out, a feed at
        every count): whatever changes the answer changes the version, and so does asking, where
        it passes pieces used up."""
        if self._waiting[0] == self.version:
            return list(self._waiting[1])
        if self.finished is not None or self.stopped is not None:
            return []
        out = [name for name in self._taking_part() if self._head(name) is None and not self._ended(name)]
        self._waiting = (self.version, out)
        return list(out)

    def finish(self, why: str):
        """The mix ends here (`why`): no document is taken after the ones taken so far."""
        if self.finished is None and self.stopped is None:
            self.version += 1
            self.finished = why
            self._close()

    def _taking_part(self) -> list:
        """The sources the next pick is among (its batch's stage begun first); none once the mix
        has ended (`_goes_on`)."""
        if self.first is not None:
            return [self.first]
        if len(self.mixer.mixture.stages) > 1:
            self.enter(self.batch_of(self.tokens))
        return list(self.mixer.shares()) if self._goes_on() else []

    def _goes_on(self) -> bool:
        """Whether the mix can take another document: a mixer with no source left to read
        (`Mixer.over`: every source with a weight has ended, also in a state saved after that)
        ends the mix here, after what was taken."""
        if self.finished is None:
            why = self.mixer.over()
            if why is not None:
                self.finish(why)
        return self.finished is None

    def enter(self, batch: int):
        """The schedule's stage at `batch` begins, if it has not (said once); a stage whose every
        source has ended ends the mix here."""
        started = self.mixer.enter(batch)
        if self._goes_on() and started is not None:
            self.version += 1
            self._close()
            self.notes.append(f"mixture: stage from batch {started.first_batch}: "
                              + ", ".join(f"{n} {w:g}" for n, w in started.weights.items()))

    def _ended(self, source: str) -> bool:
        return any(name == source and self._arrived[name].next >= n and not self._queue[name]
                   for name, n in self._exhausted)

    def _head(self, source: str):
        """The counted piece holding `source`'s next document, or None. Pieces with no document
        left end here as they are passed (an empty run each, if none was made)."""
        queue = self._queue[source]
        while queue:
            head = queue[0]
            head.skip_nulls()
            if head.row < len(head.rows.sizes):
                return head
            queue.popleft()
            self.version += 1
            if self._open is not None and self._open[1] is head:
                self._close()
            elif not head.ran:
                self._out.append(self._run(source, head, len(head.rows.sizes), self._at()))
            p = head.piece
            self._next[source] = Position(p.epoch, p.file, p.rg, p.doc_end)
        return None

    def _at(self) -> tuple:
        """Where the mix stands now."""
        sources = dict(self._next)
        for name, queue in self._queue.items():
            if queue:
                sources[name] = (queue[0].piece, queue[0].row)
        return sources, self.mixer.snapshot()

    def _run(self, source: str, head: _Head, row_hi: int, at: tuple) -> Stretch:
        """The rows of `head` not in a run yet, to `row_hi` (the nulls after a run's documents are
        in it), as a run; `head` moves past them."""
        run = Stretch.one(source, head.rows, head.covered, row_hi, at)
        head.row = head.covered = row_hi
        head.ran = True
        return run

    def _close(self):
        """The run being made is done: its rows up to its head's next document."""
        if self._open is not None:
            source, head, at = self._open
            self._open = None
            self._out.append(self._run(source, head, head.row, at))

    def runs(self, limit: int | None = None) -> list:
        """The runs that can be made now, in stream order, as `Run`s (`stretches`)."""
        return [run for stretch in self.stretches(limit) for run in stretch.runs()]

    def stretches(self, limit: int | None = None) -> list:
        """The runs that can be made now, in stream order, as `Stretch`es; with `limit`, of at most
        that many documents (best fit takes the mix a chunk at a time: packing/mixbestfit.py)."""
        mixer = self.mixer
        self._room, self.chunk_ended = limit, False
        while self.finished is None and self.stopped is None and self._room != 0:
            names = self._taking_part()
            if self.finished is not None:
                break
            heads = {name: self._head(name) for name in names}
            ended = [name for name, head in heads.items() if head is None and self._ended(name)]
            if ended:  # their weights go to the rest; with no rest the next `_taking_part` ends the mix
                self.version += 1
                for name in ended:
                    note = mixer.end(name)
                    if note:
                        self.notes.append(note)
                if self.first in ended:
                    self.first = None
                continue
            if None in heads.values():
                self._stop_if_unreadable(heads)
                self._close()
                out, self._out = self._out, []
                return out
            if self.first is not None:  # a resumed run's cut document, without a pick
                source, self.first = self.first, None
                self._take(source, heads[source])
                continue
            self._pick_block(names, [heads[name] for name in names])
        if self._room == 0:  # the limit is reached: the run being made ends here
            self._close()
        out, self._out = self._out, []
        return out

    def _stop_if_unreadable(self, heads: dict):
        """The rule needs every source's next document: the mix stops if one of them is in a
        piece that cannot be read (every piece of that source before it is used up)."""
        for name, head in heads.items():
            seq, error = self._unreadable.get(name, (None, None))
            if head is None and seq == self._arrived[name].next:
                self.version += 1
                self.stopped = error
                return

    def end_point(self) -> MixPoint:
        """Where an ended mix stands: after its last document."""
        at_sources, snapshot = self._at()
        sources = {name: place(*w) if type(w) is tuple else w for name, w in at_sources.items()}
        return MixPoint(self.names[0], 0, sources, Mixer.state_of_snapshot(snapshot))

    def _pick_block(self, names: list, heads: list):
        """The rule for a block of documents while every source's head stays where it is and the
        stage does not change (`Mixer.picks`: one call, not one a document), as one `Stretch`: its
        runs are those a document at a time would make (`_take`), the mixer takes the same
        counts, and a run's `at` is made from the block when asked (mixruns.py)."""
        mixer, cap, rows = self.mixer, self.cap, [h.rows for h in heads]
        firsts = [int(r.docs_before[h.row]) for r, h in zip(rows, heads)]  # each head's next document
        limit = self._room if self._room is not None else NO_LIMIT
        if len(rows) == 1:  # one source taking part: every pick is its (the rule's loop not run)
            picked, counts, doc_rows, doc_lengths, nexts = _one_source(rows[0], firsts[0], limit, self.chunk)
        else:
            picked, counts, doc_rows, doc_lengths, nexts = _mixed(mixer, rows, firsts, limit, cap, self.chunk)
        if not len(picked):
            return
        m = self._in_stage(doc_lengths)
        if m == 0:
            return
        if self.chunk is not None:  # the block stops after the first document that ends a chunk
            j = first_end(rows, picked, doc_rows, nexts, self.chunk)
            if j < m:
                m, self.chunk_ended, self._room = j + 1, True, 0
        if m < len(picked):
            picked, doc_rows, doc_lengths = picked[:m], doc_rows[:m], doc_lengths[:m]
            counts = (m,) if len(rows) == 1 else tuple(np.bincount(picked, minlength=len(rows)).tolist())
        block = Block(self._at(), tuple(names), tuple(rows), tuple(firsts), cap, picked, counts, doc_rows, doc_lengths)
        self._emit(names, heads, block)
        for name, r, q, k, head in zip(names, rows, firsts, counts, heads):
            if k:
                before = r.rule(cap)[1]
                mixer.took(name, int(before[q + k] - before[q]), head.piece.epoch, documents=k)
        self.tokens += int(doc_lengths.sum())
        if self._room:
            self._room -= m

    def _in_stage(self, lengths: np.ndarray) -> int:
        """How many of the picks (their documents' `lengths`, in turn) the stage in force takes:
        a pick whose first token lands in a later stage's batch is not made (`batch_of` never
        goes down as tokens grow, so the first such pick is found by halving)."""
        mixture = self.mixer.mixture
        if len(mixture.stages) == 1:
            return len(lengths)
        stage, tokens = self.mixer.stage, self.tokens + np.cumsum(lengths)
        def changed(j: int) -> bool:  # pick j's first token lands in another stage
            return mixture.stage_at(self.batch_of(self.tokens if j == 0 else int(tokens[j - 1]))) != stage
        if changed(0):
            return 0
        lo, hi = 1, len(lengths)  # the first pick in another stage is in [lo, hi]; len(lengths): none is
        while lo < hi:
            mid = (lo + hi) // 2
            if changed(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _emit(self, names: list, heads: list, block: Block):
        """The block's runs as one `Stretch`, every run closed at its end (as `_take` would have
        closed them: at a used-up head, the limit, or the stage's end; its arrays are made when
        asked); the heads move past them."""
        first = None
        if self._open is not None:  # a run begun before the block (a resumed run's cut document)
            if self._open[1] is heads[int(block.picks[0])]:
                first = self._open[2]
                self._open = None
            else:
                self._close()
        self.version += 1
        stretch = Stretch(tuple(names), block.rows, block, first, tuple(h.covered for h in heads))
        for head, r, q, k in zip(heads, block.rows, block.firsts, block.counts):
            if k:
                head.row = head.covered = int(r.after[q + k - 1])
                head.ran = True
        self._out.append(stretch)

    def _take(self, source: str, head: _Head) -> bool:
        """The mix takes `source`'s next document (`head`'s); whether the head is used up."""
        self.version += 1
        if self._open is None or self._open[1] is not head:
            self._close()
            self._open = (source, head, self._at())
        length = head.rows.sizes[head.row]
        self.mixer.took(source, length if self.cap is None else min(length, self.cap), head.piece.epoch)
        self.tokens += length
        if self._room is not None:
            self._room -= 1
        row = head.row
        head.row += 1
        head.skip_nulls()
        size = len(head.rows.sizes)
        if self.chunk is not None and ends_chunk(head.piece.doc_start, row, head.row, size, self.chunk):
            self.chunk_ended, self._room = True, 0
        if head.row >= len(head.rows.sizes):  # the piece's last document: its run ends with it
            self._close()
            return True
        return False


def _one_source(rows: Rows, q: int, limit: int, chunk) -> tuple:
    """`_mixed`'s picks where one source takes part: the rule picks it every time (`Mixer.picks`
    with one share), so the block is its head's next documents, to the piece's end or the limit:
    slices of the head's arrays, no work a document."""
    m = min(limit, len(rows.live) - q)
    return (np.zeros(m, dtype=np.intp), (m,), rows.live[q:q + m], rows.doc_lengths[q:q + m],
            rows.after[q:q + m] if chunk is not None else None)


def _mixed(mixer: Mixer, rows: list, firsts: list, limit: int, cap, chunk) -> tuple:
    """`(picks, counts, doc_rows, doc_lengths, nexts)`: the rule's picks over heads `rows` (each
    source's next document at `firsts`), each pick's source as an array, the picks of each
    source, each pick's document's row, length and, with a `chunk`, the row after it (past the
    nulls)."""
    # a source's documents past the limit cannot be picked: no need to list them
    picks = mixer.picks([r.rule_list(cap)[q:q + limit] for r, q in zip(rows, firsts)], limit)
    if not picks:
        return np.zeros(0, dtype=np.intp), (), None, None, None
    # each source's picks take its next documents in turn, a slice of its head's from its
    # first: those slices end to end are the picks sorted by source (stably), so each pick's
    # document row and length are the slices' scattered back to the picks' order
    counts = tuple(picks.count(i) for i in range(len(rows)))
    picked = np.array(picks, dtype=np.intp)
    order = np.argsort(picked, kind="stable")

    def scattered(name: str) -> np.ndarray:
        out = np.empty(len(picks), dtype=np.int64)
        out[order] = np.concatenate([getattr(r, name)[q:q + k] for r, q, k in zip(rows, firsts, counts)])
        return out
    nexts = scattered("after") if chunk is not None else None
    return picked, counts, scattered("live"), scattered("doc_lengths"), nexts


def ends_chunk(start, row, after, size, chunk):
    """Whether the document at `row` of a piece of `size` rows starting at row `start` of its
    step (row group or shuffled window) ends one of its source's best-fit chunks (rows `[k·chunk,
    (k+1)·chunk)` of the step, as one source cuts them: packing/bestfit.py `Chunks`): its source's
    next document (at `after`, past the nulls) is in another chunk or another piece (a piece
    ends at a whole chunk or its step's end: data/order.py `cut_pieces(aligned=)`). Arrays or ints."""
    return (after >= size) | ((start + after) // chunk != (start + row) // chunk)


def first_end(rows: list, picked: np.ndarray, doc_rows: np.ndarray, nexts: np.ndarray, chunk: int) -> int:
    """The first of a block's picks whose document ends a chunk (`ends_chunk`; `nexts`: the row
    after each, past the nulls), or the number of picks."""
    if len(rows) == 1:
        return first_end_of(rows[0], int(doc_rows[0]), nexts, chunk)
    starts = np.array([r.piece.doc_start for r in rows], dtype=np.int64).take(picked)
    sizes = np.array([len(r.sizes) for r in rows], dtype=np.int64).take(picked)
    hits = np.flatnonzero(ends_chunk(starts, doc_rows, nexts, sizes, chunk))
    return int(hits[0]) if len(hits) else len(picked)


def first_end_of(rows: Rows, row: int, nexts: np.ndarray, chunk: int) -> int:
    """`first_end` of picks of one head `rows` (its next documents in turn, the first at `row`;
    `nexts`: the row after each, past the nulls): their rows rise, each pick's next row the row
    of the pick after it, so the first pick that ends a chunk is the first whose next row is
    past the first pick's chunk or at the piece's end: one search, not `ends_chunk` over every
    pick (a pass-through's chunks too: packing/mixchunks.py `PassingChunks`)."""
    start, size = rows.piece.doc_start, len(rows.lengths)
    bound = min(((start + row) // chunk + 1) * chunk - start, size)
    return int(nexts.searchsorted(bound, side="left"))
