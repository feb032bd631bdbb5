"""Two ranks under torchrun, and torch.distributed.checkpoint round trips.

`tests/scripts/torchrun_worker.py` runs as 2 torchrun processes (gloo, CPU); the rank comes only from
torchrun's RANK / WORLD_SIZE. The data is IntTokenizer text whose non-BOS tokens are unique
integers (token = position in the file set), so each rank's stream maps back to the row
groups it read. Checked here, from the ranks' JSON reports:

- each rank's concat stream equals `oracle.concat_windows(rank=r, world=2)` window for
  window (checked in the rank and again here from the raw stream), and its states equal the
  oracle's positions; its best-fit batches equal `oracle.bestfit_rows(rank=r, world=2)`;
- over one epoch the two ranks read disjoint sets of row groups (rank r: row groups
  r, r+2, ...) whose union is every row group of the train split, and every train token
  exactly once;
- `all_gather_object` works alongside the loaders (each rank sees both final states);
- DCP: a per-rank key round trip resumes exactly on both ranks; `{"loader": loader}` under
  the same key on both ranks comes back mixed (DCP keeps one copy per key), and each rank
  then resumes exactly, is warned, or is refused by the state's digest: never silently wrong.

A single-process DCP round trip (`no_dist=True`) checks the Stateful protocol for both packings.
"""
import collections
import itertools
import json
import os
import signal
import subprocess
import sys
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers, oracle

B, T = 2, 24
W = B * T + 1
WORKER = helpers.SCRIPTS / "torchrun_worker.py"
TORCHRUN_TIMEOUT_S = 150


def _lengths(n=120):
    """Token counts (without BOS) of the documents: 1..29, some empty (0), some null."""
    out = []
    for i in range(n):
        if i % 11 == 4:
            out.append(None)
        elif i % 13 == 6:
            out.append(0)
        else:
            out.append((i * 7) % 29 + 1)
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist_data")
    docs = helpers.position_documents(_lengths())
    paths = [str(p) for p in corpus.write_shards(docs, root, num_files=3, row_group_size=[7, 3, 11, 5])]
    return root, paths


def _owners(paths) -> dict:
    """(file, rg) -> list of its non-BOS tokens, in order."""
    out = {}
    for f, path in enumerate(paths):
        pf = pq.ParquetFile(path)
        for g in range(pf.num_row_groups):
            texts = pf.read_row_group(g, columns=["text"]).column("text").to_pylist()
            out[(f, g)] = [int(t) for text in texts if text for t in text.split()]
    return out


@pytest.fixture(scope="module")
def ranks(data, tmp_path_factory):
    """Run torchrun once; return the two ranks' JSON reports."""
    root, _ = data
    out = tmp_path_factory.mktemp("dist_out")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master-addr=127.0.0.1", f"--master-port={helpers.free_port()}", str(WORKER),
           str(root), str(out), str(B), str(T)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    # own session, so that a hang can be ended with every rank (and their loaders) at once
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TORCHRUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"torchrun did not finish within {TORCHRUN_TIMEOUT_S} s (hang?):\n{stderr[-4000:]}")
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{stdout[-3000:]}\n{stderr[-6000:]}"
    reports = []
    for r in range(2):
        with open(out / f"rank{r}.json") as f:
            reports.append(json.load(f))
    return reports


def test_ranks_come_from_torchrun_env(ranks):
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["env_rank"] for r in ranks] == ["0", "1"]
    assert all(r["world"] == 2 for r in ranks)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_streams_its_oracle(ranks, data, rank):
    rep = ranks[rank]
    _, paths = data
    n = rep["n_batches"]
    assert n >= 3, "an epoch should take several batches"
    assert rep["equal"] and rep["positions_equal"], f"rank {rank}: stream differs from its oracle"
    # re-check here, from the raw stream, against the oracle computed in this process
    tok = helpers.IntTokenizer()
    expected = list(itertools.islice(oracle.concat_windows(paths[:-1], tok.encode, 0, B, T,
                                                            rank=rank, world=2), n))
    assert len(rep["stream"]) == n * W
    assert np.array_equal(np.array(rep["stream"]), np.concatenate([w for w, _ in expected]))
    assert [tuple(s["position"]) for s in rep["states"]] \
        == [tuple(p) for _, p in expected]
    assert rep["states"][-1]["epoch"] == 2, "the run should end just past one epoch"
    assert all(s["rank"] == rank and s["world_size"] == 2 for s in rep["states"])


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_bestfit_matches_oracle(ranks, rank):
    assert ranks[rank]["n_bestfit"] == 6
    assert ranks[rank]["equal_bestfit"], f"rank {rank}: best-fit batches differ from oracle.bestfit_rows"


