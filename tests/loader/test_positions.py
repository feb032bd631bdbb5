"""Document positions (`positions=True`, docs/contract.md §6), read as a client reads them: each
batch's `positions[b, t]` is the index of `inputs[b, t]` in its document, against two
independent counts:

- the token stream's own: the distance to the last BOS, over the batches' windows end to end
  for concat (a document cut by a row's or a batch's end counts on), within each row for best
  fit (every row starts at BOS); a plain Python loop over the tokens;
- `posdata`'s arithmetic: every non-BOS token is its index in the epoch's stream, so its
  position is its value minus its document's BOS index (the data's layout), wherever the run
  started: after a resume in the middle of a document, on another rank, after an elastic
  resume whose first document another rank began.

And: the batches equal those of `positions=False` (same loader, same data), for 1-3 workers,
both packings, both tokenizers (a BPE over `synth`, `IntTokenizer` over `posdata`); a resumed
run's batches and positions are the uninterrupted run's (a state saved without positions too);
a mixture (concat) over three sources; a token cache, cold and warm; heals (a worker killed,
the coordinator killed) change nothing; the nanochat drop-ins yield them before the state;
`cu_seqlens` of real batches equals a count by hand; a lent positions tensor keeps its slot;
`positions=False` leaves the slot's row the window, byte for byte.
"""
import itertools
import os
import signal

import numpy as np
import pytest
import torch

import shmloader
from shmloader.demo import corpus
from tests import helpers
from tests.cases import cross

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 2, 32
N = 150                         # batches per run: ~half of posdata's train epoch with concat
BESTFIT = {"buffer_size": 40, "tokenizer_batch_size": 8}


def options(packing: str, **kw) -> dict:
    return {"packing": packing, "timeout": 60, **(BESTFIT if packing == "bos_bestfit" else {}), **kw}


def run(loader, n: int, start: int = 0) -> tuple:
    """Batches `start` to `start + n` of a loader as numpy copies `(x, y, p or None)`, and the
    state before each."""
    out, states = [], []
    for i in range(start + n):
        state = loader.state_dict()
        batch = next(loader)
        if i < start:
            continue
        assert len(batch) == (3 if loader.config.positions else 2)
        for t in batch:
            assert t.dtype == torch.int64 and t.shape == (loader.B, loader.T)
        x, y, *p = (t.numpy().copy() for t in batch)
        out.append((x, y, p[0] if p else None))
        states.append(state)
    assert len(out) == n
    return out, states


def scanned(tokens, bos: int) -> list:
    """Each token's distance to the last BOS at or before it (the stream starts at a BOS)."""
    assert tokens[0] == bos, "the scan starts at a document's BOS"
    out, p = [], 0
    for tok in tokens:
        p = 0 if tok == bos else p + 1
        out.append(p)
    return out


def stream_positions(batches: list, bos: int, packing: str) -> list:
    """The positions of each batch's inputs, counted from its tokens alone."""
    if packing == "bos_bestfit":
        return [np.array([scanned(row.tolist(), bos) for row in x]) for x, _, _ in batches]
    stream = []
    for x, y, _ in batches:  # concat windows tile the stream: inputs, then the last target
        stream.extend(x.reshape(-1).tolist() + [int(y[-1, -1])])
    counted = scanned(stream, bos)
    W = B * T + 1
    return [np.array(counted[k * W:k * W + B * T]).reshape(B, T) for k in range(len(batches))]


def arithmetic(posdata, x: np.ndarray) -> np.ndarray:
    """`posdata`: a token's position is its value minus its document's BOS index (BOS: 0)."""
    bos_at = np.array(sorted(pos for _, _, _, pos, _ in posdata.layout))
    doc = bos_at[np.searchsorted(bos_at, x, side="right") - 1]
    return np.where(x == posdata.bos, 0, x - doc)


def assert_batches_equal(got: list, want: list, what: str):
    assert len(got) == len(want) > 0
    for k, ((x, y, _), (x2, y2, _)) in enumerate(zip(got, want)):
        assert np.array_equal(x, x2) and np.array_equal(y, y2), f"{what}: batch {k}'s tokens differ"


