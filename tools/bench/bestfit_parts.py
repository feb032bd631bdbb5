"""Best fit's coordinator, its pure parts alone: CPU per batch of each, no processes, no tokens.

    python tools/bench/bestfit_parts.py --batch-size 32 --compare /tmp/before

The coordinator's sequencer (`packing.bestfit.BestFitSequencer`) is driven as the coordinator
drives it: pieces of `--piece-docs` documents (log-normal lengths, median 600 tokens, sigma
1.0, clipped to [1, 16 * seq_len], 1% nulls; each piece its own row group, owned by worker 0
or 1 in turn) are counted while fewer than a batch's worth wait, every batch is planned as its
slot frees, and the buffer text a batch's slot carries is encoded (`packing.runs.encode_buffer`).
Each part is timed with `time.process_time` around its call: the planner (`plan_batch`, with
the chunks it takes in), its snapshot, the buffer's runs for the state (`_complete`), the write
orders (`_orders`), the buffer text, the counted pieces (`counted`). A round plans `--batches`
batches after 300 to fill the buffer; the figure of each part is its least over `--repeat`
rounds (the machine's noise only adds). Each round runs in a fresh process
(tools/bench/children.py); `--compare DIR` runs the same rounds with DIR's package (another
checkout), interleaved with this checkout's. A checkout before one source's best-fit pieces
passed a `mixone.Passing` (main before branch `bfpass`: `bestfit.source_sequencer`, its own
`Chunks`, no stream) is driven as it was then: its sequencer made without a stream and fed the
counted pieces alone (`_sequencer`).
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import children  # noqa: E402

PARTS = ("planner", "snapshot", "buffer runs", "write orders", "buffer text", "counted")


def one_round(B: int, T: int, buffer_size: int, chunk: int, piece_docs: int, batches: int, seed: int) -> dict:
    """us of CPU per batch of each part over `batches` batches, and their sum."""
    import numpy as np

    import shmloader.packing.bestfit as bf
    import shmloader.packing.planner as pl
    from shmloader.data.order import Piece
    from shmloader.packing.runs import encode_buffer

    spent = collections.Counter()

    def timed(name, f):
        @functools.wraps(f)
        def call(*a, **k):
            t0 = time.process_time()
            try:
                return f(*a, **k)
            finally:
                spent[name] += time.process_time() - t0
        return call

    patches = {(pl.BestFitPlanner, "plan_batch"): "planner", (pl.BestFitPlanner, "snapshot"): "snapshot",
               (bf.BestFitSequencer, "_complete"): "buffer runs", (bf.BestFitSequencer, "_orders"): "write orders",
               (bf.BestFitSequencer, "counted"): "counted"}
    saved = {key: getattr(*key) for key in patches}
    for (cls, attr), name in patches.items():
        setattr(cls, attr, timed(name, saved[cls, attr]))
    encode = timed("buffer text", encode_buffer)
    rng = np.random.default_rng(seed)
    try:
        one, seq = _sequencer(B, T, 8, buffer_size, chunk)
        index = done = 0
        while done < 300 + batches:
            if done == 300:
                spent.clear()
            while seq.chunks.docs < 40 * B + buffer_size:
                lengths = np.clip(np.rint(rng.lognormal(np.log(600.0), 1.0, piece_docs)), 1, 16 * T).astype(np.int64)
                lengths[rng.random(piece_docs) < 0.01] = 0
                piece = Piece(index, 0, index // 8, index % 8, 0, piece_docs)
                if one is not None:
                    one.counted(None, index, piece, lengths)
                seq.counted(piece, index % 2, lengths)
                index += 1
            for k, _ in seq.plan():
                encode(seq._positions.pop(k).runs)  # noqa: SLF001 (what the coordinator encodes)
                seq.book.freed()
                done += 1
    finally:
        for (cls, attr), f in saved.items():
            setattr(cls, attr, f)
    out = {name: spent[name] / batches * 1e6 for name in PARTS}
    out["all"] = sum(out.values())
    return out


def _sequencer(B: int, T: int, n_slots: int, buffer_size: int, chunk: int) -> tuple:
    """`(stream, sequencer)` of one source's best fit from its start, as the checkout imported
    makes them: its pieces pass a `mixone.Passing` (the mode's feed counts each piece into it,
    then the sequencer: `mixbestfit.source_sequencer`), or, in a checkout from before that
    (`bestfit.source_sequencer`, 7 arguments, its own `Chunks`), no stream (None)."""
    import shmloader.packing.bestfit as bf

    if hasattr(bf, "source_sequencer"):  # before branch bfpass: the sequencer's own chunks
        return None, bf.source_sequencer(B, T, n_slots, buffer_size, chunk, 0, (0, 0, 0, 0))
    from shmloader.packing.mixbestfit import source_sequencer
    from shmloader.packing.mixone import Passing

    one = Passing()
    return one, source_sequencer(B, T, n_slots, buffer_size, chunk, 0, (0, 0, 0, 0), one)


GEOMETRY = ("batch_size", "seq_len", "buffer_size", "chunk", "piece_docs")


def add_geometry(p, piece_docs: int, piece_help: str = "") -> None:
    """The best-fit geometry's arguments, which bestfit_write.py takes too (`geometry` reads them)."""
    p.add_argument("--batch-size", type=int, default=32, help="B, rows per batch (rows; default 32)")
    p.add_argument("--seq-len", type=int, default=2048, help="T (tokens; rows hold T+1; default 2048)")
    p.add_argument("--buffer-size", type=int, default=1000, help="buffered documents (documents; default 1000)")
    p.add_argument("--chunk", type=int, default=128, help="tokenizer_batch_size (documents; default 128)")
    p.add_argument("--piece-docs", type=int, default=piece_docs,
                   help=f"documents a piece (documents; default {piece_docs}{piece_help})")


def geometry(args) -> dict:
    """`one_round`'s geometry arguments from `add_geometry`'s."""
    return {"B": args.batch_size, "T": args.seq_len, "buffer_size": args.buffer_size, "chunk": args.chunk,
            "piece_docs": args.piece_docs}


def check_counts(p, args, *more: str) -> None:
    """Refuse a geometry count, or one of `more` (argument names), below 1."""
    if min(getattr(args, name) for name in GEOMETRY + more) < 1:
        p.error("every count must be >= 1")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], prog="python tools/bench/bestfit_parts.py")
    add_geometry(p, 1024)
    p.add_argument("--batches", type=int, default=1500, help="batches timed a round (batches; default 1500)")
    p.add_argument("--repeat", type=int, default=5, help="rounds; each part's least is reported (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the lengths (default 0)")
    children.add_compare_arg(p, "the same rounds")
    args = p.parse_args(argv)
    check_counts(p, args, "batches", "repeat")
    children.check_compare(p, args)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = dict(geometry(args), batches=args.batches, seed=args.seed)
    labels, rounds = children.each_round(args.compare, args.repeat, "bestfit_parts:one_round**", cfg)
    print(f"B={args.batch_size} T={args.seq_len} buffer={args.buffer_size} chunk={args.chunk} "
          f"piece={args.piece_docs} docs, {args.batches} batches a round, least of {args.repeat} rounds; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'part (us of CPU a batch)':<26}" + "".join(f"{label:>16}" for label in labels))
    for name in PARTS + ("all",):
        print(f"{name:<26}" + "".join(f"{min(r[name] for r in rounds[label]):>16.1f}" for label in labels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
