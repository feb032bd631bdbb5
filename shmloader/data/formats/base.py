"""The one interface every format implements (`Format`), and what formats share.

A `Format` is one data file, opened. All the rest of the loader knows of a file is:
- `rows()`: rows per *unit*, the format's unit of work (a parquet row group, an Arrow record
  batch, a span of lines): the canonical order deals units to ranks (`rank, rank + world, ...`)
  and cuts them into pieces for the workers, so that workers share a file and ranks an epoch;
- `unit_bytes(column)`: about the text bytes of each unit's column (0: unknown), to cut pieces;
- `read(unit, start, end, column, n_vocab)`: rows `[start, end)` of a unit's column as
  documents (`column.docs_of`: str, or token ids checked against `n_vocab`); a row that cannot
  be read is a `DataError` naming the file and the row (a row group's row, a line);
- `digest()`: the file's identity beyond its name and size (a state and a run check it),
  `identity` what it is of in words: `edge_digest` unless a format overrides both (parquet);
- `place(unit, first, last)` (a class method: no file opened): a place in a file of the format,
  in its words, for every message that names one (a parquet row group and its document rows;
  JSON Lines its lines, counted from 1; an Arrow record batch and its rows);
- `kind(column, where)`: `column.TEXT` or `column.TOKENS` where the file says it cheaply (a schema;
  JSON Lines: its first value), else None; a missing or wrong column is a `DataError` (checked
  ahead: source.SchemaCheck);
- `n_units()`: the number of units where known without reading the file whole, else None;
- `units(enough)`: the number of units, or `enough` once the file is known to hold that many
  (JSON Lines reads only so far: whether a rank has a unit, data/units.py);
- `may_hold(column)`: for each unit, False where its metadata says it holds no document (no
  rows, or the column null in every row), else True; None where the file cannot say without
  reading its documents (JSON Lines): whether a rank has a document, data/units.py.

A format opens its file through the filesystem object it is given (None: local), so every
`pyarrow.fs` filesystem reads every format. Opening a file that is not of its format is a
`DataError` that names the format it expected.
"""
import hashlib

import pyarrow as pa

from ...errors import DataError

EDGE_BYTES = 64 << 10  # `edge_digest` reads this much at each end of a file


class Format:
    name = ""        # the registry's name for it ("parquet", "jsonl", "arrow")
    unit = ""        # what its unit is called in messages ("row group")
    units_name = ""  # and several of them ("row groups")
    unit_is = ""     # what its unit is, told to a user without the file ("a parquet row group")
    suffixes = ()    # file names ending so are of this format (formats/__init__.py)
    # what `digest()` is of, in messages: a state's check that a file is the one it saved (the
    # base's `digest`, `edge_digest`; a format that overrides `digest` overrides this: parquet)
    identity = f"the digest of its first and last {EDGE_BYTES >> 10} KiB"

    def __init__(self, path: str, filesystem=None):
        self.path, self.filesystem = path, filesystem

    @classmethod
    def place(cls, unit: int, first: int | None = None, last: int | None = None) -> str:
        """Unit `unit` in words, and with `first` its row `first` (to `last`, inclusive): "row
        group 3, row 5", "record batch 3, rows 5-9"."""
        where = f"{cls.unit} {unit}"
        if first is None:
            return where
        return where + (f", row {first}" if last in (None, first) else f", rows {first}-{last}")

    def rows(self) -> list:
        raise NotImplementedError

    def unit_bytes(self, column: str) -> list:
        raise NotImplementedError

    def read(self, unit: int, start: int, end: int, column: str, n_vocab: int | None = None) -> list:
        raise NotImplementedError

    def digest(self) -> str:
        """The file's identity beyond its name and size, as `identity` words it: `edge_digest`
        (its size and both ends) unless the format overrides both."""
        return edge_digest(self.path, self.filesystem)

    def kind(self, column: str, where: str = "") -> str | None:
        return None

    def n_units(self) -> int | None:
        return None

    def units(self, enough: int) -> int:
        n = self.n_units()
        return min(enough, n if n is not None else len(self.rows()))

    def may_hold(self, column: str) -> list | None:
        return None


def open_input(path: str, filesystem=None, stream: bool = False):
    """A pyarrow input file (random access), or with `stream` a sequential stream, on
    `filesystem` (None: local). Not found and other failures are `DataError`s naming the file."""
    try:
        if filesystem is None:
            return pa.OSFile(path) if not stream else pa.input_stream(path, compression=None)
        return filesystem.open_input_stream(path, compression=None) if stream else filesystem.open_input_file(path)
    except FileNotFoundError as exc:
        raise DataError(f"{path}: file not found ({exc})") from exc
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot open it ({exc}); check that it exists and is readable") from exc


def edge_digest(path: str, filesystem=None) -> str:
    """A file's identity beyond its name: a hash of its size, its first and its last
    `EDGE_BYTES` (an Arrow file's footer, a JSON Lines file's first and last documents): a
    rewrite that changes neither end nor the size is not seen. Two reads, whatever its size."""
    f = open_input(path, filesystem)
    try:
        size = f.size()
        head = f.read_at(min(EDGE_BYTES, size), 0)
        tail = f.read_at(min(EDGE_BYTES, size), max(0, size - EDGE_BYTES))
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot be read ({exc}); re-download or rewrite it") from exc
    finally:
        f.close()
    return hashlib.sha256(str(size).encode() + b"\0" + head + b"\0" + tail).hexdigest()[:16]
