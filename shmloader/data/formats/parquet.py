"""Parquet: a unit is a row group; identity is a digest of the footer.

Row counts and each row group's column size come from the footer (read once when the file is
opened); a read decompresses the row group's column alone, whole, and keeps it for the next
pieces of the same row group. A local file reads 7% faster without pre-buffering; a remote one
pre-buffers (its reads coalesced).
"""
import hashlib

import pyarrow as pa
import pyarrow.parquet as pq

from ...errors import DataError
from .base import Format
from .column import docs_of, kind_of


def footer_digest(metadata) -> str:
    """A file's identity beyond its name and size: a hash of its parquet footer (the schema,
    every row group's rows, column chunks' offsets and compressed sizes), which a rewrite with
    other text changes unless every page compresses to the same size. Re-serialised from the
    metadata already read (no second read); about 0.5 ms for a 50-row-group shard."""
    sink = pa.BufferOutputStream()
    metadata.write_metadata_file(sink)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]


def _not_all_null(chunk, rows: int) -> bool:
    """Whether a column chunk may hold a value: not when its statistics count `rows` nulls;
    statistics absent or unreadable say nothing (a check must never refuse what reads)."""
    try:
        stats = chunk.statistics
        return stats is None or not stats.has_null_count or stats.null_count < rows
    except (pa.ArrowException, ValueError):
        return True


class Parquet(Format):
    name, suffixes = "parquet", (".parquet",)
    unit = "row group"
    units_name = "row groups"
    unit_is = "a parquet row group"
    identity = "its parquet footer"

    def __init__(self, path: str, filesystem=None):
        super().__init__(path, filesystem)
        try:
            self.file = pq.ParquetFile(path, filesystem=filesystem, pre_buffer=filesystem is not None)
        except FileNotFoundError as exc:
            raise DataError(f"{path}: file not found ({exc})") from exc
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: not a readable parquet file ({exc}); re-download or "
                            f"rewrite it") from exc
        md = self.file.metadata
        self._groups = [md.row_group(i) for i in range(md.num_row_groups)]
        self._last = None  # (rg, column, its values)

    def rows(self) -> list:
        return [g.num_rows for g in self._groups]

    def n_units(self) -> int:
        return len(self._groups)

    def digest(self) -> str:
        return footer_digest(self.file.metadata)

    def kind(self, column: str, where: str = "") -> str:
        return kind_of(self.path, self.file.schema_arrow, column, where)

    def may_hold(self, column: str) -> list:
        """Each row group: False when the footer says it has no rows, or that `column` (a flat
        one: text) is null in all of them (its statistics' null count); True otherwise, also
        without statistics and for a list column (token ids), whose null count is of its ids."""
        g = self._groups
        at = next((j for j in range(g[0].num_columns) if g[0].column(j).path_in_schema == column), None) if g else None
        return [r.num_rows > 0 and (at is None or _not_all_null(r.column(at), r.num_rows)) for r in g]

    def unit_bytes(self, column: str) -> list:
        """Each row group's column chunk size, uncompressed, from the footer: about its text's
        size (plus 4 bytes a row; a dictionary-encoded column counts each distinct text once).
        0 for every row group when there is no such column (the worker that reads it says so)."""
        g = self._groups
        at = next((j for j in range(g[0].num_columns) if g[0].column(j).path_in_schema == column), None) if g else None
        return [0 if at is None else r.column(at).total_uncompressed_size for r in g]

    def read(self, unit: int, start: int, end: int, column: str, n_vocab: int | None = None) -> list:
        if self._last is None or self._last[:2] != (unit, column):
            self._last = None
            self._last = (unit, column, self._read(unit, column))
        kind, values = self._last[2]
        return docs_of(values.slice(start, end - start), kind, n_vocab,
                       lambda i: f"{self.path}: {self.place(unit, start + i)}")

    def _read(self, rg: int, column: str):
        kind = kind_of(self.path, self.file.schema_arrow, column, f"row group {rg}: ")
        try:
            # one thread: a worker is one process per core already; pyarrow's pool would
            # only contend with the other workers for the same cores
            values = self.file.read_row_group(rg, columns=[column], use_threads=False).column(column)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{self.path}: row group {rg} cannot be read ({exc}); the file is "
                            f"corrupt or truncated: re-download or rewrite it") from exc
        return kind, values
