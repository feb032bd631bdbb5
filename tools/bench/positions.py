"""What `positions=True` costs the training process: `next()` with and without positions, side by side.

    python tools/bench/positions.py                      # demo corpus, 2 workers, both packings, 3 rounds
    python tools/bench/positions.py --corpus nanochat --quick

Per packing and round, one fresh process (`pair`) holds both loaders (`positions=False`,
`positions=True`) and alternates their calls, one to each in turn (the round's first call to
either, by turns), so that a slow stretch of a shared machine hits both alike. Each loader
measures, on the training process's side only (the workers write the positions):
- **ready batches**: a `ShmLoader` whose ring holds `--batches` + 1 slots, all ready before the
  clock starts; the calling thread's CPU in each of `--batches` `next()` calls back to back;
- **a trainer's pace**: `--step-ms` of busy work (`measure.busy_work`, a training step's
  compute) before each `next()`, the batch held through the step as a trainer holds it; the
  calling thread's CPU in `next()`, over `--batches` calls after 20 (calls that waited counted);
- with positions, `shmloader.cu_seqlens(positions)` on each paced batch (the caller's own
  cost, on the CPU: what varlen attention would ask for).
Medians per loader and round; the report gives each round's ratio with / without and their
median. The
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
    p.add_argument("--step-ms", type=float, default=30.0,
                   help="busy work per step at a trainer's pace (ms; default 30)")
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


def pair(cfg: dict) -> dict:
    """Both rows of a packing in this fresh process (`children.run`), their calls alternating
    (see the module docstring): `{"without": {...}, "with": {...}}`."""
    import numpy as np
    import torch  # noqa: F401  (imported before any timing, as in a training script)

    import shmloader
    from tools.bench import measure

    n, first = cfg["batches"], cfg["first"]
    flags = (first, not first)
    its = {flag: shmloader.ShmLoader(cfg["data"], cfg["tokenizer"], cfg["B"], cfg["T"], "train",
                                     num_workers=cfg["workers"], device="cpu", packing=cfg["packing"],
                                     n_slots=n + 1, positions=flag) for flag in flags}
    ready = {flag: [] for flag in flags}
    paced = {flag: [] for flag in flags}
    not_ready = dict.fromkeys(flags, 0)
    seqlens, buf = [], np.zeros(1 << 17)
    try:
        for it in its.values():
            next(it)
        deadline = time.monotonic() + 120  # every slot of both rings ready
        while min(it.stats().get("ring_ready", 0) for it in its.values()) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(n):
            for flag in flags:
                t = time.thread_time()
                batch = next(its[flag])
                ready[flag].append(time.thread_time() - t)
                del batch
        for _ in range(20):
            for it in its.values():
                next(it)
        held = {}
        for _ in range(n):
            for flag in flags:
                measure.busy_work(cfg["step_ms"] / 1e3, buf)
                it, waited = its[flag], its[flag].stats()["wait_s"]
                t = time.thread_time()
                held[flag] = next(it)  # held through the next step, as a trainer holds its batch
                paced[flag].append(time.thread_time() - t)
                not_ready[flag] += it.stats()["wait_s"] > waited
                if flag:
                    t = time.thread_time()
                    shmloader.cu_seqlens(held[flag][2])
                    seqlens.append(time.thread_time() - t)
        held.clear()
    finally:
        for it in its.values():
            it.close()
    us = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    out = {("with" if flag else "without"): {"ready_us": us(ready[flag]), "paced_us": us(paced[flag]),
                                             "paced_not_ready": not_ready[flag]} for flag in flags}
    out["with"]["cu_seqlens_us"] = us(seqlens)
    return dict(out, packing=cfg["packing"], first="with" if first else "without", batches=n)


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    corpus = corpora.resolve(args)[0]
    base = {"data": corpus.data, "tokenizer": corpus.tokenizer, "B": args.batch_size, "T": args.seq_len,
            "workers": args.workers, "batches": args.batches, "step_ms": args.step_ms}
    rounds = {p: [] for p in args.packings}
    with children.checkouts(None) as (ours,):
        for i in range(args.repeat):
            for packing in args.packings:
                print(f"round {i + 1}/{args.repeat}: {packing}, with and without positions", file=sys.stderr)
                rounds[packing].append(children.run("positions:pair", dict(base, packing=packing, first=i % 2 == 1),
                                                    ours))
    figures = {"config": {"corpus": corpus.name, "workers": args.workers, "B": args.batch_size, "T": args.seq_len,
                          "batches": args.batches, "step_ms": args.step_ms, "repeat": args.repeat},
               "packings": [{"packing": p, "without": [r["without"] for r in rs], "with": [r["with"] for r in rs],
                             "ratios": {k: [r["with"][k] / r["without"][k] for r in rs] for k in KEYS}}
                            for p, rs in rounds.items()]}
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
                         ", ".join(f"{r['paced_us']:.1f}" for r in rs),
                         ", ".join(str(r["paced_not_ready"]) for r in rs),
                         results.fmt(results.median([r.get("cu_seqlens_us") for r in rs]), ",.1f")))
        body.append((e["packing"], "with / without", ", ".join(f"{x:.2f}" for x in e["ratios"]["ready_us"]),
                     ", ".join(f"{x:.2f}" for x in e["ratios"]["paced_us"]), "", ""))
        body.append((e["packing"], "median ratio", f"{statistics.median(e['ratios']['ready_us']):.2f}x",
                     f"{statistics.median(e['ratios']['paced_us']):.2f}x", "", ""))
    out.append(results.table(head, body))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
