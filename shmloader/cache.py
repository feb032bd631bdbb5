"""The token cache: each row group tokenized once, then read back at memory speed.

One file per (data file identity, row group, tokenizer):
`<cache_dir>/<tokenizer fingerprint>/<hash of path, size, mtime>-rg<NNNNN>.tok`. A data file
that changes gets a new identity, so its old entries are never served. Layout (little endian):

    header  8 x uint64: magic, format version, n_rows, n_tokens, dtype bytes (2 or 4),
            crc32 of the body, identity hash (64 bits), row group
    lengths n_rows x int64      tokens of each row including its BOS, 0 for a null row
    tokens  n_tokens x uint16|uint32, every non-null row as [BOS] + tokens, in row order

Tokens are uint16 when the vocabulary has at most 65536 entries (2.0 GB per billion tokens),
else uint32 (4.0 GB). The loader stores a row group when one of its workers read it whole: with
a cache, pieces after a run's first ramp are whole row groups, so everything but the ramped
start of a run's first row group is cached on the first pass (tools/pretokenize.py fills all).
A row group whose ids do not fit, or a store that fails (read-only directory, full disk), is
simply not cached; the stream is unchanged. Writes go to a temporary name and are renamed into place, so a killed
writer never leaves a file that looks valid; a file whose size, header or crc32 is wrong is
ignored (a miss) and rewritten. Several loaders may fill one cache at once: each rename is
atomic and every writer writes the same bytes. Used by workers and tools/pretokenize.py.
"""
import hashlib
import os
import secrets
import zlib

import numpy as np

from .ring import pid_alive

MAGIC = 0x31656863616C6D73  # "smlcahe1"
VERSION = 1
HEADER = np.dtype("<u8")
N_HEADER = 8


def identity(path: str, filesystem=None) -> int:
    """64-bit hash of a data file's absolute path, size and modification time."""
    if filesystem is None:
        st = os.stat(path)
        key = f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    else:
        info = filesystem.get_file_info(path)
        key = f"{filesystem.type_name}:{path}\0{info.size}\0{info.mtime_ns}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little")


class TokenCache:
    def __init__(self, cache_dir: str, tokenizer_fingerprint: str, n_vocab: int, filesystem=None):
        self.filesystem = filesystem
        self.dir = os.path.join(os.fspath(cache_dir), tokenizer_fingerprint)
        self.dtype = np.dtype("<u2") if 0 < n_vocab <= 1 << 16 else np.dtype("<u4")
        self._ids = {}

    def _identity(self, path: str) -> int:
        if path not in self._ids:
            self._ids[path] = identity(path, self.filesystem)
        return self._ids[path]

    def path_of(self, path: str, rg: int) -> str:
        return os.path.join(self.dir, f"{self._identity(path):016x}-rg{rg:05d}.tok")

    def load(self, path: str, rg: int):
        """`(lengths, tokens)` of a valid entry (tokens memory-mapped), else None."""
        name = self.path_of(path, rg)
        try:
            raw = np.memmap(name, dtype=np.uint8, mode="r")
        except (FileNotFoundError, ValueError):  # ValueError: an empty file
            return None
        return self._parse(raw, self._identity(path), rg)

    def _parse(self, raw, ident: int, rg: int):
        if raw.size < N_HEADER * 8:
            return None
        head = raw[:N_HEADER * 8].view(HEADER)
        magic, version, n_rows, n_tokens, width, crc, ident_saved, rg_saved = (int(v) for v in head)
        if (magic, version, ident_saved, rg_saved, width) != (MAGIC, VERSION, ident, rg, self.dtype.itemsize):
            return None
        body = raw[N_HEADER * 8:]
        if body.size != n_rows * 8 + n_tokens * width or zlib.crc32(body) != crc:
            return None
        lengths = body[:n_rows * 8].view("<i8")
        tokens = body[n_rows * 8:].view(self.dtype)
        if int(lengths.sum()) != n_tokens:
            return None
        return lengths, tokens

    def fits(self, tokens: np.ndarray) -> bool:
        info = np.iinfo(self.dtype)
        return not tokens.size or (int(tokens.min()) >= 0 and int(tokens.max()) <= info.max)

    def store(self, path: str, rg: int, lengths: np.ndarray, tokens: np.ndarray):
        """Write an entry atomically (temporary file, then rename)."""
        if not self.fits(tokens):
            raise ValueError(f"token ids {int(tokens.min())}..{int(tokens.max())} do not fit the "
                             f"cache's {self.dtype}")
        body = np.ascontiguousarray(lengths, dtype="<i8").tobytes() + \
            np.ascontiguousarray(tokens, dtype=self.dtype).tobytes()
        head = np.array([MAGIC, VERSION, len(lengths), tokens.size, self.dtype.itemsize,
                         zlib.crc32(body), self._identity(path), rg], dtype=HEADER)
        os.makedirs(self.dir, exist_ok=True)
        final = self.path_of(path, rg)
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


def slice_rows(lengths: np.ndarray, tokens: np.ndarray, start: int, end: int):
    """Rows [start, end) of an entry: (their lengths, their tokens)."""
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    return lengths[start:end].copy(), tokens[offsets[start]:offsets[end]]
