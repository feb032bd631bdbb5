"""The training-process side: `ShmLoader` (nanochat's drop-in functions are in nanochat.py).

Per batch the trainer does one `recv` (the coordinator's "batch k is in slot s") and one
`send` ("batch k may be overwritten"); it never sees token lists. CPU: the batch is a view
of its slot, lent to the caller and freed by the next `next()` after the caller drops it
(`Children.lend`), so yielded batches stay valid without a copy; while `n_slots // 2` lent
batches are held, further ones are copied into windows the caller owns (outbuf.py).
CUDA: the ring is pinned once
(`cudaHostRegister`), each batch is one non-blocking copy on the current stream into one of
two device buffers (a batch stays valid until the second `next()` after it), and its slot is
freed only once a CUDA event recorded after the copy has completed. Waiting for a batch is a
`connection.wait` that costs no CPU, times out, and checks every child process's sentinel
(while batches flow, liveness is checked twice a second).
See NOTE [ring protocol] in docs/design.md.
"""
import atexit
import dataclasses
import logging
import os
import time
import weakref
from multiprocessing.connection import wait

import torch

from . import cache as cachemod
from . import errors, source, state as statemod, tokenizer as tokmod
from . import ring as ringmod
from .config import LoaderConfig
from .loader_procs import locate_position, prestart, start_children
from .plan import Cursor
from .protocol import RunArgs
from .ring import RingLayout, SlotState, WorkerCol

LIVENESS_CHECK_S = 0.5
IN_USE = int(SlotState.IN_USE)
_live = weakref.WeakSet()
_atexit_registered = False


def _close_all():
    for loader in list(_live):
        loader.close()


