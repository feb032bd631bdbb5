"""Tokens/s read: shmloader with 1..N workers against the nanochat-style baseline and against
bare engine processes, on each corpus.

    python tools/bench/throughput.py                                # demo corpus, 1 and 2 workers
    python tools/bench/throughput.py --workers 1 2 --repeat 3       # medians of 3 interleaved rounds
    python tools/bench/throughput.py --corpus demo nanochat skewed --workers 2 --repeat 2
    python tools/bench/throughput.py --quick --compare ../before    # 3 s a row, another checkout too

Every row runs in a fresh process of its own, one after the other (tools/bench/loaders.py says
what a row measures). A round measures, per corpus: the baseline, then for each worker count N:
N bare engine processes side by side (N <= cores; tools/bench/bare.py), N bare processes that read
their row groups from parquet and tokenize them, then shmloader with N
workers in each packing (and each checkout with `--compare`). With `--repeat`, every round
runs every row once, in turn, so that a slow stretch of a shared machine hits all of them; a
row is the round with the median tokens/s and its ratios are the medians of the per-round ratios.

Per row: tokens/s; "vs base", the ratio to the baseline of the same corpus and round; "of
bare", tokens/s / what as many bare processes read in the same round; "of read", the same
against bare processes that read and decompress their row groups too (the ceiling that counts
reading); "CPU of bare", the workers' tokens per CPU second of their own / a bare process's
tokens/s (what a worker reads per second of a core of its own); each worker's busy share; where the cores went (workers,
coordinator, training process, the rest); trainer CPU per batch; peak RSS.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import bare, children, corpora, loaders, results  # noqa: E402
from tools.bench.results import fmt, plural  # noqa: E402

PACKINGS = ("concat", "bos_bestfit")


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("throughput", __doc__)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], metavar="N",
                   help="shmloader worker counts to measure (processes; default 1 2)")
    p.add_argument("--packings", nargs="+", choices=PACKINGS, default=list(PACKINGS),
                   help="packings to measure shmloader with (default both)")
    loaders.add_shape_args(p)
    p.add_argument("--engine", choices=("auto", "tiktoken", "fastokens", "gigatoken"), default="auto",
                   help="the loaders' and the bare processes' engine (default auto: gigatoken where proven "
                        "equal, else fastokens when installed)")
    p.add_argument("--device", default="cpu",
                   help="where the loaders put their batches (default cpu; cuda: the pinned copy, and the "
                        "baseline's batches pinned and copied without blocking, as nanochat's own)")
    p.add_argument("--n-slots", type=int, default=None,
                   help="shmloader's ring slots (slots; default the loader's own, 8)")
    p.add_argument("--seconds", type=float, default=None,
                   help="wall time of each row and of each set of bare processes (seconds; default 10, 3 with --quick)")
    p.add_argument("--repeat", type=int, default=1, help="rounds, every row once per round (rounds; default 1)")
    p.add_argument("--quick", action="store_true", help="3 s a row")
    p.add_argument("--chart", type=Path, default=None, metavar="PNG",
                   help="also draw tokens/s against worker count on the first corpus into this PNG "
                        "(docs/bench/throughput.png is the results file's chart)")
    corpora.add_args(p)
    children.add_compare_arg(p)
    results.add_json_arg(p, "throughput")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (3.0 if args.quick else 10.0)
    if min(args.workers) < 1 or min(args.batch_size, args.seq_len, args.repeat) < 1 or args.seconds <= 0 \
            or (args.n_slots is not None and args.n_slots < 2):
        p.error("--workers, --batch-size, --seq-len and --repeat must be >= 1, --n-slots >= 2, --seconds > 0")
    corpora.check_args(p, args)
    children.check_compare(p, args)
    return args


def one_round(args, corpus, checkouts, step: str, every_bare: bool = False) -> list[dict]:
    """One round on one corpus: the baseline, then per worker count the bare processes (as many
    as the worker count, if the cores hold them, or whatever the count with `every_bare`: what
    that many processes read side by side, the scaling topic's reference) and the loaders."""
    cores = len(os.sched_getaffinity(0))
    files = corpora.split_files(corpus.data, "train")
    cfg = {"data": corpus.data, "tokenizer": corpus.tokenizer, "files": files, "B": args.batch_size,
           "T": args.seq_len, "seconds": args.seconds, "engine": args.engine, "device": args.device,
           "n_slots": args.n_slots, "warmup": getattr(args, "warmup", 0.0)}
    where = f" ({corpus.name or corpus.data})"
    say = lambda what: print(f"{step}{what}{where} ...", file=sys.stderr)  # noqa: E731
    say("the nanochat-style baseline")
    rows = [dict(children.run("loaders:loader_child", dict(cfg, kind="baseline"), checkouts[-1]), label=None)]
    for w in args.workers:
        if w <= cores or every_bare:
            say(f"{plural(w, 'bare engine process', 'bare engine processes')} side by side")
            rows.append(bare.side_by_side(files, corpus.tokenizer, w, args.seconds, args.engine, checkouts[-1]))
            say(f"{plural(w, 'bare process', 'bare processes')} reading and tokenizing, side by side")
            rows.append(bare.side_by_side(files, corpus.tokenizer, w, args.seconds, args.engine, checkouts[-1],
                                          read=True))
        for packing in args.packings:
            for ck in checkouts:
                say(f"shmloader, {plural(w, 'worker')}, {packing}{f' ({ck.label})' if ck.label else ''}")
                rows.append(children.run("loaders:loader_child",
                                         dict(cfg, kind="shmloader", workers=w, packing=packing), ck))
    return rows


def summarise(rounds: list[list[dict]]) -> dict:
    """One corpus's rounds as rows: each configuration's median round, with its per-round ratios."""
    rows, bares = [], []
    for i in range(len(rounds[0])):
        runs = [rnd[i] for rnd in rounds]
        row = results.median_of(runs, "tokens_per_s")
        if row["kind"] in ("bare", "bare_read"):
            bares.append(row)
            continue
        row["vs_base_rounds"] = [r["tokens_per_s"] / rnd[0]["tokens_per_s"] for r, rnd in zip(runs, rounds)]
        bare_of = [{b["workers"]: b for b in rnd if b["kind"] == "bare"}.get(r["workers"]) for r, rnd in zip(runs, rounds)]
        read_of = [{b["workers"]: b for b in rnd if b["kind"] == "bare_read"}.get(r["workers"])
                   for r, rnd in zip(runs, rounds)]
        if row["kind"] == "shmloader" and None not in bare_of:
            row["of_bare_rounds"] = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(runs, bare_of)]
            row["cpu_of_bare_rounds"] = [r["tokens_per_s"] * r["wall_s"] / r["worker_cpu_s"] / (b["tokens_per_s"] / b["workers"])
                                         for r, b in zip(runs, bare_of)]
        if row["kind"] == "shmloader" and None not in read_of:  # the ceiling that counts reading
            row["of_bare_read_rounds"] = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(runs, read_of)]
        row["worker_busy_share_rounds"] = [r.get("worker_busy_share") for r in runs]
        rows.append(row)
    return {"rows": rows, "bare": bares}


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    found = corpora.resolve(args)
    per_corpus = children.in_rounds(args.repeat, found, args.compare, functools.partial(one_round, args))
    figures = {"config": {"B": args.batch_size, "T": args.seq_len, "device": args.device, "n_slots": args.n_slots,
                          "seconds": args.seconds, "engine": args.engine, "rounds": args.repeat, "workers": args.workers, "packings": args.packings,
                          "compare": str(args.compare) if args.compare else None},
               "corpora": [dict(summarise(rounds), corpus=c.name, data=c.data)
                           for c, rounds in zip(found, per_corpus)]}
    run = results.publish(args.json, "throughput", began, figures, argv, report)
    if args.chart is not None:
        from tools.bench import chart

        chart.draw(run, args.chart)
    return 0


