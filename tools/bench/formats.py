"""Tokens/s of each data format against parquet for the same documents (issue 51).

Writes the demo corpus's synthetic documents as `--files` files in each format (parquet,
.jsonl, .jsonl.zst, Arrow IPC file; units of 1024 rows), then reads `--batches` batches of
each with `--workers` workers, `--rounds` rounds interleaved (parquet, jsonl, ... then again),
and prints each format's median tokens/s and its ratio to parquet's.

    python -m tools.bench.formats --docs 40000 --files 16 --workers 2 --rounds 3
"""
import argparse
import statistics
import tempfile
import time

from shmloader.demo import corpus
from tests import formats_data

FORMATS = ("parquet", "jsonl", "jsonl.zst", "arrow")


def measure(data, tok, B, T, workers, batches) -> float:
    import shmloader
    with shmloader.ShmLoader(data, tok, B, T, num_workers=workers, device="cpu", timeout=120,
                             head_start=False) as loader:
        next(loader)  # started: the rest is steady reading
        began = time.perf_counter()
        for _ in range(batches):
            next(loader)
        return batches * B * T / (time.perf_counter() - began)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=40000, help="documents in all (count)")
    p.add_argument("--files", type=int, default=16, help="files per format (count)")
    p.add_argument("--workers", type=int, default=2, help="workers (count)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (count)")
    p.add_argument("--batches", type=int, default=150, help="batches per measurement (count)")
    p.add_argument("--B", type=int, default=8, help="rows per batch")
    p.add_argument("--T", type=int, default=1024, help="tokens per row")
    a = p.parse_args(argv)
    docs = corpus.synthetic_texts(a.docs, seed=7, mean_words=200)
    tok = corpus.train_tokenizer(corpus.synthetic_texts(300, seed=1), vocab_size=1024)
    per = -(-len(docs) // a.files)
    files = [docs[i * per:(i + 1) * per] for i in range(a.files)]
    with tempfile.TemporaryDirectory() as root:
        dirs = {fmt: formats_data.write_set(f"{root}/{fmt}", files, fmt) and f"{root}/{fmt}" for fmt in FORMATS}
        got = {fmt: [] for fmt in FORMATS}
        for r in range(a.rounds):
            for fmt in FORMATS:
                got[fmt].append(measure(dirs[fmt], tok, a.B, a.T, a.workers, a.batches))
    base = statistics.median(got["parquet"])
    for fmt in FORMATS:
        med = statistics.median(got[fmt])
        print(f"{fmt:10s} {med / 1e6:6.3f} M tokens/s  {med / base:5.2f} of parquet  "
              f"(rounds: {', '.join(f'{x / 1e6:.3f}' for x in got[fmt])})")


if __name__ == "__main__":
    main()
