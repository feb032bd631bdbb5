"""The shuffled order's quality and cost (issue 52): shuffle=True against the files' order.

Quality, from the order itself (data/shuffle.py: the loader reads exactly this order) over the
row counts of `--files` shards of `--docs` documents in row groups of `--group` rows, epoch 1
of rank 0 of 1, for `--seeds` seeds: the share of neighbouring documents in the stream that
were neighbours in the files, how many files the first `--first` documents draw from, and the
Spearman rank correlation of stream place against file place (mean over seeds).

Cost: tokens/s and the first batch's latency with `--workers` workers, shuffled and not,
`--rounds` rounds interleaved, over the demo corpus's synthetic documents written as those shards.

    python -m tools.bench.shuffle --docs 40000 --files 16 --group 1024 --workers 2 --rounds 3
"""
import argparse
import statistics
import tempfile
import time

import numpy as np

from shmloader.data import shuffle
from shmloader.demo import corpus


def doc_order(counts, seed: int, epoch: int = 1) -> np.ndarray:
    """Epoch `epoch`'s documents (numbered in file order) in stream order, rank 0 of 1."""
    order = shuffle.Shuffle(seed)
    base = np.cumsum([0] + [n for rows in counts for n in rows])
    index = {(f, g): i for i, (f, g) in enumerate((f, g) for f, rows in enumerate(counts) for g in range(len(rows)))}
    parts = [base[index[f, g]] + order.rows(epoch, f, g, counts[f][g]) for f, g in order.units(epoch, counts)]
    return np.concatenate(parts)


def quality(seq: np.ndarray, doc_file: np.ndarray, first: int) -> tuple:
    neighbours = float(np.mean(np.abs(np.diff(seq)) == 1))
    files = len(set(doc_file[seq[:first]].tolist()))
    rho = float(np.corrcoef(seq, np.arange(len(seq)))[0, 1])  # seq is the file place of stream place i
    return neighbours, files, rho


def measure(data, tok, B, T, workers, batches, shuffled) -> tuple:
    import shmloader
    began = time.perf_counter()
    with shmloader.ShmLoader(data, tok, B, T, split="all", num_workers=workers, device="cpu", timeout=120,
                             head_start=False, shuffle=shuffled, seed=1) as loader:
        next(loader)
        first = time.perf_counter() - began
        began = time.perf_counter()
        for _ in range(batches):
            next(loader)
        return batches * B * T / (time.perf_counter() - began), first


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=40000, help="documents in all (count)")
    p.add_argument("--files", type=int, default=16, help="files (count)")
    p.add_argument("--group", type=int, default=1024, help="rows per row group (count)")
    p.add_argument("--seeds", type=int, default=5, help="seeds the quality is averaged over (count)")
    p.add_argument("--first", type=int, default=256, help="documents at the start of the epoch whose files are counted")
    p.add_argument("--workers", type=int, default=2, help="workers (count)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (count; 0: quality only)")
    p.add_argument("--batches", type=int, default=150, help="batches per measurement (count)")
    p.add_argument("--B", type=int, default=8, help="rows per batch")
    p.add_argument("--T", type=int, default=1024, help="tokens per row")
    a = p.parse_args(argv)
    per = -(-a.docs // a.files)
    sizes = [min(per, a.docs - i * per) for i in range(a.files)]
    counts = [[min(a.group, n - s) for s in range(0, n, a.group)] for n in sizes]
    doc_file = np.repeat(np.arange(a.files), sizes)
    plain = np.arange(a.docs)
    n, f, r = quality(plain, doc_file, a.first)
    print(f"files' order: {n:.2%} neighbours kept, first {a.first} documents from {f} file(s), Spearman {r:+.3f}")
    got = [quality(doc_order(counts, seed), doc_file, a.first) for seed in range(a.seeds)]
    print(f"shuffled (window 1 row group of {a.group}, {a.seeds} seeds): "
          f"{statistics.mean(g[0] for g in got):.2%} neighbours kept, first {a.first} documents from "
          f"{statistics.mean(g[1] for g in got):.1f} file(s), Spearman {statistics.mean(g[2] for g in got):+.3f} "
          f"(by seed {', '.join(f'{g[2]:+.3f}' for g in got)})")
    if not a.rounds:
        return
    docs = corpus.synthetic_texts(a.docs, seed=7, mean_words=200)
    tok = corpus.train_tokenizer(corpus.synthetic_texts(300, seed=1), vocab_size=1024)
    with tempfile.TemporaryDirectory() as root:
        corpus.write_shards(docs, root, num_files=a.files, row_group_size=a.group)
        runs = {False: [], True: []}
        for _ in range(a.rounds):
            for shuffled in (False, True):
                runs[shuffled].append(measure(root, tok, a.B, a.T, a.workers, a.batches, shuffled))
    base = statistics.median(x for x, _ in runs[False])
    base_first = statistics.median(f for _, f in runs[False])
    for shuffled in (False, True):
        med, first = statistics.median(x for x, _ in runs[shuffled]), statistics.median(f for _, f in runs[shuffled])
        print(f"shuffle={shuffled!s:5s} {med / 1e6:6.3f} M tokens/s ({med / base:.2f} of unshuffled), first batch "
              f"{first * 1e3:.0f} ms ({first / base_first:.2f}x)  (rounds: "
              f"{', '.join(f'{x / 1e6:.3f}' for x, _ in runs[shuffled])})")


if __name__ == "__main__":
    main()
