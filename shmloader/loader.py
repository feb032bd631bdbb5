"""The training process's side: `ShmLoader` composes three parts (the nanochat drop-in
functions over it are in nanochat.py):

- the children (`procs.children.Children`): the coordinator and workers, started, watched and
  stopped, and the ring they share;
- the delivery (`delivery.py`): how a ring slot becomes the caller's batch (a lent CPU view,
  one pinned non-blocking CUDA copy, or a copy) and when its slot goes back;
- the resume state (`state.py`): built from the position the coordinator sends with each
  batch, when `state_dict()` asks. A state carries the check of the batch it resumes at (the
  coordinator's `batch_check` of it), so `state_dict()` looks at the next batch's
  announcement, waiting for it if it is not made yet (`_take`; `next()` then returns that
  batch); a resumed loader compares its first batch's check with the state's.

A ready batch is taken from the ring's header and its slot given back there, without a
system call (NOTE [slot handover], ipc/handover.py); it never sees token lists. Waiting for a
batch is a poll on the coordinator's doorbell and pipe that costs no CPU, times out, and
checks every child process's sentinel (while batches flow, liveness is checked twice a
second). A child that dies, or stalls while `next()` waits, is healed (`_heal`): every child
starts again from the state after the last batch returned, within the `max_restarts` budget;
an idle release (`idle_release_s`) restarts the same way. `config` is the frozen
`LoaderConfig`; `debug()` exposes the running parts to tests and tools.
See NOTE [ring protocol] in docs/design.md.
"""
import atexit
import dataclasses
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from . import delivery, errors, state as statemod
from .config import LoaderConfig
from .data import cache as cachemod
from .data import engine as enginemod
from .data import elastic, source, tokenizer as tokmod
from .data.order import Cursor
from .ipc import ring as ringmod
from .ipc.protocol import RunArgs
from .ipc.ring import RingLayout, WorkerCol
from .procs.children import ChildLost, ChildrenReleased, locate_position, start_children
from .procs import precedence
from .procs.start import forget_forkserver, prestart

HEAL_WINDOW_S = 3600.0  # max_restarts counts the heals within this window

_live = weakref.WeakSet()
_registered = False


def _close_all():
    for loader in list(_live):
        loader.close()


def _forget_all():
    """In a child forked from a process that holds loaders (`os.fork()`): none is used here."""
    for loader in list(_live):
        loader._forked()
    forget_forkserver()
    precedence.forget()


