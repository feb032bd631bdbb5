"""What a mixture's stream hands a packing: runs of documents, made a block at a time; pure.

A `Run` is rows `[row_lo, row_hi)` of one counted piece, documents the mix picked in a row
(packing/mix.py says how they are made). The stream makes them a *block* at a time: while
every source's next document is known and the stage does not change, the rule decides a
whole block of documents in one call (`Mixer.picks`), and the block's runs come out as one
`Stretch`: arrays with an entry a run, which a packing places with whole-array calls (concat:
packing/mixmode.py; best fit: packing/mixbestfit.py) instead of a Python object a run. A
run's `at` (where the mix stood before it: what a state keeps) is made only when asked
(`where_at`: a batch's end asks once per batch): a block keeps the mix's place at its start
and its picks (`Block`), from which the place before any of them follows (`_picked_before`:
what the picks before one did to each source). A batch's end in a block (concat) makes its
point from where the mix stood at the block's start as a point holds it (`start_of`, made
once a block: the dict copies and the mixer's state cost more than the rest of a point)
and the picks before it (`point_of`).

`point_at(run, row, skip)` is the `MixPoint` inside a run: a resumed mix starts every source at
its document and the mixer from its state there.
"""
from __future__ import annotations

import itertools
from typing import Mapping, NamedTuple

import numpy as np

from ..data.mixture import Mixer
from ..position import Position


class MixPoint(NamedTuple):
    """A place in a mixed stream: the next token is `skip` tokens into the document that source
    `source` reads at `sources[source]`; every other source reads next at its `sources` entry;
    `mixer` is the mixer's state (`Mixer.state`) before that document was picked."""
    source: str
    skip: int
    sources: Mapping[str, Position]
    mixer: dict

    def to_json(self) -> dict:
        """Plain JSON; `"skips"`: the sources whose next document is one an old rank had cut at a
        change of world size, with the tokens of it read before (only while there are some)."""
        out = {"source": self.source, "skip": self.skip, "mixer": self.mixer,
               "sources": {name: list(p[:4]) for name, p in sorted(self.sources.items())}}
        skips = {name: p.skip for name, p in sorted(self.sources.items()) if p.skip}
        if skips:
            out["skips"] = skips
        return out

    @classmethod
    def from_json(cls, value: Mapping) -> "MixPoint":
        try:
            skips = value.get("skips", {})
            sources = {str(n): Position(*map(int, p), int(skips.get(n, 0))) for n, p in value["sources"].items()}
            point = cls(str(value["source"]), int(value["skip"]), sources, dict(value["mixer"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"the mixture's place in the state is malformed ({type(e).__name__}: {e}): "
                             f"{value!r}") from None
        if point.source not in sources or point.skip < 0:
            raise ValueError(f"the mixture's place in the state names source {point.source!r} (skip {point.skip}), "
                             f"not among its sources {sorted(sources)}")
        return point


class Run(NamedTuple):
    """Rows `[row_lo, row_hi)` of piece `piece` of source `source`, picked in a row: tokens
    `[base, base + lengths.sum())` of the piece's; `last`: no document of the piece comes
    after it; `at`: where the mix stood before its first row (`point_at` makes a `MixPoint`)."""
    source: str
    piece: object        # data.order.Piece
    row_lo: int
    row_hi: int
    base: int
    lengths: list        # tokens of each of its rows (0: a null)
    last: bool
    at: tuple            # `(sources, snapshot)`: every source's next document as a `Position` or
    #                      as `(piece, row)` of its head, and the mixer's `snapshot`; or an `At`

    @property
    def tokens(self) -> int:
        return sum(self.lengths)


class Rows:
    """A counted piece's rows, as the stream reads them (never changed once made): its lengths,
    as an array and as Python ints, its documents' rows (`live`, non-null) and lengths, the row
    after each document (past the nulls after it), the tokens before each row (`before`, one
    more entry: the piece's total) and the documents before each row (`docs_before`). A piece
    without nulls (the usual one) has its documents' rows and counts as ranges, not searched."""

    __slots__ = ("piece", "lengths", "sizes", "live", "before", "docs_before", "doc_lengths", "after", "_rule",
                 "_list")

    def __init__(self, piece, lengths: np.ndarray):
        self.piece, self.lengths = piece, lengths
        n = len(lengths)
        self.sizes = lengths.tolist()
        self.before = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.before[1:])
        if np.count_nonzero(lengths) == n:
            self.live = np.arange(n)
            self.docs_before = np.arange(n + 1)
            self.doc_lengths = lengths
            self.after = np.arange(1, n + 1)
        else:
            self.live = np.flatnonzero(lengths)
            self.docs_before = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths > 0, out=self.docs_before[1:])
            self.doc_lengths = lengths[self.live]
            self.after = np.append(self.live[1:], n)
        self._rule = self._list = None

    def rule(self, cap: int | None) -> tuple:
        """`(lengths, before)`: its documents' lengths as the mixer counts them (up to `cap`, the
        same every call) and the sum of those before each (one more entry: their total)."""
        if self._rule is None:
            lengths = self.doc_lengths if cap is None else np.minimum(self.doc_lengths, cap)
            if cap is None and len(lengths) == len(self.lengths):
                self._rule = lengths, self.before  # no nulls, no cap: its rows' sums
            else:
                before = np.zeros(len(lengths) + 1, dtype=np.int64)
                np.cumsum(lengths, out=before[1:])
                self._rule = lengths, before
        return self._rule

    def rule_list(self, cap: int | None) -> list:
        """`rule(cap)`'s lengths as Python ints (what `Mixer.picks` reads)."""
        if self._list is None:
            self._list = self.rule(cap)[0].tolist()
        return self._list


