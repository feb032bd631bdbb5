"""One huge document among ordinary ones: the first batch's wall time and each worker's peak
RSS, with 1 and 2 workers.

    python tools/bench/long_document.py --mb 200
    python tools/bench/long_document.py --mb 200 --compare ../before

The data: the demo corpus's first shard (its text that ships with Python, ~1000-token
documents), with one document of `--mb` MiB (that text repeated) at row `--row` of its first
row group of 256 (row 60: the run's third piece), as the first of 3 files, read with the
demo's tokenizer; B=16, T=2048, engine "auto", concat. Built once into `--cache-dir`
(`long_document-<mb>-<row>/`, next to the demo corpus). Each row (worker count, and checkout with
`--compare`) in a fresh process: seconds from building the loader to its first batch, and
each worker's peak RSS (VmHWM) then.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, measure, results  # noqa: E402
from tools.bench.results import plural  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("long_document", __doc__)
    p.add_argument("--mb", type=int, default=200, help="the huge document's size (MiB; default 200)")
    p.add_argument("--row", type=int, default=60, help="its row in the first row group (row; default 60)")
    p.add_argument("--cache-dir", type=Path, default=Path("demo_data"),
                   help="where the demo corpus and this data are built and kept (directory; default ./demo_data)")
    p.add_argument("--vocab-size", type=int, default=4096, help="the demo tokenizer's size when built (tokens; default 4096)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], metavar="N",
                   help="worker counts (processes; default 1 2)")
    children.add_compare_arg(p)
    results.add_json_arg(p, "long_document")
    args = p.parse_args(argv)
    if args.mb < 1 or not 0 <= args.row < 256 or min(args.workers) < 1:
        p.error("--mb and --workers must be >= 1, --row in 0..255")
    children.check_compare(p, args)
    return args


def build(cache_dir: Path, vocab_size: int, mb: int, row: int) -> tuple[str, str]:
    """`(data directory, tokenizer)`: 3 files of the demo's first shard, the first with the huge document."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shmloader.demo import prepare_data

    demo = prepare_data(cache_dir, vocab_size, log=lambda m: print(m, file=sys.stderr))
    root = cache_dir / f"long_document-{mb}-{row}"
    if not root.exists():
        texts = pq.read_table(Path(demo.data_dir) / "shard_00000.parquet").column("text").to_pylist()
        base = "\n".join(texts)
        huge = (base * (mb * 2**20 // len(base) + 1))[:mb * 2**20]
        tmp = cache_dir / f"long_document-building-{os.getpid()}"
        tmp.mkdir(parents=True)
        for i in range(3):
            docs = texts[:row] + [huge] + texts[row:300] if i == 0 else texts[:300]
            pq.write_table(pa.table({"text": docs}), tmp / f"shard_{i:05d}.parquet", row_group_size=256)
        tmp.rename(root)
    return str(root.resolve()), str(Path(demo.tokenizer_path).resolve())


def first_batch_child(cfg: dict) -> dict:
    import torch  # noqa: F401  (imported before any timing)

    import shmloader

    began = time.perf_counter()
    with shmloader.ShmLoader(cfg["data"], cfg["tokenizer"], 16, 2048, num_workers=cfg["workers"], device="cpu") as loader:
        next(loader)
        first = time.perf_counter() - began
        peaks = [measure.vm_hwm_mib(pid) for pid in measure.loader_pids(loader)[0]]
    return {"workers": cfg["workers"], "first_batch_s": first, "worker_peak_rss_mib": peaks}


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    data, tok = build(args.cache_dir, args.vocab_size, args.mb, args.row)
    rows = []
    with children.checkouts(args.compare) as checkouts:
        for w in args.workers:
            for ck in checkouts:
                print(f"{args.mb} MiB document, {plural(w, 'worker')}{f' ({ck.label})' if ck.label else ''} ...",
                      file=sys.stderr)
                rows.append(children.run("long_document:first_batch_child",
                                         {"data": data, "tokenizer": tok, "workers": w}, ck))
    figures = {"config": {"mb": args.mb, "row": args.row, "workers": args.workers, "B": 16, "T": 2048,
                          "compare": str(args.compare) if args.compare else None}, "rows": rows}
    results.publish(args.json, "long_document", began, figures, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    out = [f"a {c['mb']} MiB document at row {c['row']} of the first row group, B={c['B']}, T={c['T']}; load average "
           f"at the start {run['machine']['load_average']}"]
    for r in run["rows"]:
        label = f" ({r['label']})" if r.get("label") else ""
        out.append(f"  {plural(r['workers'], 'worker')}{label}: first batch {r['first_batch_s']:.2f} s; worker peak RSS "
                   f"{', '.join(f'{m:,.0f}' for m in r['worker_peak_rss_mib'] if m is not None)} MiB")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
