"""Tokens/s against worker count on one machine's cores: the scaling table of a GPU node, on any
machine, in one command.

    python tools/bench/scaling.py                             # 1 2 4 8 14 workers, capped by the cores
    python tools/bench/scaling.py --repeat 3 --compare ../before --cache-dir /tmp/bq
    python tools/bench/scaling.py --device cuda --nanochat-docs 32768 --corpus-files 8   # a GPU node

Per round (tools/bench/throughput.py's `one_round`, every row in a fresh process, one after the
other): the nanochat-style baseline, then for each worker count N: N bare engine processes side
by side, N bare processes that read their row groups from parquet too (tools/bench/bare.py),
and shmloader with N workers in each packing (and each checkout with `--compare`). Unlike the
throughput topic the bare processes run at every N, also above the cores: N processes on fewer
cores read what the cores read, which is what N workers are measured against ("of bare").
Worker counts above `--most-per-core` times the cores this process may run on are dropped
(on 2 cores: 1 2 4 8), and said. Defaults are nanochat's geometry: the nanochat corpus, B=32,
T=2048. `--warmup S`: each loader reads S seconds after its first batch before its window
opens, for a run past its start.

Per row: tokens/s (best fit: tokenized in the window); of bare and of read, per round; CPU of
bare (the workers' tokens per CPU second of their own / a bare process's tokens per CPU second); the
workers' CPU in cores and the coordinator's share of one core over the window; trainer CPU per
batch. A row's window starts at its first batch, so a loader's start (its workers' first
pieces) is in it, as it is in a short benchmark or an evaluation.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, corpora, loaders, results, throughput  # noqa: E402
from tools.bench.results import fmt  # noqa: E402

WORKERS = (1, 2, 4, 8, 14)
MOST_PER_CORE = 4


def parse_args(argv=None):
    p = results.parser("scaling", __doc__)
    p.add_argument("--workers", type=int, nargs="+", default=list(WORKERS), metavar="N",
                   help="worker counts (processes; default 1 2 4 8 14, those above --most-per-core x cores dropped)")
    p.add_argument("--most-per-core", type=float, default=MOST_PER_CORE,
                   help=f"worker counts above this many per usable core are dropped (default {MOST_PER_CORE})")
    p.add_argument("--packings", nargs="+", choices=throughput.PACKINGS, default=list(throughput.PACKINGS),
                   help="packings (default both)")
    p.add_argument("--batch-size", type=int, default=32, help="B, rows per batch (rows; default 32, nanochat's)")
    p.add_argument("--seq-len", type=int, default=2048, help="T, tokens per row (tokens; default 2048)")
    p.add_argument("--engine", choices=("auto", "tiktoken", "fastokens", "gigatoken"), default="auto",
                   help="the loaders' and the bare processes' engine (default auto)")
    p.add_argument("--device", default="cpu", help="where the loaders put their batches (default cpu; cuda on a GPU node)")
    p.add_argument("--n-slots", type=int, default=None, help="shmloader's ring slots (slots; default the loader's own)")
    p.add_argument("--seconds", type=float, default=6.0, help="wall time of each row (seconds; default 6)")
    p.add_argument("--warmup", type=float, default=0.0,
                   help="seconds each loader reads after its first batch before its window opens (seconds; default "
                        "0: the window holds the loader's start, its workers' first pieces included)")
    p.add_argument("--repeat", type=int, default=2, help="rounds, every row once per round (rounds; default 2)")
    corpora.add_args(p, default="nanochat")
    children.add_compare_arg(p)
    results.add_json_arg(p, "scaling")
    args = p.parse_args(argv)
    if min(args.workers) < 1 or min(args.batch_size, args.seq_len, args.repeat) < 1 or args.seconds <= 0 \
            or args.most_per_core <= 0 or args.warmup < 0:
        p.error("--workers, --batch-size, --seq-len and --repeat must be >= 1, --seconds and --most-per-core > 0, "
                "--warmup >= 0")
    if args.corpus is None and args.data is None:
        args.corpus = ["nanochat"]
    corpora.check_args(p, args)
    children.check_compare(p, args)
    cores = len(os.sched_getaffinity(0))
    kept = [w for w in args.workers if w <= args.most_per_core * cores]
    if len(kept) < len(args.workers):
        print(f"scaling: {cores} usable cores: dropped worker counts above {args.most_per_core:g} per core "
              f"({', '.join(str(w) for w in args.workers if w not in kept)})", file=sys.stderr)
    if not kept:
        p.error(f"no worker count at or under {args.most_per_core:g} per core ({cores} cores)")
    args.workers = kept
    return args


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    found = corpora.resolve(args)
    one = functools.partial(throughput.one_round, args, every_bare=True)
    per_corpus = children.in_rounds(args.repeat, found, args.compare, one)
    for rounds in per_corpus:
        for rnd in rounds:
            per_cpu(rnd)
    figures = {"config": {"B": args.batch_size, "T": args.seq_len, "device": args.device, "n_slots": args.n_slots,
                          "seconds": args.seconds, "warmup": args.warmup, "engine": args.engine, "rounds": args.repeat,
                          "workers": args.workers, "packings": args.packings,
                          "compare": str(args.compare) if args.compare else None},
               "corpora": [dict(throughput.summarise(rounds), corpus=c.name, data=c.data)
                           for c, rounds in zip(found, per_corpus)]}
    results.publish(args.json, "scaling", began, figures, argv, report)
    return 0


def per_cpu(rnd: list[dict]) -> None:
    """Each loader row's "CPU of bare" per CPU second on both sides: its workers' tokens per CPU
    second over a bare engine process's tokens per CPU second in the same round (above the
    cores a bare process's tokens/s is a share of a core, not a core)."""
    bare = {r["workers"]: r for r in rnd if r["kind"] == "bare"}
    for r in rnd:
        b = bare.get(r["workers"])
        if r["kind"] == "shmloader" and b is not None and b.get("tokens_per_cpu_s") and r.get("worker_cpu_s"):
            r["cpu_of_bare_cpu"] = r["tokens_per_s"] * r["wall_s"] / r["worker_cpu_s"] / b["tokens_per_cpu_s"]


