"""JSON Lines (`.jsonl`, `.json`: one object a line), plain or compressed (`.gz`, `.zst`).

**Units.** A unit is `LINES` lines (1024, a nanochat row group's documents): unit k is lines
`[k * LINES, (k + 1) * LINES)` of the file, whatever its compression, so a `.jsonl` and its
`.jsonl.zst` have the same units (and a parquet file written with 1024-row row groups the same
too). A line is what lies between two `\\n` (a last line without one counts; a `\\n` at the end
starts none); a blank line is a null document (no tokens), as a null text is in parquet.

**What reaching a place costs.** Row counts need every line found: `rows()` reads the file
whole once per process that asks (the coordinator; a worker only with a token cache, or to
name a bad line), finding `\\n` at memory speed (numpy), decompressing a compressed file as it
goes. A plain file's reads then go straight to their lines' bytes (its line offsets are kept
while the file is open, 8 bytes a line): a worker reads only its piece's lines. A compressed
file cannot be entered in the middle: a worker reads it forward from its start, keeping its
place (`_Forward`), so the pieces it is given of one file, in order, cost one decompression
of the file up to the last of them; a piece before its place starts again from the top. With
N workers sharing a file, each decompresses it about once (zstd and gzip: hundreds of MB/s,
small beside tokenizing). On a remote filesystem that is one download of the file per process.

**Rows.** Each line is parsed with `json.loads` (the stdlib's C parser): a line that is not
JSON, not an object, or lacks the column is a `DataError` naming the file and line (1-based);
the column's value is text (a string), token ids (a list of integers), or null. A file's
identity is `base.edge_digest` (its size and both ends).
"""
import json

import numpy as np
import pyarrow as pa

from ...errors import DataError
from .base import Format, edge_digest, open_input
from .column import TEXT, TOKENS, Ids, check_ids

LINES = 1024           # lines per unit
CHUNK = 4 << 20        # bytes read (decompressed) at a time
CODECS = {".gz": "gzip", ".zst": "zstd"}


