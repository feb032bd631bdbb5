"""A trainer to be killed (tests/loader/test_faults.py): iterates a loader until it is killed.

    python trainer_victim.py DATA TOKENIZER [--workers N] [--batch-size B] [--seq-len T]
        [--split train|val] [--step-s SECONDS]

After its first batch it prints one JSON line to stdout and flushes it:
`{"pid", "coordinator", "workers", "segment", "descendants"}`: its own pid, the loader's
coordinator and worker pids, the name of the loader's shared-memory segment and every live
descendant (the loader's processes plus multiprocessing's forkserver and resource tracker).
Then it keeps taking batches (`--step-s` of "training" each), wrapping epochs, forever.
`--sigterm-exits` installs a SIGTERM handler that exits (sys.exit(0)).
"""
import argparse
import json
import os
import signal
import sys
import time

import shmloader
from restart_trainer import descendants


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="directory of parquet shards")
    ap.add_argument("tokenizer", help="path to tokenizer.pkl")
    ap.add_argument("--workers", type=int, default=2, help="loader worker processes")
    ap.add_argument("--batch-size", type=int, default=2, help="B, rows per batch")
    ap.add_argument("--seq-len", type=int, default=32, help="T, tokens per row")
    ap.add_argument("--split", default="val", help="train or val")
    ap.add_argument("--step-s", type=float, default=0.002, help="seconds of 'training' per batch")
    ap.add_argument("--sigterm-exits", action="store_true",
                    help="install a SIGTERM handler that calls sys.exit(0), as schedulers' users do")
    args = ap.parse_args()
    if args.sigterm_exits:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))

    loader = shmloader.ShmLoader(args.data, args.tokenizer, args.batch_size, args.seq_len, args.split,
                                 num_workers=args.workers, device="cpu")
    next(loader)
    procs = loader.debug()
    print(json.dumps({"pid": os.getpid(), "coordinator": procs.coordinator.pid,
                      "workers": [p.pid for p in procs.workers], "segment": procs.segment,
                      "descendants": descendants(os.getpid())}), flush=True)
    while True:
        next(loader)
        time.sleep(args.step_s)


if __name__ == "__main__":
    main()
