"""Whether a rank has a unit to read, and a document in them, known when the loader is made:
one rule, two orders.

A unit is a format's piece of work (a parquet row group, an Arrow record batch, 1024 lines of
JSON Lines: data/formats/). Rank r of W reads, in the files' order, units `r, r + W, ...` of
each file: it has one iff some file holds more than r units. Shuffled, it reads every W-th unit
of the split's order (data/shuffle.py): it has one iff the split holds more than r units in all.
Neither changes with the epoch, nor at a resume (the files and the rank are the loader's), so
a rank without one is refused in the training process when the loader is made
(`check`, called by kinds.py), with the words the coordinator uses when it meets the same
(`files_order_error`, `shuffled_error`: data/order.py, data/shuffle.py, its backstop).

`check` reads footers until it knows, usually one: the first file with more than r units
(shuffled: until the units so far outnumber r); a JSON Lines file, which has no footer, only up
to the line that shows it holds enough (`Format.units`: its first chunk for rank 0, r * 1024
lines for rank r: a 200K-line .jsonl.zst, 2-3 ms for rank 0 against 40-70 ms read whole, on 2
cores shared at load 7-10, 2026-12-05, timed by hand around `ShmLoader(...)` (no script kept); a
parquet file's footer, 0.7 ms). A file it
cannot read leaves the answer to the coordinator (which raises that file's error, or skips it
with `on_bad_row_group="skip"`).

A rank with units may still have no document in them: every one empty or its column null in
every row. Read in the files' order it would loop over its epochs for ever (the coordinator
says so after two of them: `barren_error`); shuffled, only if every unit of the split holds
none (`barren_shuffled_error`). `check_documents` refuses that when the loader is made where
the files' metadata says it (`Format.may_hold`: a parquet footer's row counts and its text
column's null counts, an Arrow batch's header: the footers `check` opened, in a shuffled run
the first file's), stopping at the first unit that may hold a document, usually the rank's
first. A JSON Lines
file, a parquet token-id column (its null count is of ids, not rows) or a footer without
statistics cannot say it without reading the documents: there the coordinator remains the
one to tell.
"""
from typing import Callable

from ..errors import DataError
from .formats import FORMATS

# what a rank without a unit is told to do, in every format's words (each format's `unit_is`)
MORE_UNITS = (f"use fewer ranks or write files with more row groups (a unit is "
              f"{', '.join(fmt.unit_is for fmt in FORMATS)})")


def files_order_error(rank: int, world: int, n_files: int) -> DataError:
    return DataError(f"rank {rank} of {world} has no row group in any of the {n_files} "
                     f"files (row groups rank, rank+{world}, ...): {MORE_UNITS}")


def shuffled_error(rank: int, world: int, n_files: int, total: int) -> DataError:
    return DataError(f"rank {rank} of {world} has no unit of the shuffled order: the split's {n_files} "
                     f"files hold {total} units (row groups) in all, fewer than the {world} ranks; {MORE_UNITS}")


def barren_error(rank: int, n_files: int) -> DataError:
    return DataError(f"rank {rank}: a whole epoch over {n_files} files held no document with text "
                     f"(all null or no rows)")


def barren_shuffled_error(rank: int, n_files: int, epochs: int | None = None) -> DataError:
    over = "" if epochs is None else f" over {epochs} epochs"
    return DataError(f"rank {rank}: every row group of the {n_files} files, read shuffled{over}, held no "
                     f"document with text (all null or no rows)")


def check_documents(may_hold: Callable[[int], "list | None"], n_files: int, rank: int, world: int,
                    shuffled: bool):
    """Raise the coordinator's `DataError` if the units rank `rank` of `world` reads (shuffled:
    every unit of the split) are all known to hold no document (`may_hold(f)`: file f's units,
    each False where its metadata says so; None where it cannot say, or cannot be read)."""
    if n_files < 1:
        return  # "no files to read": said where the files are listed
    for f in range(n_files):
        held = may_hold(f)
        if held is None or any(held if shuffled else held[rank::world]):
            return  # unknown, or a document: the rank reads
    raise barren_shuffled_error(rank, n_files) if shuffled else barren_error(rank, n_files)


def check(units: Callable[[int, int], "int | None"], n_files: int, rank: int, world: int, shuffled: bool):
    """Raise the coordinator's `DataError` if rank `rank` of `world` has no unit of the `n_files`
    files (`units(f, enough)`: file f's number of units, or `enough` once it holds that many;
    None where it cannot be read)."""
    total = 0
    if n_files < 1:
        return  # "no files to read": said where the files are listed
    for f in range(n_files):
        n = units(f, rank + 1 - total if shuffled else rank + 1)
        if n is None:
            return  # unknown: the coordinator says what is wrong with the file
        total = total + n if shuffled else max(total, n)
        if total > rank:
            return
    raise shuffled_error(rank, world, n_files, total) if shuffled else files_order_error(rank, world, n_files)
