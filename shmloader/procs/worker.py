"""The worker process: read a row-group slice, tokenize it, copy its tokens where told.

Loop (NOTE [ring protocol] in ipc/protocol.py): take `Task` messages; tokenize the oldest task
(`[BOS] + encode_ordinary(text)` per document, nulls skipped: `encode_texts`) in runs of
documents of about `CHUNK_CHARS` characters, one engine call each (`data.engine.Engines`),
answering the coordinator's messages every 2 ms (once the run in progress is done), so that a
long row group never delays a write order; send `Counted(piece, lengths, cache_hit)`; keep
the tokens as the run's packing keeps them (its spec's `keep`) until its write orders (the
spec's `order`, carried out by its `write`) have copied all of them into ring slots, and with
positions written their positions beside them (packing/positions.py). While
another loader of the same training process is starting, it gives way (`_give_way`, before a
piece and after each run: procs/precedence.py).

Never imports torch. Ignores SIGINT (the trainer handles Ctrl-C and closes the loader). Exits
when the alive pipe reports EOF (trainer gone or loader closed) or the coordinator's pipe
closes. A piece that cannot be read (a `DataError`) is reported as `Failed`, with the worker,
pid, file, row group and traceback, and the worker goes on: it may be far ahead of the stream,
and the batches before it need the tokens this worker holds (the coordinator raises it when
the stream needs the piece). Any other exception is sent to the coordinator the same way, and
ends the worker.
"""
import bisect
import ctypes
import itertools
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from ..data import engine as enginemod
from ..data import formats
from ..data import shuffle
from ..data import tokenizer as tokmod
from ..data.cache import File, TokenCache
from ..data.order import Piece
from ..data.source import Ids, Reader, read_or_skip
from ..errors import DataError
from ..ipc import ring as ringmod
from ..ipc import segment as segmod
from ..ipc.protocol import Counted, Error, Failed, Listener, Ready, RunArgs, Skipped, Stop, Task, Warn, Written
from ..ipc.ring import WorkerCol
from ..ipc.signals import ignore_sigint
from .precedence import pause_left_us
from .stall import beat_every

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's mallopt parameters
SERVICE_EVERY_S = 0.002
GIVE_WAY_POLL_S = 0.02  # a worker giving way looks at its pipes and the trainer's word this often
CHUNK_CHARS = 32768  # characters of text per engine call (docs/benchmarks.md: its cost)
LONG_CHARS = 4 * CHUNK_CHARS  # a document this long is encoded beside the worker's loop


@dataclass
class _Ctx:
    cfg: object                # config.LoaderConfig
    args: RunArgs
    conn: object
    alive: object
    ring: ringmod.Ring
    tasks: deque
    held: dict                 # piece -> its tokens as the packing keeps them, until written
    packing: object = None     # the run's packing spec (packing/base.py: Packing)
    source: Reader = None
    ordered: bool = False  # a write order came: the first batch is planned
    listening: Listener = None  # conn and alive
    gave_way_s: float = 0.0     # seconds spent giving way to another loader (`_give_way`)
    order: object = None        # the run's shuffled order (data/shuffle.py `of_run`), or None: the files'
    counted: int = 0            # pieces counted (`Counted` sent)
    units: object = None        # a shuffled run's members read whole and kept (data/shuffle.py `Units`)


def worker_main(cfg, args: RunArgs, conn, alive):
    ignore_sigint()
    ctx = _Ctx(cfg, args, conn, alive, None, deque(), {}, cfg.spec, order=shuffle.of_run(cfg, args))
    if ctx.order is not None and (cfg.shuffle_window or shuffle.WINDOW) > 1:
        ctx.units = shuffle.Units()
    attached = None
    try:
        attached = segmod.attach_unless_gone(args.ring_name, args.layout, alive.poll)
        if attached is None:
            return
        ctx.ring = attached.ring
        ctx.listening = Listener([conn, alive])
        ctx.ring.workers[args.worker, :WorkerCol.DOC + 1] = (os.getpid(), -1, -1, -1, -1)
        _loop(ctx)
    except (Stop, EOFError, BrokenPipeError, ConnectionResetError):
        pass
    except BaseException as exc:
        _report(ctx, exc)
    finally:
        ctx.ring = None
        if attached is not None:
            attached.close()


