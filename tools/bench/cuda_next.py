"""What `next()` with its batch ready costs the training process on CUDA after a pause, beside
what the CUDA calls it makes cost alone after the same pause.

    python tools/bench/cuda_next.py                        # on a GPU machine
    python tools/bench/cuda_next.py --device cpu           # the harness (CPU rows only)

Per pause (the caller sleeps that long before each call; 0: back to back), the median over `--n`
calls of the calling thread's CPU time (`time.thread_time`) and of the process's (getrusage:
every thread, the CUDA runtime's own too) of:

- `next(loader)`: shmloader, concat, B=16, T=2048, `--workers` workers, half its ring ready
  before each call is timed (the batch is there: no wait);
- `query`: `event.query()` of an event whose copy has completed (what `next()` asks of each
  copy in flight);
- `event`: `torch.cuda.Event(blocking=True)` then `record()` (one per batch);
- `copy`: issuing a non-blocking copy of a page-locked B*T+1 row into a device buffer;
- `kernel`: a trivial kernel's launch (`torch.Tensor.add_` on one element): the price of any
  CUDA call after the pause;
- `together`: query, event and copy one after the other after one pause, as a `next()` makes
  them (each row above pays the pause's wake-up on its own).

Before each `next()` the loader is polled every 2 ms until half its ring is ready, so its "0"
row follows a short sleep or none; the CUDA rows' follow a `torch.cuda.synchronize()`.

tools/gpu_check.py's "trainer cost" (process CPU of `next()` after a 20 ms sleep) is the
loader's row at 0.02 s; this says which share of it is the loader's own work.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench, its shmloader)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import corpora, measure, results  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = results.parser("cuda_next", __doc__)
    p.add_argument("--device", default="cuda", help="device (default cuda; cpu: the loader's row alone)")
    p.add_argument("--pauses", type=float, nargs="+", default=[0.0, 0.001, 0.02],
                   help="sleeps before each call (seconds; default 0 0.001 0.02)")
    p.add_argument("--n", type=int, default=100, help="calls per row and pause (calls; default 100)")
    p.add_argument("--workers", type=int, default=4, help="the loader's workers (processes; default 4)")
    corpora.add_args(p, many=False)
    results.add_json_arg(p, "cuda_next")
    args = p.parse_args(argv)
    if args.n < 3 or args.workers < 1 or min(args.pauses) < 0:
        p.error("--n must be >= 3, --workers >= 1, --pauses >= 0")
    corpora.check_args(p, args)
    return args


def timed(fn, pause: float, n: int, before=None) -> dict:
    """Median thread and process CPU (us) of `fn()` over `n` calls, each after `before()` and `pause`."""
    thread, process = [], []
    for _ in range(n):
        if before is not None:
            before()
        if pause:
            time.sleep(pause)
        t0, p0 = time.thread_time(), measure.cpu_s()
        fn()
        thread.append(time.thread_time() - t0)
        process.append(measure.cpu_s() - p0)
    return {"thread_us": statistics.median(thread) * 1e6, "process_us": statistics.median(process) * 1e6}


def main(argv=None) -> int:
    args, began = parse_args(argv), results.begin()  # before torch: `--help` needs none (~1.5 CPU-s)
    import torch

    from shmloader import ShmLoader

    corpus = corpora.resolve(args)[0]
    B, T = 16, 2048
    cuda = torch.device(args.device).type == "cuda"
    rows = {}
    loader = ShmLoader(corpus.data, corpus.tokenizer, B, T, "train", num_workers=args.workers, device=args.device)
    try:
        for _ in range(50):
            next(loader)

        def ring_full():  # half the ring announced: the next batch is ready
            end = time.monotonic() + 5
            while (s := loader.stats())["ring_ready"] < s["ring_slots"] // 2 and time.monotonic() < end:
                time.sleep(0.002)

        rows["next"] = {p: timed(lambda: next(loader), p, args.n, ring_full) for p in args.pauses}
    finally:
        loader.close()
    if cuda:
        src = torch.empty(B * T + 1, dtype=torch.int64, pin_memory=True)
        dst = torch.empty(B * T + 1, dtype=torch.int64, device=args.device)
        one = torch.zeros(1, device=args.device)
        done = torch.cuda.Event()
        done.record()
        torch.cuda.synchronize()

        def event():
            torch.cuda.Event(blocking=True).record()

        def together():
            done.query()
            dst.copy_(src, non_blocking=True)
            event()

        calls = {"query": done.query, "event": event, "copy": lambda: dst.copy_(src, non_blocking=True),
                 "kernel": lambda: one.add_(1), "together": together}
        for name, fn in calls.items():
            rows[name] = {p: timed(fn, p, args.n, torch.cuda.synchronize) for p in args.pauses}
    figures = {"config": {"device": args.device, "B": B, "T": T, "workers": args.workers, "n": args.n,
                          "pauses": args.pauses, "corpus": corpus.name or corpus.data},
               "rows": {name: {str(p): v for p, v in by.items()} for name, by in rows.items()}}
    results.publish(args.json, "cuda_next", began, figures, argv, report)
    return 0


def report(run: dict) -> str:
    c = run["config"]
    head = ("call",) + tuple(f"after {float(p) * 1e3:g} ms: thread / process us" for p in c["pauses"])
    rows = [(name,) + tuple(f"{v['thread_us']:,.1f} / {v['process_us']:,.1f}" for v in by.values())
            for name, by in run["rows"].items()]
    return "\n".join([f"CPU of one call on {c['device']} (median of {c['n']}), B={c['B']}, T={c['T']}, "
                      f"{c['workers']} workers, corpus {c['corpus']}", results.table(head, rows)])


if __name__ == "__main__":
    sys.exit(main())
