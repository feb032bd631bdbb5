"""The token cache: each row group tokenized once, then read back at memory speed.

One file per (data file identity, its column read, row group, tokenizer; a `File` names the
file and column, also where one run reads a file in two columns, and the column's kind: token
ids' entries are keyed by their BOS rule, `TOKEN_IDS_KEY`, text's as they always were):
`<cache_dir>/<tokenizer fingerprint>/<hash of path, size, mtime>-rg<NNNNN>.tok`. A data file
that changes gets a new identity, so its old entries are never served. Layout (little endian):

    header  8 x uint64: magic, format version, n_rows, n_tokens, dtype bytes (2 or 4),
            crc32 of the body (seeded, below), identity hash (64 bits), row group
    lengths n_rows x int64      tokens of each row including its BOS, 0 for a null row
    tokens  n_tokens x uint16|uint32, every non-null row as [BOS] + tokens, in row order

Tokens are uint16 when the vocabulary has at most 65536 entries (2.0 GB per billion tokens),
else uint32 (4.0 GB). The crc32 is seeded with the index of the entry's first row (0 for a
whole row group), so that a partial entry (below) is only ever valid for its own rows.

Every tokenized piece is kept. A whole row group is stored as its entry. A slice of one (the
ramp of small pieces at the start of a run, best fit's one-chunk pieces and re-read buffer,
a run resumed inside a row group) is stored as a *partial entry* of rows `[start, end)`,
`<hash>-rg<NNNNN>.parts/<start>-<end>.part`, same layout; as soon as the partial entries of a
row group cover all its rows, the worker that stored the last one merges them into the whole
entry and removes them. A piece is served from the whole entry (sliced), else from partial
entries that cover its rows, else it is tokenized. So a run never tokenizes what an earlier
run with the same cache read, whatever the pieces were; shmloader/tools/pretokenize.py fills all.
A row group whose ids do not fit, or a store that fails (read-only directory, full disk), is
simply not cached; the stream is unchanged. Writes go to a temporary name and are renamed into place, so a killed
writer never leaves a file that looks valid; a file whose size, header or crc32 is wrong is
ignored (a miss) and rewritten. Several loaders may fill one cache at once: each rename is
atomic and every writer writes the same bytes (of a partial entry: the writer whose rename
came last sees every earlier one, so the merge is never missed). Used by workers and
shmloader/tools/pretokenize.py. A worker keeps the last few entries it read mapped and checked
(`MEMO`), so that the many small pieces of one row group cost one check.
"""
import hashlib
import os
import re
import secrets
import zlib
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from ..ipc.signals import pid_alive
from .formats.column import TEXT

MAGIC = 0x31656863616C6D73  # "smlcahe1"
VERSION = 1
HEADER = np.dtype("<u8")
N_HEADER = 8
MEMO = 4                        # whole entries a TokenCache keeps mapped and checked
_PART = re.compile(r"(\d+)-(\d+)\.part")


# What an entry of token ids is keyed by beyond its file and column: the rule that made it, ids
# already beginning with BOS given no second (procs/worker.py `ids_with_bos`). Entries of token
# ids kept before the rule (keyed without it) held [BOS, BOS, ...]: never found, made again.
# Text entries are keyed as they always were.
TOKEN_IDS_KEY = "token ids, own BOS kept"


def identity(path: str, filesystem=None, column: str = "text", kind: str = TEXT) -> int:
    """64-bit hash of a data file's absolute path, size and modification time, of the column
    read when it is not "text" (one file's two columns are two entries), and of
    `TOKEN_IDS_KEY` unless the column is known to hold text."""
    if filesystem is None:
        st = os.stat(path)
        key = f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
    else:
        info = filesystem.get_file_info(path)
        key = f"{filesystem.type_name}:{path}\0{info.size}\0{info.mtime_ns}"
    key = key if column == "text" else f"{key}\0{column}"
    key = (key if kind == TEXT else f"{key}\0{TOKEN_IDS_KEY}").encode()  # token ids, or a kind not known
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little")


class File(NamedTuple):
    """A data file as the cache keeps it: its path, the column read (one file's two columns,
    two sources of one mixture, are two entries) and the column's kind (`formats.column.TEXT`
    or `TOKENS`, or `UNKNOWN`: entries of token ids, or of a kind not known, are keyed by the ids'
    BOS rule, `TOKEN_IDS_KEY`). The cache's
    methods take a `File`, or a path alone for its `text` column of text."""
    path: str
    column: str = "text"
    kind: str = TEXT

    @classmethod
    def of(cls, reader, f: int) -> "File":
        """File `f` of a `source.Reader`, as workers and tools/pretokenize.py key it."""
        return cls(reader.files[f], reader.columns[f], reader.kind(f))


class _Entry:
    """A checked entry: its rows' lengths, tokens and token offsets (plain arrays over the
    file's mapping), for rows `start ...` of its row group."""

    __slots__ = ("lengths", "tokens", "offsets")

    def __init__(self, lengths, tokens):
        self.lengths, self.tokens = lengths, tokens
        self.offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])

    def rows(self, start: int, end: int):
        """(lengths, tokens) of its rows [start, end), counted from its own first row."""
        o = self.offsets
        return self.lengths[start:end].copy(), self.tokens[o[start]:o[end]]


