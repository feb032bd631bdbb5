"""The fast engine against tiktoken, one core, on the demo corpus (shmloader/data/engine.py).

    python tools/bench_engine.py [--out-dir demo_data] [--vocab-size 4096] [--rounds 3] [--loader-s 4]

Raw rates in this process (the engine pinned to one thread, as in a worker), over the train
split's documents, the methods interleaved, best of `--rounds` passes:
- tiktoken `encode_to_numpy(text, disallowed_special=())`, what a worker used before;
- the engine's per-document encode (`engine.build(spec, "fastokens").encode`);
- the same with the worker's sampled check (`engine.Check` with no start sample: 1 document in
  256 also encoded by tiktoken and compared), the steady-state cost of checking;
- the start check once: the first 64 documents encoded by tiktoken (a one-time cost per worker).
Then `ShmLoader` with 1 worker, concat, B=16, T=2048, CPU, for `--loader-s` seconds per
engine: tokens/s read by the trainer.
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
import time

os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shmloader.data import engine as enginemod  # noqa: E402
from shmloader.data import tokenizer as tokmod  # noqa: E402
from shmloader.demo import prepare_data  # noqa: E402
from shmloader.demo.baseline import documents  # noqa: E402


def raw(texts, encode, check=None) -> float:
    n, t0 = 0, time.perf_counter()
    for text in texts:
        ids = encode(text)
        if check is not None:
            check(text, ids, lambda: "?")
        n += len(ids)
    return n / (time.perf_counter() - t0)


def loader_rate(data_dir, tok, engine, seconds) -> float:
    import shmloader

    with shmloader.ShmLoader(str(data_dir), tok, 16, 2048, "train", num_workers=1, device="cpu",
                             engine=engine) as loader:
        next(loader)
        n, t0 = 0, time.perf_counter()
        for _ in loader:
            n += 16 * 2048 + 1
            if time.perf_counter() - t0 > seconds:
                break
        return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default="demo_data")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loader-s", type=float, default=4.0)
    args = ap.parse_args()
    demo = prepare_data(args.out_dir, args.vocab_size)
    files = sorted(str(p) for p in demo.data_dir.glob("*.parquet"))[:-1]
    texts = [t for _, t in documents(files, epochs=1) if t is not None]
    with open(demo.tokenizer_path, "rb") as f:
        enc = pickle.load(f)
    spec = tokmod.resolve(enc)
    fast = enginemod.build(spec, "fastokens")
    ref = tokmod.build(spec)
    methods = {"tiktoken encode_to_numpy": lambda: raw(texts, ref),
               "fastokens": lambda: raw(texts, fast.encode),
               "fastokens + sampled check (1 in 256)": lambda: raw(texts, fast.encode, enginemod.Check(fast, start=0))}
    rates = {name: [] for name in methods}
    for _ in range(args.rounds):
        for name, run in methods.items():
            rates[name].append(run())
    print(f"{len(texts)} documents, {sum(map(len, texts)) / 1e6:.1f} M characters, "
          f"{enc.n_vocab}-token BPE; engine threads started: {fast.threads}")
    base = max(rates["tiktoken encode_to_numpy"])
    for name, got in rates.items():
        print(f"  {name:40s} {max(got) / 1e6:6.2f} M tokens/s  {max(got) / base:5.2f}x  "
              f"(passes: {', '.join(f'{r / 1e6:.2f}' for r in got)})")
    fast_rate, checked = max(rates["fastokens"]), max(rates["fastokens + sampled check (1 in 256)"])
    print(f"  sampled check cost: {100 * (1 - checked / fast_rate):.1f}% of the engine's rate")
    t0 = time.perf_counter()
    for text in texts[:enginemod.START_DOCS]:
        ref(text)
    print(f"  start check: {enginemod.START_DOCS} documents encoded by tiktoken too, "
          f"{(time.perf_counter() - t0) * 1e3:.0f} ms once per worker")
    if args.loader_s > 0:
        for engine in ("tiktoken", "fastokens"):
            print(f"  ShmLoader 1 worker, engine={engine!r}: "
                  f"{loader_rate(demo.data_dir, str(demo.tokenizer_path), engine, args.loader_s) / 1e6:.2f} M tokens/s")


if __name__ == "__main__":
    main()