class Block(NamedTuple):
    """The rule's picks over fixed heads (packing/mix.py): where the mix stood at the block's
    start (`at`: `(sources, snapshot)`), the sources picked among (the shares' order), their
    heads' rows and each one's next document there (`firsts`, an index into its documents);
    each pick's source (an index into `names`), the picks of each source (`counts`), each
    picked document's row and length (in the order picked)."""
    at: tuple
    names: tuple
    rows: tuple          # `Rows` of each source's head
    firsts: tuple
    cap: int | None
    picks: np.ndarray
    counts: tuple
    doc_rows: np.ndarray
    doc_lengths: np.ndarray

    def before(self, j: int) -> list:
        """The picks of each source before pick `j`."""
        if len(self.names) == 1:  # one source: every pick is its
            return [j]
        return np.bincount(self.picks[:j], minlength=len(self.names)).tolist() if j else [0] * len(self.names)

    def nth(self, j: int) -> int:
        """Pick `j` is its source's how many-th (from 1)."""
        return int(np.count_nonzero(self.picks[:j + 1] == self.picks[j]))

    def last(self, i: int) -> int:
        """The pick that takes source i's last document of the block."""
        return int(np.flatnonzero(self.picks == i)[-1])


class At(NamedTuple):
    """A run's `at` inside a block: where the mix stood before the block's pick `j`."""
    block: Block
    j: int


def where_at(at, counts: bool = True) -> tuple:
    """`(sources, snapshot)` of a run's `at` (made from its block for an `At`); without `counts`,
    `(sources, None)`."""
    if type(at) is not At:
        return at if counts else (at[0], None)
    block, j = at
    sources, (stage, stage_batch, counted, totals, ended, mixer) = block.at
    sources, counted, totals = dict(sources), dict(counted), dict(totals)
    for name, moved in _picked_before(block, j, counts):
        sources[name] = (moved.piece, moved.row)
        if counts:
            _took(counted, totals, name, moved, tuple)
    return sources, (stage, stage_batch, counted, totals, ended, mixer) if counts else None


class Moved(NamedTuple):
    """What a block's picks before a pick did to one source: its next document is row `row`
    of `piece`, and it took `documents` documents, `tokens` as the rule counts them."""
    piece: object
    row: int
    documents: int
    tokens: int


