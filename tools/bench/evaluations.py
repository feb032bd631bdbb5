"""First batch as nanochat's evaluations pay it: base_train's pattern, a train loader running
and a new val loader built at every evaluation, next to nanochat's own loader.

    python tools/bench/evaluations.py                                  # demo corpus, 2 workers
    python tools/bench/evaluations.py --corpus demo nanochat skewed --packings bos_bestfit --repeat 2
    python tools/bench/evaluations.py --compare ../before
    python tools/bench/evaluations.py --head-start both    # what the head start earns: with and without
    python tools/bench/evaluations.py --data-as both --head-start both --packings concat  # a mixture of one

In one fresh process per row (torch imported first), as base_train does: a train loader of
the row's kind is built and its first batch taken (step 0: the process's first loader, timed
from the call too); then `--loaders` evaluations, each
building a new val loader and assigning it over the last one (so dropping the last one is part
of the evaluation's time), timed from the call to its first batch, `--take` batches taken;
between evaluations `--gap-ms` of training steps (`--step-ms` of busy work and a train batch
each; after the first step the garbage collector is collected, frozen and disabled, as
base_train does), after which the resident memory of the trainer and all its descendants is
read (RSS summed, which counts the pages they share in each, and PSS, which splits them).
Rows: nanochat's own loader (the nanochat-style in-process loaders, its train loader too),
then shmloader through the drop-ins (the tokenizer an object, as nanochat passes it) with each
`--workers` count (and each checkout with `--compare`), per packing (best fit: buffer 1000,
128 documents a chunk, as nanochat's). Every evaluation's time (the median over rounds of the
k-th loader's) is put next to nanochat's own loader's at the same evaluation. `--head-start`:
shmloader's rows with its head start ("on", the default), without ("off", `head_start=False`), or
both, in turn. `--data-as`: shmloader's rows given the corpus as its directory ("source", the
default), as a mixture of one source (`Mixture({"x": data}, {"x": 1})`, "mixture"), or both, in
turn. `--shuffle`: shmloader's rows read shuffled (`shuffle=True`, `other_rank="exact"`;
nanochat's own loader reads in order).
"""
from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import baseline, children, corpora, loaders, measure, results  # noqa: E402
from tools.bench.results import fmt, plural  # noqa: E402

PACKINGS = ("concat", "bos_bestfit")


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("evaluations", __doc__)
    p.add_argument("--workers", type=int, nargs="+", default=[2], metavar="N",
                   help="shmloader worker counts (processes; default 2)")
    p.add_argument("--packings", nargs="+", choices=PACKINGS, default=list(PACKINGS),
                   help="packings of the train and val loaders (default both; nanochat's val loader is best fit)")
    loaders.add_shape_args(p)
    p.add_argument("--loaders", type=int, default=8, help="evaluations, a new val loader each (loaders; default 8)")
    p.add_argument("--take", type=int, default=4, help="batches taken from each val loader (batches; default 4)")
    p.add_argument("--gap-ms", type=float, default=500.0,
                   help="training steps between evaluations, after which the memory is read (ms; default 500)")
    p.add_argument("--step-ms", type=float, default=50.0, help="busy work per training step (ms; default 50)")
    p.add_argument("--idle-release-s", type=float, default=None, metavar="S",
                   help="the val loaders' idle_release_s (s; default the loader's, 30 for val): with --gap-ms longer, "
                        "the memory between evaluations is read after the idle val loader let its processes go")
    p.add_argument("--repeat", type=int, default=1, help="rounds, every row once per round (rounds; default 1)")
    p.add_argument("--head-start", choices=("on", "off", "both"), default="on",
                   help="shmloader's rows with its head start, without it (head_start=False), or both (default on)")
    p.add_argument("--data-as", choices=("source", "mixture", "both"), default="source",
                   help="shmloader's rows given the corpus as its directory, as a mixture of one source, or both "
                        "(default source)")
    p.add_argument("--shuffle", action="store_true",
                   help="shmloader's rows read shuffled (shuffle=True, other_rank='exact'; default: the files' order)")
    corpora.add_args(p)
    children.add_compare_arg(p)
    results.add_json_arg(p, "evaluations")
    args = p.parse_args(argv)
    if min(args.workers + [args.batch_size, args.seq_len, args.loaders, args.take, args.repeat]) < 1:
        p.error("--workers, --batch-size, --seq-len, --loaders, --take and --repeat must be >= 1")
    if min(args.gap_ms, args.step_ms) < 0:
        p.error("--gap-ms and --step-ms must be >= 0")
    corpora.check_args(p, args)
    children.check_compare(p, args)
    return args


