"""One rank of tests/loader/test_distributed.py, launched by torchrun (2 processes, gloo, CPU).

Usage: torchrun --nproc_per_node=2 tests/scripts/torchrun_worker.py DATA_DIR OUT_DIR B T

The rank and world size come only from torchrun's environment (RANK / WORLD_SIZE): the loader
is not told them. Each rank
  1. streams one epoch of concat batches plus one batch (ceil(epoch tokens / window) + 1
     batches) with `ShmLoader(..., device="cpu")`, compares every window with
     `oracle.concat_windows(..., rank=r, world=2)`, and maps the epoch-1 part of its
     stream back to row groups (IntTokenizer data: every non-BOS token is a unique integer,
     so a token names the row group it came from);
  2. streams a few best-fit batches and compares them with `oracle.bestfit_rows`;
  3. exchanges its final state with the other rank through `all_gather_object`;
  4. saves a loader after K batches with torch.distributed.checkpoint (collectively, both
     ranks), once as `{"loader": loader}` and once under a per-rank key
     `{f"loader_rank{r}": loader}`, loads each into a fresh loader and compares its next
     batches with the uninterrupted run's;
and writes everything to OUT_DIR/rank{r}.json for the test to check.
"""
import itertools
import json
import os
import sys
import warnings

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

import shmloader
from tests import oracle
from tests.helpers import IntTokenizer


def token_owners(files) -> dict:
    """token -> (file, row group) for every non-BOS token of `files` (tokens are unique)."""
    owners = {}
    for f, path in enumerate(files):
        pf = pq.ParquetFile(path)
        for g in range(pf.num_row_groups):
            for text in pf.read_row_group(g, columns=["text"]).column("text").to_pylist():
                for tok in (text or "").split():
                    assert int(tok) not in owners, f"token {tok} is not unique in the data"
                    owners[int(tok)] = (f, g)
    return owners


def concat_run(files, tok, B, T, rank, world) -> dict:
    bos = tok.get_bos_token_id()
    W = B * T + 1
    epoch_tokens = sum(1 + len(tok.encode(text)) for _, text in
                       oracle.documents(files, rank, world, epochs=1) if text is not None)
    n = -(-epoch_tokens // W) + 1
    expected = list(itertools.islice(
        oracle.concat_windows(files, tok.encode, bos, B, T, rank=rank, world=world), n))
    windows, states = [], []
    with shmloader.ShmLoader(sys.argv[1], tok, B, T, "train", num_workers=1, device="cpu",
                             timeout=60) as loader:
        assert (loader.rank, loader.world_size) == (rank, world), (loader.rank, loader.world_size)
        for inputs, targets in itertools.islice(loader, n):
            assert inputs.device.type == "cpu" and inputs.dtype == torch.int64
            x, y = inputs.reshape(-1).numpy(), targets.reshape(-1).numpy()
            windows.append(np.concatenate([x[:1], y]))
            states.append(loader.state_dict())
    equal = len(windows) == n and all(np.array_equal(w, o) for w, (o, _) in zip(windows, expected))
    positions_equal = [tuple(s["position"])
                       for s in states] == [tuple(p) for _, p in expected]
    stream = np.concatenate(windows)[:epoch_tokens]
    owners = token_owners(files)
    row_groups = sorted({owners[int(t)] for t in stream if t != bos})
    return {"n_batches": len(windows), "equal": bool(equal), "positions_equal": positions_equal,
            "epoch_tokens": epoch_tokens, "row_groups": [list(rg) for rg in row_groups],
            "stream": [int(t) for t in np.concatenate(windows)], "states": states}


def bestfit_run(files, tok, B, T, rank, world, n=6) -> dict:
    kw = dict(buffer_size=12, tokenizer_batch_size=4)
    expected = list(itertools.islice(
        oracle.bestfit_rows(files, tok.encode, tok.get_bos_token_id(), B, T, rank=rank,
                               world=world, buffer_size=kw["buffer_size"],
                               chunk_docs=kw["tokenizer_batch_size"]), n))
    got = []
    with shmloader.ShmLoader(sys.argv[1], tok, B, T, "train", packing="bos_bestfit",
                             num_workers=1, device="cpu", timeout=60, **kw) as loader:
        for inputs, targets in itertools.islice(loader, n):
            got.append((inputs.numpy().copy(), targets.numpy().copy()))
    equal = len(got) == n and all(
        np.array_equal(x, rows[:, :-1]) and np.array_equal(y, rows[:, 1:])
        for (x, y), (rows, _) in zip(got, expected))
    return {"n_bestfit": len(got), "equal_bestfit": bool(equal)}


def dcp_run(tok, B, T, rank, out_dir, k=3, n=3) -> dict:
    import torch.distributed.checkpoint as dcp

    def loader():
        return shmloader.ShmLoader(sys.argv[1], tok, B, T, "train", num_workers=1, device="cpu",
                                   timeout=60)

    out = {}
    with loader() as first:
        head = [x.clone() for x, _ in itertools.islice(first, k)]
        saved = first.state_dict()
        for name in ("naive", "keyed"):
            key = "loader" if name == "naive" else f"loader_rank{rank}"
            dcp.save({key: first}, checkpoint_id=os.path.join(out_dir, f"dcp_{name}"))
        rest = [x.clone() for x, _ in itertools.islice(first, n)]
    dist.barrier()
    for name in ("naive", "keyed"):
        key = "loader" if name == "naive" else f"loader_rank{rank}"
        with warnings.catch_warnings(record=True) as caught, loader() as second:
            warnings.simplefilter("always")
            try:
                dcp.load({key: second}, checkpoint_id=os.path.join(out_dir, f"dcp_{name}"))
                got = [x.clone() for x, _ in itertools.islice(second, n)]
                error = None
            except Exception as exc:  # reported, judged by the test
                got, error = [], f"{type(exc).__name__}: {exc}"
        out[f"dcp_{name}"] = {
            "exact": len(got) == n and all(torch.equal(a, b) for a, b in zip(got, rest)),
            "error": error, "warnings": [str(w.message) for w in caught
                                         if "resume state" in str(w.message)]}
    out["dcp_k"] = len(head)
    out["dcp_saved_state"] = saved
    out["dcp_rest_differs_from_head"] = not torch.equal(head[0], rest[0])
    return out


def main():
    data, out_dir, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert (rank, world) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    files = sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".parquet"))[:-1]
    tok = IntTokenizer()
    result = {"rank": rank, "world": world, "env_rank": os.environ["RANK"]}
    result.update(concat_run(files, tok, B, T, rank, world))
    result.update(bestfit_run(files, tok, B, T, rank, world))
    gathered = [None] * world
    dist.all_gather_object(gathered, result["states"][-1])
    result["gathered_states"] = gathered
    result.update(dcp_run(tok, B, T, rank, out_dir))
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