def _took(counted: dict, totals: dict, name: str, moved: Moved, kind=tuple):
    """The mixer's counts after source `name`'s `moved` (into `counted` and `totals`, the
    caller's copies): its tokens counted, its totals `[tokens, documents, epoch]` (as `kind`)."""
    t = totals[name]
    counted[name] += moved.tokens
    totals[name] = kind((t[0] + moved.tokens, t[1] + moved.documents, moved.piece.epoch))


def _picked_before(block: Block, j: int, counts: bool = True):
    """`(name, Moved)` of each source the block's picks before pick `j` took from (without
    `counts`, tokens 0)."""
    if not j:
        return
    for name, rows, q, k in zip(block.names, block.rows, block.firsts, block.before(j)):
        if k:
            tokens = 0
            if counts:
                before = rows.rule(block.cap)[1]
                tokens = int(before[q + k] - before[q])
            yield name, Moved(rows.piece, int(rows.after[q + k - 1]), k, tokens)


class RunArrays(NamedTuple):
    """A stretch's runs, an entry a run: run i is rows `[row_lo[i], row_hi[i])` of the piece of
    the stretch's `rows[which[i]]`, its tokens `[base[i], base[i] + tokens[i])` of the piece's,
    `docs[i]` documents; `last[i]`: no document of its piece comes after it; `opened[i]`: the
    block's pick it begins with."""
    which: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray
    base: np.ndarray
    tokens: np.ndarray
    docs: np.ndarray
    last: np.ndarray
    opened: np.ndarray