class TokenCache:
    def __init__(self, cache_dir: str, tokenizer_fingerprint: str, n_vocab: int, filesystem=None):
        self.filesystem = filesystem
        self.dir = os.path.join(os.fspath(cache_dir), tokenizer_fingerprint)
        self.dtype = np.dtype("<u2") if 0 < n_vocab <= 1 << 16 else np.dtype("<u4")
        self._ids = {}
        self._memo = OrderedDict()  # (path, rg) -> _Entry of the whole row group

    def _identity(self, path: "File | str") -> int:
        if path not in self._ids:
            f = path if isinstance(path, File) else File(path)
            self._ids[path] = identity(f.path, self.filesystem, f.column, f.kind)
        return self._ids[path]

    def path_of(self, path: "File | str", rg: int) -> str:
        return os.path.join(self.dir, f"{self._identity(path):016x}-rg{rg:05d}.tok")

    def parts_dir(self, path: "File | str", rg: int) -> str:
        return os.path.join(self.dir, f"{self._identity(path):016x}-rg{rg:05d}.parts")

    def part_path(self, path: "File | str", rg: int, start: int, end: int) -> str:
        return os.path.join(self.parts_dir(path, rg), f"{start}-{end}.part")

    def load(self, path: "File | str", rg: int):
        """`(lengths, tokens)` of a valid whole entry (tokens memory-mapped), else None."""
        entry = self._whole(path, rg)
        return None if entry is None else (entry.lengths, entry.tokens)

    def load_rows(self, path: "File | str", rg: int, start: int, end: int):
        """`(lengths, tokens)` of rows [start, end) of row group `rg`: sliced out of its whole
        entry, else put together from partial entries that cover them; None when not cached."""
        entry = self._whole(path, rg)
        if entry is not None:
            return entry.rows(start, end)
        if start >= end:
            return None
        return self._cover(path, rg, start, end, self._parts(path, rg))

    def _whole(self, path: "File | str", rg: int) -> "_Entry | None":
        key = (path, rg)
        entry = self._memo.get(key)
        if entry is not None:
            self._memo.move_to_end(key)
            return entry
        entry = self._read(self.path_of(path, rg), self._identity(path), rg, 0)
        if entry is not None:
            self._memo[key] = entry
            if len(self._memo) > MEMO:
                self._memo.popitem(last=False)
        return entry

    def _read(self, name: str, ident: int, rg: int, start: int, n_rows: int | None = None):
        try:
            raw = np.memmap(name, dtype=np.uint8, mode="r").view(np.ndarray)
        except (OSError, ValueError):  # none (the usual miss), unreadable; ValueError: an empty file
            return None
        return self._parse(raw, ident, rg, start, n_rows)

    def _parse(self, raw, ident: int, rg: int, start: int = 0, n_rows_want: int | None = None):
        if raw.size < N_HEADER * 8:
            return None
        head = raw[:N_HEADER * 8].view(HEADER)
        magic, version, n_rows, n_tokens, width, crc, ident_saved, rg_saved = (int(v) for v in head)
        if (magic, version, ident_saved, rg_saved, width) != (MAGIC, VERSION, ident, rg, self.dtype.itemsize):
            return None
        if n_rows_want is not None and n_rows != n_rows_want:
            return None
        body = raw[N_HEADER * 8:]
        if body.size != n_rows * 8 + n_tokens * width or zlib.crc32(body, start) != crc:
            return None
        lengths = body[:n_rows * 8].view("<i8")
        tokens = body[n_rows * 8:].view(self.dtype)
        entry = _Entry(lengths, tokens)
        if int(entry.offsets[-1]) != n_tokens or (n_rows and int(lengths.min()) < 0):
            return None
        return entry

    def _parts(self, path: "File | str", rg: int) -> dict:
        """{(start, end): file name} of the partial entries of row group `rg` on disk."""
        where = self.parts_dir(path, rg)
        try:
            names = os.listdir(where)
        except OSError:  # none (the usual case), or not a directory
            return {}
        out = {}
        for name in names:
            m = _PART.fullmatch(name)
            if m and int(m[1]) < int(m[2]):
                out[int(m[1]), int(m[2])] = os.path.join(where, name)
        return out

    def _cover(self, path: "File | str", rg: int, start: int, end: int, parts: dict):
        """(lengths, tokens) of rows [start, end) from valid partial entries, or None."""
        ident, lengths, tokens, at = self._identity(path), [], [], start
        while at < end:
            # of the partial entries holding row `at`, the one reaching furthest that is valid
            for (lo, hi), name in sorted(((k, v) for k, v in parts.items() if k[0] <= at < k[1]),
                                         key=lambda kv: -kv[0][1]):
                entry = self._read(name, ident, rg, lo, hi - lo)
                if entry is not None:
                    stop = min(hi, end)
                    got = entry.rows(at - lo, stop - lo)
                    lengths.append(got[0])
                    tokens.append(got[1])
                    at = stop
                    break
            else:
                return None
        return np.concatenate(lengths), np.concatenate(tokens).astype(self.dtype, copy=False)

    def fits(self, tokens: np.ndarray) -> bool:
        info = np.iinfo(self.dtype)
        return not tokens.size or (int(tokens.min()) >= 0 and int(tokens.max()) <= info.max)

    def store(self, path: "File | str", rg: int, lengths: np.ndarray, tokens: np.ndarray):
        """Write the whole entry of row group `rg` atomically (temporary file, then rename);
        its partial entries, now useless, are removed."""
        os.makedirs(self.dir, exist_ok=True)
        self._write(self.path_of(path, rg), path, rg, 0, lengths, tokens)
        self._drop_parts(path, rg)

    def store_rows(self, path: "File | str", rg: int, start: int, end: int, n_rows: int,
                   lengths: np.ndarray, tokens: np.ndarray) -> bool:
        """Keep rows [start, end) of row group `rg` (of `n_rows` rows): the whole entry when
        they are all its rows, else a partial entry, merged into the whole entry once the
        partial entries cover the row group. True when the whole entry was written."""
        if start == 0 and end == n_rows:
            self.store(path, rg, lengths, tokens)
            return True
        name = self.part_path(path, rg, start, end)
        for attempt in (0, 1):  # a merge elsewhere may remove the directory in between
            os.makedirs(os.path.dirname(name), exist_ok=True)
            try:
                self._write(name, path, rg, start, lengths, tokens)
                break
            except FileNotFoundError:
                if attempt:
                    raise
        if self._whole(path, rg) is not None:  # merged meanwhile by another writer (one that is not
            #                                    valid, torn or of another format, is written again)
            self._drop_parts(path, rg)
            return False
        parts = self._parts(path, rg)
        if not _spans(parts, n_rows):  # by their names: the usual answer, read nothing
            return False
        whole = self._cover(path, rg, 0, n_rows, parts)
        if whole is None:
            return False
        self.store(path, rg, *whole)
        return True

    def _write(self, final: str, path: "File | str", rg: int, start: int, lengths: np.ndarray, tokens: np.ndarray):
        if not self.fits(tokens):
            raise ValueError(f"token ids {int(tokens.min())}..{int(tokens.max())} do not fit the "
                             f"cache's {self.dtype}")
        body = np.ascontiguousarray(lengths, dtype="<i8").tobytes() + \
            np.ascontiguousarray(tokens, dtype=self.dtype).tobytes()
        head = np.array([MAGIC, VERSION, len(lengths), tokens.size, self.dtype.itemsize,
                         zlib.crc32(body, start), self._identity(path), rg], dtype=HEADER)
        tmp = f"{final}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            with open(tmp, "wb") as f:
                f.write(head.tobytes())
                f.write(body)
            os.replace(tmp, final)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def _drop_parts(self, path: "File | str", rg: int):
        parts = self._parts(path, rg)
        for name in parts.values():
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass
        if parts:
            try:
                os.rmdir(self.parts_dir(path, rg))
            except OSError:  # another writer's part or temporary is in it; harmless
                pass


