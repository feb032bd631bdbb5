"""Benchmark shmloader against today's nanochat loader, side by side on the same data in one run.

    python tools/bench.py                      # the demo corpus, workers 1 2, 10 s per measurement
    python tools/bench.py --quick              # 3 s per measurement (~1.5-2 min on 2 cores)
    python tools/bench.py --workers 1 2 4 --json bench_out/bench.json
    python tools/bench.py --workers 2 --repeat 5     # medians of 5 interleaved rounds
    python tools/bench.py --corpus demo nanochat skewed --workers 1 2 --repeat 3 --first-batch
                                               # the three corpora (about 3x as long per corpus)

Every loader configuration (the baseline, then shmloader with each `--workers` count) runs
in a fresh child process, so that its peak RSS is its own; the children run one after the
other, never together. Figures (docs/contract.md §5):

- tokens/s: tokens read per wall second, consuming as fast as possible for `--seconds`,
  counted from the first batch; "vs base" is the ratio to the baseline measured in the same
  run (with `--repeat`, the median of the ratios within each round). Concat: B*T+1 per batch delivered. Best fit: tokens the workers tokenized in the window
  (it opens after a quarter of `--seconds`, once the read-ahead and the buffer are full),
  since best fit drops a share of what it reads (docs/contract.md §5: compare modes by tokens read).
- trainer CPU us/batch: user + system CPU time of the training process (getrusage
  RUSAGE_SELF, all threads) per batch over that same loop.
- first batch: wall time from constructing a loader to its first batch in a process that
  has already imported torch; the median of `--first-runs` fresh loaders. "cold" is the first
  of them, which for shmloader also starts multiprocessing's forkserver.
- trainer cost: the CPU time of each `next()` alone (getrusage deltas around the call) on
  batches that are ready: shmloader gets a ring of `--cost-batches` slots, the bench waits
  until every slot is ready and then calls next() back to back. Also measured with the
  consumer sleeping `--cost-sleep-ms` between calls, as a training step would, next to the
  cost of one small torch op (a view) under the same sleeps: on this kind of virtual machine
  the first work after a sleep pays a large warm-up penalty (cache and TLB refills), which
  the "floor" column shows and which has nothing to do with the loader.
- system calls per `next()` (`--syscall-batches`, needs strace): a trainer process runs
  that many steps of `--syscall-step-ms` of busy work (a training step's compute, no system
  call) then `next()`, with strace attached to its main thread for those steps
  (`tools/syscalls.py`), per packing, with the largest `--workers` count; also how many
  of those calls found no batch ready (they block, which takes system calls).
- RSS: the trainer's peak (ru_maxrss) and the largest worker's peak (VmHWM in /proc).
- raw rates: single-thread tiktoken `encode_to_numpy(text, disallowed_special=())` and
  `encode_ordinary(text)`, and the loaders' engine (`--engine`, default auto: fastokens when
  installed, as a worker builds it) over the same documents in this (the main) process, best
  of 3 interleaved passes, the engine both one document per call and as a worker calls it
  ("batch": runs of documents of `worker.CHUNK_CHARS` characters per call): how fast each
  engine is, for context.
- bare processes: in every round, just before the loaders with N workers (N <= cores), N bare
  single-thread processes of the loaders' engine side by side for `--seconds` (no loader; the
  documents read beforehand, the engine called as a worker calls it): what N cores tokenize
  with nothing else to do. Per-worker efficiency ("eff/worker") = shmloader's tokens/s / the
  tokens/s of as many bare processes in the same round (the median of the per-round ratios
  with `--repeat`): side by side in time, so that this machine's slow stretches hit both;
  "busy rate" is each worker's own tokens per second of reading + tokenizing; "CPU
  eff/worker" = tokens per CPU second of the workers (/proc, the same window) / a bare
  process's tokens per second: what a worker reads per second of a core of its own, the
  trainer's and the coordinator's share of the cores (and other processes') left out.
  `--compare DIR` also runs every shmloader throughput row with another checkout's package, interleaved.

- first batch as nanochat pays it (`--first-batch`, or `--first-batch-only`): nanochat builds a
  new validation loader at every evaluation, takes a few batches and drops it. In one fresh
  process (torch imported first) the bench builds `--first-batch-loaders` loaders one after the
  other through the nanochat drop-ins (`shmloader.nanochat`; the tokenizer passed as an object,
  as nanochat does), times each from the call to its first batch, takes
  `--first-batch-take` batches and drops it; "first" is loader 1 (which also starts the
  forkserver), "later" the median and max of loaders 2..N. Per packing (best fit with
  buffer_size 1000, tokenizer_batch_size 128, as nanochat's val loader), next to the
  nanochat-style in-process loaders of `shmloader.demo.baseline` timed the same way.
  `--first-batch-compare DIR` also runs every shmloader row with the shmloader package of
  another checkout (DIR on PYTHONPATH), interleaved, for before/after figures in one run.

- token cache (`--cache-runs`, on by default): shmloader with 1 worker and `cache_dir` set,
  cold (an empty cache: it tokenizes and writes every row group), restart (a fresh loader on
  what the cold run cached: its first epoch) and warm (the cache filled for the whole split
  first, as tools/pretokenize.py does), in the same run. Like every row, their tokens/s count
  from the first batch: what a restart tokenizes before it shows in "first ms" (and in the
  JSON's `worker_tokenized`, tokens the worker tokenized instead of reading the cache).

- corpora (`--corpus`, default demo): every throughput row, bare process and drop-in row is
  measured on each corpus in turn within every round. "demo" is the stdlib corpus of
  `python -m shmloader.demo`; "nanochat" has nanochat's shard geometry (`corpus.nanochat_corpus`:
  1024-document row groups, log-normal lengths averaging ~4.7K characters with a long tail,
  zstd 3, no dictionary); "skewed" has row groups of 1 to ~500 documents and documents from
  empty to 100K characters (`corpus.skewed_corpus`: code, long web pages, one-liners). The two
  built ones go into `--cache-dir` (`<name>_corpus/`, reused while their manifest matches:
  sizes, Python, the generator's code) as `--corpus-files` files; all are read with the demo's
  tokenizer. The first corpus also gets the raw rates, cache rows, system calls and chart.
  Per corpus and loader row: tokens/s, each worker's busy share (its utime + stime from
  /proc/<pid>/stat over the measured window / the window's wall time) and the ratio to as many
  bare engine processes side by side in the same round ("of bare"; a bare process reads the
  split's first epoch, up to 64M characters, so its mix of documents is the loader's).
- next() after busy work: in the trainer-cost child, `--cost-batches` times `--cost-busy-ms` of
  busy CPU (`busy_work`: numpy passes over a 1 MiB buffer and Python bytecode, no sleep), a bare
  `torch.from_numpy(window[:-1]).view(B, T)` timed, the same busy work, then `next()` timed:
  medians of both, side by side (target: next() <= 2x the bare view).
- nanochat drop-ins (`--no-dropin-runs` to skip): `tokenizing_distributed_data_loader_with_state`
  and `..._with_state_bos_bestfit` iterated as nanochat's loop does, `x, y, state = next(loader)`,
  at the most `--workers` the cores hold, each in a fresh process: the training process's CPU per
  batch consuming as fast as it goes for `--seconds`, next() after busy work, next() at a
  trainer's pace (after `--dropin-step-ms` of busy work, the batch ready: target best fit <=
  1.3x concat), and the time and size of the last state as JSON.
- first batch (`--first-batch`) as base_train pays it: a train loader of the same kind is built
  and its first batch taken before the first evaluation (`--first-batch-no-train`: none), each
  val loader stays referenced until the next is built and assigned over it (so dropping it is
  part of the next evaluation's time; `--first-batch-close` closes each at once instead),
  `--first-batch-gap-ms` of training steps between evaluations (`--first-batch-step-ms` of busy
  work and a train batch each; the garbage collector frozen and disabled after the first, as
  base_train does), after which the resident memory of the trainer and all its descendants is
  read (RSS summed and PSS, `tree_memory`); every evaluation's time is compared with nanochat's
  own loader's (the nanochat-style in-process loaders, its train loader too) at the same
  evaluation, per corpus.

Default data: the stdlib demo corpus of `python -m shmloader.demo`, built into `--cache-dir`.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULT_TAG = "BENCH_RESULT "
TARGET_SPEEDUP = 2.5          # x baseline, 2 workers on 2 cores (tokenizing with tiktoken)
TARGET_EFFICIENCY = 0.85      # per worker, of a bare tiktoken thread
TARGET_SPEEDUP_ENGINE = 6.0   # the same with a faster engine (fastokens)
TARGET_EFFICIENCY_ENGINE = 0.80  # per worker, of a bare thread of that engine
TARGET_TRAINER_US = 100.0     # CPU us per batch at B=16, T=2048
TARGET_BT = (16, 2048)
TARGET_FIRST_MS = 400.0       # first loader of a process, call to first batch
TARGET_LATER_MS = 100.0       # every later loader in the same process
TARGET_BUSY_SHARE = 0.90      # each worker's CPU share of the window, on every corpus (issue 21)
TARGET_VS_BARE = 0.85         # the loader's tokens/s / as many bare engine processes', on every corpus
TARGET_DROPIN_RATIO = 1.3     # best-fit drop-in trainer CPU per batch / concat drop-in's (nanochat's loop)
TARGET_AFTER_BUSY = 2.0       # next() after busy work / a bare view after the same busy work
CORPORA = ("demo", "nanochat", "skewed")
CORPUS = "corpus"             # the key naming a measurement's corpus
RAW_CHARS = 64e6              # a bare process's documents: its split's first epoch, up to this many characters
RAW_START_S = 5.0             # the bare processes start together this long after they are launched


# ---------------------------------------------------------------- measurements (child process)

def _cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _bar(desc: str, iterable=None):
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, unit="batch", leave=False, disable=None, mininterval=0.5, file=sys.stderr)


def first_batch_s(make) -> float:
    started = time.perf_counter()
    it = make()
    try:
        next(it)
        return time.perf_counter() - started
    finally:
        it.close()


def throughput(make, seconds: float, window: int, desc: str, bestfit: bool = False,
               first_epoch_only: bool = False) -> dict:
    """Consume as fast as possible for `seconds` after the first batch (a cold cache: only
    while the first epoch lasts, since later epochs hit what the first one wrote)."""
    it = make()
    try:
        next(it)
        if bestfit:  # let the read-ahead and the buffer fill before the window opens
            end = time.perf_counter() + seconds / 4
            while time.perf_counter() < end:
                next(it)
            read0 = it.stats()["tokens_read"]
        workers, coordinator = _worker_pids(it), _coordinator_pid(it)
        n, c0, t0 = 0, _cpu(), time.perf_counter()
        w0, k0 = [_cpu_of([pid]) for pid in workers], _cpu_of(coordinator)
        with _bar(desc) as bar:
            while time.perf_counter() - t0 < seconds:
                next(it)
                if first_epoch_only and it.state_dict()["epoch"] > 1:
                    break
                n += 1
                bar.update()
        each = [_cpu_of([pid]) - c for pid, c in zip(workers, w0)]
        wall, cpu, worker_cpu = time.perf_counter() - t0, _cpu() - c0, sum(each)
        coordinator_cpu = _cpu_of(coordinator) - k0
        read = n * window
        if bestfit:  # tokens read = tokenized by the workers in the window (docs/contract.md §5)
            stats = it.stats()
            read = stats["tokens_read"] - read0
        out = {"batches": n, "wall_s": wall, "tokens_per_s": read / wall,
               "trainer_cpu_us_per_batch": cpu / n * 1e6, "trainer_cpu_s": cpu,
               "worker_cpu_s": worker_cpu if workers else None,
               # each worker's CPU (utime + stime, /proc) over the window / the window's wall time
               "worker_busy_share": [x / wall for x in each] if workers else None,
               "coordinator_cpu_s": coordinator_cpu if coordinator else None}
        if bestfit:
            out.update(cropped_fraction=stats["cropped_fraction"], delivered_tokens_per_s=n * window / wall)
        out.update(_process_peaks(it))
        workers = it.stats().get("workers") if hasattr(it, "stats") else None
        if workers:  # each worker's tokens per second of its own busy (reading + tokenizing) time
            out["worker_busy_tokens_per_s"] = statistics.fmean(w["tokens_per_s"] for w in workers)
            out["worker_tokenized"] = sum(w.get("tokenized", 0) for w in workers)  # not from the cache
        return out
    finally:
        it.close()


def _worker_pids(loader) -> list:
    procs = loader.debug() if hasattr(loader, "debug") else None  # the baseline is a generator
    return [p.pid for p in procs.workers] if procs is not None else []


def _coordinator_pid(loader) -> list:
    procs = loader.debug() if hasattr(loader, "debug") else None
    return [procs.coordinator.pid] if procs is not None else []


def _cpu_of(pids) -> float:
    """User + system CPU seconds of these processes, from /proc."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def busy_work(seconds: float, buf) -> None:
    """Keep this thread on the CPU for `seconds` without a system call, as a training step
    launching kernels does: numpy passes over `buf` (1 MiB: the caches get refilled) and
    Python bytecode, never a sleep."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        buf += 1.0
        sum(range(200))


def trainer_cost(make, n_batches: int, sleep_s: float, desc: str, B: int, T: int, busy_s: float = 0.010) -> dict:
    """CPU time of `next()` alone on ready batches: back to back on a full ring, and with
    the consumer sleeping between calls, next to the floor under the same sleeps: a bare
    `torch.from_numpy(window[:-1]).view(B, T)` of a (B*T+1)-token window. Then the same with
    `busy_s` of busy CPU work (`busy_work`) instead of each sleep, next() and the floor
    alternating, side by side: medians."""
    import numpy as np

    it = make(n_slots=n_batches + 1)
    try:
        next(it)
        if hasattr(it, "stats"):  # wait until every slot holds a ready batch
            deadline = time.monotonic() + 60
            while it.stats().get("ring_ready", 0) < n_batches and time.monotonic() < deadline:
                time.sleep(0.05)
        back_to_back = []
        for _ in range(n_batches):
            c0 = _cpu()
            next(it)
            back_to_back.append(_cpu() - c0)
        probe = np.zeros(B * T + 1, dtype=np.int64)
        buf = np.zeros(1 << 17)
        slept, floor, not_ready = _after_pauses(it, lambda: time.sleep(sleep_s), probe, B, T, n_batches, desc)
        busy, busy_floor, busy_not_ready = _after_pauses(it, lambda: busy_work(busy_s, buf), probe, B, T,
                                                         n_batches, f"{desc} after busy work")
        us = lambda xs: statistics.fmean(xs) * 1e6  # noqa: E731
        med = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
        return {"cost_batches": n_batches, "cost_sleep_ms": sleep_s * 1e3,
                "trainer_cpu_us_per_next": us(back_to_back),
                "trainer_cpu_us_per_next_median": med(back_to_back),
                "trainer_cpu_us_per_next_after_sleep": us(slept),
                "after_sleep_floor_us": us(floor),
                "cost_not_ready": not_ready if hasattr(it, "stats") else None,
                "cost_busy_ms": busy_s * 1e3,
                "next_after_busy_us_median": med(busy), "next_after_busy_us_mean": us(busy),
                "after_busy_floor_us_median": med(busy_floor), "after_busy_floor_us_mean": us(busy_floor),
                "busy_not_ready": busy_not_ready if hasattr(it, "stats") else None}
    finally:
        it.close()


def _after_pauses(it, pause, probe, B: int, T: int, n_batches: int, desc: str) -> tuple:
    """`(next() CPU times, bare-view CPU times, calls that found no batch ready)`: each step
    pauses, times a bare `torch.from_numpy(probe[:-1]).view(B, T)`, pauses again and times
    `next(it)`."""
    import torch

    cost, floor, not_ready = [], [], 0
    for _ in _bar(desc, range(n_batches)):
        pause()
        c0 = _cpu()
        torch.from_numpy(probe[:-1]).view(B, T)
        floor.append(_cpu() - c0)
        pause()
        waited = it.stats()["wait_s"] if hasattr(it, "stats") else None
        c0 = _cpu()
        next(it)
        cost.append(_cpu() - c0)
        if waited is not None and it.stats()["wait_s"] > waited:
            not_ready += 1
    return cost, floor, not_ready


def _process_peaks(loader) -> dict:
    """Peak RSS (VmHWM) of shmloader's worker and coordinator processes, read from /proc."""
    procs = loader.debug() if hasattr(loader, "debug") else None  # the baseline is a generator
    if procs is None:
        return {}
    workers = [_vm_hwm_mib(p.pid) for p in procs.workers]
    coord = _vm_hwm_mib(procs.coordinator.pid)
    workers = [w for w in workers if w is not None]
    return {"worker_peak_rss_mib": max(workers) if workers else None, "coordinator_peak_rss_mib": coord}