def _device(device) -> torch.device:
    """`device` as a torch.device with its index; a CUDA device this torch cannot use is a
    DeviceError that says to pass device="cpu" (torch's own is an AssertionError, raised later)."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is a CPU build" if torch.version.cuda is None
                   else "no CUDA device is visible (CUDA_VISIBLE_DEVICES, the driver?)")
            raise errors.DeviceError(f"device={str(device)!r}, but {why} (torch {torch.__version__}); "
                                     f"pass device=\"cpu\" to load on the CPU")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer (torchrun sets "
                         f"RANK and WORLD_SIZE; or pass rank= and world_size=)") from None


@dataclass(frozen=True)
class Debug:
    """`ShmLoader.debug()`: the running children (multiprocessing `Process` objects), the ring's
    /dev/shm name and views, and the delivery (delivery.py) in use."""
    coordinator: object
    workers: list
    segment: str
    ring: object
    delivery: object


class _Taken(NamedTuple):
    """A batch taken from the ring and not yet returned (`ShmLoader._take`)."""
    k: int           # its number in the run
    slot: int
    pos: tuple       # the position after it (epoch, file, rg, doc, skip)
    docs: int        # documents begun by its end, in this run
    check: int       # its batch_check
    runs: object     # best fit: the buffer after it (`state.Encoded`), else None
    waited: float    # seconds next_batch blocked for it


class ShmLoader:
    """Iterate `(inputs, targets)` int64 batches of shape (B, T); see docs/contract.md §1-§3."""

    def __init__(self, data=None, tokenizer=None, B: int = 32, T: int = 2048, split: str = "train",
                 packing: str = "concat", num_workers: int = 4, device="cuda", *, rank=None,
                 world_size=None, resume_state=None, filesystem=None, bos: int | None = None,
                 **options):
        """`options` are the fields of `LoaderConfig` (n_slots, tokenizer_batch_size,
        buffer_size, max_piece_docs, max_piece_bytes, start_method, timeout, on_bad_row_group,
        cache_dir, log_every, other_rank, engine, idle_release_s, max_restarts, stall_s); see
        the README for each one's meaning and default."""
        self.device = _device(device)  # first: without CUDA, say so before reading anything
        if options.get("cache_dir") is not None:
            options["cache_dir"] = os.fspath(options["cache_dir"])
        self.config = LoaderConfig(B, T, split, packing, num_workers, **options)
        prestart(self.config.start_method)  # the forkserver boots while the rest is built
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank {self.rank} of {self.world_size}")
        if data is None:  # nanochat's directory; rank 0 of the train split tells of a fallback
            data = source.default_data_dir(notice=self.rank == 0 and split == "train")
        self.filesystem = source.filesystem_for(data, filesystem)
        listing = source.list_files(data, self.filesystem)
        self.files = source.split_files(listing, split)
        self._listing, self._later, self._later_at = list(self.files), None, None  # (see _reorder)
        self.tokenizer = tokmod.resolve(tokenizer, bos)
        enginemod.available(self.config.engine)
        if self.config.cache_dir is not None:
            problem = cachemod.prepare(self.config.cache_dir)
            if problem is not None:
                errors.warn(f"shmloader: {problem}")
        sizes = source.file_sizes(self.files, self.filesystem)
        self._identity = statemod.Loader(self.config.fingerprint(self.tokenizer.fingerprint),
                                         statemod.file_list(self.files, sizes), self.rank,
                                         self.world_size, B, T, self.config.spec.buffered, self.config.other_rank,
                                         footers=lambda idx: source.footer_digests([self.files[i] for i in idx],
                                                                                   self.filesystem),
                                         val=statemod.file_list(listing[-1:], [0])[0][0])
        self._procs, self._delivery, self._closed = None, None, False
        self._pid, self._forked_from = os.getpid(), None
        self._next_lock = threading.Lock()  # next() from several threads: one at a time
        self._shape = (B, T, self.config.spec.targets_at(B, T))  # a batch's (B, T, targets' offset)
        self._buffered, self._log_every = self.config.spec.buffered, self.config.log_every
        # documents delivered: by runs that ended (load_state_dict), and by the current run
        self._stats = {"batches": 0, "wait_s": 0.0, "docs": 0, "run_docs": 0, "idle_releases": 0, "heals": 0}
        self._heals = []          # monotonic times of the heals (the budget counts those within HEAL_WINDOW_S)
        self._lost_on = {}        # (path, row group) -> the last piece of it a worker held at a death or stall
        self._poisoned = set()    # of those, the ones in flight at two deaths, skipped (on_bad_row_group="skip")
        self._verify = None       # a resumed run's first batch must have this check (the state's)
        self._failed = None       # the error state_dict() met looking ahead, for the next next() to raise
        self._inside = None       # the thread inside next(), if any
        self._begin(statemod.start(self._identity))
        if resume_state is not None:
            self.load_state_dict(resume_state)
        _register(self)

    B = property(lambda self: self.config.B, doc="rows per batch")
    T = property(lambda self: self.config.T, doc="tokens per row")
    split = property(lambda self: self.config.split)
    packing = property(lambda self: self.config.packing)
    num_workers = property(lambda self: self.config.num_workers)
    n_slots = property(lambda self: self.config.n_slots)

    # ---- public API -------------------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        """The next batch. Threads that call it at once are served one at a time, in turn (each
        batch goes to one of them); one that waits longer than `timeout` for another's call
        raises `LoaderTimeout`."""
        lock = self._next_lock
        if not lock.acquire(False) and not lock.acquire(timeout=self.config.timeout):
            raise errors.LoaderTimeout(f"next() waited {self.config.timeout:.0f} s for another thread's "
                                       f"next() on this loader to return")
        self._inside = threading.get_ident()
        try:
            return self._next()
        finally:
            self._inside = None
            lock.release()

    def _next(self):
        if self._closed:
            raise errors.LoaderClosed(self._closed_text())
        k, slot, pos, docs, _, runs, waited = self._take()
        batch = self._delivery.batch(k, slot, self._shape)
        stats = self._stats
        stats["batches"] += 1
        if waited:
            stats["wait_s"] += waited
        stats["run_docs"] = docs
        if self._log_every and stats["batches"] % self._log_every == 0:
            self._log()
        self._state, self._position = None, (pos, runs, k)  # built when state_dict() asks
        return batch

    def _take(self) -> _Taken:
        """The next batch, taken from the ring and not yet returned: the one `state_dict()`
        looked ahead at, else the ring's next (starting the children first, and healing or
        restarting them when they are gone). The first one of a resumed run is checked."""
        got, self._ahead = self._ahead, None
        if got is not None:
            return got
        if self._failed is not None:  # what state_dict() met looking ahead for this batch
            failed, self._failed = self._failed, None
            raise failed
        while True:
            if self._closed:  # closed by another thread while this one waited, or healed
                raise errors.LoaderClosed(self._closed_text())
            if self._procs is None:
                self._start()
            procs = self._procs
            try:
                k, slot, pos, docs, check, waited = procs.next_batch(self._delivery, self.config.timeout)
                break
            except (ChildrenReleased, ChildLost) as exc:
                gone = exc.with_traceback(None)  # its frames (and its context's) hold the old ring's views:
                gone.__context__ = gone.__cause__ = None  # kept, they would keep the ring mapped
            # the children are gone: start new ones from the state (as a resume)
            if isinstance(gone, ChildLost):
                self._heal(gone)
            else:
                self._restart_after_release(gone.args[0])
        if procs.opened:  # files the coordinator has read (first, or again after a change)
            self._learn(procs.opened)
        if self._verify is not None:
            self._check_first(check)
        # best fit: the buffer after this batch, as the state's text (copied before the slot is freed)
        runs = statemod.Encoded(*procs.ring.buffer_of(slot)) if self._buffered else None
        return _Taken(k, slot, pos, docs, check, runs, waited)

    def _check_first(self, check: int):
        """The first batch of a resumed run has `check`: it must be the state's (`_verify`)."""
        expected, self._verify = self._verify, None
        if check == expected:
            return
        epoch, file, rg, doc, skip = self._position[0]
        at = (f"batch {self._resume.batch} (epoch {epoch}, {os.path.basename(self.files[file])}, row group {rg}, "
              f"document {doc}" + (f", token {skip}" if skip else "") + ")")
        skipping = ("; with on_bad_row_group='skip', a row group skipped as bad in the saved run and readable "
                    "now (or the other way round) changes it too" if self.config.on_bad_row_group == "skip" else "")
        self.close()
        raise ValueError(
            f"resume check: the batch this loader resumed at, {at}, is not the one the state was saved before "
            f"(its check is {check:08x}, the state's 'check' is {expected:08x}): the data at or after that position "
            f"differs from the run's although the files' names and sizes (and footers, where the state has them) "
            f"match, e.g. a file replaced by another of the same name and size, or a tokenizer that encodes "
            f"differently under the same name{skipping}; resume with the data and tokenizer the run used, or start "
            f"a new run. This loader is closed")

    def _heal(self, lost: ChildLost):
        """A child died or stalled (`lost`): unless the budget (`max_restarts` within
        `HEAL_WINDOW_S`) is spent or the row group it held was in flight at an earlier death
        too (then an error, or skipped with on_bad_row_group="skip"), every child starts again
        from the state after the last batch returned, as a resume: the stream goes on exactly."""
        c, now = self.config, time.monotonic()
        self._heals = [t for t in self._heals if now - t < HEAL_WINDOW_S]
        if len(self._heals) >= c.max_restarts:
            if not c.max_restarts:
                raise lost
            raise errors.WorkerError(f"{lost} (the loader healed {len(self._heals)} deaths or stalls in the last "
                                     f"{HEAL_WINDOW_S / 60:.0f} minutes: max_restarts={c.max_restarts} is spent)") from None
        what, held = "", lost.held
        if held is not None:
            path, rg = held.path, held.rg
            what = f"; it was tokenizing {path}, row group {rg}, documents {held.doc}-{held.end - 1}"
            if self._not_passed(self._lost_on.get((path, rg))):
                if c.on_bad_row_group != "skip":
                    slow = (f"; if its documents are only slow to read or to tokenize, raise stall_s "
                            f"(now {c.stall_s:g} s)" if lost.stalled_s is not None else "")
                    raise errors.WorkerError(
                        f"{lost}: {path}, row group {rg} was being tokenized at two deaths or stalls of a worker "
                        f"(a document in it kills or hangs the worker or its tokenizer): fix or remove it, or "
                        f"pass on_bad_row_group='skip' to skip it{slow}") from None
                self._poisoned.add((path, rg))
                errors.warn(f"shmloader: skipping {path}, row group {rg}: it was being tokenized at two deaths or "
                            f"stalls of a worker (on_bad_row_group='skip')")
            self._lost_on[(path, rg)] = held
        self._heals.append(now)
        self._stats["heals"] += 1
        logging.getLogger("shmloader").warning(
            "rank %d: %s%s; heal %d of max_restarts=%d in %.0f minutes: every loader process starts again at "
            "batch %d", self.rank, str(lost), what, len(self._heals), c.max_restarts, HEAL_WINDOW_S / 60,
            self._restart())

    def _not_passed(self, held) -> bool:
        """Whether the stream has not yet gone past the piece `held` (a `Held` from an earlier
        death, or None): the next batch starts before its end (best fit: the buffer has not
        taken all of it), so the piece has never been read whole since. A second death in the
        same row group is then not chance but a document that kills: a poison pill."""
        if held is None:
            return False
        epoch, file, rg, doc = self._position[0][:4]
        return (epoch, file, rg, doc) < (held.epoch, held.file, held.rg, held.end)

    def _restart_after_release(self, idle_s: float):
        """The children exited after `idle_s` s without a batch taken (`idle_release_s`): new
        ones start from the state after the last batch returned, as a resume would (the
        batches left in the ring are made again; lent ones stay valid)."""
        self._stats["idle_releases"] += 1
        logging.getLogger("shmloader").info(
            "rank %d: the loader's processes exited after %.1f s without a batch taken (idle_release_s=%g); "
            "starting them again at batch %d", self.rank, idle_s, self.config.idle_seconds, self._restart())

    def _restart(self) -> int:
        """Stop the children and start new ones where the last batch returned left off: the
        position, batch count and best-fit buffer `state_dict()` would give, taken as they are
        (in this run's numbering of the files; no check of the files again: nothing changed).
        Returns the batch count it starts at."""
        pos, runs, k = self._position
        resume = dataclasses.replace(
            self._resume, cursor=Cursor(*pos[:4]), skip=pos[4], batch=self._resume.batch + k + 1, locate=False,
            runs=statemod.decode_runs(runs.text).tolist() if runs is not None else [], check=None)
        self._begin(resume)  # first: a Ctrl-C in _stop leaves the new start in place, not the old run's
        self._state = None  # its check is the next batch's: state_dict() looks ahead for it
        self._stop()
        return resume.batch

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
            return self._state_after_last()
        lock = self._next_lock
        if not lock.acquire(False) and not lock.acquire(timeout=self.config.timeout):
            raise errors.LoaderTimeout(f"state_dict() waited {self.config.timeout:.0f} s for another thread's "
                                       f"next() on this loader to return")
        try:
            if self._state is None:  # a best-fit buffer of ~1000 documents is worth not listing per batch
                if self._closed:
                    return self._state_after_last()
                try:
                    self._ahead = self._take()
                except Exception as exc:  # noqa: BLE001 (it is the next next()'s to raise)
                    self._failed = exc.with_traceback(None)
                    return self._state_after_last()
                self._state = self._state_after_last(self._ahead.check)
            return dict(self._state)
        finally:
            lock.release()

    def _state_after_last(self, check: int | None = None) -> dict:
        """The state after the last batch returned, with the next batch's `check` if known."""
        pos, runs, k = self._position
        return self._make_state(pos, self._resume.batch + k + 1, runs, check)

    def load_state_dict(self, state: dict):
        """Continue from `state`: the next batch is the one it resumes at (docs/contract.md §3). Another
        rank's state first finds this rank's own position at the state's batch count."""
        if not self._next_lock.acquire(timeout=self.config.timeout):  # not under another thread's next()
            raise errors.LoaderTimeout(f"load_state_dict() waited {self.config.timeout:.0f} s for another "
                                       f"thread's next() on this loader to return")
        try:
            self._load(state)
        finally:
            self._next_lock.release()

    def _load(self, state: dict):
        if self._closed:
            raise errors.LoaderClosed(self._closed_text())
        resume = statemod.check(state, self._identity)
        if resume.origin is not None and "version" not in state:
            self._check_row_group(resume.origin)
        self._reorder(resume.order)
        if resume.change is not None:
            resume = self._elastic(resume)
        elif resume.locate and resume.plan is not None:  # another rank's state of a run that began elastic
            resume = self._plan_start(resume, resume.plan)
        if resume.locate:
            resume = self._locate(resume)
        self._identity = dataclasses.replace(self._identity, files=statemod.with_footers(state, self._identity.files))
        self._begin(resume)  # first: a Ctrl-C in _stop leaves the new start in place, not the old run's
        self._verify = resume.check
        if getattr(self, "_procs", None) is not None:
            self._stop()

    def stats(self) -> dict:
        """Counters of this loader. `tokens_delivered` and `docs_delivered` are what the batches
        `next()` returned hold (documents begun in them; best fit: placed in them);
        `tokens_read` and `docs_read` are what the workers tokenized (or read from the cache)
        so far, which runs ahead of delivery by up to the ring and the workers' pieces."""
        s = self._stats
        out = {"batches": s["batches"], "wait_s": s["wait_s"], "num_workers": self.config.num_workers,
               "epoch": self._epoch(), "tokens_delivered": s["batches"] * self.config.B * self.config.T,
               "docs_delivered": s["docs"] + s["run_docs"], "idle_releases": s["idle_releases"], "heals": s["heals"]}
        p = self._procs
        if p is not None:
            values = dict(zip(ringmod.STATS_FIELDS, (int(v) for v in p.ring.stats)))
            elapsed = time.monotonic() - p.started_at
            out.update(tokens_read=values["tokens"], docs_read=values["docs"], nulls=values["nulls"],
                       pieces=values["pieces"], bad_row_groups_skipped=values["skipped_rg"],
                       cache_hits=values["cache_hits"], cache_misses=values["cache_misses"],
                       tokens_per_s=values["tokens"] / max(elapsed, 1e-9),
                       ring_ready=p.ready_batches(),
                       ring_slots=self.config.n_slots, epoch=max(out["epoch"], values["epoch"]),
                       workers=[{"pid": int(r[WorkerCol.PID]), "tokens": int(r[WorkerCol.TOKENS]),
                                 "tokenized": int(r[WorkerCol.TOKENIZED]),
                                 "tokens_per_s": float(r[WorkerCol.TOKENS] / (r[WorkerCol.BUSY_US] / 1e6))
                                 if r[WorkerCol.BUSY_US] else 0.0}
                                for r in p.ring.workers])
            out.update(self.config.spec.stats(values))
        return out

    def _log(self):
        s = self.stats()
        extra = f", cropped {s['cropped_fraction']:.1%}" if "cropped_fraction" in s else ""
        logging.getLogger("shmloader").info(
            "batch %d: %.2fM tokens/s read, waited %.1f s in next(), ring %d/%d ready, epoch %d%s",
            s["batches"], s.get("tokens_per_s", 0) / 1e6, s["wait_s"], s.get("ring_ready", 0),
            self.config.n_slots, s["epoch"], extra)

    def debug(self) -> "Debug | None":
        """What the loader runs now, for tests and tools (not a stable API); None before the
        first `next()` and after `close()`."""
        p = self._procs
        if p is None:
            return None
        return Debug(p.coordinator, list(p.workers), p.segment.name, p.ring, self._delivery)

    def close(self):
        """Stop every process and unlink the shared memory; safe to call twice."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    # ---- internals --------------------------------------------------------------------------

    def _closed_text(self) -> str:
        if self._forked_from is not None:
            return (f"this ShmLoader belongs to process {self._forked_from}, and this process was forked "
                    f"from it: a forked child never uses its parent's loader (its processes and ring "
                    f"are the parent's); make a new loader in the child, after the fork")
        return "this ShmLoader was closed; make a new one"

    def _make_state(self, pos: tuple, batch: int, runs, check: int | None):
        """The state at `pos` (epoch, file, rg, doc, skip: the file as the run numbers it);
        `runs`: a buffered packing's `state.Encoded` buffer (the coordinator's), or None;
        `check`: the batch_check of the batch there, if known."""
        epoch, file, *rest = pos
        pq, files, renumber = self._described(epoch, file)
        if runs is None:
            return statemod.make_state(self._base_state, epoch, pq, *rest, batch, files=files, check=check)
        if renumber is not None:  # the run's file numbers are not the state's: decoded and renumbered
            runs = statemod.decode_runs(runs.text)
            runs[:, 1] = renumber[runs[:, 1]]
        return statemod.make_state(self._base_state, epoch, pq, *rest, batch, runs,
                                   files=files, check=check)  # a buffered packing's position has skip 0

    def _described(self, epoch: int, file: int) -> tuple:
        """`(pq_idx, files, renumber)` a state at (epoch, file) holds: the files in the order of
        its epoch (past the epoch a reordered run started in, their sorted order: `_reorder`),
        `state.described_files` of them, and the array that renumbers the run's file indices
        into that order (None: the same). Kept while it does not change: nanochat's loop asks
        for a state with every batch, and a split may hold thousands of files."""
        later = self._later is not None and epoch > self._resume.cursor.epoch
        pq = int(self._later_at[file]) if later else file
        key = (later, epoch > 1, pq if epoch == 1 else -1)
        if self._described_at[0] != key:
            files = [self._identity.files[t] for t in self._later] if later else self._identity.files
            self._described_at = (key, statemod.described_files(files, epoch, pq))
        return pq, self._described_at[1], self._later_at if later else None

    def _reorder(self, order: list | None):
        """The files in the order of the epoch in progress (`order`: indices into the present
        order; `state.check` gives it when files arrived inside the sort order since the save),
        and, for the epochs after it, in their sorted place: `_later` (indices into the new
        order), `_later_at` (its inverse)."""
        if order is not None:
            self.files = [self.files[i] for i in order]
            self._identity = dataclasses.replace(self._identity, files=[self._identity.files[i] for i in order])
        place = {path: i for i, path in enumerate(self._listing)}
        later = sorted(range(len(self.files)), key=lambda t: place[self.files[t]])
        self._later = None if later == list(range(len(later))) else tuple(later)
        self._later_at = np.argsort(later) if self._later is not None else None

    def _learn(self, opened: list):
        """The files' identities as the coordinator read them, for the states from here on: a
        state describes the files its batches came from. A file whose size or footer changed
        since the loader knew it is warned of. The list is replaced, never changed in place:
        states already handed out keep theirs."""
        files = list(self._identity.files)
        while opened:
            msg = opened.pop(0)
            name, size, footer = files[msg.file]
            if size != msg.size or footer not in (None, msg.footer):
                errors.warn(f"shmloader: {self.files[msg.file]} changed since this loader first knew it "
                            f"({size} bytes, footer {footer}; now {msg.size} bytes, footer {msg.footer}): "
                            f"batches from here on read it as it is now, and states say so")
            files[msg.file] = [name, msg.size, msg.footer]
        self._identity = dataclasses.replace(self._identity, files=files)
        self._base_state = dict(self._base_state, files=files)
        self._described_at = (None, None)

    def _check_row_group(self, origin: dict):
        """A nanochat state's row group must be one of its file's (the file's footer says)."""
        f, rg = origin["pq_idx"], origin["rg_idx"]
        n = len(source.ParquetSource(self.files, self.filesystem).row_counts(f))
        if rg >= n:
            raise ValueError(f"resume state field 'rg_idx' is {rg}, but {self.files[f]} (its 'pq_idx' "
                             f"{f}) has {n} row groups: the state is not of these files")

    def _forked(self):
        """This process was forked from the loader's: let go of the parent's processes and ring
        without touching them (`Children.forget`), and refuse to be used."""
        if self._closed:
            return
        self._closed, self._forked_from = True, self._pid
        self._next_lock = threading.Lock()  # the parent's other thread may have held it
        procs, self._procs, self._delivery = self._procs, None, None
        if procs is not None:
            procs.forget()

    def _epoch(self) -> int:
        """The state's epoch, without building the state."""
        return self._state["epoch"] if self._state is not None else self._position[0][0]

    def _begin(self, resume: statemod.Resume):
        self._resume = resume
        self._described_at = (None, None)
        self._base_state = statemod.base_state(self._identity, resume)
        c = resume.cursor
        runs = statemod.encode_buffer(resume.runs) if self._identity.buffered else None
        pos = (c.epoch, c.file, c.rg, c.doc, resume.skip)
        self._state = self._make_state(pos, resume.batch, runs, resume.check)
        self._position = (pos, runs, -1)  # where the run starts (its state is built already)
        self._ahead = self._failed = None  # a batch state_dict() took from the run before, or its error

    def _coordinator_args(self, layout: RingLayout, resume: statemod.Resume, files, locate=None,
                          rank: int | None = None, world: int | None = None):
        poisoned = tuple((files.index(p), rg) for p, rg in sorted(self._poisoned) if p in files)
        return RunArgs(files=files, rank=self.rank if rank is None else rank,
                       world=self.world_size if world is None else world, layout=layout, poisoned=poisoned,
                       start=resume.cursor, skip=resume.skip,
                       buffer_runs=tuple(tuple(r) for r in resume.runs),
                       filesystem=source.FilesystemRef(self.filesystem) if self.filesystem else None,
                       tokenizer=self.tokenizer, locate=locate, later=None if locate else self._later,
                       plan=resume.plan)

    def _start(self):
        c = self.config
        # a buffer can hold one run per document: the packing's most, or more, at first, after an elastic
        # resume gave this rank several old ranks' buffers (the planner refills only below its size)
        runs = sum(r[4] for r in self._resume.runs) + c.tokenizer_batch_size if c.max_runs else 0
        layout = RingLayout(c.n_slots, c.window, c.num_workers, max(c.max_runs, runs))
        self._procs = start_children(self.config, layout, self._coordinator_args(layout, self._resume, self.files))
        try:
            self._delivery = delivery.make(self.device, self._procs.ring.slots, self._procs.handover.free,
                                           self.config.lend_cap)
        except BaseException:
            self._stop()
            raise

    def _locate(self, resume: statemod.Resume, rank: int | None = None, world: int | None = None) -> statemod.Resume:
        """The position at `resume.batch` of this rank (or of `rank` of `world`: an old rank at a
        change of world size), by replaying the run over its document lengths (the token
        cache's, or counted by the workers), from the files the state was saved with; a run
        that began elastic replays from its plan's batch count."""
        log = logging.getLogger("shmloader")
        who = f"rank {self.rank}" if rank is None else f"rank {self.rank}: old rank {rank} of {world}"
        log.info("%s: finding the position at batch %d of another rank's state, counting document lengths "
                 "with %d workers", who, resume.batch, self.config.num_workers)
        began = time.monotonic()
        layout = RingLayout(2, 1, self.config.num_workers)
        first = resume.plan.batch if resume.plan is not None else 0
        cargs = self._coordinator_args(layout, resume, self.files[:resume.n_files],
                                       (resume.shapes, resume.batch, first), rank, world)
        (epoch, file, rg, doc, skip), runs, cached, counted = locate_position(self.config, layout, cargs)
        log.info("%s: batch %d is at epoch %d, file %d, row group %d, document %d, token %d "
                 "(found in %.1f s; row groups from the token cache: %d, %d counted)", who,
                 resume.batch, epoch, file, rg, doc, skip, time.monotonic() - began, cached, counted)
        return dataclasses.replace(resume, cursor=Cursor(epoch, file, rg, doc), skip=skip, runs=runs,
                                   locate=False)

    def _elastic(self, resume: statemod.Resume) -> statemod.Resume:
        """A state saved at another world size W (`resume.change`): find where every old rank
        stood at its batch count (the state's own rank from the state, the others by replaying
        their streams), make the plan that shares out what they had not consumed
        (data/elastic.py), and start this rank at its first unit, with its share of the old
        ranks' best-fit buffers."""
        change, log = resume.change, logging.getLogger("shmloader")
        log.warning("rank %d of %d: resuming a state saved at world_size %d (batch %d): finding where each of "
                    "the %d old ranks stood%s", self.rank, self.world_size, change.world, resume.batch,
                    change.world, "" if self.config.cache_dir else
                    " by tokenizing their streams up to that batch (tools/pretokenize.py and cache_dir make it "
                    "fast)")
        began = time.monotonic()
        positions, buffers = [], []
        for r in range(change.world):
            if r == change.rank:
                pos, runs = change.position, change.runs
            else:
                old = dataclasses.replace(resume, cursor=statemod.origin_cursor(resume.origin, r, change.world),
                                          skip=0, runs=[], change=None, locate=True, plan=change.parent)
                if change.parent is not None:  # the old run began at a change too: r's stream of its plan
                    old = self._plan_start(old, change.parent, r, change.world)
                found = self._locate(old, r, change.world)
                pos, runs = (*dataclasses.astuple(found.cursor), found.skip), found.runs
            positions.append(pos)
            buffers.append(runs)
        plan = elastic.Plan.of(change.world, resume.batch, positions, buffers if self._buffered else (), change.parent)
        log.warning("rank %d of %d: the old ranks' positions found in %.1f s; the rest of epoch%s %s is shared "
                    "out over the %d new ranks", self.rank, self.world_size, time.monotonic() - began,
                    "s up to" if plan.epoch > min(p[0] for p in positions) else "", plan.epoch, self.world_size)
        return self._plan_start(dataclasses.replace(resume, change=None, locate=False), plan)

    def _plan_start(self, resume: statemod.Resume, plan, rank: int | None = None,
                    world: int | None = None) -> statemod.Resume:
        """`resume` from where this rank's (or `rank` of `world`'s) stream of `plan` begins: its
        first unit and its share of the old buffers (at the plan's batch count)."""
        rank, world = (self.rank, self.world_size) if rank is None else (rank, world)
        files = self.files[:resume.n_files]
        reader = source.ParquetSource(files, self.filesystem)

        def row_counts(f: int) -> list:  # as the coordinator reads them (a bad file: none)
            counts = source.read_or_skip(lambda: reader.row_counts(f), self.config.on_bad_row_group,
                                         lambda text: None, "file")
            return [] if counts is None else counts

        cursor, skip = elastic.start(plan, rank, world, row_counts, len(files))
        runs = elastic.buffer(plan, rank, world) if self._buffered else []
        return dataclasses.replace(resume, cursor=cursor, skip=skip, runs=runs, plan=plan)

    def _stop(self):
        """Stop the children; the delivery first (copies in flight read the ring)."""
        self._stats["docs"] += self._stats["run_docs"]
        self._stats["run_docs"] = 0
        procs, self._procs = self._procs, None
        got, self._delivery = self._delivery, None
        try:
            if got is not None:
                got.close()
        finally:
            if procs is not None:
                procs.shutdown()


def _register(loader: ShmLoader):
    global _registered
    _live.add(loader)
    if not _registered:
        atexit.register(_close_all)
        os.register_at_fork(after_in_child=_forget_all)
        _registered = True
