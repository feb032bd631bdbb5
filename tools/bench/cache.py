"""The token cache: a loader on an empty cache, a restart on what it cached, and a warm cache,
next to the nanochat-style baseline.

    python tools/bench/cache.py                     # demo corpus, 1 worker
    python tools/bench/cache.py --quick --compare ../before

The baseline runs in a fresh process; then, per checkout, the cache rows run in order in one
fresh process, each its own loader (tools/bench/loaders.py says what a row measures), concat,
`--workers` workers:
- cold: an empty cache; it tokenizes and writes every row group it reads; its first epoch only
  (later epochs would read what it wrote);
- restart: a fresh loader on what the cold run cached (its first epoch);
- warm: a cache filled for the whole split beforehand (the checkout's own tools/pretokenize.py).
Like every row, tokens/s count from the first batch; what a restart still tokenizes shows in
its first batch (ms, the median of `--first-runs` fresh loaders) and in `worker_tokenized`
(tokens the workers tokenized instead of reading them from the cache).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, corpora, loaders, results  # noqa: E402
from tools.bench.results import fmt, plural  # noqa: E402

KINDS = ("cold", "restart", "warm")


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("cache", __doc__)
    p.add_argument("--workers", type=int, default=1, help="loader workers (processes; default 1)")
    loaders.add_shape_args(p)
    p.add_argument("--seconds", type=float, default=None,
                   help="wall time of each row (seconds; default 10, 3 with --quick; the cold row stops at its epoch's end)")
    p.add_argument("--first-runs", type=int, default=3,
                   help="fresh loaders timed to their first batch, restart and warm rows (loaders; default 3)")
    p.add_argument("--quick", action="store_true", help="3 s a row")
    corpora.add_args(p, many=False)
    children.add_compare_arg(p, "every cache row")
    results.add_json_arg(p, "cache")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (3.0 if args.quick else 10.0)
    if min(args.workers, args.batch_size, args.seq_len) < 1 or args.first_runs < 0 or args.seconds <= 0:
        p.error("--workers, --batch-size and --seq-len must be >= 1, --first-runs >= 0, --seconds > 0")
    corpora.check_args(p, args)
    children.check_compare(p, args)
    return args


def pretokenize(corpus, cache_dir: str, checkout, workers: int) -> None:
    """Fill `cache_dir` for the train split with the checkout's own tools/pretokenize.py."""
    proc = subprocess.run([sys.executable, os.path.join(checkout.root, "tools", "pretokenize.py"), "--data", corpus.data,
                           "--tokenizer", corpus.tokenizer, "--cache-dir", cache_dir, "--split", "train",
                           "--workers", str(workers)], env=children.env(checkout), cwd=checkout.cwd,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench: tools/pretokenize.py of {checkout.root} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def rows_child(cfg: dict) -> dict:
    """The cache rows, in order, in this fresh process."""
    import torch  # noqa: F401  (imported before any timing, as in a training script)

    from tools.bench import loaders

    dirs = {"cold": cfg["cold_dir"], "restart": cfg["cold_dir"], "warm": cfg["warm_dir"]}
    return {"rows": [loaders.row(dict(cfg, kind="shmloader", cache=kind, cache_dir=dirs[kind],
                                      first_runs=0 if kind == "cold" else cfg["first_runs"])) for kind in KINDS]}


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    [corpus] = corpora.resolve(args)
    cfg = {"data": corpus.data, "tokenizer": corpus.tokenizer, "files": corpora.split_files(corpus.data, "train"),
           "B": args.batch_size, "T": args.seq_len, "seconds": args.seconds, "workers": args.workers,
           "first_runs": args.first_runs}
    with children.checkouts(args.compare) as checkouts:
        print("the nanochat-style baseline ...", file=sys.stderr)
        rows = [dict(children.run("loaders:loader_child", dict(cfg, kind="baseline"), checkouts[-1]), label=None)]
        for i, ck in enumerate(checkouts):
            cold, warm = (os.path.join(ck.cwd, f"{kind}-{i}") for kind in ("cold", "warm"))
            print(f"filling a cache for the split{f' ({ck.label})' if ck.label else ''} ...", file=sys.stderr)
            pretokenize(corpus, warm, ck, args.workers)
            print(f"shmloader, {plural(args.workers, 'worker')}, cold, restart, warm cache"
                  f"{f' ({ck.label})' if ck.label else ''} ...", file=sys.stderr)
            got = children.run("cache:rows_child", dict(cfg, cold_dir=cold, warm_dir=warm), ck)
            rows += [dict(r, label=got["label"], shmloader=got["shmloader"]) for r in got["rows"]]
    for r in rows[1:]:
        r["vs_base"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
    figures = {"config": {"corpus": corpus.name, "data": corpus.data, "B": args.batch_size, "T": args.seq_len,
                          "workers": args.workers, "seconds": args.seconds, "first_runs": args.first_runs,
                          "compare": str(args.compare) if args.compare else None}, "rows": rows}
    results.publish(args.json, "cache", began, figures, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    out = [f"token cache, {c['corpus'] or c['data']} corpus, B={c['B']}, T={c['T']}, concat, {c['seconds']:g} s a row; "
           f"load average at the start {run['machine']['load_average']}"]
    head = ("loader", "tokens/s", "vs base", "trainer CPU us/batch", "first batch ms (median)", "tokens tokenized",
            "batches")
    rows = []
    for r in run["rows"]:
        who = "nanochat-style baseline" if r["kind"] == "baseline" else \
            f"shmloader, {plural(r['workers'], 'worker')}, {r['cache']} cache" + (f" ({r['label']})" if r.get("label") else "")
        rows.append((who, f"{r['tokens_per_s'] / 1e6:.2f} M", f"{r.get('vs_base', 1.0):.1f}x",
                     fmt(r["trainer_cpu_us_per_batch"]), fmt(results.median(r["first_batch_ms"])),
                     fmt(r.get("worker_tokenized")), f"{r['batches']:,}"))
    out.append(results.table(head, rows))
    out.append("(tokens tokenized: by the workers instead of read from the cache, over the row's reading)")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