def _vm_hwm_mib(pid: int):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(ln.split()[1]) / 1024 for ln in f if ln.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def engine_encoder(tokenizer_path: str, engine: str):
    """The encoder a loader worker uses with `engine` (shmloader.engine, built at once):
    name "fastokens" when it is in use, else "tiktoken"."""
    from shmloader.data import engine as enginemod
    from shmloader.data import tokenizer as tokmod

    return enginemod.build(tokmod.resolve(tokenizer_path), engine)


def in_chunks(encoder):
    """`texts -> tokens` as a worker calls the engine: `encode_batch` on runs of documents of
    about `worker.CHUNK_CHARS` characters (one call per document for engines without a batch call)."""
    from shmloader.procs.worker import CHUNK_CHARS

    def run(texts) -> int:
        n, start, size = 0, 0, 0
        for i, text in enumerate(texts):
            size += len(text)
            if size >= CHUNK_CHARS or i == len(texts) - 1:
                n += len(encoder.encode_batch(texts[start:i + 1])[0])
                start, size = i + 1, 0
        return n
    return run


def raw_child(cfg: dict) -> dict:
    """Bare single-thread tokenizing in a process of its own, from `cfg["start"]` (a shared
    wall-clock time) for `cfg["seconds"]`: one of several run side by side. The engine is called
    as a worker calls it (`in_chunks`), which is at least as fast as one call per document."""
    from shmloader.demo.baseline import documents

    encode = in_chunks(engine_encoder(cfg["tokenizer"], cfg.get("engine", "auto")))
    texts, chars = [], 0  # the split's documents in order, its whole first epoch up to RAW_CHARS
    for _, t in documents(cfg["files"], epochs=1):
        if t is not None:
            texts.append(t)
            chars += len(t)
        if chars >= RAW_CHARS:
            break
    late = time.time() - cfg["start"]
    time.sleep(max(-late, 0))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < cfg["seconds"]:
        n += encode(texts[:100])
        texts = texts[100:] + texts[:100]
    return {"tokens_per_s": n / (time.perf_counter() - t0), "late_s": max(late, 0.0), "docs": len(texts)}


def parallel_raw(cfg: dict, n_procs: int, seconds: float) -> dict:
    """`n_procs` bare tokenizer processes side by side (no loader, no trainer): what the cores
    can really tokenize together, the ceiling for that many workers on this machine."""
    job = json.dumps(dict(cfg, kind="raw", start=time.time() + RAW_START_S, seconds=seconds))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(n_procs)]
    for proc in procs:
        proc.stdin.write(job)
        proc.stdin.close()
    got = []
    for proc in procs:
        lines = [ln for ln in proc.stdout.read().splitlines() if ln.startswith(RESULT_TAG)]
        if proc.wait() != 0 or not lines:
            raise SystemExit("bench: a side-by-side raw tokenizer process failed")
        got.append(json.loads(lines[-1][len(RESULT_TAG):]))
    rates = [g["tokens_per_s"] for g in got]
    return {"processes": n_procs, "seconds": seconds, "tokens_per_s": sum(rates), "per_process": rates,
            "late_s": max(g.get("late_s", 0.0) for g in got), "docs": got[0].get("docs")}


def child_main(cfg: dict) -> dict:
    """One loader configuration, in a fresh process: latency, throughput, trainer cost, RSS."""
    if cfg["kind"] == "raw":
        return raw_child(cfg)
    if cfg["kind"] in ("fb_baseline", "fb_shmloader"):
        return first_batch_child(cfg)
    if cfg["kind"] == "dropin":
        return dropin_child(cfg)
    import resource

    import torch  # noqa: F401  (imported before any timing: docs/contract.md §5)

    from shmloader.loader import ShmLoader

    B, T = cfg["B"], cfg["T"]
    bestfit = cfg.get("packing") == "bos_bestfit"
    window = B * (T + 1) if bestfit else B * T + 1
    if cfg["kind"] == "baseline":
        from shmloader.demo.baseline import nanochat_style_batches  # (not in a --compare checkout's child)

        enc = _load_tiktoken(cfg["tokenizer"])
        bos = _bos(enc)
        make = lambda **_: nanochat_style_batches(cfg["files"], enc, B, T, bos)  # noqa: E731
        label = "baseline"
    else:
        cache = {"cache_dir": cfg["token_cache"]} if cfg.get("token_cache") else {}
        make = lambda **kw: ShmLoader(cfg["data"], cfg["tokenizer"], B, T, cfg["split"],  # noqa: E731
                                      num_workers=cfg["workers"], device="cpu", engine=cfg.get("engine", "auto"),
                                      packing=cfg.get("packing", "concat"), **cache, **kw)
        label = f"shmloader {cfg['workers']}w {cfg.get('packing', 'concat')} {cfg.get('cache') or ''}"
    # a cold-cache run measures throughput only: timing first batches would fill the cache
    firsts = [first_batch_s(make) for _ in range(0 if cfg.get("cache") == "cold" else cfg["first_runs"])]
    out = {"kind": cfg["kind"], "workers": cfg.get("workers"), "packing": cfg.get("packing", "concat"),
           "cache": cfg.get("cache"), "label": cfg.get("label"),
           "first_batch_ms_median": statistics.median(firsts) * 1e3 if firsts else None,
           "first_batch_ms_cold": firsts[0] * 1e3 if firsts else None,
           "first_batch_ms_all": [f * 1e3 for f in firsts]}
    out.update(throughput(make, cfg["seconds"], window, f"{label} throughput", bestfit,
                          first_epoch_only=cfg.get("cache") == "cold"))
    out.update(trainer_cost(make, cfg["cost_batches"], cfg["cost_sleep_ms"] / 1e3, f"{label} trainer cost", B, T,
                            cfg.get("cost_busy_ms", 10.0) / 1e3))
    out["trainer_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def first_batch_series(make, n_loaders: int, take: int, keep: bool = True, gap_s: float = 0.0,
                       train=None, step_s: float = 0.05) -> dict:
    """Build `n_loaders` loaders one after the other (evaluations), each timed from the call to
    its first batch, then `take` batches in all from it. With `keep` (nanochat's base_train:
    `val_loader = build_val_loader()` at every evaluation), the last loader stays referenced
    until the next one is built and assigned over it, so dropping it is inside the next
    evaluation's time; else each is closed at once. After each evaluation, `gap_s` (the
    training steps until the next one), then the resident memory of this process and all its
    descendants (`tree_memory`: the loader's processes, forkserver included).

    With `train` (base_train's pattern): a train loader (`train()`: an iterator) is built and
    its first batch taken before the first evaluation (step 0), and the gap is training
    steps, `step_s` of busy work then a train batch each; after the first step the garbage
    collector is collected, frozen and disabled, as base_train does after its first step."""
    times, memory, gen, trainer, buf = [], [], None, None, None
    try:
        if train is not None:
            import numpy as np

            trainer, buf = train(), np.zeros(1 << 17)
            next(trainer)
        for i in range(n_loaders):
            started = time.perf_counter()
            gen = make()  # the previous loader, still referenced, is dropped here (keep)
            next(gen)
            times.append(time.perf_counter() - started)
            for _ in range(take - 1):
                next(gen)
            if not keep:
                gen.close()
                gen = None
            if trainer is None:
                time.sleep(gap_s)
            else:
                end = time.perf_counter() + gap_s
                while True:
                    busy_work(step_s, buf)
                    next(trainer)
                    if i == 0 and gc.isenabled():  # base_train, after its first step
                        gc.collect()
                        gc.freeze()
                        gc.disable()
                    if time.perf_counter() >= end:
                        break
            memory.append(tree_memory())
    finally:
        for it in (gen, trainer):
            if it is not None:
                it.close()
    later = times[1:]
    return {"loaders": n_loaders, "take": take, "keep": keep, "gap_s": gap_s, "train": train is not None,
            "step_s": step_s, "first_ms": times[0] * 1e3,
            "later_ms_median": statistics.median(later) * 1e3 if later else None,
            "later_ms_max": max(later) * 1e3 if later else None, "all_ms": [t * 1e3 for t in times],
            "memory_between": memory}


