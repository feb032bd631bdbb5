"""A buffered packing's runs `[epoch, file, rg, row, count]` as a state's `buffer` text: pure.

The text is the width `u1`, `u2`, `u4` or `u8` (the narrowest unsigned little-endian integer
that holds every value), a colon and the hex of the runs' values in turn; "" for no runs
(state.py reads it back, docs/contract.md §3). The coordinator encodes the buffer after each
best-fit batch once (`encode_buffer`) and writes the text and its crc into the batch's slot
(ipc/ring.py), so that the training process, which takes a state with every batch in
nanochat's loop, only copies a short text.
"""
import zlib
from typing import NamedTuple

import numpy as np

# the buffer text's widths: (largest value, numpy dtype, name), narrowest first
RUN_WIDTHS = ((0xFF, "<u1", "u1"), (0xFFFF, "<u2", "u2"), (0xFFFFFFFF, "<u4", "u4"), (2**63 - 1, "<u8", "u8"))


class Narrowed(NamedTuple):
    """Best fit's runs in the narrowest unsigned width that holds them (`narrow`)."""
    prefix: str           # "u1", "u2", "u4" or "u8"
    values: np.ndarray    # the runs' values in turn (5 per run), little-endian of that width


def narrow(runs) -> Narrowed:
    """The runs (non-negative integers: an (n, 5) or flat array, or a list of runs) as a flat
    copy in the narrowest of 1, 2, 4 and 8 bytes that holds them all."""
    if type(runs) is not np.ndarray or runs.dtype != np.int64:
        runs = np.asarray(runs, dtype=np.int64)
    top = int(runs.max()) if runs.size else 0
    for limit, dtype, prefix in RUN_WIDTHS:
        if top <= limit:
            return Narrowed(prefix, runs.astype(dtype).ravel())
    raise ValueError(f"best-fit buffer run value {top} is past 2**63 - 1")


class BufferText(NamedTuple):
    """Best fit's buffer as a state holds it: its `encode_runs` text and the crc32 its digest
    starts from (`digest`'s `buffer_bytes`: the width name, then the bytes the hex spells)."""
    text: str
    crc: int


def encode_buffer(runs) -> BufferText:
    """`BufferText` of the runs (as `narrow` takes them); the coordinator's, once per batch."""
    prefix, values = narrow(runs)
    if not values.size:
        return BufferText("", 0)
    raw = values.tobytes()
    return BufferText(f"{prefix}:{raw.hex()}", zlib.crc32(raw, zlib.crc32(prefix.encode())))


def encode_runs(runs) -> str:
    """Best fit's buffer runs `[epoch, file, rg, row, count]` (non-negative integers; an (n, 5)
    array or a list of runs) as a state's "buffer" text: "" for an empty buffer, else the
    width `u1`, `u2`, `u4` or `u8`, a colon, and the hex of every run's five values in turn,
    little-endian unsigned integers of that many bytes, the narrowest that holds them all."""
    prefix, values = narrow(runs)
    return f"{prefix}:{values.tobytes().hex()}" if values.size else ""


def decode(text: str, per_run: int = 5, field: str = "buffer") -> tuple[str, bytes, np.ndarray]:
    """`(prefix, raw bytes, (n, per_run) int64 runs)` of a buffer text (a state's `field`); a
    malformed one is a ValueError."""
    if text == "":
        return "", b"", np.zeros((0, per_run), dtype=np.int64)
    prefix, colon, body = text.partition(":")
    dtype = next((d for _, d, p in RUN_WIDTHS if p == prefix), None) if colon else None
    if dtype is None:
        raise ValueError(f"resume state field {field!r} must start with u1:, u2:, u4: or u8:, got {text[:12]!r}")
    try:
        raw = bytes.fromhex(body)
    except ValueError:
        raise ValueError(f"resume state field {field!r} is not hex after its width") from None
    width = np.dtype(dtype).itemsize
    if not raw or len(raw) % (per_run * width) or raw.hex() != body:
        raise ValueError(f"resume state field {field!r} holds {len(raw)} bytes of hex: not whole runs of "
                         f"{per_run} {prefix} values (lowercase hex, no spaces)")
    values = np.frombuffer(raw, dtype=dtype)
    if int(values.max()) > RUN_WIDTHS[-1][0]:
        raise ValueError(f"resume state field {field!r} has a value past 2**63 - 1")
    return prefix, raw, values.astype(np.int64).reshape(-1, per_run)


def decode_runs(text: str) -> np.ndarray:
    """The (n, 5) int64 runs of a buffer text (`encode_runs`); a malformed one is a ValueError."""
    return decode(text)[2]
