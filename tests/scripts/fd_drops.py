"""Repro of issue 49 item 1: a loader dropped through a reference cycle must close its pipes'
descriptors once, and never a number the caller has opened since.

    python fd_drops.py [--drops N] [--files 8] [--mode loader|trainer|both] [--sleep-s S]

Each drop: a loader (`loader`: a ShmLoader referring to itself; `trainer`: the nanochat
drop-in held by an object that holds a bound method of itself) reads a batch, is dropped and
collected (`gc.collect()`, the collector otherwise disabled as in nanochat's base_train);
the script then opens `--files` files of its own and, once the reaper has finished (or
`--sleep-s` later), checks that each descriptor still points to its file (`os.fstat` st_ino)
and reads it. Every 10th drop a new loader reads a batch (an `OSError` there counts). Prints
per mode: drops where a file was closed or replaced under the script, files so lost, the new
loaders' errors, and the process's descriptors before and after.
"""
import argparse
import gc
import os
import sys
import tempfile

import shmloader
from shmloader.demo import corpus
from shmloader.procs.reaper import REAPER
from tests.helpers import IntTokenizer, position_documents, position_lengths


class Trainer:
    """Holds its val loader and a bound method of itself: only the collector frees it."""

    def __init__(self, data: str):
        self.val = shmloader.tokenizing_distributed_data_loader(2, 32, "val", 2, device="cpu", data=data,
                                                                tokenizer=IntTokenizer())
        self.step = self.evaluate

    def evaluate(self):
        return next(self.val)


def drop_one(mode: str, data: str):
    if mode == "trainer":
        trainer = Trainer(data)
        trainer.step()
    else:
        loader = shmloader.ShmLoader(data, IntTokenizer(), 2, 32, "val", num_workers=2, device="cpu")
        loader.myself = loader
        next(loader)
    trainer = loader = None  # noqa: F841 (dropped: only the collector can free it)
    gc.collect()


def lost_files(n: int, tmp: str, sleep_s: float) -> int:
    """Open `n` files, wait for the reaper (or `sleep_s`), count those no longer ours."""
    opened = []
    for i in range(n):
        path = os.path.join(tmp, f"user_{i}")
        with open(path, "wb") as f:
            f.write(f"file {i}".encode())
        fd = os.open(path, os.O_RDONLY)
        opened.append((fd, os.fstat(fd).st_ino, f"file {i}".encode()))
    if sleep_s:
        import time
        time.sleep(sleep_s)
    REAPER.drain(10.0)
    lost = 0
    for fd, ino, text in opened:
        try:
            ok = os.fstat(fd).st_ino == ino and os.pread(fd, 64, 0) == text
        except OSError:
            ok = False
        lost += not ok
        try:
            os.close(fd)
        except OSError:
            pass
    return lost


def new_loader_fails(data: str) -> bool:
    try:
        with shmloader.ShmLoader(data, IntTokenizer(), 2, 32, "val", num_workers=1, device="cpu") as fresh:
            next(fresh)
        return False
    except OSError as exc:
        print(f"  a new loader's next(): {exc!r}", file=sys.stderr)
        return True


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def run(mode: str, drops: int, files: int, data: str, tmp: str, sleep_s: float):
    before, bad_drops, lost_total, failed = fds(), 0, 0, 0
    for k in range(drops):
        drop_one(mode, data)
        lost = lost_files(files, tmp, sleep_s)
        bad_drops += lost > 0
        lost_total += lost
        if k % 10 == 9:
            failed += new_loader_fails(data)
    REAPER.drain(10.0)
    print(f"{mode}: {bad_drops} of {drops} drops lost a file ({lost_total} of {drops * files} files closed "
          f"or replaced under the script); new loaders failing: {failed} of {drops // 10}; "
          f"fds {before} -> {fds()}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--drops", type=int, default=30, help="drops per mode")
    ap.add_argument("--files", type=int, default=8, help="files the script opens after each drop")
    ap.add_argument("--mode", choices=["loader", "trainer", "both"], default="both")
    ap.add_argument("--sleep-s", type=float, default=0.0, help="seconds to hold the files before the reaper drains")
    args = ap.parse_args()
    gc.disable()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        corpus.write_shards(position_documents(position_lengths()), data, num_files=4, row_group_size=[30, 1, 13, 64])
        for mode in (["loader", "trainer"] if args.mode == "both" else [args.mode]):
            run(mode, args.drops, args.files, data, tmp, args.sleep_s)


if __name__ == "__main__":
    main()
