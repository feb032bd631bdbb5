"""The corpora the benchmarks read, built offline and reused, all read with the demo's tokenizer.

- "demo": the stdlib text cut into ~4,000-character documents, 256-document row groups, 4
  files (`python -m shmloader.demo`'s corpus, `shmloader.demo.prepare_data`).
- "nanochat": nanochat's shard geometry (`corpus.nanochat_corpus`): 1024-document row groups,
  log-normal lengths averaging ~4.7K characters with a long tail, zstd 3, no dictionary.
- "skewed": row groups of 1 to ~500 documents, documents from empty to 100K characters
  (`corpus.skewed_corpus`: code, long web pages, one-liners).

The built ones go into `--cache-dir` (`<name>_corpus/base_data`) as `--corpus-files` files, the
last one the val split, and are reused while their manifest matches (sizes, Python, a hash of
the generator's code); a directory holding shards they did not write is refused. `--data`
measures a directory of your own instead (with `--tokenizer`).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import NamedTuple

CORPORA = ("demo", "nanochat", "skewed")
OWNER = "tools/bench"


class Corpus(NamedTuple):
    name: str | None   # None: a --data directory
    data: str          # a directory of parquet shards (absolute)
    tokenizer: str     # a pickled tiktoken.Encoding (absolute)


def add_args(p, *, many: bool = True, default: str = "demo") -> None:
    """The corpus options: `--corpus` (several with `many`) or `--data`, and the built ones' sizes."""
    g = p.add_argument_group("data")
    if many:
        g.add_argument("--corpus", nargs="+", choices=CORPORA, default=None, metavar="NAME",
                       help=f"corpora to measure, each in turn within every round ({', '.join(CORPORA)}; "
                            f"default {default})")
    else:
        g.add_argument("--corpus", choices=CORPORA, default=None, help=f"the corpus to read (default {default})")
    g.add_argument("--data", default=None,
                   help="a directory of parquet shards of your own instead of a corpus (the last file is val)")
    g.add_argument("--tokenizer", default=None,
                   help="a pickled tiktoken tokenizer.pkl or its directory (default: the demo's)")
    g.add_argument("--cache-dir", type=Path, default=Path("demo_data"),
                   help="where the corpora and the demo tokenizer are built and kept (directory; default ./demo_data)")
    g.add_argument("--vocab-size", type=int, default=4096, help="the demo tokenizer's size when built (tokens; default 4096)")
    g.add_argument("--corpus-files", type=int, default=4,
                   help="files of the nanochat and skewed corpora, the last one val (files; default 4)")
    g.add_argument("--nanochat-docs", type=int, default=12288,
                   help="documents of the nanochat corpus (documents; default 12288: 12 row groups of 1024)")
    g.add_argument("--skewed-docs", type=int, default=6000,
                   help="documents of the skewed corpus (documents; default 6000, ~78 row groups)")
    p.set_defaults(corpus_default=default, corpus_many=many)


def check_args(p, args) -> None:
    """Refuse what `add_args`' options cannot mean; set `args.corpus` to the names to build."""
    if args.data is not None and args.corpus is not None:
        p.error("--data measures that one directory: drop --corpus, or drop --data to build the corpora")
    if args.data is not None and args.tokenizer is None:
        p.error("--data needs --tokenizer")
    if args.corpus_files < 2 or min(args.nanochat_docs, args.skewed_docs) < 1:
        p.error("--corpus-files must be >= 2 (a train and a val file) and --nanochat-docs, --skewed-docs >= 1")
    if args.corpus is None:
        args.corpus = [] if args.data is not None else [args.corpus_default]
    elif not args.corpus_many:
        args.corpus = [args.corpus]
    args.corpus = list(dict.fromkeys(args.corpus))  # each once, in the order given