def assert_positions(got: list, want: list, what: str):
    assert len(got) == len(want) > 0
    for k, ((_, _, p), q) in enumerate(zip(got, want)):
        assert np.array_equal(p, q), f"{what}: batch {k}'s positions differ at {np.argwhere(p != q)[:5].tolist()}"


@pytest.fixture(scope="module")
def plain(posdata, synth):
    """The positions=False batches of each (data, packing), 2 workers."""
    out = {}
    for name, data in (("posdata", posdata), ("synth", synth)):
        for packing in ("concat", "bos_bestfit"):
            with data.loader(B, T, **options(packing)) as loader:
                out[name, packing] = run(loader, N)[0]
    return out


# default: every pair of data, packing and worker count once; the other six with -m slow
@pytest.mark.parametrize("name,packing,workers", cross(
    ["posdata", "synth"], ["concat", "bos_bestfit"], [1, 2, 3],
    default={"posdata-concat-1", "posdata-bos_bestfit-2", "synth-bos_bestfit-1", "synth-concat-2", "posdata-concat-3",
             "synth-bos_bestfit-3"}))
def test_positions_count_each_token_in_its_document(posdata, synth, plain, name, packing, workers):
    data = posdata if name == "posdata" else synth
    with data.loader(B, T, num_workers=workers, **options(packing, positions=True)) as loader:
        got, _ = run(loader, N)
    assert_batches_equal(got, plain[name, packing], "positions=True against positions=False")
    want = stream_positions(got, data.bos, packing)
    assert_positions(got, want, "against the token stream's count")
    if name == "posdata":
        assert_positions(got, [arithmetic(posdata, x) for x, _, _ in got], "against posdata's arithmetic")
    p = np.stack([p for _, _, p in got])
    if packing == "concat":  # not vacuous: documents cross rows and batches here
        assert (p[:, :, 0] > 0).sum() > N // 2 and (p[:, 0, 0] > 0).sum() > N // 4
    else:
        assert (p[:, :, 0] == 0).all() and (p > 0).mean() > 0.5


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_resumed_run_has_the_uninterrupted_runs_positions(posdata, packing):
    with posdata.loader(B, T, num_workers=2, **options(packing, positions=True)) as loader:
        whole, states = run(loader, N)
    with posdata.loader(B, T, num_workers=2, **options(packing)) as loader:
        _, plain_states = run(loader, N)
    assert plain_states == states  # positions change no state
    # concat: states inside a document (skip > 0), the first one a few batches in; best fit: any
    inside = [k for k, s in enumerate(states) if k and (packing == "bos_bestfit" or s["position"][4] > 0)]
    assert len(inside) > N // 2
    for k, workers, given in ((inside[0], 1, states), (inside[len(inside) // 2], 3, plain_states),
                              (inside[-5], 2, states)):
        with posdata.loader(B, T, num_workers=workers, resume_state=given[k],
                            **options(packing, positions=True)) as loader:
            again, _ = run(loader, N - k)
        assert_batches_equal(again, whole[k:], f"resumed at batch {k}")
        assert_positions(again, [p for _, _, p in whole[k:]], f"resumed at batch {k}")
        assert_positions(again, [arithmetic(posdata, x) for x, _, _ in again], f"resumed at {k}, arithmetic")
        if packing == "concat":
            assert again[0][2][0, 0] == given[k]["position"][4] > 0  # the first token counts on from the skip


def test_another_ranks_and_elastic_positions_count_on(posdata):
    """Rank 1 of 2, and a world of 2 resumed by one rank (elastic: its first documents were
    begun by the old ranks, its pieces start inside them): positions by arithmetic."""
    kw = options("concat", positions=True)
    with posdata.loader(B, T, rank=1, world_size=2, **kw) as loader:
        got, states = run(loader, 40)
    assert_positions(got, [arithmetic(posdata, x) for x, _, _ in got], "rank 1 of 2")
    olds = []
    for rank in (0, 1):
        with posdata.loader(B, T, rank=rank, world_size=2, **kw) as loader:
            run(loader, 23)
            olds.append(loader.state_dict())
    assert [s["position"][4] > 0 for s in olds] == [True, True]  # both old ranks stopped inside a document
    with posdata.loader(B, T, rank=0, world_size=1, resume_state=olds[0], **kw) as loader:
        got, _ = run(loader, 60)
    assert_positions(got, [arithmetic(posdata, x) for x, _, _ in got], "elastic 2 -> 1")
    # not vacuous: the new stream enters documents in their middle (an old rank's position with
    # its skip, as the run's start or a piece's), where the token before is another document's
    x = np.concatenate([x.reshape(-1) for x, _, _ in got])
    p = np.concatenate([p.reshape(-1) for _, _, p in got])
    entered = (x[1:] != posdata.bos) & (x[:-1] != posdata.bos) & (x[1:] != x[:-1] + 1)
    assert p[0] > 0 and entered.sum() >= 1 and (p[1:][entered] > 0).all()


def test_best_fits_elastic_resume_has_each_rows_positions(posdata):
    """Best fit from a world of 2 to 3 ranks (the old buffers dealt out): every row from a BOS,
    positions by arithmetic, and the new ranks' batches equal with positions off."""
    kw = options("bos_bestfit")
    olds = []
    for rank in (0, 1):
        with posdata.loader(B, T, rank=rank, world_size=2, **kw) as loader:
            run(loader, 17)
            olds.append(loader.state_dict())
    for rank in range(3):
        with posdata.loader(B, T, rank=rank, world_size=3, resume_state=olds[rank % 2], positions=True, **kw) as loader:
            got, _ = run(loader, 40)
        with posdata.loader(B, T, rank=rank, world_size=3, resume_state=olds[rank % 2], **kw) as loader:
            plain, _ = run(loader, 40)
        assert_batches_equal(got, plain, f"elastic 2 -> 3, rank {rank}")
        assert_positions(got, [arithmetic(posdata, x) for x, _, _ in got], f"elastic 2 -> 3, rank {rank}")
        assert all((p[:, 0] == 0).all() for _, _, p in got)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_token_cache_serves_the_same_positions(posdata, plain, tmp_path, packing):
    """Cold (the workers tokenize and store; the second epoch, read ahead, is served) and warm
    (the cache serves every piece)."""
    for temperature in ("cold", "warm"):
        with posdata.loader(B, T, num_workers=2, cache_dir=str(tmp_path), **options(packing, positions=True)) as loader:
            got, _ = run(loader, N)
            stats = loader.stats()
        assert_batches_equal(got, plain["posdata", packing], f"{temperature} cache")
        assert_positions(got, [arithmetic(posdata, x) for x, _, _ in got], f"{temperature} cache")
        assert stats["cache_hits"] > 0 and (stats["cache_misses"] > 0) == (temperature == "cold")


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_positions_go_on_exactly_through_heals(posdata, plain, packing):
    """Each worker killed once and the coordinator once while the trainer reads: a replaced worker
    writes again what the dead one held, positions too; a restart starts from the last state."""
    # another worker each time: 50 batches after its death worker 0's replacement may still be
    # reading the piece it lost (the ring held them ready), and a death there is a poison pill
    got, killed = [], {10: 0, 60: 1, 100: "coordinator"}  # worker 0, worker 1, the coordinator
    with posdata.loader(B, T, num_workers=2, max_restarts=5, **options(packing, positions=True)) as loader:
        for k in range(N):
            if k in killed:
                d = loader.debug()
                os.kill((d.coordinator if killed[k] == "coordinator" else d.workers[killed[k]]).pid, signal.SIGKILL)
            got.append(tuple(t.numpy().copy() for t in next(loader)))
        heals = loader.stats()["heals"]
    assert heals >= 2
    assert_batches_equal(got, plain["posdata", packing], "through heals")
    assert_positions(got, [arithmetic(posdata, x) for x, _, _ in got], "through heals")


# ---------------------------------------------------------------- a mixture (concat)

MIX = {"web": (160, [40, 3, 17], 30), "code": (80, [9, 1, 25], 55), "math": (60, [12], 15)}


@pytest.fixture(scope="module")
def mixdata(tmp_path_factory, synth_tokenizer):
    root = tmp_path_factory.mktemp("mixpos")
    for i, (name, (n, groups, words)) in enumerate(MIX.items()):
        docs = list(corpus.synthetic_texts(n, seed=40 + i, mean_words=words))
        for j in range(3, n, 29):
            docs[j] = None
        corpus.write_shards(docs, root / name, num_files=3, row_group_size=groups)
    return root


def mix_loader(root, tok, **kw):
    mix = shmloader.Mixture({name: str(root / name) for name in MIX}, {"web": 0.5, "code": 0.3, "math": 0.2})
    kw.setdefault("timeout", 60)
    return shmloader.ShmLoader(mix, tok, B, T, device="cpu", **kw)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_mixtures_positions_count_on_and_resume(mixdata, synth_tokenizer, packing):
    bos = synth_tokenizer.encode_single_token("<|bos|>")
    with mix_loader(mixdata, synth_tokenizer, num_workers=2, **options(packing)) as loader:
        plain, _ = run(loader, N)
    with mix_loader(mixdata, synth_tokenizer, num_workers=3, positions=True, **options(packing)) as loader:
        got, states = run(loader, N)
    assert_batches_equal(got, plain, "a mixture with positions")
    assert_positions(got, stream_positions(got, bos, packing), "a mixture, against the stream's count")
    k = next(k for k, s in enumerate(states) if k > 20 and (s["position"][4] > 0 or packing == "bos_bestfit"))
    with mix_loader(mixdata, synth_tokenizer, num_workers=1, positions=True, resume_state=states[k],
                    **options(packing)) as loader:
        again, _ = run(loader, N - k)
    assert_batches_equal(again, got[k:], f"a mixture resumed at {k}")
    assert_positions(again, [p for _, _, p in got[k:]], f"a mixture resumed at {k}")


# ---------------------------------------------------------------- the drop-ins, cu_seqlens, the slot

def test_the_drop_ins_yield_positions_before_the_state(synth, plain):
    kw = {"data": str(synth.root), "device": "cpu", "num_workers": 2, "positions": True, "timeout": 60}
    gen = shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit(
        synth.tokenizer, B, T, "train", buffer_size=BESTFIT["buffer_size"],
        tokenizer_batch_size=BESTFIT["tokenizer_batch_size"], **kw)
    got, states = [], []
    for x, y, p, state in itertools.islice(gen, 30):
        got.append((x.numpy().copy(), y.numpy().copy(), p.numpy().copy()))
        states.append(state)
    gen.close()
    assert_batches_equal(got, plain["synth", "bos_bestfit"][:30], "best fit drop-in")
    assert_positions(got, stream_positions(got, synth.bos, "bos_bestfit"), "best fit drop-in")
    gen = shmloader.tokenizing_distributed_data_loader_bos_bestfit(
        synth.tokenizer, B, T, "train", resume_state_dict=states[12], buffer_size=BESTFIT["buffer_size"],
        tokenizer_batch_size=BESTFIT["tokenizer_batch_size"], **kw)
    again = [tuple(t.numpy().copy() for t in batch) for batch in itertools.islice(gen, 10)]
    gen.close()
    assert_batches_equal(again, got[12:22], "best fit drop-in resumed")
    assert_positions(again, [p for _, _, p in got[12:22]], "best fit drop-in resumed")
    gen = shmloader.tokenizing_distributed_data_loader(B, T, "train", tokenizer=synth.tokenizer, **kw)
    got = [tuple(t.numpy().copy() for t in batch) for batch in itertools.islice(gen, 30)]
    gen.close()
    assert_batches_equal(got, plain["synth", "concat"][:30], "concat drop-in")
    assert_positions(got, stream_positions(got, synth.bos, "concat"), "concat drop-in")


def by_hand(p: np.ndarray) -> tuple:
    """Sequence lengths of a (B, T) positions batch, row by row: a new one at each 0 and row start."""
    lengths = helpers.sequence_lengths(p)
    return [0] + list(itertools.accumulate(lengths)), max(lengths)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_cu_seqlens_of_real_batches(synth, packing):
    inside = 0  # batches with a document starting inside a row: not only the row starts
    with synth.loader(B, T, **options(packing, positions=True)) as loader:
        for _, _, p in itertools.islice(loader, 120):  # past synth's 1500-word document
            cu, longest = shmloader.cu_seqlens(p)
            want, most = by_hand(p.numpy())
            assert cu.dtype == torch.int32 and cu.device == p.device
            assert cu.tolist() == want and longest == most
            inside += len(want) > B + 1
    assert inside >= 10


def test_a_lent_positions_tensor_keeps_its_slot(posdata):
    """On the CPU positions are a view of the ring's slot, like the tokens: holding only them
    keeps the slot lent, and they stay valid through many later batches."""
    with posdata.loader(B, T, n_slots=4, **options("concat", positions=True)) as loader:
        x, y, p = next(loader)
        ring = loader.debug().ring
        row = ring.rows[0]
        assert p.data_ptr() == row.ctypes.data + ring.layout.window * 8  # lent, not copied: after the window
        kept = p.clone()
        del x, y
        for _ in range(40):
            next(loader)
        assert torch.equal(p, kept)
        del p
        kept = [next(loader) for _ in range(6)]  # past n_slots // 2 held: copies, positions with them
        ring = loader.debug().ring
        assert sum(any(b[2].data_ptr() == r.ctypes.data + ring.layout.window * 8 for r in ring.rows)
                   for b in kept) == 2
        clones = [b[2].clone() for b in kept]
        for _ in range(20):
            next(loader)
        for (x, _, p), q in zip(kept, clones):
            assert torch.equal(p, q) and np.array_equal(p.numpy(), arithmetic(posdata, x.numpy()))


def test_without_positions_the_slot_is_the_window(posdata):
    with posdata.loader(B, T, **options("concat")) as loader:
        batch = next(loader)
        ring = loader.debug().ring
        assert len(batch) == 2 and ring.positions is None and ring.rows is ring.slots
        assert ring.layout.row_words == B * T + 1 and ring.layout.positions == 0


# ---------------------------------------------------------------- randomized (slow)

@pytest.mark.slow
@pytest.mark.deadline(600)
@pytest.mark.parametrize("seed", range(12))
def test_random_shapes_resumes_and_worker_counts(tmp_path, seed):
    """Random token = position data (long documents, nulls, empty ones, row groups of 1-9
    documents), a random shape, packing and worker count; positions against the arithmetic,
    through an epoch, and a resume at a random batch with another worker count and positions
    off in the first run (a state saved without positions)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(150, 400))
    lengths = [None if rng.random() < 0.05 else int(rng.choice([0, 1, 3, rng.integers(1, 300)])) for _ in range(n)]
    helpers.position_shards(tmp_path, lengths, num_files=3, rg=int(rng.integers(1, 10)))
    bos_at, at = [], 0
    for length in lengths:
        if length is not None:
            bos_at.append(at)
            at += length + 1
    bos_at = np.array(bos_at)

    def expected(x):
        return np.where(x == 0, 0, x - bos_at[np.searchsorted(bos_at, x, side="right") - 1])

    packing = ["concat", "bos_bestfit"][seed % 2]
    b, t = int(rng.integers(1, 4)), int(rng.integers(4, 64))
    kw = dict(packing=packing, device="cpu", timeout=60, **(BESTFIT if packing == "bos_bestfit" else {}))
    make = lambda **more: shmloader.ShmLoader(str(tmp_path), helpers.IntTokenizer(), b, t, **kw, **more)  # noqa: E731
    total = min(at // (b * t) + 5, 3000)  # past the first epoch (the train split: 2 of the 3 files)
    with make(num_workers=int(rng.integers(1, 4)), positions=True) as loader:
        got, _ = run(loader, total)
    assert_positions(got, [expected(x) for x, _, _ in got], f"seed {seed}")
    k = int(rng.integers(1, total - 1))
    with make(num_workers=int(rng.integers(1, 4))) as loader:
        _, states = run(loader, k + 1)
    with make(num_workers=int(rng.integers(1, 4)), positions=True, resume_state=states[k]) as loader:
        again, _ = run(loader, total - k)
    assert_batches_equal(again, got[k:], f"seed {seed}, resumed at {k}")
    assert_positions(again, [p for _, _, p in got[k:]], f"seed {seed}, resumed at {k}")