def ratio(row: dict, key: str):
    """The median of a row's per-round ratios `key` ("vs_base", "of_bare", "cpu_of_bare")."""
    return results.median(row.get(f"{key}_rounds") or [])


def name(row: dict) -> str:
    if row["kind"] == "baseline":
        return "nanochat-style baseline"
    mode = ", best fit" if row.get("packing") == "bos_bestfit" else ""
    return f"shmloader, {plural(row['workers'], 'worker')}{mode}" + (f" ({row['label']})" if row.get("label") else "")


def report(run: dict) -> str:
    c = run["config"]
    m = run["machine"]
    out = [f"tokens/s read into {c.get('device', 'cpu')}, B={c['B']}, T={c['T']}, engine {c['engine']}, "
           f"{c['seconds']:g} s a row, {plural(c['rounds'], 'round')}; {m['cores']} cores usable, load average at "
           f"the start {m['load_average']}"]
    for entry in run["corpora"]:
        out += ["", f"corpus: {entry['corpus'] or entry['data']}", corpus_table(entry)]
        for kind, what in (("bare", "bare engine processes"), ("bare_read", "bare processes that read too")):
            got = [b for b in entry["bare"] if b.get("kind", "bare") == kind]
            out += [f"  {what} ({got[0]['engine']}, no loader): "
                    + "; ".join(f"{b['processes']}: {b['tokens_per_s'] / 1e6:.2f} M tokens/s" for b in got)] if got else []
        if c["rounds"] > 1:
            out += [f"  {name(r)}: vs base per round " + ", ".join(f"{x:.2f}x" for x in r["vs_base_rounds"])
                    for r in entry["rows"][1:]]
        out += cores_lines(entry, m["cores"])
    out.append("(vs base: / the baseline in the same round; of bare: / as many bare engine processes side by side in "
               "the same round, tokenizing documents in memory; of read: / as many bare processes that read their row "
               "groups from parquet and tokenize them, the ceiling that counts reading; CPU of bare: tokens per worker CPU second / a bare process's tokens/s; busy: each "
               "worker's CPU time / the window's wall time; busy rate: a worker's tokens per second of its own "
               "reading + tokenizing)")
    return "\n".join(out)


