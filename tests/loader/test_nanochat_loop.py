"""Resume in nanochat's real training loop (scripts/base_train.py), written as that client.

The loop: take one batch before the first step; in each of the step's micro-steps train on the
batch in hand, then call next() for the following one (a prefetch); at the top of step s (a
checkpoint) save the state that came with the batch just prefetched and not trained on yet,
through JSON (only rank 0's state is saved, and every rank gets it back); on resume, build the
loader with that state and start again with a prefetch. The resumed run must train on exactly
the batches of the uninterrupted run, on every rank, with another worker count, at a step
inside a row group, at a file boundary and across the epoch boundary, for both packings; with
and without a token cache (rank 1 then finds its place from the cache's stored lengths).
"""
import hashlib
import itertools
import json
import logging

import numpy as np
import pytest

import shmloader
from shmloader.data import tokenizer as tokmod
from shmloader.data.cache import TokenCache
from shmloader.data.source import Reader
from tests import oracle
from tests.cases import cross

pytestmark = pytest.mark.usefixtures("watchdog")
B, T, MICRO = 2, 16, 2
STEPS = 110  # crosses the train epoch of posdata on either rank of 2, for both packings


def make_loader(ds, packing, rank, workers, state, **options):
    # num_workers: exactly `workers` (tokenizer_threads alone is capped at the machine's cores)
    common = dict(data=str(ds.root), rank=rank, world_size=2, num_workers=workers, **options)
    if packing == "concat":
        return shmloader.tokenizing_distributed_data_loader_with_state(
            B, T, "train", workers, 128, "cpu", state, tokenizer=ds.tokenizer, **common)
    return shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit(
        ds.tokenizer, B, T, "train", workers, 3, "cpu", state, 5, **common)


def train(gen, steps, start_step=0, save_at=None):
    """base_train.py's loop over `gen`: the batches trained on (sha256 each), the state saved
    at step `save_at` (a JSON round trip), and the state of every step's prefetched batch."""
    trained, saved, states = [], None, []
    x, y, state = next(gen)  # kick off load of the very first batch of data
    step = start_step
    while True:
        states.append(state)
        if step == save_at:
            saved = json.loads(json.dumps(state))  # into the checkpoint's JSON metadata
        if step == steps:
            break
        for _ in range(MICRO):
            trained.append(hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest())
            x, y, state = next(gen)  # prefetch the next batch while the GPU is busy
        step += 1
    gen.close()
    return trained, saved, states


_RUNS = {}


def uninterrupted(ds, packing, rank):
    """The uninterrupted run of `rank` (computed once per module)."""
    key = (str(ds.root), packing, rank)
    if key not in _RUNS:
        trained, _, states = train(make_loader(ds, packing, rank, 2, None), STEPS)
        assert len(trained) == STEPS * MICRO
        _RUNS[key] = trained, states
    return _RUNS[key]


def save_points(states) -> dict:
    """Steps whose checkpoint falls inside a row group, at a file boundary (the first step in
    a new file) and at the epoch boundary (the first step of epoch 2)."""
    pos = [(s["epoch"], s["pq_idx"], s["rg_idx"]) for s in states]
    out = {"inside": next(s for s in range(3, len(pos)) if pos[s] == pos[s - 1])}
    out["file"] = next(s for s in range(1, len(pos)) if pos[s][:2] != pos[s - 1][:2] and pos[s][0] == 1)
    out["epoch"] = next(s for s in range(1, len(pos)) if pos[s][0] == 2)
    assert out["epoch"] < STEPS - 5, "the run does not go far enough past the epoch boundary"
    return out


# default: every pair of values (packing, rank, save point) once; the other six with -m slow
@pytest.mark.parametrize("packing,rank,where", cross(
    ["concat", "bos_bestfit"], [0, 1], ["inside", "file", "epoch"],
    default={"concat-0-inside", "bos_bestfit-1-inside", "concat-1-file", "bos_bestfit-0-file", "concat-0-epoch",
             "bos_bestfit-1-epoch"}))
