"""How fast a rank finds its own place from another rank's state (docs/contract.md §3, shmloader/packing/count.py).

    python tools/bench_locate.py [--batches 2000] [--workers 2] [--packing concat]

Rank 0 of 2 runs `--batches` batches (B=16, T=2048 by default) and saves its state; rank 1 is
then built with that state and must count its own document lengths up to the same batch
count, once with no token cache (its workers tokenize, lengths only) and once with a warm
cache (lengths read from it). Reports seconds and tokens counted per second, next to one
single-thread tokenizer over the same documents (bench.py's `raw_rates`), and what that rate
means for a rank 10% into a billion tokens (100 M tokens to count); best fit reports batches
per second (it reads more tokens than its batches hold).
Default data: the stdlib demo corpus (as tools/bench.py), built into `--cache-dir`.
"""
import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (tools/bench.py: the demo corpus and the raw tokenizer rate)


def rank0_state(data, tok, args, **kw) -> dict:
    import shmloader

    with shmloader.ShmLoader(data, tok, args.batch_size, args.seq_len, "train", packing=args.packing,
                             num_workers=args.workers, device="cpu", rank=0, world_size=2, **kw) as loader:
        for _ in itertools.islice(loader, args.batches):
            pass
        return json.loads(json.dumps(loader.state_dict()))


def locate(data, tok, state, args, **kw) -> dict:
    import shmloader

    began = time.perf_counter()
    loader = shmloader.ShmLoader(data, tok, args.batch_size, args.seq_len, "train", packing=args.packing,
                                 num_workers=args.workers, device="cpu", rank=1, world_size=2,
                                 resume_state=state, **kw)
    seconds = time.perf_counter() - began
    with loader:
        next(loader)
    return {"seconds": seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=2000, help="batch count of rank 0's state")
    p.add_argument("--workers", type=int, default=2, help="worker processes per rank")
    p.add_argument("--packing", choices=["concat", "bos_bestfit"], default="concat")
    p.add_argument("-B", "--batch-size", type=int, default=16, help="rows per batch")
    p.add_argument("-T", "--seq-len", type=int, default=2048, help="tokens per row")
    p.add_argument("--data", default=None, help="directory of parquet shards (default: the demo corpus)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.pkl (default: the demo corpus's)")
    p.add_argument("--cache-dir", type=Path, default=Path("demo_data"), help="where the demo corpus is built")
    p.add_argument("--vocab-size", type=int, default=4096, help="demo tokenizer vocabulary (tokens)")
    p.add_argument("--raw-seconds", type=float, default=6.0, help="seconds of the bare tokenizer rate")
    args = p.parse_args(argv)
    data, tok = bench._resolve_data(args)
    import shmloader.data.source as source

    state = rank0_state(data, tok, args)
    tokens = state["batch"] * (args.batch_size * args.seq_len + 1)  # rank 1's stream, concat
    enc = bench._load_tiktoken(tok)
    raw = bench.raw_rates(source.split_files(source.list_files(data), "train"), enc, args.raw_seconds)
    single = raw["encode_to_numpy"]["tokens_per_s"]
    cold = locate(data, tok, state, args)
    with tempfile.TemporaryDirectory() as cache:
        import subprocess
        subprocess.run([sys.executable, str(Path(__file__).parent / "pretokenize.py"), "--data", data,
                        "--tokenizer", tok, "--cache-dir", cache, "--split", "train"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        warm = locate(data, tok, state, args, cache_dir=cache)
    print(f"rank 1 locating batch {state['batch']} of rank 0's state ({args.packing}, B={args.batch_size}, "
          f"T={args.seq_len}, {args.workers} workers); rank 0 reached epoch {state['epoch']}")
    for name, run in (("no cache (tokenizing)", cold), ("warm token cache", warm)):
        line = f"  {name:<22} {run['seconds']:6.2f} s  {state['batch'] / run['seconds']:8.0f} batches/s"
        if args.packing == "concat":  # best fit reads more tokens than its batches hold (cropping)
            rate = tokens / run["seconds"]
            line += (f"  {rate / 1e6:7.2f} M tokens counted/s = {rate / single:4.2f}x one bare tokenizer "
                     f"thread; 100 M tokens: {1e8 / rate:5.1f} s")
        print(line)
    print(f"  one bare tokenizer thread (encode_to_numpy): {single / 1e6:.2f} M tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