def resolve(args, log=None) -> list[Corpus]:
    """The corpora of `args` (`add_args`), built or reused."""
    log = log or (lambda m: print(m, file=sys.stderr))
    if args.data is not None:
        return [Corpus(None, os.path.abspath(args.data), _tokenizer_file(args.tokenizer))]
    from shmloader.demo import prepare_data

    try:
        demo = prepare_data(args.cache_dir, args.vocab_size, log=log)
        tok = _tokenizer_file(args.tokenizer) if args.tokenizer else str(Path(demo.tokenizer_path).resolve())
        out = []
        for name in args.corpus:
            if name == "demo":
                out.append(Corpus(name, str(Path(demo.data_dir).resolve()), tok))
                continue
            n_docs = args.nanochat_docs if name == "nanochat" else args.skewed_docs
            data = prepare_corpus(name, args.cache_dir, n_docs, args.corpus_files, log=log)
            out.append(Corpus(name, str(data.resolve()), tok))
        return out
    except ValueError as exc:
        raise SystemExit(f"bench: error: {exc}") from None


def _tokenizer_file(path: str) -> str:
    path = os.path.abspath(path)
    return os.path.join(path, "tokenizer.pkl") if os.path.isdir(path) else path


def split_files(data: str, split: str) -> list[str]:
    """The split's files, as the loader takes a directory: its `*.parquet` sorted by name,
    train all but the last, val the last."""
    files = sorted(glob.glob(os.path.join(data, "*.parquet")))
    if len(files) < 2:
        raise SystemExit(f"bench: {data} holds {len(files)} parquet files; a train and a val split need 2 or more")
    return files[-1:] if split == "val" else files[:-1]


def prepare_corpus(name: str, cache_dir: Path, n_docs: int, num_files: int, seed: int = 0, log=print) -> Path:
    """Write (or reuse) the `name` corpus ("nanochat" or "skewed") as `num_files` shards in
    `cache_dir/<name>_corpus/base_data`; return that directory."""
    from shmloader.demo import corpus

    root = Path(cache_dir) / f"{name}_corpus"
    data_dir, manifest_path = root / "base_data", root / "corpus.json"
    key = {"corpus": name, "n_docs": n_docs, "num_files": num_files, "seed": seed, "python": sys.version,
           "stdlib": sysconfig.get_paths()["stdlib"], "format": corpus.SHARD_FORMAT,
           "generator": hashlib.sha256(Path(corpus.__file__).read_bytes()).hexdigest()[:16]}
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    if manifest.get("key") == key and len(list(data_dir.glob("*.parquet"))) == num_files:
        return data_dir
    if manifest.get("owner") not in (OWNER, "tools/bench.py") and any(data_dir.glob("*.parquet")):
        raise ValueError(f"{data_dir} holds parquet shards that {OWNER} did not write (no {manifest_path.name} "
                         f"of ours): pick another --cache-dir")
    started = time.perf_counter()
    make = corpus.nanochat_corpus if name == "nanochat" else corpus.skewed_corpus
    docs, sizes = make(n_docs, seed)
    if len(sizes) < num_files:
        raise ValueError(f"the {name} corpus of {n_docs} documents has {len(sizes)} row groups, fewer than "
                         f"--corpus-files {num_files}: pass more documents")
    root.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps({"owner": OWNER}) + "\n")  # ours, even if interrupted
    for old in data_dir.glob("*.parquet"):
        old.unlink()
    log(f"writing the {name} corpus: {len(docs):,} documents ({sum(map(len, docs)) / 1e6:.1f} M characters), "
        f"{len(sizes)} row groups of {min(sizes)}-{max(sizes)} documents, as {num_files} parquet files into "
        f"{data_dir} ...")
    corpus.write_shards(docs, data_dir, num_files=num_files, row_group_sizes=sizes)
    manifest_path.write_text(json.dumps({"owner": OWNER, "key": key, "n_docs": len(docs), "row_groups": len(sizes),
                                         "chars": sum(map(len, docs))}, indent=2) + "\n")
    log(f"{name} corpus ready in {time.perf_counter() - started:.1f} s (cached for the next run)")
    return data_dir
