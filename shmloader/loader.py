"""The training process's side: `ShmLoader`, a thin facade over its parts (the nanochat drop-in
functions over it are in nanochat.py). Each part is a room of its own:

- what it reads (`kinds.py`): one source or a `Mixture`, decided once, with its catalogue
  (`data/catalogue.py`: the split's files, their identities, each epoch's order);
- the runs (`procs/run.py`): the children started, watched, healed and restarted, with the
  delivery (`delivery.py`) that turns a ring slot into the caller's batch; taking a batch
  gives one `Announcement`;
- the resume plan (`resume.py`): from a state to where the next run starts (the state's check,
  another rank's or another world size's position, the elastic plan);
- the states (`state.Writer`, with the part of what it reads): a state from the progress after
  the last batch returned (one `Mark`), built when asked. A state carries the check of the batch
  it resumes at, so `state_dict()` takes the next batch's announcement ahead (`resume.Ahead`,
  which also checks a resumed run's first batch against the state's);
- precedence (`procs/precedence.py`): a loader that starts has the cores until its first batch;
- the report (`report.py`): what was delivered, `stats()` and the log's lines;
- its life (`procs/lifecycle.py`): closed when dropped and at exit, let go of in a forked
  child, and as a Python object (`Managed`: `with`, never pickled, no len()).

The facade holds the lock that serves threads one at a time and the `Mark`.
A ready batch is taken from the ring's header and its slot given back there, without a system
call (NOTE [slot handover], ipc/handover.py). `config` is the frozen `LoaderConfig`; `debug()`
exposes the running parts to tests and tools. See NOTE [ring protocol] in ipc/protocol.py.
"""
import dataclasses
import functools
import os
import threading

from . import cores, delivery, errors, kinds, profiling, report, resume as resumemod, state as statemod
from .config import LoaderConfig, place
from .data import cache as cachemod
from .data import engine as enginemod
from .data import source, tokenizer as tokmod
from .procs import lifecycle
from .procs.run import Runs
from .procs.start import prestart