def test_nanochat_loop_resumes_exactly_on_every_rank(posdata, packing, rank, where):
    """Rank 0 saves at step s; rank `rank` resumes from rank 0's state (with 3 workers, not 2)
    and trains on exactly its own uninterrupted batches from step s on."""
    full0, states0 = uninterrupted(posdata, packing, 0)
    full, _ = uninterrupted(posdata, packing, rank)
    s = save_points(states0)[where]
    _, saved, _ = train(make_loader(posdata, packing, 0, 2, None), s, save_at=s)
    assert saved == json.loads(json.dumps(states0[s])) and saved["batch"] == s * MICRO
    resumed, _, _ = train(make_loader(posdata, packing, rank, 3, saved), STEPS, start_step=s)
    assert len(resumed) == (STEPS - s) * MICRO > 0
    first_diff = next((i for i, (a, b) in enumerate(zip(resumed, full[s * MICRO:])) if a != b), None)
    assert first_diff is None, f"resumed at step {s}: micro-batch {s * MICRO + first_diff} differs"
    if rank == 1:
        assert full != full0, "ranks 0 and 1 train on the same batches: the rank check is vacuous"


def test_a_resume_without_the_fix_would_skip_a_batch(posdata):
    """The state saved at step s resumes AT the prefetched batch: the first batch trained
    after the resume is the one the uninterrupted run trains at step s, not the one after."""
    full, states = uninterrupted(posdata, "concat", 0)
    s = 7
    resumed, _, _ = train(make_loader(posdata, "concat", 0, 1, json.loads(json.dumps(states[s]))),
                          s + 1, start_step=s)
    assert resumed == full[s * MICRO:(s + 1) * MICRO]


def fill_cache(ds, cache_dir):
    """Every row group of the data in the token cache, as tools/pretokenize.py writes it."""
    spec = tokmod.resolve(ds.tokenizer, None)
    encode, store = tokmod.build(spec), TokenCache(str(cache_dir), spec.fingerprint, spec.n_vocab)
    for f, path in enumerate(ds.paths):
        src = Reader([str(path)])
        for rg, rows in enumerate(src.row_counts(0)):
            texts = src.read_texts(0, rg, 0, rows)
            docs = [np.concatenate([[spec.bos], encode(t)]) for t in texts if t is not None]
            lengths = np.zeros(len(texts), dtype=np.int64)
            lengths[[i for i, t in enumerate(texts) if t is not None]] = [len(d) for d in docs]
            tokens = np.concatenate(docs).astype(spec.dtype) if docs else np.empty(0, spec.dtype)
            store.store(str(path), rg, lengths, tokens)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_rank1_finds_its_place_from_the_token_cache(posdata, packing, tmp_path, caplog):
    """With a filled token cache, rank 1 reads its lengths from the cache (no tokenizing) and
    still resumes exactly from rank 0's state."""
    cache = tmp_path / "cache"
    fill_cache(posdata, cache)
    full, _ = uninterrupted(posdata, packing, 1)
    _, states0 = uninterrupted(posdata, packing, 0)
    s = save_points(states0)["epoch"]
    with caplog.at_level(logging.INFO, logger="shmloader"):
        resumed, _, _ = train(make_loader(posdata, packing, 1, 2, json.loads(json.dumps(states0[s])),
                                          cache_dir=cache), STEPS, start_step=s)
    assert resumed == full[s * MICRO:]
    found = [r.getMessage() for r in caplog.records if "row groups from the token cache" in r.getMessage()]
    assert found and "counted: 0," in found[0], found


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_the_nanochat_keys_yielded_with_each_batch_are_nanochats(posdata, packing, rank):
    """nanochat's loaders yield with each batch the file, row group and epoch of the last
    tokenizer batch they read to make it (oracle.nanochat_keys, checked against nanochat's own
    code); the drop-in's must say the same, from step 0 on (rank 0 of 2: the first batch needs
    more than its first row group; rank 1: its first row group, 1 row, too)."""
    B, T, chunk, buffer = (4, 256, 16, 0) if packing == "concat" else (2, 16, 16, 64)
    common = dict(data=str(posdata.root), rank=rank, world_size=2, num_workers=2)
    if packing == "concat":
        gen = shmloader.tokenizing_distributed_data_loader_with_state(
            B, T, "train", 2, chunk, "cpu", None, tokenizer=posdata.tokenizer, **common)
    else:
        gen = shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit(
            posdata.tokenizer, B, T, "train", 2, chunk, "cpu", None, buffer, **common)
    got = [(s["pq_idx"], s["rg_idx"], s["epoch"]) for *_, s in itertools.islice(gen, 6)]
    gen.close()
    want = list(itertools.islice(oracle.nanochat_keys(posdata.files("train"), posdata.encode, posdata.bos, B, T,
                                                      packing, rank, 2, chunk, buffer), 6))
    assert want[0] != (0, rank, 1), "nanochat's first batch reads only the rank's first row group: vacuous"
    assert got == want