def _keep_freed_memory():
    """Keep memory glibc's malloc gets back for the next allocation, not for the kernel.

    A worker allocates and frees the same sizes all the time (the engine's output for each
    run, a piece's tokens); by default glibc gives such memory back (it trims the heap's top
    and maps big blocks apart), and touching it again faults each page in, several hundred
    times per row group (docs/benchmarks.md: what that cost a worker). Fixed thresholds (which also stop glibc raising them on its own) keep it: a
    worker's memory stays at its peak, which it reaches within its first pieces anyway. Not
    glibc (no mallopt): nothing."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, 32 << 20)  # blocks below 32 MiB come from the heap, reused once freed
    mallopt(M_TRIM_THRESHOLD, 64 << 20)  # the heap's free top goes back to the kernel past 64 MiB
    mallopt(M_TOP_PAD, 16 << 20)         # and grows 16 MiB at a time


def _loop(ctx: _Ctx):
    _keep_freed_memory()
    ctx.args = replace(ctx.args, tokenizer=tokmod.loaded(ctx.args.tokenizer))  # a large payload: from its file
    spec = ctx.args.tokenizer
    # the definition encodes until the fast engine, built once it pays, takes over
    encode = enginemod.Engines(spec, ctx.cfg.engine,
                               lambda text: ctx.conn.send(Warn(f"worker {ctx.args.worker}: {text}")))
    if ctx.args.replacement:  # a running loader's batches wait for it: the fast engine pays at once
        encode.start()
        ctx.ordered = True
    fs = ctx.args.filesystem.open() if ctx.args.filesystem is not None else None
    source = ctx.source = Reader(ctx.args.files, fs, ctx.args.columns, spec.n_vocab or None,
                                     ctx.args.keep_open)
    cache = TokenCache(ctx.cfg.cache_dir, spec.fingerprint, spec.n_vocab, fs) if ctx.cfg.cache_dir else None
    row = ctx.ring.workers[ctx.args.worker]
    ctx.conn.send(Ready(encode.state))  # pieces come from now on (NOTE [ring protocol] 2); first, so
    row[WorkerCol.ENGINE] = encode.state  # that an engine in stats() means Ready is sent; updated after
    #                                       each run of documents (`_tokenize`)
    idle_s = beat_every(ctx.cfg)
    while True:
        if ctx.tasks:
            task = ctx.tasks[0]
            piece, keep = task.piece, task.keep
            row[WorkerCol.PIECE:WorkerCol.DOC + 1] = (piece.index, piece.file, piece.rg, piece.doc_start)
            row[WorkerCol.EPOCH], row[WorkerCol.END] = piece.epoch, piece.doc_end
            row[WorkerCol.RUN], row[WorkerCol.RUN_END] = -1, -1  # while it is read (procs/heal.py)
            row[WorkerCol.BEAT] += 1
            _give_way(ctx)
            began, gave_way = time.perf_counter(), ctx.gave_way_s
            try:
                tokens, lengths, hit = _cached_or_tokenized(ctx, source, encode, cache, task)
            except DataError as exc:  # the coordinator holds it until the stream needs the piece
                ctx.conn.send(Failed(piece.index, Error.of(_who(ctx), exc)))
                ctx.tasks.popleft()
                row[WorkerCol.PIECE] = -1
                continue
            if piece.skip:  # its first document was begun by another rank (elastic resume)
                tokens, lengths = skipped(tokens, lengths, piece.skip)
            busy = time.perf_counter() - began - (ctx.gave_way_s - gave_way)
            row[WorkerCol.TOKENS] += len(tokens)
            row[WorkerCol.BUSY_US] += int(busy * 1e6)
            row[WorkerCol.ENGINE] = encode.state  # (its rent is paid run by run: `_tokenize`)
            ctx.tasks.popleft()
            held = ctx.packing.keep(tokens, lengths, piece.skip) if keep else None
            if held is not None and task.rows is not None:  # done again for a replaced worker: what it still needs
                held = ctx.packing.keep_rows(held, task.rows)
            if held is not None:
                ctx.held[piece.index] = held
            ctx.conn.send(Counted(piece.index, lengths, hit))
            ctx.counted += 1
            row[WorkerCol.PIECE] = -1  # after the send: a death in it names the piece
            continue
        row[WorkerCol.BEAT] += 1  # idle and alive: a stopped idle worker is a stall too (a task may wait for it)
        ready = ctx.listening.wait(idle_s)
        if ctx.alive in ready:
            raise Stop
        if ctx.conn in ready:
            _drain(ctx)


def skipped(tokens: np.ndarray, lengths: np.ndarray, skip: int) -> tuple:
    """A piece's tokens and row lengths without the first `skip` tokens of its first row."""
    cut = min(skip, int(lengths[0])) if len(lengths) else 0
    lengths = lengths.copy()
    lengths[0] -= cut
    return tokens[cut:], lengths


