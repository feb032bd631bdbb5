"""One rank of tests/loader/test_elastic.py's torchrun check (gloo, CPU): resume a state saved at
another world size, as nanochat does (rank 0's state, read from a file, given to every rank).

Usage: torchrun --nproc_per_node=W2 tests/scripts/torchrun_elastic.py DATA_DIR STATE.json OUT_DIR B T N PACKING

The rank and world size come only from torchrun's environment. Each rank iterates nanochat's
drop-in (`x, y, state = next(loader)`) built with the state, takes N batches (concat: windows;
best fit: rows) and the state yielded with each, gathers every rank's plan through
`all_gather_object` (they must be one), and writes OUT_DIR/rank{r}.json.
"""
import itertools
import json
import sys

import numpy as np
import torch.distributed as dist

from shmloader import nanochat
from tests.helpers import IntTokenizer


def main():
    data, state_path, out, B, T, n, packing = sys.argv[1:8]
    B, T, n = int(B), int(T), int(n)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(state_path) as f:
        state = json.load(f)
    got, states = [], []
    # nanochat's loop: the drop-in with the state of rank 0 of the old run, x, y, state = next(loader)
    opts = dict(data=data, device="cpu", num_workers=1, timeout=120, tokenizer_batch_size=4, resume_state_dict=state)
    if packing == "concat":
        loader = nanochat.tokenizing_distributed_data_loader_with_state(B, T, "train", tokenizer=IntTokenizer(), **opts)
    else:
        loader = nanochat.tokenizing_distributed_data_loader_with_state_bos_bestfit(IntTokenizer(), B, T, "train",
                                                                                    buffer_size=12, **opts)
    for x, y, s in itertools.islice(loader, n):
        x, y = x.numpy(), y.numpy()
        got.append((np.concatenate([x.reshape(-1)[:1], y.reshape(-1)]) if packing == "concat"
                    else np.concatenate([x, y[:, -1:]], axis=1).reshape(-1)).tolist())
        states.append(s)
    loader.close()
    plan = states[0]["elastic"]
    world = (states[0]["rank"], states[0]["world_size"])
    plans = [None] * dist.get_world_size()
    dist.all_gather_object(plans, plan)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"rank": world[0], "world": world[1], "batches": got, "states": states,
                   "same_plan": all(p == plan for p in plans)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
