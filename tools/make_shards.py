"""Write a parquet shard directory (and optionally a tokenizer) for the demo, tests and benches.

Documents come from the Python standard library (``--source stdlib``), a seeded synthetic
generator (``--source synthetic``), your own text files (``--source files``), or one of the
benchmark corpora of ``tools/bench/<topic>.py --corpus`` (``--source nanochat``: nanochat's shard
geometry, 1024-document row groups of log-normal prose; ``--source skewed``: row groups of 1 to
500 documents, documents from empty to 100K characters). They are split into ``--num-files``
consecutive shards ``shard_00000.parquet ...`` with one string column ``text`` and row groups
of exactly ``--row-group-size`` rows (several sizes are cycled); the benchmark corpora bring
their own row groups, and each file holds a run of them. With ``--vocab-size N`` a byte-level
BPE is trained on the written documents and pickled nanochat-style (rustbpe: ``pip install
shmloader[demo]``).

Example:
    python tools/make_shards.py --source synthetic --num-docs 5000 --out-dir demo_data \\
        --num-files 4 --row-group-size 256 --vocab-size 1024
    python tools/make_shards.py --source skewed --num-docs 6000 --out-dir skewed_data --num-files 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow.parquet as pq
from tqdm import tqdm

from shmloader.demo import corpus

DEFAULT_SYNTHETIC_DOCS = 10_000
DEFAULT_CORPUS_DOCS = {"nanochat": 12_288, "skewed": 6_000}  # as tools/bench/corpora.py builds them


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", choices=("stdlib", "synthetic", "files", "nanochat", "skewed"),
                   default="synthetic",
                   help="where documents come from (default: synthetic; nanochat and skewed: the "
                        "benchmark corpora, with their own row groups)")
    p.add_argument("--files", nargs="+", type=Path, metavar="PATH",
                   help="text files for --source files (UTF-8); one document per file")
    p.add_argument("--one-per-line", action="store_true",
                   help="with --source files: each line of each file is one document")
    p.add_argument("--num-docs", type=int, default=None,
                   help="documents: synthetic count (default 10000), nanochat / skewed count (default "
                        "12288 / 6000) or cap for stdlib/files")
    p.add_argument("--seed", type=int, default=0, help="seed for --source synthetic, nanochat and skewed")
    p.add_argument("--mean-words", type=int, default=200,
                   help="mean words per ordinary synthetic document (words)")
    p.add_argument("--out-dir", type=Path, required=True,
                   help="directory to write the parquet shards into (created)")
    p.add_argument("--num-files", type=int, default=4, help="number of parquet files (files)")
    p.add_argument("--row-group-size", type=int, nargs="+", default=None, metavar="ROWS",
                   help="rows per row group; several values are cycled (default: 1024 rows; not with "
                        "--source nanochat or skewed, which bring their own)")
    p.add_argument("--prefix", default="shard_", help="file name prefix (default: shard_)")
    p.add_argument("--vocab-size", type=int, default=0,
                   help="train a BPE tokenizer with this many tokens incl. specials "
                        "(tokens; default 0 = don't train; needs rustbpe: pip install shmloader[demo])")
    p.add_argument("--tokenizer-out", type=Path, default=None,
                   help="tokenizer pickle path (default: OUT_DIR/tokenizer/tokenizer.pkl)")
    args = p.parse_args(argv)
    if args.source == "files" and not args.files:
        p.error("--source files needs --files PATH [PATH ...]")
    if args.files and args.source != "files":
        p.error(f"--files is only used with --source files, got --source {args.source}")
    if args.source in DEFAULT_CORPUS_DOCS and args.row_group_size is not None:
        p.error(f"--source {args.source} brings its own row groups: drop --row-group-size")
    if args.row_group_size is None:
        args.row_group_size = [1024]
    return args


def load_docs(args: argparse.Namespace) -> list[str | None]:
    """Documents for the chosen source, capped at --num-docs (for the benchmark corpora, their
    row-group sizes go into ``args.row_group_sizes``)."""
    args.row_group_sizes = None
    if args.source in DEFAULT_CORPUS_DOCS:
        n = DEFAULT_CORPUS_DOCS[args.source] if args.num_docs is None else args.num_docs
        make = corpus.nanochat_corpus if args.source == "nanochat" else corpus.skewed_corpus
        docs, args.row_group_sizes = make(n, args.seed)
        return docs
    if args.source == "synthetic":
        n = DEFAULT_SYNTHETIC_DOCS if args.num_docs is None else args.num_docs
        return corpus.synthetic_texts(n, args.seed, mean_words=args.mean_words)
    if args.source == "stdlib":
        return list(corpus.stdlib_texts(args.num_docs))
    docs: list[str | None] = []
    for path in args.files:
        text = path.read_text(encoding="utf-8", errors="replace")
        docs += text.splitlines() if args.one_per_line else [text]
    return docs if args.num_docs is None else docs[:args.num_docs]


def summarize(paths: list[Path], n_docs: int) -> str:
    """One line: docs, files, row groups, bytes on disk."""
    row_groups = sum(pq.ParquetFile(p).metadata.num_row_groups for p in paths)
    n_bytes = sum(p.stat().st_size for p in paths)
    return (f"wrote {n_docs} docs to {len(paths)} files, {row_groups} row groups, "
            f"{n_bytes} bytes in {paths[0].parent}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.vocab_size:
        try:
            corpus.require_rustbpe()  # before the shards are written: one line, not a traceback
        except ImportError as exc:
            raise SystemExit(f"make_shards: {exc}") from None
    docs = load_docs(args)
    with tqdm(total=args.num_files, unit="file", desc="writing shards") as bar:
        paths = corpus.write_shards(docs, args.out_dir, num_files=args.num_files,
                                    row_group_size=args.row_group_size, prefix=args.prefix,
                                    on_file_written=lambda _path: bar.update(1),
                                    row_group_sizes=args.row_group_sizes)
    print(summarize(paths, len(docs)))
    if args.vocab_size:
        enc = corpus.train_tokenizer((d for d in docs if d is not None), args.vocab_size)
        out = args.tokenizer_out or args.out_dir / "tokenizer" / corpus.TOKENIZER_FILENAME
        out = corpus.save_tokenizer(enc, out)
        print(f"trained tokenizer with {enc.n_vocab} tokens -> {out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as e:  # bad argument combinations found by corpus; no traceback needed
        sys.exit(f"make_shards: error: {e}")
