"""A loader read as fast as it goes (`row`; `loader_child`: one in a fresh process): the rows
of the throughput and token-cache topics.

- tokens/s: tokens read per wall second over `seconds`, counted from the first batch. Concat:
  B*T+1 per batch delivered. Best fit: what the workers tokenized in the window (`stats()`
  `tokens_read`; the window opens after a quarter of `seconds`, once the read-ahead and the
  buffer are full), since best fit drops a share of what it reads (docs/contract.md §5:
  compare packings by tokens read); what it delivered is `delivered_tokens_per_s`.
- trainer CPU per batch: user + system CPU of the training process (all threads) per batch
  over that loop. The workers' and the coordinator's CPU over the same window come from
  /proc: each worker's busy share (its CPU seconds / the window's wall seconds).
- ahead: tokens the workers read and no batch returned holds yet, at the window's end (a
  window from the first batch loses what fills the pipeline: with more workers than cores,
  docs/benchmarks.md "More workers than cores: the fill").
- peaks: the trainer's (ru_maxrss), the largest worker's and the coordinator's (VmHWM).
- first batch (`first_runs` > 0): wall time from building a loader to its first batch, each of
  `first_runs` fresh loaders in this process (the first also starts the forkserver).
"""
from __future__ import annotations

import statistics
import time

from tools.bench import baseline, measure


def add_shape_args(p) -> None:
    """`--batch-size` (B) and `--seq-len` (T), nanochat's B=16, T=2048 by default."""
    p.add_argument("--batch-size", type=int, default=16, help="B, rows per batch (rows; default 16)")
    p.add_argument("--seq-len", type=int, default=2048, help="T, tokens per row (tokens; default 2048)")


def loader_child(cfg: dict) -> dict:
    """One loader configuration in this fresh process (`row`), with the process's peak RSS."""
    import resource

    import torch  # noqa: F401  (imported before any timing, as in a training script)

    return dict(row(cfg), trainer_peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def row(cfg: dict) -> dict:
    """A loader built by `cfg`: `kind` "baseline" (nanochat-style) or "shmloader" (`workers`,
    `packing`, `engine`, optional `cache_dir` and `n_slots`), onto `device` (default "cpu"),
    timed to its first batch `first_runs` times and read as fast as it goes for `seconds`
    (`cache` "cold": its first epoch only)."""
    B, T, device, packing = cfg["B"], cfg["T"], cfg.get("device", "cpu"), cfg.get("packing", "concat")
    bestfit = packing == "bos_bestfit"
    if cfg["kind"] == "baseline":
        enc = baseline.load_tiktoken(cfg["tokenizer"])
        make = lambda: baseline.on_device(baseline.loader(cfg["files"], enc, B, T, packing), device)  # noqa: E731
    else:
        from shmloader import Mixture, ShmLoader

        opts = {k: cfg[k] for k in ("cache_dir", "n_slots") if cfg.get(k)}
        mix = cfg.get("mixture")  # {"sources": {name: dir}, "weights": {name: weight}} (tools/bench/mixture.py)
        data = Mixture(mix["sources"], mix["weights"]) if mix else cfg["data"]
        make = lambda: ShmLoader(data, cfg["tokenizer"], B, T, "train", num_workers=cfg["workers"],  # noqa: E731
                                 device=device, engine=cfg.get("engine", "auto"), packing=packing, **opts)
    firsts = [measure.first_batch_s(make) * 1e3 for _ in range(cfg.get("first_runs", 0))]
    out = {"kind": cfg["kind"], "workers": cfg.get("workers"), "packing": packing,
           "cache": cfg.get("cache"), "first_batch_ms": firsts}
    # an empty cache is read for its first epoch only: later epochs would hit what it wrote
    out.update(read_as_fast(make(), cfg["seconds"], B * (T + 1) if bestfit else B * T + 1, bestfit,
                            first_epoch_only=cfg.get("cache") == "cold", warmup=cfg.get("warmup") or 0.0))
    return out


def read_as_fast(it, seconds: float, window: int, bestfit: bool = False, first_epoch_only: bool = False,
                 warmup: float = 0.0) -> dict:
    """Read `it` as fast as it goes for `seconds` after its first batch (and `warmup` seconds
    more of reading, left out of the window: a run past its start); closes it."""
    try:
        next(it)
        if bestfit or warmup:  # best fit: let the read-ahead and the buffer fill before the window opens
            end = time.perf_counter() + max(warmup, seconds / 4 if bestfit else 0.0)
            while time.perf_counter() < end:
                next(it)
            read0 = it.stats()["tokens_read"] if bestfit else None
        workers, coordinator = measure.loader_pids(it)
        n, c0, t0 = 0, measure.cpu_s(), time.perf_counter()
        w0, k0 = [measure.cpu_of([pid]) for pid in workers], measure.cpu_of(coordinator)
        with measure.bar("reading") as bar:
            while time.perf_counter() - t0 < seconds:
                next(it)
                if first_epoch_only and it.state_dict()["epoch"] > 1:
                    break
                n += 1
                bar.update()
        each = [measure.cpu_of([pid]) - c for pid, c in zip(workers, w0)]
        wall, cpu = time.perf_counter() - t0, measure.cpu_s() - c0
        read = it.stats()["tokens_read"] - read0 if bestfit else n * window
        out = {"batches": n, "wall_s": wall, "tokens_per_s": read / wall,
               "trainer_cpu_us_per_batch": cpu / max(n, 1) * 1e6, "trainer_cpu_s": cpu,
               "worker_cpu_s": sum(each) if workers else None,
               "worker_busy_share": [x / wall for x in each] if workers else None,
               "coordinator_cpu_s": measure.cpu_of(coordinator) - k0 if coordinator else None}
        if workers:
            stats = it.stats()
            out["ahead_tokens"] = stats["tokens_read"] - stats["tokens_delivered"]  # read, not yet in a batch returned
            # each worker's tokens per second of its own busy (reading + tokenizing) time
            out["worker_busy_tokens_per_s"] = statistics.fmean(w["tokens_per_s"] for w in stats["workers"])
            out["worker_tokenized"] = sum(w.get("tokenized", 0) for w in stats["workers"])  # not from a cache
            if bestfit:
                out.update(cropped_fraction=stats["cropped_fraction"], delivered_tokens_per_s=n * window / wall)
        out.update(measure.process_peaks(it))
        return out
    finally:
        it.close()
