"""NOTE [ring protocol]: the messages between the trainer, the coordinator and the workers.

One shared-memory segment (segment.py: a `multiprocessing.shared_memory.SharedMemory`),
created by the trainer, holds a header and `n_slots` slots of `window` int64 tokens each (the
packing's spec says how many: concat `B*T + 1`; best fit `2*B*T`, the inputs then the
targets, so that both come out contiguous); with `positions=True` each slot's window is
followed, in the same row, by the B*T int64 positions of its inputs (packing/positions.py),
written by the same workers with the same write orders (5). The coordinator's `SlotMap` gives batch `k` the
lowest free slot when k's first write order goes out, and takes it back when k is freed; the
slot travels in the write orders and in the announcement. A buffered packing (best fit) adds
one *buffer area* per slot: the buffer after batch k, as the state's text of its
`[epoch, file, rg, row, count]` runs and that text's crc (packing/runs.py), written by the
coordinator before it announces k and copied by the trainer before it frees k (the buffer is
too big to send with every batch, and the trainer takes a state with every batch). A mixture's
run (its `RunArgs` carry a `MixArgs`, packing/mixmode.py) has one too: the mix's place after
batch k (`packing.mix.MixPoint`) as JSON text, the same way.

Header words (int64, ring.py): magic, layout version, n_slots, window, n_workers; the counters
`ring.Stat`, written only by the coordinator; the slot handover's counters `ring.Counter`; one
status row per worker (`ring.WorkerCol`: pid, piece, file, row group, first document, tokens,
busy time), written only by that worker; the handover's announcement records and free log.
A slot's state is what the handover's logs say of its batch: written (an order went out),
announced, taken by `next()`, freed. Every word starts at zero, so a zeroed segment is a valid,
empty ring. No lock is shared, so a killed process cannot wedge the others.

Between the trainer and the coordinator, batches and frees cross through the header, and a
ready batch costs the trainer no system call: NOTE [slot handover] (handover.py). Between the
coordinator and the workers, and for everything else the coordinator tells the trainer, every
message is one record below, sent through a pipe and dispatched on its type:

1. Trainer -> coordinator (free log): batch k once its slot may be overwritten. On the CPU,
   once the caller has dropped the lent batch: nothing runs when it does; the next `next()`
   (`delivery.Lending.reclaim`) finds the reference count of each of the slot's numpy views
   down to the delivery's own and logs the free (a batch copied out instead, while `lend_cap`
   lent batches are held, right after its copy). On CUDA, when the event recorded after the
   copy has completed. Batches come back in any order; batches below `freed + n_slots`
   (`freed` = how many came back) may be written, so at most `n_slots` hold a slot at once.
2. Worker -> coordinator: `Ready(engine)` once its tokenizer is built and its source open;
   only then, or 2 s after its start (`coordinator.READY_WAIT_S`: one stuck starting up then
   holds a piece, and its stall or the timeout is seen as before), is it given new pieces: a
   worker slow to start, starved of the cores while another loader's workers run or
   unpickling a 200k-token vocabulary, holds no piece that a worker already started could
   read, and the first batch waits for the first worker ready, not the last. A replacement
   (8) says it too.
   Coordinator -> worker: `Task(piece, keep, footer, rows, skip, alone)`; how much a worker
   may hold is the mode's rule (packing/base.py, "What a worker may hold": a few pieces not yet
   counted, and tokens counted but not yet written below a budget; best fit also caps the
   documents waiting to enter its buffer), so memory is bounded whatever the trainer's pace.
   `keep` says whether the worker keeps the tokens until they are written (as the packing's
   spec keeps them: one array a piece, best fit's until each of its documents is placed) or
   only counts them; `footer` is the digest of the piece's file as the coordinator read it (a
   worker refuses a file that changed since); `skip` are rows read as nulls (poison) and
   `alone` rows tokenized one per engine call (suspects), both `Span`s of the trainer's word
   (procs/heal.py); `rows` are the rows a worker that replaces a dead one keeps of a piece
   counted before (8).
3. Worker -> coordinator: `Counted(piece, lengths, cache_hit)` after tokenizing a piece
   (`lengths[i]` = tokens of row i including BOS, 0 for a null); `Skipped(piece, text)` first
   when its row group is bad and `on_bad_row_group="skip"`; `Failed(piece, error)` instead
   when it cannot be read (a `DataError`: a corrupt row group, no `text` column, invalid
   UTF-8, ...), and the worker goes on with its other pieces. Workers read ahead of the
   stream, so the coordinator holds that error (`packing.base.Stops`): the mode's stream stops
   at the first such piece in stream order, every batch that does not need it is written and
   announced (concat: none of its tokens, nor the token after it, whose place its state names,
   is in the piece; best fit: its plan took no chunk of it), and only then is the error told to
   the trainer (as `Ended`, 6; a count-only run's as the `Error`, once its replay needs the
   piece), so that it is raised at the same batch whatever the workers and the timing. A file
   the coordinator cannot read while it plans the order is held the same way, as the piece
   that would have come next (a mixture's: of that source's order, packing/mixfeed.py).
4. Coordinator -> worker, write orders, each packing's own record (its spec's `order`, in its
   module; the worker carries it out with the spec's `write`). Concat: pieces are sequenced in
   order; piece i starts where piece i-1 ends. For every sequenced piece its worker gets
   `Place(piece, segments, done)`, one segment `(batch, slot, batch_offset, piece_offset, n)` per writable batch the
   piece overlaps. Best fit: when batch k may be written and the chunks its plan needs are
   counted, the planner plans batch k (a plan that runs out of chunks is rolled back and
   retried later) and each worker holding a placed document gets `Rows(k, slot,
   placements)`, an (n, 5) array of rows `[piece, row, batch_row, offset, n]` (pickled as its
   bytes).
5. Worker -> coordinator: copies what it was told (with positions: the inputs' positions too,
   before it replies), replies `Written([(batch, tokens), ...], orders)`, which acknowledges
   the next `orders` orders it was sent, in order (empty ones too): the orders its pipe held
   when it looked, all carried out first (one message, and one turn of the coordinator's loop,
   for the several orders a look at the free log sends it); and drops tokens it no longer
   needs. An order is acknowledged only once written, so the orders not acknowledged are
   exactly those a dead worker may not have finished (8).
6. Coordinator -> trainer (the header's announcement record, `handover.Announcement`): when
   every token of batch k is written, and batches < k were announced, `(k, slot, position,
   docs, check)`: the canonical position of the first token after batch k (best fit: the
   buffer goes into the slot's buffer area first), the documents begun by then, and the
   batch's `ring.batch_check`. Through the pipe: `Opened(file, size, footer)` when the
   coordinator reads a file's footer (first, or again after it changed: the trainer's states
   describe files by it); a count-only run (packing/mixcount.py) sends
   `Progress(done, total, docs)` once a second and then `Located(position, runs, tokenized,
   cached)`; errors travel as `Error(kind, head, trace)` and warnings as `Warn(text, info)`
   (`info`: a line for the log, e.g. a mixture's stage that begins), from the workers through
   the coordinator, to the trainer. A stream that ends (a mixture whose sources have all
   ended) sends `Ended(text)` once every complete batch is announced; the trainer raises it as
   a `DataError` when no batch is left to take; so does a stream that stops at a piece that
   cannot be read (3), with the report of whoever found it (`Error.head`: the process, its
   pid, the file and the row group).
7. Idle release (`idle_release_s`; the rule: procs/idle.py): when every slot holds a batch
   announced to the trainer, the trainer is not waiting in `next()` (`Counter.WAITING`) and has
   neither taken a batch (`Counter.TAKEN`, or `Counter.HEAD`: one it made itself, the head start)
   nor given one back (a slot freed, or `Counter.HEAD_BACK`: one it made itself) for
   `idle_release_s` s (and for 10 times the longest gap between those so far, counted from the
   first, once it has given back 2, `Counter.HEAD_GAP_US` timing the head start's: a trainer whose
   steps are slow is never released, nor one that returned fewer batches), the coordinator
   sends `Released(idle_s)` and exits; the workers exit on its pipe's EOF. The trainer reads
   it at its next `next()` (messages come before batches; or as the account of the exits it
   sees), drops the ring's batches, stops what is left and starts new children from the state
   after the last batch it returned: the stream goes on exactly, and only the ring stays
   resident meanwhile.
8. A worker replaced (procs/run.py): the trainer starts a new worker at the dead one's index
   and sends the coordinator `Replace(worker, poisoned, suspects)` and then the new pipe's end
   as a file descriptor. The coordinator gives the new worker again every piece the old one
   held (`Mode.holding`), counted ones with the `rows` still to write (their `Counted` is not
   counted again), and sends again the orders the old one had not acknowledged (5), each once
   the pieces it reads are counted again; an order half carried out is carried out again,
   writing the same tokens to the same places. Nothing else stops.

The coordinator's loop never blocks in a send: every message to a worker or to the trainer
goes through an outbox per peer (ipc/outbox.py: sent at once when the pipe has room, else by
the outbox's thread, in order), so the loop keeps reading all of them (a worker blocked
sending a long piece's lengths can never stall it or deadlock with it). Every wait has
a timeout; all children also wait on the read end of an *alive pipe* whose write end only
the trainer holds: EOF means the trainer closed the loader or died, and they exit at once
(`Stop`). Records are NamedTuples: a NamedTuple pickles as little more than its tuple.
"""
import select
import traceback
from dataclasses import dataclass
from typing import Callable, NamedTuple

