"""A measurement in a fresh process of its own, with this checkout's shmloader or another's.

`run(fn, cfg, checkout)` starts `python -m tools.bench.child FN` (FN: "module:function" of
tools/bench), which calls the function on `cfg` (JSON on its stdin) and prints the result as
one tagged JSON line, with the directory of the shmloader it imported. Each configuration of a
topic runs so, one after the other, never together (except `start` of bare processes, which
run side by side on purpose), so that its peak RSS and its first batch are its own.

Side by side with another checkout (`--compare DIR`): `checkouts(DIR)` gives that checkout
("before") and this one ("this checkout"); a child of the other one has, first on its path, a
folder holding only a link to DIR's shmloader package, then this checkout (for tools.bench),
so it runs this checkout's measurement code on the other's loader. Every child runs with
PYTHONSAFEPATH set and a scratch directory as its working directory: multiprocessing's
forkserver is a `python -c` that would put its working directory first on its path, and its
workers would import whatever shmloader lies there.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

RESULT_TAG = "BENCH_RESULT "
REPO = Path(__file__).resolve().parents[2]


class Checkout(NamedTuple):
    label: str | None   # "before" or "this checkout" with --compare, else None
    path: str           # first on a child's PYTHONPATH: where its shmloader package is
    cwd: str            # a child's working directory (no shmloader package there)
    root: str           # the checkout itself (its tools/, for tools that use the package's internals)


def add_compare_arg(p, what: str = "every shmloader row") -> None:
    p.add_argument("--compare", type=Path, default=None, metavar="DIR",
                   help=f"also run {what} with the shmloader package of DIR (another checkout), interleaved "
                        f"with this checkout's, for before/after figures in one run")


def check_compare(p, args) -> None:
    if args.compare is not None:
        args.compare = args.compare.resolve()
        if not (args.compare / "shmloader" / "__init__.py").is_file():
            p.error(f"--compare {args.compare}: no shmloader package there")


@contextlib.contextmanager
def checkouts(compare: Path | None):
    """The checkouts to measure, in the order each round runs them: `compare` ("before") then
    this one ("this checkout"); this one alone (label None) without `compare`."""
    with tempfile.TemporaryDirectory(prefix="shmloader-bench-") as tmp:
        ours = Checkout(None if compare is None else "this checkout", str(REPO), tmp, str(REPO))
        if compare is None:
            yield [ours]
            return
        link = Path(tmp) / "before"
        link.mkdir()
        (link / "shmloader").symlink_to(Path(compare).resolve() / "shmloader")
        yield [Checkout("before", str(link), tmp, str(Path(compare).resolve())), ours]


def in_rounds(repeat: int, found: list, compare: Path | None, one_round) -> list[list[list[dict]]]:
    """`one_round(corpus, checkouts, step)` for every corpus in every round, in turn (so that a
    slow stretch of a shared machine hits every row): per corpus, each round's rows."""
    per_corpus = [[] for _ in found]
    with checkouts(compare) as cks:
        for i in range(repeat):
            for k, corpus in enumerate(found):
                per_corpus[k].append(one_round(corpus, cks, f"round {i + 1}/{repeat}: " if repeat > 1 else ""))
    return per_corpus


def each_round(compare: Path | None, repeat: int, fn: str, cfg, alternate: bool = False) -> tuple[list, dict]:
    """`fn` in a fresh process for each checkout (`checkouts`) in each of `repeat` rounds (`run`):
    (the checkouts' labels in order, {label: each round's result}). `cfg` is the child's
    arguments, or `(round, i) -> them` for the i-th checkout of a round; `alternate`: every
    other round runs the checkouts in reverse order, so that neither always runs first."""
    rounds = {}
    with checkouts(compare) as cks:
        labelled = [(ck.label or "this checkout", ck) for ck in cks]
        for r in range(repeat):
            for label, ck in (labelled[::-1] if alternate and r % 2 else labelled):
                i = [c for _, c in labelled].index(ck)
                rounds.setdefault(label, []).append(run(fn, cfg(r, i) if callable(cfg) else cfg, ck))
    return [label for label, _ in labelled], rounds


def env(checkout: Checkout) -> dict:
    """A child's environment: `checkout`'s shmloader first on its path, then this checkout."""
    path = [checkout.path, str(REPO), os.environ.get("PYTHONPATH")]
    return dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=os.pathsep.join(dict.fromkeys(filter(None, path))))


def start(fn: str, cfg: dict, checkout: Checkout) -> subprocess.Popen:
    """Start the child for `fn` on `cfg`; `result` reads what it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "tools.bench.child", fn], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env(checkout), cwd=checkout.cwd)
    proc.stdin.write(json.dumps(cfg))
    proc.stdin.close()
    return proc


def result(proc: subprocess.Popen, what: str) -> dict:
    out = proc.stdout.read()
    lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.wait() != 0 or not lines:
        raise SystemExit(f"bench: the {what} measurement failed (exit code {proc.returncode}); its output:\n{out}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def run(fn: str, cfg: dict, checkout: Checkout) -> dict:
    """`fn` on `cfg` in a fresh process with `checkout`'s shmloader; its result, with the checkout's label.
    The child is killed if anything interrupts the wait (a Ctrl-C, a test's deadline)."""
    proc = start(fn, cfg, checkout)
    try:
        return dict(result(proc, fn), label=checkout.label)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
