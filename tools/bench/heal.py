"""What a heal costs the training loop: the longest `next()` around a killed worker and a killed
coordinator (SIGKILL), and around a stopped worker (SIGSTOP, healed after `stall_s`).

    python tools/bench/heal.py                               # demo corpus, 2 workers, concat
    python tools/bench/heal.py --faults 3 --packing bos_bestfit

For each kind of fault, `--faults` times, in this process: a loader is read as fast as it goes
(a consumer that never waits: the workers are the bottleneck) for `--settle` s, then the child
is signalled and the loader read for `--after` s more. Per kind: the longest `next()` after the
signal (the heal: the death seen, every child started again from the state, the first batch of
the new run) against the longest `next()` of the same loader in the `--settle` s before it (its
start-up left out), medians and maxima over the faults; and whether every batch is the one an
uninterrupted loader yields (the stream is checked, not assumed: the run exits 1 if not).
Beside them, the first batch of a fresh loader of the same shape, in this process (its
forkserver already running: the first loader of a process also pays its start), median of
`--faults`: what a heal is measured against.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import corpora, loaders, results  # noqa: E402
from tools.bench.results import plural  # noqa: E402

KINDS = ("worker-SIGKILL", "coordinator-SIGKILL", "worker-SIGSTOP")


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("heal", __doc__)
    p.add_argument("--workers", type=int, default=2, help="loader workers (processes; default 2)")
    loaders.add_shape_args(p)
    p.add_argument("--packing", choices=("concat", "bos_bestfit"), default="concat", help="packing (default concat)")
    p.add_argument("--faults", type=int, default=5, help="faults of each kind (faults; default 5)")
    p.add_argument("--settle", type=float, default=2.0, help="reading before each fault (seconds; default 2)")
    p.add_argument("--after", type=float, default=3.0, help="reading after each fault (seconds; default 3)")
    p.add_argument("--stall-s", type=float, default=1.0, help="the loader's stall_s, for SIGSTOP (seconds; default 1)")
    corpora.add_args(p, many=False)
    results.add_json_arg(p, "heal")
    args = p.parse_args(argv)
    if min(args.workers, args.faults, args.batch_size, args.seq_len) < 1 or min(args.settle, args.after) <= 0:
        p.error("--workers, --faults, --batch-size and --seq-len must be >= 1, --settle and --after > 0")
    corpora.check_args(p, args)
    return args


def _flat(x, y):
    import torch

    return torch.cat([x.reshape(-1), y.reshape(-1)]).clone()


HEAL_WAIT_S = 60.0  # the longest a fault's loader is read for, waiting for its heal


def one_fault(make, kind: str, settle: float, after: float) -> dict:
    """One loader: read for `settle` s, signal a child (`kind`), read for `after` s and on until
    the loader has healed (at most `HEAL_WAIT_S`: the ring's ready batches may outlast `after` on a
    loaded machine); the longest next() before and after, and the stream checked against a loader
    without the fault."""
    import torch

    loader, got = make(), []
    try:
        got.append(_flat(*next(loader)))  # the start-up, not a step
        before, t0 = 0.0, time.monotonic()
        while time.monotonic() - t0 < settle:
            c = time.perf_counter()
            got.append(_flat(*next(loader)))
            before = max(before, time.perf_counter() - c)
        who, sig = kind.split("-")
        d = loader.debug()
        os.kill((d.coordinator if who == "coordinator" else d.workers[0]).pid, getattr(signal, sig))
        longest, t1 = 0.0, time.monotonic()
        while time.monotonic() - t1 < after or (loader.stats()["heals"] == 0 and time.monotonic() - t1 < HEAL_WAIT_S):
            c = time.perf_counter()
            got.append(_flat(*next(loader)))
            longest = max(longest, time.perf_counter() - c)
        heals = loader.stats()["heals"]
    finally:
        loader.close()
    with make() as ref:  # the same stream without a fault
        same = all(torch.equal(a, _flat(x, y)) for a, (x, y) in zip(got, ref))
    return {"kind": kind, "before_ms": before * 1e3, "after_ms": longest * 1e3, "heals": heals,
            "batches": len(got), "same_stream": same}


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    import shmloader

    [corpus] = corpora.resolve(args)
    make = lambda: shmloader.ShmLoader(corpus.data, corpus.tokenizer, args.batch_size, args.seq_len, "train",  # noqa: E731
                                       packing=args.packing, num_workers=args.workers, device="cpu",
                                       max_restarts=1000, stall_s=args.stall_s, idle_release_s=0)
    firsts = []
    for _ in range(args.faults):
        t = time.perf_counter()
        with make() as fresh:
            next(fresh)
            firsts.append((time.perf_counter() - t) * 1e3)
    faults = []
    for kind in KINDS:
        for i in range(args.faults):
            r = one_fault(make, kind, args.settle, args.after)
            print(f"{kind} {i + 1}/{args.faults}: longest next() {r['after_ms']:.0f} ms after the fault, "
                  f"{r['before_ms']:.0f} ms before; {r['heals']} heal(s); stream "
                  f"{'the same' if r['same_stream'] else 'DIFFERENT'} over {r['batches']} batches", file=sys.stderr)
            faults.append(r)
    figures = {"config": {"corpus": corpus.name, "data": corpus.data, "packing": args.packing, "workers": args.workers,
                          "B": args.batch_size, "T": args.seq_len, "faults": args.faults, "settle_s": args.settle,
                          "after_s": args.after, "stall_s": args.stall_s},
               "kinds": [summary(kind, [r for r in faults if r["kind"] == kind]) for kind in KINDS], "faults": faults,
               "fresh_first_batch_ms": {"median": statistics.median(firsts), "max": max(firsts), "each": firsts}}
    results.publish(args.json, "heal", began, figures, argv, report)
    return 0 if all(r["same_stream"] and r["heals"] == 1 for r in faults) else 1


def summary(kind: str, rows: list[dict]) -> dict:
    a, b = [r["after_ms"] for r in rows], [r["before_ms"] for r in rows]
    return {"kind": kind, "after_ms_median": statistics.median(a), "after_ms_max": max(a),
            "before_ms_median": statistics.median(b), "before_ms_max": max(b),
            "heals": sum(r["heals"] for r in rows), "faults": len(rows), "same_stream": sum(r["same_stream"] for r in rows)}


def report(run: dict) -> str:
    c = run["config"]
    out = [f"heal cost, {c['corpus'] or c['data']} corpus, {c['packing']}, {plural(c['workers'], 'worker')}, B={c['B']}, "
           f"T={c['T']}, {plural(c['faults'], 'fault')} of each kind (stall_s={c['stall_s']:g} for SIGSTOP): the longest next() after the fault "
           f"and before it (ms, median / max over the faults); load average at the start {run['machine']['load_average']}"]
    first = run.get("fresh_first_batch_ms")
    head = ("fault", "after", "before", "after / fresh first batch", "heals", "stream the same")
    out.append(results.table(head, [(k["kind"], f"{k['after_ms_median']:,.0f} / {k['after_ms_max']:,.0f}",
                                     f"{k['before_ms_median']:,.0f} / {k['before_ms_max']:,.0f}",
                                     f"{k['after_ms_median'] / first['median']:.2f}x" if first else "-",
                                     f"{k['heals']}/{k['faults']}", f"{k['same_stream']}/{k['faults']}")
                                    for k in run["kinds"]]))
    if first:
        out.append(f"a fresh loader's first batch (its forkserver running): {first['median']:,.0f} ms median, "
                   f"{first['max']:,.0f} ms at most")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
