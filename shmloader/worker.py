"""The worker process: read a row-group slice, tokenize it, copy its tokens where told.

Loop (NOTE [ring protocol] in docs/design.md): take `("task", piece)` messages; tokenize the
oldest task one chunk of documents at a time (`[BOS] + encode_ordinary(text)` per document,
nulls skipped), answering the coordinator's messages every 2 ms so that a long row group
never delays a write order; send `("counted", piece, lengths)`; keep the tokens until the
`("place", ...)` orders have copied all of them into ring slots.

Never imports torch. Ignores SIGINT (the trainer handles Ctrl-C and closes the loader). Exits
when the alive pipe reports EOF (trainer gone or loader closed) or the coordinator's pipe
closes. Any exception is sent to the coordinator with the worker, pid, file, row group and
traceback, and ends the worker.
"""
import os
import signal
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait

import numpy as np

from . import ring as ringmod
from . import tokenizer as tokmod
from .cache import TokenCache, slice_rows
from .errors import DataError
from .plan import Piece
from .ring import RingLayout
from .source import ParquetSource

IDLE_WAIT_S = 1.0
SERVICE_EVERY_S = 0.002


@dataclass(frozen=True)
class WorkerArgs:
    index: int
    files: list
    tokenizer: tokmod.TokenizerSpec
    ring_name: str
    layout: RingLayout
    packing: str = "concat"
    B: int = 0
    T: int = 0
    on_bad_row_group: str = "raise"
    cache_dir: str | None = None
    filesystem: object = None
    count_only: bool = False   # send lengths only, keep no tokens (a run that finds a position)


class _Stop(Exception):
    pass


@dataclass
class _Ctx:
    args: WorkerArgs
    conn: object
    alive: object
    ring: ringmod.Ring
    tasks: deque
    held: dict


def worker_main(args: WorkerArgs, conn, alive):
    # Ctrl-C is the trainer's; started with SIGINT blocked (loader_procs._start),
    # so ignore it before unblocking it, which drops one that is pending
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    ctx = _Ctx(args, conn, alive, None, deque(), {})
    attached = None
    try:
        attached = ringmod.attach_unless_gone(args.ring_name, args.layout, alive.poll)
        if attached is None:
            return
        ctx.ring = attached.ring
        ctx.ring.workers[args.index, :5] = (os.getpid(), -1, -1, -1, -1)
        _loop(ctx)
    except (_Stop, EOFError, BrokenPipeError, ConnectionResetError):
        pass
    except BaseException as exc:
        _report(ctx, exc)
    finally:
        ctx.ring = None
        if attached is not None:
            attached.close()


def _loop(ctx: _Ctx):
    encode = tokmod.build(ctx.args.tokenizer)
    fs = ctx.args.filesystem.open() if ctx.args.filesystem is not None else None
    source = ParquetSource(ctx.args.files, fs)
    spec = ctx.args.tokenizer
    cache = (TokenCache(ctx.args.cache_dir, spec.fingerprint, spec.n_vocab, fs)
             if ctx.args.cache_dir else None)
    while True:
        if ctx.tasks:
            piece = ctx.tasks[0]
            row = ctx.ring.workers[ctx.args.index]
            row[1:5] = (piece.index, piece.file, piece.rg, piece.doc_start)
            began = time.perf_counter()
            tokens, lengths, hit = _cached_or_tokenized(ctx, source, encode, cache, piece)
            row[5] += len(tokens)
            row[6] += int((time.perf_counter() - began) * 1e6)
            ctx.tasks.popleft()
            if ctx.args.packing == "bos_bestfit" and not ctx.args.count_only:
                tokens = _per_doc(tokens, lengths)
            if len(tokens) and getattr(tokens, "live", 1) and not ctx.args.count_only:
                ctx.held[piece.index] = tokens
            ctx.conn.send(("counted", piece.index, lengths, hit))
            ctx.ring.workers[ctx.args.index, 1] = -1  # after the send: a death in it names the piece
            continue
        ready = wait([ctx.conn, ctx.alive], timeout=IDLE_WAIT_S)
        if ctx.alive in ready:
            raise _Stop
        if ctx.conn in ready:
            _handle(ctx, ctx.conn.recv())


def _service(ctx: _Ctx):
    """Answer pending messages; called every SERVICE_EVERY_S while tokenizing."""
    if ctx.alive.poll():
        raise _Stop
    while ctx.conn.poll():
        _handle(ctx, ctx.conn.recv())


def _handle(ctx: _Ctx, msg):
    kind = msg[0]
    if kind == "task":
        ctx.tasks.append(msg[1])
    elif kind == "place":
        _, index, segments, done = msg
        written = _write(ctx, ctx.held[index], segments) if segments else []
        ctx.conn.send(("written", index, written))
        if done:
            ctx.held.pop(index, None)  # a piece without tokens was never held
    elif kind == "rows":
        _, k, slot, placements = msg
        _write_rows(ctx, slot, placements)
        ctx.conn.send(("written", k))
    else:
        raise RuntimeError(f"worker {ctx.args.index}: unknown message {kind!r}")