from ..errors import DataError
from .runstart import RunStart  # noqa: F401 (`RunArgs.start`'s record)


class Stop(Exception):
    """The trainer closed the loader or is gone: a child's loop ends, quietly."""


@dataclass(frozen=True, kw_only=True)
class RunArgs:
    """What one run adds to the `LoaderConfig`, for the coordinator and the workers."""

    files: list                    # the split's data files (a count-only run: those it was saved with)
    rank: int
    world: int
    layout: object                 # ring.RingLayout
    ring_name: str | None = None   # set by procs.children.start_children, which creates the ring
    start: "RunStart | None" = None  # where the run starts, one record (ipc/runstart.py): its position and
    #                                batch count, its kind's start there, a count-only run's `CountTo`
    filesystem: object = None      # data.source.FilesystemRef, or None for local files
    tokenizer: object = None       # data.tokenizer.TokenizerSpec (workers)
    worker: int = -1               # this worker's index (workers)
    replacement: bool = False      # it replaces a dead worker of a running loader (procs/run.py)
    poisoned: tuple = ()           # `Span`s of documents that killed a worker twice, skipped (procs/heal.py)
    suspects: tuple = ()           # `Span`s in the engine at a worker's death: tokenized a document at a time
    counts: tuple | None = None    # what the trainer read of the files, not a place (every run of a shuffled
    #                                loader gets it): each file's rows per unit, read for its first position
    #                                (data/shuffle.py `FirstPositions`), the footers' stand-in for a run
    #                                without an elastic plan (coordinator.py `_pieces`); None: not read
    mixture: "MixArgs | None" = None  # the run reads a mixture of sources (packing/mixmode.py)
    columns: tuple | None = None   # the column read of each file (None: "text" of every file)
    modes: tuple = ()              # (the coordinator's mode, its count-only mode): the packing's or
    #                                the mixture's, as the kind read says (kinds.py)
    keep_open: int = 4             # the files a process keeps open (`source.Reader`)
    order_of: Callable[[object, "RunArgs"], object]  # the kind's `(config, run) -> shuffle.Sourced | None`:
    #                                the run's shuffled order (data/shuffle.py `of_run`; kinds.py `run_fields`),
    #                                required: a run made without it fails where it is made, not where it is read


