"""What a heal costs the training loop: the longest next() around a killed worker and a killed
coordinator (SIGKILL), and around a stopped one (SIGSTOP, healed after `stall_s`).

    python tools/bench_heal.py                       # demo corpus, 2 workers, B=16, T=2048
    python tools/bench_heal.py --faults 10 --packing bos_bestfit --json heal.json

For each kind of fault, `--faults` times: a loader reads as fast as it can (a consumer that
never waits: the workers are the bottleneck) for `--settle` s, then the child is signalled
and the loader read for `--after` s more. Reported per kind: the longest next() in the
window after the signal (the heal: the death seen, every child started again from the
state, the first batch of the new run), against the longest next() of the same loader in
the `--settle` s before it (no fault), medians and maxima over the faults; and whether each
batch after the heal is the one an uninterrupted loader yields (the stream is checked, not
assumed). Numbers are this machine's: compare kinds and packings in one run.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="loader workers (default 2)")
    p.add_argument("--batch-size", type=int, default=16, help="B (rows; default 16)")
    p.add_argument("--seq-len", type=int, default=2048, help="T (tokens; default 2048)")
    p.add_argument("--packing", choices=("concat", "bos_bestfit"), default="concat")
    p.add_argument("--faults", type=int, default=5, help="faults of each kind (default 5)")
    p.add_argument("--settle", type=float, default=2.0, help="s of reading before each fault (default 2)")
    p.add_argument("--after", type=float, default=3.0, help="s of reading after each fault (default 3)")
    p.add_argument("--stall-s", type=float, default=1.0, help="the loaders' stall_s for the SIGSTOP kind (default 1)")
    p.add_argument("--data", default=None, help="parquet shards (default: the demo corpus in --cache-dir)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: the demo corpus's)")
    p.add_argument("--cache-dir", type=Path, default=Path("demo_data"), help="where the demo corpus is (default demo_data)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    return p.parse_args(argv)


def one_fault(make, kind: str, args) -> dict:
    """One loader: settle, signal a child (`kind`: worker-SIGKILL, coordinator-SIGKILL,
    worker-SIGSTOP), read on; the longest next() before and after, and the stream checked
    against a loader without the fault."""
    import torch

    loader = make()
    got = []
    try:
        it = iter(loader)
        x, y = next(it)  # the start-up, not a step
        got.append(torch.cat([x.reshape(-1), y.reshape(-1)]).clone())
        before, t0 = 0.0, time.monotonic()
        while time.monotonic() - t0 < args.settle:
            c = time.perf_counter()
            x, y = next(it)
            before = max(before, time.perf_counter() - c)
            got.append(torch.cat([x.reshape(-1), y.reshape(-1)]).clone())
        who, sig = kind.split("-")
        d = loader.debug()
        pid = (d.coordinator if who == "coordinator" else d.workers[0]).pid
        os.kill(pid, getattr(signal, sig))
        after, first_after, t1 = 0.0, None, time.monotonic()
        while time.monotonic() - t1 < args.after:
            c = time.perf_counter()
            x, y = next(it)
            took = time.perf_counter() - c
            after = max(after, took)
            first_after = took if first_after is None else first_after
            got.append(torch.cat([x.reshape(-1), y.reshape(-1)]).clone())
        heals = loader.stats()["heals"]
    finally:
        loader.close()
    with make() as ref:  # the same stream without a fault
        same = all(torch.equal(a, torch.cat([x.reshape(-1), y.reshape(-1)]))
                   for a, (x, y) in zip(got, ref))
    return {"kind": kind, "before_s": before, "after_s": after, "heals": heals, "batches": len(got),
            "same_stream": same}


def main(argv=None) -> int:
    args = parse_args(argv)
    import shmloader

    if args.data is None:
        from shmloader.demo import prepare_data

        demo = prepare_data(args.cache_dir, log=lambda m: print(m, file=sys.stderr))
        data, tok = str(demo.data_dir), args.tokenizer or str(demo.tokenizer_path)
    else:
        data, tok = args.data, args.tokenizer
    make = lambda: shmloader.ShmLoader(data, tok, args.batch_size, args.seq_len, "train",  # noqa: E731
                                       packing=args.packing, num_workers=args.workers, device="cpu",
                                       max_restarts=1000, stall_s=args.stall_s, idle_release_s=0)
    rows = []
    for kind in ("worker-SIGKILL", "coordinator-SIGKILL", "worker-SIGSTOP"):
        for i in range(args.faults):
            r = one_fault(make, kind, args)
            print(f"{kind} {i + 1}/{args.faults}: longest next() {r['after_s'] * 1e3:.0f} ms after the fault, "
                  f"{r['before_s'] * 1e3:.0f} ms before; {r['heals']} heal(s); stream "
                  f"{'the same' if r['same_stream'] else 'DIFFERENT'} over {r['batches']} batches", file=sys.stderr)
            rows.append(r)
    print(f"heal cost, {args.packing}, {args.workers} workers, B={args.batch_size}, T={args.seq_len}, "
          f"{args.faults} faults of each kind (stall_s={args.stall_s:g} for SIGSTOP): longest next() after the fault "
          f"vs before it (ms, median / max over faults)")
    for kind in ("worker-SIGKILL", "coordinator-SIGKILL", "worker-SIGSTOP"):
        rs = [r for r in rows if r["kind"] == kind]
        a, b = [r["after_s"] * 1e3 for r in rs], [r["before_s"] * 1e3 for r in rs]
        print(f"  {kind:20s} after {statistics.median(a):6.0f} / {max(a):6.0f}   before {statistics.median(b):5.0f} / "
              f"{max(b):5.0f}   heals {sum(r['heals'] for r in rs)}/{len(rs)}   stream the same: "
              f"{sum(r['same_stream'] for r in rs)}/{len(rs)}")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    return 0 if all(r["same_stream"] and r["heals"] == 1 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
