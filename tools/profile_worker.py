"""Where a loader worker's time goes, sampled with py-spy while a training process reads.

    python tools/profile_worker.py                         # the demo corpus, 1 worker, 15 s
    python tools/profile_worker.py --workers 2 --seconds 30 --raw worker.txt
    python tools/profile_worker.py --packing bos_bestfit --workers 2 --process coordinator
    python tools/profile_worker.py --packing bos_bestfit --workers 2 --process coordinator \
        --mixture demo_data/mixture_demo/a,demo_data/mixture_demo/b,demo_data/mixture_demo/c

Builds a CPU `ShmLoader` (B=16, T=2048 by default), takes batches for `--warmup` seconds,
then runs `py-spy record --native` on worker 0 for `--seconds` while this process keeps taking
batches as fast as it can (a consumer that never waits: the workers are the bottleneck).
Prints the share of the worker's samples in each part of its work, judged by the innermost
frame of the worker's own code in each sample (and, for reading, zstd's native frames), and
the loader's tokens/s while it was sampled (the sampler slows the worker; compare shares, not
rates). `--mixture DIR,DIR,...` reads a `Mixture` of those directories, one source each named
by its last part, equal weights (tools/bench/mixture.py's sources: `<cache-dir>/mixture_demo/a`,
`b`, `c`), instead of `--data`. `--process coordinator` samples the coordinator instead and prints the shares of the
innermost functions of shmloader's own code in its samples. Needs `py-spy` (`pip install
py-spy`) and permission to trace a process of your own.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

# (part, what marks a sample as that part), checked in this order against a sample's frames
PARTS = [
    ("sampled check (tiktoken) and its bookkeeping", lambda fr: any(f.startswith("Check.") for f in fr)),
    ("engine encode", lambda fr: _inner(fr, ("_fastokens.<locals>.batch", "Encoder.encode_batch"))),
    ("reading: zstd decompression", lambda fr: _reading(fr) and "ZSTD_" in fr[-1]),
    ("reading: the rest (decode, to_pylist)", lambda fr: _reading(fr)),
    ("inserting BOS", lambda fr: _inner(fr, ("_with_bos",))),
    ("copies into ring slots", lambda fr: _inner(fr, ("write ", "_keep"))),  # the packing's
    ("messages and polls", lambda fr: _inner(fr, ("_service", "_handle", "Connection.", "_loop", "Listener.",
                                                    "_tokenize.<locals>.between"))),
]


def _inner(frames: list[str], names: tuple[str, ...]) -> bool:
    """Whether the innermost frame of shmloader's own code is one of `names` (a prefix)."""
    for frame in reversed(frames):
        if "shmloader/" in frame:
            return (frame.split(" (", 1)[0] + " ").startswith(names)
    return False


def _reading(frames: list[str]) -> bool:
    """Whether the innermost frame of shmloader's own code reads the data: the `Reader`, or a
    format's code (shmloader/data/formats/, where the reading itself is since formats were one
    file each)."""
    for frame in reversed(frames):
        if "shmloader/" in frame:
            return "shmloader/data/formats/" in frame or (frame.split(" (", 1)[0] + " ").startswith(("Reader.", "read_or_skip"))
    return False


def tally(raw: str, key) -> tuple[Counter, int]:
    """(samples per `key(frames)`, all samples) of py-spy's raw format: one
    `frame;frame;... count` per line, outermost frame first."""
    parts, total = Counter(), 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        parts[key(stack.split(";"))] += n
    return parts, total


def classify(raw: str) -> tuple[Counter, int]:
    """(samples per part of the worker's work, all samples)."""
    return tally(raw, lambda frames: next((name for name, match in PARTS if match(frames)), "other"))


def report(parts: Counter, total: int) -> str:
    rows = [f"{'part of the worker':<46} {'samples':>8} {'share':>7}", "-" * 63]
    for name in [p for p, _ in PARTS] + ["other"]:
        rows.append(f"{name:<46} {parts[name]:>8,} {parts[name] / max(total, 1):>7.1%}")
    rows.append(f"{'all':<46} {total:>8,}")
    return "\n".join(rows)


def functions(raw: str) -> tuple[Counter, int]:
    """(samples per innermost function of shmloader's own code, as "name file:line", all
    samples); a sample with none of shmloader's frames counts as "(outside shmloader)"."""
    def innermost(frames: list[str]) -> str:
        own = [f for f in frames if "shmloader/" in f]
        if not own:
            return "(outside shmloader)"
        return own[-1].split(" (", 1)[0] + " " + own[-1].rsplit("/", 1)[-1].rstrip(")")
    return tally(raw, innermost)