class Stretch:
    """Runs made in a row: a block's (packing/mix.py), or one run. `sources[i]`, `rows[i]`: the
    source and the counted piece of each head it takes from, `covered[i]` the first row of it
    not in a run before the stretch; `first`: the `at` of a run begun before the block that its
    first run goes on with (a resumed cut document), else None. Its runs as arrays (`arrays`,
    what concat places) are made when first asked: best fit takes only its documents
    (`documents`), its rows (`rows_covered`), its pieces used up and its last run."""

    __slots__ = ("sources", "rows", "block", "first", "covered", "_arrays")

    def __init__(self, sources: tuple, rows: tuple, block: Block | None, first, covered: tuple,
                 arrays: RunArrays | None = None):
        self.sources, self.rows, self.block, self.first, self.covered = sources, rows, block, first, covered
        self._arrays = arrays

    @classmethod
    def one(cls, source: str, rows: Rows, row_lo: int, row_hi: int, at) -> "Stretch":
        """A single run."""
        b, d = rows.before, rows.docs_before
        arrays = RunArrays(np.zeros(1, dtype=np.intp), np.array([row_lo]), np.array([row_hi]), np.array([b[row_lo]]),
                           np.array([b[row_hi] - b[row_lo]]), np.array([d[row_hi] - d[row_lo]]),
                           np.array([row_hi == len(rows.sizes)]), np.zeros(1, dtype=np.intp))
        return cls((source,), (rows,), None, at, (row_lo,), arrays)

    @property
    def arrays(self) -> RunArrays:
        if self._arrays is None:
            self._arrays = _run_arrays(self.block, self.covered)
        return self._arrays

    def _ends(self) -> list:
        """Each head's first row not in a run after the stretch."""
        if self.block is None:
            return [int(self._arrays.row_hi[0])]
        b = self.block
        return [int(r.after[q + k - 1]) if k else c
                for r, q, k, c in zip(b.rows, b.firsts, b.counts, self.covered)]

    def rows_covered(self) -> int:
        """The rows (documents and nulls) of its runs."""
        return sum(e - c for e, c in zip(self._ends(), self.covered))

    def used_up(self) -> list:
        """`(source, piece)` of the pieces whose last run is here."""
        if self.block is None:
            return [(self.sources[0], self.rows[0].piece)] if self._arrays.last[0] else []
        return [(name, r.piece) for name, r, e in zip(self.sources, self.rows, self._ends()) if e == len(r.sizes)]

    def at(self, i: int):
        """Run i's `at`."""
        return self.first if i == 0 and self.first is not None else At(self.block, int(self.arrays.opened[i]))

    def run(self, i: int) -> Run:
        """Run i as a `Run`."""
        a = self.arrays
        w = int(a.which[i])
        rows, lo, hi = self.rows[w], int(a.row_lo[i]), int(a.row_hi[i])
        return Run(self.sources[w], rows.piece, lo, hi, int(a.base[i]), rows.sizes[lo:hi], bool(a.last[i]), self.at(i))

    def runs(self) -> list:
        return [self.run(i) for i in range(len(self.arrays.which))]

    def last_run(self) -> Run:
        """Its last run (made without the others)."""
        b = self.block
        if b is None:
            return self.run(0)
        picks = b.picks
        i, j = int(picks[-1]), len(picks) - 1
        if j and picks[j - 1] == i:  # a run of more than one pick: back to its first by one array call
            others = np.flatnonzero(picks[:j] != i)
            j = int(others[-1]) + 1 if len(others) else 0
        # n: that pick is the source's n-th (the source's picks from it on are the last run's)
        rows, q, n = b.rows[i], b.firsts[i], b.counts[i] - (len(picks) - j) + 1
        lo = self.covered[i] if n == 1 else int(rows.after[q + n - 2])
        hi = int(rows.after[q + b.counts[i] - 1])
        at = self.first if j == 0 and self.first is not None else At(b, j)
        return Run(self.sources[i], rows.piece, lo, hi, int(rows.before[lo]), rows.sizes[lo:hi],
                   hi == len(rows.sizes), at)

    def documents(self) -> tuple:
        """`(which, rows, lengths)`: each document's entry of `rows`, its row and its length, in
        stream order."""
        if self.block is not None and self.first is None:  # a block's picks, and only they
            return self.block.picks, self.block.doc_rows, self.block.doc_lengths
        a = self.arrays
        firsts = offsets(len(r.live) for r in self.rows)
        live = np.concatenate([r.live for r in self.rows])
        lo_docs = np.concatenate([r.docs_before for r in self.rows])[
            offsets(len(r.docs_before) for r in self.rows)[a.which] + a.row_lo]
        start = firsts[a.which] + lo_docs   # each run's first document in `live`
        ends = np.cumsum(a.docs)
        idx = np.repeat(start - (ends - a.docs), a.docs) + np.arange(int(ends[-1]) if len(ends) else 0)
        which, rows = np.repeat(a.which, a.docs), live[idx]
        return which, rows, np.concatenate([r.lengths for r in self.rows])[
            offsets(len(r.sizes) for r in self.rows)[which] + rows]


def _run_arrays(block: Block, covered: tuple) -> RunArrays:
    """A block's runs: a run a source's picks in a row, from the row after the source's pick
    before them (or its first row not in a run) to the row after its last pick."""
    picks, rows = block.picks, block.rows
    opened = np.flatnonzero(np.concatenate(([True], picks[1:] != picks[:-1])))  # each run's first pick
    closed = np.append(opened[1:], len(picks)) - 1                                # ... and its last
    which = picks[opened]
    starts = (offsets(len(r.live) for r in rows) + block.firsts)  # each head's next document
    nth = np.empty(len(picks), dtype=np.intp)      # each pick is its source's nth (from 1)
    for i in range(len(rows)):
        mine = picks == i
        nth[mine] = np.arange(1, np.count_nonzero(mine) + 1)
    n_open = nth[opened]
    after = np.concatenate([r.after for r in rows])
    row_hi = after[starts[which] + nth[closed] - 1]
    row_lo = np.where(n_open == 1, np.array(covered)[which], after[starts[which] + n_open - 2])
    at = offsets(len(r.before) for r in rows)[which]            # each run's piece in `before`
    before = np.concatenate([r.before for r in rows])
    docs_before = np.concatenate([r.docs_before for r in rows])
    base = before[at + row_lo]
    return RunArrays(which, row_lo, row_hi, base, before[at + row_hi] - base,
                     docs_before[at + row_hi] - docs_before[at + row_lo],
                     row_hi == np.array([len(r.sizes) for r in rows])[which], opened)


