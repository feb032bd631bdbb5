"""The fast tokenizer engine against tiktoken, one core (docs/engines.md).

    python tools/bench/engines.py                     # demo corpus, best of 3 passes, 4 s loaders
    python tools/bench/engines.py --rounds 1 --loader-seconds 0

In this process, the engine pinned to one thread as in a worker, over the train split's
documents, the methods interleaved, the best of `--rounds` passes each:
- tiktoken `encode_to_numpy(text, disallowed_special=())`, the reference;
- the engine's per-document encode (fastokens);
- the same with the worker's sampled check (1 document in 256 also encoded by tiktoken and
  compared): the steady-state cost of checking;
- the start check once: the first documents a worker checks, encoded by tiktoken (a one-time
  cost per worker).
Then `ShmLoader` with 1 worker, concat, for `--loader-seconds` per engine ("tiktoken",
"fastokens"): tokens/s read. The engine is built and checked through the package's internals
(`shmloader.data.engine`, `shmloader.data.tokenizer`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import baseline, children, corpora, loaders, results  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("engines", __doc__)
    p.add_argument("--rounds", type=int, default=3, help="passes of each method, interleaved; the best counts (default 3)")
    p.add_argument("--docs", type=int, default=None,
                   help="the first this many documents of the split (documents; default all, up to 64 M characters)")
    p.add_argument("--loader-seconds", type=float, default=4.0,
                   help="reading with ShmLoader per engine (seconds; 0 skips it; default 4)")
    loaders.add_shape_args(p)
    corpora.add_args(p, many=False)
    results.add_json_arg(p, "engines")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.loader_seconds < 0 or (args.docs is not None and args.docs < 1):
        p.error("--rounds and --docs must be >= 1, --loader-seconds >= 0")
    corpora.check_args(p, args)
    return args


def rate(texts, encode, check=None) -> float:
    n, t0 = 0, time.perf_counter()
    for text in texts:
        ids = encode(text)
        if check is not None:
            check(text, ids, lambda: "?")
        n += len(ids)
    return n / (time.perf_counter() - t0)


def loader_rate(corpus, engine: str, seconds: float, B: int, T: int) -> float:
    import shmloader

    with shmloader.ShmLoader(corpus.data, corpus.tokenizer, B, T, "train", num_workers=1, device="cpu",
                             engine=engine) as loader:
        next(loader)
        n, t0 = 0, time.perf_counter()
        for _ in loader:
            n += B * T + 1
            if time.perf_counter() - t0 > seconds:
                break
        return n / (time.perf_counter() - t0)


def rates_child(cfg: dict) -> dict:
    """Every measurement, in this fresh process (`children.run`)."""
    os.environ["FASTOKENS_BPE_THREADS"] = os.environ["RAYON_NUM_THREADS"] = "1"  # as in a worker: before it loads
    from shmloader.data import engine as enginemod
    from shmloader.data import tokenizer as tokmod
    from tools.bench.bare import split_texts

    corpus = corpora.Corpus(*cfg["corpus"])
    texts = split_texts(corpora.split_files(corpus.data, "train"))[:cfg["docs"]]
    enc = baseline.load_tiktoken(corpus.tokenizer)
    spec = tokmod.resolve(enc)
    fast, ref = enginemod.build(spec, "fastokens"), tokmod.build(spec)
    methods = {"tiktoken encode_to_numpy": lambda: rate(texts, ref),
               "fastokens": lambda: rate(texts, fast.encode),
               "fastokens + sampled check (1 in 256)": lambda: rate(texts, fast.encode, enginemod.Check(fast, start=0))}
    passes = {name: [] for name in methods}
    for _ in range(cfg["rounds"]):
        for name, run in methods.items():
            passes[name].append(run())
    t0 = time.perf_counter()
    for text in texts[:enginemod.START_DOCS]:
        ref(text)
    start_ms = (time.perf_counter() - t0) * 1e3
    return {"docs": len(texts), "chars": sum(map(len, texts)), "vocab": enc.n_vocab, "engine_threads": fast.threads,
            "rates": [{"method": name, "tokens_per_s": max(got), "passes": got} for name, got in passes.items()],
            "start_check_docs": enginemod.START_DOCS, "start_check_ms": start_ms,
            "loaders": [{"engine": e, "tokens_per_s": loader_rate(corpus, e, cfg["loader_seconds"], cfg["B"], cfg["T"])}
                        for e in (("tiktoken", "fastokens") if cfg["loader_seconds"] > 0 else ())]}


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    [corpus] = corpora.resolve(args)
    config = {"corpus": corpus.name, "data": corpus.data, "rounds": args.rounds, "docs": args.docs,
              "loader_seconds": args.loader_seconds, "B": args.batch_size, "T": args.seq_len}
    with children.checkouts(None) as [ours]:
        got = children.run("engines:rates_child", dict(config, corpus=corpus), ours)
    results.publish(args.json, "engines", began, dict(got, config=config), argv, report)
    return 0


def report(run: dict) -> str:
    c, rates = run["config"], {r["method"]: r for r in run["rates"]}
    base = rates["tiktoken encode_to_numpy"]["tokens_per_s"]
    out = [f"{run['docs']} documents of the {c['corpus'] or c['data']} corpus, {run['chars'] / 1e6:.1f} M characters, "
           f"a {run['vocab']}-token BPE; one core, best of {c['rounds']} interleaved passes; engine threads started: "
           f"{run['engine_threads']}; load average at the start {run['machine']['load_average']}"]
    for r in run["rates"]:
        out.append(f"  {r['method']:40s} {r['tokens_per_s'] / 1e6:6.2f} M tokens/s  {r['tokens_per_s'] / base:5.2f}x  "
                   f"(passes: {', '.join(f'{x / 1e6:.2f}' for x in r['passes'])})")
    fast, checked = rates["fastokens"]["tokens_per_s"], rates["fastokens + sampled check (1 in 256)"]["tokens_per_s"]
    out.append(f"  sampled check cost: {100 * (1 - checked / fast):.1f}% of the engine's rate")
    out.append(f"  start check: {run['start_check_docs']} documents encoded by tiktoken too, "
               f"{run['start_check_ms']:.0f} ms once per worker")
    out += [f"  ShmLoader, 1 worker, engine={r['engine']!r}: {r['tokens_per_s'] / 1e6:.2f} M tokens/s" for r in run["loaders"]]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
