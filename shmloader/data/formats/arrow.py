"""Arrow IPC (`.arrow`, `.feather`): the file format and the stream format; a unit is a record batch.

Which of the two a file is, its first bytes say: the file format begins with the magic
`ARROW1` (Feather v2 is the file format); the stream format (Hugging Face `datasets` cache
files) with a message. A local file is memory-mapped and its batches are views of the mapping:
counting rows and reaching batch k cost a walk over the batches' headers (the stream format
has no footer), nothing is copied until a piece's rows are read. A file on another filesystem
is read whole into memory when opened (once per process that opens it). A file's identity is
`base.edge_digest` (its size and both ends: the file format's footer among them).
"""
import pyarrow as pa

from ...errors import DataError
from .base import Format, open_input
from .column import docs_of, kind_of

MAGIC = b"ARROW1"


class ArrowIPC(Format):
    name, suffixes = "arrow", (".arrow", ".feather")
    unit = "record batch"
    units_name = "record batches"
    unit_is = "an Arrow record batch"

    def __init__(self, path: str, filesystem=None):
        super().__init__(path, filesystem)
        try:
            if filesystem is None:
                source = pa.memory_map(path)
            else:
                f = open_input(path, filesystem)
                source = pa.BufferReader(f.read_buffer())
                f.close()
            head = source.read_at(len(MAGIC), 0) if source.size() >= len(MAGIC) else b""
            if head == MAGIC:
                reader = pa.ipc.open_file(source)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            else:
                reader = pa.ipc.open_stream(source)
                batches = list(reader)
        except FileNotFoundError as exc:
            raise DataError(f"{path}: file not found ({exc})") from exc
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: not a readable Arrow IPC file (file or stream format) ({exc}); "
                            f"re-download or rewrite it (Feather v1 files are not read: rewrite them as v2)") from exc
        self.schema, self.batches = reader.schema, batches

    def rows(self) -> list:
        return [b.num_rows for b in self.batches]

    def n_units(self) -> int:
        return len(self.batches)

    def kind(self, column: str, where: str = "") -> str:
        return kind_of(self.path, self.schema, column, where)

    def may_hold(self, column: str) -> list:
        """Each record batch: False when it has no rows or `column` is null in all of them (the
        batch's header says; nothing is read), else True."""
        if column not in self.schema.names:
            return [b.num_rows > 0 for b in self.batches]
        return [b.num_rows > b.column(column).null_count for b in self.batches]

    def unit_bytes(self, column: str) -> list:
        if column not in self.schema.names:
            return [0] * len(self.batches)
        return [b.column(column).nbytes for b in self.batches]

    def read(self, unit: int, start: int, end: int, column: str, n_vocab: int | None = None) -> list:
        kind = kind_of(self.path, self.schema, column, f"record batch {unit}: ")
        values = self.batches[unit].column(column).slice(start, end - start)
        return docs_of(values, kind, n_vocab, lambda i: f"{self.path}: {self.place(unit, start + i)}")