def offsets(sizes) -> np.ndarray:
    """Where each of parts of `sizes` begins in them end to end (made in Python: `np.cumsum` of a
    few ints costs some µs)."""
    return np.array(list(itertools.accumulate(sizes, initial=0))[:-1], dtype=np.int64)


def point_at(run: Run, row: int, skip: int) -> MixPoint:
    """Where the mix stands at token `skip` of row `row` of `run` (row_lo <= row < row_hi): the
    run's source reads that document, the mixer before it has taken the run's earlier rows."""
    before = run.lengths[:row - run.row_lo]
    at_sources, snapshot = where_at(run.at)
    mixer = Mixer.state_of_snapshot(snapshot)
    counted, totals = mixer["counted"], mixer["totals"]
    tokens, docs, _ = totals[run.source]
    counted[run.source] += sum(before)
    totals[run.source] = [tokens + sum(before), docs + len(before) - before.count(0), run.piece.epoch]
    return MixPoint(run.source, skip, _sources(run, row, at_sources), mixer)


class Start(NamedTuple):
    """Where the mix stood at a block's start, as a point holds it (`start_of`): every source's
    next document as a `Position` and the mixer's state (`Mixer.state_of_snapshot`)."""
    sources: dict
    mixer: dict


def start_of(block: Block) -> Start:
    """`Start` of `block` (its `at`), made once a block: its batches' points (`point_of`) each
    add the block's picks before theirs to it."""
    at_sources, snapshot = block.at
    return Start({n: place(*where) if type(where) is tuple else where for n, where in at_sources.items()},
                 Mixer.state_of_snapshot(snapshot))


def point_of(block: Block, j: int, skip: int, start: Start | None = None) -> MixPoint:
    """`point_at` at token `skip` of the document of the block's pick `j`, made from the block (no
    `Run`): the mix stood there as at the block's start (`start`, `start_of(block)`'s, which a
    caller asking for several points of one block keeps) after the block's picks before j (its
    run's earlier documents are the block's earlier picks of that source), the source's epoch
    its piece's."""
    if start is None:
        start = start_of(block)
    i = int(block.picks[j])
    name, rows, row = block.names[i], block.rows[i], int(block.doc_rows[j])
    sources, mixer = dict(start.sources), dict(start.mixer)
    counted, totals = dict(mixer["counted"]), {n: list(t) for n, t in mixer["totals"].items()}
    mixer["counted"], mixer["totals"] = counted, totals
    for n, moved in _picked_before(block, j):  # as `where_at`'s (`_took`)
        sources[n] = place(moved.piece, moved.row)
        _took(counted, totals, n, moved, list)
    totals[name][2] = rows.piece.epoch
    p = rows.piece
    sources[name] = Position(p.epoch, p.file, p.rg, p.doc_start + row)
    return MixPoint(name, skip, sources, mixer)


def sources_at(run: Run, row: int) -> dict:
    """`point_at(run, row, 0).sources`, without the mixer's state."""
    return _sources(run, row, where_at(run.at, counts=False)[0])


def _sources(run: Run, row: int, at_sources: dict) -> dict:
    sources = {name: place(*where) if type(where) is tuple else where for name, where in at_sources.items()}
    p = run.piece
    sources[run.source] = Position(p.epoch, p.file, p.rg, p.doc_start + row)
    return sources


def place(piece, row: int) -> Position:
    """Row `row` of `piece` as a source's next document; its first row keeps the piece's skip (a
    document an old rank had cut at a change of world size, not begun here yet)."""
    return Position(piece.epoch, piece.file, piece.rg, piece.doc_start + row, piece.skip if row == 0 else 0)
