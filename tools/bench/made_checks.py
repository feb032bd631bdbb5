"""Two small costs of a new user's data, side by side with another checkout (`--compare DIR`):

- `check_units`: the refusals when a loader is made (kinds.py `check_units`: a rank without a
  unit, and one whose units' footers say they hold no document, data/units.py), for rank 1 of
  8 over 20 parquet files of 50 row groups written with statistics, in the files' order and
  shuffled; median of `--calls` calls, in microseconds;
- `ids_with_bos`: a piece of 1,024 token-id documents of 50-1,500 ids made into the stream
  (procs/worker.py `ids_with_bos`), none and all of them already beginning with BOS; median
  of `--calls` calls, in milliseconds.

Each checkout runs in a fresh process of its own (tools/bench/children.py), alternating, for
`--rounds` rounds.

    python -m tools.bench.made_checks --compare /tmp/base --rounds 3
"""
import argparse
import os
import statistics
import tempfile
import time
from types import SimpleNamespace

from tools.bench import children


def measure(cfg: dict) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shmloader import kinds
    from shmloader.data.source import Ids
    from shmloader.procs import worker

    root, calls = cfg["root"], cfg["calls"]
    if not os.path.exists(os.path.join(root, "s019.parquet")):
        for f in range(20):
            pq.write_table(pa.table({"text": [f"doc {i} of file {f}" for i in range(500)]}),
                           os.path.join(root, f"s{f:03d}.parquet"), row_group_size=10)
    out = {}
    for name, order in (("files_order_us", None), ("shuffled_us", "shuffled")):
        kind, config = kinds.of(root, "train"), SimpleNamespace(order=order)
        ts = []
        for _ in range(calls):
            t = time.perf_counter()
            kind.check_units(config, 1, 8)
            ts.append(time.perf_counter() - t)
        out[name] = statistics.median(ts) * 1e6
    rng = np.random.default_rng(0)
    for name, first in (("ids_plain_ms", []), ("ids_with_bos_ms", [7])):
        docs = Ids(np.array(first + rng.integers(8, 50_000, rng.integers(50, 1500)).tolist(), dtype=np.int64)
                   for _ in range(1024))
        ts = []
        for _ in range(calls):
            t = time.perf_counter()
            worker.ids_with_bos(docs, 7, np.uint32)
            ts.append(time.perf_counter() - t)
        out[name] = statistics.median(ts) * 1e3
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds, each checkout once a round")
    p.add_argument("--calls", type=int, default=200, help="calls a measurement (its median is reported)")
    children.add_compare_arg(p)
    args = p.parse_args(argv)
    children.check_compare(p, args)
    with tempfile.TemporaryDirectory(prefix="made-checks-") as root, children.checkouts(args.compare) as cks:
        print(f"load average {os.getloadavg()[0]:.1f}")
        for r in range(args.rounds):
            for ck in cks:
                got = children.run("made_checks:measure", {"root": root, "calls": args.calls}, ck)
                print(f"round {r + 1} {ck.label or 'this checkout'}: check_units files' order "
                      f"{got['files_order_us']:.0f} us, shuffled {got['shuffled_us']:.0f} us; ids_with_bos "
                      f"{got['ids_plain_ms']:.2f} ms (none begin with BOS), {got['ids_with_bos_ms']:.2f} ms (all do)")
        print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
