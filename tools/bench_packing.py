"""Benchmark the best-fit planner against the linear-scan oracle, side by side in one run.

Both plan the same batches from the same heavy-tailed document lengths (lognormal, median
600 tokens, sigma 1.0, clipped to [1, 16 * seq_len]; ~11% are longer than a 2049-token row);
the plans are checked identical, then the time per batch of each and the speedup are printed.
Target: >= 30x at buffer 1000, T=2048, B=16. From the repository root:

    python -m tools.bench_packing --batches 2000
"""

import argparse
import os
import sys
import time

import numpy as np

from shmloader.packing.planner import BestFitPlanner

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
from tests.oracle import plan_batch_scan  # noqa: E402  (nanochat's scan, the tests' oracle)


def chunk_source(seq_len: int, chunk: int, seed: int):
    """An endless `next_chunk` callable: doc ids count up from 0, lengths are lognormal with
    median 600 tokens and sigma 1.0, clipped to [1, 16 * seq_len]. Same seed, same stream."""
    rng, next_id = np.random.default_rng(seed), 0

    def next_chunk():
        nonlocal next_id
        lengths = np.rint(rng.lognormal(mean=np.log(600.0), sigma=1.0, size=chunk))
        ids = np.arange(next_id, next_id + chunk, dtype=np.int64)
        next_id += chunk
        return ids, np.clip(lengths, 1, 16 * seq_len).astype(np.int64)

    return next_chunk


def time_batches(plan_one, batches: int):
    plans, t0 = [], time.perf_counter()
    for _ in range(batches):
        plans.append(plan_one())
    return plans, (time.perf_counter() - t0) / batches


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=500, help="batches to plan (count)")
    ap.add_argument("--buffer-size", type=int, default=1000, help="buffered documents (count)")
    ap.add_argument("--seq-len", type=int, default=2048, help="T in tokens; rows hold T+1")
    ap.add_argument("--batch-size", type=int, default=16, help="B, rows per batch (count)")
    ap.add_argument("--chunk", type=int, default=128, help="tokenizer_batch_size (documents)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the length generator")
    args = ap.parse_args(argv)
    if args.batches < 1:
        ap.error("--batches must be >= 1")

    row_len = args.seq_len + 1
    planner = BestFitPlanner(args.batch_size, row_len, args.buffer_size)
    src_fast = chunk_source(args.seq_len, args.chunk, args.seed)
    fast, t_fast = time_batches(lambda: planner.plan_batch(src_fast), args.batches)

    buffer, src_scan = [], chunk_source(args.seq_len, args.chunk, args.seed)
    scan, t_scan = time_batches(
        lambda: plan_batch_scan(buffer, src_scan, args.batch_size, row_len, args.buffer_size),
        args.batches)

    for k, (a, b) in enumerate(zip(fast, scan)):
        same = a.n_cropped == b.n_cropped and all(
            np.array_equal(x, y) for x, y in zip(a[:4], b[:4]))
        if not same:
            raise SystemExit(f"batch {k}: planner and scan oracle disagree")
    placements = sum(p.doc_id.size for p in fast) / args.batches
    crop = planner.tokens_cropped / (planner.tokens_placed + planner.tokens_cropped)
    print(f"B={args.batch_size} T={args.seq_len} buffer={args.buffer_size} "
          f"chunk={args.chunk} batches={args.batches} seed={args.seed}")
    print(f"{placements:.1f} placements/batch; cropped {100 * crop:.1f}% of tokens read")
    print(f"plans identical: yes ({args.batches} batches)")
    print(f"scan oracle  {1e3 * t_scan:8.3f} ms/batch")
    print(f"planner      {1e3 * t_fast:8.3f} ms/batch")
    print(f"speedup      {t_scan / t_fast:8.1f}x")


if __name__ == "__main__":
    main()
