"""Count the system calls a trainer makes in `next()`, with strace, in a training loop's rhythm.

`trace_next(...)` starts a trainer process (this module's `child`), which builds a CPU
`ShmLoader`, takes one batch, then the batches a head start made and the first from the ring
(the hand-over from the trainer's batches to the ring's is not the steady state), each time
waiting until the ring holds ready batches, and then runs `n`
steps of a training loop: `spin_ms` of busy work (a step's compute, no system call: the
clock it spins on is read through the vDSO), then `x, y = next(loader)` and `loader.stats()`
(counted with it: stats() makes none). strace is attached
to the trainer's main thread only (torch's threads are not the loader's) for those steps,
which lie between two `getppid()` markers; every system call between the markers is counted.
The child also reports how many of the `n` calls found no batch ready (they block, and may
make system calls: NOTE [slot handover]).

Used by tests/loader/test_handover.py and tools/bench/trainer.py; needs `strace` (`available()`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

MARKER = "getppid"


def available() -> bool:
    return shutil.which("strace") is not None


def trace_next(data: str, tokenizer_pkl: str, *, B: int, T: int, n: int = 200, spin_ms: float = 5.0,
               num_workers: int = 1, packing: str = "concat", env: dict | None = None,
               loader_options: dict | None = None, timeout: float = 120.0) -> dict:
    """Run the child under strace; returns `{"calls": [names...], "per_next": float, "n": n,
    "not_ready": int, "by_name": {name: count}}`."""
    config = {"data": data, "tokenizer": tokenizer_pkl, "B": B, "T": T, "n": n, "spin_ms": spin_ms,
              "num_workers": num_workers, "packing": packing, "options": loader_options or {}}
    with tempfile.TemporaryDirectory(prefix="shml_strace_") as tmp:
        out = os.path.join(tmp, "trace.txt")
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "child", json.dumps(config)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, **(env or {})})
        tracer = None
        watchdog = threading.Timer(timeout, lambda: [p.kill() for p in (child, tracer) if p is not None])
        watchdog.start()  # every read below blocks until the child or strace writes, or dies
        try:
            line = child.stdout.readline().split()
            if line[:1] != ["ready"]:
                raise RuntimeError(f"the traced trainer did not start (or took over {timeout:.0f} s): {line}")
            tracer = subprocess.Popen(["strace", "-p", line[1], "-o", out], stderr=subprocess.PIPE, text=True)
            tracer.stderr.readline()  # "strace: Process N attached"
            child.stdin.write("go\n")
            child.stdin.flush()
            line = child.stdout.readline()
            if not line:
                raise RuntimeError(f"the traced trainer ended without a result (or took over {timeout:.0f} s)")
            result = json.loads(line)
            child.wait(timeout)
            tracer.wait(timeout)
        finally:
            watchdog.cancel()
            for p in (child, tracer):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()
        with open(out) as f:
            calls = _between_markers(f.read().splitlines())
    by_name = {}
    for name in calls:
        by_name[name] = by_name.get(name, 0) + 1
    return {"calls": calls, "by_name": by_name, "n": n, "per_next": len(calls) / n,
            "not_ready": result["not_ready"]}


def _between_markers(lines: list[str]) -> list[str]:
    names = [m.group(1) for line in lines if (m := re.match(r"(\w+)\(", line))]
    marks = [i for i, name in enumerate(names) if name == MARKER]
    if len(marks) < 2:
        raise RuntimeError(f"strace saw {len(marks)} of the 2 markers")
    return names[marks[0] + 1:marks[1]]


def _fill(loader, timeout: float = 60.0):
    """Wait until the ring holds all but 2 of its slots ready."""
    deadline = time.monotonic() + timeout
    while loader.stats()["ring_ready"] < loader.n_slots - 2 and time.monotonic() < deadline:
        time.sleep(0.01)


def _spin(seconds: float):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def child(config: dict):
    import shmloader

    loader = shmloader.ShmLoader(config["data"], config["tokenizer"], config["B"], config["T"], packing=config["packing"],
                                 num_workers=config["num_workers"], device="cpu", **config["options"])
    try:
        x, y = next(loader)
        _fill(loader)
        taken = 1
        while taken <= loader.stats()["head_batches"]:  # past a head start's batches, and the first from the ring
            x, y = next(loader)
            taken += 1
        _fill(loader)
        print("ready", threading.get_native_id(), flush=True)
        sys.stdin.readline()  # strace is attached
        waits = [loader.stats()["wait_s"]]
        os.getppid()
        for _ in range(config["n"]):
            _spin(config["spin_ms"] / 1e3)
            x, y = next(loader)
            waits.append(loader.stats()["wait_s"])
        os.getppid()
        not_ready = sum(1 for a, b in zip(waits, waits[1:]) if b > a)
        print(json.dumps({"not_ready": not_ready}), flush=True)
    finally:
        loader.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("role", choices=["child"])
    p.add_argument("config")
    args = p.parse_args()
    child(json.loads(args.config))


if __name__ == "__main__":
    main()
