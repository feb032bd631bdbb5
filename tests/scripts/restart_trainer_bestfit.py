"""A minimal best-fit trainer for the restart test (tests/loader/test_bestfit_stream.py).

    python restart_trainer_bestfit.py --data DIR --tokenizer PKL|int --out DIR --total N
        [--batch-size B] [--seq-len T] [--workers N] [--split train|val]
        [--buffer-size DOCS] [--chunk DOCS] [--step-s SECONDS]

Iterates `shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit` and, for each
batch k, appends one JSON line `{"k", "pid", "sha", "pos", "buffer_docs"}` to OUT/log.jsonl
(`sha`: sha256 of the (B, T+1) int64 rows, i.e. inputs plus the last target column; `pos`:
the state's position[:4] (epoch, file, row group, row); `buffer_docs`: documents in the state's
buffer), then writes `{"k", "state"}` to OUT/state.json atomically (tmp file + os.replace).
On start it resumes from OUT/state.json when present, first dropping the log lines written
after that checkpoint. `--tokenizer int` uses `tests.helpers.IntTokenizer` (token ==
position data). After its first batch it writes OUT/pids-<pid>.json: its live descendant
processes. Exits 0 after batch N-1.
"""
import hashlib
import os

import numpy as np

import shmloader
from shmloader.state import decode_runs
from tests import helpers
from restart_trainer import load_checkpoint, run_arguments, train


def main():
    ap = run_arguments(__doc__, seq_len=16, tokenizer_help="path to tokenizer.pkl, or 'int' for IntTokenizer")
    ap.add_argument("--buffer-size", type=int, default=1000, help="best-fit buffer, in documents")
    ap.add_argument("--chunk", type=int, default=128, help="tokenizer_batch_size, in documents")
    args = ap.parse_args()

    tokenizer = helpers.IntTokenizer() if args.tokenizer == "int" else args.tokenizer
    k, state = load_checkpoint(args.out)
    gen = shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit(
        tokenizer, args.batch_size, args.seq_len, args.split, args.workers, args.chunk, "cpu",
        state, args.buffer_size, data=args.data)
    train(gen, k, args, record)


def record(k: int, inputs, targets, state) -> dict:
    rows = np.concatenate([inputs.numpy(), targets.numpy()[:, -1:]], axis=1)
    return {"k": k, "pid": os.getpid(), "sha": hashlib.sha256(rows.tobytes()).hexdigest(),
            "pos": state["position"][:4],
            "buffer_docs": int(decode_runs(state["buffer"])[:, 4].sum())}

if __name__ == "__main__":
    main()