def _spans(parts: dict, n_rows: int) -> bool:
    """Whether the row ranges `parts` holds (its keys) cover rows [0, n_rows)."""
    at = 0
    for lo, hi in sorted(parts):
        if lo > at:
            return False
        at = max(at, hi)
    return at >= n_rows


def prepare(cache_dir: str) -> str | None:
    """Check `cache_dir` in the caller's process, when the loader is built: a ValueError when
    it cannot be a directory at all (a regular file, or a path through one); the directory is
    made if missing. Returns a warning's text when the cache can only be read (not writable:
    nothing new is kept), else None. Temporary files of writers that died are removed."""
    path = os.fspath(cache_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"cache_dir {path!r} is a file, not a directory: pass a directory (it is "
                         f"made if missing) or cache_dir=None")
    try:
        os.makedirs(path, exist_ok=True)
    except NotADirectoryError:
        raise ValueError(f"cache_dir {path!r} lies under a file, not a directory: pass a directory "
                         f"or cache_dir=None") from None
    except OSError as exc:
        return f"cache_dir {path!r} cannot be made ({exc}): nothing is cached in this run"
    sweep_temporaries(path)
    if not os.access(path, os.W_OK | os.X_OK):
        return f"cache_dir {path!r} is not writable: tokens it holds are read, nothing new is kept"
    return None


def sweep_temporaries(cache_dir: str) -> int:
    """Remove the temporary files of writers that died (their pid is in the name)."""
    removed = 0
    for root, _, names in os.walk(cache_dir):
        for name in names:
            head, sep, tail = name.partition(".tmp-")
            pid = tail.split("-", 1)[0]
            if sep and pid.isdigit() and not pid_alive(int(pid)):
                try:
                    os.unlink(os.path.join(root, name))
                    removed += 1
                except FileNotFoundError:
                    pass
    return removed