class MixArgs(NamedTuple):
    """A mixture's run: its `Mixture` (data/mixture.py), each source's files as a `Range` of the
    run's (data/sources.py) and the rules the run keeps (data/mixrules.py `Rules`; None: this
    version's, no source with the loader's seed). Where it starts is `RunArgs.start`'s
    (`runstart.MixStart`: its point, each source's plan, first unit and later order)."""
    mixture: object
    ranges: tuple
    rules: object = None


class Span(NamedTuple):
    """Documents (rows) `[lo, hi)` of row group `rg` of file `file` (the run's numbering), as
    epoch `epoch` orders them (a shuffled order puts a unit's documents in another order each
    epoch: data/shuffle.py `moved`; in the files' order 0: every epoch's are the rows)."""
    file: int
    rg: int
    lo: int
    hi: int
    epoch: int = 0


# coordinator -> worker
class Task(NamedTuple):
    piece: object                  # data.order.Piece
    keep: bool                     # keep the tokens for write orders (False: count only)
    footer: str | None = None      # the footer digest of the piece's file, as the coordinator read it
    rows: tuple | None = None      # a piece tokenized again for a replaced worker: the rows it keeps (None: all)
    skip: tuple = ()               # (lo, hi) rows of the piece's row group skipped as poison (as nulls)
    alone: tuple = ()              # (lo, hi) rows tokenized one document per engine call (suspects)


# coordinator -> worker, write orders: each packing's own (packing/concat.py `Place`,
# packing/bestfit.py `Rows`), named by its spec's `order`


