"""A process's first loader, for tests/loader/test_boot.py: it builds one loader (its process's
first, so the forkserver boots meanwhile, `SLOW_PRELOAD_S` s longer), takes batches and writes,
as one JSON line: per batch the window's tokens, whether its workers had started when it came
(`started`), the state after it; then `head_batches` and the workers' pids at the end.

    python first_loader.py DATA TOKENIZER B T N [--workers W] [--resume STATE.json]
        [--step-s S] [--drop-at K] [--positions]

`--kill-server`: the forkserver killed after the first batch. `--boot-s S`: `start.BOOT_S` set to S. `--tempdir D`: `tempfile.tempdir`
set to D first. `--pause-s S`: a pause after the first batch (`after_pause`: whether the workers had started
and the batches the ring held then, no `next()` between; `--pause-until-ready`: at most S, until the workers started
and the ring holds a batch). `--drop-at K`: after K batches the loader is dropped (children maybe unstarted) and the
script checks nothing of it is left, then exits."""
import argparse
import gc
import json
import os
import sys
import time

from shmloader.procs import start

if float(os.environ.get("SLOW_PRELOAD_S", "0")):
    start.PRELOAD.insert(0, "tests.slow_preload")

import shmloader  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("tokenizer")
    ap.add_argument("B", type=int)
    ap.add_argument("T", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--resume")
    ap.add_argument("--step-s", type=float, default=0.0)
    ap.add_argument("--drop-at", type=int)
    ap.add_argument("--positions", action="store_true")
    ap.add_argument("--pause-s", type=float, default=0.0, help="after the first batch (a compile's first step)")
    ap.add_argument("--pause-until-ready", action="store_true",
                    help="end the pause (at most --pause-s) once the workers started and the ring holds a batch")
    ap.add_argument("--kill-server", action="store_true", help="SIGKILL the booting forkserver after the first batch")
    ap.add_argument("--tempdir", help="tempfile.tempdir, set before the loader is built")
    ap.add_argument("--boot-s", type=float, help="start.BOOT_S: how long a server's boot is waited for at most")
    args = ap.parse_args()
    if args.boot_s is not None:
        start.BOOT_S = args.boot_s
    if args.tempdir:
        import tempfile
        tempfile.tempdir = args.tempdir
    loader = shmloader.ShmLoader(args.data, args.tokenizer, args.B, args.T, num_workers=args.workers,
                                 device="cpu", positions=args.positions)
    if args.resume:
        with open(args.resume) as f:
            loader.load_state_dict(json.load(f))
    out = {"batches": []}
    began = time.monotonic()
    for k in range(args.n):
        if args.drop_at is not None and k == args.drop_at:
            out["unstarted_at_drop"] = [p.pid for p in loader.debug(start=False).workers].count(None)
            segment = loader.debug(start=False).segment
            del loader
            gc.collect()
            out["segment_left"] = os.path.exists(f"/dev/shm/{segment}")
            break
        batch = next(loader)
        if k == 0:
            out["first_s"] = time.monotonic() - began
            out["started_at_first"] = all(p.pid is not None for p in loader.debug(start=False).workers)
            if args.kill_server:
                import multiprocessing.forkserver
                import signal
                os.kill(multiprocessing.forkserver._forkserver._forkserver_pid, signal.SIGKILL)
            if args.pause_until_ready:  # the pause ends once the workers started and the ring holds a batch
                deadline = time.monotonic() + args.pause_s
                while time.monotonic() < deadline:
                    if all(p.pid is not None for p in loader.debug(start=False).workers) and \
                            loader.stats()["ring_ready"] > 0:
                        break
                    time.sleep(0.01)
            else:
                time.sleep(args.pause_s)
            out["after_pause"] = {"started": all(p.pid is not None for p in loader.debug(start=False).workers),
                                  "ring_ready": loader.stats()["ring_ready"]}
        started = all(p.pid is not None for p in loader.debug(start=False).workers)
        window = batch[0].reshape(-1).tolist() + batch[1].reshape(-1)[-1:].tolist()
        rec = {"window": window, "started": started, "state": loader.state_dict()}
        if args.positions:
            rec["positions"] = batch[2].reshape(-1).tolist()
        out["batches"].append(rec)
        time.sleep(args.step_s)
    else:
        out["head_batches"] = loader.stats()["head_batches"]
        out["pids"] = [p.pid for p in loader.debug().workers]
        loader.close()
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