def _device(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


class ShmLoader:
    """Iterate `(inputs, targets)` int64 batches of shape (B, T); see SPEC §1-§3."""

    def __init__(self, data=None, tokenizer=None, B: int = 32, T: int = 2048, split: str = "train",
                 packing: str = "concat", num_workers: int = 4, device="cuda", *, rank=None,
                 world_size=None, resume_state=None, filesystem=None, bos: int | None = None,
                 **options):
        """`options` are the fields of `LoaderConfig` (n_slots, tokenizer_batch_size,
        buffer_size, max_piece_docs, start_method, timeout, on_bad_row_group, cache_dir,
        log_every); see the README for each one's meaning and default."""
        if options.get("cache_dir") is not None:
            options["cache_dir"] = os.fspath(options["cache_dir"])
        self.cfg = LoaderConfig(B, T, split, packing, num_workers, **options)
        prestart(self.cfg.start_method)  # the forkserver boots while the rest is built
        self.device = _device(device)
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank {self.rank} of {self.world_size}")
        if data is None:  # nanochat's directory; rank 0 of the train split tells of a fallback
            data = source.default_data_dir(notice=self.rank == 0 and split == "train")
        self.filesystem = source.filesystem_for(data, filesystem)
        self.files = source.split_files(source.list_files(data, self.filesystem), split)
        self.tokenizer = tokmod.resolve(tokenizer, bos)
        if self.cfg.cache_dir is not None:
            cachemod.sweep_temporaries(self.cfg.cache_dir)
        sizes = source.file_sizes(self.files, self.filesystem)
        self.config = self.cfg.fingerprint(self.tokenizer.fingerprint)
        self._identity = statemod.Loader(self.config, statemod.file_list(self.files, sizes), self.rank,
                                         self.world_size, B, T, self.cfg.bestfit, self.cfg.other_rank)
        self._procs, self._closed = None, False
        self._stats = {"batches": 0, "wait_s": 0.0}
        self._begin(statemod.start(self._identity))
        if resume_state is not None:
            self.load_state_dict(resume_state)
        _register(self)

    def __getattr__(self, name):
        """The config's fields read as the loader's own (loader.B, loader.n_slots, ...)."""
        cfg = self.__dict__.get("cfg")
        if cfg is not None and hasattr(cfg, name):
            return getattr(cfg, name)
        raise AttributeError(f"'ShmLoader' object has no attribute {name!r}")

    # ---- public API -------------------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        if self._closed:
            raise errors.LoaderClosed("this ShmLoader was closed; make a new one")
        if self._procs is None:
            self._start()
        k, slot, pos = self._next_ready()
        p = self._procs
        p.ring.slot_states[slot] = IN_USE
        runs = p.ring.runs_of(slot) if self.bestfit else None  # before the slot is freed
        if p.pinned:
            window = p.device_bufs[k & 1]
            window.copy_(p.slot_tensors[slot], non_blocking=True)
            event = torch.cuda.Event(blocking=True)  # synchronize() sleeps instead of spinning
            event.record(torch.cuda.current_stream(self.device))
            p.inflight.append((k, slot, event))
        elif self.device.type == "cpu" and len(p.lent) < self.cfg.lend_cap:
            window = p.lend(k, slot)  # its slot is freed by the first next() after the caller drops it
        else:  # a copy: the caller holds many batches already, or a device without pinning
            window = p.outputs.copy_out(p.ring.slots[slot])
            p.free(k, slot)
            if self.device.type != "cpu":
                window = window.to(self.device)
        self._stats["batches"] += 1
        if self.log_every and self._stats["batches"] % self.log_every == 0:
            self._log()
        self._state, self._position = None, (pos, runs, k)  # built when state_dict() asks
        if self.bestfit:
            n = self.B * self.T
            return window[:n].view(self.B, self.T), window[n:].view(self.B, self.T)
        return window[:-1].view(self.B, self.T), window[1:].view(self.B, self.T)

    def state_dict(self) -> dict:
        """The state that resumes after the last batch yielded (JSON-serialisable; SPEC §3).
        nanochat's drop-in functions yield, with each batch, the state that resumes at it."""
        if self._state is None:  # a best-fit buffer of ~1000 documents is worth not listing per batch
            pos, runs, k = self._position
            batch = self._resume.batch + k + 1
            if runs is None:
                self._state = statemod.make_state(self._base_state, *pos, batch)
            else:
                self._state = statemod.make_state(self._base_state, *pos, 0, batch, runs.tolist(),
                                                  runs.tobytes())
        return dict(self._state)

    def load_state_dict(self, state: dict):
        """Continue from `state`: the next batch is the one it resumes at (SPEC §3). Another
        rank's state first finds this rank's own position at the state's batch count."""
        resume = statemod.check(state, self._identity)
        if resume.locate:
            resume = self._locate(resume)
        if getattr(self, "_procs", None) is not None:
            self._stop()
        self._begin(resume)

    def stats(self) -> dict:
        out = {"batches": self._stats["batches"], "wait_s": self._stats["wait_s"],
               "num_workers": self.num_workers, "epoch": self._epoch()}
        p = self._procs
        if p is not None:
            values = dict(zip(ringmod.STATS_FIELDS, (int(v) for v in p.ring.stats)))
            elapsed = time.monotonic() - p.started_at
            out.update(tokens_read=values["tokens"], docs_read=values["docs"], nulls=values["nulls"],
                       pieces=values["pieces"], bad_row_groups_skipped=values["skipped_rg"],
                       cache_hits=values["cache_hits"], cache_misses=values["cache_misses"],
                       tokens_per_s=values["tokens"] / max(elapsed, 1e-9),
                       ring_ready=int((p.ring.slot_states == SlotState.READY).sum()),
                       ring_slots=self.n_slots, epoch=max(out["epoch"], values["epoch"]),
                       workers=[{"pid": int(r[WorkerCol.PID]), "tokens": int(r[WorkerCol.TOKENS]),
                                 "tokens_per_s": float(r[WorkerCol.TOKENS] / (r[WorkerCol.BUSY_US] / 1e6))
                                 if r[WorkerCol.BUSY_US] else 0.0}
                                for r in p.ring.workers])
            if self.bestfit:
                planned = values["placed"] + values["cropped"]
                out.update(tokens_cropped=values["cropped"],
                           cropped_fraction=values["cropped"] / planned if planned else 0.0)
        return out

    def _log(self):
        s = self.stats()
        extra = f", cropped {s['cropped_fraction']:.1%}" if "cropped_fraction" in s else ""
        logging.getLogger("shmloader").info(
            "batch %d: %.2fM tokens/s read, waited %.1f s in next(), ring %d/%d ready, epoch %d%s",
            s["batches"], s.get("tokens_per_s", 0) / 1e6, s["wait_s"], s.get("ring_ready", 0),
            self.n_slots, s["epoch"], extra)

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

    def _epoch(self) -> int:
        """The state's epoch, without building the state."""
        return self._state["epoch"] if self._state is not None else self._position[0][0]

    def _begin(self, resume: statemod.Resume):
        self._resume = resume
        self._base_state = statemod.base_state(self._identity, resume)
        c = resume.cursor
        runs = [list(run) for run in resume.runs] if self.bestfit else None
        self._state = statemod.make_state(self._base_state, c.epoch, c.file, c.rg, c.doc, resume.skip,
                                          resume.batch, runs)

    def _coordinator_args(self, layout: RingLayout, resume: statemod.Resume, files, locate=None):
        return RunArgs(files=files, rank=self.rank, world=self.world_size, layout=layout,
                       start=resume.cursor, skip=resume.skip,
                       buffer_runs=tuple(tuple(r) for r in resume.runs),
                       filesystem=source.FilesystemRef(self.filesystem) if self.filesystem else None,
                       tokenizer=self.tokenizer, locate=locate)

    def _start(self):
        c = self.cfg
        layout = RingLayout(c.n_slots, c.window, c.num_workers, c.max_runs)
        self._procs = start_children(self, layout, self._coordinator_args(layout, self._resume, self.files))

    def _locate(self, resume: statemod.Resume) -> statemod.Resume:
        """This rank's position at `resume.batch`, by replaying the run over its own document
        lengths (the token cache's, or counted by the workers), from the files the state was
        saved with."""
        log = logging.getLogger("shmloader")
        log.info("rank %d: finding this rank's position at batch %d of another rank's state, "
                 "counting document lengths with %d workers", self.rank, resume.batch, self.num_workers)
        began = time.monotonic()
        layout = RingLayout(2, 1, self.num_workers)
        cargs = self._coordinator_args(layout, resume, self.files[:resume.n_files],
                                       (resume.shapes, resume.batch))
        (epoch, file, rg, doc, skip), runs, cached, counted = locate_position(self, layout, cargs)
        log.info("rank %d: batch %d is at epoch %d, file %d, row group %d, document %d, token %d "
                 "(found in %.1f s; row groups from the token cache: %d, %d counted)", self.rank,
                 resume.batch, epoch, file, rg, doc, skip, time.monotonic() - began, cached, counted)
        return dataclasses.replace(resume, cursor=Cursor(epoch, file, rg, doc), skip=skip, runs=runs,
                                   locate=False)

    def _stop(self):
        procs, self._procs = self._procs, None
        if procs is not None:
            procs.shutdown()

    def _flush_copies(self, wait_all: bool):
        p = self._procs
        while p.inflight and (wait_all or p.inflight[0][2].query()):
            k, slot, event = p.inflight.popleft()
            event.synchronize()
            p.free(k, slot)

    def _next_ready(self):
        p = self._procs
        p.free_released()
        if p.inflight:
            self._flush_copies(wait_all=False)
        now = time.monotonic()
        if now >= p.next_check:  # a select() per batch is measurable; twice a second is enough
            p.next_check = now + LIVENESS_CHECK_S
            p.check_alive()
        while p.has_message():
            got = p.receive()
            if got is not None:
                return got
        started = time.monotonic()
        deadline = started + self.timeout
        if p.inflight:
            self._flush_copies(wait_all=True)
        while True:
            p.free_released()  # batches let go of in another thread meanwhile
            ready = wait([p.conn, *p.sentinels], timeout=min(1.0, max(deadline - time.monotonic(), 0)))
            if p.conn in ready:
                got = p.receive()
                if got is not None:
                    self._stats["wait_s"] += time.monotonic() - started
                    return got
                continue
            if ready:
                p.check_alive()
            if time.monotonic() >= deadline:
                raise errors.LoaderTimeout(
                    f"no batch within {self.timeout:.0f} s although every loader process is alive; "
                    f"workers: {p.describe_workers()}; raise timeout= if row groups are huge")


def _register(loader: ShmLoader):
    global _atexit_registered
    _live.add(loader)
    if not _atexit_registered:
        atexit.register(_close_all)
        _atexit_registered = True