def _service(ctx: _Ctx):
    """Answer pending messages; called every SERVICE_EVERY_S while tokenizing. Usually there
    are none: one poll(2) of both pipes says so (`Connection.poll` builds a selector per call)."""
    if not ctx.listening.wait(0):
        return
    if ctx.alive.poll():
        raise Stop
    _drain(ctx)


def _give_way(ctx: _Ctx):
    """While the trainer asks (the ring's YIELD_UNTIL: another loader of the training process
    is starting, procs/precedence.py), tokenize nothing: wait on the pipes, answer the
    coordinator's messages (write orders included) and beat, until the word is cleared or its
    deadline passes. Called before each piece and after each run of documents."""
    left = pause_left_us(ctx.ring.counters)
    if not left:
        return
    began = time.perf_counter()
    row = ctx.ring.workers[ctx.args.worker]
    while left:
        row[WorkerCol.BEAT] += 1  # giving way is not a stall
        ready = ctx.listening.wait(min(GIVE_WAY_POLL_S, left / 1e6))
        if ctx.alive in ready:
            raise Stop
        if ctx.conn in ready:
            _drain(ctx)
        left = pause_left_us(ctx.ring.counters)
    ctx.gave_way_s += time.perf_counter() - began


def _drain(ctx: _Ctx):
    """Handle every message the coordinator's pipe holds (at least one: it is readable), and
    acknowledge the write orders among them with one `Written` after the last is carried out
    (NOTE [ring protocol] 5): the coordinator sends a worker several at once when it finds
    several frees, and each message is a turn of its loop."""
    counts, orders = [], 0
    while True:
        if _handle(ctx, ctx.conn.recv(), counts):
            orders += 1
        if not ctx.conn.poll():
            break
    if orders:  # every order, also one that wrote nothing: the coordinator pairs them in order
        ctx.conn.send(Written(counts, orders))


def _handle(ctx: _Ctx, msg, counts: list) -> bool:
    """Take a task, or carry out a write order and add what it wrote to `counts` (True)."""
    if type(msg) is Task:
        ctx.tasks.append(msg)
        ctx.source.expect(msg.piece.file, msg.footer)
        return False
    if type(msg) is not ctx.packing.order and type(msg) not in ctx.packing.orders:
        raise RuntimeError(f"worker {ctx.args.worker}: unknown message {msg!r}")
    ctx.ordered = True
    counts += ctx.packing.write(ctx.ring.slots, ctx.held, msg, ctx.cfg.B, ctx.cfg.T, ctx.ring.positions)
    return True


