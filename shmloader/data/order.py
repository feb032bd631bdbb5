"""The canonical document order, cut into pieces: pure logic over row-group sizes.

Order (docs/contract.md §2): files in the given order; in each file the row groups `rank, rank + world,
...`; in each row group its rows in order; after the last file, the next epoch (1, 2, ...).

A *piece* is a slice `[doc_start, doc_end)` of one row group. The first pieces of a run
follow `RAMP` (16, 32, ... documents) so that the first batch needs only a few milliseconds
of tokenizing; later pieces run to the end of their row group, capped at `max_docs`, and at
about `max_bytes` of text: a row group's text size is in its parquet footer, so a piece of a
row group of N documents and S bytes has at most `max_bytes * N / S` of them (rounded down to
whole `unit`s, at least one). That keeps the work of a piece, and what a worker holds behind
it, bounded whatever the row groups look like (1 to thousands of documents, of 0 to 100K
characters each). Piece boundaries never change the token stream; they only decide how work
is split.

With a `data.shuffle.Shuffle` (`shuffle=`) the row groups are those of its shuffled order
instead (`row_steps` hands over to `shuffle.row_steps`); the pieces are cut the same way.

`iter_pieces` raises `DataError` when a whole pass over the files yields no row group for
this rank, instead of looping forever (the original loader's end-of-data hang).
"""
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Sequence

from ..errors import DataError
from ..position import Position, Step
from . import shuffle as shufflemod, units

RAMP = (16, 32, 64, 128, 256, 512)


class Later(NamedTuple):
    """The files' order in the epochs after `after`: `order`, indices into the run's files (a
    resumed run reads the files new to its state after the state's in the epoch it resumed in,
    and every file in its sorted place from the next epoch on: data/catalogue.py)."""
    after: int
    order: tuple


@dataclass(frozen=True)
class Piece:
    index: int
    epoch: int
    file: int
    rg: int
    doc_start: int
    doc_end: int
    text_bytes: int = 0  # its text's size, estimated from its row group's (0: unknown)
    skip: int = 0        # tokens of its first document read before it (concat, elastic resume:
    #                      a document an old rank had begun; the worker drops them)
    members: tuple = ()  # a shuffled window's units (data/shuffle.py `Member`s), () in the files' order

    @property
    def n_docs(self) -> int:
        return self.doc_end - self.doc_start

    def but(self, **changes) -> "Piece":
        """`dataclasses.replace(self, **changes)` without its introspection (a sixth of the time:
        a mixture's coordinator renumbers every piece it hands out)."""
        out = object.__new__(Piece)
        out.__dict__.update(self.__dict__, **changes)
        return out

    def from_file(self, lo: int) -> "Piece":
        """This piece of files numbered from 0 (a mixture's source's own) with its files, its
        members' too, numbered from `lo` (the run's numbering: `data.sources.Range.lo`)."""
        return self.but(file=self.file + lo, members=tuple(m._replace(file=m.file + lo) for m in self.members))


