"""What an elastic resume costs: the time from building a loader at a new world size, given rank
0's state of the old one, to its first batch, with and without a warm token cache; and what the
resume check costs the coordinator per batch.

    python tools/bench_elastic.py --cache-dir /tmp/bq                 # 2 -> 3 after 10% of an epoch
    python tools/bench_elastic.py --docs 40000 --old-world 4 --new-world 8 --fraction 0.5

The corpus is nanochat's geometry (tools/bench.py's `nanochat` corpus, `--docs` documents). Old
rank 0 reads `--fraction` of its share of the epoch and saves its state. Then, `--repeat` times
each, side by side:
- a resume at the old world size from that state (the reference: no replay);
- new rank 0 of `--new-world` given it (it replays the other old ranks' streams: the workers
  tokenize them),
- the same with the token cache filled first (`tools/pretokenize.py`: the workers read the
  lengths from it).
Reported: seconds to the first batch, medians and all. Numbers are this machine's; compare the
rows of one run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", type=Path, default=Path("demo_data"),
                   help="where the corpus, its tokenizer and the token cache are made (default demo_data)")
    p.add_argument("--docs", type=int, default=12288, help="documents of the nanochat-geometry corpus (default 12288)")
    p.add_argument("--files", type=int, default=4, help="its parquet files (default 4; the last is val)")
    p.add_argument("--old-world", type=int, default=2, help="W, the world size the state is saved at (default 2)")
    p.add_argument("--new-world", type=int, default=3, help="W2, the world size it resumes at (default 3)")
    p.add_argument("--fraction", type=float, default=0.1, help="of old rank 0's share of the epoch read before "
                                                               "the save (default 0.1)")
    p.add_argument("--packing", choices=("concat", "bos_bestfit"), default="concat")
    p.add_argument("--workers", type=int, default=2, help="loader workers (default 2)")
    p.add_argument("--batch-size", type=int, default=16, help="B (default 16)")
    p.add_argument("--seq-len", type=int, default=2048, help="T (default 2048)")
    p.add_argument("--repeat", type=int, default=2, help="rounds of each measurement (default 2)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    return p.parse_args(argv)


def check_cost(slot_tokens: int, n: int = 2000) -> float:
    """Microseconds of `batch_check` on one slot's window (the coordinator's, per batch)."""
    import numpy as np

    from shmloader.ipc.ring import batch_check

    window = np.random.default_rng(0).integers(0, 65536, slot_tokens, dtype=np.int64)
    batch_check(window)
    t0 = time.perf_counter()
    for _ in range(n):
        batch_check(window)
    return (time.perf_counter() - t0) / n * 1e6


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np  # noqa: F401  (imported before any timing)
    import torch  # noqa: F401

    import shmloader
    from shmloader.demo import load_encoding
    from tools import bench

    data, tok_path = bench.resolve_corpora(argparse.Namespace(
        corpus=["nanochat"], data=None, tokenizer=None, cache_dir=args.cache_dir, nanochat_docs=args.docs,
        skewed_docs=6000, corpus_files=args.files, vocab_size=4096))[0][1:]
    enc = load_encoding(tok_path)
    B, T, W, W2 = args.batch_size, args.seq_len, args.old_world, args.new_world

    def loader(rank, world, **kw):
        return shmloader.ShmLoader(data, enc, B, T, packing=args.packing, num_workers=args.workers, device="cpu",
                                   rank=rank, world_size=world, timeout=600, **kw)

    # old rank 0's share of the epoch, in batches: its tokens, counted by a cache-filling pass
    cache = args.cache_dir / "elastic_cache"
    shutil.rmtree(cache, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, str(Path(__file__).parent / "pretokenize.py"), "--data", data, "--tokenizer",
                    tok_path, "--cache-dir", str(cache), "--split", "train"], check=True, capture_output=True)
    pretokenize_s = time.perf_counter() - started
    from shmloader.data import cache as cachemod, source, tokenizer as tokmod
    files = source.split_files(source.list_files(data), "train")
    spec = tokmod.resolve(enc, None)
    tc = cachemod.TokenCache(str(cache), spec.fingerprint, spec.n_vocab)
    counts = [source.ParquetSource([f]).row_counts(0) for f in files]
    epoch_tokens = sum(int(tc.load(f, g)[1].size) for f, c in zip(files, counts) for g in range(len(c)))
    share = sum(int(tc.load(f, g)[1].size) for f, c in zip(files, counts) for g in range(0, len(c), W))
    window = B * T + 1 if args.packing == "concat" else B * T
    n = max(1, int(share * args.fraction / window))
    with loader(0, W) as old:
        for _ in range(n):
            next(old)
        state = json.loads(json.dumps(old.state_dict()))
    print(f"corpus: {data} ({len(files)} train files, {epoch_tokens / 1e6:.1f} M tokens an epoch); "
          f"old rank 0 of {W} read {n} batches ({n * window / 1e6:.2f} M tokens, {args.fraction:.0%} of its share); "
          f"the cache was filled in {pretokenize_s:.1f} s")
    rows = {"same world size (no replay)": [], f"{W} -> {W2}, no cache (tokenize)": [],
            f"{W} -> {W2}, token cache (tools/pretokenize.py)": []}
    for _ in range(args.repeat):
        rows["same world size (no replay)"].append(bench.first_batch_s(lambda: loader(0, W, resume_state=state)))
        rows[f"{W} -> {W2}, no cache (tokenize)"].append(bench.first_batch_s(lambda: loader(0, W2, resume_state=state)))
        rows[f"{W} -> {W2}, token cache (tools/pretokenize.py)"].append(
            bench.first_batch_s(lambda: loader(0, W2, resume_state=state, cache_dir=str(cache))))
    slot = B * T + 1 if args.packing == "concat" else 2 * B * T  # the packing's slot: inputs and targets
    us = check_cost(slot)
    print(f"\nseconds from building new rank 0 to its first batch ({args.packing}, {args.workers} workers, "
          f"B={B}, T={T}), median of {args.repeat} (all):")
    for name, xs in rows.items():
        print(f"  {name:50s} {statistics.median(xs):6.2f} s  ({', '.join(f'{x:.2f}' for x in xs)})")
    print(f"\nresume check: batch_check of a {slot:,}-token slot, {us:.1f} us (the coordinator's, per batch; "
          f"{us * epoch_tokens / window / 1e3:.0f} ms of one core for this {epoch_tokens / 1e6:.0f} M-token epoch)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "epoch_tokens": epoch_tokens,
                                         "old_batches": n, "pretokenize_s": pretokenize_s, "first_batch_s": rows,
                                         "check_us": us, "cores": os.cpu_count()}, indent=2))
    shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