def _cached_or_tokenized(ctx: _Ctx, source: Reader, encode, cache, task: Task):
    """(tokens, lengths, hit): hit is None without a cache, else whether it served the piece.
    A piece the cache does not hold is tokenized and kept, whole row group or not (data/cache.py).
    Rows the task skips as poison are nulls either way (and such a piece is not cached)."""
    piece = task.piece
    if cache is None:
        return (*_tokenized(ctx, source, encode, task)[:2], None)
    if piece.members:  # a piece of a shuffled window
        return _cached_shuffled(ctx, source, encode, cache, task)
    path = _file(ctx, source, piece.file)
    got = cache.load_rows(path, piece.rg, piece.doc_start, piece.doc_end)
    if got is not None:
        return (*without(got[1], got[0], _relative(task.skip, piece)), True)
    tokens, lengths, bad = _tokenized(ctx, source, encode, task)
    if not bad and cache.fits(tokens):
        try:
            cache.store_rows(path, piece.rg, piece.doc_start, piece.doc_end,
                             source.row_counts(piece.file)[piece.rg], lengths, tokens)
        except OSError as exc:
            ctx.conn.send(Warn(f"worker {ctx.args.worker}: token cache not written ({exc})"))
    return tokens, lengths, False


def _file(ctx: _Ctx, source: Reader, f: int) -> File:
    """File `f` of the run as the token cache keeps it: its path, the column read and its kind."""
    return File.of(source, f)


def _cached_shuffled(ctx: _Ctx, source: Reader, encode, cache, task: Task):
    """`_cached_or_tokenized` of a piece of a shuffled window (data/shuffle.py): the cache keeps
    units whole and in file order, so it serves any piece's rows of its members in any epoch's
    order; a piece that is its whole window is put back in file order and kept, member by
    member, a part of one (the first pieces of a run, or pieces of a window of many units) is
    not."""
    piece = task.piece
    got = shuffle.cached(lambda m: cache.load_rows(_file(ctx, source, m.file), m.unit, 0, m.rows) if m.rows else None,
                         piece, ctx.order)
    if got is not None:
        return (*without(got[1], got[0], _relative(task.skip, piece)), True)
    tokens, lengths, bad = _tokenized(ctx, source, encode, task)
    if not bad and piece.doc_start == 0 and piece.doc_end == sum(m.rows for m in piece.members) and cache.fits(tokens):
        try:
            for member, ls, ts in shuffle.in_file_order(piece, ctx.order, lengths, tokens):
                if member.rows:
                    cache.store(_file(ctx, source, member.file), member.unit, ls, ts)
        except OSError as exc:
            ctx.conn.send(Warn(f"worker {ctx.args.worker}: token cache not written ({exc})"))
    return tokens, lengths, False


def _tokenized(ctx: _Ctx, source: Reader, encode, task: Task):
    """`_tokenize`, counted in the worker's `TOKENIZED` column (tokens not from the cache)."""
    out = _tokenize(ctx, source, encode, task)
    ctx.ring.workers[ctx.args.worker, WorkerCol.TOKENIZED] += len(out[0])
    return out