def evaluations(train, val, n: int, take: int, gap_s: float, step_s: float) -> dict:
    """base_train's pattern: `train()` built and its first batch taken, then `n` evaluations of
    `val()` (each assigned over the last), `gap_s` of training steps after each; ms per
    evaluation from the call to its first batch (and the train loader's, the process's first
    loader), and the memory after each gap."""
    import numpy as np

    times, memory, gen, buf = [], [], None, np.zeros(1 << 17)
    started = time.perf_counter()
    trainer = train()
    try:
        next(trainer)
        first_train_ms = (time.perf_counter() - started) * 1e3  # the process's first loader
        for i in range(n):
            started = time.perf_counter()
            gen = val()  # the previous val loader, still referenced, is dropped here
            next(gen)
            times.append((time.perf_counter() - started) * 1e3)
            for _ in range(take - 1):
                next(gen)
            end = time.perf_counter() + gap_s
            while True:
                measure.busy_work(step_s, buf)
                next(trainer)
                if i == 0 and gc.isenabled():  # base_train, after its first step
                    gc.collect()
                    gc.freeze()
                    gc.disable()
                if time.perf_counter() >= end:
                    break
            memory.append(measure.tree_memory())
    finally:
        for it in (gen, trainer):
            if it is not None:
                it.close()
    return {"train_first_ms": first_train_ms, "per_evaluation_ms": times, "memory_between": memory}


def evaluations_child(cfg: dict) -> dict:
    import torch  # noqa: F401  (imported before any timing, as in a training script)

    B, T, bestfit = cfg["B"], cfg["T"], cfg["packing"] == "bos_bestfit"
    enc = baseline.load_tiktoken(cfg["tokenizer"])  # nanochat passes its tokenizer object
    if cfg["kind"] == "baseline":
        loader = lambda split: baseline.loader(corpora.split_files(cfg["data"], split), enc, B, T, cfg["packing"])  # noqa: E731
    else:
        from shmloader import nanochat

        from shmloader import Mixture

        data = Mixture({"x": cfg["data"]}, {"x": 1}) if cfg.get("mixture") else cfg["data"]
        opts = dict(device="cpu", data=data, num_workers=cfg["workers"], head_start=cfg.get("head_start", True),
                    **(dict(shuffle=True, other_rank="exact") if cfg.get("shuffle") else {}))
        fit = dict(buffer_size=1000, tokenizer_batch_size=128)

        def loader(split):
            kw = dict(opts, **({"idle_release_s": cfg["idle_release_s"]}
                               if split == "val" and cfg.get("idle_release_s") is not None else {}))
            if split == "train":  # as base_train: its train loader yields states
                return (nanochat.tokenizing_distributed_data_loader_with_state_bos_bestfit(enc, B, T, split, **fit, **kw)
                        if bestfit else nanochat.tokenizing_distributed_data_loader_with_state(B, T, split, tokenizer=enc, **kw))
            return (nanochat.tokenizing_distributed_data_loader_bos_bestfit(enc, B, T, split, **fit, **kw)
                    if bestfit else nanochat.tokenizing_distributed_data_loader(B, T, split, tokenizer=enc, **kw))
    out = evaluations(lambda: loader("train"), lambda: loader("val"), cfg["loaders"], cfg["take"],
                      cfg["gap_ms"] / 1e3, cfg["step_ms"] / 1e3)
    return dict(out, kind=cfg["kind"], packing=cfg["packing"], workers=cfg.get("workers"),
                head_start=cfg.get("head_start", True), mixture=cfg.get("mixture", False))


def one_round(args, corpus, checkouts, step: str) -> list[dict]:
    cfg = {"data": corpus.data, "tokenizer": corpus.tokenizer, "B": args.batch_size, "T": args.seq_len,
           "loaders": args.loaders, "take": args.take, "gap_ms": args.gap_ms, "step_ms": args.step_ms,
           "idle_release_s": args.idle_release_s, "shuffle": args.shuffle}
    rows = []
    for packing in args.packings:
        configs = [(dict(kind="baseline"), checkouts[-1], "nanochat's own loader")]
        heads = {"on": (True,), "off": (False,), "both": (True, False)}[args.head_start]
        mixed = {"source": (False,), "mixture": (True,), "both": (False, True)}[args.data_as]
        configs += [(dict(kind="shmloader", workers=w, head_start=h, mixture=m), ck,
                     f"shmloader, {plural(w, 'worker')}" + (", a mixture of one" if m else "")
                     + ("" if h else ", head_start=False") + (f" ({ck.label})" if ck.label else ""))
                    for w in args.workers for m in mixed for h in heads for ck in checkouts]
        for extra, ck, what in configs:
            print(f"{step}evaluations, {what}, {packing} ({corpus.name or corpus.data}) ...", file=sys.stderr)
            row = children.run("evaluations:evaluations_child", dict(cfg, packing=packing, **extra), ck)
            rows.append(dict(row, label=None) if extra["kind"] == "baseline" else row)
    return rows


