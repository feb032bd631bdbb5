"""One source's shuffled order as the run's processes read it (`shuffle.of_run`), per call,
side by side with another checkout (`--compare DIR`): before issue 50 one source's order was
its bare `Shuffle`, since then a `Sourced` of one, which each call asks for its file's source.

Over 16 files of 8 units of 256 rows (the row counts alone; no data is read), `shuffle=True`,
seed 1, the default window, rank 0 of 1, epoch 1, in microseconds, the median of `--calls`
calls (each call timed in a batch of 100):
- `rows_us`: `order.rows(1, f, u, 256)` of `of_run`'s order, f and u in turn;
- `members_us`: `shuffle.Windows(...).members(1, f, u)` of each window's head in turn (its
  epoch's windows kept after the first call, as the coordinator keeps them);
- `read_us`: `shuffle.read` of a 64-document piece of a window, rows read as short strings.

Each checkout runs in a fresh process of its own (tools/bench/children.py), alternating, for
`--rounds` rounds; each round's ratios (this checkout's time over the other's) and their median
are printed with the load average.

    python -m tools.bench.sourced --compare /tmp/base --rounds 8
"""
import argparse
import inspect
import itertools
import os
import statistics
import tempfile
import time
from types import SimpleNamespace

from tools.bench import children

FILES, UNITS, ROWS = 16, 8, 256
FIGURES = ("rows_us", "members_us", "read_us")


def _per_call(fn, calls: int, batch: int = 100) -> float:
    """The median time of one call of `fn()` in microseconds, over `calls` batches of `batch` calls."""
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        ts.append((time.perf_counter() - t) / batch)
    return statistics.median(ts) * 1e6


def measure(cfg: dict) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shmloader import kinds
    from shmloader.config import LoaderConfig
    from shmloader.data import shuffle
    from shmloader.data.order import Piece

    root, calls = cfg["root"], cfg["calls"]
    for f in range(FILES):  # the catalogue's files (their footers are never read here)
        path = os.path.join(root, f"s{f:03d}.parquet")
        if not os.path.exists(path):
            pq.write_table(pa.table({"text": ["x"] * 2}), path)
    counts = [[ROWS] * UNITS for _ in range(FILES)]
    config = LoaderConfig(B=2, T=8, shuffle=True, seed=1)
    kind = kinds.of(root, "train")
    run = SimpleNamespace(files=[f"f{i}" for i in range(FILES)], mixture=None, **kind.run_fields(config))
    order = shuffle.of_run(config, run)
    units = [(f, u) for f in range(FILES) for u in range(UNITS)]
    at = itertools.cycle(units)

    def rows():
        f, u = next(at)
        order.rows(1, f, u, ROWS)

    # `Windows(order, row_counts, [n_files,] world)`: before issue 50 it took the file count too
    named = {"n_files": FILES} if "n_files" in inspect.signature(shuffle.Windows).parameters else {}
    windows = shuffle.Windows(order, counts.__getitem__, world=1, **named)
    heads = [w.head for w in shuffle.share(config.order, 1, counts, 0, 1)]
    turn = itertools.cycle(heads)

    def members():
        f, u = next(turn)
        windows.members(1, f, u)

    window = shuffle.share(config.order, 1, counts, 0, 1)[0]
    piece = Piece(0, 1, *window.head, 0, 64, members=window.members)
    texts = [f"document {r}" for r in range(ROWS)]

    def read():
        shuffle.read(lambda f, g, lo, hi: texts[lo:hi], order, piece)

    return {"rows_us": _per_call(rows, calls), "members_us": _per_call(members, calls),
            "read_us": _per_call(read, calls, batch=20)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8, help="rounds, each checkout once a round (count)")
    p.add_argument("--calls", type=int, default=50, help="batches of calls a figure (count; their median is reported)")
    children.add_compare_arg(p)
    args = p.parse_args(argv)
    children.check_compare(p, args)
    with tempfile.TemporaryDirectory(prefix="bench-sourced-") as root:
        print(f"load average {os.getloadavg()[0]:.1f}")
        labels, rounds = children.each_round(args.compare, args.rounds, "sourced:measure",
                                             {"root": root, "calls": args.calls}, alternate=True)
        for r in range(args.rounds):
            print(f"round {r + 1}: " + "; ".join(
                f"{label} " + ", ".join(f"{k} {rounds[label][r][k]:.2f}" for k in FIGURES) for label in labels))
        if len(labels) == 2:
            before, ours = (rounds[label] for label in labels)
            for k in FIGURES:
                ratios = [o[k] / b[k] for b, o in zip(before, ours)]
                print(f"{k}: median {statistics.median(b[k] for b in before):.2f} before, "
                      f"{statistics.median(o[k] for o in ours):.2f} this checkout; ratio median "
                      f"{statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})")
        print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
