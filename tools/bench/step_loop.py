"""The training step: a loop whose step holds the GIL for `--step-ms` of Python and takes
nanochat's best-fit batch with its state, with shmloader, nanochat's own loader and that loader
in a background thread, each against the same loop on batches already in memory.

    python tools/bench/step_loop.py                                    # demo corpus, 3 rounds
    python tools/bench/step_loop.py --corpus demo nanochat skewed --repeat 5
    python tools/bench/step_loop.py --quick --loaders shmloader --compare ../before

The step is what kernel launches and optimizer bookkeeping cost a trainer's CPU: a fixed
amount of pure Python (sized once, before the rounds, to take `--step-ms` on this machine), so
that whatever takes the trainer's core or its GIL makes the step longer. Then
`x, y, state = next(loader)`, B=8, T=1024 by default. Rows, each in a fresh process, one after
the other: shmloader's drop-in with `--workers` workers (each checkout with `--compare`),
nanochat's own loader (the in-repo nanochat-style baseline, in the training process) and the
same loader in a background thread with a queue of `--depth` batches (the approach of nanochat
PR #832); per corpus, each with the garbage collector frozen after the warm-up (as nanochat's
base_train) and with it left on. In each row's process the loader's steps alternate, in blocks
of `--block` steps, with the same loop over batches already in memory, the ideal
(tools/bench/loop.py): on a shared machine the load lands on both sides of every pair. A row's
ratio in a round is the median over its pairs of the loader's block time / the ideal's; a round
runs every row once, in turn; a row is its median round.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, corpora, measure, results  # noqa: E402
from tools.bench.loop import KINDS  # noqa: E402
from tools.bench.results import fmt, plural  # noqa: E402

GC_MODES = ("frozen", "on")
NAMES = {"nanochat": "nanochat's loader", "thread": "nanochat's loader, thread"}


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("step_loop", __doc__)
    p.add_argument("--workers", type=int, default=1, help="shmloader's worker processes (processes; default 1)")
    p.add_argument("--batch-size", type=int, default=8, help="B, rows per batch (rows; default 8)")
    p.add_argument("--seq-len", type=int, default=1024, help="T, tokens per row (tokens; default 1024)")
    p.add_argument("--step-ms", type=float, default=20.0,
                   help="the step's pure Python, sized on this machine before the rounds (ms; default 20)")
    p.add_argument("--block", type=int, default=25,
                   help="steps of a block, the loader's or the ideal's (steps; default 25)")
    p.add_argument("--pairs", type=int, default=None,
                   help="pairs of blocks, the loader's and the ideal's, a row (pairs; default 8, 3 with --quick)")
    p.add_argument("--warmup", type=int, default=None,
                   help="the loader's steps before the clock starts and the collector is frozen "
                        "(steps; default 50, 20 with --quick)")
    p.add_argument("--loaders", nargs="+", choices=KINDS, default=list(KINDS), help="the rows (default all three)")
    p.add_argument("--depth", type=int, default=2, help="the background thread's queue (batches; default 2)")
    p.add_argument("--gc", nargs="+", choices=GC_MODES, default=list(GC_MODES), dest="gc_modes",
                   help="the collector after the warm-up: frozen (collected, frozen, disabled, as base_train) "
                        "and/or on (default both)")
    p.add_argument("--repeat", type=int, default=None,
                   help="rounds, every row once per round (rounds; default 3, 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="3 pairs of blocks a row after 20 steps of warm-up, 1 round (unless --repeat)")
    corpora.add_args(p)
    children.add_compare_arg(p, "shmloader's rows")
    results.add_json_arg(p, "step_loop")
    args = p.parse_args(argv)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.pairs = args.pairs or (3 if args.quick else 8)
    args.warmup = args.warmup if args.warmup is not None else (20 if args.quick else 50)
    if min(args.workers, args.batch_size, args.seq_len, args.block, args.pairs, args.depth, args.repeat) < 1:
        p.error("--workers, --batch-size, --seq-len, --block, --pairs, --depth and --repeat must be >= 1")
    if args.step_ms <= 0:
        p.error("--step-ms must be > 0")
    if args.warmup < 1:
        p.error("--warmup must be >= 1 (the collector is frozen after it)")
    corpora.check_args(p, args)
    children.check_compare(p, args)
    return args


def one_round(args, units: int, corpus, checkouts, step: str) -> list[dict]:
    cfg = {"data": corpus.data, "tokenizer": corpus.tokenizer, "B": args.batch_size, "T": args.seq_len,
           "units": units, "block": args.block, "pairs": args.pairs, "warmup": args.warmup, "workers": args.workers, "depth": args.depth}
    rows = []
    for mode in args.gc_modes:
        plan = []
        for kind in args.loaders:
            plan += [(kind, ck) for ck in checkouts] if kind == "shmloader" else [(kind, checkouts[-1])]
        for kind, ck in plan:
            label = ck.label if kind == "shmloader" else None
            print(f"{step}{kind}{f' ({label})' if label else ''}, collector {mode} ({corpus.name or corpus.data}) ...",
                  file=sys.stderr)
            rows.append(dict(children.run("loop:step_row", dict(cfg, kind=kind, gc=mode), ck), label=label))
    return rows


def summarise(rounds: list[list[dict]]) -> list[dict]:
    """Each row's median round by its ratio to the ideal (the median of its pairs'), with every
    round's pairs pooled (`pair_ratios_all`), their median and its 95% bootstrap interval: what
    the run can resolve (a pair of blocks moves by 10-15% on this VM)."""
    out = []
    for i in range(len(rounds[0])):
        row = results.median_of([rnd[i] for rnd in rounds], "vs_ideal")
        pooled = [x for rnd in rounds for x in rnd[i]["pair_ratios"]]
        out.append(dict(row, pair_ratios_all=pooled, vs_ideal_pooled=statistics.median(pooled),
                        vs_ideal_interval=list(results.median_interval(pooled))))
    return out


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    found = corpora.resolve(args)
    units = measure.gil_units(args.step_ms / 1e3)
    print(f"the step: {units:,} units of pure Python ({args.step_ms:g} ms on this core now)", file=sys.stderr)
    per_corpus = children.in_rounds(args.repeat, found, args.compare, functools.partial(one_round, args, units))
    figures = {"config": {"B": args.batch_size, "T": args.seq_len, "workers": args.workers, "step_ms": args.step_ms,
                          "units": units, "block": args.block, "pairs": args.pairs, "warmup": args.warmup, "depth": args.depth,
                          "rounds": args.repeat, "gc": args.gc_modes,
                          "compare": str(args.compare) if args.compare else None},
               "corpora": [{"corpus": c.name, "data": c.data, "rows": summarise(rounds)}
                           for c, rounds in zip(found, per_corpus)]}
    results.publish(args.json, "step_loop", began, figures, argv, report)
    return 0


def name(row: dict) -> str:
    if row["kind"] == "shmloader":
        return f"shmloader, {plural(row['workers'], 'worker')}" + (f" ({row['label']})" if row.get("label") else "")
    return NAMES[row["kind"]]


def _us(x: dict) -> str:
    return f"{x['median']:,.0f} / {x['mean']:,.0f}"


def _pooled(row: dict) -> str:
    if "vs_ideal_interval" not in row:  # a results file from before the pooled figure
        return "-"
    lo, hi = row["vs_ideal_interval"]
    return f"{row['vs_ideal_pooled']:.3f}x ({lo:.3f}-{hi:.3f})"


def report(run: dict) -> str:
    c = run["config"]
    out = [f"the training step: {c['step_ms']:g} ms of Python holding the GIL, then x, y, state = next(loader), "
           f"best fit, B={c['B']}, T={c['T']}; per row, after {c['warmup']} steps of warm-up, {c['pairs']} pairs of "
           f"{c['block']}-step blocks, the loader's and the in-memory ideal's, alternating; "
           f"{plural(c['rounds'], 'round')} (a row: its median round; every round's ratio in brackets); load average "
           f"at the start {run['machine']['load_average']}"]
    head = ("corpus", "collector", "loader", "/ ideal", "rounds", "all pairs (95%)", "step ms", "p99 / max ms", "core kept", "preempted",
            "next() us", "next() CPU us", "collections (ms)", "loader CPU", "others")
    rows = []
    for e in run["corpora"]:
        for r in e["rows"]:
            lo, hi = r["loader"], r["ideal"]
            both = lambda key, f: f"{f(lo[key])} | {f(hi[key])}"  # noqa: E731
            rows.append((e["corpus"] or "data", r["gc"], name(r), f"{r['vs_ideal']:.3f}x",
                         ", ".join(f"{x:.3f}" for x in r["vs_ideal_rounds"]), _pooled(r), both("step_ms", "{:.2f}".format),
                         f"{lo['step_p99_ms']:.1f} / {lo['step_max_ms']:.1f}", both("core_kept", "{:.1%}".format),
                         both("preempted_per_step", "{:.2f}".format),
                         both("next_us", _us), both("next_cpu_us", _us),
                         both("collections", lambda g: "/".join(map(str, g))) + f" ({lo['collection_ms']:.0f})",
                         fmt(lo["loader_cpu_share"], ".0%"), both("others_cores", "{:.2f}".format)))
    out.append(results.table(head, rows))
    out.append("/ ideal: the median over pairs of the loader's block time / the ideal's; all pairs: the median of "
               "every round's pairs together, and its 95% bootstrap interval (what the run resolves); "
               "a | b: the loader's blocks | "
               "the ideal's; step ms: wall time / steps; core kept: the step's Python, thread CPU / wall; preempted: the training thread's involuntary "
               "context switches per step; next(): "
               "median / mean over the steps; collections: by generation 0/1/2 (the loader's ms); loader CPU: its "
               "processes' CPU / its blocks' wall time; others: the cores the rest of the machine used meanwhile")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