class ShmLoader(lifecycle.Managed):
    """Iterate `(inputs, targets)` int64 batches of shape (B, T), with `positions=True`
    `(inputs, targets, positions)`; see docs/contract.md §1-§3 and §6."""

    def __init__(self, data=None, tokenizer=None, B: int = 32, T: int = 2048, split: str = "train",
                 packing: str = "concat", num_workers: int | None = None, device="cuda", *,
                 rank: int | None = None, world_size: int | None = None, resume_state: dict | None = None,
                 filesystem=None, bos: int | None = None, n_slots: int = 8, tokenizer_batch_size: int = 128,
                 buffer_size: int = 1000, max_piece_docs: int | None = None, max_piece_bytes: int | None = None,
                 start_method: str = "forkserver", timeout: float = 300.0, on_bad_row_group: str = "raise",
                 cache_dir: str | os.PathLike | None = None, log_every: int = 0, other_rank: str = "exact",
                 engine: str = "auto", idle_release_s: float | None = None, max_restarts: int = 3,
                 stall_s: float | None = None, positions: bool = False, head_start: bool = True,
                 column: str = "text", shuffle: bool = False, seed: int = 0, shuffle_window: int | None = None):
        """A loader of `data` (a directory of data files, a glob, a list of paths, a URI; a
        `shmloader.Source` naming its column; a `Mixture`; None: nanochat's directory; formats by
        file name: .parquet, .jsonl/.json plain, .gz or .zst, .arrow/.feather) tokenized by `tokenizer` (a tiktoken pickle or Encoding, a Hugging
        Face tokenizer.json, a SentencePiece .model, nanochat's tokenizer; None: nanochat's), `B` rows of `T` tokens per
        batch, on `device` ("cpu", "cuda", "cuda:N"). Nothing starts until the first batch.

        split: "train" (every file but the last), "val" (the last) or "all" (every file: a directory
            that is one split).
        packing: "concat" (nanochat's original loader) or "bos_bestfit" (every row starts at BOS).
        num_workers: tokenizing processes for this rank (None: its share of the cores this process
            may run on, at most 4; the ranks on a machine share it: cores.py); more than that share
            is warned of (`cores.CoresWarning`: they read no more, and cost a slower start).
        rank, world_size: this rank of how many (default: $RANK, $WORLD_SIZE, else an initialized
            torch.distributed group's, else 0 of 1; $WORLD_SIZE above 1 without $RANK is a ValueError).
        resume_state: a state to continue from (`state_dict()`, nanochat's yielded state, or
            nanochat's own loader's), as `load_state_dict`.
        filesystem: a `pyarrow.fs.FileSystem` for `data` (default: from the URI).
        bos: the BOS token id (default: `<|bos|>`, else `<|endoftext|>`, ...; SentencePiece: its bos_id()).
        n_slots: batches the ring holds.
        tokenizer_batch_size, buffer_size: best fit's chunk of documents and its buffer (as nanochat's).
        max_piece_docs, max_piece_bytes: how a row group is cut into work for the workers (None:
            1024 documents, and 8 MiB of text for concat, 2 MiB for best fit; whole row groups
            with cache_dir, which refuses them). The stream does not depend on them.
        start_method: "forkserver" or "spawn" (never "fork").
        timeout: seconds without a batch while every process lives, then `LoaderTimeout`.
        on_bad_row_group: "raise", or "skip" an unreadable row group or file, with a warning.
        cache_dir: keep tokenized row groups on disk and read them back (docs/token-cache.md).
        log_every: log a summary every N batches to `logging.getLogger("shmloader")` (0: never).
        other_rank: given another rank's or another world size's state, find this rank's exact
            position ("exact") or resume approximately as nanochat does ("nanochat").
        engine: who tokenizes: "auto" (gigatoken where it is proven equal, else fastokens when
            installed, else the definition), "fastokens" or "gigatoken" (required), "tiktoken"
            (the definition only); the stream is the same (docs/engines.md).
        idle_release_s: a loader not read this long (and 10x its slowest step), its ring full,
            lets its processes go until its next `next()` (None: 30 s for val, 0 = never for train).
        max_restarts: a process that dies or stalls is replaced, and the stream goes on exactly,
            this many times an hour; 0: the first death is an error.
        stall_s: seconds without progress while `next()` waits before a process counts as
            stalled (None: 60 s; it acts only with max_restarts > 0).
        positions: yield `(inputs, targets, positions)`: `positions[b, t]` is the index of
            `inputs[b, t]` in its document (0 at its BOS; concat counts on across rows and
            batches), int64 on `device`, written by the workers beside the tokens;
            `shmloader.cu_seqlens(positions)` for varlen attention (docs/contract.md §6).
        head_start: concat: while a run's processes start, the training process makes the
            batches asked for itself (the same bytes and states), so that a new loader's first
            batch does not wait for them to start: at most 4 once they are started, up to 16
            while the process's forkserver boots (its first loader), before they are started
            (procs/headstart.py); False: every batch comes from the workers.
        column: the column the documents are in (a source given as `Source(data, column=...)`
            reads its own): strings are text to tokenize, lists of integers are token ids, used
            as they are after the BOS (not given a second when they begin with it; ids at or above
            the tokenizer's vocabulary: DataError).
        shuffle, seed, shuffle_window: every epoch's units (row groups) over the whole split in an
            order drawn from `seed` and the epoch, and the documents of each run of consecutive
            units holding `shuffle_window` documents (None: 256; 1: each unit alone) in one order
            (data/shuffle.py; README "The order"); False: the files' order, nanochat's. A state
            keeps all three."""
        self.device = delivery.device_of(device)  # first: without CUDA, say so before reading anything
        self.config = LoaderConfig.of_call(locals())  # one source's own `Source(shuffle=)` over shuffle=
        cores.crowded(self.config.num_workers)  # more than this rank's share of the cores: said once
        prestart(self.config.start_method)  # the forkserver boots while the rest is built
        self.rank, self.world_size = place(rank, world_size)
        if data is None:  # nanochat's directory; rank 0 of the train split tells of a fallback
            data = source.default_data_dir(notice=self.rank == 0 and split == "train")
        self._kind = kinds.of(data, split, filesystem, source.check_column(column))  # one source, or a Mixture
        self._kind.refuse(self.config)
        self._catalogue = self._kind.catalogue
        self._first = self._kind.first_positions(self.config)  # a shuffled stream begins at its share's first unit
        self._kind.check_units(self.config, self.rank, self.world_size)  # a rank without a unit: now, not at next()
        self.tokenizer = tokmod.resolve(tokenizer, bos)
        enginemod.available(self.config.engine, self.tokenizer)
        if self.config.cache_dir is not None and (problem := cachemod.prepare(self.config.cache_dir)):
            errors.warn(f"shmloader: {problem}")
        self._lock = threading.Lock()  # next() from several threads: one at a time
        self._closed, self._pid, self._forked_from, self._inside = False, os.getpid(), None, None
        self._shape = delivery.Shape.of(self.config)  # where a batch lies in its slot
        self._mark = None
        # no reference back to the loader: the drop's finalizer holds the runs (it would keep the loader alive),
        # and a cycle would leave a dropped loader to the collector, which nanochat's base_train disables
        deliver = functools.partial(delivery.make, self.device, lend_cap=self.config.lend_cap,
                                    pinning=delivery.Pinning())  # one refusal to pin, said once
        self._runs = Runs(self.config, deliver,
                          functools.partial(self._catalogue.learn, warn=errors.warn), self.rank, self._kind)
        self._ahead = resumemod.Ahead(self._runs, self.config, self._catalogue,  # the next batch, taken early
                                      self._kind.shuffled(self.config))
        lifecycle.close_when_dropped(self, self._runs)  # not a __del__: the pipes are never the collector's
        self._report = report.Report(self.config, self._runs, self._kind)  # stats() and the log's lines
        self._begin(statemod.start(self._identity(), self._kind.fresh()))
        if resume_state is not None:
            self.load_state_dict(resume_state)
        self._report.named(lifecycle.register(self), split, self.rank, self.world_size)  # who its log lines are of

    B = property(lambda self: self.config.B, doc="rows per batch")
    T = property(lambda self: self.config.T, doc="tokens per row")
    split = property(lambda self: self.config.split)
    packing = property(lambda self: self.config.packing)
    num_workers = property(lambda self: self.config.num_workers)
    n_slots = property(lambda self: self.config.n_slots)
    files = property(lambda self: list(self._catalogue.paths), doc="the split's files, in this epoch's order")

    def __iter__(self):
        return self

    def __next__(self):
        """The next batch. Threads that call it at once are served one at a time, in turn (each
        batch goes to one of them); one that waits longer than `timeout` for another's call
        raises `LoaderTimeout`."""
        lock = self._lock  # taken here, not through `_locked`: this is every batch's path
        if not lock.acquire(False):
            lifecycle.wait_for(lock, self.config.timeout, "next()")
        self._inside = threading.get_ident()
        try:
            if profiling.active():  # a range in torch.profiler traces, only while one records
                with profiling.named(profiling.NEXT):
                    return self._next()
            return self._next()
        finally:
            self._inside = None
            lock.release()

    def state_dict(self) -> dict:
        """The state that resumes after the last batch yielded (JSON-serialisable; docs/contract.md §3).
        nanochat's drop-in functions yield, with each batch, the state that resumes at it.

        It carries the check of the batch it resumes at (the next one), so once a batch was
        returned it waits for that batch to be made if it is not yet, as the next `next()`
        would (which then returns it at once). Threads are served one at a time with `next()`.
        Where the next batch cannot be had (the loader is closed, or making it fails: that error
        is raised by the next `next()`), or when called inside `next()` (a signal handler), the
        state has no check; it still resumes exactly."""
        if self._state is not None:
            return dict(self._state)
        if self._inside == threading.get_ident():  # a signal handler, inside this thread's next()
            return self._writer.state(self._mark)
        lock = self._lock  # taken here, not through `_locked`: nanochat's loop asks with every batch
        if not lock.acquire(False):
            lifecycle.wait_for(lock, self.config.timeout, "state_dict()")
        try:
            if self._state is None:  # a best-fit buffer of ~1000 documents is worth not listing per batch
                if self._closed:
                    return self._writer.state(self._mark)
                if (ahead := self._ahead.peek(self._mark)) is None:  # what it met is the next next()'s to raise
                    return self._writer.state(self._mark)
                self._state = self._writer.state(self._mark, ahead.check)
            return dict(self._state)
        finally:
            lock.release()

    def nanochat_keys(self) -> dict:
        """nanochat's keys (`pq_idx`, `rg_idx`, `epoch`) of the last batch returned: the row group
        its reading ended in, as nanochat's loaders yield them with that batch (the drop-ins
        yield them with it; `state_dict()` carries them too). Before any batch, the position's."""
        return self._writer.keys(self._mark)

    def load_state_dict(self, state: dict):
        """Continue from `state`: the next batch is the one it resumes at (docs/contract.md §3). Another
        rank's or another world size's state first finds this rank's own position (resume.py)."""
        with self._locked("load_state_dict()"):
            if self._closed:
                raise errors.LoaderClosed(lifecycle.closed_text(self._forked_from))
            self._begin(self._kind.resume(state, self._identity(), self.config, self._args(),
                                       self._runs.heal_count))

    def stats(self) -> dict:
        """Counters of this loader (README "Seeing the pipeline"; docs/contract.md §7).
        Cumulative: `tokens_delivered` and `docs_delivered` are what the batches `next()`
        returned hold (documents begun in them; best fit: placed in them); `tokens_read` and
        `docs_read` are what the workers tokenized (or read from the cache) so far, which runs
        ahead of delivery by up to the ring and the workers' pieces; `tokens_per_s` is
        `tokens_read` per second since this run's processes started; `wait_s` is the seconds
        `next()` blocked for a batch (or made one: `head_batches`, the batches the training
        process made itself while a run's processes started, procs/headstart.py). Since the previous `stats()` call (the first: since the
        loader was made), over `interval_s` seconds (observe.py): `wait_share` (the share of
        it `next()` blocked for a batch), `delivered_tokens_per_s`, and each worker's
        `busy_share`. Now: `last_wait_s` (the last `next()`'s wait), `ready` of `ring_slots`
        (batches ready in the ring). No system call."""
        return self._report.stats(self._mark)

    def debug(self, start: bool = True):
        """What the loader runs now (`procs.run.Debug`), for tests and tools (not a stable API);
        None before the first `next()` and after `close()`. Children left unstarted while the
        forkserver boots (procs/headstart.py) are started first (waiting for it), unless `start`
        is False (their `pid` is None until then)."""
        return self._runs.debug(self._mark, start)

    def close(self, wait: bool = True):
        """Stop every process and unlink the shared memory; safe to call twice. The ring is
        unlinked and the processes told to exit at once; `wait=False` leaves joining them (2 s
        at most, then they are killed) to a thread of this process (procs/reaper.py), as a
        dropped loader does, so that the caller does not wait for their exit."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._runs.close(lifecycle.closed_text(self._forked_from), wait)

    # ---- internals --------------------------------------------------------------------------

    def _next(self):
        """`next()` under the lock."""
        if self._closed:
            raise errors.LoaderClosed(lifecycle.closed_text(self._forked_from))
        try:
            ann = self._ahead.take(self._mark)  # the run's next, or the one state_dict() looked ahead at
        except resumemod.Mismatch:
            self.close()
            raise
        batch, self._mark = self._runs.deliver(ann, self._shape)
        self._state = None  # built when asked
        self._report.delivered(ann.waited, self._mark)
        return batch

    def _begin(self, resume: statemod.Resume):
        """Start from `resume` (a fresh start, or where a resume plan says): the next run begins
        there, the states are written from there, a resumed run's first batch is checked."""
        self._catalogue.begin(resume.position.epoch)
        args = dataclasses.replace(self._args(), **self._kind.run_args(resume))  # its start: one `RunStart`
        self._writer = statemod.Writer(self._identity(), resume, self._kind.part)
        self._mark = self._kind.start_mark(resume, self.config.spec, self._mark.docs if self._mark else 0)
        self._runs.begin(args, resume.batch, self._mark.docs)
        self._state = self._writer.state(self._mark, resume.check)
        self._ahead.begin(resume.check)

    def _identity(self) -> statemod.Loader:
        """What a state is checked against, now."""
        return self._kind.identity(self.config, self.tokenizer, self.rank, self.world_size, self._first)

    def _args(self):
        """What every run of this loader is given (`RunArgs`; a run's start is added by `Runs`)."""
        return self._kind.args(self.config, self.tokenizer, self.rank, self.world_size, self._first)

    def _locked(self, what: str):
        """The lock (`what` names the call), waited for at most `timeout` s: `LoaderTimeout`."""
        return lifecycle.Within(self._lock, self.config.timeout, what)

    def _forked(self):
        """This process was forked from the loader's: let go of the parent's processes and ring
        without touching them, and refuse to be used."""
        if self._closed:
            return
        self._closed, self._forked_from = True, self._pid
        self._lock = threading.Lock()  # the parent's other thread may have held it
        self._runs.forget()
