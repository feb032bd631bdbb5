"""Best fit's worker side alone: CPU a token of keeping counted pieces and carrying out write orders.

    python tools/bench/bestfit_write.py --compare /tmp/before

The coordinator's sequencer (`packing.bestfit.BestFitSequencer`, untimed) plans batches over
pieces of `--piece-docs` documents (log-normal lengths, median `--median` tokens, sigma 1.0,
clipped to [1, 16 * seq_len], 1% nulls: nanochat's corpus has median 760 and mean 1294 with the
demo tokenizer), owned by `--workers` workers in turn; each worker keeps its counted pieces'
tokens (random uint16, as a 4,096-token vocabulary's) with the packing's `keep` and carries
out its write orders with its `write` into 8 int64 slots, as a worker does, with
`procs.worker._keep_freed_memory` in force. `time.process_time` around each `keep` and each
`write`; per round, ns of CPU a token written. Beside them, in the same process over the same
batches, what the same bytes cost without the per-placement calls: "1 copy" (a batch's tokens
into its slot in one call, concat's write of a piece that spans the batch) and "2 copies" (the
inputs and the targets, one call each: the floor of best fit's slot layout). Each round runs in
a fresh process (tools/bench/children.py); `--compare DIR` runs the same rounds with DIR's
package (another checkout), interleaved with this checkout's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this checkout first on the path (tools.bench)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench import bestfit_parts, children  # noqa: E402

PARTS = ("keep", "write", "keep + write", "1 copy", "2 copies")
SLOTS = 8


def one_round(B: int, T: int, buffer_size: int, chunk: int, piece_docs: int, median: float, workers: int,
              batches: int, seed: int) -> dict:
    """ns of CPU a token written of each part over `batches` batches (after 20 to fill the buffer)."""
    import numpy as np

    import shmloader.packing.bestfit as bf
    from shmloader.data.order import Piece
    from shmloader.procs.worker import _keep_freed_memory

    _keep_freed_memory()
    rng = np.random.default_rng(seed)
    from shmloader.packing.mixbestfit import source_sequencer
    from shmloader.packing.mixone import Passing

    one = Passing()  # one source's stream: the mode's feed counts each piece into it, then the sequencer
    seq = source_sequencer(B, T, SLOTS, buffer_size, chunk, 0, (0, 0, 0, 0), one)
    slots = np.ones((SLOTS, 2 * B * T), dtype=np.int64)
    floors = np.ones((2, SLOTS, 2 * B * T), dtype=np.int64)  # slots of their own, as cold as the writes' ones
    stream = rng.integers(0, 4096, 4 * B * T, dtype=np.uint16)  # the floors' source
    held = [{} for _ in range(workers)]
    spent = dict.fromkeys(PARTS, 0.0)
    index, done, tokens, at = 0, 0, 0, 0
    while done < 20 + batches:
        if done == 20:
            spent, tokens = dict.fromkeys(PARTS, 0.0), 0
        while seq.chunks.docs < 40 * B + buffer_size:
            lengths = np.clip(np.rint(rng.lognormal(np.log(median), 1.0, piece_docs)), 1, 16 * T).astype(np.int64)
            lengths[rng.random(piece_docs) < 0.01] = 0
            piece_tokens = rng.integers(0, 4096, int(lengths.sum()), dtype=np.uint16)
            t0 = time.process_time()
            kept = bf.PACKING.keep(piece_tokens, lengths)
            spent["keep"] += time.process_time() - t0
            if kept is not None:
                held[index % workers][index] = kept
            piece = Piece(index, 0, index // 8, index % 8, 0, piece_docs)
            one.counted(None, index, piece, lengths)
            seq.counted(piece, index % workers, lengths)
            index += 1
        for k, by_worker in seq.plan():
            slot, n = k % SLOTS, 0
            for w, placements in by_worker.items():
                t0 = time.process_time()
                n += sum(c for _, c in bf.PACKING.write(slots, held[w], bf.Rows(k, slot, placements), B, T))
                spent["write"] += time.process_time() - t0
            inputs, at = min(n, B * T), (at + n) % (2 * B * T)
            t0 = time.process_time()
            floors[0, slot, :inputs] = stream[at:at + inputs]
            t1 = time.process_time()
            floors[1, slot, :inputs] = stream[at:at + inputs]
            floors[1, slot, B * T:B * T + inputs] = stream[at + 1:at + 1 + inputs]
            t2 = time.process_time()
            spent["1 copy"] += t1 - t0
            spent["2 copies"] += t2 - t1
            tokens += n
            seq.book.freed()
            done += 1
    spent["keep + write"] = spent["keep"] + spent["write"]
    out = {name: spent[name] / tokens * 1e9 for name in PARTS}
    out["tokens"] = tokens
    out["placements a batch"] = seq.docs_placed / seq.planned
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], prog="python tools/bench/bestfit_write.py")
    bestfit_parts.add_geometry(p, 384, ": a third of a nanochat row group, as 2 MiB pieces are")
    p.add_argument("--median", type=float, default=760.0, help="median document length (tokens; default 760)")
    p.add_argument("--workers", type=int, default=2, help="workers the pieces are dealt to (default 2)")
    p.add_argument("--batches", type=int, default=200, help="batches timed a round (batches; default 200)")
    p.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the lengths and tokens (default 0)")
    children.add_compare_arg(p, "the same rounds")
    args = p.parse_args(argv)
    bestfit_parts.check_counts(p, args, "batches", "repeat", "workers")
    if args.median < 1:
        p.error("--median must be >= 1")
    children.check_compare(p, args)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = dict(bestfit_parts.geometry(args), median=args.median, workers=args.workers, batches=args.batches,
               seed=args.seed)
    load = os.getloadavg()[0]
    labels, rounds = children.each_round(args.compare, args.repeat, "bestfit_write:one_round**", cfg, alternate=True)
    first = rounds[labels[0]][0]
    print(f"B={args.batch_size} T={args.seq_len} buffer={args.buffer_size} piece={args.piece_docs} docs, "
          f"{args.workers} workers, {args.batches} batches a round ({first['placements a batch']:.0f} placements "
          f"a batch), {args.repeat} rounds; load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print("ns of CPU a token written, per round")
    for label in labels:
        for name in PARTS:
            print(f"  {label:<14} {name:<13}" + "".join(f"{r[name]:>7.2f}" for r in rounds[label]))
    if len(labels) == 2:
        before, ours = labels
        ratios = [a["keep + write"] / b["keep + write"] for a, b in zip(rounds[ours], rounds[before])]
        print(f"keep + write, {ours} / {before}, per round: " + " ".join(f"{x:.3f}" for x in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
