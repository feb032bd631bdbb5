"""Tokens/s of each data format against parquet for the same documents (issue 51).

Writes the demo corpus's synthetic documents as `--files` files in each format (parquet,
.jsonl, .jsonl.zst, Arrow IPC file; units of 1024 rows), then reads `--batches` batches of
each with `--workers` workers, `--rounds` rounds interleaved (parquet, jsonl, ... then again),
and prints each format's median tokens/s and its ratio to parquet's. `--shuffle`: each format
also read with `shuffle=True` in the same rounds, beside its files' order, and that ratio printed
(a compressed file's shuffled pieces each decompress it from its start).

    python -m tools.bench.formats --docs 40000 --files 16 --workers 2 --rounds 3
    python -m tools.bench.formats --docs 200000 --mean-words 8 --files 1 --shuffle --rounds 2 --formats jsonl.gz jsonl parquet
"""
import argparse
import statistics
import tempfile
import time

from shmloader.demo import corpus
from tests import formats_data

FORMATS = ("parquet", "jsonl", "jsonl.zst", "arrow")


def measure(data, tok, B, T, workers, batches, shuffle: bool = False) -> float:
    import shmloader
    with shmloader.ShmLoader(data, tok, B, T, num_workers=workers, device="cpu", timeout=120,
                             head_start=False, shuffle=shuffle) as loader:
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
    p.add_argument("--mean-words", type=int, default=200, help="a document's mean length (words)")
    p.add_argument("--formats", nargs="+", default=FORMATS, choices=FORMATS + ("jsonl.gz",), help="formats read")
    p.add_argument("--shuffle", action="store_true", help="also read each format shuffled, beside its files' order")
    a = p.parse_args(argv)
    docs = corpus.synthetic_texts(a.docs, seed=7, mean_words=a.mean_words)
    tok = corpus.train_tokenizer(corpus.synthetic_texts(300, seed=1), vocab_size=1024)
    per = -(-len(docs) // a.files)
    files = [docs[i * per:(i + 1) * per] for i in range(a.files)]
    with tempfile.TemporaryDirectory() as root:
        dirs = {fmt: formats_data.write_set(f"{root}/{fmt}", files, fmt) and f"{root}/{fmt}" for fmt in a.formats}
        got = {fmt: [] for fmt in a.formats}
        shuffled = {fmt: [] for fmt in a.formats}
        for r in range(a.rounds):
            for fmt in a.formats:
                got[fmt].append(measure(dirs[fmt], tok, a.B, a.T, a.workers, a.batches))
                if a.shuffle:
                    shuffled[fmt].append(measure(dirs[fmt], tok, a.B, a.T, a.workers, a.batches, shuffle=True))
    base = statistics.median(got["parquet"]) if "parquet" in got else None
    for fmt in a.formats:
        med = statistics.median(got[fmt])
        print(f"{fmt:10s} {med / 1e6:6.3f} M tokens/s  {f'{med / base:5.2f} of parquet' if base else ''}  "
              f"(rounds: {', '.join(f'{x / 1e6:.3f}' for x in got[fmt])})")
        if a.shuffle:
            print(f"{'':10s} shuffled, of its files' order, a round each: "
                  f"{', '.join(f'{s / u:.2f}' for s, u in zip(shuffled[fmt], got[fmt]))}")


if __name__ == "__main__":
    main()