def ramp_for(chunk_docs: int, max_docs: int, fill_docs: int = 0) -> tuple[tuple[int, ...], int]:
    """Ramp and cap rounded up to whole chunks, so that pieces never split a chunk.

    Best fit plans its first batch only once `fill_docs` documents (its buffer) and the
    batch's own are counted: the ramp then starts with one-chunk pieces covering them plus
    one chunk, which the coordinator spreads over every worker, so that the fill is
    tokenized in parallel in pieces of equal size (one big last piece would hold the first
    batch back, and pieces past the fill only compete with it for the cores)."""
    up = lambda n: -(-n // chunk_docs) * chunk_docs
    fill = (chunk_docs,) * (-(-fill_docs // chunk_docs) + 1) if fill_docs else ()
    return fill + tuple(up(n) for n in RAMP if not fill or up(n) > chunk_docs), up(max_docs)


def buffer_pieces(runs, max_docs: int) -> list[Piece]:
    """Pieces that re-read the documents of a saved best-fit buffer, in arrival order."""
    pieces = []
    for epoch, file, rg, row, count in runs:
        for lo in range(row, row + count, max_docs):
            pieces.append(Piece(len(pieces), epoch, file, rg, lo, min(row + count, lo + max_docs)))
    return pieces


def start_position(rank: int) -> Position:
    """Where a fresh run of `rank` starts: epoch 1, file 0, its first row group."""
    return Position(epoch=1, file=0, rg=rank, doc=0)


def nanochat_position(pq_idx: int, rg_idx: int, epoch: int, rank: int, world: int) -> Position:
    """Resume point of a state holding only nanochat's keys, as nanochat computes it:
    the next stride after `rg_idx`, on this rank, in file `pq_idx`."""
    return Position(epoch=epoch, file=pq_idx, rg=(rg_idx // world + 1) * world + rank, doc=0)


def iter_pieces(row_counts: Callable[[int], Sequence[int]], n_files: int, rank: int, world: int,
                start: Position, max_docs: int = 1024, ramp: Sequence[int] = RAMP,
                first_index: int = 0, later: Later | None = None,
                row_bytes: Callable[[int], Sequence[int]] | None = None, max_bytes: int | None = None,
                unit: int = 1, shuffle: "shufflemod.Shuffle | None" = None, aligned: bool = False) -> Iterator[Piece]:
    """Yield the pieces of the canonical order (or of `shuffle`'s) from `start`, forever.

    `row_counts(f)` returns the number of rows of each row group of file `f`, `row_bytes(f)`
    (called after it) their text's size in bytes; with both `row_bytes` and `max_bytes` a
    piece holds about `max_bytes` of text at most, in whole `unit`s of documents. The files are
    read in index order, and in the epochs after `later.after` in `later.order`, when given;
    `aligned` as `cut_pieces` says.
    """
    return cut_pieces(row_steps(row_counts, n_files, rank, world, start, later, shuffle), max_docs, ramp,
                      first_index, row_bytes, max_bytes, unit, aligned)


def row_steps(row_counts: Callable[[int], Sequence[int]], n_files: int, rank: int, world: int,
              start: Position, later: Later | None = None,
              shuffle: "shufflemod.Shuffle | None" = None) -> Iterator[tuple]:
    """The row groups of the canonical order (or of `shuffle`'s: data/shuffle.py) from `start`,
    forever, as `Step`s (skip 0: `cut_pieces` says what it is)."""
    if shuffle is not None:
        assert later is None, "a shuffled run never reorders its files (state.py refuses files added to it)"
        yield from shufflemod.row_steps(shuffle, row_counts, n_files, rank, world, start)
        return
    if n_files < 1:
        raise DataError("no files to read")
    epoch, at, rg, doc = start.epoch, start.file, start.rg, start.doc
    reordered = (lambda e: e > later.after) if later is not None else (lambda e: False)
    if reordered(epoch) and start.file in later.order:  # a restart in a reordered epoch: `at` counts in its order
        at = later.order.index(start.file)
    barren = 0  # files passed in a row without yielding a piece
    while True:
        if at >= n_files:
            epoch, at, rg, doc = epoch + 1, 0, rank, 0
            continue
        file = later.order[at] if reordered(epoch) else at
        counts = row_counts(file)
        if rg >= len(counts):
            barren += 1
            if barren > n_files:  # the training process checks it when the loader is made (data/units.py)
                raise units.files_order_error(rank, world, n_files)
            at, rg, doc = at + 1, rank, 0
            continue
        barren = 0
        yield Step(epoch, file, rg, doc, 0, counts[rg])
        rg, doc = rg + world, 0


def cut_pieces(steps: Iterator[tuple], max_docs: int = 1024, ramp: Sequence[int] = RAMP, first_index: int = 0,
               row_bytes: Callable[[int], Sequence[int]] | None = None, max_bytes: int | None = None,
               unit: int = 1, aligned: bool = False) -> Iterator[Piece]:
    """The pieces of `Step`s: each step's documents from its first, cut as `iter_pieces` says;
    the first piece of a step with a skip starts that many tokens into its first document. An
    empty row group (or window) is still a step of the order: it gives one empty piece.
    `aligned`: a step that starts inside a unit (a mixture's source resumed inside one of best
    fit's chunks) has its first piece end at the next whole unit of the step, so that every piece
    ends at a whole unit of its step's rows or at its end (packing/mix.py `chunk`)."""
    sizes = iter(ramp)
    index = first_index
    for epoch, file, rg, doc, skip, rows, members in steps:
        per_doc = _bytes_per_doc(row_bytes, members or ((file, rg, rows),), rows)
        while doc < rows:
            size = min(next(sizes, max_docs), max_docs, _docs_within(max_bytes, per_doc, unit))
            end = min(rows, doc + size)
            if aligned and doc % unit:
                end = min(end, doc - doc % unit + unit)
            yield Piece(index, epoch, file, rg, doc, end, round(per_doc * (end - doc)), skip, members)
            index, doc, skip = index + 1, end, 0
        if rows == 0:
            yield Piece(index, epoch, file, rg, 0, 0, members=members)
            index += 1


def _bytes_per_doc(row_bytes, units, n_docs: int) -> float:
    """Average text bytes per document of `units` (`(file, rg, rows)` each: a row group, or a
    shuffled window's members) of `n_docs` documents in all (0.0 when unknown)."""
    if row_bytes is None or n_docs == 0:
        return 0.0
    total = 0
    for file, rg, _ in units:
        sizes = row_bytes(file)
        total += sizes[rg] if rg < len(sizes) else 0
    return total / n_docs


def _docs_within(max_bytes: int | None, per_doc: float, unit: int) -> float:
    """The most documents of `per_doc` bytes that fit in `max_bytes`, in whole units (>= 1)."""
    if not max_bytes or per_doc <= 0:
        return float("inf")
    return max(1, int(max_bytes / per_doc) // unit) * unit
