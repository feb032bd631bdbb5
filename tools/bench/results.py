"""A topic's results file, and the tables and medians its report is made of.

A results file (`docs/bench/<topic>.json` by default) holds the topic's current figures:

    {"topic": "throughput",
     "runs": [{"command": "python tools/bench/throughput.py --workers 1 2 --repeat 3",
               "date": "2026-12-01", "commit": "375aad3", "machine": {..., "load_average": at the start},
               ...the figures, as the topic measured them}]}

A topic's run writes one run, replacing the file; figures carried over from earlier tools
keep their own run with the date, commit and command (`measured_with`: the command as it was
then) they came from. History is in git.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "bench"


def parser(topic: str, doc: str):
    """The topic's argument parser: `python tools/bench/<topic>.py`, described by its docstring's first paragraph."""
    import argparse

    return argparse.ArgumentParser(prog=f"python tools/bench/{topic}.py", description=doc.split("\n\n")[0])


def add_json_arg(p, topic: str) -> None:
    p.add_argument("--json", type=Path, default=DOCS / f"{topic}.json", metavar="PATH",
                   help=f"where to write the results (file; default docs/bench/{topic}.json, this topic's "
                        f"results file: a run replaces it)")


def begin() -> dict:
    """When a run began, and the load average then (what else the machine was doing)."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "load_average": " ".join(open("/proc/loadavg").read().split()[:3])}


def machine() -> dict:
    """What the figures were measured on."""
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
        with open("/proc/meminfo") as f:
            mem = int(next(ln.split()[1] for ln in f if ln.startswith("MemTotal:"))) / 2**20
    except OSError:
        mem = None
    versions = {}
    for dist in ("torch", "fastokens", "tiktoken", "pyarrow"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "memory_gib": round(mem, 1) if mem else None,
            "python": platform.python_version(), "platform": platform.platform(), **versions}


def commit(root: Path = REPO) -> str | None:
    """`git rev-parse --short HEAD` of `root`, "+changes" when its tracked files differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if dirty else "")


def command(topic: str, argv=None) -> str:
    """The command line that ran this topic, as a reader types it in the checkout."""
    return shlex.join(["python", f"tools/bench/{topic}.py", *map(str, sys.argv[1:] if argv is None else argv)])


def write(path: Path | None, topic: str, began: dict, figures: dict, argv=None) -> dict:
    """Write `figures` as the topic's one run (`began`: `begin()` at its start), with the
    command, the commit and the machine; return the run."""
    run = {"command": command(topic, argv), "date": began["date"], "commit": commit(),
           "machine": dict(machine(), load_average=began["load_average"]), **figures}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"topic": topic, "runs": [run]}, indent=1) + "\n")
        print(f"results written to {path}", file=sys.stderr)
    return run


def publish(path: Path | None, topic: str, began: dict, figures: dict, argv, report) -> dict:
    """`write` the run, then print `report(run)`; return the run."""
    run = write(path, topic, began, figures, argv)
    print(report(run))
    return run


def fmt(x, spec=",.0f", none="-") -> str:
    return none if x is None else format(x, spec)


def table(head, rows) -> str:
    """Columns padded to their widest cell: the first left-aligned, the rest right-aligned."""
    rows = [tuple(map(str, r)) for r in rows]
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(str(c).ljust(widths[0]) if i == 0 else str(c).rjust(widths[i])  # noqa: E731
                                for i, c in enumerate(r))
    return "\n".join([line(head), "-" * (sum(widths) + 2 * (len(head) - 1))] + [line(r) for r in rows])


def median_of(runs: list, key: str) -> dict:
    """One configuration's runs over the rounds as one row: the round with the median `key` (the
    lower middle one for an even count), with every round's `key` attached as `<key>_rounds`."""
    pick = sorted(runs, key=lambda r: r[key])[(len(runs) - 1) // 2]
    return dict(pick, **{f"{key}_rounds": [r[key] for r in runs]})


def median_interval(xs: list, level: float = 0.95, draws: int = 2000, seed: int = 0) -> tuple:
    """`(low, high)`: the `level` bootstrap interval of the median of `xs` (resampled `draws`
    times with a fixed seed, so a results file's figure can be made again from its samples)."""
    rng, n = random.Random(seed), len(xs)
    meds = sorted(statistics.median(rng.choices(xs, k=n)) for _ in range(draws))
    cut = int(draws * (1 - level) / 2)
    return meds[cut], meds[draws - 1 - cut]


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"
