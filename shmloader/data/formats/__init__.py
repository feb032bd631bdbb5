"""Data file formats, one module each, found by file name: the registry.

| suffix | format | unit |
|---|---|---|
| `.parquet` | `parquet.Parquet` | a row group |
| `.jsonl`, `.json` (+ `.gz`, `.zst`) | `jsonl.JsonLines` | 1024 lines |
| `.arrow`, `.feather` | `arrow.ArrowIPC` (file or stream format) | a record batch |

Every format implements `base.Format` (its docstring is the interface); nothing outside this
package asks which format a file is: `open_file(path, filesystem)` opens it as its name says,
`is_data_file(name)` says whether a listing keeps it, `digests` gives files' identities,
`place_of(path, unit, first, last)` names a place in it in its format's words (every message
that names one asks it: a JSON Lines file's lines, not "row group"). A
new format is one module, its line in `FORMATS` and its unit test.
"""
from ...errors import DataError
from .arrow import ArrowIPC
from .base import Format
from .column import TEXT, TOKENS, Ids
from .jsonl import JsonLines
from .parquet import Parquet, footer_digest

FORMATS = (Parquet, JsonLines, ArrowIPC)
SUFFIXES = tuple(s for fmt in FORMATS for s in fmt.suffixes)

__all__ = ["FORMATS", "SUFFIXES", "Format", "Ids", "TEXT", "TOKENS", "digest_of", "format_of", "footer_digest",
           "format_name", "identity_of", "is_data_file", "open_file", "place_of", "docs_of_unit", "units_of"]


def format_of(path: str) -> type:
    """The format a file's name says (the longest matching suffix), else a `DataError`."""
    name = path.lower()
    found = [(len(s), fmt) for fmt in FORMATS for s in fmt.suffixes if name.endswith(s)]
    if not found:
        raise DataError(f"{path}: not a data file this loader reads (by its name: {', '.join(SUFFIXES)}); "
                        f"rename it or convert it")
    return max(found, key=lambda t: t[0])[1]


def is_data_file(name: str) -> bool:
    """Whether a directory's listing keeps a file of this name (a `*.parquet.tmp` download is not)."""
    return name.lower().endswith(SUFFIXES)


def open_file(path: str, filesystem=None) -> Format:
    """`path` opened as its format (a `DataError` when it cannot be)."""
    return format_of(path)(path, filesystem)


def format_name(path: str) -> str:
    """The registry's name of a file's format ("parquet", "jsonl", "arrow")."""
    return format_of(path).name


def place_of(path: str, unit: int, first: int | None = None, last: int | None = None) -> str:
    """A place in a file, in its format's words (`Format.place`): unit `unit`, and its rows
    `first` to `last` (inclusive); a file of no format (by its name), a parquet file's words."""
    try:
        fmt = format_of(path)
    except DataError:
        fmt = Parquet
    return fmt.place(unit, first, last)


def docs_of_unit(path: str, unit: int, first: int, last: int | None = None, ordered: bool = False) -> str:
    """Documents `first` to `last` of unit `unit` of a file, in words: as `place_of` says them
    where `ordered` (the unit's rows, in the files' order), else the unit and the documents' numbers
    in the order read (a shuffled window's order, headed by that unit: its rows are elsewhere)."""
    if ordered:
        return place_of(path, unit, first, last)
    docs = f"document {first}" if last in (None, first) else f"documents {first}-{last}"
    return f"{place_of(path, unit)}, {docs} in the order read"


def units_of(paths: list) -> str:
    """Several units of `paths`' files in words: their format's (`Format.units_name`: "row groups"),
    or "units" when they are of several formats."""
    found = {format_of(path).units_name for path in paths}
    return found.pop() if len(found) == 1 else "units"


def identity_of(path: str) -> str:
    """What a file's `digest_of` is of, in words for a message ("its parquet footer")."""
    return format_of(path).identity


def digest_of(path: str, filesystem=None) -> str:
    """A file's identity beyond its name and size (parquet: its footer's digest)."""
    return open_file(path, filesystem).digest()
