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
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children  # noqa: E402

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


def one_round(cfg: dict) -> dict:
    """us of coordinator CPU a batch over the window, whole and by part (this process's package;
    `cfg`: the arguments, `parts` the parts file's prefix; run in a fresh process by `children.run`)."""
    os.environ[ENV] = cfg["parts"]  # before the loader starts its processes: its coordinator times its parts
    import shmloader
    opts = {"cache_dir": cfg["token_cache"]} if cfg["token_cache"] else {}
    with shmloader.ShmLoader(cfg["data"], cfg["tokenizer"], cfg["B"], cfg["T"], "train", packing=cfg["packing"],
                             num_workers=cfg["workers"], device="cpu", **opts) as loader:
        it = iter(loader)
        for _ in range(cfg["warmup"]):
            next(it)
        pid = loader.debug().coordinator.pid
        path = f"{cfg['parts']}.{pid}.json"
        first, cpu0, t0 = _parts_at(path), _cpu_ns(pid), time.perf_counter()
        for _ in range(cfg["batches"]):
            next(it)
        cpu1, t1 = _cpu_ns(pid), time.perf_counter()
        time.sleep(0.1)
        last = _parts_at(path) if first is not None else None
    n_batches = cfg["batches"]
    out = {"whole": (cpu1 - cpu0) / n_batches / 1e3, "batches_per_s": n_batches / (t1 - t0), "parts": {}}
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
    children.add_compare_arg(p, "the loader")
    args = p.parse_args(argv)
    if min(args.workers, args.B, args.T, args.batches, args.rounds) < 1 or args.warmup < 0:
        p.error("every count must be >= 1 (--warmup >= 0)")
    children.check_compare(p, args)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = {k: getattr(args, k) for k in ("data", "tokenizer", "packing", "workers", "B", "T", "token_cache",
                                         "warmup", "batches")}
    cfg["data"], cfg["tokenizer"] = os.path.abspath(cfg["data"]), os.path.abspath(cfg["tokenizer"])
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="coordinator_parts_") as tmp:
        labels, rounds = children.each_round(args.compare, args.rounds, "coordinator_parts:one_round",
                                             lambda r, i: dict(cfg, parts=f"{tmp}/{r}.{i}"))
    print(f"{args.packing}, B={args.B} T={args.T}, {args.workers} workers, token cache {args.token_cache}, "
          f"{args.batches} batches a round after {args.warmup}, medians of {args.rounds} rounds; "
          f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    med = lambda label, f: statistics.median(f(r) for r in rounds[label])  # noqa: E731
    def row(name, value, digits):
        print(f"{name:<30}" + "".join(f"{med(label, value):>16.{digits}f}" for label in labels))

    print(f"{'us of coordinator CPU a batch':<30}" + "".join(f"{label:>16}" for label in labels))
    row("whole (all its threads)", lambda r: r["whole"], 0)
    row("batches/s", lambda r: r["batches_per_s"], 0)
    names = sorted({k for rs in rounds.values() for r in rs for k in r["parts"]},
                   key=lambda k: -max(med(label, lambda r: r["parts"].get(k, 0.0)) for label in labels))
    for name in names:
        row(name, lambda r: r["parts"].get(name, 0.0), 1)  # noqa: B023 (called at once)
    return 0


if __name__ == "__main__":
    sys.exit(main())
