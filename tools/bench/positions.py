"""What `positions=True` costs the training process: `next()` with and without positions, side by side.

    python tools/bench/positions.py                      # demo corpus, 2 workers, both packings, 3 rounds
    python tools/bench/positions.py --corpus nanochat --quick

Per packing, the two rows (`positions=False`, `positions=True`) alternate in every round, each
in a fresh process (`row`), so that a slow stretch of a shared machine hits both. A row
measures, on the training process's side only (the workers write the positions):
- **ready batches**: a `ShmLoader` whose ring holds `--batches` + 1 slots, all ready before the
  clock starts; the calling thread's CPU in each of `--batches` `next()` calls back to back;
- **a trainer's pace**: `--step-ms` of busy work (`measure.busy_work`, a training step's
  compute) before each `next()`, the batch held through the step as a trainer holds it; the
  calling thread's CPU in `next()`, over `--batches` calls after 20 (calls that waited counted);
- with positions, `shmloader.cu_seqlens(positions)` on each paced batch (the caller's own
  cost, on the CPU: what varlen attention would ask for).
Medians per row; the report gives each round's ratio with / without and their median. The
target (issue 33): at most 1.3x.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, corpora, loaders, results  # noqa: E402

PACKINGS = ("concat", "bos_bestfit")
KEYS = ("ready_us", "paced_us")  # the per-round ratios


def parse_args(argv=None):
    p = results.parser("positions", __doc__)
    p.add_argument("--workers", type=int, default=2, help="loader workers (processes; default 2)")
    p.add_argument("--packings", nargs="+", choices=PACKINGS, default=list(PACKINGS), help="packings (default both)")
    loaders.add_shape_args(p)
    p.add_argument("--batches", type=int, default=None,
                   help="next() calls timed per measurement (calls; default 100, 40 with --quick)")
    p.add_argument("--step-ms", type=float, default=30.0, help="busy work per step at a trainer's pace (ms; default 30)")
    p.add_argument("--repeat", type=int, default=3, help="rounds, both rows of each packing per round (default 3)")
    p.add_argument("--quick", action="store_true", help="40 timed calls a measurement")
    corpora.add_args(p, many=False)
    results.add_json_arg(p, "positions")
    args = p.parse_args(argv)
    args.batches = args.batches or (40 if args.quick else 100)
    if min(args.workers, args.batch_size, args.seq_len, args.batches, args.repeat) < 1 or args.step_ms < 0:
        p.error("--workers, --batch-size, --seq-len, --batches and --repeat must be >= 1, --step-ms >= 0")
    corpora.check_args(p, args)
    return args


def row(cfg: dict) -> dict:
    """One row in this fresh process (`children.run`): see the module docstring."""
    import numpy as np
    import torch  # noqa: F401  (imported before any timing, as in a training script)

    import shmloader
    from tools.bench import measure

    n, with_p = cfg["batches"], cfg["positions"]
    it = shmloader.ShmLoader(cfg["data"], cfg["tokenizer"], cfg["B"], cfg["T"], "train", num_workers=cfg["workers"],
                             device="cpu", packing=cfg["packing"], n_slots=n + 1, positions=with_p)
    try:
        next(it)
        deadline = time.monotonic() + 60  # every slot ready
        while it.stats().get("ring_ready", 0) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        ready = []
        for _ in range(n):
            t = time.thread_time()
            batch = next(it)
            ready.append(time.thread_time() - t)
        for _ in range(20):
            batch = next(it)
        buf, paced, seqlens = np.zeros(1 << 17), [], []
        waited = it.stats()["wait_s"]
        not_ready = 0
        for _ in range(n):
            measure.busy_work(cfg["step_ms"] / 1e3, buf)
            w = it.stats()["wait_s"]
            t = time.thread_time()
            batch = next(it)
            paced.append(time.thread_time() - t)
            not_ready += it.stats()["wait_s"] > w
            if with_p:
                t = time.thread_time()
                shmloader.cu_seqlens(batch[2])
                seqlens.append(time.thread_time() - t)
        del batch
        waited = it.stats()["wait_s"] - waited
    finally:
        it.close()
    us = lambda xs: statistics.median(xs) * 1e6 if xs else None  # noqa: E731
    return {"packing": cfg["packing"], "positions": with_p, "ready_us": us(ready), "paced_us": us(paced),
            "paced_not_ready": not_ready, "paced_waited_s": waited, "cu_seqlens_us": us(seqlens), "batches": n}


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    corpus = corpora.resolve(args)[0]
    base = {"data": corpus.data, "tokenizer": corpus.tokenizer, "B": args.batch_size, "T": args.seq_len,
            "workers": args.workers, "batches": args.batches, "step_ms": args.step_ms}
    rows = {(p, flag): [] for p in args.packings for flag in (False, True)}
    with children.checkouts(None) as (ours,):
        for i in range(args.repeat):
            for packing in args.packings:
                for flag in (False, True) if i % 2 == 0 else (True, False):
                    print(f"round {i + 1}/{args.repeat}: {packing}, positions={flag}", file=sys.stderr)
                    rows[packing, flag].append(children.run("positions:row", dict(base, packing=packing,
                                                                                  positions=flag), ours))
    figures = {"config": {"corpus": corpus.name, "workers": args.workers, "B": args.batch_size, "T": args.seq_len,
                          "batches": args.batches, "step_ms": args.step_ms, "repeat": args.repeat},
               "packings": [{"packing": p, "without": rows[p, False], "with": rows[p, True],
                             "ratios": {k: [w[k] / o[k] for w, o in zip(rows[p, True], rows[p, False])] for k in KEYS}}
                            for p in args.packings]}
    results.publish(args.json, "positions", began, figures, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    out = [f"the training process's CPU per next(), with positions=True against without, {c['corpus'] or 'data'}, "
           f"B={c['B']}, T={c['T']}, {results.plural(c['workers'], 'worker')}, device cpu, {c['repeat']} rounds, "
           f"medians of {c['batches']} calls; load average at the start {run['machine']['load_average']}"]
    head = ("packing", "positions", "ready batches, us (rounds)", f"after {c['step_ms']:g} ms steps, us (rounds)",
            "calls that waited", "cu_seqlens, us")
    body = []
    for e in run["packings"]:
        for key, rs in (("without", e["without"]), ("with", e["with"])):
            body.append((e["packing"], key, ", ".join(f"{r['ready_us']:.1f}" for r in rs),
                         ", ".join(f"{r['paced_us']:.1f}" for r in rs), ", ".join(str(r["paced_not_ready"]) for r in rs),
                         results.fmt(results.median([r["cu_seqlens_us"] for r in rs]), ",.1f")))
        body.append((e["packing"], "with / without", ", ".join(f"{x:.2f}" for x in e["ratios"]["ready_us"]),
                     ", ".join(f"{x:.2f}" for x in e["ratios"]["paced_us"]), "", ""))
        body.append((e["packing"], "median ratio", f"{statistics.median(e['ratios']['ready_us']):.2f}x",
                     f"{statistics.median(e['ratios']['paced_us']):.2f}x", "", ""))
    out.append(results.table(head, body))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
