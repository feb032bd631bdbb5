"""The live coordinator's CPU a batch, whole and by part, while a training process reads.

    python tools/bench/coordinator_parts.py --data /tmp/bq/nanochat_corpus/base_data \
        --tokenizer /tmp/bq/tokenizer/tokenizer.pkl --compare /tmp/before --rounds 3

Each round, in a fresh process per checkout (interleaved): a `ShmLoader(data, tokenizer, B, T,
packing=--packing, num_workers=--workers)` (with `--token-cache`, its `cache_dir`) is read as fast
as it goes, `--warmup` batches first, then `--batches` more; the coordinator's CPU over that
window is read from `/proc/<pid>/task/*/schedstat` (all its threads, nanoseconds). With
`SHMLOADER_COORDINATOR_PARTS` set for it (shmloader/procs/parts.py) the coordinator also times its
parts with `time.thread_time_ns`; a checkout without that module gives its whole only. Each
figure is the median of the rounds, in us of CPU a batch; a part includes the parts it calls
(see procs/parts.py). The wrappers add ~10 us a batch to the whole.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__ and "--round" not in sys.argv:  # run as a file: this checkout first on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (a round: its PYTHONPATH's package)

ENV = "SHMLOADER_COORDINATOR_PARTS"  # procs/parts.py's


def _cpu_ns(pid: int) -> int:
    return sum(int(Path(f).read_text().split()[0]) for f in glob.glob(f"/proc/{pid}/task/*/schedstat"))


def _parts_at(path: str, timeout: float = 10.0) -> dict | None:
    """The parts file's latest write (None: this checkout writes none)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return json.loads(Path(path).read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    return None


def one_round(args) -> dict:
    """us of coordinator CPU a batch over the window, whole and by part (this process's package)."""
    import shmloader
    opts = {"cache_dir": args.token_cache} if args.token_cache else {}
    with shmloader.ShmLoader(args.data, args.tokenizer, args.B, args.T, "train", packing=args.packing,
                             num_workers=args.workers, device="cpu", **opts) as loader:
        it = iter(loader)
        for _ in range(args.warmup):
            next(it)
        pid = loader.debug().coordinator.pid
        path = f"{os.environ.get(ENV, '')}.{pid}.json"
        first, cpu0, t0 = _parts_at(path) if os.environ.get(ENV) else None, _cpu_ns(pid), time.perf_counter()
        for _ in range(args.batches):
            next(it)
        cpu1, t1 = _cpu_ns(pid), time.perf_counter()
        time.sleep(0.1)
        last = _parts_at(path) if first is not None else None
    out = {"whole": (cpu1 - cpu0) / args.batches / 1e3, "batches_per_s": args.batches / (t1 - t0), "parts": {}}
    if first is not None and last is not None and last["batches"] > first["batches"]:
        n = last["batches"] - first["batches"]
        out["parts"] = {k: (v - first["spent"].get(k, 0)) / n / 1e3 for k, v in last["spent"].items()}
        out["parts"]["main thread"] = (last["thread_ns"] - first["thread_ns"]) / n / 1e3
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], prog="python tools/bench/coordinator_parts.py")
    p.add_argument("--data", required=True, help="directory of parquet shards")
    p.add_argument("--tokenizer", required=True, help="tokenizer.pkl (tiktoken) or another the loader takes")
    p.add_argument("--packing", default="bos_bestfit", help="concat or bos_bestfit (default bos_bestfit)")
    p.add_argument("--workers", type=int, default=2, help="loader workers (default 2)")
    p.add_argument("-B", type=int, default=32, help="rows per batch (default 32)")
    p.add_argument("-T", type=int, default=2048, help="tokens per row (default 2048)")
    p.add_argument("--token-cache", help="the loader's cache_dir (default: none)")
    p.add_argument("--warmup", type=int, default=300, help="batches read before the window (default 300)")
    p.add_argument("--batches", type=int, default=1500, help="batches in the window (default 1500)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; medians reported (default 3)")
    p.add_argument("--compare", metavar="DIR", help="also run DIR's package (another checkout), interleaved")
    p.add_argument("--round", action="store_true", help=argparse.SUPPRESS)  # a child: one round, JSON out
    args = p.parse_args(argv)
    if min(args.workers, args.B, args.T, args.batches, args.rounds) < 1 or args.warmup < 0:
        p.error("every count must be >= 1 (--warmup >= 0)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.round:
        print(json.dumps(one_round(args)))
        return 0
    here = str(Path(__file__).resolve().parents[2])
    checkouts = [("this checkout", here)] + ([("compare", str(Path(args.compare).resolve()))] if args.compare else [])
    child = list(argv if argv is not None else sys.argv[1:])
    if "--compare" in child:
        at = child.index("--compare")
        del child[at:at + 2]
    load0, rounds = os.getloadavg()[0], {label: [] for label, _ in checkouts}
    with tempfile.TemporaryDirectory(prefix="coordinator_parts_") as tmp:
        for r in range(args.rounds):
            for label, root in checkouts:
                env = dict(os.environ, PYTHONPATH=root, **{ENV: f"{tmp}/{r}.{len(rounds[label])}.{label[:4]}"})
                done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--round", *child], env=env,
                                      check=True, capture_output=True, text=True, cwd=root)
                rounds[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{args.packing}, B={args.B} T={args.T}, {args.workers} workers, token cache {args.token_cache}, "
          f"{args.batches} batches a round after {args.warmup}, medians of {args.rounds} rounds; "
          f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    med = lambda label, f: statistics.median(f(r) for r in rounds[label])  # noqa: E731
    def row(name, value, digits):
        print(f"{name:<30}" + "".join(f"{med(label, value):>16.{digits}f}" for label, _ in checkouts))

    print(f"{'us of coordinator CPU a batch':<30}" + "".join(f"{label:>16}" for label, _ in checkouts))
    row("whole (all its threads)", lambda r: r["whole"], 0)
    row("batches/s", lambda r: r["batches_per_s"], 0)
    names = sorted({k for rs in rounds.values() for r in rs for k in r["parts"]},
                   key=lambda k: -max(med(label, lambda r: r["parts"].get(k, 0.0)) for label, _ in checkouts))
    for name in names:
        row(name, lambda r: r["parts"].get(name, 0.0), 1)  # noqa: B023 (called at once)
    return 0


if __name__ == "__main__":
    sys.exit(main())
