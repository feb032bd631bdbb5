"""A shuffled order (`shuffle=True, seed=S`): pure logic over row counts and a seed.

Epoch e of a split, shuffled:
1. *Units* (row groups, each format's unit: data/formats/) of the whole split, every
   `(file, unit)` pair, in an order drawn from `(seed, e)` (`Shuffle.units`); this rank's share
   is every world-th of that list (`rank, rank + world, ...`), so the ranks of an epoch read
   disjoint units that cover the split, each once.
2. The documents of each unit in an order drawn from `(seed, e, file, unit)` and the unit's row
   count alone (`Shuffle.rows`), so every process (coordinator, workers, head start, best
   fit's buffer re-read, the token cache, a count-only replay) computes the same permutation.

A position `(epoch, file, rg, doc, skip)` of a shuffled stream is unit `(file, rg)` of epoch
`epoch`, its `doc`-th document *in the unit's shuffled order* (`skip` tokens into it); a piece
`[doc_start, doc_end)` of a shuffled unit reads the unit's rows `rows(...)[doc_start:doc_end]`
(`read`: the rows' span is read once and those rows taken: a parquet row group is read whole
anyway, and a piece of it costs about one more conversion of its span to Python strings).
Every permutation is an argsort of splitmix64 hashes of (seed, key..., index): the same on
every machine and numpy version, so a state resumes anywhere.

The window (documents of W consecutive units interleaved) is not built: W = 1, documents are
shuffled within their unit. The order is over all units of the split, so it needs every
file's row counts: a fresh run's trainer reads every footer (8 threads) for its first position
and hands the counts to the run (`FirstPositions.counts`), whose coordinator then reads each
footer only when it reaches a unit of the file; a resumed run's coordinator reads them itself.
A `Mixture` shuffles each source on its own (`Sourced`): its own `Shuffle`, seeded by
`source_seed(seed, name)`, over its own files numbered within it, its own epochs; a source
begins at its share's first unit (`Sourced.firsts`, found by the run's coordinator).
Another world size deals out the rest of the old ranks' shuffled epoch (data/elastic.py), of
each source of a mixture in its own order (data/mixelastic.py).
What is refused (`refusal`, state.py, mixstate.py): a second change of world size, files added
to a resumed run, nanochat-key states and `other_rank="nanochat"`.
"""
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Sequence

import numpy as np

from ..errors import DataError
from ..position import Position

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


@dataclass(frozen=True)
class Shuffle:
    """The shuffled order of a split with `seed` (docs/contract.md §2)."""
    seed: int

    def units(self, epoch: int, counts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
        """Every `(file, unit)` of files with `counts` (rows per unit of each file), in epoch
        `epoch`'s order."""
        pairs = [(f, g) for f, rows in enumerate(counts) for g in range(len(rows))]
        return [pairs[i] for i in permutation(len(pairs), self.seed, epoch).tolist()]

    def rows(self, epoch: int, file: int, unit: int, n: int) -> np.ndarray:
        """The rows of a unit of `n` rows in epoch `epoch`'s order: document `doc` is row `rows()[doc]`."""
        return permutation(n, self.seed, epoch, file, unit)


def source_seed(seed: int, name: str) -> int:
    """The seed of a mixture's source `name` in a run with `seed`: drawn from both (crc32 of the
    name, then splitmix64: the same in every process and Python, unlike `hash`), in [0, 2**63)."""
    return int(_key(seed, zlib.crc32(name.encode("utf-8")))) & (2 ** 63 - 1)


class Sourced(NamedTuple):
    """A shuffled mixture's orders by the run's file number: source `names[i]`'s files are the
    run's `[los[i], his[i])`, each ordered by its own `Shuffle` (`orders[i]`, `source_seed`) and
    its file number within the source, as the source's own order cuts them (procs/coordinator.py
    `_pieces`). `rows` is `Shuffle.rows` of a run's file, so that the workers, the token cache
    and healing read a mixture's pieces as they read one source's."""
    names: tuple
    los: tuple
    his: tuple
    orders: tuple

    def source(self, file: int) -> tuple[int, Shuffle]:
        """`(lo, order)` of the source that the run's file `file` is of."""
        for lo, hi, order in zip(self.los, self.his, self.orders):
            if lo <= file < hi:
                return lo, order
        raise IndexError(f"file {file} is in no source of the mixture ({list(zip(self.names, self.los, self.his))})")

    def rows(self, epoch: int, file: int, unit: int, n: int) -> np.ndarray:
        lo, order = self.source(file)
        return order.rows(epoch, file - lo, unit, n)

    def firsts(self, placed, row_counts: Callable[[int], Sequence[int]], rank: int, world: int) -> dict:
        """`{name: Position}`: where each source that `placed` (a state's point's sources, or
        none) does not place begins, numbered within the source (its share's first unit of epoch
        1); `row_counts(f)`: the run's file f's. A source whose footers cannot be read is left
        out (its order raises the same error when it is first read: packing/mixfeed.py)."""
        out = {}
        for name, lo, hi, order in zip(self.names, self.los, self.his, self.orders):
            if name in (placed or {}):
                continue
            try:
                out[name] = first_position(order, lambda f, lo=lo: row_counts(lo + f), hi - lo, rank, world)
            except DataError:
                pass
        return out


def of_run(config, run) -> "Shuffle | Sourced | None":
    """The order a run's processes read its pieces in: `config.order` (one source, or None:
    the files' order), or a mixture's (`run.mixture`: `RunArgs.mixture`) `Sourced`."""
    order, mix = config.order, run.mixture
    if order is None or mix is None:
        return order
    names = tuple(r.name for r in mix.ranges)
    return Sourced(names, tuple(r.lo for r in mix.ranges), tuple(r.hi for r in mix.ranges),
                   tuple(Shuffle(source_seed(order.seed, name)) for name in names))


def share(order: Shuffle, epoch: int, counts: Sequence[Sequence[int]], rank: int, world: int) -> list[tuple[int, int]]:
    """Rank `rank` of `world`'s units of epoch `epoch`: every world-th of the epoch's order."""
    return order.units(epoch, counts)[rank::world]


def _counts(row_counts: Callable[[int], Sequence[int]], n_files: int, threads: int = 1) -> list:
    """Every file's `row_counts`, `threads` at a time (footers: I/O and parsing outside the GIL)."""
    if n_files < 1:
        raise DataError("no files to read")
    if threads < 2 or n_files < 2:
        return [list(row_counts(f)) for f in range(n_files)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, n_files)) as pool:
        return [list(c) for c in pool.map(row_counts, range(n_files))]


