"""A picture of the data pipeline over time: tokens/s delivered, the trainer's wait share and
the ring's fill, from a run's `log_every` lines or from a short measurement.

    shmloader-plot-pipeline --log train.log --out pipeline.png
    shmloader-plot-pipeline --measure 20 --step-ms 30 --out pipeline.png   # the demo corpus

(also `python -m shmloader.tools.plot_pipeline`, and in a checkout `python tools/plot_pipeline.py`)

`--log`: a log holding shmloader's lines (the loader made with `log_every=N` and Python
logging at INFO): the start-up line ("batch 1: shmloader start-up: the first batch came 2.31 s
after the loader was made ...") and one "shmloader interval" line per N batches. The intervals
follow one another from the first batch, so an interval's end is the start-up plus the
intervals so far; the plot's clock is seconds since the loader was made. A log of several
loaders (a training and a validation loader, several ranks) holds their lines interleaved;
each line ends with the loader it is of ("; loader 4242-1 (train)": pid 4242's first loader),
and the tool plots one: the first in the log, or `--loader 4242-2` (or `--loader val`: the
first loader of that split), naming on stderr those the log holds. Lines from a shmloader
before that ending are all one loader's: `--every N` keeps those of the loader logging every
N batches.

`--measure S`: a loader on the demo corpus (built offline under `--cache-dir`, as the demo
builds it) read for S seconds by a trainer whose step takes `--step-ms` (0: as fast as it
goes, a consumer faster than the workers), logging every `--log-every` batches; its lines are
plotted as above.

Prints the figures as a table too (one row per interval), and draws with matplotlib (`pip
install shmloader[plot]`), three panels over one clock; `--measure` trains the demo's
tokenizer (`pip install shmloader[demo]`).
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple

START = re.compile(r"batch 1: shmloader start-up: the first batch came ([\d.]+) s after the loader was made")
INTERVAL = re.compile(r"batch (\d+): shmloader interval ([\d.]+) s: ([\d.]+) tokens/s delivered, wait share "
                      r"([\d.]+)% \(last wait ([\d.]+) s\), ring (\d+)/(\d+) ready")
LOADER = re.compile(r"; loader ((\d+-\d+) \(([^)]*)\))")  # a line's loader: "4242-1 (train)", its id, split
UNNAMED = ""  # the loader of lines without that ending (a shmloader from before it)


class Point(NamedTuple):
    """One `log_every` interval, ending at `at_s` (seconds since the loader was made)."""
    batch: int
    at_s: float
    interval_s: float
    tokens_per_s: float
    wait_share: float      # 0..1
    ready: int
    slots: int


def loader_of(line: str) -> str:
    """The loader a shmloader line is of, as its ending names it ("4242-1 (train)", with ", rank
    r of w" after the split when there are several ranks: ranks in other containers may share a
    pid); `UNNAMED` for a line without the ending."""
    m = LOADER.search(line)
    return m[1] if m else UNNAMED


def loaders(lines) -> dict[str, int]:
    """The loaders whose start-up or interval lines `lines` holds, in the order each first
    appears, with their numbers of lines."""
    found = {}
    for line in lines:
        if START.search(line) or INTERVAL.search(line):
            name = loader_of(line)
            found[name] = found.get(name, 0) + 1
    return found


def pick(found: dict, wanted: str | None) -> str:
    """The loader of `found` to plot: `wanted` (its name, its id "4242-2", or a split: the
    first such loader), else the first; a `ValueError` naming those present when `wanted` is
    none of them."""
    if wanted is None:
        return next(iter(found))
    for name in found:
        m = LOADER.search(f"; loader {name}")
        if wanted == name or m and wanted in (m[2], m[3].split(",")[0]):
            return name
    raise ValueError(f"no loader {wanted!r} in the log; it holds {describe(found)}")


def describe(found: dict) -> str:
    return ", ".join(f"{name or '(unnamed)'}: {n} line{'s' if n != 1 else ''}" for name, n in found.items())


def parse(lines, every: int | None = None, loader: str | None = None) -> tuple[float, list[Point]]:
    """`(start_up_s, points)` from a log's lines (other lines ignored); `loader`: keep that
    loader's lines only (a name of `loaders`; None: every line, as one loader's); `every`: keep
    the intervals whose batch is a multiple of it. No start-up line: the clock starts at 0."""
    start_up, points = None, []
    for line in lines:
        start, interval = START.search(line), INTERVAL.search(line)
        if (start or interval) and loader is not None and loader_of(line) != loader:
            continue
        if start_up is None and (m := start):
            start_up = float(m[1])
        elif m := interval:
            batch = int(m[1])
            if every and batch % every:
                continue
            at = (points[-1].at_s if points else start_up or 0.0) + float(m[2])
            points.append(Point(batch, at, float(m[2]), float(m[3]), float(m[4]) / 100, int(m[6]), int(m[7])))
    return start_up or 0.0, points


def table(start_up: float, points: list[Point]) -> str:
    rows = [f"start-up: the first batch after {start_up:.2f} s",
            f"{'batch':>7} {'time s':>8} {'tokens/s':>12} {'wait share':>11} {'ring ready':>11}"]
    rows += [f"{p.batch:>7} {p.at_s:>8.1f} {p.tokens_per_s:>12,.0f} {p.wait_share:>10.1%} {p.ready:>6}/{p.slots:<4}"
             for p in points]
    return "\n".join(rows)


def draw(start_up: float, points: list[Point], out: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plot_pipeline: drawing needs matplotlib, which is not installed: pip install shmloader[plot] "
                         "(or matplotlib), or pass --no-plot for the table alone") \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # each interval is a step over its own span: the figures are its averages
    xs = [start_up] + [p.at_s for p in points]
    def steps(values):
        return values[:1] + values
    fig, (a, b, c) = plt.subplots(3, 1, sharex=True, figsize=(7, 6), dpi=120)
    a.step(xs, steps([p.tokens_per_s / 1e6 for p in points]), where="pre")
    a.set_ylabel("M tokens/s\ndelivered")
    a.set_ylim(bottom=0)
    b.step(xs, steps([100 * p.wait_share for p in points]), where="pre", color="tab:red")
    b.set_ylabel("trainer's wait\nshare, %")
    b.set_ylim(0, 100)
    c.plot([p.at_s for p in points], [100 * p.ready / p.slots for p in points], "o-", color="tab:green", ms=3)
    c.set_ylabel("ring ready, %\n(at the line)")
    c.set_ylim(0, 105)
    c.set_xlabel("seconds since the loader was made")
    for ax in (a, b, c):
        ax.axvspan(0, start_up, color="0.9", label="start-up" if ax is a else None)  # apart
        ax.grid(alpha=0.3)
    a.legend(loc="lower right", fontsize=8)
    a.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def measure(seconds: float, step_ms: float, log_every: int, workers: int, cache_dir: str, B: int, T: int,
            vocab: int) -> list[str]:
    """The lines a demo-corpus loader logs while a trainer with `step_ms` steps reads it for `seconds`."""
    import shmloader
    from shmloader.demo import prepare_data

    data = prepare_data(cache_dir, vocab, log=lambda text: print(text, file=sys.stderr))
    lines = []
    handler = _ListHandler(lines)
    logger = logging.getLogger("shmloader")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        with shmloader.ShmLoader(str(data.data_dir), str(data.tokenizer_path), B, T, num_workers=workers,
                                 device="cpu", log_every=log_every) as ld:
            end = None
            for _ in ld:
                end = end or time.monotonic() + seconds
                if time.monotonic() >= end:
                    break
                _busy(step_ms / 1000)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    return lines


class _ListHandler(logging.Handler):
    def __init__(self, lines: list):
        super().__init__()
        self.lines = lines

    def emit(self, record):
        self.lines.append(record.getMessage())


def _busy(seconds: float) -> None:
    """A training step's compute: the trainer's core busy for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--log", type=Path, help="a log file with shmloader's log_every lines")
    src.add_argument("--measure", type=float, metavar="SECONDS", help="measure a demo-corpus loader for SECONDS")
    ap.add_argument("--loader", help="--log: the loader to plot, as the lines' '; loader ID (SPLIT)' ending "
                    "names it: its ID (e.g. 4242-2), the whole name, or a split (val: the first val loader); "
                    "default: the first in the log")
    ap.add_argument("--every", type=int, help="--log: keep the lines of the loader logging every N batches "
                    "(logs whose lines name no loader)")
    ap.add_argument("--out", type=Path, default=Path("pipeline.png"), help="the picture (PNG; default pipeline.png)")
    ap.add_argument("--no-plot", action="store_true", help="print the table only")
    ap.add_argument("--step-ms", type=float, default=0.0, help="--measure: the trainer's step, ms of busy work "
                    "(default 0: as fast as it goes)")
    ap.add_argument("--log-every", type=int, default=10, help="--measure: batches per line (default 10)")
    ap.add_argument("--workers", type=int, default=2, help="--measure: worker processes (default 2)")
    ap.add_argument("--cache-dir", default="demo_data", help="--measure: the demo corpus's directory (default demo_data)")
    ap.add_argument("--batch-size", type=int, default=16, help="--measure: B, rows per batch (default 16)")
    ap.add_argument("--seq-len", type=int, default=2048, help="--measure: T, tokens per row (default 2048)")
    ap.add_argument("--vocab-size", type=int, default=4096, help="--measure: the demo tokenizer's size (default 4096)")
    args = ap.parse_args(argv)
    if args.log is not None:
        try:
            lines, title = args.log.read_text(errors="replace").splitlines(), str(args.log)
        except OSError as exc:
            print(f"plot_pipeline: cannot read the log {args.log}: {exc.strerror or exc}; give a log file "
                  f"holding shmloader's log_every lines", file=sys.stderr)
            return 2
    else:
        lines = measure(args.measure, args.step_ms, args.log_every, args.workers, args.cache_dir, args.batch_size,
                        args.seq_len, args.vocab_size)
        title = (f"demo corpus, {args.workers} workers, B={args.batch_size} T={args.seq_len}, "
                 f"steps of {args.step_ms:g} ms")
    loader, found = None, loaders(lines)
    if found:
        try:
            loader = pick(found, args.loader)
        except ValueError as exc:
            print(f"plot_pipeline: {exc}", file=sys.stderr)
            return 2
        if len(found) > 1 or loader != UNNAMED:
            print(f"plot_pipeline: the log holds {len(found)} loader{'s' if len(found) != 1 else ''} "
                  f"({describe(found)}); plotting {loader or '(unnamed)'}"
                  f"{' (--loader to choose another)' if len(found) > 1 else ''}", file=sys.stderr)
            title += f", loader {loader}" if loader else ""
    start_up, points = parse(lines, args.every, loader)
    if not points:
        raise SystemExit("plot_pipeline: no 'shmloader interval' lines found (make the loader with log_every=N "
                         "and log at INFO: logging.basicConfig(level=logging.INFO))")
    print(table(start_up, points))
    if not args.no_plot:
        draw(start_up, points, args.out, title)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
