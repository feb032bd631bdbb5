"""What a mixture costs the coordinator: its mode's logic replayed in this process, no workers.

    python tools/profile_mixture.py                        # best fit, 3 sources, 200 batches
    python tools/profile_mixture.py --packing concat --profile
    python tools/profile_mixture.py --packing concat --single   # the same documents as one source
    python tools/profile_mixture.py --packing concat --sources 1   # a mixture of that one source

A mixture's mode (packing/mixmode.py, packing/mixbestfit.py) is driven as the coordinator
drives it: pieces handed out to 2 pretend workers, counted at once with lognormal document
lengths (256 documents a piece, a median of about 400 tokens), their write orders acknowledged,
every batch's slot buffer made (`buffer_of`: concat's packed point, best fit's text) and its
slot freed. Prints the mode's CPU time (this process's, so that other work on a shared machine
counts less) per batch and per document (the coordinator's Python a mixture adds, which on 2
cores the workers lose); `--single` replays the packing's own mode over one source of the same
documents (what a mixture adds is the difference); `--sources 1` a mixture of one source (what
the mix costs where it has nothing to mix: against `--single`, what a plain loader would pay
as a mixture of one); `--weights` other weights; `--profile` adds
cProfile's top functions; `--parts` the CPU a batch of each of the mode's calls (handing out,
counting, placing, acknowledging, the batches' ends, the slot buffers), timed around each call
(their sum is a little more than the plain run's: the timing's own cost). Compare runs made side by side (on a shared machine, with
`--batches 2000`: 200 batches move by half between runs).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shmloader.data.mixture import Mixture  # noqa: E402
from shmloader.data.order import Piece  # noqa: E402
from shmloader.data.sources import Range  # noqa: E402
from shmloader.ipc.protocol import Counted, MixArgs  # noqa: E402
from shmloader.ipc.runstart import MixStart, RunStart, SourceStart  # noqa: E402
from shmloader.position import Position  # noqa: E402
from shmloader.packing import MIX_MODES, MODES  # noqa: E402
from shmloader.packing.base import SlotMap  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--packing", choices=sorted(MIX_MODES), default="bos_bestfit", help="the mode replayed")
    p.add_argument("--batches", type=int, default=200, help="batches timed (after 20 to warm up)")
    p.add_argument("--batch-size", type=int, default=16, help="B (rows)")
    p.add_argument("--seq-len", type=int, default=2048, help="T (tokens a row)")
    p.add_argument("--weights", default=None, help="the sources' weights (default 1 each)")
    p.add_argument("--sources", type=int, default=3, choices=(1, 2, 3), help="the mixture's sources (default 3)")
    p.add_argument("--single", action="store_true", help="one source of the same documents instead (no mixture)")
    p.add_argument("--profile", action="store_true", help="also print cProfile's top 15 functions")
    p.add_argument("--parts", action="store_true", help="also print the CPU a batch of each of the mode's calls")
    return p.parse_args(argv)


def mode_of(args):
    names = ("a", "b", "c")[:args.sources]
    weights = [float(w) for w in args.weights.split(",")] if args.weights else [1.0] * len(names)
    if len(weights) != len(names):
        raise SystemExit(f"--weights: {len(names)} weights expected (one a source), got {args.weights!r}")
    mix = Mixture({n: n for n in names}, dict(zip(names, weights)))
    ranges = tuple(Range(n, 2 * i, 2 * i + 2) for i, n in enumerate(names))
    B, T = args.batch_size, args.seq_len
    window = B * T + 1 if args.packing == "concat" else 2 * B * T
    at = SourceStart() if args.single else MixStart()  # one source's start, or a mixture's
    run = SimpleNamespace(mixture=MixArgs(mix, ranges), start=RunStart(Position(1, 0, 0, 0), at), rank=0,
                          layout=SimpleNamespace(window=window, n_slots=8))
    cfg = SimpleNamespace(B=B, T=T, buffer_size=1000, tokenizer_batch_size=128, max_piece_docs=1024,
                          max_piece_bytes=None, workers_at_once=None)

    def pieces(ramp, cap, first, files=(0,), start=None, plan=None, later=None):
        return (Piece(first + i, 1, files[0], i, 0, 256) for i in range(10**7))
    if args.single:
        return MODES[args.packing].source(cfg, run, 2, pieces)
    return MIX_MODES[args.packing](cfg, run, 2, pieces)


def written(order) -> list:
    """What a worker acknowledges for `order`: `(batch, tokens)` it wrote."""
    if hasattr(order, "placements"):  # best fit's Rows
        return [(order.batch, sum(p[4] for p in order.placements))]
    if hasattr(order, "counts"):      # a mixture's Copies
        return order.counts()
    if hasattr(order, "orders"):      # Places (a mixture's orders before Copies: the base commit's)
        return [c for o in order.orders for c in written(o)]
    return [(k, n) for k, _, _, _, n in order.segments]  # Place


PARTS = ("hand out", "count", "place", "acknowledge", "batch ends", "slot buffers")


class _Parts:
    """CPU time by part of the mode's calls (`--parts`); `timed(part, f, *args)` calls f."""

    def __init__(self):
        self.took = dict.fromkeys(PARTS, 0.0)

    def timed(self, part: str, f, *args):
        began = time.process_time()
        out = f(*args)
        self.took[part] += time.process_time() - began
        return out


class _Untimed:
    @staticmethod
    def timed(part, f, *args):
        return f(*args)


def drive(mode, slots, rng, n_batches: int, parts=_Untimed) -> int:
    """`n_batches` batches through the mode; the documents counted. `parts`: a `_Parts` to time
    the mode's calls by part."""
    batches = docs = 0
    timed = parts.timed
    while batches < n_batches:
        given = []
        for w in (0, 1):
            while timed("hand out", mode.can_take, w):
                piece = timed("hand out", next, mode.pieces)
                mode.take(w, piece)
                given.append(piece)
        for piece in given:
            msg = Counted(piece.index, rng.lognormal(6, 1, piece.n_docs).astype(np.int64) + 1, None)
            timed("count", mode.counted, msg)
            docs += piece.n_docs
        for order in timed("place", lambda: [order for _, order in mode.orders(slots.take_slot)]):
            timed("acknowledge", mode.written, written(order))
        for done in timed("batch ends", mode.ready):
            timed("slot buffers", mode.buffer_of, done)
            slots.release(done.batch)
            mode.freed(done.batch)
            batches += 1
    return docs


def main(argv=None) -> int:
    args = parse_args(argv)
    mode, slots, rng = mode_of(args), SlotMap(8), np.random.default_rng(0)
    drive(mode, slots, rng, 20)
    began = time.process_time()
    docs = drive(mode, slots, rng, args.batches)
    took = time.process_time() - began
    per_doc = f"{took / docs * 1e6:.1f} us a document counted" if docs else "no document counted (the buffer held them)"
    what = ("one source" if args.single else "1 source as a mixture" if args.sources == 1
            else f"{args.sources} sources (weights {args.weights or 'equal'})")
    print(f"{args.packing} over {what}, B={args.batch_size}, T={args.seq_len}: {took / args.batches * 1e3:.3f} ms "
          f"CPU a batch, {per_doc} ({docs} documents, {args.batches} batches)")
    if args.parts:
        parts = _Parts()
        drive(mode, slots, rng, args.batches, parts)
        print("by part, us of CPU a batch: " + ", ".join(f"{p} {t / args.batches * 1e6:.1f}"
                                                          for p, t in parts.took.items()))
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(drive, mode, slots, rng, args.batches)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