def _tokenize(ctx: _Ctx, source: Reader, encode, task: Task):
    """(tokens, lengths, bad) of a piece (`encode_texts`), answering write orders between chunks;
    bad: a piece not to cache (a bad row group skipped, or rows skipped as poison)."""
    spec, piece = ctx.args.tokenizer, task.piece
    skip = _relative(task.skip, piece)
    if skip == [(0, piece.n_docs)]:  # it killed a worker while it was read: not read again
        return np.empty(0, spec.dtype), np.zeros(piece.n_docs, dtype=np.int64), True
    bad = []  # a shuffled window's members skipped (their documents nulls)
    if not piece.members:  # the files' order (a mixture's source may be read so beside shuffled ones)
        texts = read_or_skip(lambda: source.read_texts(piece.file, piece.rg, piece.doc_start, piece.doc_end),
                             ctx.cfg.on_bad_row_group, lambda text: ctx.conn.send(Skipped(piece, text)),
                             formats.format_of(ctx.args.files[piece.file]).unit)
    else:  # a window's members, each read or skipped on its own
        texts = shuffle.read(lambda f, g, lo, hi: read_or_skip(
            lambda: source.read_texts(f, g, lo, hi), ctx.cfg.on_bad_row_group,
            lambda text: bad.append(((f, g), text)), formats.format_of(ctx.args.files[f]).unit), ctx.order, piece,
            ctx.units)
        for unit, text, rows in shuffle.skipped(piece, ctx.order, bad):
            ctx.conn.send(Skipped(piece, text, unit, rows))
    if texts is None:
        return np.empty(0, spec.dtype), np.zeros(piece.n_docs, dtype=np.int64), True
    for lo, hi in skip:  # poison: read as nulls
        texts[lo:hi] = [None] * (hi - lo)
    if task.rows is not None:  # done again for a replaced worker: only the rows it still needs
        keep = set(task.rows)
        texts = type(texts)(text if i in keep else None for i, text in enumerate(texts))  # Ids stay Ids
    due = time.perf_counter() + SERVICE_EVERY_S
    row = ctx.ring.workers[ctx.args.worker]

    began = None  # when the run of documents in the engine began

    def running(lo: int, hi: int):  # documents [lo, hi) of the piece go into the engine now
        nonlocal began
        row[WorkerCol.RUN], row[WorkerCol.RUN_END] = piece.doc_start + lo, piece.doc_start + hi
        began = time.perf_counter()

    def between(beat: bool = True):
        nonlocal due, began
        if beat:  # a run of documents is done (not while one long document is on its thread)
            if began is not None:
                _rent(ctx, encode, time.perf_counter() - began, task)
            began = None
            row[WorkerCol.BEAT] += 1
            row[WorkerCol.ENGINE] = encode.state
        if time.perf_counter() >= due:  # write orders wait at most about this long (or one chunk)
            _service(ctx)
            due = time.perf_counter() + SERVICE_EVERY_S
        if beat:
            _give_way(ctx)

    def where(i: int) -> str:  # document i of the piece, in words
        file, rg, row = ((piece.file, piece.rg, piece.doc_start + i) if not piece.members
                         else shuffle.row_of(piece, ctx.order, i))
        return f"{ctx.args.files[file]}, {formats.place_of(ctx.args.files[file], rg, row)}"

    tokens, lengths = encode_texts(texts, encode.encode_batch, spec.bos, spec.dtype, where,
                                   between, running, _relative(task.alone, piece))
    return tokens, lengths, bool(skip or bad) or task.rows is not None  # then not the piece's whole tokens: not cached


def _rent(ctx: _Ctx, encode, seconds: float, task: Task):
    """A run of documents took `seconds` with the definition: the fast engine's build starts
    once these add up to its price (`engine.Engines.worked`), at the first run that is not
    on the way to the run's first batch, as far as the worker can tell: once the run has a
    batch (the ring's counters: announced by the coordinator, or made by the trainer's head
    start), after a write order came (the first batch is planned), after its first piece, or
    in a count-only run; and not while another loader of the process is starting. With more
    workers than a first batch needs, most of them are on their first piece when it comes (on
    nanochat's geometry a whole row group, 0.3 s of tiktoken): they build then, not after it. Paid run by run, not piece by
    piece: a piece of 1024 documents is 0.3 s of tiktoken (4x fastokens' time) where the
    build costs 0.05-0.4 s, and each of 8 workers tokenized its first two pieces with the
    definition before its build began, the first seconds of a run at a quarter of its
    speed (docs/benchmarks.md, "More workers than cores")."""
    counters = ctx.ring.counters
    after_first = (ctx.ordered or ctx.counted or not task.keep
                   or counters[ringmod.Counter.ANNOUNCED] > 0 or counters[ringmod.Counter.HEAD] > 0)
    encode.worked(seconds, may_start=after_first and not pause_left_us(ctx.ring.counters))


