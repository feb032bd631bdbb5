"""The drop-ins' `pq_idx`/`rg_idx`/`epoch` with each batch against nanochat's own loaders' (their
real code), batch by batch (issue 49 item 9): nanochat's original concat loader
(../shared/reference/nanochat_dataloader_original.py, within one epoch: it hangs at the end of its
data) and its current best fit (a nanochat checkout's nanochat/dataloader.py), ranks 0 and 1 of 2,
two geometries each, on a corpus of documents of 1 to 700 tokens (IntTokenizer).

    git clone <nanochat> /tmp/nanochat
    DOCS=300 N=60 NANOCHAT=/tmp/nanochat REFERENCE=../shared/reference python tests/scripts/nanochat_keys.py

Prints each case's batches equal of N and the keys' variety; exits 1 on any difference."""
import importlib.util
import itertools
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.environ.get("NANOCHAT", "/tmp/nanochat"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import shmloader  # noqa: E402
from shmloader.demo import corpus  # noqa: E402
from tests import helpers  # noqa: E402

rng = random.Random(5)
lengths = [rng.choice([1, 3, 9, 30, 80, 200, 700]) for _ in range(int(os.environ.get('DOCS', '1500')))]  # no nulls: nanochat reads none
docs, t = [], 1
for n in lengths:
    docs.append(" ".join(str(t + i) for i in range(n))); t += n
paths = [str(p) for p in corpus.write_shards(docs, Path(tempfile.mkdtemp(prefix="nanochat_keys_")), num_files=4, row_group_size=[30, 1, 13, 64])]
tok = helpers.IntTokenizer()
N = int(os.environ.get("N", "40"))

def nanochat_keys(fn_module, name, rank, world, args, key):
    m = fn_module
    m.get_dist_info = lambda: (True, rank, rank, world)
    m.list_parquet_files = lambda **kw: paths
    if hasattr(m, "get_tokenizer"):
        m.get_tokenizer = lambda: tok
    gen = getattr(m, name)(*args)
    return [key(s) for *_, s in itertools.islice(gen, N)]

spec = importlib.util.spec_from_file_location("orig", os.path.join(os.environ.get("REFERENCE", "../shared/reference"), "nanochat_dataloader_original.py"))
orig = importlib.util.module_from_spec(spec); spec.loader.exec_module(orig)
import nanochat.dataloader as cur
bad = 0
for rank in (0, 1):
    for B, T, chunk in ((2, 64, 8), (2, 32, 16)):  # within an epoch: nanochat's original loader hangs at the end of its data
        want = nanochat_keys(orig, "tokenizing_distributed_data_loader_with_state", rank, 2, (B, T, "train", 1, chunk, "cpu"), lambda s: (s["pq_idx"], s["rg_idx"]))
        g = shmloader.tokenizing_distributed_data_loader_with_state(B, T, "train", 2, chunk, "cpu", None, tokenizer=tok, data=paths, rank=rank, world_size=2, num_workers=2)
        got = [(s["pq_idx"], s["rg_idx"]) for *_, s in itertools.islice(g, N)]; g.close()
        diff = [k for k in range(N) if got[k] != want[k]]
        bad += len(diff)
        print(f"concat rank {rank} B={B} T={T} chunk={chunk}: {N - len(diff)}/{N} equal; first {want[:4]} distinct {len(set(want))}", "DIFF at", diff[:5] if diff else "")
    for B, T, chunk, buf in ((8, 128, 16, 64), (4, 64, 8, 100)):
        want = nanochat_keys(cur, "tokenizing_distributed_data_loader_with_state_bos_bestfit", rank, 2, (tok, B, T, "train", 1, chunk, "cpu", None, buf), lambda s: (s["pq_idx"], s["rg_idx"], s["epoch"]))
        g = shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit(tok, B, T, "train", 2, chunk, "cpu", None, buf, data=paths, rank=rank, world_size=2, num_workers=2)
        got = [(s["pq_idx"], s["rg_idx"], s["epoch"]) for *_, s in itertools.islice(g, N)]; g.close()
        diff = [k for k in range(N) if got[k] != want[k]]
        bad += len(diff)
        print(f"bestfit rank {rank} B={B} T={T} chunk={chunk} buffer={buf}: {N - len(diff)}/{N} equal; distinct {len(set(want))} epochs {sorted(set(w[2] for w in want))}", "DIFF at", diff[:5] if diff else "")
print("differences:", bad)
sys.exit(1 if bad else 0)
