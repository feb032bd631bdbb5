"""Fill shmloader's token cache for a split ahead of time, on every core.

    shmloader-pretokenize --data DIR --tokenizer tokenizer.pkl --cache-dir CACHE [--split all] [--column text]
    python -m shmloader.tools.pretokenize ...   (the same; in a checkout also python tools/pretokenize.py)

Each unit of the split's files (a parquet row group, an Arrow record batch, 1024 lines of JSON
Lines; all ranks: the cache is shared), its documents in `--column`, is tokenized once, with the
loader's engine and its checks against tiktoken (`--engine`), and written as the loader's
workers would write it; entries already present and valid are skipped, so a
second run does nothing. Shows its progress (units done of all, in their format's words, the rate, the time left:
a bar on a terminal, else a line on stderr after a second and every ten: shmloader/progress.py),
then prints what it did and the disk the cache takes.
"""
import argparse
import multiprocessing
import os
import sys
import time

from shmloader import progress
from shmloader.config import ENGINES, SPLITS
from shmloader.data import cache as cachemod
from shmloader.data import engine as enginemod
from shmloader.data import formats
from shmloader.data import source
from shmloader.data import tokenizer as tokmod
from shmloader.procs import worker


def _init(spec_, cache_dir_, engine, column):
    global _SPEC, _ENGINES, _CACHE, _COLUMN
    _SPEC, _COLUMN = spec_, column
    # the loader's engine, checked as a worker checks it, taking over before the first document
    _ENGINES = enginemod.Engines(spec_, engine, warn=lambda text: print(f"pretokenize: {text}", file=sys.stderr),
                                 at=0)
    _CACHE = cachemod.TokenCache(cache_dir_, spec_.fingerprint, spec_.n_vocab)


def _one(job):
    path, rg = job
    reader = source.Reader([path], columns=_COLUMN, n_vocab=_SPEC.n_vocab or None)
    file = cachemod.File.of(reader, 0)
    if _CACHE.load(file, rg) is not None:
        return 0, False
    texts = reader.read_texts(0, rg, 0, reader.row_counts(0)[rg])
    tokens, lengths = worker.encode_texts(texts, _ENGINES.encode_batch, _SPEC.bos, _SPEC.dtype,
                                          lambda i: f"{path}, {formats.place_of(path, rg, i)}")
    _CACHE.store(file, rg, lengths, tokens)
    return int(tokens.size), True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="the loader's data=: a directory, glob or file of data files "
                    "(parquet, JSON Lines plain, .gz or .zst, Arrow IPC; a Hugging Face datasets directory)")
    ap.add_argument("--tokenizer", required=True, help="the loader's tokenizer: tokenizer.pkl, tokenizer.json, a "
                    "SentencePiece .model, or their directory")
    ap.add_argument("--cache-dir", required=True, help="the loader's cache_dir")
    ap.add_argument("--column", default="text", help="the column the documents are in, as the loader's column= "
                    "(text, or token ids: stored as they are; default text)")
    ap.add_argument("--split", choices=SPLITS, default="all",
                    help="which files to tokenize, as the loader's split= (default: all, every file)")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="processes (default: all cores)")
    ap.add_argument("--engine", choices=ENGINES, default="auto",
                    help="tokenizer engine, as the loader's engine= (default auto: gigatoken where it is "
                         "proven equal, else fastokens when installed, checked against tiktoken)")
    args = ap.parse_args(argv)
    try:
        source.check_column(args.column)
    except ValueError as exc:
        ap.error(str(exc))
    files = source.split_files(source.list_files(args.data), args.split)
    spec = tokmod.resolve(args.tokenizer)
    jobs = [(f, rg) for f in files for rg in range(len(source.Reader([f]).row_counts(0)))]
    t0 = time.monotonic()
    done = tokens = 0
    ctx = multiprocessing.get_context("forkserver")
    units = formats.units_of(files)
    report = progress.Report("pretokenize", len(jobs), units, t0,
                             lambda level, text: print(text, file=sys.stderr, flush=True), bar=True)
    with ctx.Pool(args.workers, initializer=_init,
                  initargs=(spec, args.cache_dir, args.engine, args.column)) as pool:
        for i, (n, wrote) in enumerate(pool.imap_unordered(_one, jobs), 1):
            done += wrote
            tokens += n
            report.update(time.monotonic(), i, extra=f"{tokens / 1e6:.1f}M tokens")
    report.finish(time.monotonic())
    dt = time.monotonic() - t0
    root = os.path.join(args.cache_dir, spec.fingerprint)
    size = sum(e.stat().st_size for e in os.scandir(root)) if os.path.isdir(root) else 0
    print(f"{len(jobs)} {units}: {done} tokenized ({tokens / 1e6:.1f}M tokens, "
          f"{tokens / max(dt, 1e-9) / 1e6:.2f}M tokens/s), {len(jobs) - done} already cached; "
          f"cache {root} holds {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    sys.exit(main())