# worker -> coordinator
class Ready(NamedTuple):
    """The worker has built its tokenizer and opened its source: it may be given pieces."""
    engine: int                    # its engine's code (data/engine.py `NAMES`)


class Counted(NamedTuple):
    piece: int
    lengths: object                # np.ndarray of int64, one per row
    cache_hit: bool | None         # None without a token cache


class Written(NamedTuple):
    counts: list                   # [(batch, tokens written)] of the orders it acknowledges
    orders: int = 1                # the next `orders` write orders sent to this worker, in order


class Skipped(NamedTuple):
    piece: object                  # plan.Piece
    text: str
    unit: tuple | None = None      # (file, rg) of the bad unit when not the piece's (a shuffled window's member)
    rows: int | None = None        # the piece's documents it held (None: all of them)


class Failed(NamedTuple):
    """Piece `piece` cannot be read (a `DataError`): `error`, the worker's report. The worker
    goes on; the coordinator holds the error until the stream needs the piece (3)."""
    piece: int
    error: "Error"


# either child -> trainer (a worker's through the coordinator)
class Warn(NamedTuple):
    text: str
    info: bool = False             # said in the log at INFO, not warned


class Ended(NamedTuple):
    """Coordinator -> trainer: the stream has ended (a mixture whose sources have all ended, or
    a piece that cannot be read: 3), after every complete batch before the end was announced;
    `text` says why (raised as `DataError` once no batch is left to take)."""
    text: str


class Error(NamedTuple):
    kind: str                      # "data" (raised as DataError) or "crash"
    head: str
    trace: str

    @classmethod
    def of(cls, who: str, exc: BaseException) -> "Error":
        """The report of `exc`, being handled now in process `who`."""
        kind = "data" if isinstance(exc, DataError) else "crash"
        return cls(kind, f"{who}: {type(exc).__name__}: {exc}", traceback.format_exc())


# coordinator -> trainer (a batch's announcement is a header record: handover.py)
class Located(NamedTuple):
    position: tuple
    runs: list
    tokenized: int                 # pieces tokenized to count them
    cached: int                    # pieces whose lengths came from the token cache


class Opened(NamedTuple):
    """The coordinator read file `file`'s footer (first, or again after it changed)."""
    file: int
    size: int | None
    footer: str

    @classmethod
    def if_new(cls, told: dict, file: int, identity: tuple) -> "Opened | None":
        """The `Opened` to send for `file`, whose `(size, footer)` is `identity`: the first time
        it is read and whenever it changed since (`told`: file -> the identity last sent)."""
        if told.get(file) == identity:
            return None
        told[file] = identity
        return cls(file, *identity)


# trainer -> coordinator
class Replace(NamedTuple):
    """Worker `worker` died and a new one takes its place: its pipe's end follows as a passed
    file descriptor (`multiprocessing.reduction.send_handle`). The poisoned and suspect spans
    as they are now (procs/heal.py), for the tasks from here on."""
    worker: int
    poisoned: tuple
    suspects: tuple


class Released(NamedTuple):
    """The coordinator and the workers exit: the trainer took no batch for `idle_s` s with
    every slot full (`idle_release_s`). The trainer restarts them from its state at its next
    `next()` (loader.py); the batches left in the ring are made again."""
    idle_s: float


class Progress(NamedTuple):
    done: int                      # batches replayed (over pieces in stream order)
    total: int
    docs: int                      # documents counted so far, also those waiting for an earlier piece


class Listener:
    """`multiprocessing.connection.wait` over a fixed set of pipes with one poll object kept
    for the whole run: `wait` builds and tears down a selector per call, which costs tens of
    microseconds several times per batch. A hung-up pipe reports ready, so its EOF is seen."""

    def __init__(self, conns):
        """`conns`: objects with `fileno()`, or file descriptors (process sentinels)."""
        self._poll, self._by_fd = select.poll(), {}
        for conn in conns:
            fd = conn if isinstance(conn, int) else conn.fileno()
            self._by_fd[fd] = conn
            self._poll.register(fd, select.POLLIN)

    def wait(self, timeout: float) -> list:
        return [self._by_fd[fd] for fd, _ in self._poll.poll(timeout * 1000)]

    def add(self, conn):
        self._by_fd[conn.fileno()] = conn
        self._poll.register(conn.fileno(), select.POLLIN)

    def remove(self, conn):
        self._poll.unregister(conn.fileno())
        del self._by_fd[conn.fileno()]