def summarise(rounds: list[list[dict]]) -> list[dict]:
    """Per row: each evaluation's median over rounds, the memory between evaluations, and the
    ratio to nanochat's own loader's at every evaluation."""
    rows = []
    for i in range(len(rounds[0])):
        runs = [rnd[i] for rnd in rounds]
        memory = [m for r in runs for m in r["memory_between"]]
        pss = [m["pss_mib"] for m in memory]
        rows.append(dict({k: v for k, v in runs[0].items()
                          if k not in ("train_first_ms", "per_evaluation_ms", "memory_between")},
                         train_first_ms=results.median(r["train_first_ms"] for r in runs),
                         train_first_ms_rounds=[r["train_first_ms"] for r in runs],
                         per_evaluation_ms=[results.median(ts) for ts in zip(*(r["per_evaluation_ms"] for r in runs))],
                         per_evaluation_ms_rounds=[r["per_evaluation_ms"] for r in runs],
                         memory_between_rounds=[r["memory_between"] for r in runs],
                         rss_between_mib_median=results.median(m["rss_mib"] for m in memory),
                         pss_between_mib_median=None if None in pss else results.median(pss),
                         processes_between=max(m["processes"] for m in memory)))
    base_of = {r["packing"]: r for r in rows if r["kind"] == "baseline"}
    for r in rows:
        base = base_of[r["packing"]]["per_evaluation_ms"]
        r["vs_nanochat_per_evaluation"] = [a / b for a, b in zip(r["per_evaluation_ms"], base)]
        r["vs_nanochat_train_first"] = r["train_first_ms"] / base_of[r["packing"]]["train_first_ms"]
    return rows


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    found = corpora.resolve(args)
    per_corpus = children.in_rounds(args.repeat, found, args.compare, functools.partial(one_round, args))
    figures = {"config": {"B": args.batch_size, "T": args.seq_len, "loaders": args.loaders, "take": args.take,
                          "gap_ms": args.gap_ms, "step_ms": args.step_ms, "idle_release_s": args.idle_release_s,
                          "shuffle": args.shuffle,
                          "rounds": args.repeat, "cores": len(os.sched_getaffinity(0)),
                          "compare": str(args.compare) if args.compare else None},
               "corpora": [{"corpus": c.name, "data": c.data, "rows": summarise(rounds)}
                           for c, rounds in zip(found, per_corpus)]}
    results.publish(args.json, "evaluations", began, figures, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    out = [f"nanochat's evaluations, base_train's pattern: a train loader running, {c['loaders']} evaluations each "
           f"building a new val loader over the last, {c['take']} batches each, {c['gap_ms']:g} ms of training steps "
           f"({c['step_ms']:g} ms of busy work and a train batch) between them; B={c['B']}, T={c['T']}; ms from the "
           f"call to the first val batch (and to the train loader's first, the process's first loader)" + (f", the median of {c['rounds']} rounds" if c["rounds"] > 1 else "")
           + f"; load average at the start {run['machine']['load_average']}"]
    head = ("corpus", "loader", "packing", "train loader's first (ms)", "per evaluation (ms)",
            "/ nanochat's own: train's first, evaluations' worst", "MiB between (RSS sum / PSS)")
    rows = []
    for e in run["corpora"]:
        for r in e["rows"]:
            who = "nanochat's own loader" if r["kind"] == "baseline" else \
                f"shmloader, {plural(r['workers'], 'worker')}" + (", a mixture of one" if r.get("mixture") else "") \
                + ("" if r.get("head_start", True) else ", head_start=False") \
                + (f" ({r['label']})" if r.get("label") else "")
            rows.append((e["corpus"] or "data", who, r["packing"], f"{r['train_first_ms']:.0f}",
                         " ".join(f"{t:.0f}" for t in r["per_evaluation_ms"]),
                         "-" if r["kind"] == "baseline" else
                         f"{r['vs_nanochat_train_first']:.2f}x, {max(r['vs_nanochat_per_evaluation']):.2f}x",
                         f"{fmt(r['rss_between_mib_median'])} / {fmt(r['pss_between_mib_median'])} "
                         f"({plural(r['processes_between'], 'process', 'processes')})"))
    out.append(results.table(head, rows))
    out.append("(MiB between evaluations: the trainer and all its descendants after each gap, the last val loader "
               "still referenced, the median over evaluations)")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