def _mine(order: Shuffle, epoch: int, counts: list, rank: int, world: int) -> list:
    mine = share(order, epoch, counts, rank, world)
    if not mine:
        total = sum(map(len, counts))
        raise DataError(f"rank {rank} of {world} has no unit of the shuffled order: the split's {len(counts)} "
                        f"files hold {total} units (row groups) in all, fewer than the {world} ranks; use fewer "
                        f"ranks or write files with more row groups")
    return mine


def first_position(order: Shuffle, row_counts: Callable[[int], Sequence[int]], n_files: int, rank: int,
                   world: int, epoch: int = 1) -> Position:
    """Where rank `rank` of `world`'s stream of epoch `epoch` begins: its share's first unit."""
    file, unit = _mine(order, epoch, _counts(row_counts, n_files), rank, world)[0]
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
              start: Position) -> Iterator[tuple]:
    """The unit steps `(epoch, file, rg, first doc, skip 0, rows)` of the shuffled order from
    `start` (a unit of this rank's share of its epoch), forever (data/order.py `cut_pieces`
    cuts them)."""
    counts = _counts(row_counts, n_files)
    epoch, mine = start.epoch, _mine(order, start.epoch, counts, rank, world)
    try:
        at = mine.index((start.file, start.rg))
    except ValueError:
        raise ValueError(f"position ({start}) is not a unit of rank {rank} of {world}'s share of the shuffled "
                         f"order of epoch {epoch} (seed {order.seed}): the state is of another seed, world "
                         f"size or data") from None
    doc = start.doc
    while True:
        for file, unit in mine[at:]:
            yield epoch, file, unit, doc, 0, counts[file][unit]
            doc = 0
        epoch, at = epoch + 1, 0
        mine = _mine(order, epoch, counts, rank, world)


def read(source, order: Shuffle, piece) -> list:
    """The documents of `piece` (a `data.order.Piece` of a shuffled unit) in its order: rows
    `rows()[doc_start:doc_end]` of its unit, read as one span of the unit and taken from it (a
    list of str, or `Ids`, as `source.read_texts`)."""
    if piece.n_docs == 0:
        return source.read_texts(piece.file, piece.rg, 0, 0)
    take = rows_of(source, order, piece)
    lo, hi = int(take.min()), int(take.max()) + 1
    span = source.read_texts(piece.file, piece.rg, lo, hi)
    return type(span)(span[i - lo] for i in take.tolist())


def rows_of(source, order: Shuffle, piece) -> np.ndarray:
    """The unit's rows that `piece`'s documents are, in its order."""
    n = source.row_counts(piece.file)[piece.rg]
    return order.rows(piece.epoch, piece.file, piece.rg, n)[piece.doc_start:piece.doc_end]


def moved(order: Shuffle, n: int, file: int, unit: int, spans, to_epoch: int) -> list[tuple[int, int]]:
    """Documents `[lo, hi)` of a unit of `n` rows, each span counted in its own epoch's order
    (`spans`: `(epoch, lo, hi)`), as the runs `(lo, hi)` of the same rows in epoch `to_epoch`'s
    order, sorted: a poisoned or suspect document found in one epoch is another place of its
    unit in every other (procs/heal.py keys them by the epoch they were found in)."""
    rows = [order.rows(epoch, file, unit, n)[lo:hi] for epoch, lo, hi in spans if lo < hi]
    if not rows:
        return []
    place = np.argsort(order.rows(to_epoch, file, unit, n), kind="stable")  # row -> its document in to_epoch
    docs = np.unique(place[np.concatenate(rows)]).tolist()
    out = []
    for d in docs:
        if out and out[-1][1] == d:
            out[-1] = (out[-1][0], d + 1)
        else:
            out.append((d, d + 1))
    return out


def take_tokens(lengths: np.ndarray, tokens: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(lengths, tokens)` of `rows` (in that order) of a unit whose documents in file order have
    `lengths` and the flat `tokens`."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    out_lengths = lengths[rows]
    if len(rows) == 0:
        return out_lengths, tokens[:0]
    parts = [tokens[s:e] for s, e in zip(starts[rows].tolist(), ends[rows].tolist())]
    return out_lengths, np.concatenate(parts)


def in_file_order(lengths: np.ndarray, tokens: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(lengths, tokens)` of a whole unit tokenized in its shuffled order (document i is row
    `rows[i]`) put back in file order (the token cache keeps units in file order)."""
    back = np.argsort(rows, kind="stable")
    return take_tokens(lengths, tokens, back)


def refusal(config) -> str | None:
    """What a shuffled loader does not do yet, in words (None: nothing refused)."""
    if not config.shuffle:
        return None
    if config.other_rank == "nanochat":
        return ("shuffle=True with other_rank='nanochat' is not built yet (nanochat's approximate resume "
                "names row groups of the unshuffled order); use other_rank='exact'")
    return None
