"""A minimal trainer for the restart test (tests/loader/test_resume.py), in nanochat's loop:
it takes one batch before the first step, trains on the batch in hand, prefetches the next
one, and checkpoints the state that came with the prefetched batch (which resumes AT that
batch).

    python restart_trainer.py --data DIR --tokenizer PKL --out DIR --total N [--batch-size B]
        [--seq-len T] [--workers N] [--split train|val] [--step-s SECONDS]

For each batch k it appends one JSON line `{"k", "pid", "head", "sha"}` to OUT/log.jsonl
(`head`: inputs[0, :8]; `sha`: sha256 of the int64 window of B*T+1 tokens), then writes
`{"k": k + 1, "state"}` (the prefetched batch k + 1 and its state) to OUT/state.json
atomically (tmp file + os.replace). On start it resumes from OUT/state.json when present at
batch "k", first dropping the log lines of that batch and later ones.
After its first batch it writes OUT/pids-<pid>.json: its live descendant processes (the
loader's coordinator and workers, multiprocessing's helpers), again whenever more are seen
(a process's first loader starts its children once the forkserver has booted). Exits 0 after batch N-1.
"""
import argparse
import hashlib
import json
import os
import time

import torch

import shmloader


def descendants(root: int) -> list[int]:
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(name))
    out, stack = [], [root]
    while stack:
        for pid in children.get(stack.pop(), []):
            out.append(pid)
            stack.append(pid)
    return out


def load_checkpoint(out: str):
    """(the batch to resume at, its state or None); trims log lines from that batch on."""
    path = os.path.join(out, "state.json")
    if not os.path.exists(path):
        open(os.path.join(out, "log.jsonl"), "w").close()
        return 0, None
    with open(path) as f:
        saved = json.load(f)
    log = os.path.join(out, "log.jsonl")
    with open(log) as f:
        lines = [line for line in f if line.endswith("\n") and json.loads(line)["k"] < saved["k"]]
    with open(log, "w") as f:
        f.writelines(lines)
    return saved["k"], saved["state"]


def save_checkpoint(out: str, k: int, state: dict):
    tmp = os.path.join(out, "state.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"k": k, "state": state}, f)
    os.replace(tmp, os.path.join(out, "state.json"))


def run_arguments(doc: str, seq_len: int, tokenizer_help: str = "path to tokenizer.pkl"):
    """The options every restart trainer takes."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--data", required=True, help="directory of parquet shards")
    ap.add_argument("--tokenizer", required=True, help=tokenizer_help)
    ap.add_argument("--out", required=True, help="directory for log.jsonl, state.json, pids-*.json")
    ap.add_argument("--total", type=int, required=True, help="batches to train, in all runs together")
    ap.add_argument("--batch-size", type=int, default=2, help="B, rows per batch")
    ap.add_argument("--seq-len", type=int, default=seq_len, help="T, tokens per row")
    ap.add_argument("--workers", type=int, default=2, help="loader worker processes")
    ap.add_argument("--split", default="train", help="train or val")
    ap.add_argument("--step-s", type=float, default=0.01, help="seconds of 'training' per batch")
    return ap


def main():
    args = run_arguments(__doc__, seq_len=32).parse_args()

    k, state = load_checkpoint(args.out)
    gen = shmloader.tokenizing_distributed_data_loader_with_state(
        args.batch_size, args.seq_len, args.split, args.workers, device="cpu",
        resume_state_dict=state, data=args.data, tokenizer=args.tokenizer)
    train(gen, k, args, record)


def record(k: int, inputs, targets, state) -> dict:
    window = torch.cat([inputs.reshape(-1)[:1], targets.reshape(-1)]).numpy()
    return {"k": k, "pid": os.getpid(), "head": inputs[0, :8].tolist(),
            "sha": hashlib.sha256(window.tobytes()).hexdigest()}


def train(gen, k: int, args, record_of):
    """Train on batches k.. up to args.total as nanochat does: log the batch in hand, prefetch
    the next, checkpoint the prefetched batch's state; note the pids (again when more came)."""
    pids, seen = os.path.join(args.out, f"pids-{os.getpid()}.json"), set()
    inputs, targets, state = next(gen)  # before the first step
    with open(os.path.join(args.out, "log.jsonl"), "a") as log:
        while k < args.total:
            log.write(json.dumps(record_of(k, inputs, targets, state)) + "\n")
            log.flush()
            time.sleep(args.step_s)
            inputs, targets, state = next(gen)  # the prefetch
            save_checkpoint(args.out, k + 1, state)
            if set(now := descendants(os.getpid())) - seen:  # a process's first loader starts its
                seen.update(now)                             # children once the forkserver has booted
                with open(pids + ".tmp", "w") as f:
                    json.dump(sorted(seen), f)
                os.replace(pids + ".tmp", pids)
            k += 1
    gen.close()

if __name__ == "__main__":
    main()