def _write(ctx: _Ctx, tokens: np.ndarray, segments) -> list:
    slots = ctx.ring.slots
    done = []
    for k, slot, off, src, n in segments:
        slots[slot, off:off + n] = tokens[src:src + n]
        done.append((k, n))
    return done


def _write_rows(ctx: _Ctx, slot_index: int, placements):
    """Best fit: a slot holds inputs (B, T) then targets (B, T); a placement puts tokens
    [0, n) of a document at column `off` of row `r` of the (B, T+1) rows, and so at
    inputs[r, off:] and targets[r, off-1:]. The document leaves memory once placed."""
    B, T = ctx.args.B, ctx.args.T
    slot = ctx.ring.slots[slot_index]
    for index, row, r, off, n in placements:
        docs = ctx.held[index]
        doc = docs[row]
        end = min(off + n, T)
        if off < end:
            slot[r * T + off:r * T + end] = doc[:end - off]
        lo = max(off, 1)
        base = B * T + r * T - 1
        slot[base + lo:base + off + n] = doc[lo - off:n]
        docs[row] = None
        docs.live -= 1
        if docs.live == 0:
            del ctx.held[index]


class _Docs(list):
    """A piece's documents (each `[BOS] + tokens`, None once placed or when null)."""
    live = 0


def _cached_or_tokenized(ctx: _Ctx, source: ParquetSource, encode, cache, piece: Piece):
    """(tokens, lengths, hit): hit is None without a cache, else whether it served the piece."""
    if cache is None:
        return (*_tokenize(ctx, source, encode, piece)[:2], None)
    path = ctx.args.files[piece.file]
    entry = cache.load(path, piece.rg)
    if entry is not None:
        lengths, tokens = slice_rows(*entry, piece.doc_start, piece.doc_end)
        return tokens, lengths, True
    tokens, lengths, bad = _tokenize(ctx, source, encode, piece)
    whole = piece.doc_start == 0 and piece.doc_end == source.row_counts(piece.file)[piece.rg]
    if whole and not bad and cache.fits(tokens):
        try:
            cache.store(path, piece.rg, lengths, tokens)
        except OSError as exc:
            ctx.conn.send(("warn", f"worker {ctx.args.index}: token cache not written ({exc})"))
    return tokens, lengths, False


def _tokenize(ctx: _Ctx, source: ParquetSource, encode, piece: Piece):
    spec = ctx.args.tokenizer
    try:
        texts = source.read_texts(piece.file, piece.rg, piece.doc_start, piece.doc_end)
    except DataError as exc:
        if ctx.args.on_bad_row_group != "skip":
            raise
        ctx.conn.send(("skipped", piece.index, f"skipped a bad row group: {exc}"))
        return np.empty(0, ctx.args.tokenizer.dtype), np.zeros(piece.n_docs, dtype=np.int64), True
    lengths = np.zeros(len(texts), dtype=np.int64)
    bos = np.array([spec.bos], dtype=spec.dtype)
    parts = []
    due = time.perf_counter() + SERVICE_EVERY_S
    for i, text in enumerate(texts):
        if text is not None:
            ids = encode(text)
            parts.append(bos)
            parts.append(ids)
            lengths[i] = len(ids) + 1
        if time.perf_counter() >= due:  # write orders wait at most this long for a busy worker
            _service(ctx)
            due = time.perf_counter() + SERVICE_EVERY_S
    tokens = np.concatenate(parts).astype(spec.dtype, copy=False) if parts else np.empty(0, spec.dtype)
    return tokens, lengths, False


def _per_doc(tokens: np.ndarray, lengths: np.ndarray) -> "_Docs":
    """Best fit keeps each document on its own (a copy), so that a document that lingers in
    the buffer does not pin its whole piece in memory."""
    docs = _Docs([None] * len(lengths))
    ends = np.cumsum(lengths).tolist()
    live = np.flatnonzero(lengths).tolist()
    for i in live:
        docs[i] = np.array(tokens[ends[i] - lengths[i]:ends[i]])
    docs.live = len(live)
    return docs


def _report(ctx: _Ctx, exc: BaseException):
    row = ctx.ring.workers[ctx.args.index] if ctx.ring is not None else None
    where = ""
    if row is not None and row[1] >= 0:
        where = (f" on {ctx.args.files[int(row[2])]}, row group {int(row[3])}, "
                 f"documents from {int(row[4])}")
    kind = "data" if isinstance(exc, DataError) else "crash"
    head = f"worker {ctx.args.index} (pid {os.getpid()}){where}: {type(exc).__name__}: {exc}"
    try:
        ctx.conn.send(("error", kind, head, traceback.format_exc()))
    except OSError:
        pass
