"""The best-fit planner alone against the plain scan (nanochat's algorithm, the tests' oracle),
on the same document lengths: no processes, no tokens, no tokenizer.

    python tools/bench/packing.py --batches 2000

Both plan the same batches from the same heavy-tailed lengths (log-normal, median 600 tokens,
sigma 1.0, clipped to [1, 16 * seq_len]; ~11% are longer than a 2049-token row); the plans are
checked identical (the run fails if not), then the time per batch of each and their ratio are
reported. The planner is the package's internal `shmloader.packing.planner.BestFitPlanner`;
the scan is `tests/oracle.py`'s `plan_batch_scan`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, tests, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import results  # noqa: E402


def chunk_source(seq_len: int, chunk: int, seed: int):
    """An endless `next_chunk` callable: doc ids count up from 0, lengths are log-normal with
    median 600 tokens and sigma 1.0, clipped to [1, 16 * seq_len]. Same seed, same stream."""
    import numpy as np

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


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("packing", __doc__)
    p.add_argument("--batches", type=int, default=500, help="batches to plan (batches; default 500)")
    p.add_argument("--buffer-size", type=int, default=1000, help="buffered documents (documents; default 1000)")
    p.add_argument("--seq-len", type=int, default=2048, help="T (tokens; rows hold T+1; default 2048)")
    p.add_argument("--batch-size", type=int, default=16, help="B, rows per batch (rows; default 16)")
    p.add_argument("--chunk", type=int, default=128, help="tokenizer_batch_size (documents; default 128)")
    p.add_argument("--seed", type=int, default=0, help="seed of the length generator (default 0)")
    results.add_json_arg(p, "packing")
    args = p.parse_args(argv)
    if min(args.batches, args.buffer_size, args.seq_len, args.batch_size, args.chunk) < 1:
        p.error("--batches, --buffer-size, --seq-len, --batch-size and --chunk must be >= 1")
    return args


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    import numpy as np

    from shmloader.packing.planner import BestFitPlanner
    from tests.oracle import plan_batch_scan

    row_len = args.seq_len + 1
    planner = BestFitPlanner(args.batch_size, row_len, args.buffer_size)
    src_fast = chunk_source(args.seq_len, args.chunk, args.seed)
    fast, t_fast = time_batches(lambda: planner.plan_batch(src_fast), args.batches)
    buffer, src_scan = [], chunk_source(args.seq_len, args.chunk, args.seed)
    scan, t_scan = time_batches(
        lambda: plan_batch_scan(buffer, src_scan, args.batch_size, row_len, args.buffer_size), args.batches)
    for k, (a, b) in enumerate(zip(fast, scan)):
        if a.n_cropped != b.n_cropped or not all(np.array_equal(x, y) for x, y in zip(a[:4], b[:4])):
            raise SystemExit(f"batch {k}: the planner and the scan oracle disagree")
    figures = {"config": {"batches": args.batches, "buffer_size": args.buffer_size, "B": args.batch_size,
                          "T": args.seq_len, "chunk": args.chunk, "seed": args.seed},
               "placements_per_batch": sum(p.doc_id.size for p in fast) / args.batches,
               "cropped_fraction": planner.tokens_cropped / (planner.tokens_placed + planner.tokens_cropped),
               "plans_identical": True, "scan_ms_per_batch": t_scan * 1e3, "planner_ms_per_batch": t_fast * 1e3}
    results.publish(args.json, "packing", began, figures, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    return "\n".join([
        f"B={c['B']} T={c['T']} buffer={c['buffer_size']} chunk={c['chunk']} batches={c['batches']} seed={c['seed']}",
        f"{run['placements_per_batch']:.1f} placements/batch; cropped {100 * run['cropped_fraction']:.1f}% of tokens read",
        f"plans identical: yes ({c['batches']} batches)",
        f"scan oracle  {run['scan_ms_per_batch']:8.3f} ms/batch",
        f"planner      {run['planner_ms_per_batch']:8.3f} ms/batch",
        f"planner / scan: {run['scan_ms_per_batch'] / run['planner_ms_per_batch']:.1f}x as fast"])


if __name__ == "__main__":
    sys.exit(main())