def test_ranks_cover_every_row_group_once_per_epoch(ranks, data):
    _, paths = data
    owners = _owners(paths[:-1])
    assert all(owners.values()), "every row group needs a token for this check to mean anything"
    read = [{tuple(rg) for rg in rep["row_groups"]} for rep in ranks]
    for r in (0, 1):
        assert read[r], f"rank {r} read nothing"
        assert all(g % 2 == r for _, g in read[r]), f"rank {r} read another rank's row group: {read[r]}"
    assert not read[0] & read[1], f"row groups read by both ranks: {read[0] & read[1]}"
    assert read[0] | read[1] == set(owners), f"row groups never read: {set(owners) - (read[0] | read[1])}"
    # every train token exactly once in the two ranks' first epochs (multiset equality)
    seen = collections.Counter()
    for rep in ranks:
        epoch1 = rep["stream"][:rep["epoch_tokens"]]
        seen.update(t for t in epoch1 if t != 0)
    expected = collections.Counter(t for toks in owners.values() for t in toks)
    assert seen == expected
    # epoch 2 starts right after: a BOS, then the rank's first row group again
    for r, rep in enumerate(ranks):
        after = rep["stream"][rep["epoch_tokens"]:]
        assert after[0] == 0
        assert next(t for t in after if t != 0) == owners[(0, r)][0]


def test_all_gather_object_alongside_loaders(ranks):
    finals = [rep["states"][-1] for rep in ranks]
    assert finals[0] != finals[1]
    for rep in ranks:
        assert rep["gathered_states"] == finals
        json.dumps(rep["gathered_states"])  # plain data


@pytest.mark.parametrize("rank", [0, 1])
def test_dcp_per_rank_key_resumes_exactly(ranks, rank):
    rep = ranks[rank]
    assert rep["dcp_k"] == 3 and rep["dcp_rest_differs_from_head"]
    got = rep["dcp_keyed"]
    assert got["error"] is None, got["error"]
    assert got["warnings"] == []
    assert got["exact"], f"rank {rank}: DCP round trip under a per-rank key did not resume exactly"


def test_dcp_same_key_on_every_rank_is_never_a_silent_wrong_resume(ranks):
    """DCP keeps one value per non-tensor key across ranks, so {'loader': loader} saved by both
    ranks loads fields of both. Each rank must then resume exactly (it got its own state),
    be warned (it got another rank's whole state: nanochat-style resume), or be refused by the
    state's digest (a mix) -- never resume silently at a wrong position."""
    for rank, rep in enumerate(ranks):
        got = rep["dcp_naive"]
        refused = got["error"] is not None and "digest" in got["error"] and "ValueError" in got["error"]
        assert got["exact"] or got["warnings"] or refused, f"rank {rank}: {got}"


# ------------------------------------------------------------------ single process, no_dist

@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_dcp_single_process_round_trip(data, tmp_path, packing):
    import torch
    import torch.distributed.checkpoint as dcp

    root, _ = data
    tok = helpers.IntTokenizer()
    kw = dict(packing=packing, num_workers=1, device="cpu", timeout=60,
              buffer_size=12, tokenizer_batch_size=4)
    k, n = 5, 4

    def make():
        return shmloader.ShmLoader(str(root), tok, B, T, "train", **kw)

    with make() as full_run:
        full = [(x.clone(), y.clone()) for x, y in itertools.islice(full_run, k + n)]
    with make() as first:
        for _ in itertools.islice(first, k):
            pass
        saved = first.state_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "assuming ... a single process"
            dcp.save({"loader": first}, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    assert tuple(saved["position"][1:4]) != (0, 0, 0), "resume point is the start"
    with make() as second:
        assert second.state_dict() != saved
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({"loader": second}, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
        assert second.state_dict() == saved
        rest = [(x.clone(), y.clone()) for x, y in itertools.islice(second, n)]
    assert len(rest) == n
    assert not torch.equal(full[k][0], full[0][0])
    for i, ((x, y), (ex, ey)) in enumerate(zip(rest, full[k:])):
        assert torch.equal(x, ex) and torch.equal(y, ey), f"batch {k + i + 1} differs after a DCP resume"