def _relative(spans: tuple, piece: Piece) -> list:
    """Row ranges `(lo, hi)` of the piece's row group as ranges of the piece's own rows, those
    that meet it."""
    out = []
    for lo, hi in spans:
        lo, hi = max(lo, piece.doc_start) - piece.doc_start, min(hi, piece.doc_end) - piece.doc_start
        if lo < hi:
            out.append((lo, hi))
    return out


def without(tokens: np.ndarray, lengths: np.ndarray, spans: list) -> tuple:
    """A piece's tokens and row lengths with rows `[lo, hi)` of each span dropped (as nulls)."""
    if not spans:
        return tokens, lengths
    ends = np.cumsum(lengths)
    keep = np.ones(len(tokens), dtype=bool)
    lengths = lengths.copy()
    for lo, hi in spans:
        keep[(ends[lo - 1] if lo else 0):ends[hi - 1]] = False
        lengths[lo:hi] = 0
    return tokens[keep], lengths


def encode_texts(texts: list, encode_batch, bos: int, dtype, where, between=None, running=None,
                 alone=()) -> tuple:
    """(tokens, lengths): `[BOS] + ids` of each non-null text, end to end, and each text's
    length with its BOS (0 for a null), as the stream and the token cache hold them. Encoded
    in runs of about `CHUNK_CHARS` characters, one `encode_batch(texts, where) -> (ids,
    offsets)` call each (`engine.Engines.encode_batch`), `where(i)` naming text i; the texts
    of the `(lo, hi)` ranges in `alone` one per call (a suspect: procs/heal.py); `running(lo,
    hi)` before each call, `between()` after each run. A document of `LONG_CHARS` or more (a run of its own) is encoded on a
    thread, with `between(False)` every `SERVICE_EVERY_S` meanwhile (False: no progress
    shown, so an engine stuck on one document is a stall): the engines release the GIL,
    so write orders for the tokens this worker already holds are carried out while it
    tokenizes (one long document used to hold a loader's first batch until it was done).
    A token-id column's documents (`Ids`) are not encoded: each is `[BOS] + ids` as it is, one
    that already begins with BOS not given another (`ids_with_bos`)."""
    if isinstance(texts, Ids):
        out = ids_with_bos(texts, bos, dtype)
        if between is not None:
            between()
        return out
    lengths = np.zeros(len(texts), dtype=np.int64)
    parts = []  # each run's [BOS] + ids, ...
    for start, end in _apart(_chunks(texts, CHUNK_CHARS), alone):
        if running is not None:
            running(start, end)
        docs, rows, at = texts[start:end], range(start, end), slice(start, end)  # at: their lengths
        if None in docs:
            at = rows = [i for i in rows if texts[i] is not None]
            docs = [texts[i] for i in rows]
        if docs:
            call = lambda: encode_batch(docs, lambda j: where(rows[j]))  # noqa: E731
            long = between is not None and len(docs) == 1 and len(docs[0]) >= LONG_CHARS
            ids, offsets = _beside(call, between) if long else call()
            lengths[at] = offsets[1:] - offsets[:-1] + 1
            parts.append(_with_bos(ids, offsets, bos, dtype))
        if between is not None:
            between()
    if len(parts) == 1:
        return parts[0], lengths
    return (np.concatenate(parts) if parts else np.empty(0, dtype)), lengths


