"""Two loaders reading at the same time: their workers' tokens per CPU second, as a ratio per round.

    python tools/bench/pairs.py --compare /tmp/before --workers 2 4 8     # best fit and concat, after / before
    python tools/bench/pairs.py --packings-side-by-side --workers 2 4 8   # best fit / concat, this checkout

On a shared machine two loaders measured one after the other meet different loads; two read at
the same time meet the same one, so the ratio of their workers' tokens per CPU second holds
where the absolute figures move by 10% and more. Each loader runs in a fresh process
(tools/bench/children.py): a `ShmLoader` over the corpus (nanochat's by default, B=32, T=2048),
read as fast as it goes for `--warmup` seconds after its first batch, then for `--seconds`:
`stats()["tokens_read"]` over the window / its workers' user + system CPU seconds over the
window (from /proc). The two of a pair are started together; which one is started first
alternates by round. `--compare DIR`: for each packing and worker count, this checkout's
loader beside DIR's (concat is the control where its code did not change); without it, or
with `--packings-side-by-side`, this checkout's best fit beside its concat.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, corpora  # noqa: E402

PACKINGS = ("bos_bestfit", "concat")


def one_loader(cfg: dict) -> dict:
    """A loader of `cfg` read for `warmup` then `seconds`: its workers' tokens per CPU second."""
    import torch  # noqa: F401  (the training process's own import, before the loader)

    from shmloader import ShmLoader
    from tools.bench import measure

    with ShmLoader(cfg["data"], cfg["tokenizer"], cfg["B"], cfg["T"], "train", num_workers=cfg["workers"],
                   device="cpu", packing=cfg["packing"]) as it:
        next(it)
        end = time.perf_counter() + cfg["warmup"]
        while time.perf_counter() < end:
            next(it)
        workers, _ = measure.loader_pids(it)
        read0, cpu0, t0 = it.stats()["tokens_read"], measure.cpu_of(workers), time.perf_counter()
        while time.perf_counter() - t0 < cfg["seconds"]:
            next(it)
        read, cpu, wall = it.stats()["tokens_read"] - read0, measure.cpu_of(workers) - cpu0, time.perf_counter() - t0
    return {"tokens_per_cpu_s": read / cpu, "tokens_per_s": read / wall, "worker_cores": cpu / wall}


def pair(a: tuple, b: tuple, cfg: dict, first_a: bool) -> tuple[dict, dict]:
    """Loaders `a` and `b` (each `(checkout, packing)`) at the same time; `first_a`: a starts first."""
    order = [(a, "a"), (b, "b")] if first_a else [(b, "b"), (a, "a")]
    procs = {key: children.start("pairs:one_loader", dict(cfg, packing=packing), ck) for (ck, packing), key in order}
    try:
        return children.result(procs["a"], f"{a[1]} loader"), children.result(procs["b"], f"{b[1]} loader")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            proc.stdout.close()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], prog="python tools/bench/pairs.py")
    p.add_argument("--workers", type=int, nargs="+", default=[2], metavar="N", help="worker counts (default 2)")
    p.add_argument("--packings", nargs="+", choices=PACKINGS, default=list(PACKINGS),
                   help="packings compared across checkouts with --compare (default both)")
    p.add_argument("--packings-side-by-side", action="store_true",
                   help="also (without --compare: only) this checkout's best fit beside its concat")
    p.add_argument("--batch-size", type=int, default=32, help="B, rows per batch (rows; default 32)")
    p.add_argument("--seq-len", type=int, default=2048, help="T, tokens per row (tokens; default 2048)")
    p.add_argument("--warmup", type=float, default=8.0, help="reading before the window (seconds; default 8)")
    p.add_argument("--seconds", type=float, default=15.0, help="the window (seconds; default 15)")
    p.add_argument("--repeat", type=int, default=2, help="rounds (default 2)")
    corpora.add_args(p, many=False, default="nanochat")
    children.add_compare_arg(p, "each packing's loader")
    args = p.parse_args(argv)
    corpora.check_args(p, args)
    children.check_compare(p, args)
    if min(args.workers + [args.repeat]) < 1 or args.seconds <= 0 or args.warmup < 0:
        p.error("--workers and --repeat must be >= 1, --seconds > 0, --warmup >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    corpus = corpora.resolve(args)[0]
    cfg = {"data": corpus.data, "tokenizer": corpus.tokenizer, "B": args.batch_size, "T": args.seq_len,
           "warmup": args.warmup, "seconds": args.seconds}
    rows = {}
    with children.checkouts(args.compare) as cks:
        ours = cks[-1]
        pairs = [(f"{p}, this checkout / before", (ours, p), (cks[0], p))
                 for p in args.packings] if args.compare is not None else []
        if args.packings_side_by_side or args.compare is None:
            pairs.append(("best fit / concat, this checkout", (ours, "bos_bestfit"), (ours, "concat")))
        for i in range(args.repeat):
            for workers in args.workers:
                for name, a, b in pairs:
                    load = os.getloadavg()[0]
                    ra, rb = pair(a, b, dict(cfg, workers=workers), first_a=i % 2 == 0)
                    rows.setdefault((name, workers), []).append((ra, rb, load))
                    print(f"round {i + 1}, {workers} workers, {name}: {ra['tokens_per_cpu_s'] / rb['tokens_per_cpu_s']:.3f} "
                          f"({ra['tokens_per_cpu_s'] / 1e6:.2f} / {rb['tokens_per_cpu_s'] / 1e6:.2f} M tokens per worker "
                          f"CPU s; {ra['tokens_per_s'] / 1e6:.2f} / {rb['tokens_per_s'] / 1e6:.2f} M tokens/s; "
                          f"load {load:.1f})", file=sys.stderr, flush=True)
    print(f"workers' tokens per CPU second, the first loader of each pair / the second, per round "
          f"(B={args.batch_size}, T={args.seq_len}, {args.warmup:g} s then {args.seconds:g} s; load average at each pair's start)")
    for (name, workers), rs in rows.items():
        print(f"  {name}, {workers} workers: " + "  ".join(
            f"{a['tokens_per_cpu_s'] / b['tokens_per_cpu_s']:.3f} (load {load:.1f})" for a, b, load in rs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