def report_functions(parts: Counter, total: int, top: int) -> str:
    rows = [f"{'innermost function of shmloader':<70} {'samples':>8} {'share':>7}", "-" * 87]
    for name, n in parts.most_common(top):
        rows.append(f"{name[:70]:<70} {n:>8,} {n / max(total, 1):>7.1%}")
    rows.append(f"{'all':<70} {total:>8,}")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="directory (or glob) of parquet shards (default: the demo corpus)")
    ap.add_argument("--mixture", help="comma-separated directories of parquet shards read as a mixture, one source "
                    "each named by its last part, equal weights (default: no mixture, --data)")
    ap.add_argument("--tokenizer", help="tokenizer.pkl (default: the demo tokenizer)")
    ap.add_argument("--cache-dir", default="demo_data", help="where the demo corpus is built (default ./demo_data)")
    ap.add_argument("--vocab-size", type=int, default=4096, help="demo tokenizer size when it is built (default 4096)")
    ap.add_argument("--workers", type=int, default=1, help="loader workers; worker 0 is sampled (default 1)")
    ap.add_argument("--packing", default="concat", help="the loader's packing (concat or bos_bestfit; default concat)")
    ap.add_argument("--process", choices=("worker", "coordinator"), default="worker",
                    help="the process sampled: worker 0 or the coordinator (default worker)")
    ap.add_argument("--top", type=int, default=25, help="functions listed for the coordinator (default 25)")
    ap.add_argument("-B", type=int, default=16, help="rows per batch (default 16)")
    ap.add_argument("-T", type=int, default=2048, help="tokens per row (default 2048)")
    ap.add_argument("--seconds", type=int, default=15, help="sampling time (whole seconds; default 15)")
    ap.add_argument("--warmup", type=float, default=2.0, help="batches taken before sampling (s; default 2)")
    ap.add_argument("--rate", type=int, default=200, help="samples per second (default 200)")
    ap.add_argument("--raw", help="also keep py-spy's raw samples in this file")
    args = ap.parse_args(argv)
    # pip puts it beside this Python, which is on PATH only in an activated environment
    spy = shutil.which("py-spy", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    if spy is None:
        raise SystemExit("profile_worker: needs py-spy: pip install py-spy")
    if args.mixture is not None and args.data is not None:
        raise SystemExit("profile_worker: give --mixture or --data, not both")
    if args.data is None and (args.mixture is None or args.tokenizer is None):
        from shmloader.demo import prepare_data

        demo = prepare_data(args.cache_dir, args.vocab_size, log=lambda m: print(m, file=sys.stderr))
        data, tok = str(demo.data_dir), args.tokenizer or str(demo.tokenizer_path)
    else:
        data, tok = args.data, args.tokenizer
    import torch  # noqa: F401  (the training process's own import, before the loader)

    from shmloader import Mixture, ShmLoader

    if args.mixture is not None:
        dirs = {Path(d).name: d for d in args.mixture.split(",") if d}
        if len(dirs) != len([d for d in args.mixture.split(",") if d]):
            raise SystemExit(f"profile_worker: --mixture {args.mixture}: two directories of one name")
        data = Mixture(dirs, dict.fromkeys(dirs, 1))
    with tempfile.TemporaryDirectory(prefix="shmloader-profile-") as tmp, \
            ShmLoader(data, tok, args.B, args.T, packing=args.packing, num_workers=args.workers,
                      device="cpu") as loader:
        end = time.monotonic() + args.warmup
        while time.monotonic() < end:
            next(loader)
        out = args.raw or os.path.join(tmp, "raw.txt")
        debug = loader.debug()
        pid = (debug.coordinator if args.process == "coordinator" else debug.workers[0]).pid
        proc = subprocess.Popen([spy, "record", "--native", "-r", str(args.rate), "-d", str(args.seconds),
                                 "-f", "raw", "-o", out, "-p", str(pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        n, started, deadline = 0, time.monotonic(), time.monotonic() + args.seconds + 60
        while proc.poll() is None and time.monotonic() < deadline:  # py-spy ends after --seconds
            next(loader)
            n += 1
        wall = time.monotonic() - started
        if proc.poll() is None:
            proc.kill()
        err = proc.communicate(timeout=10)[1]
        if proc.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"profile_worker: py-spy failed (exit code {proc.returncode}): {err.strip()}")
        with open(out) as f:
            raw = f.read()
    who = "the coordinator" if args.process == "coordinator" else f"worker 0 of {args.workers}"
    tokens = n * args.B * args.T
    what = f"a mixture of {', '.join(data.names)}" if args.mixture is not None else "one source"
    print(f"{who} (pid {pid}), {args.packing} over {what}, {args.seconds} s at {args.rate}/s; the loader read "
          f"{tokens / wall / 1e6:.2f} M tokens/s meanwhile (slowed by the sampler)")
    print(report(*classify(raw)) if args.process == "worker" else report_functions(*functions(raw), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