def ids_with_bos(docs: Ids, bos: int, dtype) -> tuple:
    """(tokens, lengths) of documents given as token ids, as `encode_texts` makes them of text:
    `[BOS] + ids` each, but a document whose ids already begin with BOS as it is (pretokenized
    corpora, nanochat's own among them, carry their BOS: never `[BOS, BOS, ...]`); an empty
    one is `[BOS]`. The ids were checked against the vocabulary when read."""
    lengths = np.zeros(len(docs), dtype=np.int64)
    rows = [i for i, d in enumerate(docs) if d is not None]
    if not rows:
        return np.empty(0, dtype), lengths
    sizes = np.fromiter((len(docs[i]) for i in rows), dtype=np.int64, count=len(rows))
    flat = np.concatenate([docs[i] for i in rows])
    starts = np.cumsum(sizes) - sizes
    need = sizes == 0  # each document needs a BOS unless its ids begin with one (an empty one does)
    need[~need] = flat[starts[~need]] != bos
    lengths[rows] = sizes + need
    return _with_bos(flat, np.append(starts[need], len(flat)), bos, dtype), lengths


def _beside(work, between):
    """`work()` on a thread of its own, `between()` every `SERVICE_EVERY_S` until it is done;
    its result, or its exception raised here. (A `Stop` from `between` leaves the thread to
    the process's exit.)"""
    out = {}

    def run():
        try:
            out["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - raised in the worker's thread below
            out["error"] = exc

    thread = threading.Thread(target=run, name="shmloader-long-document", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(SERVICE_EVERY_S)
        if thread.is_alive():
            between(False)
    if "error" in out:
        raise out["error"]
    return out["value"]


def _with_bos(ids: np.ndarray, offsets: np.ndarray, bos: int, dtype) -> np.ndarray:
    """`[BOS] + ids` of each document of a run, end to end, in one pass over the run while its
    ids are in the cache (no numpy call per document): a BOS before each `offsets[:-1]`, the
    ids' end last (`ids_with_bos` gives only the documents that need one)."""
    k = len(offsets) - 1
    out = np.empty(len(ids) + k, dtype=dtype)
    starts = offsets[:-1] + np.arange(k)
    keep = np.ones(len(out), dtype=bool)
    keep[starts] = False
    out[starts] = bos
    out[keep] = ids
    return out


def _chunks(texts: list, chars: int):
    """[start, end) ranges of documents of about `chars` characters together (a longer
    document alone): an engine call's worth, short enough to answer write orders between.
    Cut on the running total of their lengths (no Python per document)."""
    sizes = map(len, texts) if None not in texts else (0 if text is None else len(text) for text in texts)
    totals = list(itertools.accumulate(sizes))
    start = 0
    while start < len(texts):
        end = min(bisect.bisect_left(totals, (totals[start - 1] if start else 0) + chars, lo=start) + 1,
                  len(texts))
        if end - start > 1 and texts[end - 1] is not None and len(texts[end - 1]) > chars:
            end -= 1  # the long one starts a run of its own
        yield start, end
        start = end


def _apart(chunks, alone):
    """The runs of `chunks` with every text of the `alone` ranges in a run of its own."""
    for start, end in chunks:
        cuts = sorted({i for lo, hi in alone for i in range(max(lo, start), min(hi, end))})
        for i in cuts:
            if start < i:
                yield start, i
            yield i, i + 1
            start = i + 1
        if start < end:
            yield start, end


def _who(ctx: _Ctx) -> str:
    """This worker, its pid and the piece it is on (from its status row), for a report."""
    row = ctx.ring.workers[ctx.args.worker] if ctx.ring is not None else None
    where = ""
    if row is not None and row[WorkerCol.PIECE] >= 0:
        path = ctx.args.files[int(row[WorkerCol.FILE])]
        where = (f" on {path}, {formats.docs_of_unit(path, int(row[WorkerCol.RG]), int(row[WorkerCol.DOC]), int(row[WorkerCol.END]) - 1, ordered=ctx.order is None)}")
    return f"worker {ctx.args.worker} (pid {os.getpid()}){where}"


def _report(ctx: _Ctx, exc: BaseException):
    try:
        ctx.conn.send(Error.of(_who(ctx), exc))
    except OSError:
        pass
