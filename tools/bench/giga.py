"""The third engine (gigatoken) beside fastokens and tiktoken, with GPT-2- and cl100k-pattern
tokenizers trained offline, on each corpus: ids compared document by document, tokens/s on one core.

    python tools/bench/giga.py                                   # demo corpus, gpt2 and cl100k patterns
    python tools/bench/giga.py --corpus demo nanochat skewed --cache-dir /tmp/bq

Per corpus and split pattern, a byte-level BPE of `--vocab-size` tokens is trained (rustbpe,
`shmloader.demo.corpus.train_tokenizer`) on the corpus's train split's first `--train-chars`
characters and cached beside the corpus. Then, in a fresh process with one thread per engine
(as in a worker), over the split's documents (up to `--docs`):
- ids: every document encoded by each engine and compared with tiktoken's `encode_ordinary`,
  the stream's definition (documents that differ, of all);
- tokens/s: the documents encoded as a worker calls its engine (runs of the worker's
  `CHUNK_CHARS` characters, `Encoder.encode_batch`), each engine in turn, the best of
  `--rounds` interleaved passes; tiktoken's is `encode_ordinary_batch` on one thread.
The engines are built through the package (`shmloader.data.engine.build`), gigatoken only
where data/giga.py proves it equal (its pattern and its probe).
"""
from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children, corpora, results  # noqa: E402

PATTERNS = ("gpt2", "cl100k")


def parse_args(argv=None):
    p = results.parser("giga", __doc__)
    p.add_argument("--patterns", nargs="+", choices=PATTERNS, default=list(PATTERNS),
                   help="split patterns to train tokenizers with (default gpt2 cl100k)")
    p.add_argument("--vocab-size-trained", type=int, default=4096, dest="trained_vocab",
                   help="the trained tokenizers' vocabulary (tokens; default 4096)")
    p.add_argument("--train-chars", type=float, default=4e6, help="characters to train on (default 4e6)")
    p.add_argument("--docs", type=int, default=None, help="documents of the split measured (default all, up to 64 M "
                                                          "characters)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved passes; the best counts (default 3)")
    corpora.add_args(p)
    results.add_json_arg(p, "giga")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.trained_vocab < 300 or (args.docs is not None and args.docs < 1):
        p.error("--rounds and --docs must be >= 1, --vocab-size-trained >= 300")
    corpora.check_args(p, args)
    return args


def trained(corpus, pattern: str, vocab: int, chars: float) -> str:
    """A `pattern` BPE trained on `corpus`'s train split, cached beside its shards: its path."""
    path = Path(corpus.data).parent / f"tokenizer_{pattern}_{vocab}_{int(chars)}.pkl"
    if path.exists():
        return str(path)
    from shmloader.data import giga
    from shmloader.demo import corpus as corpusmod
    from tools.bench.bare import split_texts

    texts = split_texts(corpora.split_files(corpus.data, "train"), chars)
    pat = {"gpt2": giga._R50K, "cl100k": giga._CL100K}[pattern]  # noqa: SLF001 (the patterns it implements)
    enc = corpusmod.train_tokenizer(texts, vocab, name=f"bench-{pattern}", pattern=pat)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(enc, f)
    os.replace(tmp, path)
    return str(path)


def engines_child(cfg: dict) -> dict:
    """Every measurement of one corpus and tokenizer, in this fresh process (`children.run`)."""
    os.environ["FASTOKENS_BPE_THREADS"] = os.environ["RAYON_NUM_THREADS"] = "1"  # as in a worker: before it loads
    import numpy as np

    from shmloader.data import engine as enginemod
    from shmloader.data import tokenizer as tokmod
    from shmloader.procs.worker import CHUNK_CHARS
    from tools.bench.bare import split_texts

    texts = split_texts(cfg["files"])[:cfg["docs"]]
    spec = tokmod.resolve(cfg["tokenizer"])
    enc = pickle.loads(spec.payload)
    built = {name: enginemod.build(spec, name) for name in ("fastokens", "gigatoken")}
    runs, start, size = [], 0, 0  # the worker's engine calls: runs of about CHUNK_CHARS characters
    for i, text in enumerate(texts):
        size += len(text)
        if size >= CHUNK_CHARS or i == len(texts) - 1:
            runs.append(texts[start:i + 1])
            start, size = i + 1, 0
    ref = [enc.encode_ordinary(t) for t in texts]
    differ = {}
    for name, e in built.items():
        got, j = 0, 0
        for run in runs:
            ids, offsets = e.encode_batch(run)
            got += sum(ids[offsets[k]:offsets[k + 1]].tolist() != ref[j + k] for k in range(len(run)))
            j += len(run)
        differ[name] = got
    methods = {"tiktoken": lambda run: sum(map(len, enc.encode_ordinary_batch(run, num_threads=1))),
               **{name: (lambda run, e=e: len(e.encode_batch(run)[0])) for name, e in built.items()}}
    passes = {name: [] for name in methods}
    for _ in range(cfg["rounds"]):
        for name, encode in methods.items():
            n, t0 = 0, time.perf_counter()
            for run in runs:
                n += encode(run)
            passes[name].append(n / (time.perf_counter() - t0))
    return {"docs": len(texts), "chars": sum(map(len, texts)), "tokens": int(sum(map(len, ref))),
            "vocab": enc.n_vocab, "differ": differ, "engines": {n: e.name for n, e in built.items()},
            "rates": [{"engine": name, "tokens_per_s": max(got), "passes": got} for name, got in passes.items()],
            "chunks": len(runs), "ids_dtype": str(np.uint32)}


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()
    found = corpora.resolve(args)
    out = []
    with children.checkouts(None) as [ours]:
        for corpus in found:
            for pattern in args.patterns:
                tok = trained(corpus, pattern, args.trained_vocab, args.train_chars)
                print(f"{corpus.name or corpus.data}, {pattern} pattern ...", file=sys.stderr)
                got = children.run("giga:engines_child", {"files": corpora.split_files(corpus.data, "train"),
                                                          "tokenizer": tok, "docs": args.docs, "rounds": args.rounds},
                                   ours)
                out.append(dict(got, corpus=corpus.name, pattern=pattern, tokenizer=tok))
    config = {"patterns": args.patterns, "vocab": args.trained_vocab, "train_chars": args.train_chars,
              "docs": args.docs, "rounds": args.rounds}
    results.publish(args.json, "giga", began, {"config": config, "corpora": out}, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    out = [f"tokens/s on one core, the best of {c['rounds']} interleaved passes, runs of documents as a worker "
           f"calls its engine; ids compared with tiktoken's encode_ordinary document by document; load average "
           f"at the start {run['machine']['load_average']}"]
    head = ("corpus", "pattern", "documents", "tiktoken", "fastokens", "gigatoken", "giga / fastokens",
            "differ (fastokens, gigatoken)")
    rows = []
    for e in run["corpora"]:
        r = {x["engine"]: x["tokens_per_s"] for x in e["rates"]}
        rows.append((e["corpus"] or "data", e["pattern"], f"{e['docs']:,}", f"{r['tiktoken'] / 1e6:.2f} M",
                     f"{r['fastokens'] / 1e6:.2f} M", f"{r['gigatoken'] / 1e6:.2f} M",
                     f"{r['gigatoken'] / r['fastokens']:.2f}x",
                     f"{e['differ']['fastokens']}, {e['differ']['gigatoken']} of {e['docs']:,}"))
    out.append(results.table(head, rows))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