def report(run: dict) -> str:
    c, m = run["config"], run["machine"]
    out = [f"tokens/s against worker count into {c['device']}, B={c['B']}, T={c['T']}, engine {c['engine']}, "
           f"{c['seconds']:g} s a row after {c.get('warmup', 0):g} s of reading, {results.plural(c['rounds'], 'round')}; "
           f"{m['cores']} cores usable, "
           f"load average at the start {m['load_average']}"]
    for entry in run["corpora"]:
        out += ["", f"corpus: {entry['corpus'] or entry['data']}", table(entry)]
        for kind, what in (("bare", "bare engine processes"), ("bare_read", "bare processes that read too")):
            got = [b for b in entry["bare"] if b.get("kind") == kind]
            if got:
                out.append(f"  {what}: " + "; ".join(
                    f"{b['processes']}: {b['tokens_per_s'] / 1e6:.2f} M tokens/s "
                    f"({' '.join(f'{x / 1e6:.1f}' for x in b['tokens_per_s_rounds'])})" for b in got))
    out.append("(of bare / of read: tokens/s over as many bare engine processes / bare processes that read, side by "
               "side in the same round, per round; CPU of bare: the workers' tokens per CPU second / a bare "
               "process's tokens per CPU second (the median round's); workers' CPU: their CPU seconds / the window, in cores; coordinator: its share "
               "of one core; ahead: tokens read that no batch returned holds yet at the window's end, the median round's)")
    return "\n".join(out)


def table(entry: dict) -> str:
    head = ("loader", "M tokens/s (rounds)", "of bare (rounds)", "of read (rounds)", "CPU of bare",
            "workers' CPU, cores", "coordinator", "ahead at the end, M tokens", "trainer CPU us/batch")
    rows = []
    pct = lambda xs: " ".join(f"{x:.0%}" for x in xs or []) or "-"  # noqa: E731
    for r in entry["rows"]:
        if r["kind"] != "shmloader":
            rows.append((throughput.name(r), f"{r['tokens_per_s'] / 1e6:.2f} "
                         f"({' '.join(f'{x / 1e6:.2f}' for x in r['tokens_per_s_rounds'])})", "-", "-", "-", "-", "-", "-",
                         fmt(r["trainer_cpu_us_per_batch"])))
            continue
        wall = r["wall_s"]
        rows.append((throughput.name(r),
                     f"{r['tokens_per_s'] / 1e6:.2f} ({' '.join(f'{x / 1e6:.2f}' for x in r['tokens_per_s_rounds'])})",
                     pct(r.get("of_bare_rounds")), pct(r.get("of_bare_read_rounds")),
                     fmt(r.get("cpu_of_bare_cpu"), ".0%"),
                     fmt(r["worker_cpu_s"] / wall if r.get("worker_cpu_s") is not None else None, ".2f"),
                     fmt(r["coordinator_cpu_s"] / wall if r.get("coordinator_cpu_s") is not None else None, ".0%"),
                     fmt(r["ahead_tokens"] / 1e6 if r.get("ahead_tokens") is not None else None, ".1f"),
                     fmt(r["trainer_cpu_us_per_batch"])))
    return results.table(head, rows)


if __name__ == "__main__":
    sys.exit(main())
