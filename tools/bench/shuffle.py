"""The shuffled order's quality and cost (issue 52): shuffle=True against the files' order.

Quality, from the order itself (data/shuffle.py: the loader reads exactly this order) over the
row counts of `--files` shards of `--docs` documents in row groups of `--group` rows, epoch 1
of rank 0 of 1, for `--seeds` seeds and each window of `--windows` (documents a window holds at least): the
share of neighbouring documents in the stream that were neighbours in the files, how many files
the first `--first` documents draw from, and the Spearman rank correlation of stream place
against file place (mean over seeds).

Cost: tokens/s and the first batch's latency with `--workers` workers, unshuffled and shuffled
with each window of `--cost-windows`, `--rounds` rounds interleaved, over the demo corpus's
synthetic documents written as those shards.

    python -m tools.bench.shuffle --docs 40000 --files 16 --group 1024 --workers 2 --rounds 3
"""
import argparse
import statistics
import tempfile
import time

import numpy as np

from shmloader.data import shuffle
from shmloader.demo import corpus


def doc_order(counts, seed: int, window: int, epoch: int = 1) -> np.ndarray:
    """Epoch `epoch`'s documents (numbered in file order) in stream order, rank 0 of 1."""
    order = shuffle.Shuffle(seed, window)
    base, index = np.cumsum([0] + [n for rows in counts for n in rows]), {}
    for f, rows in enumerate(counts):
        for g in range(len(rows)):
            index[f, g] = len(index)
    parts = []
    for w in shuffle.share(order, epoch, counts, 0, 1):
        which, rows = shuffle.locate(w.members, order.rows(epoch, *w.head, w.rows))
        firsts = np.array([base[index[m.file, m.unit]] for m in w.members])
        parts.append(firsts[which] + rows)
    return np.concatenate(parts)


def quality(seq: np.ndarray, doc_file: np.ndarray, first: int) -> tuple:
    neighbours = float(np.mean(np.abs(np.diff(seq)) == 1))
    files = len(set(doc_file[seq[:first]].tolist()))
    rho = float(np.corrcoef(seq, np.arange(len(seq)))[0, 1])  # seq is the file place of stream place i
    return neighbours, files, rho


def measure(data, tok, B, T, workers, batches, window) -> tuple:
    """(tokens/s, first batch s) unshuffled (`window` 0) or shuffled with `window` units a window."""
    import shmloader
    began = time.perf_counter()
    with shmloader.ShmLoader(data, tok, B, T, split="all", num_workers=workers, device="cpu", timeout=120,
                             head_start=False, shuffle=window > 0, seed=1, shuffle_window=window or None) as loader:
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
    p.add_argument("--seeds", type=int, default=20, help="seeds the quality is averaged over (count)")
    p.add_argument("--first", type=int, default=256, help="documents at the start of the epoch whose files are counted")
    p.add_argument("--windows", default="1,64,256,1024,4096", help="windows whose quality is reported (documents, comma-separated)")
    p.add_argument("--cost-windows", default="1,256,4096", help="windows whose cost is measured (documents, comma-separated)")
    p.add_argument("--workers", type=int, default=2, help="workers (count)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (count; 0: quality only)")
    p.add_argument("--batches", type=int, default=150, help="batches per measurement (count)")
    p.add_argument("--batch-size", type=int, default=8, help="B, rows per batch (rows; default 8)")
    p.add_argument("--seq-len", type=int, default=1024, help="T (tokens; default 1024)")
    a = p.parse_args(argv)
    per = -(-a.docs // a.files)
    sizes = [min(per, a.docs - i * per) for i in range(a.files)]
    counts = [[min(a.group, n - s) for s in range(0, n, a.group)] for n in sizes]
    doc_file = np.repeat(np.arange(a.files), sizes)
    plain = np.arange(a.docs)
    n, f, r = quality(plain, doc_file, a.first)
    print(f"files' order: {n:.2%} neighbours kept, first {a.first} documents from {f} file(s), Spearman {r:+.3f}")
    for window in map(int, a.windows.split(",")):
        got = [quality(doc_order(counts, seed, window), doc_file, a.first) for seed in range(a.seeds)]
        print(f"shuffled, window {window:4d} documents, row groups of {a.group} ({a.seeds} seeds): "
              f"{statistics.mean(g[0] for g in got):.2%} neighbours kept, first {a.first} documents from "
              f"{statistics.mean(g[1] for g in got):.1f} file(s), Spearman {statistics.mean(g[2] for g in got):+.3f} "
              f"(by seed {', '.join(f'{g[2]:+.3f}' for g in got)})")
    if not a.rounds:
        return
    docs = corpus.synthetic_texts(a.docs, seed=7, mean_words=200)
    tok = corpus.train_tokenizer(corpus.synthetic_texts(300, seed=1), vocab_size=1024)
    windows = [0] + [int(w) for w in a.cost_windows.split(",")]
    with tempfile.TemporaryDirectory() as root:
        corpus.write_shards(docs, root, num_files=a.files, row_group_size=a.group)
        runs = {w: [] for w in windows}
        for _ in range(a.rounds):
            for w in windows:
                runs[w].append(measure(root, tok, a.batch_size, a.seq_len, a.workers, a.batches, w))
    base = statistics.median(x for x, _ in runs[0])
    base_first = statistics.median(f for _, f in runs[0])
    for w in windows:
        med, first = statistics.median(x for x, _ in runs[w]), statistics.median(f for _, f in runs[w])
        name = "unshuffled" if not w else f"window {w:4d}"
        print(f"{name:10s} {med / 1e6:6.3f} M tokens/s ({med / base:.2f} of unshuffled), first batch "
              f"{first * 1e3:.0f} ms ({first / base_first:.2f}x)  (rounds: "
              f"{', '.join(f'{x / 1e6:.3f}' for x, _ in runs[w])})")


if __name__ == "__main__":
    main()
