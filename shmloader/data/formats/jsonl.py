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
JSON, not an object, or lacks the column is a `DataError` naming the file and line (1-based),
and so is a text holding a lone surrogate (a `\\ud83d` escape without its pair: valid JSON, not
Unicode text; invalid UTF-8 in a parquet file is refused alike). The column's value is text (a
string), token ids (a list of JSON integers: a float, string, boolean or null among them is a
`DataError`, never coerced), or null. A file's column is of one kind, its first string or list
value's (`kind`: read from the file's start, usually one line, once per process): a line of the
other kind is a `DataError` at that line, whatever the pieces the file is cut into. A UTF-8
BOM before a line is read past (`json.loads` of bytes). A file whose first non-space byte
(after a BOM) is `[` is one JSON array, not JSON Lines: a `DataError` saying how to convert it
when the file is first read. A file's identity is `base.edge_digest` (its size and
both ends).
"""
import contextlib
import json

import numpy as np
import pyarrow as pa

from ...errors import DataError
from .base import Format, open_input
from .column import TEXT, TOKENS, Ids, check_ids, outside

LINES = 1024           # lines per unit
CHUNK = 4 << 20        # bytes read (decompressed) at a time
HEAD_CHUNK = 64 << 10  # the same, looking for a file's first value (`kind`)
CODECS = {".gz": "gzip", ".zst": "zstd"}
ZSTD_WINDOW = "Frame requires too much memory"  # pyarrow's zstd error for a window past its limit


class JsonLines(Format):
    name = "jsonl"
    unit = "unit of lines"
    units_name = f"units of {LINES} lines"
    unit_is = f"{LINES} lines of JSON Lines"
    suffixes = tuple(s + c for s in (".jsonl", ".json") for c in ("", ".gz", ".zst"))

    @classmethod
    def place(cls, unit: int, first: int | None = None, last: int | None = None) -> str:
        """The lines of unit `unit`'s rows `first` to `last` (all of them without `first`),
        counted from 1 as an editor does: "line 2051", "lines 2049-3072"."""
        base = unit * LINES
        if first is None:
            return f"lines {base + 1}-{base + LINES}"
        if last in (None, first):
            return f"line {base + first + 1}"
        return f"lines {base + first + 1}-{base + last + 1}"

    def __init__(self, path: str, filesystem=None):
        super().__init__(path, filesystem)
        self.codec = next((c for s, c in CODECS.items() if path.lower().endswith(s)), None)  # as the registry
        if self.codec is not None and not pa.Codec.is_available(self.codec):
            raise DataError(f"{path}: this pyarrow cannot decompress {self.codec}; install a pyarrow with it")
        self._starts = None   # line start offsets (decompressed bytes), then the end: len(lines) + 1
        self._forward = None  # a compressed file's reader, where it stands
        self._kinds = {}      # column -> (its kind in this file, the line that says it)

    def _stream(self):
        raw = open_input(self.path, self.filesystem, stream=True)
        return raw if self.codec is None else pa.CompressedInputStream(raw, self.codec)

    def _read_through(self, size: int = CHUNK):
        """The file's bytes from its start, `size` at a time (`_chunks`), its stream closed once
        read or left (`_lines` reads it whole; `units` and `_head` only as far as they must)."""
        stream = self._stream()
        try:
            yield from self._chunks(stream, size)
        finally:
            stream.close()

    def _chunks(self, stream, size: int = CHUNK):
        try:
            while True:
                chunk = stream.read(size)
                if not chunk:
                    return
                yield chunk
        except (pa.ArrowException, OSError, EOFError) as exc:
            if ZSTD_WINDOW in str(exc):
                name = self.path.rsplit("/", 1)[-1]
                raise DataError(f"{self.path}: cannot be read as zstd ({exc}): it was compressed with a window over "
                                f"the decoder's limit (zstd --long=28 or more: pyarrow's decoder takes windows up to "
                                f"128 MiB, --long=27, and cannot be given more); recompress it without --long, e.g. "
                                f"`zstd -dc --long=31 {name} | zstd -o new.jsonl.zst`") from exc
            if self.codec is not None and (other := self._other_bytes()) is not None:
                raise DataError(f"{self.path}: cannot be read as {self.codec}: the file is {other[0]} (its first "
                                f"bytes); name it {other[1]} to read it as that") from exc
            raise DataError(f"{self.path}: cannot be read{' as ' + self.codec if self.codec else ''} ({exc}); "
                            f"the file is corrupt or truncated: re-download or rewrite it") from exc

    def _other_bytes(self) -> "tuple | None":
        """`(what it is, the name that reads it)` of a compressed file's raw first bytes when they
        are not its codec's: another format's (`MAGIC`) or JSON text; None when they are its own
        (the file is corrupt) or unknown, also where its first bytes cannot be read (the caller's
        error says the file cannot be read)."""
        try:
            with contextlib.closing(open_input(self.path, self.filesystem, stream=True)) as raw:
                head = raw.read(8)
        except (pa.ArrowException, OSError):
            return None
        name = self.path.rsplit("/", 1)[-1]
        codec = next(s for s in CODECS if name.lower().endswith(s))
        plain, stem = name[:-len(codec)], _stem(name)
        kind = _magic(head)
        if kind is not None:
            return None if kind[1].endswith(codec) else (kind[0], stem + kind[1])
        if head.removeprefix(BOM).lstrip()[:1] in (b"{", b"["):
            return "not compressed", plain
        return None

    def _lines(self) -> np.ndarray:
        """Every line's start, then the end of the data: one pass over the file."""
        if self._starts is None:
            ends, at, last, head = [np.zeros(1, dtype=np.int64)], 0, b"\n", _Head(self.path)
            with contextlib.closing(self._read_through()) as chunks:
                for chunk in chunks:
                    head.check(chunk)
                    ends.append(np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10).astype(np.int64) + at + 1)
                    at, last = at + len(chunk), chunk[-1:]
            starts = np.concatenate(ends)
            if last != b"\n":  # a last line without its newline
                starts = np.append(starts, at)
            self._starts = starts
        return self._starts

    def units(self, enough: int) -> int:
        """The units, or `enough` once `enough - 1` units and a line are found: the file is read
        only so far (its first chunk for one unit), its lines not kept."""
        if self._starts is not None or enough < 1:
            return min(enough, len(self.rows()))
        need, lines, last = (enough - 1) * LINES + 1, 0, b"\n"
        with contextlib.closing(self._read_through()) as chunks:
            for chunk in chunks:
                lines, last = lines + chunk.count(b"\n"), chunk[-1:]
                if lines >= need:
                    return enough
        lines += last != b"\n"  # a last line without its newline (as `_lines` counts it)
        return -(-lines // LINES)

    def rows(self) -> list:
        n = len(self._lines()) - 1
        return [min(LINES, n - lo) for lo in range(0, n, LINES)]

    def unit_bytes(self, column: str) -> list:
        starts = self._lines()
        n = len(starts) - 1
        return [int(starts[min(lo + LINES, n)] - starts[lo]) for lo in range(0, n, LINES)]

    def kind(self, column: str, where: str = "") -> str | None:
        """The kind of the file's first value of `column` that is a string or a list (lines
        that cannot be read are their own lines' errors, when read), None when it has none
        in its first unit: read from the start of the file, mostly its first line. A file
        that is one JSON array is a `DataError`."""
        kind, _ = self._kind(column, LINES, where)
        return kind

    def _kind(self, column: str, limit: int | None = None, where: str = "") -> tuple:
        """`(kind, line)`: the file's kind of `column` and the (1-based) line that says it, or
        `(None, 0)` when none of its first `limit` lines (None: all) has a string or a list."""
        if column in self._kinds:
            return self._kinds[column]
        found, lines = (None, 0), self._head(where)
        try:
            for n, line in lines:
                if limit is not None and n > limit:
                    return found  # not kept: another caller may look further
                try:
                    value = self._value(line, n, column)
                except DataError:
                    continue
                if value is not None:
                    found = (TEXT if isinstance(value, str) else TOKENS, n)
                    break
        finally:
            lines.close()
        self._kinds[column] = found
        return found

    def _head(self, where: str = ""):
        """`(number, line)` of the file's lines from its start (1-based), read as they are taken."""
        head, n, part = _Head(self.path, where), 0, []  # part: the line so far
        with contextlib.closing(self._read_through(HEAD_CHUNK)) as chunks:
            for chunk in chunks:
                head.check(chunk)
                lines = chunk.split(b"\n")
                if len(lines) > 1:
                    n += 1
                    yield n, b"".join(part + lines[:1])
                    for line in lines[1:-1]:
                        n += 1
                        yield n, line
                    part = []
                part.append(lines[-1])
            if any(part):
                yield n + 1, b"".join(part)

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
        """Each line's `column` as a document: str, token ids (`Ids`) or None. Every value is
        of the file's kind (`_kind`: its first value's), whatever piece the line is read in."""
        out, kind = [], None
        for i, line in enumerate(lines):
            value = self._value(line, first + i + 1, column)
            if value is not None:
                now = TEXT if isinstance(value, str) else TOKENS
                if kind is None:
                    kind, said = self._kind(column)
                    kind, said = (kind, said) if kind is not None else (now, first + i + 1)  # changed since
                if now != kind:
                    raise DataError(f"{self.path}: line {first + i + 1}: {column!r} is {type(value).__name__}, "
                                    f"expected {_KIND_WORDS[kind]} like the file's first value (line {said}): a "
                                    f"file's column is all text or all token ids; write each kind to a file of its own")
            out.append(value)
        if kind != TOKENS:
            return out
        return _ids(out, n_vocab, lambda i: f"{self.path}: line {first + i + 1}")

    def _value(self, line: bytes, n: int, column: str):
        """Line `n`'s value of `column`: a str, a list or None (a null, a blank line); else a
        `DataError` naming the file and line."""
        if not line.strip():
            return None
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{self.path}: line {n} is not JSON ({exc}); fix the line or pass "
                            f"on_bad_row_group='skip'") from exc
        if not isinstance(obj, dict) or column not in obj:
            keys = list(obj)[:8] if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
            raise DataError(f"{self.path}: line {n} has no {column!r} field (found {keys}); each "
                            f"line must be an object with the documents' column, or pass column= naming it")
        value = obj[column]
        if value is not None and not isinstance(value, (str, list)):
            raise DataError(f"{self.path}: line {n}: {column!r} is {type(value).__name__}, expected a string "
                            f"(text) or a list of integers (token ids)")
        if isinstance(value, str) and not value.isascii():  # isascii: O(1) in CPython
            _unicode(value, f"{self.path}: line {n}: {column!r}")
        return value


