"""A minimal best-fit trainer for the restart test (tests/test_bestfit_stream.py).

    python restart_trainer_bestfit.py --data DIR --tokenizer PKL|int --out DIR --total N
        [--batch-size B] [--seq-len T] [--workers N] [--split train|val]
        [--buffer-size DOCS] [--chunk DOCS] [--step-s SECONDS]

Iterates `shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit` and, for each
batch k, appends one JSON line `{"k", "pid", "sha", "pos", "buffer_docs"}` to OUT/log.jsonl
(`sha`: sha256 of the (B, T+1) int64 rows, i.e. inputs plus the last target column; `pos`:
the state's [epoch, pq_idx, rg_idx, doc_idx]; `buffer_docs`: documents in the state's
buffer), then writes `{"k", "state"}` to OUT/state.json atomically (tmp file + os.replace).
On start it resumes from OUT/state.json when present, first dropping the log lines written
after that checkpoint. `--tokenizer int` uses `shmloader.testing.IntTokenizer` (token ==
position data). After its first batch it writes OUT/pids-<pid>.json: its live descendant
processes. Exits 0 after batch N-1.
"""
import argparse
import hashlib
import os

import numpy as np

import shmloader
from shmloader import testing
from restart_trainer import load_checkpoint, train


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="directory of parquet shards")
    ap.add_argument("--tokenizer", required=True, help="path to tokenizer.pkl, or 'int' for IntTokenizer")
    ap.add_argument("--out", required=True, help="directory for log.jsonl, state.json, pids-*.json")
    ap.add_argument("--total", type=int, required=True, help="batches to train, in all runs together")
    ap.add_argument("--batch-size", type=int, default=2, help="B, rows per batch")
    ap.add_argument("--seq-len", type=int, default=16, help="T, tokens per row")
    ap.add_argument("--workers", type=int, default=2, help="loader worker processes")
    ap.add_argument("--split", default="train", help="train or val")
    ap.add_argument("--buffer-size", type=int, default=1000, help="best-fit buffer, in documents")
    ap.add_argument("--chunk", type=int, default=128, help="tokenizer_batch_size, in documents")
    ap.add_argument("--step-s", type=float, default=0.01, help="seconds of 'training' per batch")
    args = ap.parse_args()

    tokenizer = testing.IntTokenizer() if args.tokenizer == "int" else args.tokenizer
    k, state = load_checkpoint(args.out)
    gen = shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit(
        tokenizer, args.batch_size, args.seq_len, args.split, args.workers, args.chunk, "cpu",
        state, args.buffer_size, data=args.data)
    train(gen, k, args, record)


def record(k: int, inputs, targets, state) -> dict:
    rows = np.concatenate([inputs.numpy(), targets.numpy()[:, -1:]], axis=1)
    return {"k": k, "pid": os.getpid(), "sha": hashlib.sha256(rows.tobytes()).hexdigest(),
            "pos": [state[f] for f in ("epoch", "pq_idx", "rg_idx", "doc_idx")],
            "buffer_docs": sum(run[4] for run in state["buffer"])}

if __name__ == "__main__":
    main()
