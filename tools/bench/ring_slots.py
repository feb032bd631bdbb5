"""Tokens/s against the ring's size: shmloader read as fast as it goes with each `--slots` count
and each `--workers` count, interleaved in rounds, every other round in reverse order (so that
a slow stretch of a shared machine hits every row alike).

    python tools/bench/ring_slots.py --corpus nanochat --workers 8 14 --slots 8 16 32 --repeat 2
    python tools/bench/ring_slots.py --quick                   # the harness

Every row runs in a fresh process (tools/bench/loaders.py says what a row measures). A row is
the round with the median tokens/s; "vs first" is the median over rounds of its tokens/s / the
row of the same worker count with the first `--slots` count in the same round.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, corpora, loaders, results  # noqa: E402
from tools.bench.results import fmt  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("ring_slots", __doc__)
    p.add_argument("--workers", type=int, nargs="+", default=[2], metavar="N", help="worker counts (default 2)")
    p.add_argument("--slots", type=int, nargs="+", default=[8, 16, 32], metavar="S",
                   help="ring sizes (slots; default 8 16 32; the first is each worker count's reference)")
    p.add_argument("--packing", choices=("concat", "bos_bestfit"), default="concat", help="(default concat)")
    p.add_argument("--device", default="cpu", help="where the batches go (default cpu)")
    loaders.add_shape_args(p)
    p.add_argument("--seconds", type=float, default=None, help="each row's reading time (seconds; default 5, 1 with --quick)")
    p.add_argument("--repeat", type=int, default=1, help="rounds (default 1)")
    p.add_argument("--quick", action="store_true", help="1 s a row, B=4")
    corpora.add_args(p, many=False)
    results.add_json_arg(p, "ring_slots")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_size = 4
    args.seconds = args.seconds or (1.0 if args.quick else 5.0)
    if min(args.workers) < 1 or min(args.slots) < 2 or args.repeat < 1 or args.seconds <= 0:
        p.error("--workers and --repeat must be >= 1, --slots >= 2, --seconds > 0")
    corpora.check_args(p, args)
    return args


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    corpus = corpora.resolve(args)[0]
    cfg = {"kind": "shmloader", "data": corpus.data, "tokenizer": corpus.tokenizer, "B": args.batch_size,
           "T": args.seq_len, "seconds": args.seconds, "packing": args.packing, "device": args.device}
    rounds = []
    with children.checkouts(None) as cks:
        for r in range(args.repeat):
            rows = {}
            order = [(w, s) for w in args.workers for s in args.slots]
            for w, s in (order if r % 2 == 0 else order[::-1]):  # every other round backwards: no row always first
                print(f"round {r + 1}/{args.repeat}: {w} workers, {s} slots ...", file=sys.stderr)
                rows[w, s] = dict(children.run("loaders:loader_child", dict(cfg, workers=w, n_slots=s), cks[-1]),
                                  n_slots=s)
            rounds.append([rows[key] for key in order])
    out = []
    for i in range(len(rounds[0])):
        runs = [rnd[i] for rnd in rounds]
        row = results.median_of(runs, "tokens_per_s")
        first = [next(x for x in rnd if x["workers"] == row["workers"]) for rnd in rounds]
        row["vs_first_rounds"] = [r["tokens_per_s"] / f["tokens_per_s"] for r, f in zip(runs, first)]
        out.append(row)
    figures = {"config": {k: cfg[k] for k in ("B", "T", "seconds", "packing", "device")} | {"rounds": args.repeat},
               "corpus": corpus.name or corpus.data, "rows": out}
    results.publish(args.json, "ring_slots", began, figures, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    head = ("workers", "slots", "tokens/s", "vs first", "per round", "busy per worker", "coordinator CPU share")
    rows = [(r["workers"], r["n_slots"], f"{r['tokens_per_s'] / 1e6:.2f} M",
             f"{results.median(r['vs_first_rounds']):.2f}x", " ".join(f"{x:.2f}" for x in r["vs_first_rounds"]),
             " ".join(f"{x:.0%}" for x in r.get("worker_busy_share") or []),
             fmt(r["coordinator_cpu_s"] / r["wall_s"] if r.get("coordinator_cpu_s") is not None else None, ".0%"))
            for r in run["rows"]]
    return "\n".join([f"tokens/s against the ring's size, {c['packing']}, B={c['B']}, T={c['T']}, into {c['device']}, "
                      f"{c['seconds']:g} s a row, {c['rounds']} round(s); corpus {run['corpus']}",
                      results.table(head, rows)])


if __name__ == "__main__":
    sys.exit(main())