def _unicode(text: str, where: str):
    """A `DataError` if `text` is not Unicode text: a lone surrogate (half a UTF-16 pair), which
    JSON's `\\ud83d` escape (or CESU-8 bytes) gives to `json.loads` and no UTF-8 tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        at = exc.start
        raise DataError(f"{where} holds a lone surrogate ({text[at]!r} at character {at}: half of a UTF-16 "
                        f"pair, not Unicode text); fix the line or pass on_bad_row_group='skip'") from None


_KIND_WORDS = {TEXT: "text (a string)", TOKENS: "token ids (a list of integers)"}
_JSON_TYPES = {bool: "boolean", float: "number with a fraction or exponent", str: "string", list: "list",
               dict: "object"}


def _ids(values: list, n_vocab: int | None, where) -> Ids:
    """Each list of `values` as int64 ids checked against `n_vocab`: every element a JSON
    integer (not a float, string, boolean or null: nothing is coerced), else a `DataError`."""
    out = Ids()
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        if set(map(type, v)) - {int}:
            k, x = next((k, x) for k, x in enumerate(v) if type(x) is not int)
            json_type = _JSON_TYPES.get(type(x), type(x).__name__)
            what = "a null" if x is None else f"{json.dumps(x)[:40]} (a JSON {json_type})"
            raise DataError(f"{where(i)}: token ids must be a list of integers, but element {k} is {what}; "
                            f"write every id as a JSON integer (nothing is rounded or converted)")
        try:
            a = np.array(v, dtype=np.int64)
        except OverflowError:
            big = next(x for x in v if not -(1 << 63) <= x < (1 << 63))
            raise DataError(f"{where(i)}: {outside(big, n_vocab)}") from None
        check_ids(a, np.array([0, len(a)]), n_vocab, lambda _: where(i))
        out.append(a)
    return out


BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which Windows tools write first
# the first bytes of files of other formats (what each is, the name that reads it), never JSON's first bytes
MAGIC = {b"\x1f\x8b": ("gzip-compressed data", ".jsonl.gz"),
         b"\x28\xb5\x2f\xfd": ("zstd-compressed data", ".jsonl.zst"),
         b"PAR1": ("a Parquet file", ".parquet"), b"ARROW1": ("an Arrow IPC file", ".arrow")}


class _Head:
    """The first bytes of a file: a JSON array (first non-space byte `[`, after a BOM) is not
    JSON Lines, nor is a file of another format (`MAGIC`: a `.jsonl` that is gzip data, say)."""

    def __init__(self, path: str, where: str = ""):
        self.path, self.where, self.done, self.first = path, where, False, True

    def check(self, chunk: bytes):
        if self.done:
            return
        if self.first:
            self.first = False
            self._other_format(chunk)
            chunk = chunk.removeprefix(BOM)
        start = chunk.lstrip()[:1]
        if not start:
            return  # all space so far
        self.done = True
        if start == b"[":
            name = self.path.rsplit("/", 1)[-1]
            stem = name.split(".")[0] or "docs"
            raise DataError(f"{self.path}: {self.where}the file is one JSON array (its first character is '['), not "
                            f"JSON Lines (one JSON object a line); convert it, e.g. `jq -c '.[]' {name} > {stem}.jsonl`"
                            f"{' (decompress it first)' if name.endswith(('.gz', '.zst')) else ''}")

    def _other_format(self, chunk: bytes):
        """A `DataError` when the file begins as another format does (`MAGIC`), with its name."""
        what = _magic(chunk)
        if what is None:
            return
        name = self.path.rsplit("/", 1)[-1]
        compressed = name.lower().endswith(tuple(CODECS))
        stem = _stem(name)
        todo = ("it is compressed twice: decompress it once and name it as what is left" if compressed else
                f"name it {stem}{what[1]} to read it as that (formats are read by their file names)")
        raise DataError(f"{self.path}: {self.where}the file{' decompressed' if compressed else ''} is {what[0]} "
                        f"(its first bytes), not JSON Lines; {todo}")


def _magic(head: bytes) -> "tuple | None":
    """`MAGIC`'s entry for a file whose bytes begin `head` (what it is, the name that reads it), or None."""
    return next((kind for magic, kind in MAGIC.items() if head.startswith(magic)), None)


def _stem(name: str) -> str:
    """A JSON Lines file's name before its `.json`/`.jsonl` suffix (any case): `docs` of `docs.jsonl.gz`."""
    at = name.lower().rfind(".json")
    return name[:at] if at > 0 else name


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
