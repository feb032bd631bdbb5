"""The test suite's CPU, per test and per file, loader children included: a pytest plugin and
its report.

pytest's own rusage (`/usr/bin/time`) misses most of a loader test's CPU: a loader's children
are the forkserver's, and each xdist worker's forkserver outlives its worker, so their CPU is
never reaped into pytest's. This plugin reads, before and after each test, the CPU of the
worker's whole process tree from /proc (each live process's own time plus what it reaped:
`utime + stime + cutime + cstime`, so the forkserver's children count once they end), and
writes one JSON line per test, `{"id", "cpu", "wall"}` (seconds), to `DIR/<worker>.jsonl`.
A process that leaves the tree before it ends (an orphan) is missed; a test's CPU is its
tree's, so a fixture's first use (a session dataset, a module's) counts in the test that made
it. Measured on a loaded machine the CPU figures hold roughly (the wall ones do not).

    python -m pytest -q -p tools.suite_cpu --suite-cpu DIR
    python tools/suite_cpu.py DIR [--files N] [--tests N]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

import pytest

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_KEY = pytest.StashKey()  # the open DIR/<worker>.jsonl


def _table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, CPU ticks of it and of the children it reaped), for every process (the
    plugin's: under pytest, where the repository's tests package imports)."""
    from tests import helpers

    return {pid: (int(fields[1]), sum(int(x) for x in fields[11:15])) for pid, fields in helpers.processes()}


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds of `root` (default: this process), its live descendants and all they reaped."""
    table = _table()
    kids = collections.defaultdict(list)
    for pid, (ppid, _) in table.items():
        kids[ppid].append(pid)
    total, stack = 0, [os.getpid() if root is None else root]
    while stack:
        pid = stack.pop()
        if pid in table:
            total += table[pid][1]
            stack.extend(kids[pid])
    return total * TICK_S


def pytest_addoption(parser):
    parser.addoption("--suite-cpu", metavar="DIR", help="write each test's CPU and wall seconds to DIR/<worker>.jsonl")


def pytest_unconfigure(config):
    out = config.stash.get(_KEY, None)
    if out is not None:
        out.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = item.config.stash.get(_KEY, None)
    if out is None and item.config.getoption("suite_cpu"):  # opened at the first test: xdist's controller runs none
        Path(item.config.getoption("suite_cpu")).mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        out = item.config.stash[_KEY] = open(Path(item.config.getoption("suite_cpu")) / f"{worker}.jsonl", "w")
    cpu, wall = tree_cpu_s(), time.monotonic()
    yield
    if out is not None:
        out.write(json.dumps({"id": item.nodeid, "cpu": tree_cpu_s() - cpu, "wall": time.monotonic() - wall}) + "\n")
        out.flush()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Per-file and per-test CPU of a run with -p tools.suite_cpu.")
    p.add_argument("dir", help="the --suite-cpu directory")
    p.add_argument("--files", type=int, default=30, help="files to list, most CPU first (default 30)")
    p.add_argument("--tests", type=int, default=30, help="tests to list, most CPU first (default 30)")
    args = p.parse_args(argv)
    tests = [json.loads(line) for path in sorted(Path(args.dir).glob("*.jsonl")) for line in open(path)]
    if not tests:
        p.error(f"{args.dir}: no test lines (was the run made with --suite-cpu {args.dir}?)")
    files = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for t in tests:
        row = files[t["id"].split("::")[0]]
        row[0] += t["cpu"]
        row[1] += t["wall"]
        row[2] += 1
    print(f"{len(tests)} tests, {sum(t['cpu'] for t in tests):.1f} CPU-s, {sum(t['wall'] for t in tests):.1f} wall-s")
    print("   CPU-s   wall-s  tests  file")
    for name, (cpu, wall, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:args.files]:
        print(f"{cpu:8.1f} {wall:8.1f} {n:6d}  {name}")
    print("   CPU-s   wall-s  test")
    for t in sorted(tests, key=lambda t: -t["cpu"])[:args.tests]:
        print(f"{t['cpu']:8.2f} {t['wall']:8.2f}  {t['id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
