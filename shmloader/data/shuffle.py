"""A shuffled order (`shuffle=True, seed=S, shuffle_window=K`): pure logic over row counts and a seed.

Epoch e of a split, shuffled:
1. *Units* (row groups, each format's unit: data/formats/) of the whole split, every
   `(file, unit)` pair, in an order drawn from `(seed, e)` (`Shuffle.units`); this rank's share
   is every world-th of that list (`rank, rank + world, ...`), so the ranks of an epoch read
   disjoint units that cover the split, each once.
2. *Windows*: this rank's share cut into runs of consecutive units, each the fewest that hold
   K documents (`Shuffle.windows_of`; the last may hold fewer; K = 1: every unit on its own),
   so every rank with a unit has a window whatever K. A window is named by its first unit, its
   *head*, and holds its `Member`s' rows; every process names a window's units from the seed,
   the epoch, the world size the epoch was dealt in and the row counts (`Windows`).
3. The documents of a window in an order drawn from `(seed, e, head file, head unit)` and its
   row count alone (`Shuffle.rows`): document d of the window is row `rows()[d]` of its members'
   rows one after another (`locate`). So documents, not only units, are shuffled: a document's
   stream neighbours come from the window's units, not from its own unit alone. K is counted
   in documents, not units: units of K documents or more are windows of their own (no unit is
   read by more workers than without a shuffle: each worker that reads a piece of a window
   reads each of its units, docs/benchmarks.md), and small units are taken together until K.
   K = 1 is the order of states saved before the window (`shuffle_window=1`).

A position `(epoch, file, rg, doc, skip)` of a shuffled stream is the window headed by unit
`(file, rg)` of epoch `epoch`, its `doc`-th document *in the window's order* (`skip` tokens into
it). A piece `[doc_start, doc_end)` of a window carries its members (`order.Piece.members`, put
there by whoever cuts it, `Windows.filled` for pieces cut without them: best fit's buffer
re-read), so a worker reads it with no more footers than its members'. `read` reads a piece's
rows of each member (`Units`: a window of several units has each read whole once per worker,
kept while its window is read: two windows' units of text per worker at most; a window of
one unit reads the span of rows its piece takes) and puts them in the window's order.
Every permutation is an argsort of splitmix64 hashes of (seed, key..., index): the same on
every machine and numpy version, so a state resumes anywhere.

The order is over all units of the split, so it needs every file's row counts: a fresh run's
trainer reads every footer (8 threads) for its first position and hands the counts to the run
(`FirstPositions.counts`), whose coordinator then reads each footer only when it reaches a unit
of the file; a resumed run's coordinator reads them itself.
A run's processes read its order as a `Sourced` (`of_run`, as the run's kind makes it): one
source's is a `Sourced` of one, the loader's `Shuffle` over every file (`one_source`); a
`Mixture` shuffles each source on its own (data/mixrules.py `order`): its own `Shuffle`, seeded
by `source_seed(seed, name)` (a fresh run of a one-source mixture: by `seed` as it is, so that it
is that source's order), over its own files numbered within it, its own epochs; a source its
start does not place begins at its share's first window (`Sourced.firsts`, found by the run's
coordinator; one source's start always places it).
Another world size deals out the rest of the old ranks' shuffled epoch, window by window
(data/elastic.py), of each source of a mixture in its own order (data/mixelastic.py).
What is refused (`refusal`, state.py, mixstate.py): a second change of world size, files added
to a resumed run, nanochat-key states and `other_rank="nanochat"`.
"""
import dataclasses
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np

from . import units
from ..errors import DataError
from ..ipc.runstart import ONE_SOURCE
from ..position import Position, Step

_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _key(*parts: int) -> np.uint64:
    """One 64-bit key of integers (each folded in through `_mix`)."""
    h = np.uint64(0x243F6A8885A308D3)
    for p in parts:
        h = _mix(np.array([h ^ (np.uint64(int(p) & 0xFFFFFFFFFFFFFFFF))], dtype=np.uint64))[0]
    return h


