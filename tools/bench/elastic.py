"""A resume at another rank or another world size: what a rank pays before its first batch to
find its place from rank 0's state, with and without the token cache; and what the resume
check costs the coordinator per batch.

    python tools/bench/elastic.py                                    # nanochat corpus, 2 -> 3, 150 batches
    python tools/bench/elastic.py --nanochat-docs 102400 --repeat 2 --packing bos_bestfit
    python tools/bench/elastic.py --corpus demo --batches 1000 --new-world 4

Old rank 0 of `--old-world` reads `--batches` batches and saves its state (through JSON). Then,
`--repeat` times each, in this process, side by side:
- rank 0 of the old world given that state: the reference (no replay, nothing to find);
- rank 1 of the old world given rank 0's state: it counts its own document lengths up to the
  same batch count (its workers tokenize, lengths only);
- rank 0 of `--new-world`: it replays every old rank's stream up to the saved batch count to
  know which documents they consumed;
the last two also with the token cache filled first (tools/pretokenize.py; the workers read
lengths from it). Per row: seconds to build the loader and seconds to its first batch;
for rank 1 with concat, the tokens it counted per second of building (batches x (B*T+1)).
The resume check: the coordinator's `batch_check` of one slot's window (every 16th token, crc32),
timed alone (`shmloader.ipc.ring.batch_check`, an internal of the package).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import corpora, loaders, results  # noqa: E402
from tools.bench.results import plural  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("elastic", __doc__)
    p.add_argument("--old-world", type=int, default=2, help="W, the world size the state is saved at (ranks; default 2)")
    p.add_argument("--new-world", type=int, default=3, help="W2, the world size it resumes at (ranks; default 3)")
    p.add_argument("--batches", type=int, default=150, help="batches old rank 0 reads before it saves (batches; default 150)")
    p.add_argument("--packing", choices=("concat", "bos_bestfit"), default="concat", help="packing (default concat)")
    p.add_argument("--workers", type=int, default=2, help="loader workers per rank (processes; default 2)")
    loaders.add_shape_args(p)
    p.add_argument("--repeat", type=int, default=2, help="rounds of every row (rounds; default 2)")
    corpora.add_args(p, many=False, default="nanochat")
    results.add_json_arg(p, "elastic")
    args = p.parse_args(argv)
    if min(args.old_world, args.new_world) < 2 or args.old_world == args.new_world:
        p.error("--old-world and --new-world must be >= 2 and differ")
    if min(args.batches, args.workers, args.batch_size, args.seq_len, args.repeat) < 1:
        p.error("--batches, --workers, --batch-size, --seq-len and --repeat must be >= 1")
    corpora.check_args(p, args)
    return args


def check_us(slot_tokens: int, n: int = 2000) -> float | None:
    """Microseconds of the coordinator's `batch_check` on one slot's window; None if this
    shmloader has none."""
    import numpy as np

    try:
        from shmloader.ipc.ring import batch_check
    except ImportError:
        return None
    window = np.random.default_rng(0).integers(0, 65536, slot_tokens, dtype=np.int64)
    batch_check(window)
    t0 = time.perf_counter()
    for _ in range(n):
        batch_check(window)
    return (time.perf_counter() - t0) / n * 1e6


def timed(make) -> tuple[float, float]:
    """(seconds to build, seconds to the first batch) of `make()`; the loader is closed after."""
    began = time.perf_counter()
    loader = make()
    built = time.perf_counter() - began
    with loader:
        next(loader)
    return built, time.perf_counter() - began


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    import torch  # noqa: F401  (imported before any timing)

    import shmloader

    [corpus] = corpora.resolve(args)
    W, W2, B, T = args.old_world, args.new_world, args.batch_size, args.seq_len

    def loader(rank, world, **kw):
        return shmloader.ShmLoader(corpus.data, corpus.tokenizer, B, T, "train", packing=args.packing,
                                   num_workers=args.workers, device="cpu", rank=rank, world_size=world, timeout=600, **kw)

    with loader(0, W) as old:
        for _ in range(args.batches):
            next(old)
        state = json.loads(json.dumps(old.state_dict()))
    rows = {"same rank, same world size (no replay)": [], f"rank 1 of {W}, no cache": [],
            f"rank 1 of {W}, token cache": [], f"rank 0 of {W2}, no cache": [], f"rank 0 of {W2}, token cache": []}
    with tempfile.TemporaryDirectory(prefix="shmloader-bench-cache-") as cache:
        started = time.perf_counter()
        subprocess.run([sys.executable, str(results.REPO / "tools" / "pretokenize.py"), "--data", corpus.data,
                        "--tokenizer", corpus.tokenizer, "--cache-dir", cache, "--split", "train"],
                       check=True, capture_output=True)
        pretokenize_s = time.perf_counter() - started
        for i in range(args.repeat):
            print(f"round {i + 1}/{args.repeat} ...", file=sys.stderr)
            for name, (rank, world, kw) in zip(rows, [(0, W, {}), (1, W, {}), (1, W, {"cache_dir": cache}),
                                                      (0, W2, {}), (0, W2, {"cache_dir": cache})]):
                rows[name].append(timed(lambda: loader(rank, world, resume_state=state, **kw)))
    window = B * T + 1 if args.packing == "concat" else B * T
    figures = {"config": {"corpus": corpus.name, "data": corpus.data, "packing": args.packing, "workers": args.workers,
                          "B": B, "T": T, "old_world": W, "new_world": W2, "batches": args.batches, "repeat": args.repeat},
               "old_batch": state["batch"], "old_tokens": args.batches * window, "pretokenize_s": pretokenize_s,
               "rows": [{"resume": name, "built_s": [b for b, _ in got], "first_batch_s": [f for _, f in got]}
                        for name, got in rows.items()],
               "check_us": check_us(B * T + 1 if args.packing == "concat" else 2 * B * T),
               "check_slot_tokens": B * T + 1 if args.packing == "concat" else 2 * B * T}
    results.publish(args.json, "elastic", began, figures, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    out = [f"{c['corpus'] or c['data']} corpus, {c['packing']}, {plural(c['workers'], 'worker')}, B={c['B']}, T={c['T']}: "
           f"old rank 0 of {c['old_world']} read {c['batches']} batches ({run['old_tokens'] / 1e6:.2f} M tokens) and "
           f"saved; the cache was filled in {run['pretokenize_s']:.1f} s; seconds to build / to the first batch, "
           f"median of {c['repeat']} (all); load average at the start {run['machine']['load_average']}"]
    for r in run["rows"]:
        built, first = statistics.median(r["built_s"]), statistics.median(r["first_batch_s"])
        line = f"  {r['resume']:40s} {built:6.2f} / {first:6.2f} s  ({', '.join(f'{x:.2f}' for x in r['first_batch_s'])})"
        if r["resume"].startswith("rank 1") and c["packing"] == "concat":  # best fit's batches hold fewer tokens than it reads
            line += f"  {c['batches'] * (c['B'] * c['T'] + 1) / built / 1e6:.2f} M tokens counted/s"
        out.append(line)
    if run["check_us"] is not None:
        out.append(f"resume check: batch_check of a {run['check_slot_tokens']:,}-token slot, {run['check_us']:.1f} us "
                   f"(the coordinator's, per batch)")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
