"""One huge document among ordinary ones: the first batch's wall time and each worker's peak
RSS, with 1 and 2 workers.

    python tools/bench_long_document.py --mb 200            # this checkout
    python tools/bench_long_document.py --mb 200 --checkout DIR   # another checkout's shmloader

The data: the demo corpus's first shard (its text that ships with Python, ~1000-token
documents), with one document of `--mb` MiB (that text repeated) at row `--row` of its first
row group of 256 (row 60: the run's third piece), as the first of 3 files; B=16, T=2048,
engine "auto". Built once under `--out-dir`.
"""
import argparse
import os
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=200, help="the huge document's size (MiB; default 200)")
    p.add_argument("--row", type=int, default=60, help="its row in the first row group (default 60)")
    p.add_argument("--out-dir", default="/tmp/shmloader-long-document", help="where the data is built")
    p.add_argument("--checkout", default=None, help="import shmloader from this checkout instead")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts (default 1 2)")
    args = p.parse_args(argv)
    if args.checkout:
        sys.path.insert(0, args.checkout)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [args.checkout, os.environ.get("PYTHONPATH")]))
        os.environ["PYTHONSAFEPATH"] = "1"  # the forkserver's `python -c` would put the cwd first
    import pyarrow as pa
    import pyarrow.parquet as pq

    import shmloader

    demo, root = os.path.join(args.out_dir, "demo"), os.path.join(args.out_dir, f"data-{args.mb}-{args.row}")
    if not os.path.exists(root):
        from shmloader.demo import prepare_data  # this checkout's, whatever --checkout says

        prepare_data(demo, 4096, log=lambda *a: None)
        texts = pq.read_table(os.path.join(demo, "base_data", "shard_00000.parquet")).column("text").to_pylist()
        base = "\n".join(texts)
        huge = (base * (args.mb * 2**20 // len(base) + 1))[:args.mb * 2**20]
        os.makedirs(root)
        for i in range(3):
            docs = texts[:args.row] + [huge] + texts[args.row:300] if i == 0 else texts[:300]
            pq.write_table(pa.table({"text": docs}), os.path.join(root, f"shard_{i:05d}.parquet"), row_group_size=256)
    import torch  # noqa: F401  (imported before any timing)

    tok = os.path.join(demo, "tokenizer", "tokenizer.pkl")
    for w in args.workers:
        began = time.perf_counter()
        with shmloader.ShmLoader(root, tok, 16, 2048, num_workers=w, device="cpu") as loader:
            next(loader)
            first = time.perf_counter() - began
            peaks = []
            for proc in loader.debug().workers:
                with open(f"/proc/{proc.pid}/status") as f:
                    peaks.append(int(next(line for line in f if line.startswith("VmHWM")).split()[1]) / 1024)
        print(f"{args.mb} MiB document at row {args.row}, {w} worker{'s' * (w > 1)}: first batch {first:.2f} s; "
              f"worker peak RSS {', '.join(f'{m:,.0f}' for m in peaks)} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