def permutation(n: int, *key: int) -> np.ndarray:
    """A permutation of `range(n)` drawn from the integers `key` (int64)."""
    h = _key(*key)
    with np.errstate(over="ignore"):
        return np.argsort(_mix(np.arange(n, dtype=np.uint64) ^ h), kind="stable")


WINDOW = 256  # documents a window holds at least unless `shuffle_window=` says (docs/benchmarks.md
#               "The shuffled order": row groups of 256 documents or more are windows of their own)


class Member(NamedTuple):
    """One unit of a window: unit `unit` of file `file`, `rows` rows."""
    file: int
    unit: int
    rows: int


class Window(NamedTuple):
    """Consecutive units of an epoch's order whose documents are shuffled together."""
    members: tuple  # of Member, the head first

    @property
    def head(self) -> tuple[int, int]:
        """`(file, unit)` that names the window (a position's `file`, `rg`)."""
        return self.members[0].file, self.members[0].unit

    @property
    def rows(self) -> int:
        return sum(m.rows for m in self.members)


@dataclass(frozen=True)
class Shuffle:
    """The shuffled order of a split with `seed`, windows of at least `window` documents (docs/contract.md §2)."""
    seed: int
    window: int = 1

    def units(self, epoch: int, counts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
        """Every `(file, unit)` of files with `counts` (rows per unit of each file), in epoch
        `epoch`'s order."""
        pairs = [(f, g) for f, rows in enumerate(counts) for g in range(len(rows))]
        return [pairs[i] for i in permutation(len(pairs), self.seed, epoch).tolist()]

    def shares(self, epoch: int, counts: Sequence[Sequence[int]], world: int) -> list[list[Window]]:
        """Epoch `epoch`'s windows of each rank of `world`: rank r's share of its order of units
        (every world-th from the r-th) cut into windows (`windows_of`)."""
        units = [Member(f, g, counts[f][g]) for f, g in self.units(epoch, counts)]
        return [self.windows_of(units[r::world]) for r in range(world)]

    def windows_of(self, units: Sequence[Member]) -> list[Window]:
        """`units` in windows of consecutive units, each the fewest that hold `window` documents
        (the last may hold fewer); `window` 1: every unit on its own (empty ones too)."""
        if self.window == 1:
            return [Window((u,)) for u in units]
        out, run, docs = [], [], 0
        for u in units:
            run.append(u)
            docs += u.rows
            if docs >= self.window:
                out.append(Window(tuple(run)))
                run, docs = [], 0
        if run:
            out.append(Window(tuple(run)))
        return out

    def rows(self, epoch: int, file: int, unit: int, n: int) -> np.ndarray:
        """The rows of the window headed by `(file, unit)` of `n` rows in epoch `epoch`'s order:
        document `doc` is row `rows()[doc]` of its members' rows one after another (`locate`)."""
        return permutation(n, self.seed, epoch, file, unit)


def locate(members: Sequence[Member], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(member, row)` of each of a window's `rows` (its members' rows one after another): the
    index of its member and its row in that member's unit."""
    ends = np.cumsum([m.rows for m in members], dtype=np.int64)
    which = np.searchsorted(ends, rows, side="right")
    return which, rows - (ends - np.array([m.rows for m in members], dtype=np.int64))[which]


def source_seed(seed: int, name: str) -> int:
    """The seed of a mixture's source `name` in a run with `seed`: drawn from both (crc32 of the
    name, then splitmix64: the same in every process and Python, unlike `hash`), in [0, 2**63)."""
    return int(_key(seed, zlib.crc32(name.encode("utf-8")))) & (2 ** 63 - 1)


class SourceOrder(NamedTuple):
    """One source of a run's order (`Sourced.of`): its name, its files the run's `[lo, hi)`,
    its `Shuffle` (None: its files' order) and the elastic plan its windows are dealt by in the
    epochs the plan covers (data/elastic.py `Plan`; None: none, or not asked: `Sourced` knows no
    plan, `Windows` adds the run's)."""
    name: str
    lo: int
    hi: int
    order: "Shuffle | None"
    plan: object = None


class Sourced(NamedTuple):
    """A run's shuffled order by the run's file number, source by source: source `names[i]`'s
    files are the run's `[los[i], his[i])`, each ordered by its own `Shuffle` (`orders[i]`; None:
    a source read in its files' order) and its file number within the source, as the source's
    own order cuts them (procs/coordinator.py `_pieces`). One source's is a `Sourced` of one
    (`one`: `ONE_SOURCE`, every file of the run, the loader's `Shuffle`); a mixture's has a
    source each (data/mixrules.py `order`, seeded by `source_seed`). So the workers, the token
    cache, healing (`Windows`) and the coordinator read one type whatever the run reads: `rows`
    is `Shuffle.rows` of a run's file."""
    names: tuple
    los: tuple
    his: tuple
    orders: tuple

    @classmethod
    def one(cls, order: Shuffle, n_files: int) -> "Sourced":
        """One source's shuffled order `order` over the run's `n_files` files."""
        return cls((ONE_SOURCE,), (0,), (n_files,), (order,))

    def sources(self) -> "Iterator[SourceOrder]":
        """Each source's `SourceOrder`, in the run's order of its files."""
        return map(SourceOrder, self.names, self.los, self.his, self.orders)

    def of(self, file: int) -> "SourceOrder":
        """The `SourceOrder` of the source that the run's file `file` is of (its files the run's
        `[lo, hi)`; its order None: a source read in its files' order)."""
        for source in self.sources():
            if source.lo <= file < source.hi:
                return source
        raise IndexError(f"file {file} is in no source of the run ({list(zip(self.names, self.los, self.his))})")

    def rows(self, epoch: int, file: int, unit: int, n: int) -> np.ndarray:
        source = self.of(file)
        return source.order.rows(epoch, file - source.lo, unit, n)

    def firsts(self, placed: frozenset, row_counts: Callable[[int], Sequence[int]], rank: int, world: int) -> dict:
        """`{name: Position}`: where each source that `placed` (the names of the sources the
        run's start places: `ipc.runstart`'s `placed`) does not place begins, numbered within
        the source (its share's first window of epoch 1); `row_counts(f)`: the run's file f's.
        One source's start always places it (its position), so its `firsts` are none. A source
        whose footers cannot be read is left out (its order raises the same error when it is
        first read: packing/mixfeed.py)."""
        out = {}
        for s in self.sources():
            if s.name in placed or s.order is None:  # placed, or read in its files' order
                continue
            try:
                out[s.name] = first_position(s.order, lambda f, lo=s.lo: row_counts(lo + f), s.hi - s.lo, rank, world)
            except DataError:
                pass
        return out


def of_run(config, run) -> Sourced | None:
    """The order a run's processes read its pieces in, a `Sourced` (None: every file in the
    files' order), as its kind makes it (`run.order_of`, kinds.py `run_fields`: one source's
    `one_source`, a mixture's data/mixrules.py `order`)."""
    return run.order_of(config, run)


def one_source(config, run) -> Sourced | None:
    """One source's run's order: `config.order` (the loader's `shuffle=`) over every file of the
    run, or None (the files' order)."""
    return None if config.order is None else Sourced.one(config.order, len(run.files))


def own_setting(mixture, name: str) -> bool | None:
    """A `Mixture`'s source `name`'s own `Source(shuffle=)` (None: it says none, the loader's)."""
    return getattr(mixture.sources.get(name), "shuffle", None)


def source_shuffled(mixture, name: str, default: bool) -> bool:
    """Whether a `Mixture`'s source `name` is read shuffled: its `Source(shuffle=)`, else
    `default` (the loader's `shuffle=`)."""
    own = own_setting(mixture, name)
    return default if own is None else own


def share(order: Shuffle, epoch: int, counts: Sequence[Sequence[int]], rank: int, world: int) -> list[Window]:
    """Rank `rank` of `world`'s windows of epoch `epoch` (`Shuffle.shares`)."""
    return order.windows_of([Member(f, g, counts[f][g]) for f, g in order.units(epoch, counts)[rank::world]])


def _counts(row_counts: Callable[[int], Sequence[int]], n_files: int, threads: int = 1) -> list:
    """Every file's `row_counts`, `threads` at a time (footers: I/O and parsing outside the GIL)."""
    if n_files < 1:
        raise DataError("no files to read")
    if threads < 2 or n_files < 2:
        return [list(row_counts(f)) for f in range(n_files)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, n_files)) as pool:
        return [list(c) for c in pool.map(row_counts, range(n_files))]


def _mine(order: Shuffle, epoch: int, counts: list, rank: int, world: int) -> list[Window]:
    mine = share(order, epoch, counts, rank, world)
    if not mine:  # the training process checks it when the loader is made (data/units.py): a backstop
        raise units.shuffled_error(rank, world, len(counts), sum(map(len, counts)))
    return mine


def first_position(order: Shuffle, row_counts: Callable[[int], Sequence[int]], n_files: int, rank: int,
                   world: int, epoch: int = 1) -> Position:
    """Where rank `rank` of `world`'s stream of epoch `epoch` begins: its share's first window."""
    file, unit = _mine(order, epoch, _counts(row_counts, n_files), rank, world)[0].head
    return Position(epoch, file, unit, 0)


class FirstPositions:
    """`(rank, world) -> Position`: where a fresh shuffled stream begins (`first_position` of
    epoch 1), the files' row counts read once, when first asked (a loader's `state.Loader.first`),
    `threads` footers at a time; `counts` hands them to the run (its coordinator reads each
    footer only when it reaches a unit of the file: procs/coordinator.py `_pieces`)."""

    def __init__(self, order: Shuffle, row_counts: Callable[[int], Sequence[int]], n_files: int, threads: int = 8):
        self.order, self._row_counts, self.n_files, self._counts = order, row_counts, n_files, None
        self.threads = threads

    @property
    def counts(self) -> tuple | None:
        """Every file's rows per unit, once read (None before)."""
        return None if self._counts is None else tuple(map(tuple, self._counts))

    def __call__(self, rank: int, world: int) -> Position:
        if self._counts is None:
            self._counts = _counts(self._row_counts, self.n_files, self.threads)
        return first_position(self.order, self._counts.__getitem__, self.n_files, rank, world)


def row_steps(order: Shuffle, row_counts: Callable[[int], Sequence[int]], n_files: int, rank: int, world: int,
              start: Position) -> Iterator[Step]:
    """The window steps of the shuffled order from `start` (a window of this rank's share of
    its epoch), forever (data/order.py `cut_pieces` cuts them)."""
    counts = _counts(row_counts, n_files)
    epoch, mine = start.epoch, _mine(order, start.epoch, counts, rank, world)
    heads = [w.head for w in mine]
    try:
        at = heads.index((start.file, start.rg))
    except ValueError:
        raise ValueError(f"position ({start}) does not head a window of rank {rank} of {world}'s share of the "
                         f"shuffled order of epoch {epoch} (seed {order.seed}, shuffle_window {order.window}): "
                         f"the state is of another seed, window, world size or data") from None
    doc = start.doc
    while True:
        for w in mine[at:]:
            yield Step(epoch, *w.head, doc, 0, w.rows, w.members)
            doc = 0
        epoch, at = epoch + 1, 0
        mine = _mine(order, epoch, counts, rank, world)


class Windows:
    """A window's members from its epoch and head (`members`), for pieces cut without them
    (`filled`: best fit's buffer re-read, data/order.py `buffer_pieces`) and for healing
    (`moved`): every file's `row_counts` read when a window of more than one unit is first
    asked for, each epoch's windows kept while it is asked for. `order` is the run's `Sourced`
    (a file's source's windows, numbered in the run's files)."""

    def __init__(self, order: Sourced, row_counts: Callable[[int], Sequence[int]], world: int, plans=None):
        """`world`: the run's; `plans`: the elastic plans (data/elastic.py) of a run that began
        at a change of world size, `{source: Plan}` (a run's start's `order_plans`: one
        source's under `ipc.runstart.ONE_SOURCE`; None: none). In the epochs a plan covers, the
        windows are those its units are (`elastic.units`): an old rank's window at its
        position, as its old world size dealt it, and every other unit on its own."""
        self.order, self._row_counts, self.world = order, row_counts, world
        self._plans = plans
        self._counts, self._epochs, self._sources = {}, {}, {}

    def _of(self, file: int) -> SourceOrder:
        """The source `file` is ordered with, with its plan, kept by file (asked once a piece)."""
        got = self._sources.get(file)
        if got is None:
            source = self.order.of(file)
            got = self._sources[file] = source._replace(plan=(self._plans or {}).get(source.name))
        return got

    def members(self, epoch: int, file: int, unit: int) -> tuple:
        """The `Member`s of the window headed by `(file, unit)` in `epoch` (run's numbering)."""
        source = self._of(file)
        lo, order, plan = source.lo, source.order, source.plan
        if order.window == 1:
            return (Member(file, unit, list(self._row_counts(file))[unit]),)
        elastic = plan is not None and epoch <= plan.epoch
        world = plan.world if elastic else self.world
        shares = self._shares(source, epoch, world)
        try:
            rank, j = shares.heads[(file - lo, unit)]
        except KeyError:
            if elastic:  # a unit of a window no old rank began, dealt on its own (data/elastic.py)
                return (Member(file, unit, list(self._row_counts(file))[unit]),)
            raise ValueError(f"file {file}, unit {unit} heads no window of epoch {epoch}'s shuffled order at "
                             f"world size {world} (seed {order.seed}, shuffle_window {order.window})") from None
        if elastic:  # an old rank's window up to the one at its position is whole; later ones unit by unit
            e, pf, pg = plan.positions[rank][:3]
            if epoch > e or (epoch == e and j > shares.heads.get((pf, pg), (rank, -1))[1]):
                return (Member(file, unit, list(self._row_counts(file))[unit]),)
        return tuple(m._replace(file=m.file + lo) for m in shares.windows[rank][j].members)

    def _shares(self, source: SourceOrder, epoch: int, world: int):
        """Epoch `epoch`'s windows of every rank of `world` over `source`'s files, with each
        head's `(rank, index in its share)`, kept while asked for."""
        lo, hi, order = source.lo, source.hi, source.order
        if lo not in self._counts:
            self._counts[lo] = _counts(lambda f: self._row_counts(lo + f), hi - lo)
        key = (lo, epoch, world)
        if key not in self._epochs:
            if len(self._epochs) > 8:
                self._epochs.clear()
            windows = order.shares(epoch, self._counts[lo], world)
            heads = {w.head: (r, j) for r, share in enumerate(windows) for j, w in enumerate(share)}
            self._epochs[key] = _Shares(windows, heads)
        return self._epochs[key]

    def filled(self, piece):
        """`piece` with its window's members (as it is when it has them, or in the files' order)."""
        if piece.members or self._of(piece.file).order is None:
            return piece
        return dataclasses.replace(piece, members=self.members(piece.epoch, piece.file, piece.rg))

    def moved(self, piece, spans) -> list[tuple[int, int]]:
        """The documents `(lo, hi)` of `piece`'s window, in its epoch's order, that are rows of
        `spans` (`(epoch, file, rg, lo, hi)`: documents of the window headed by `(file, rg)` as
        their epoch orders them; poisoned or suspect, procs/heal.py), sorted and merged: a
        document found in one epoch is another place of another window in every other."""
        if self._of(piece.file).order is None:  # a source read in its files' order (a mixture's): as found
            return [(lo, hi) for _, file, rg, lo, hi in spans if (file, rg) == (piece.file, piece.rg)]
        members = self.filled(piece).members
        place = {(m.file, m.unit): i for i, m in enumerate(members)}
        hit = []
        for epoch, file, rg, lo, hi in spans:
            if self._of(file).order is None:  # of a source in its files' order: never of this window
                continue
            theirs = self.members(epoch, file, rg)
            if lo >= hi or not place.keys() & {(m.file, m.unit) for m in theirs}:
                continue
            which, row = locate(theirs, self.order.rows(epoch, file, rg, sum(m.rows for m in theirs))[lo:hi])
            hit += [(place[k], r) for k, r in zip(((theirs[w].file, theirs[w].unit) for w in which.tolist()),
                                                   row.tolist()) if k in place]
        if not hit:
            return []
        ends = np.cumsum([m.rows for m in members])
        flat = np.array([int(ends[m] - members[m].rows) + r for m, r in hit], dtype=np.int64)
        order = self.order.rows(piece.epoch, piece.file, piece.rg, int(ends[-1]))
        back = np.argsort(order, kind="stable")  # a window's row -> its document in the piece's epoch
        return _runs(np.unique(back[flat]).tolist())


class _Shares(NamedTuple):
    windows: list  # each rank's windows
    heads: dict    # head -> (rank, index in its share)


def _runs(docs: list) -> list[tuple[int, int]]:
    """Sorted document numbers as runs `(lo, hi)`."""
    out = []
    for d in docs:
        if out and out[-1][1] == d:
            out[-1] = (out[-1][0], d + 1)
        else:
            out.append((d, d + 1))
    return out


class Units:
    """A worker's (or the head start's) units of text read whole (`text`) for the pieces of a
    window of several units: the pieces of a window read the same units, so each is read once
    while its window is read. The units of the last `keep` windows are kept (a worker's pieces
    are of one window or the next), the others let go."""

    def __init__(self, keep: int = 2):
        self.keep, self._windows = keep, {}  # window key -> {(file, unit): text}

    def text(self, window, read_unit, file: int, unit: int, rows: int):
        """Unit `unit` of `file` (`rows` rows) of `window` (a key: epoch and head), read whole."""
        texts = self._windows.get(window)
        if texts is None:
            if len(self._windows) >= self.keep:
                del self._windows[next(iter(self._windows))]
            texts = self._windows[window] = {}
        if (file, unit) not in texts:
            text = read_unit(file, unit, 0, rows)
            if text is None:  # a bad unit skipped is read (and told) again
                return None
            texts[(file, unit)] = text
        return texts[(file, unit)]


def rows_of(order, piece) -> np.ndarray:
    """The rows of `piece`'s window (its members' rows one after another) that its documents
    are, in its order."""
    n = sum(m.rows for m in piece.members)
    return order.rows(piece.epoch, piece.file, piece.rg, n)[piece.doc_start:piece.doc_end]


def read(read_unit, order, piece, units: Units | None = None) -> list:
    """The documents of `piece` (a `data.order.Piece` of a window, with its members) in its
    order, as `read_unit(file, unit, lo, hi)` reads rows (`Reader.read_texts`: a list of str, or
    `Ids`): each member's rows that the piece takes (`_rows`: one span of the unit, or its runs
    when they are few in it; with `units` and a window of several units, the member read whole
    once and kept). A member that `read_unit` gives None for (a bad unit skipped) gives nulls."""
    members = piece.members
    if piece.n_docs == 0:
        return read_unit(members[0].file, members[0].unit, 0, 0)
    which, rows = locate(members, rows_of(order, piece))
    out, kind = [None] * piece.n_docs, None
    for m in np.unique(which).tolist():
        at = np.flatnonzero(which == m)
        take = rows[at]
        member = members[m]
        if units is not None and len(members) > 1:
            got = units.text((piece.epoch, piece.file, piece.rg), read_unit, member.file, member.unit, member.rows)
            texts = None if got is None else {_KIND: type(got), **{r: got[r] for r in take.tolist()}}
        else:
            texts = _rows(read_unit, member, take)
        if texts is None:
            continue
        kind = texts.pop(_KIND)
        for i, r in zip(at.tolist(), take.tolist()):
            out[i] = texts[r]
    return out if kind is None or kind is list else kind(out)


_KIND = object()  # `_rows`'s key for the type its reads gave (list, or `Ids`)


def _rows(read_unit, member: Member, take: np.ndarray) -> "dict | None":
    """`{row: document}` of `take` (rows of `member`), read as one span of the unit or, when
    they are few in it (the first pieces of a run: 16 documents of a row group of 1,024), as
    their runs of consecutive rows: converting a span costs about a document's time per row,
    a read of its own about two (docs/benchmarks.md). None: the unit was skipped as bad."""
    rows = np.sort(take)
    runs = np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1)
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    if 2 * len(runs) + len(rows) >= hi - lo:
        span = read_unit(member.file, member.unit, lo, hi)
        return None if span is None else {_KIND: type(span), **{r: span[r - lo] for r in take.tolist()}}
    out, kind = {}, None
    for run in runs:
        a, b = int(run[0]), int(run[-1]) + 1
        got = read_unit(member.file, member.unit, a, b)
        if got is None:
            return None
        kind = type(got)
        out.update(zip(range(a, b), got))
    out[_KIND] = kind
    return out


def skipped(piece, order, bad) -> list[tuple]:
    """`(unit, text, rows)` of each bad member `read` skipped (`bad`: `((file, unit), text)`):
    how many of `piece`'s documents it held."""
    if not bad:
        return []
    which, _ = locate(piece.members, rows_of(order, piece))
    index = {(m.file, m.unit): i for i, m in enumerate(piece.members)}
    return [(unit, text, int(np.count_nonzero(which == index[unit]))) for unit, text in dict(bad).items()]


def row_of(piece, order, i: int) -> tuple[int, int, int]:
    """`(file, unit, row)` of `piece`'s document `i`."""
    which, rows = locate(piece.members, rows_of(order, piece)[i:i + 1])
    member = piece.members[int(which[0])]
    return member.file, member.unit, int(rows[0])


def cached(load, piece, order) -> tuple[np.ndarray, np.ndarray] | None:
    """`(lengths, tokens)` of `piece`'s documents from the token cache, which keeps units
    whole in file order (`load(member)`: `(lengths, tokens)` of a member, or None when not
    kept), or None when a member it takes is not kept."""
    which, rows = locate(piece.members, rows_of(order, piece))
    parts = {}
    for m in np.unique(which).tolist():
        got = load(piece.members[m])
        if got is None:
            return None
        parts[m] = (got[0], got[1], np.cumsum(got[0]))
    lengths, tokens = [], []
    for m, r in zip(which.tolist(), rows.tolist()):
        ls, ts, ends = parts[m]
        lengths.append(int(ls[r]))
        tokens.append(ts[ends[r] - ls[r]:ends[r]])
    if not tokens:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.array(lengths, dtype=np.int64), np.concatenate(tokens)


def in_file_order(piece, order, lengths: np.ndarray, tokens: np.ndarray) -> list:
    """`[(member, lengths, tokens)]`: a whole window tokenized in its shuffled order (`piece`,
    every document of it) as each member's documents in file order (the token cache keeps
    units whole, in file order)."""
    which, rows = locate(piece.members, rows_of(order, piece))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    out = []
    for m, member in enumerate(piece.members):
        at = np.flatnonzero(which == m)
        at = at[np.argsort(rows[at], kind="stable")]  # the member's documents in file order
        parts = [tokens[s:e] for s, e in zip(starts[at].tolist(), ends[at].tolist())]
        out.append((member, lengths[at], np.concatenate(parts) if parts else tokens[:0]))
    return out


def refusal(config) -> str | None:
    """What a shuffled loader does not do yet, in words (None: nothing refused)."""
    if not config.shuffle:
        return None
    if config.other_rank == "nanochat":
        return ("shuffle=True with other_rank='nanochat' is not built yet (nanochat's approximate resume "
                "names row groups of the unshuffled order); use other_rank='exact'")
    return None