def corpus_table(entry: dict) -> str:
    head = ("loader", "tokens/s", "vs base", "of bare", "of read", "CPU of bare", "busy per worker", "busy rate/worker",
            "trainer CPU us/batch", "trainer RSS MiB", "worker RSS MiB")
    rows = []
    for r in entry["rows"]:
        pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
        rows.append((name(r), f"{r['tokens_per_s'] / 1e6:.2f} M", f"{ratio(r, 'vs_base'):.2f}x",
                     pct(ratio(r, "of_bare")), pct(ratio(r, "of_bare_read")), pct(ratio(r, "cpu_of_bare")),
                     " ".join(f"{x:.0%}" for x in r.get("worker_busy_share") or []) or "-",
                     "-" if r.get("worker_busy_tokens_per_s") is None else f"{r['worker_busy_tokens_per_s'] / 1e6:.2f} M",
                     fmt(r["trainer_cpu_us_per_batch"]), fmt(r.get("trainer_peak_rss_mib")),
                     fmt(r.get("worker_peak_rss_mib"))))
    return results.table(head, rows)


def cores_lines(entry: dict, cores: int) -> list[str]:
    """Where the cores went over each loader row's window: workers, coordinator, trainer, the rest."""
    out = []
    for r in entry["rows"]:
        if r["kind"] != "shmloader" or r["workers"] > cores or r.get("coordinator_cpu_s") is None:
            continue
        share = lambda x: x / (r["wall_s"] * cores)  # noqa: E731
        used = r["worker_cpu_s"] + r["coordinator_cpu_s"] + r["trainer_cpu_s"]
        out.append(f"  where the {cores} cores went, {name(r)}: workers {share(r['worker_cpu_s']):.0%}, coordinator "
                   f"{share(r['coordinator_cpu_s']):.0%}, training process {share(r['trainer_cpu_s']):.0%}, "
                   f"the rest (idle, kernel, other processes) {1 - share(used):.0%}")
    return out


if __name__ == "__main__":
    sys.exit(main())