class JsonLines(Format):
    name = "jsonl"
    unit = "unit of lines"
    suffixes = tuple(s + c for s in (".jsonl", ".json") for c in ("", ".gz", ".zst"))

    def __init__(self, path: str, filesystem=None):
        super().__init__(path, filesystem)
        self.codec = next((c for s, c in CODECS.items() if path.endswith(s)), None)
        if self.codec is not None and not pa.Codec.is_available(self.codec):
            raise DataError(f"{path}: this pyarrow cannot decompress {self.codec}; install a pyarrow with it")
        self._starts = None   # line start offsets (decompressed bytes), then the end: len(lines) + 1
        self._forward = None  # a compressed file's reader, where it stands

    def _stream(self):
        raw = open_input(self.path, self.filesystem, stream=True)
        return raw if self.codec is None else pa.CompressedInputStream(raw, self.codec)

    def _chunks(self, stream):
        try:
            while True:
                chunk = stream.read(CHUNK)
                if not chunk:
                    return
                yield chunk
        except (pa.ArrowException, OSError, EOFError) as exc:
            raise DataError(f"{self.path}: cannot be read{' as ' + self.codec if self.codec else ''} ({exc}); "
                            f"the file is corrupt or truncated: re-download or rewrite it") from exc

    def _lines(self) -> np.ndarray:
        """Every line's start, then the end of the data: one pass over the file."""
        if self._starts is None:
            ends, at, last = [np.zeros(1, dtype=np.int64)], 0, b"\n"
            stream = self._stream()
            try:
                for chunk in self._chunks(stream):
                    ends.append(np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10).astype(np.int64) + at + 1)
                    at, last = at + len(chunk), chunk[-1:]
            finally:
                stream.close()
            starts = np.concatenate(ends)
            if last != b"\n":  # a last line without its newline
                starts = np.append(starts, at)
            self._starts = starts
        return self._starts

    def rows(self) -> list:
        n = len(self._lines()) - 1
        return [min(LINES, n - lo) for lo in range(0, n, LINES)]

    def unit_bytes(self, column: str) -> list:
        starts = self._lines()
        n = len(starts) - 1
        return [int(starts[min(lo + LINES, n)] - starts[lo]) for lo in range(0, n, LINES)]

    def digest(self) -> str:
        return edge_digest(self.path, self.filesystem)

    def kind(self, column: str, where: str = "") -> None:
        return None  # a line's value says (read, below)

    def read(self, unit: int, start: int, end: int, column: str, n_vocab: int | None = None) -> list:
        lo = unit * LINES + start
        lines = self._read_lines(lo, unit * LINES + end)
        return self._docs(lines, lo, column, n_vocab)

    def _read_lines(self, lo: int, hi: int) -> list:
        """Lines `[lo, hi)` of the file, as bytes."""
        if self.codec is None:
            starts = self._lines()
            if hi > len(starts) - 1:
                raise DataError(f"{self.path}: lines {lo + 1}-{hi} asked, the file has {len(starts) - 1}: it "
                                f"changed while it was read; a data file must not be rewritten under a running loader")
            f = open_input(self.path, self.filesystem)
            try:
                data = f.read_at(int(starts[hi] - starts[lo]), int(starts[lo]))
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{self.path}: cannot be read ({exc}); re-download or rewrite it") from exc
            finally:
                f.close()
            return data.split(b"\n")[:hi - lo]
        if self._forward is None or self._forward.line > lo:
            if self._forward is not None:
                self._forward.close()
            self._forward = _Forward(self._stream(), self._chunks)
        return self._forward.take(lo, hi, self.path)

    def _docs(self, lines: list, first: int, column: str, n_vocab: int | None) -> list:
        """Each line's `column` as a document: str, token ids (`Ids`) or None."""
        out, kind = [], None
        for i, line in enumerate(lines):
            if not line.strip():
                out.append(None)
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{self.path}: line {first + i + 1} is not JSON ({exc}); fix the line or pass "
                                f"on_bad_row_group='skip'") from exc
            if not isinstance(obj, dict) or column not in obj:
                keys = list(obj)[:8] if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
                raise DataError(f"{self.path}: line {first + i + 1} has no {column!r} field (found {keys}); each "
                                f"line must be an object with the documents' column, or pass column= naming it")
            value = obj[column]
            now = TEXT if isinstance(value, str) else TOKENS if isinstance(value, list) else None if value is None else "?"
            if now == "?" or (now is not None and kind is not None and now != kind):
                raise DataError(f"{self.path}: line {first + i + 1}: {column!r} is {type(value).__name__}, expected "
                                f"{'a string (text) or a list of integers (token ids)' if now == '?' else kind + ' like the lines before it'}")
            kind = kind or now
            out.append(value)
        if kind != TOKENS:
            return out
        return _ids(out, n_vocab, lambda i: f"{self.path}: line {first + i + 1}")


def _ids(values: list, n_vocab: int | None, where) -> Ids:
    out = Ids()
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        try:
            a = np.array(v, dtype=np.int64)
        except (TypeError, ValueError, OverflowError) as exc:
            raise DataError(f"{where(i)}: token ids must be a list of integers ({exc})") from exc
        if a.ndim != 1:
            raise DataError(f"{where(i)}: token ids must be a flat list of integers, got {a.ndim} levels")
        check_ids(a, np.array([0, len(a)]), n_vocab, lambda _: where(i))
        out.append(a)
    return out


class _Forward:
    """A compressed file read forward: `take(lo, hi)` gives lines `[lo, hi)`, from where the
    last take ended (`line`), decompressing on."""

    def __init__(self, stream, chunks):
        self.stream, self._chunks = stream, chunks(stream)
        self.line, self.buf, self.pos = 0, b"", 0  # line `line` starts at buf[pos]

    def take(self, lo: int, hi: int, path: str) -> list:
        out, buf, pos = [], self.buf, self.pos
        while self.line < hi:
            cut = buf.find(b"\n", pos)
            if cut < 0:
                chunk = next(self._chunks, None)
                if chunk is not None:
                    buf, pos = buf[pos:] + chunk, 0
                    continue
                if pos == len(buf):
                    self.buf, self.pos = buf, pos
                    raise DataError(f"{path}: lines {lo + 1}-{hi} asked, the file has {self.line}: it changed "
                                    f"while it was read; a data file must not be rewritten under a running loader")
                cut = len(buf)  # the last line, without its newline
            if self.line >= lo:
                out.append(buf[pos:cut])
            pos, self.line = min(cut + 1, len(buf)), self.line + 1
        self.buf, self.pos = buf, pos
        return out

    def close(self):
        self.stream.close()