def _descendants(root: int) -> list[int]:
    """`root`'s descendant processes, from /proc (parent pids)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _status_kib(pid: int, field: str, path: str = "status"):
    try:
        with open(f"/proc/{pid}/{path}") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith(field + ":"))
    except (OSError, StopIteration, ValueError):
        return None


def tree_memory(root: int | None = None) -> dict:
    """Resident memory of `root` (this process) and all its descendants, in MiB: the sum of
    their RSS (pages shared between them, the ring's included, counted in each) and of their
    PSS (shared pages split between their users, from smaps_rollup), and how many processes."""
    root = os.getpid() if root is None else root
    pids = [root] + _descendants(root)
    rss = [_status_kib(p, "VmRSS") for p in pids]
    pss = [_status_kib(p, "Pss", "smaps_rollup") for p in pids]
    mib = lambda xs: sum(x for x in xs if x is not None) / 1024  # noqa: E731
    return {"processes": sum(r is not None for r in rss), "rss_mib": mib(rss),
            "pss_mib": mib(pss) if None not in pss else None, "trainer_rss_mib": (rss[0] or 0) / 1024}


def _has_option(name: str) -> bool:
    """Whether the shmloader this child imports has loader option `name` (a --compare checkout may not)."""
    import dataclasses

    from shmloader.config import LoaderConfig

    return name in {f.name for f in dataclasses.fields(LoaderConfig)}


def first_batch_child(cfg: dict) -> dict:
    import torch  # noqa: F401  (imported before any timing, as in a training script)

    B, T, split = cfg["B"], cfg["T"], cfg["fb_split"]
    bestfit = cfg["packing"] == "bos_bestfit"
    enc = _load_tiktoken(cfg["tokenizer"])  # nanochat passes its tokenizer object
    if cfg["kind"] == "fb_baseline":
        from shmloader.data import source
        from shmloader.demo.baseline import nanochat_style_batches, nanochat_style_bestfit_batches

        every, bos = source.list_files(cfg["data"]), _bos(enc)

        def loader(split):
            files = source.split_files(every, split)
            if bestfit:
                return nanochat_style_bestfit_batches(files, enc, B, T, bos, buffer_size=1000, tokenizer_batch_size=128)
            return nanochat_style_batches(files, enc, B, T, bos)
    else:
        import shmloader
        from shmloader import nanochat

        opts = dict(device="cpu", data=cfg["data"], num_workers=cfg["workers"], engine=cfg.get("engine", "auto"))
        if cfg.get("fb_idle_release_s") is not None and _has_option("idle_release_s"):  # not in older checkouts
            opts["idle_release_s"] = cfg["fb_idle_release_s"]
        def loader(split):
            if split == "train":  # as base_train: its train loader never idles out, yields states
                train_opts = {k: v for k, v in opts.items() if k != "idle_release_s"}
                if bestfit:
                    return nanochat.tokenizing_distributed_data_loader_with_state_bos_bestfit(
                        enc, B, T, split, buffer_size=1000, tokenizer_batch_size=128, **train_opts)
                return nanochat.tokenizing_distributed_data_loader_with_state(B, T, split, tokenizer=enc,
                                                                              **train_opts)
            if bestfit:
                return nanochat.tokenizing_distributed_data_loader_bos_bestfit(
                    enc, B, T, split, buffer_size=1000, tokenizer_batch_size=128, **opts)
            return nanochat.tokenizing_distributed_data_loader(B, T, split, tokenizer=enc, **opts)
    out = {"kind": cfg["kind"], "packing": cfg["packing"], "workers": cfg.get("workers"),
           "label": cfg.get("label")}
    if cfg["kind"] != "fb_baseline":
        out["shmloader"] = os.path.dirname(os.path.dirname(os.path.abspath(shmloader.__file__)))
    out.update(first_batch_series(lambda: loader(split), cfg["fb_loaders"], cfg["fb_take"],
                                  keep=cfg.get("fb_keep", True), gap_s=cfg.get("fb_gap_ms", 0.0) / 1e3,
                                  train=(lambda: loader("train")) if cfg.get("fb_train", True) else None,
                                  step_s=cfg.get("fb_step_ms", 50.0) / 1e3))
    return out


def dropin_child(cfg: dict) -> dict:
    """A nanochat drop-in with its state (`shmloader.nanochat.tokenizing_distributed_data_loader_with_state`
    or `..._with_state_bos_bestfit`, the tokenizer passed as an object), iterated as nanochat's
    loop does, `x, y, state = next(loader)`: the training process's CPU per batch (getrusage,
    all threads) consuming as fast as it goes for `seconds` (after a quarter of that to fill the
    read-ahead and best fit's buffer); then the CPU of each `next()` after `cost_busy_ms` of busy
    work, as a training step; then at a trainer's pace: the CPU of each `next()` after
    `dropin_step_ms` of busy work, a step longer than the loader takes per batch, so that the
    batch and its state are ready (the calls that still waited are counted); and what turning
    the last state into JSON costs (a checkpoint)."""
    import resource

    import numpy as np
    import torch  # noqa: F401  (imported before any timing, as in a training script)

    from shmloader import nanochat

    B, T = cfg["B"], cfg["T"]
    bestfit = cfg["packing"] == "bos_bestfit"
    enc = _load_tiktoken(cfg["tokenizer"])
    opts = dict(device="cpu", data=cfg["data"], num_workers=cfg["workers"], engine=cfg.get("engine", "auto"))
    if bestfit:
        loader = nanochat.tokenizing_distributed_data_loader_with_state_bos_bestfit(enc, B, T, cfg["split"], **opts)
        name = "tokenizing_distributed_data_loader_with_state_bos_bestfit"
    else:
        loader = nanochat.tokenizing_distributed_data_loader_with_state(B, T, cfg["split"], tokenizer=enc, **opts)
        name = "tokenizing_distributed_data_loader_with_state"
    try:
        x, y, state = next(loader)
        end = time.perf_counter() + cfg["seconds"] / 4
        while time.perf_counter() < end:
            x, y, state = next(loader)
        n, c0, t0 = 0, _cpu(), time.perf_counter()
        with _bar(f"drop-in {cfg['packing']} {cfg['workers']}w"):
            while time.perf_counter() - t0 < cfg["seconds"]:
                x, y, state = next(loader)
                n += 1
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        buf, after_busy = np.zeros(1 << 17), []
        for _ in range(cfg["cost_batches"]):
            busy_work(cfg.get("cost_busy_ms", 10.0) / 1e3, buf)
            c0 = _cpu()
            x, y, state = next(loader)
            after_busy.append(_cpu() - c0)
        # at a trainer's pace: a step long enough that the batch is ready, so that what is timed
        # is what a batch and its state cost, not waiting for the loader
        inner = loader.gi_frame.f_locals.get("loader") if loader.gi_frame is not None else None
        paced, not_ready = [], 0
        for _ in range(cfg["cost_batches"]):
            busy_work(cfg.get("dropin_step_ms", 30.0) / 1e3, buf)
            waited = inner.stats()["wait_s"] if inner is not None else 0.0
            c0 = _cpu()
            x, y, state = next(loader)
            paced.append(_cpu() - c0)
            not_ready += inner is not None and inner.stats()["wait_s"] > waited
        c0 = time.perf_counter()
        saved = json.dumps(state)
        json_s = time.perf_counter() - c0
    finally:
        loader.close()
    return {"kind": "dropin", "function": name, "packing": cfg["packing"], "workers": cfg["workers"],
            "step_ms": cfg.get("dropin_step_ms", 30.0), "paced_us_median": statistics.median(paced) * 1e6,
            "paced_us_mean": statistics.fmean(paced) * 1e6, "paced_not_ready": not_ready if inner is not None else None,
            "batches": n, "wall_s": wall, "delivered_tokens_per_s": n * B * T / wall,
            "trainer_cpu_us_per_batch": cpu / n * 1e6, "cost_batches": cfg["cost_batches"],
            "cost_busy_ms": cfg.get("cost_busy_ms", 10.0),
            "next_after_busy_us_median": statistics.median(after_busy) * 1e6,
            "next_after_busy_us_mean": statistics.fmean(after_busy) * 1e6,
            "state_json_us": json_s * 1e6, "state_json_bytes": len(saved),
            "trainer_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# ---------------------------------------------------------------- main process

def _load_tiktoken(path):
    import pickle

    import tiktoken

    with open(path, "rb") as f:
        tok = pickle.load(f)
    tok = getattr(tok, "enc", tok)  # nanochat's RustBPETokenizer wraps a tiktoken.Encoding
    if not isinstance(tok, tiktoken.Encoding):
        raise SystemExit(f"bench: {path} holds a {type(tok).__name__}; the baseline and the raw rate "
                         f"need a pickled tiktoken.Encoding")
    return tok


def _bos(enc) -> int:
    from shmloader.data.tokenizer import BOS_NAMES

    for name in BOS_NAMES:
        if name in enc.special_tokens_set:
            return enc.encode_single_token(name)
    raise SystemExit(f"bench: tokenizer has none of the BOS tokens {BOS_NAMES}")


def raw_rates(files, enc, seconds: float, rounds: int = 3, engine=None) -> dict:
    """Single-thread rates over the split's documents: tiktoken's, and with `engine` (the
    loaders' encoder when it is not tiktoken) the engine's one document per call and as a
    worker calls it (`in_chunks`, "<name> batch"); the best of `rounds` passes from the first
    document, each capped at `seconds / rounds`, the methods interleaved (best-of damps other
    processes' noise)."""
    from shmloader.demo.baseline import documents

    texts, chars = [], 0
    for _, text in documents(files, epochs=1):
        if text is not None:
            texts.append(text)
            chars += len(text)
        if chars > 64e6:
            break
    out = {"docs": len(texts)}
    methods = {"encode_to_numpy": lambda t: enc.encode_to_numpy(t, disallowed_special=()),
               "encode_ordinary": enc.encode_ordinary}
    chunked = {}
    if engine is not None:
        methods[engine.name] = engine.encode
        if engine.batch is not None:
            chunked[f"{engine.name} batch"] = in_chunks(engine)
    passes = {name: [] for name in [*methods, *chunked]}
    for _ in range(rounds):  # interleaved, so that every method sees the same conditions
        for name, encode in methods.items():
            n_tok, n_doc, t0 = 0, 0, time.perf_counter()
            for text in texts:
                n_tok += len(encode(text))
                n_doc += 1
                if time.perf_counter() - t0 > seconds / rounds:
                    break
            passes[name].append({"tokens_per_s": n_tok / (time.perf_counter() - t0), "tokens": n_tok, "docs": n_doc})
        for name, run in chunked.items():  # 100 documents at a time: the same cap
            n_tok, n_doc, t0 = 0, 0, time.perf_counter()
            while n_doc < len(texts) and time.perf_counter() - t0 <= seconds / rounds:
                n_tok += run(texts[n_doc:n_doc + 100])
                n_doc += len(texts[n_doc:n_doc + 100])
            passes[name].append({"tokens_per_s": n_tok / (time.perf_counter() - t0), "tokens": n_tok, "docs": n_doc})
    for name, got in passes.items():
        out[name] = dict(max(got, key=lambda p: p["tokens_per_s"]), passes=got)
    return out


def engine_rate(raw: dict, engine: str) -> tuple[str, float]:
    """(method, tokens/s): the engine's fastest single-thread way in `raw`, what per-worker
    efficiency is measured against (tiktoken: encode_to_numpy, what a worker calls)."""
    got = [(name, raw[name]["tokens_per_s"]) for name in (engine, f"{engine} batch") if name in raw]
    return max(got, key=lambda x: x[1]) if got else ("encode_to_numpy", raw["encode_to_numpy"]["tokens_per_s"])


def first_batch_runs(cfg: dict, args) -> dict:
    """Per packing: the nanochat-style baseline, then shmloader at each worker count (and the
    `--first-batch-compare` checkout next to it), each a fresh process, `--repeat` rounds in
    turn. A row: the median over rounds of loader 1's time, later loaders pooled."""
    configs = []
    for packing in args.packings:
        configs.append(dict(kind="fb_baseline", packing=packing, label="nanochat-style baseline"))
        for w in args.workers:
            if args.first_batch_compare is not None:
                configs.append(dict(kind="fb_shmloader", packing=packing, workers=w, label="before",
                                    pythonpath=str(args.first_batch_compare)))
            configs.append(dict(kind="fb_shmloader", packing=packing, workers=w,
                                label="this checkout" if args.first_batch_compare is not None else None))
    base = dict(cfg, fb_split=args.first_batch_split, fb_loaders=args.first_batch_loaders,
                fb_take=args.first_batch_take, fb_keep=not args.first_batch_close, fb_gap_ms=args.first_batch_gap_ms,
                fb_idle_release_s=args.first_batch_idle_release, fb_train=not args.first_batch_no_train,
                fb_step_ms=args.first_batch_step_ms)
    rounds = []
    for i in range(args.repeat):
        runs = []
        for c in configs:
            c = dict(c)
            pythonpath = c.pop("pythonpath", None)
            workers = "" if c.get("workers") is None else f", {c['workers']} workers"
            print(f"{f'round {i + 1}/{args.repeat}: ' if args.repeat > 1 else ''}first batch"
                  f"{f' ({cfg[CORPUS]})' if cfg.get(CORPUS) else ''}: {c['label'] or ''} "
                  f"{c['kind'][3:]} {c['packing']}{workers} (fresh process) ...", file=sys.stderr)
            runs.append(run_child(dict(base, **c), pythonpath))
        rounds.append(runs)
    rows = []
    for i in range(len(configs)):
        got = [rnd[i] for rnd in rounds]
        later = [t for r in got for t in r["all_ms"][1:]]
        memory = [m for r in got for m in r.get("memory_between", [])]
        rows.append(dict(got[0], first_ms=statistics.median(r["first_ms"] for r in got),
                         first_ms_rounds=[r["first_ms"] for r in got],
                         later_ms_median=statistics.median(later) if later else None,
                         later_ms_max=max(later) if later else None,
                         all_ms_rounds=[r["all_ms"] for r in got],
                         # evaluation k's time: the median over rounds of the k-th loader's
                         per_evaluation_ms=[statistics.median(ts) for ts in zip(*(r["all_ms"] for r in got))],
                         memory_between_rounds=[r.get("memory_between", []) for r in got],
                         rss_between_mib_median=statistics.median(m["rss_mib"] for m in memory) if memory else None,
                         rss_between_mib_max=max(m["rss_mib"] for m in memory) if memory else None,
                         pss_between_mib_median=statistics.median(m["pss_mib"] for m in memory)
                         if memory and all(m["pss_mib"] is not None for m in memory) else None,
                         processes_between=max(m["processes"] for m in memory) if memory else None))
    base_of = {r["packing"]: r for r in rows if r["kind"] == "fb_baseline"}
    for r in rows:  # side by side with nanochat's own loader at every evaluation
        if r["kind"] == "fb_shmloader" and r["packing"] in base_of:
            r["vs_nanochat_per_evaluation"] = [a / b for a, b in zip(r["per_evaluation_ms"],
                                                                    base_of[r["packing"]]["per_evaluation_ms"])]
    return {"split": args.first_batch_split, "loaders": args.first_batch_loaders, "take": args.first_batch_take,
            "rounds": args.repeat, "keep": not args.first_batch_close, "gap_ms": args.first_batch_gap_ms,
            "idle_release_s": args.first_batch_idle_release, "train": not args.first_batch_no_train,
            "step_ms": args.first_batch_step_ms, "corpus": cfg.get(CORPUS), "rows": rows}


def first_batch_report(fb: dict, c: dict) -> list[str]:
    keep = fb.get("keep")
    pattern = "" if keep is None else (
        f"; each loader stays referenced until the next is built over it (as base_train), "
        f"{fb.get('gap_ms', 0):g} ms between evaluations" if keep else
        f"; each loader closed at once, {fb.get('gap_ms', 0):g} ms between evaluations")
    if fb.get("train"):
        pattern += (f"; base_train's pattern: a train loader of the same kind built and its first batch taken before "
                    f"the first evaluation, the time between evaluations training steps of {fb['step_ms']:g} ms of busy "
                    f"work and a train batch, the garbage collector frozen and disabled after the first step")
    if fb.get("idle_release_s") is not None:
        pattern += f"; shmloader's idle_release_s={fb['idle_release_s']:g}"
    out = ["", f"first batch, as nanochat's val loader (rebuilt at every evaluation)"
               f"{f' on the {fb[CORPUS]} corpus' if fb.get(CORPUS) else ''}: split {fb['split']}, "
               f"B={c['B']}, T={c['T']}; {fb['loaders']} loaders one after the other in one fresh process "
               f"(torch imported first), {fb['take']} batches each; ms from the call to the first batch{pattern}"
               + (f"; {fb['rounds']} rounds, loader 1 the median over rounds, later loaders pooled"
                  if fb["rounds"] > 1 else "")]
    head = ("loader", "packing", "first (loader 1)", "later median", "later max",
            "per evaluation" + (" (median of rounds)" if fb["rounds"] > 1 else ""), "MiB between evals (RSS sum / PSS)")
    rows = []
    for r in fb["rows"]:
        name = "nanochat-style baseline" if r["kind"] == "fb_baseline" else \
            f"shmloader, {r['workers']} worker{'s' * (r['workers'] > 1)}" + (f" ({r['label']})" if r.get("label") else "")
        memory = "-" if r.get("rss_between_mib_median") is None else \
            f"{r['rss_between_mib_median']:,.0f} / {_fmt(r.get('pss_between_mib_median'))} " \
            f"({r['processes_between']} proc{'s' * (r['processes_between'] > 1)})"
        rows.append((name, r["packing"], _fmt(r["first_ms"]), _fmt(r["later_ms_median"]), _fmt(r["later_ms_max"]),
                     " ".join(f"{t:.0f}" for t in r.get("per_evaluation_ms") or r["all_ms_rounds"][0]), memory))
    out.append(_table(head, rows))
    out.append("(MiB between evaluations: this process and all its descendants, the last loader still referenced, "
               "the median over evaluations; RSS summed counts the pages they share in each, PSS splits them)")
    ours = [r for r in fb["rows"] if r["kind"] == "fb_shmloader" and r.get("label") != "before"]
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    for packing in sorted({r["packing"] for r in ours}):
        mine = [r for r in ours if r["packing"] == packing]
        first = max(r["first_ms"] for r in mine)
        median = max(r["later_ms_median"] or 0 for r in mine)
        worst = max(r["later_ms_max"] or 0 for r in mine)
        out.append(f"  {packing}: first loader <= {TARGET_FIRST_MS:.0f} ms: {first:,.0f} ms, "
                   f"{met(first <= TARGET_FIRST_MS)}; every later loader <= {TARGET_LATER_MS:.0f} ms: median "
                   f"{median:,.0f}, max {worst:,.0f} ms, {met(worst <= TARGET_LATER_MS)}")
    out += first_batch_targets(fb)
    return out


def first_batch_targets(fb: dict) -> list[str]:
    """First val batch <= nanochat's own loader's at every evaluation (issue 21), per packing and
    worker count, with the memory left resident between evaluations."""
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    base_of = {r["packing"]: r for r in fb["rows"] if r["kind"] == "fb_baseline"}
    out = []
    for r in fb["rows"]:
        if r["kind"] != "fb_shmloader" or r.get("label") == "before" or not r.get("vs_nanochat_per_evaluation"):
            continue
        ratios, base = r["vs_nanochat_per_evaluation"], base_of[r["packing"]]
        pairs = ", ".join(f"{a:,.0f}/{b:,.0f}" for a, b in zip(r["per_evaluation_ms"], base["per_evaluation_ms"]))
        where = f" ({fb[CORPUS]})" if fb.get(CORPUS) else ""
        memory = "" if r.get("rss_between_mib_median") is None else \
            (f"; between evaluations {r['rss_between_mib_median']:,.0f} MiB RSS summed over "
             f"{r['processes_between']} processes ({_fmt(r.get('pss_between_mib_median'))} PSS) against "
             f"{_fmt(base.get('rss_between_mib_median'))} MiB for nanochat's own loader")
        out.append(f"  {r['packing']}{where}, {r['workers']} worker{'s' * (r['workers'] > 1)}: first val batch "
                   f"<= nanochat's own loader's at every evaluation (ms, ours/theirs: {pairs}): worst "
                   f"{max(ratios):.2f}x, {met(max(ratios) <= 1.0)}{memory}")
    return out


def cache_runs(cfg: dict, data: str, tok: str, compare: Path | None = None) -> list:
    """1 worker with an empty token cache, again on what that run cached, then with the cache
    filled for the whole split. With `compare` (another checkout), each of these rows is also
    run with its shmloader, on a cache of its own, just before this checkout's."""
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pretokenize

    checkouts = ([("before", str(compare))] if compare is not None else []) + \
        [("this checkout" if compare is not None else None, None)]
    out = []
    with tempfile.TemporaryDirectory(prefix="shmloader-bench-cache-") as root:
        dirs = [os.path.join(root, str(i)) for i in range(len(checkouts))]
        for kind, what in (("cold", "cold token cache"), ("restart", "restarted on what the cold run cached"),
                           ("warm", "warm token cache")):
            if kind == "warm":
                for d in dirs:
                    pretokenize.main(["--data", data, "--tokenizer", tok, "--cache-dir", d,
                                      "--split", cfg["split"], "--workers", "2"])
            for (label, pythonpath), d in zip(checkouts, dirs):
                print(f"measuring shmloader with 1 worker, {what}{f' ({label})' if label else ''} "
                      f"(fresh process) ...", file=sys.stderr)
                out.append(run_child(dict(cfg, kind="shmloader", workers=1, packing="concat", cache=kind,
                                          token_cache=d, label=label), pythonpath))
    return out


def run_child(cfg: dict, pythonpath: str | None = None) -> dict:
    """One measurement in a fresh process; `pythonpath` (another checkout) goes first on its path.
    PYTHONSAFEPATH: the loader's workers come from multiprocessing's forkserver, a `python -c`
    that puts the current directory first on its path (3.11 ignores the sys_path it is given),
    so run from a checkout they imported that checkout's shmloader whatever the child did (the
    rows of --first-batch-compare and --cache-compare then timed the same workers). Python 3.10
    has no PYTHONSAFEPATH: compare from a directory that holds no shmloader package."""
    env = dict(os.environ, PYTHONSAFEPATH="1")
    if pythonpath is not None:  # another checkout's shmloader first
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], input=json.dumps(cfg),
                          stdout=subprocess.PIPE, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"bench: the {cfg['kind']} measurement failed (exit code {proc.returncode}); "
                         f"its output:\n{proc.stdout}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def _fmt(x, spec=",.0f", none="-"):
    return none if x is None else format(x, spec)


def _table(head, rows) -> str:
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(str(c).ljust(widths[0]) if i == 0 else str(c).rjust(widths[i])  # noqa: E731
                                for i, c in enumerate(r))
    return "\n".join([line(head), "-" * (sum(widths) + 2 * (len(head) - 1))] + [line(r) for r in rows])


def _name(run) -> str:
    if run["kind"] == "baseline":
        return "nanochat-style baseline"
    mode = ", best fit" if run.get("packing") == "bos_bestfit" else ""
    mode += f", {run['cache']} cache" if run.get("cache") else ""
    mode += f" ({run['label']})" if run.get("label") else ""
    return f"shmloader, {run['workers']} worker{'s' * (run['workers'] > 1)}{mode}"


def efficiency(run: dict) -> float | None:
    """Per-worker efficiency: the loader's tokens/s over what as many bare single-thread engine
    processes read side by side in the same round (`bare_tokens_per_s`); with `--repeat`, the
    median of the per-round ratios. None for rows without that measurement (the baseline,
    cache rows, more workers than cores)."""
    if run.get("efficiency_rounds"):
        return statistics.median(run["efficiency_rounds"])
    if not run.get("bare_tokens_per_s") or run.get("cache"):
        return None
    return run["tokens_per_s"] / run["bare_tokens_per_s"]


def cpu_efficiency(run: dict) -> float | None:
    """Tokens per CPU second of the workers over a bare process's tokens per second (each bare
    process has a core to itself): what a worker reads per second of a core of its own. None
    without a worker CPU count or a bare measurement, and for cache rows, whose workers mostly
    read the cache."""
    if run.get("cpu_efficiency_rounds"):
        return statistics.median(run["cpu_efficiency_rounds"])
    if not run.get("worker_cpu_s") or run.get("cache") or not run.get("bare_tokens_per_s"):
        return None
    return run["tokens_per_s"] * run["wall_s"] / run["worker_cpu_s"] / (run["bare_tokens_per_s"] / run["workers"])


def vs_base(run: dict, base: dict) -> float:
    """The ratio to the baseline: with --repeat, the median of the ratios within each round."""
    rounds = run.get("vs_base_rounds")
    return statistics.median(rounds) if rounds else run["tokens_per_s"] / base["tokens_per_s"]


def median_round(runs: list) -> dict:
    """One configuration's runs over the rounds as one row: the round with the median tokens/s
    (the lower middle one for an even count), with every round's tokens/s attached."""
    pick = sorted(runs, key=lambda r: r["tokens_per_s"])[(len(runs) - 1) // 2]
    return dict(pick, tokens_per_s_rounds=[r["tokens_per_s"] for r in runs])


def median_by(runs: list, key: str) -> dict:
    """One configuration's runs over the rounds as one row: the round with the median `key` (the
    lower middle one for an even count), with every round's `key` attached."""
    pick = sorted(runs, key=lambda r: r[key])[(len(runs) - 1) // 2]
    return dict(pick, **{f"{key}_rounds": [r[key] for r in runs]})


def aggregate(rounds: list) -> list:
    """One row per configuration from `--repeat` rounds (`median_round`), with every round's
    ratio to that round's baseline and, for loaders measured against bare processes, every
    round's efficiencies attached."""
    out = []
    for i in range(len(rounds[0])):
        runs = [rnd[i] for rnd in rounds]
        row = dict(median_round(runs),
                   vs_base_rounds=[r["tokens_per_s"] / rnd[0]["tokens_per_s"] for r, rnd in zip(runs, rounds)])
        for key, of in (("efficiency_rounds", efficiency), ("cpu_efficiency_rounds", cpu_efficiency)):
            got = [of(r) for r in runs]
            if None not in got:
                row[key] = got
        for key in ("worker_busy_share", "next_after_busy_us_median", "after_busy_floor_us_median"):
            if any(r.get(key) is not None for r in runs):
                row[f"{key}_rounds"] = [r.get(key) for r in runs]
        out.append(row)
    return out


def syscall_runs(cfg: dict, args) -> list[dict]:
    """System calls per `next()` in a trainer's rhythm, per packing (tools/syscalls.py)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this script's folder
    import syscalls

    if not syscalls.available():
        return [{"error": "not measured: strace is not installed"}]
    out = []
    for packing in args.packings:
        workers = max(args.workers)
        print(f"counting system calls per next(), {packing}, {workers} workers (strace) ...", file=sys.stderr)
        r = syscalls.trace_next(cfg["data"], cfg["tokenizer"], B=cfg["B"], T=cfg["T"], n=args.syscall_batches,
                                spin_ms=args.syscall_step_ms, num_workers=workers, packing=packing,
                                loader_options={"engine": cfg["engine"]})
        r.pop("calls")
        out.append(dict(r, packing=packing, workers=workers, step_ms=args.syscall_step_ms))
    return out


def report(result: dict) -> str:
    c = result["config"]
    if "runs" not in result:  # --first-batch-only
        out = [f"shmloader bench: cores: {result['cores']} usable, load average at start "
               f"{result['loadavg']}; data: {c['data']}"]
        for fb in _first_batches(result):
            out += first_batch_report(fb, c)
        return "\n".join(out)
    raw, runs = result["raw"], result["runs"]
    base = runs[0]
    engine = result.get("engine", "tiktoken")  # what the loaders and the bare processes tokenize with
    method, rate = engine_rate(raw, engine)
    out = [f"shmloader bench: B={c['B']}, T={c['T']} ({c['B'] * c['T'] + 1:,} tokens read per batch), "
           f"split {c['split']}, {c['seconds']:g} s per throughput measurement",
           f"data: {c['data']} ({len(c['files'])} files), tokenizer: {c['tokenizer']}",
           f"cores: {result['cores']} usable (os.cpu_count() = {os.cpu_count()}), load average at start "
           f"{result['loadavg']}",
           f"raw tiktoken, 1 thread, main process, best of {len(raw['encode_to_numpy']['passes'])} passes over "
           f"{raw['encode_to_numpy']['docs']} documents: "
           f"encode_to_numpy {raw['encode_to_numpy']['tokens_per_s'] / 1e6:.2f} M tokens/s, encode_ordinary "
           f"{raw['encode_ordinary']['tokens_per_s'] / 1e6:.2f} M tokens/s"
           + (f"; the loaders' engine, {engine}: {raw[engine]['tokens_per_s'] / 1e6:.2f} M tokens/s one document "
              f"per call" + (f", {raw[engine + ' batch']['tokens_per_s'] / 1e6:.2f} M as a worker calls it (batch)"
                             if engine + " batch" in raw else "")
              + f" ({rate / raw['encode_to_numpy']['tokens_per_s']:.2f}x encode_to_numpy)" if engine in raw else "")]
    for par in result.get("bare", []):
        rounds = par.get("tokens_per_s_rounds") or []
        out.append(f"bare {engine}: {par['processes']} single-thread process{'es side by side' * (par['processes'] > 1)}"
                   f" (no loader, the engine called as a worker calls it) for {par['seconds']:g} s: "
                   f"{par['tokens_per_s'] / 1e6:.2f} M tokens/s in total"
                   + (f" (rounds: {', '.join(f'{x / 1e6:.2f}' for x in rounds)} M)" if len(rounds) > 1 else "")
                   + f", {par['tokens_per_s'] / (par['processes'] * rate):.0%} of {par['processes']} x the "
                     f"best in-process pass")
    out.append("")
    head = ("loader", "tokens/s", "vs base", "eff/worker", "CPU eff/worker", "busy rate/worker",
            "trainer CPU us/batch", "first ms (median)", "first ms (cold)", "trainer RSS MiB", "worker RSS MiB")
    rows = []
    for r in runs:
        eff, cpu_eff = efficiency(r), cpu_efficiency(r)
        rows.append((_name(r), f"{r['tokens_per_s'] / 1e6:.2f} M",
                     f"{vs_base(r, base):.2f}x",
                     "-" if eff is None else f"{eff:.0%}",
                     "-" if cpu_eff is None else f"{cpu_eff:.0%}",
                     # with a cache, busy time mixes tokenized pieces and (much faster) cache hits
                     "-" if r.get("worker_busy_tokens_per_s") is None or r.get("cache")
                     else f"{r['worker_busy_tokens_per_s'] / 1e6:.2f} M",
                     _fmt(r["trainer_cpu_us_per_batch"]), _fmt(r["first_batch_ms_median"]),
                     _fmt(r["first_batch_ms_cold"]), _fmt(r["trainer_peak_rss_mib"]),
                     _fmt(r.get("worker_peak_rss_mib"))))
    out.append(_table(head, rows))
    out.append(f"(eff/worker: tokens/s / what as many bare single-thread {engine} processes read side by side "
               "in the same round, for as long (workers <= cores; with --repeat the median of the per-round "
               "ratios); CPU eff/worker: tokens per CPU second of the workers (their own, from /proc, over the same "
               "window) / a bare process's tokens per second, what a worker would read with a core of its own, the "
               "trainer's and coordinator's share of the cores left out; busy rate: a worker's tokens per second of "
               "its own reading + tokenizing time)")
    if len(base.get("vs_base_rounds") or []) > 1:
        out.append(f"{len(base['vs_base_rounds'])} rounds, each configuration once per round in turn; a row is "
                   f"the round with its median tokens/s, 'vs base' the median of the per-round ratios:")
        out += [f"  {_name(r)}: " + ", ".join(f"{x:.2f}x" for x in r["vs_base_rounds"])
                for r in runs[1:] if r.get("vs_base_rounds")]
    out += ["", f"trainer cost at B={c['B']}, T={c['T']}, device cpu: CPU time of next() alone on ready "
                f"batches ({c['cost_batches']} calls): back to back on a full ring | after "
                f"{c['cost_sleep_ms']:g} ms sleeps | floor: torch.from_numpy(window[:-1]).view(B, T) after "
                f"the same sleeps"]
    for r in runs:
        ready = "" if r["cost_not_ready"] is None else \
            f"; {r['cost_batches'] - r['cost_not_ready']}/{r['cost_batches']} ready after sleeps"
        out.append(f"  {_name(r)}: {r['trainer_cpu_us_per_next']:,.1f} us (median "
                   f"{r['trainer_cpu_us_per_next_median']:,.1f}) | {r['trainer_cpu_us_per_next_after_sleep']:,.1f} us"
                   f" | floor {r['after_sleep_floor_us']:,.1f} us"
                   f" ({r['trainer_cpu_us_per_next_after_sleep'] / r['after_sleep_floor_us']:.2f}x){ready}")
    for r in result.get("syscalls") or []:
        if "error" in r:
            out.append(f"system calls per next(): {r['error']}")
            continue
        names = ", ".join(f"{n} {k}" for k, n in sorted(r["by_name"].items())) or "none"
        out.append(f"system calls per next(), {r['packing']}, {r['workers']} workers, {r['n']} steps of "
                   f"{r['step_ms']:g} ms busy work then next() (strace on the trainer's main thread): "
                   f"{r['per_next']:.3f} ({names}); {r['not_ready']} of {r['n']} calls found no batch ready")
    out += corpora_report(result)
    out += ["", "targets:"] + _targets(result, rate) + corpora_targets(result)
    for fb in _first_batches(result):
        out += first_batch_report(fb, c)
    return "\n".join(out)


def _first_batches(result: dict) -> list[dict]:
    """The first-batch measurements: one per corpus, or the one of a JSON from before corpora."""
    got = [e["first_batch"] for e in result.get("corpora") or [] if e.get("first_batch")]
    return got or ([result["first_batch"]] if result.get("first_batch") else [])


def _corpus_name(entry: dict) -> str:
    return entry.get(CORPUS) or "data"


def busy_text(shares) -> str:
    return "-" if not shares else " ".join(f"{x:.0%}" for x in shares)


def after_busy_ratio(r: dict) -> float | None:
    """next() after busy work / a bare view after the same busy work (medians; with --repeat the
    median of the per-round ratios), None if not measured."""
    ours, floors = r.get("next_after_busy_us_median_rounds"), r.get("after_busy_floor_us_median_rounds")
    if ours and floors and None not in ours and all(floors):
        return statistics.median(a / b for a, b in zip(ours, floors))
    if r.get("next_after_busy_us_median") is None or not r.get("after_busy_floor_us_median"):
        return None
    return r["next_after_busy_us_median"] / r["after_busy_floor_us_median"]


def corpora_report(result: dict) -> list[str]:
    """Per corpus and loader row: tokens/s, each worker's busy share, the ratio to as many bare
    engine processes in the same round, next() after busy work; then the nanochat drop-in rows."""
    corpora = [e for e in result.get("corpora") or [] if e.get("runs")]
    if not corpora:
        return []
    c = result["config"]
    busy_ms = c.get("cost_busy_ms", 10.0)
    out = ["", f"per corpus, side by side in each round: tokens/s read; each worker's busy share (its CPU time, "
               f"utime + stime from /proc, over the measured window / the window's wall time); the loader's tokens/s "
               f"/ as many bare engine processes' side by side in the same round; next() after {busy_ms:g} ms of busy "
               f"work against a bare view after the same (medians, us)"]
    head = ("corpus", "loader", "tokens/s", "vs base", "of bare", "busy per worker", "next() after busy / bare view")
    rows = []
    for entry in corpora:
        base = entry["runs"][0]
        for r in entry["runs"]:
            eff, ratio = efficiency(r), after_busy_ratio(r)
            rows.append((_corpus_name(entry), _name(r), f"{r['tokens_per_s'] / 1e6:.2f} M", f"{vs_base(r, base):.2f}x",
                         "-" if eff is None else f"{eff:.0%}", busy_text(r.get("worker_busy_share")),
                         "-" if ratio is None else f"{r['next_after_busy_us_median']:,.1f} / "
                         f"{r['after_busy_floor_us_median']:,.1f} ({ratio:.2f}x)"
                         + (f", {r['busy_not_ready']} not ready" if r.get("busy_not_ready") else "")))
    out.append(_table(head, rows))
    bare = [(entry, b) for entry in corpora for b in entry.get("bare") or []]
    if bare:
        out.append("bare engine processes side by side per corpus (M tokens/s in total): " + "; ".join(
            f"{_corpus_name(e)} {b['processes']}: {b['tokens_per_s'] / 1e6:.2f}" for e, b in bare))
    dropins = [(entry, r) for entry in corpora for r in entry.get("dropin") or []]
    if dropins:
        r0 = dropins[0][1]
        out += ["", f"nanochat's loop through the drop-ins (x, y, state = next(loader), the tokenizer an object, "
                    f"device cpu, {r0['workers']} worker{'s' * (r0['workers'] > 1)}): the training process's CPU per "
                    f"batch consuming as fast as it goes | next() after {r0['cost_busy_ms']:g} ms of busy work "
                    f"(median of {r0['cost_batches']}) | at a trainer's pace: next() after "
                    f"{r0.get('step_ms', 30):g} ms of busy work, the batch ready (median; calls that waited) "
                    f"| the last state as JSON"]
        head = ("corpus", "drop-in", "trainer CPU us/batch", "next() after busy us", "trainer's pace us (waited)",
                "state JSON us", "state JSON bytes")
        out.append(_table(head, [(_corpus_name(e), ("best fit" if r["packing"] == "bos_bestfit" else "concat")
                                  + (f" ({r['label']})" if r.get("label") else ""),
                                  f"{r['trainer_cpu_us_per_batch']:,.0f}", f"{r['next_after_busy_us_median']:,.1f}",
                                  "-" if r.get("paced_us_median") is None else
                                  f"{r['paced_us_median']:,.1f} ({_fmt(r.get('paced_not_ready'))})",
                                  f"{r['state_json_us']:,.0f}", f"{r['state_json_bytes']:,}") for e, r in dropins]))
    return out


def corpora_targets(result: dict) -> list[str]:
    """Issue 21's targets over every corpus: each worker busy, the loader against bare processes,
    the best-fit drop-in against concat's, next() after busy work against a bare view."""
    corpora = [e for e in result.get("corpora") or [] if e.get("runs")]
    if not corpora:
        return []
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    ours = lambda r: r["kind"] == "shmloader" and r.get("label") != "before" and not r.get("cache")  # noqa: E731
    lines = []
    names = ", ".join(_corpus_name(e) for e in corpora)
    counts = sorted({r["workers"] for e in corpora for r in e["runs"] if ours(r) and r["workers"] <= result["cores"]})
    for packing in ("concat", "bos_bestfit"):
        mode = "concat" if packing == "concat" else "best fit"
        context = "" if packing == "concat" else "(context) "
        for w in counts:
            rows = [(e, r) for e in corpora for r in e["runs"]
                    if ours(r) and r["workers"] == w and r.get("packing", "concat") == packing]
            busy = [(e, r["worker_busy_share"]) for e, r in rows if r.get("worker_busy_share")]
            if busy:
                worst = min(min(b) for _, b in busy)
                lines.append(f"  {context}each worker busy >= {TARGET_BUSY_SHARE:.0%} on every corpus ({names}), "
                             f"{w} worker{'s' * (w > 1)}, {mode}: "
                             + "; ".join(f"{_corpus_name(e)} {busy_text(b)}" for e, b in busy)
                             + f"; worst {worst:.0%}, {met(worst >= TARGET_BUSY_SHARE)}")
            effs = [(e, efficiency(r)) for e, r in rows if efficiency(r) is not None]
            if effs:
                worst = min(x for _, x in effs)
                lines.append(f"  {context}loader >= {TARGET_VS_BARE:.0%} of {w} bare engine process"
                             f"{'es side by side' * (w > 1)} in the same round on every corpus, {mode}: "
                             + ", ".join(f"{_corpus_name(e)} {x:.0%}" for e, x in effs)
                             + f"; worst (the headline) {worst:.0%}, {met(worst >= TARGET_VS_BARE)}")
    pairs = []
    for e in corpora:
        got = {r["packing"]: r for r in e.get("dropin") or [] if r.get("label") != "before"}
        if {"concat", "bos_bestfit"} <= set(got):
            pairs.append((e, got["bos_bestfit"], got["concat"]))
    paced = [(e, f, c) for e, f, c in pairs if f.get("paced_us_median") and c.get("paced_us_median")]
    if paced:
        ratios = [f["paced_us_median"] / c["paced_us_median"] for _, f, c in paced]
        waited = sum((f.get("paced_not_ready") or 0) + (c.get("paced_not_ready") or 0) for _, f, c in paced)
        calls = sum(f["cost_batches"] + c["cost_batches"] for _, f, c in paced)
        lines.append(f"  best-fit drop-in trainer CPU per batch <= {TARGET_DROPIN_RATIO:g}x the concat drop-in's, "
                     f"at a trainer's pace (nanochat's loop, {paced[0][2]['workers']} workers, "
                     f"{paced[0][2].get('step_ms', 30):g} ms steps, medians in us; {waited} of {calls} calls waited): "
                     + ", ".join(f"{_corpus_name(e)} {f['paced_us_median']:,.0f}/{c['paced_us_median']:,.0f} = {x:.2f}x"
                                 for (e, f, c), x in zip(paced, ratios))
                     + f"; worst {max(ratios):.2f}x, {met(max(ratios) <= TARGET_DROPIN_RATIO)}")
    if pairs:
        ratios = [f["trainer_cpu_us_per_batch"] / c["trainer_cpu_us_per_batch"] for _, f, c in pairs]
        lines.append(f"  best-fit drop-in trainer CPU per batch <= {TARGET_DROPIN_RATIO:g}x the concat drop-in's, "
                     f"consuming as fast as it goes (nanochat's loop, {pairs[0][2]['workers']} workers; us; best fit "
                     f"delivers fewer tokens per token read, so it waits more often): "
                     + ", ".join(f"{_corpus_name(e)} {f['trainer_cpu_us_per_batch']:,.0f}/"
                                 f"{c['trainer_cpu_us_per_batch']:,.0f} = {x:.2f}x"
                                 for (e, f, c), x in zip(pairs, ratios))
                     + f"; worst {max(ratios):.2f}x, {met(max(ratios) <= TARGET_DROPIN_RATIO)}")
    busy = [(e, r, after_busy_ratio(r)) for e in corpora for r in e["runs"] if ours(r) and after_busy_ratio(r)]
    if busy:
        worst = max(x for _, _, x in busy)
        short = lambda r: f"{r['workers']}w {'bf' if r.get('packing') == 'bos_bestfit' else 'concat'}"  # noqa: E731
        lines.append(f"  next() after {busy[0][1]['cost_busy_ms']:g} ms of busy work <= {TARGET_AFTER_BUSY:g}x a bare "
                     f"torch.from_numpy(...).view(B, T) after the same busy work (medians, side by side): "
                     + ", ".join(f"{_corpus_name(e)} {short(r)} {x:.2f}x" for e, r, x in busy)
                     + f"; worst {worst:.2f}x, {met(worst <= TARGET_AFTER_BUSY)}")
    return lines


def _targets(result: dict, rate: float) -> list[str]:
    c, runs = result["config"], result["runs"]
    base = runs[0]
    shm = [r for r in runs[1:] if r.get("packing", "concat") == "concat" and not r.get("cache")
           and r.get("label") != "before"]
    cached = {r["cache"]: r for r in runs[1:] if r.get("cache")}
    fit = {r["workers"]: r for r in runs[1:] if r.get("packing") == "bos_bestfit" and r.get("label") != "before"}
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    fast = result.get("engine", "tiktoken") != "tiktoken"
    speedup = TARGET_SPEEDUP_ENGINE if fast else TARGET_SPEEDUP
    target_eff = TARGET_EFFICIENCY_ENGINE if fast else TARGET_EFFICIENCY
    lines = []
    if {"cold", "warm"} <= set(cached):
        x = cached["warm"]["tokens_per_s"] / cached["cold"]["tokens_per_s"]
        cost = cached["warm"]["trainer_cpu_us_per_next"] / max(cached["cold"]["trainer_cpu_us_per_next"], 1e-9)
        lines.append(f"  warm token cache >= 20x cold, 1 worker: {x:.1f}x, {met(x >= 20)}; trainer cost per "
                     f"next() warm/cold {cost:.2f}")
        x = vs_base(cached["warm"], base)
        lines.append(f"  warm token cache >= 40x the baseline, 1 worker: {x:.1f}x, {met(x >= 40)}")
    pairs = [(r["workers"], fit[r["workers"]]["tokens_per_s"] / r["tokens_per_s"]) for r in shm if r["workers"] in fit]
    if pairs:
        text = ", ".join(f"{w} worker{'s' * (w > 1)} {x:.0%}" for w, x in pairs)
        lines.append(f"  best fit within 10% of concat (tokens read) at the same worker count: {text}, "
                     f"{met(all(x >= 0.9 for _, x in pairs))}")
    two = [r for r in shm if r["workers"] == 2]
    if two:
        x = vs_base(two[0], base)
        note = "" if result["cores"] == 2 else f" (this machine has {result['cores']} cores, not 2)"
        lines.append(f"  >= {speedup}x baseline with 2 workers on 2 cores: {x:.2f}x, "
                     f"{met(x >= speedup)}{note}")
    else:
        lines.append(f"  >= {speedup}x baseline with 2 workers on 2 cores: not measured (add 2 to --workers)")
    if result.get("bare"):  # the most processes side by side: what these cores tokenize together
        par = max(result["bare"], key=lambda r: r["processes"])
        lines.append(f"  (context) {par['processes']} bare engine process{'es side by side' * (par['processes'] > 1)} "
                     f"read {par['tokens_per_s'] / base['tokens_per_s']:.2f}x the baseline in this run")
    effs = [(r["workers"], efficiency(r)) for r in shm if efficiency(r) is not None]
    if effs:
        text = ", ".join(f"{w} worker{'s' * (w > 1)} {e:.0%}" for w, e in effs)
        lines.append(f"  >= {target_eff:.0%} per-worker efficiency, of as many bare single-thread engine processes "
                     f"side by side (workers <= cores): {text}, {met(all(e >= target_eff for _, e in effs))}")
    cpu = [(r["workers"], cpu_efficiency(r)) for r in shm if cpu_efficiency(r) is not None]
    if cpu:
        text = ", ".join(f"{w} worker{'s' * (w > 1)} {e:.0%}" for w, e in cpu)
        lines.append(f"  (context) per worker CPU second, of a bare process's second: {text}")
    for r in shm:
        if r.get("coordinator_cpu_s") is not None and r["workers"] <= result["cores"]:
            share = lambda x: x / (r["wall_s"] * result["cores"])  # noqa: E731  (of all the cores)
            lines.append(f"  (context) where the {result['cores']} cores went with {r['workers']} worker"
                         f"{'s' * (r['workers'] > 1)}: workers {share(r['worker_cpu_s']):.0%}, coordinator "
                         f"{share(r['coordinator_cpu_s']):.0%}, training process {share(r['trainer_cpu_s']):.0%}, "
                         f"the rest (idle, kernel, other processes) "
                         f"{1 - share(r['worker_cpu_s'] + r['coordinator_cpu_s'] + r['trainer_cpu_s']):.0%}")
    best = [(r["workers"], r["tokens_per_s"] / (r["workers"] * rate)) for r in shm if r["workers"] <= result["cores"]]
    if best:
        text = ", ".join(f"{w} worker{'s' * (w > 1)} {e:.0%}" for w, e in best)
        lines.append(f"  (context) per worker, of the engine's best in-process pass ({rate / 1e6:.2f} M): {text}")
    calls = [r for r in result.get("syscalls") or [] if "per_next" in r]
    if calls:
        text = ", ".join(f"{r['packing']} {r['per_next']:.3f}" for r in calls)
        lines.append(f"  <= 0.1 system calls per next() with ready batches (amortised, strace): {text}, "
                     f"{met(all(r['per_next'] <= 0.1 for r in calls))}")
    slept = [(r, r["trainer_cpu_us_per_next_after_sleep"] / r["after_sleep_floor_us"]) for r in shm]
    if slept:
        text = ", ".join(f"{r['workers']}w {x:.2f}x" for r, x in slept)
        lines.append(f"  next() CPU within 2x of a bare torch.from_numpy(...).view(B, T) after the same "
                     f"{c['cost_sleep_ms']:g} ms pause: {text}, {met(all(x <= 2 for _, x in slept))}")
    worst = max(r["trainer_cpu_us_per_next"] for r in shm) if shm else None
    if worst is not None:
        at = "" if (c["B"], c["T"]) == TARGET_BT else \
            f" (measured at B={c['B']}, T={c['T']}; the target is defined at B=16, T=2048)"
        lines.append(f"  < {TARGET_TRAINER_US:.0f} us trainer CPU per next() at B=16, T=2048 (ready, back to back): "
                     f"worst {worst:,.1f} us, {met(worst < TARGET_TRAINER_US)}{at}")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python tools/bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], metavar="N",
                   help="shmloader worker counts to measure (processes; default 1 2)")
    p.add_argument("--batch-size", type=int, default=16, help="B, rows per batch (rows; default 16)")
    p.add_argument("--seq-len", type=int, default=2048, help="T, tokens per row (tokens; default 2048)")
    p.add_argument("--split", choices=("train", "val"), default="train", help="split to read (default train)")
    p.add_argument("--engine", choices=("auto", "tiktoken", "fastokens"), default="auto",
                   help="the loaders' tokenizer engine (engine=), also used by the bare-process ceiling "
                        "(default auto: fastokens when installed)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds: every configuration once per round, in turn, so that a slow stretch of "
                        "a noisy machine hits each of them; rows are medians (default 1)")
    p.add_argument("--seconds", type=float, default=None,
                   help="wall time of each throughput measurement (seconds; default 10, 3 with --quick)")
    p.add_argument("--first-runs", type=int, default=3,
                   help="fresh loaders timed for the first-batch latency (loaders; default 3)")
    p.add_argument("--cost-batches", type=int, default=None,
                   help="batches in the trainer-cost measurement (batches; default 100, 40 with --quick)")
    p.add_argument("--cost-sleep-ms", type=float, default=20.0,
                   help="consumer sleep between next() calls in the trainer-cost measurement (ms; default 20)")
    p.add_argument("--cost-busy-ms", type=float, default=10.0,
                   help="busy CPU work (a numpy and Python spin, no sleep) before each next() and each bare "
                        "view in the after-busy-work measurement, and before each drop-in next() (ms; default 10)")
    p.add_argument("--dropin-step-ms", type=float, default=30.0,
                   help="busy work per training step for the drop-ins' at-a-trainer's-pace figure: longer than the "
                        "loader takes per batch, so that the batch is ready (ms; default 30)")
    p.add_argument("--no-dropin-runs", dest="dropin_runs", action="store_false",
                   help="skip the nanochat drop-in rows (x, y, state = next(loader) with each packing)")
    p.add_argument("--syscall-batches", type=int, default=200,
                   help="steps in the system-call count (0: skip it; needs strace; default 200)")
    p.add_argument("--syscall-step-ms", type=float, default=10.0,
                   help="busy work per step before each next() in the system-call count (ms; default 10)")
    p.add_argument("--data", default=None,
                   help="directory (or glob) of parquet shards (default: build the stdlib demo corpus in --cache-dir)")
    p.add_argument("--tokenizer", default=None,
                   help="pickled tiktoken tokenizer.pkl or its directory (default: the demo tokenizer "
                        "without --data, else $NANOCHAT_BASE_DIR/tokenizer)")
    p.add_argument("--corpus", nargs="+", choices=CORPORA, default=None, metavar="NAME",
                   help="corpora to measure, each built offline into --cache-dir (and reused): demo (the stdlib "
                        "demo corpus), nanochat (nanochat's shard geometry), skewed (skewed row groups and "
                        "documents); the first also gets the raw rates, cache, system-call and chart rows "
                        f"(choices: {', '.join(CORPORA)}; default demo)")
    p.add_argument("--corpus-files", type=int, default=4,
                   help="files of the nanochat and skewed corpora, the last one the val split (files; default 4)")
    p.add_argument("--nanochat-docs", type=int, default=12288,
                   help="documents of the nanochat corpus (documents; default 12288: 12 row groups of 1024)")
    p.add_argument("--skewed-docs", type=int, default=6000,
                   help="documents of the skewed corpus (documents; default 6000, ~75 row groups)")
    p.add_argument("--cache-dir", type=Path, default=Path("demo_data"),
                   help="where the corpora are built and cached (directory; default ./demo_data)")
    p.add_argument("--vocab-size", type=int, default=4096,
                   help="demo tokenizer size when it is built (tokens; default 4096)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the results to this JSON file")
    p.add_argument("--packings", nargs="+", choices=("concat", "bos_bestfit"), default=["concat", "bos_bestfit"],
                   help="packings to measure shmloader with (default: both; best fit counts tokens read, "
                        "cropped ones included, docs/contract.md §5)")
    p.add_argument("--no-cache-runs", dest="cache_runs", action="store_false",
                   help="skip the token-cache runs (1 worker, cold and warm cache)")
    p.add_argument("--chart", type=Path, default=None, metavar="PNG",
                   help="also draw tokens/s against worker count (shmloader vs baseline) into this PNG")
    p.add_argument("--from-json", type=Path, default=None, metavar="JSON",
                   help="measure nothing: redraw --chart (and reprint the report) from an earlier --json")
    p.add_argument("--first-batch", action="store_true",
                   help="also measure first-batch latency as nanochat pays it (a new val loader per evaluation)")
    p.add_argument("--first-batch-only", action="store_true",
                   help="measure only the first-batch latency (no raw rates, throughput or cache runs)")
    p.add_argument("--first-batch-loaders", type=int, default=8,
                   help="loaders built one after the other per process (loaders; default 8)")
    p.add_argument("--first-batch-take", type=int, default=4,
                   help="batches taken from each before it is dropped (batches; default 4)")
    p.add_argument("--first-batch-split", choices=("train", "val"), default="val",
                   help="split of the first-batch loaders (default val, as nanochat's evaluation)")
    p.add_argument("--first-batch-gap-ms", type=float, default=500.0,
                   help="time between evaluations, after which the resident memory is read (ms; default 500)")
    p.add_argument("--first-batch-idle-release", type=float, default=None, metavar="S",
                   help="the loaders' idle_release_s (s; default: the loader's own, 30 for val): with a gap longer than "
                        "it, memory between evaluations is read after the idle loader has let its processes go")
    p.add_argument("--first-batch-no-train", action="store_true",
                   help="evaluations without a train loader (the default is base_train's: a train loader built and "
                        "its first batch taken before the first evaluation, training steps between evaluations)")
    p.add_argument("--first-batch-step-ms", type=float, default=50.0,
                   help="busy work per training step between evaluations, with a train loader (ms; default 50)")
    p.add_argument("--first-batch-close", action="store_true",
                   help="close each first-batch loader at once (default: keep it referenced until the next "
                        "one is built over it, as nanochat's base_train does)")
    p.add_argument("--first-batch-compare", type=Path, default=None, metavar="DIR",
                   help="also run the shmloader rows with the shmloader package under DIR (another checkout), "
                        "interleaved, for before/after figures in one run")
    p.add_argument("--compare", type=Path, default=None, metavar="DIR",
                   help="also run the shmloader throughput rows with the shmloader package under DIR (another "
                        "checkout), interleaved, for before/after figures (tokens/s, efficiency) in one run")
    p.add_argument("--cache-compare", type=Path, default=None, metavar="DIR",
                   help="also run the token-cache rows with the shmloader package under DIR (another "
                        "checkout), interleaved, for before/after figures in one run")
    p.add_argument("--quick", action="store_true", help="a short run: 3 s per measurement, 40 trainer-cost batches")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # config on stdin
    args = p.parse_args(argv)
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 10.0
    if args.cost_batches is None:
        args.cost_batches = 40 if args.quick else 100
    if min(args.workers) < 1 or min(args.batch_size, args.seq_len, args.first_runs, args.repeat) < 1:
        p.error("--workers, --batch-size, --seq-len, --first-runs and --repeat must be >= 1")
    if args.first_batch_loaders < 1 or args.first_batch_take < 1:
        p.error("--first-batch-loaders and --first-batch-take must be >= 1")
    if args.first_batch_compare is not None:
        args.first_batch_compare = args.first_batch_compare.resolve()
        if not (args.first_batch_compare / "shmloader" / "__init__.py").is_file():
            p.error(f"--first-batch-compare {args.first_batch_compare}: no shmloader package there")
    if args.compare is not None:
        args.compare = args.compare.resolve()
        if not (args.compare / "shmloader" / "__init__.py").is_file():
            p.error(f"--compare {args.compare}: no shmloader package there")
    if args.cache_compare is not None:
        args.cache_compare = args.cache_compare.resolve()
        if not (args.cache_compare / "shmloader" / "__init__.py").is_file():
            p.error(f"--cache-compare {args.cache_compare}: no shmloader package there")
    if args.seconds <= 0 or args.cost_batches < 1:
        p.error("--seconds must be > 0 and --cost-batches >= 1")
    if args.cost_busy_ms < 0 or args.first_batch_gap_ms < 0:
        p.error("--cost-busy-ms and --first-batch-gap-ms must be >= 0")
    if args.corpus_files < 2 or min(args.nanochat_docs, args.skewed_docs) < 1:
        p.error("--corpus-files must be >= 2 (a train and a val file) and --nanochat-docs, --skewed-docs >= 1")
    if args.data is not None and args.corpus is not None:
        p.error("--data measures that one directory: drop --corpus, or drop --data to build the corpora")
    if args.corpus is None:
        args.corpus = [] if args.data is not None else ["demo"]
    args.corpus = list(dict.fromkeys(args.corpus))  # each once, in the order given
    return args


def _resolve_data(args) -> tuple[str, str]:
    if args.data is None:
        from shmloader.demo import prepare_data

        try:
            demo = prepare_data(args.cache_dir, args.vocab_size, log=lambda m: print(m, file=sys.stderr))
        except ValueError as exc:
            raise SystemExit(f"bench: error: {exc}") from None
        return str(demo.data_dir), args.tokenizer or str(demo.tokenizer_path)
    from shmloader.data import tokenizer as tokmod

    tok = args.tokenizer or tokmod.default_path()
    if os.path.isdir(tok):
        tok = os.path.join(tok, "tokenizer.pkl")
    return args.data, tok


def resolve_corpora(args) -> list[tuple[str | None, str, str]]:
    """`(name, data, tokenizer)` per corpus to measure: `--data` alone (name None), else each
    `--corpus`, built offline into `--cache-dir` or reused, all read with one tokenizer (the demo's,
    trained on the stdlib text the corpora are made of, unless `--tokenizer`)."""
    if args.data is not None:
        return [(None, *_resolve_data(args))]
    demo_data, tok = _resolve_data(args)  # the demo corpus and its tokenizer, built or reused
    out = []
    for name in args.corpus:
        if name == "demo":
            out.append((name, demo_data, tok))
            continue
        n_docs = args.nanochat_docs if name == "nanochat" else args.skewed_docs
        try:
            data = prepare_corpus(name, args.cache_dir, n_docs, args.corpus_files,
                                  log=lambda m: print(m, file=sys.stderr))
        except ValueError as exc:
            raise SystemExit(f"bench: error: {exc}") from None
        out.append((name, str(data), tok))
    return out


def prepare_corpus(name: str, cache_dir: Path, n_docs: int, num_files: int, seed: int = 0, log=print) -> Path:
    """Write (or reuse) the `name` corpus ("nanochat": `corpus.nanochat_corpus`, "skewed":
    `corpus.skewed_corpus`) as `num_files` shards in `cache_dir/<name>_corpus/base_data`; return
    that directory. Reused when its manifest records the same corpus, sizes, Python and generator
    code (a hash of shmloader/demo/corpus.py); a directory holding shards it did not write is refused."""
    import hashlib
    import sysconfig

    from shmloader.demo import corpus

    root = Path(cache_dir) / f"{name}_corpus"
    data_dir, manifest_path = root / "base_data", root / "corpus.json"
    key = {"corpus": name, "n_docs": n_docs, "num_files": num_files, "seed": seed, "python": sys.version,
           "stdlib": sysconfig.get_paths()["stdlib"], "format": corpus.SHARD_FORMAT,
           "generator": hashlib.sha256(Path(corpus.__file__).read_bytes()).hexdigest()[:16]}
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    if manifest.get("key") == key and len(list(data_dir.glob("*.parquet"))) == num_files:
        return data_dir
    if manifest.get("owner") != "tools/bench.py" and any(data_dir.glob("*.parquet")):
        raise ValueError(f"{data_dir} holds parquet shards that tools/bench.py did not write (no {manifest_path.name} "
                         f"of ours): pick another --cache-dir")
    started = time.perf_counter()
    make = corpus.nanochat_corpus if name == "nanochat" else corpus.skewed_corpus
    docs, sizes = make(n_docs, seed)
    if len(sizes) < num_files:
        raise ValueError(f"the {name} corpus of {n_docs} documents has {len(sizes)} row groups, fewer than "
                         f"--corpus-files {num_files}: pass more documents")
    root.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps({"owner": "tools/bench.py"}) + "\n")  # ours, even if interrupted
    for old in data_dir.glob("*.parquet"):
        old.unlink()
    log(f"writing the {name} corpus: {len(docs):,} documents ({sum(map(len, docs)) / 1e6:.1f} M characters), "
        f"{len(sizes)} row groups of {min(sizes)}-{max(sizes)} documents, as {num_files} parquet files into "
        f"{data_dir} ...")
    corpus.write_shards(docs, data_dir, num_files=num_files, row_group_sizes=sizes)
    manifest_path.write_text(json.dumps({"owner": "tools/bench.py", "key": key, "n_docs": len(docs),
                                         "row_groups": len(sizes), "chars": sum(map(len, docs))}, indent=2) + "\n")
    log(f"{name} corpus ready in {time.perf_counter() - started:.1f} s (cached for the next run)")
    return data_dir


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(RESULT_TAG + json.dumps(child_main(json.loads(sys.stdin.read()))), flush=True)
        return 0
    if args.from_json is not None:
        result = json.loads(args.from_json.read_text())
        print(report(result))
        if args.chart is not None:
            draw_chart(result, args.chart)
        return 0
    from shmloader.data import source

    common = {"B": args.batch_size, "T": args.seq_len, "split": args.split, "seconds": args.seconds,
              "first_runs": args.first_runs, "cost_batches": args.cost_batches, "cost_sleep_ms": args.cost_sleep_ms,
              "cost_busy_ms": args.cost_busy_ms, "dropin_step_ms": args.dropin_step_ms, "engine": args.engine}
    cfgs = [dict(common, data=data, tokenizer=tok, files=source.split_files(source.list_files(data), args.split),
                 **{CORPUS: name}) for name, data, tok in resolve_corpora(args)]
    cfg, data, tok = cfgs[0], cfgs[0]["data"], cfgs[0]["tokenizer"]  # the first corpus: every other row too
    result = {"config": cfg, "cores": len(os.sched_getaffinity(0)),
              "loadavg": " ".join(open("/proc/loadavg").read().split()[:3]),
              "corpora": [{CORPUS: c[CORPUS], "data": c["data"], "files": c["files"]} for c in cfgs]}
    if args.first_batch_only:
        for c, entry in zip(cfgs, result["corpora"]):
            entry["first_batch"] = first_batch_runs(c, args)
        result["first_batch"] = result["corpora"][0]["first_batch"]
        _write_json(args, result)
        print(report(result))
        return 0
    print(f"measuring single-thread tokenizing on {len(cfg['files'])} files ...", file=sys.stderr)
    encoder = engine_encoder(tok, args.engine)
    result["engine"] = encoder.name
    result["raw"] = raw_rates(cfg["files"], _load_tiktoken(tok), min(args.seconds, 5.0),
                              engine=None if encoder.name == "tiktoken" else encoder)
    compare = [("before", str(args.compare))] if args.compare is not None else []
    ours = [("this checkout" if compare else None, None)]
    configs = [("baseline", None, "concat", None, None)]
    for w in args.workers:  # the bare processes just before the loaders of their count
        if w <= result["cores"]:
            configs.append(("bare", w, None, None, None))
        configs += [("shmloader", w, p, label, path) for p in args.packings for label, path in compare + ours]
    if args.dropin_runs:  # nanochat's loop, at the most workers the cores hold
        w = max([w for w in args.workers if w <= result["cores"]] or args.workers)
        configs += [("dropin", w, p, label, path) for p in ("concat", "bos_bestfit") for label, path in compare + ours]
    rounds = {i: [] for i in range(len(cfgs))}      # per corpus: each round's loader rows
    bare_rounds = {i: [] for i in range(len(cfgs))}
    dropin_rounds = {i: [] for i in range(len(cfgs))}
    for i in range(args.repeat):
        step = f"round {i + 1}/{args.repeat}: " if args.repeat > 1 else ""
        for k, ccfg in enumerate(cfgs):
            where = f" ({ccfg[CORPUS]} corpus)" if len(cfgs) > 1 else ""
            runs = []
            for kind, workers, packing, label, path in configs:
                if kind == "bare":
                    print(f"{step}measuring {workers} bare tokenizer process{'es side by side' * (workers > 1)}"
                          f"{where} ...", file=sys.stderr)
                    runs.append(dict(parallel_raw(ccfg, workers, args.seconds), kind="bare", workers=workers))
                    continue
                what = "the nanochat drop-in" if kind == "dropin" else kind
                print(f"{step}measuring {what}{'' if workers is None else f' with {workers} workers, {packing}'}"
                      f"{f' ({label})' if label else ''}{where} (fresh process) ...", file=sys.stderr)
                runs.append(dict(run_child(dict(ccfg, kind=kind, workers=workers, packing=packing, label=label),
                                           path), label=label, **{CORPUS: ccfg[CORPUS]}))
            bare = {r["workers"]: r["tokens_per_s"] for r in runs if r["kind"] == "bare"}
            for r in runs:  # each loader's ceiling: as many bare processes, measured in the same round
                if r["kind"] == "shmloader":
                    r["bare_tokens_per_s"] = bare.get(r["workers"])
            rounds[k].append([r for r in runs if r["kind"] in ("baseline", "shmloader")])
            bare_rounds[k].append([r for r in runs if r["kind"] == "bare"])
            dropin_rounds[k].append([r for r in runs if r["kind"] == "dropin"])
    for k, entry in enumerate(result["corpora"]):
        entry["runs"] = aggregate(rounds[k]) if args.repeat > 1 else rounds[k][0]
        entry["bare_rounds"] = bare_rounds[k]
        entry["bare"] = [median_round(list(got)) for got in zip(*bare_rounds[k])]  # per count
        entry["dropin"] = [median_by(list(got), "trainer_cpu_us_per_batch") for got in zip(*dropin_rounds[k])]
    runs = list(result["corpora"][0]["runs"])
    result["bare_rounds"], result["bare"] = result["corpora"][0]["bare_rounds"], result["corpora"][0]["bare"]
    if args.cache_runs:
        runs += cache_runs(cfg, data, tok, args.cache_compare)
    result["runs"], result["rounds"] = runs, args.repeat
    if args.syscall_batches > 0:
        result["syscalls"] = syscall_runs(cfg, args)
    if args.first_batch:
        for c, entry in zip(cfgs, result["corpora"]):
            entry["first_batch"] = first_batch_runs(c, args)
        result["first_batch"] = result["corpora"][0]["first_batch"]
    _write_json(args, result)  # first: a report that fails must not lose the measurements
    print(report(result))
    if args.json is not None:
        print(f"results written to {args.json}")
    if args.chart is not None:
        draw_chart(result, args.chart)
    return 0


def _write_json(args, result: dict) -> None:
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def draw_chart(result: dict, path: Path):
    """tokens/s read against worker count: shmloader's line, the baseline as a level."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("bench: --chart draws with matplotlib, which is not installed: "
                         "pip install matplotlib (or omit --chart)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c, runs = result["config"], result["runs"]
    base = runs[0]["tokens_per_s"] / 1e6
    runs = runs[:1] + [r for r in runs[1:] if r.get("label") != "before"]
    shm = sorted((r["workers"], r["tokens_per_s"] / 1e6) for r in runs[1:]
                 if r.get("packing", "concat") == "concat" and not r.get("cache"))
    fit = sorted((r["workers"], r["tokens_per_s"] / 1e6) for r in runs[1:] if r.get("packing") == "bos_bestfit")
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.plot([w for w, _ in shm], [t for _, t in shm], "o-", label="shmloader, concat")
    if fit:
        ax.plot([w for w, _ in fit], [t for _, t in fit], "s--", label="shmloader, best fit (tokens read)")
    ax.axhline(base, color="gray", linestyle="--", label="nanochat-style loader (in-process, 4 threads)")
    raw = result["raw"]["encode_to_numpy"]["tokens_per_s"] / 1e6
    cores = result["cores"]
    ax.plot([1, cores], [raw, raw * cores], ":", color="gray", label="tiktoken's single-thread rate x cores")
    bare = result.get("bare", [])
    if bare:  # the ceiling: as many bare engine processes, no loader
        ax.plot([b["processes"] for b in bare], [b["tokens_per_s"] / 1e6 for b in bare], "^:", color="green",
                label=f"bare {result.get('engine', 'tiktoken')} processes side by side (no loader)")
    ratios = {r["workers"]: vs_base(r, runs[0]) for r in runs[1:]
              if r.get("packing", "concat") == "concat" and not r.get("cache")}
    for w, t in shm:
        ax.annotate(f"{ratios[w]:.2f}x", (w, t), textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax.set_xlabel("worker processes")
    ax.set_ylabel("M tokens/s read")
    ax.set_xticks([w for w, _ in shm])
    ax.set_ylim(bottom=0)
    ax.set_title(f"B={c['B']}, T={c['T']}, {cores} cores, load avg {result['loadavg']}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"chart written to {path}")


if __name__ == "__main__":
    sys.exit(main())
