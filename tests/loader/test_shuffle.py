"""shuffle=True, seed= (data/shuffle.py) as a client sees it, over documents whose tokens say
which document they are: every document once per epoch, twice over; few stream neighbours
that were file neighbours; another order each epoch and each seed; the same batches with 1 and
3 workers; exact resume with another worker count in both packings; another rank's state; two
ranks' disjoint shares covering the epoch; the token cache and positions; shuffle off as
before; a state at 2 ranks resumed on 3, of one source and of a Mixture (each source's epoch in
progress read once, then plain 3-rank shuffled epochs); and the refusals of what is not built yet."""
import collections
import itertools
import json
import random
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

import shmloader
from shmloader.data import shuffle
from shmloader.demo import corpus
from tests import helpers, oracle
from tests.helpers import window_of

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 4, 32
FILES, PER_FILE, GROUP = 4, 150, 30  # 3 train files of 150 documents in row groups of 30


@pytest.fixture(scope="module")
def shufdata(tmp_path_factory):
    """Documents of 1-12 tokens (none empty or null) whose tokens are their stream positions in
    the files' order: a token names its document; `first[t]` the document of token t."""
    rng = random.Random(52)
    lengths = [rng.randint(1, 12) for _ in range(FILES * PER_FILE)]
    docs = helpers.position_documents(lengths)
    root = tmp_path_factory.mktemp("shuf")
    paths = corpus.write_shards(docs, root, num_files=FILES, row_group_size=GROUP)
    doc_of = {}
    for i, text in enumerate(docs):
        for t in text.split():
            doc_of[int(t)] = i
    n_train = PER_FILE * (FILES - 1)
    return root, paths, docs, doc_of, n_train


def load(root, **kw):
    kw.setdefault("num_workers", 2)
    return shmloader.ShmLoader(str(root), helpers.IntTokenizer(), B, T, device="cpu", **kw)


def window(loader, x, y) -> np.ndarray:
    """A batch as a window (concat: B*T+1 tokens; best fit: inputs then targets)."""
    if loader.packing == "bos_bestfit":
        return np.concatenate([x.numpy().ravel(), y.numpy().ravel()])
    return window_of(x, y)


def windows(loader, n):
    out = [window(loader, x, y) for x, y in itertools.islice(loader, n)]
    assert len(out) == n
    return out


def documents(stream, doc_of):
    """The documents of a concat stream in order, each checked whole: `[doc index, ...]`."""
    out, run = [], None
    for t in stream.tolist():
        if t == 0:
            run = []
            out.append(run)
        elif run is not None:
            run.append(t)
    seq = []
    for toks in out[:-1]:  # the last may be cut by the end of the batches taken
        doc = doc_of[toks[0]]
        assert all(doc_of[t] == doc for t in toks), "a document's tokens are not together"
        assert toks == list(range(toks[0], toks[0] + len(toks))), "a document's tokens are not in order"
        seq.append(doc)
    return seq


def neighbour_share(seq) -> float:
    pairs = list(zip(seq, seq[1:]))
    return sum(abs(a - b) == 1 for a, b in pairs) / len(pairs)


def spearman(seq) -> float:
    """Rank correlation of stream place against file place of the documents `seq` (a permutation)."""
    return float(np.corrcoef(np.argsort(seq), np.arange(len(seq)))[0, 1])


def test_every_document_once_per_epoch_twice_over_in_a_new_order(shufdata, capsys):
    root, _, docs, doc_of, n = shufdata
    rhos, shares = [], []
    for seed in (3, 4, 5, 6):
        with load(root, shuffle=True, seed=seed) as loader:
            stream = np.concatenate(windows(loader, 75 if seed == 3 else 32))  # an epoch: ~3.7K tokens
        seq = documents(stream, doc_of)
        assert len(seq) > (2 * n if seed == 3 else n)
        one = seq[:n]
        assert sorted(one) == list(range(n))
        if seed == 3:
            two = seq[n:2 * n]
            assert sorted(two) == list(range(n)) and one != two
        shares.append(neighbour_share(one))
        rhos.append(spearman(one))
    with capsys.disabled():
        print(f"\nshuffle, seeds 3-6: {', '.join(f'{s:.1%}' for s in shares)} of neighbouring documents in the "
              f"stream were neighbours in the files; Spearman rho {', '.join(f'{r:+.2f}' for r in rhos)} "
              f"(15 units of 30 documents)")
    assert max(shares) <= 0.10
    assert abs(np.mean(rhos)) < 0.2


def same_by_workers_other_by_seed(make, root, packing) -> dict:
    """40 batches of `make(root, ...)` shuffled with (workers, seed) (1, 3), (3, 3) and (2, 4):
    the same with 1 and 3 workers, others with another seed; the batches by (workers, seed)."""
    got = {}
    for workers, seed in ((1, 3), (3, 3), (2, 4)):
        with make(root, shuffle=True, seed=seed, num_workers=workers, packing=packing) as loader:
            got[workers, seed] = windows(loader, 40)
    assert all(np.array_equal(a, b) for a, b in zip(got[1, 3], got[3, 3]))
    assert not all(np.array_equal(a, b) for a, b in zip(got[1, 3], got[2, 4]))
    return got


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_the_same_batches_with_1_and_3_workers_and_other_batches_with_another_seed(shufdata, packing):
    same_by_workers_other_by_seed(load, shufdata[0], packing)


def with_states(loader, n) -> list:
    """`n` batches of `loader` as `(window, the state after it)`."""
    out = [(window(loader, x, y), loader.state_dict()) for x, y in itertools.islice(loader, n)]
    assert len(out) == n
    return out


def resumes_with_another_worker_count(make, root, n, at, **kw):
    """`n` batches of `make(root, **kw)` with 2 workers; from the state after each batch of `at`,
    3 workers read the rest of them, the same."""
    with make(root, num_workers=2, **kw) as loader:
        got = with_states(loader, n)
    for k in at:
        with make(root, num_workers=3, resume_state=got[k][1], **kw) as loader:
            again = windows(loader, n - k - 1)
        assert all(np.array_equal(a, b) for a, (b, _) in zip(again, got[k + 1:])), f"resume at batch {k}"


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_exact_resume_with_another_worker_count(shufdata, packing):
    # inside epoch 1, and in epoch 2
    resumes_with_another_worker_count(load, shufdata[0], 60, (0, 9, 33), shuffle=True, seed=7, packing=packing)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_another_ranks_state_resumes_this_ranks_place(shufdata, packing):
    root = shufdata[0]
    kw = dict(shuffle=True, seed=2, packing=packing, world_size=2)
    with load(root, rank=0, **kw) as loader:
        windows(loader, 20)
        state = loader.state_dict()
    with load(root, rank=1, **kw) as loader:
        mine = windows(loader, 30)
    with load(root, rank=1, resume_state=state, **kw) as loader:
        again = windows(loader, 10)
    assert all(np.array_equal(a, b) for a, b in zip(again, mine[20:]))


def test_two_ranks_read_disjoint_documents_covering_the_epoch(shufdata):
    root, paths, _, doc_of, n = shufdata
    counts = [[pq.ParquetFile(p).metadata.row_group(g).num_rows for g in range(pq.ParquetFile(p).num_row_groups)]
              for p in paths[:-1]]
    seen = []
    for rank in (0, 1):
        mine = shuffle.share(shuffle.Shuffle(5, shuffle.WINDOW), 1, counts, rank, 2)
        n_mine = sum(w.rows for w in mine)
        with load(root, shuffle=True, seed=5, rank=rank, world_size=2) as loader:
            seq = documents(np.concatenate(windows(loader, 40)), doc_of)
        assert len(seq) > n_mine
        seen.append(seq[:n_mine])
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(n))


def test_shuffle_off_is_the_files_order(shufdata):
    root, paths, *_ = shufdata
    tok = helpers.IntTokenizer()
    want = [w for w, _ in itertools.islice(oracle.concat_windows([str(p) for p in paths[:-1]], tok.encode, 0, B, T), 30)]
    for kw in ({}, {"shuffle": False, "seed": 9}):
        with load(root, **kw) as loader:
            got = windows(loader, 30)
            assert "shuffle" not in loader.state_dict()["config"]
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_the_token_cache_serves_the_shuffled_order(shufdata, tmp_path):
    root = shufdata[0]
    with load(root, shuffle=True, seed=1) as loader:
        want = windows(loader, 70)
    for _ in range(2):  # tokenized and kept, then served from the cache (in file order, any epoch's)
        with load(root, shuffle=True, seed=1, cache_dir=tmp_path) as loader:
            got = windows(loader, 70)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert list(tmp_path.rglob("*.npz")) or list(tmp_path.rglob("*"))


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_positions_count_each_token_in_its_document(shufdata, packing):
    root = shufdata[0]
    with load(root, shuffle=True, seed=1, positions=True, packing=packing) as loader:
        for x, _, pos in itertools.islice(loader, 20):
            x, pos = x.numpy(), pos.numpy()
            assert (pos[x == 0] == 0).all()
            for row_x, row_p in zip(x, pos):  # within a document, tokens (stream places) and positions step by 1
                for i in range(1, len(row_x)):
                    if row_x[i] != 0 and row_x[i - 1] != 0:
                        assert row_x[i] - row_x[i - 1] == 1 and row_p[i] - row_p[i - 1] == 1


def test_a_state_with_another_seed_or_setting_is_refused_naming_both(shufdata):
    root = shufdata[0]
    with load(root, shuffle=True, seed=1) as loader:
        windows(loader, 3)
        state = loader.state_dict()
    with load(root) as loader:
        windows(loader, 3)
        plain = loader.state_dict()
    with pytest.raises(ValueError, match="shuffle 'seed 1 window 256', this loader has shuffle 'seed 2 window 256'"):
        load(root, shuffle=True, seed=2, resume_state=state)
    with pytest.raises(ValueError, match="shuffle 'seed 1 window 256', this loader has shuffle 'off'"):
        load(root, resume_state=state)
    with pytest.raises(ValueError, match="shuffle 'off', this loader has shuffle 'seed 1 window 256'"):
        load(root, shuffle=True, seed=1, resume_state=plain)


def test_what_is_not_built_is_refused(shufdata, tmp_path):
    root = shufdata[0]
    with load(root, shuffle=True, seed=1, world_size=2, rank=0) as loader:
        windows(loader, 3)
        state = loader.state_dict()
    with load(root, shuffle=True, seed=1, resume_state=state) as loader:  # a change of world size: built
        windows(loader, 2)
        changed = loader.state_dict()
    with pytest.raises(ValueError, match="second change of world size of a shuffled run is not built yet"):
        load(root, shuffle=True, seed=1, world_size=2, rank=0, resume_state=changed)
    with pytest.raises(ValueError, match="not built yet"):
        load(root, shuffle=True, resume_state={"pq_idx": 0, "rg_idx": 0, "epoch": 1})
    with pytest.raises(ValueError, match="other_rank='nanochat' is not built yet"):
        load(root, shuffle=True, other_rank="nanochat")


def test_the_drop_ins_pass_the_shuffle_on_and_resume_from_their_states(shufdata):
    from shmloader import nanochat
    root, tok = shufdata[0], helpers.IntTokenizer()
    with load(root, shuffle=True, seed=8, packing="bos_bestfit") as loader:
        want = windows(loader, 12)
    gen = nanochat.tokenizing_distributed_data_loader_with_state_bos_bestfit(
        tok, B, T, "train", device="cpu", data=str(root), num_workers=2, shuffle=True, seed=8)
    got = [(np.concatenate([x.numpy().ravel(), y.numpy().ravel()]), s) for x, y, s in itertools.islice(gen, 6)]
    gen.close()
    assert all(np.array_equal(a, b) for (a, _), b in zip(got, want))
    gen = nanochat.tokenizing_distributed_data_loader_with_state_bos_bestfit(
        tok, B, T, "train", device="cpu", data=str(root), num_workers=1, shuffle=True, seed=8,
        resume_state_dict=got[-1][1])
    again = [np.concatenate([x.numpy().ravel(), y.numpy().ravel()]) for x, y, _ in itertools.islice(gen, 6)]
    gen.close()
    assert all(np.array_equal(a, b) for a, b in zip(again, want[5:]))


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_killing_document_is_skipped_in_every_epoch_and_no_other(tmp_path, packing):
    """on_bad_row_group='skip' over a shuffled run: the document that kills its worker (found in
    epoch 1, in that epoch's order of its row group) is skipped in epochs 2 and 3, where its row
    group's documents are in other orders, and no other document is: the stream is the shuffled
    stream of the files with that document null."""
    lengths = [6] * 1000  # 5 files of 200 (the last is val): an epoch of 800 documents, ~44 batches
    docs = helpers.position_documents(lengths)
    kill = 200 + 20 + 7  # file 1, row group 1, row 7
    docs[kill] = docs[kill] + " kill"
    nulled = list(docs)
    nulled[kill] = None
    for name, rows in (("data", docs), ("ref", nulled)):
        corpus.write_shards(rows, tmp_path / name, num_files=5, row_group_size=20)
    doc_of = {int(t): i for i, text in enumerate(nulled) if text for t in text.split()}
    n, kw = 135, dict(shuffle=True, seed=11, packing=packing)  # 3 epochs
    with load(tmp_path / "ref", **kw) as loader:
        want = windows(loader, n)
    with shmloader.ShmLoader(str(tmp_path / "data"), helpers.KillerTokenizer(), B, T, device="cpu", num_workers=2,
                             max_restarts=10, on_bad_row_group="skip", **kw) as loader:
        got = windows(loader, n)
        stats = loader.stats()
    assert stats["heals"] >= 2 and stats["poison_rows_skipped"] >= 1, stats
    for k, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"batch {k} is not the shuffled stream without the killing document"
    if packing == "concat":  # and that stream holds every other document once in each of 3 epochs
        seq = documents(np.concatenate(got), doc_of)
        assert len(seq) > 3 * 799
        for e in range(3):
            assert sorted(seq[e * 799:(e + 1) * 799]) == [d for d in range(800) if d != kill]


# ---- a shuffled Mixture: each source shuffled on its own, with a seed drawn from the loader's and its name
MIX_PER_FILE, MIX_GROUP, B_OFFSET = 60, 10, 20000  # per source: 3 train files of 60 documents in row groups of 10


@pytest.fixture(scope="module")
def mixshuf(tmp_path_factory):
    """Two sources of the same shape, "a" and "b", whose tokens name their source and document
    (b's from 20000 on): `of[t] = (source, document)`; `n`: each source's train documents."""
    rng = random.Random(53)
    lengths = [rng.randint(1, 12) for _ in range(FILES * MIX_PER_FILE)]
    root, of = tmp_path_factory.mktemp("mixshuf"), {}
    for name, start in (("a", 1), ("b", B_OFFSET)):
        docs = helpers.position_documents(lengths, start=start)
        corpus.write_shards(docs, root / name, num_files=FILES, row_group_size=MIX_GROUP)
        for i, text in enumerate(docs):
            for t in text.split():
                of[int(t)] = (name, i)
    return root, of, MIX_PER_FILE * (FILES - 1)


def load_mix(root, weights=None, **kw):
    kw.setdefault("num_workers", 2)
    mix = shmloader.Mixture({"a": str(root / "a"), "b": str(root / "b")}, weights or {"a": 0.5, "b": 0.5})
    return shmloader.ShmLoader(mix, helpers.IntTokenizer(), B, T, device="cpu", **kw)


def source_documents(stream, of) -> dict:
    """Each source's documents in a concat stream, in order, each checked whole."""
    out, run = {"a": [], "b": []}, None
    runs = []
    for t in stream.tolist():
        if t == 0:
            run = []
            runs.append(run)
        elif run is not None:
            run.append(t)
    for toks in runs[:-1]:
        if not toks:
            continue
        name, doc = of[toks[0]]
        assert all(of[t] == (name, doc) for t in toks), "a document's tokens are not together"
        assert toks == list(range(toks[0], toks[0] + len(toks))), "a document's tokens are not in order"
        out[name].append(doc)
    return out


def test_a_mixture_shuffles_every_source_on_its_own_every_document_once_per_source_epoch(mixshuf):
    root, of, n = mixshuf
    with load_mix(root, shuffle=True, seed=3) as loader:
        seqs = source_documents(np.concatenate(windows(loader, 60)), of)  # ~2.5 epochs of each source
    for name, seq in seqs.items():
        assert len(seq) > 2 * n, (name, len(seq))
        one, two = seq[:n], seq[n:2 * n]
        assert sorted(one) == list(range(n)) and sorted(two) == list(range(n)), name
        assert one != two, f"source {name}: epoch 2 in epoch 1's order"
        assert one != list(range(n)) and neighbour_share(one) <= 0.2, name
    # the two sources are alike and read with one loader seed: each has its own order
    assert seqs["a"][:n] != seqs["b"][:n]


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_shuffled_mixture_the_same_with_1_and_3_workers_and_another_with_another_seed(mixshuf, packing):
    root = mixshuf[0]
    got = same_by_workers_other_by_seed(load_mix, root, packing)
    with load_mix(root, num_workers=2, packing=packing) as loader:
        plain = windows(loader, 40)
    assert not all(np.array_equal(a, b) for a, b in zip(got[1, 3], plain))


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_shuffled_mixture_resumes_exactly_with_another_worker_count(mixshuf, packing):
    # inside the sources' first epochs, and in their second
    resumes_with_another_worker_count(load_mix, mixshuf[0], 50, (0, 9, 30), shuffle=True, seed=7, packing=packing)


def test_a_shuffled_mixture_resumes_another_ranks_state_and_refuses_another_seed(mixshuf):
    root = mixshuf[0]
    kw = dict(shuffle=True, seed=2, world_size=2)
    with load_mix(root, rank=0, **kw) as loader:
        windows(loader, 12)
        state = loader.state_dict()
    with load_mix(root, rank=1, **kw) as loader:
        mine = windows(loader, 20)
    with load_mix(root, rank=1, resume_state=state, **kw) as loader:
        again = windows(loader, 8)
    assert all(np.array_equal(a, b) for a, b in zip(again, mine[12:]))
    with pytest.raises(ValueError, match="shuffle 'seed 2 window 256', this loader has shuffle 'seed 5 window 256'"):
        load_mix(root, rank=0, world_size=2, shuffle=True, seed=5, resume_state=state)
    with pytest.raises(ValueError, match="shuffle 'seed 2 window 256', this loader has shuffle 'off'"):
        load_mix(root, rank=0, world_size=2, resume_state=state)
    with load_mix(root, rank=0, world_size=3, shuffle=True, seed=2, resume_state=state) as loader:
        assert len(windows(loader, 2)) == 2  # another world size: built (the tests below check what it reads)


# ---- another world size: a state saved at 2 ranks resumed on 3
def _plan_tokens(state, counts, lengths, seed, rank, world, k) -> int:
    """The tokens (BOS included) of new rank `rank` of `world`'s units of the plan in `state`
    (data/elastic.py over the shuffled order): what it reads before its plain epochs."""
    from shmloader.data import elastic
    plan = elastic.Plan.from_state(state["elastic"])
    order, total = shuffle.Shuffle(seed, k), 0
    for u in elastic.rank_units(plan, rank, world, counts.__getitem__, len(counts), order):
        which, rows = shuffle.locate(u.members, order.rows(u.epoch, u.file, u.rg, u.rows)[u.doc:])
        firsts = [m.file * PER_FILE + m.unit * GROUP for m in u.members]
        total += sum(lengths[firsts[w] + r] + 1 for w, r in zip(which.tolist(), rows.tolist())) - u.skip
    return total


def _counts(paths):
    return [[pq.ParquetFile(p).metadata.row_group(g).num_rows for g in range(pq.ParquetFile(p).num_row_groups)]
            for p in paths[:-1]]


@pytest.mark.parametrize("window", [60, shuffle.WINDOW])
def test_a_state_at_2_ranks_resumes_on_3_every_token_of_the_epoch_once_concat(shufdata, window):
    """With windows of 256 documents (the default) each old rank of this corpus of 15 row
    groups of 30 has one window, which goes on whole with one new rank: rank 2 has nothing of
    epoch 1 left and begins epoch 2; with 60 (2 row groups), the rest of epoch 1 is dealt row
    group by row group to all three."""
    root, paths, docs, doc_of, n = shufdata
    counts, lengths = _counts(paths), [len(d.split()) for d in docs]
    seed, k, kw = 6, 9, dict(shuffle=True, packing="concat", shuffle_window=window)
    old, states = [], []
    for rank in (0, 1):
        with load(root, seed=seed, rank=rank, world_size=2, **kw) as loader:
            ws = windows(loader, k)
            states.append(loader.state_dict())
        old += ws  # a concat batch takes B*T+1 tokens of the stream
    consumed = np.concatenate(old)
    new = []
    for rank in range(3):
        with load(root, seed=seed, rank=rank, world_size=3, num_workers=1 + rank, resume_state=states[0], **kw) as ld:
            first = ld.state_dict()
            stream = np.concatenate(windows(ld, 25))
        L = _plan_tokens(first, counts, lengths, seed, rank, 3, window)
        assert (0 < L if window == 60 else 0 <= L) and L <= len(stream), (rank, L, len(stream))
        new.append(stream[:L])
    got = np.concatenate([consumed] + new)
    want = sorted(int(t) for d in docs[:n] for t in d.split())
    assert sorted(int(t) for t in got if t != 0) == want  # every token of epoch 1 once: none consumed read again
    assert np.count_nonzero(got == 0) in (n, n - 1)  # every document's BOS once (one may be cut by the change)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_state_at_2_ranks_on_3_reads_nothing_consumed_again_and_resumes_exactly(shufdata, packing):
    root, _, _, doc_of, _ = shufdata
    kw, k = dict(shuffle=True, seed=4, packing=packing, shuffle_window=60), 4  # every new rank some of epoch 1
    if packing == "bos_bestfit":  # a buffer of a few row groups, not of several epochs of this small corpus
        kw.update(buffer_size=24, tokenizer_batch_size=8)
    consumed, states = set(), []
    for rank in (0, 1):
        with load(root, rank=rank, world_size=2, **kw) as loader:
            consumed |= {doc_of[int(t)] for w in windows(loader, k) for t in w if t}
            states.append(loader.state_dict())
    for rank in range(3):
        with load(root, rank=rank, world_size=3, num_workers=1, resume_state=states[1], **kw) as loader:
            ws, mine = [], []
            for x, y in itertools.islice(loader, 12):
                ws.append(window(loader, x, y))
                mine.append(loader.state_dict())
        assert mine[1]["elastic"] is not None  # a run that began at the change
        assert packing != "concat" or mine[1]["position"][0] == 1  # inside the elastic epoch (best fit reads ahead)
        # the first batches read the rest of epoch 1 only: no document the old ranks had consumed
        cut = {doc_of[int(t)] for t in ws[0][:1] if t}  # concat: the old rank's cut document goes on
        assert not ({doc_of[int(t)] for t in ws[0] if t} - cut) & consumed, f"new rank {rank}"
        for at in (1, 7):  # inside the elastic epoch, and in the plain epoch after it
            with load(root, rank=rank, world_size=3, num_workers=3, resume_state=mine[at], **kw) as loader:
                again = windows(loader, 11 - at)
            assert all(np.array_equal(a, b) for a, b in zip(again, ws[at + 1:])), f"new rank {rank}: resume at {at}"


# ---- a shuffled Mixture at another world size: a state saved at 2 ranks resumed on 3 (concat)
def source_runs(stream, of) -> dict:
    """Each source's runs of one document's consecutive tokens in a stream, in order: `{name:
    [(document, tokens), ...]}` (a document an old rank had cut goes on, without its BOS, as a run
    of its own on a new rank)."""
    out, last = {"a": [], "b": []}, None
    for t in stream.tolist():
        if t == 0:
            last = None
            continue
        name, doc = of[t]
        if last is None or of[last] != (name, doc) or t != last + 1:
            out[name].append((doc, []))
        out[name][-1][1].append(t)
        last = t
    return out


def plain_share(counts, lengths, seed, name, epoch, rank, world, k, alone=False) -> tuple[list, list]:
    """Source `name`'s documents of a plain `world`-rank shuffled epoch `epoch`, rank `rank`'s
    share, in order (its windows of `k` units of every world-th unit of the epoch's order, each
    window's documents in theirs: data/shuffle.py), and their tokens with BOS; `alone`: the only
    source of its mixture, shuffled with the loader's `seed` as it is (data/mixrules.py)."""
    order, docs = shuffle.Shuffle(seed if alone else shuffle.source_seed(seed, name), k), []
    for w in shuffle.share(order, epoch, counts, rank, world):
        which, rows = shuffle.locate(w.members, order.rows(epoch, *w.head, w.rows))
        docs += [w.members[m].file * MIX_PER_FILE + w.members[m].unit * MIX_GROUP + r
                 for m, r in zip(which.tolist(), rows.tolist())]
    return docs, [lengths[d] + 1 for d in docs]


def another_world_size(root, names, seed, k, saver, epochs, window):
    """2 old ranks read `k` batches each (inside epoch 1 of every source); old rank `saver`'s
    state is resumed on 3 ranks over the shuffled Mixture of `names` (each read for `epochs`
    epochs), every new rank to the mixture's end: `(the old ranks' tokens, each new rank's
    windows, each new rank's state after each of them, the mixture, the loaders' options)`."""
    mix = lambda: shmloader.Mixture({n: str(root / n) for n in names}, {n: 1 for n in names},  # noqa: E731
                                    max_epochs={n: epochs for n in names})
    kw = dict(shuffle=True, seed=seed, packing="concat", device="cpu", timeout=60, shuffle_window=window)
    old, states = [], []
    for rank in (0, 1):
        with shmloader.ShmLoader(mix(), helpers.IntTokenizer(), B, T, rank=rank, world_size=2, num_workers=2,
                                 **kw) as loader:
            old += windows(loader, k)
            states.append(loader.state_dict())
        assert {p[0] for p in json.loads(states[-1]["mixture"]["point"])["sources"].values()} == {1}
    streams, mine = [], []
    for rank in range(3):
        with shmloader.ShmLoader(mix(), helpers.IntTokenizer(), B, T, rank=rank, world_size=3, num_workers=1 + rank % 2,
                                 resume_state=states[saver], **kw) as loader:
            ws, ss = [], []
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the sources' ends are said (test_mixture.py checks the words)
                try:
                    for x, y in loader:
                        ws.append(window_of(x, y))
                        ss.append(loader.state_dict())
                except shmloader.DataError as e:
                    assert "nothing is left to read" in str(e), e
        assert len(ws) > 4, (rank, len(ws))
        streams.append(ws)
        mine.append(ss)
    return np.concatenate(old), streams, mine, mix, kw


def check_another_world_size(root, of, names, seed, k, saver, epochs, window=20):
    """Every token of every source's epoch 1 read exactly once over the old ranks' batches and the
    new ranks' first ones (none consumed read again, none left out); then each new rank reads its
    share of plain 3-rank shuffled epochs 2, 3, ... of every source, to the batch that cannot be
    filled; a new rank's state, inside its part of epoch 1 and in a later epoch, resumes exactly;
    a second change of world size is refused."""
    consumed, streams, mine, mix, kw = another_world_size(root, names, seed, k, saver, epochs, window)
    W = B * T + 1
    counts = _counts(sorted(str(p) for p in (root / "a").glob("*.parquet")))  # every source's shape
    lengths = {}
    for t, (name, doc) in of.items():
        lengths.setdefault(name, collections.Counter())[doc] += 1
    first = {name: [int(t) for t in consumed if t and of[int(t)][0] == name] for name in names}  # epoch 1's reads
    for rank, ws in enumerate(streams):
        runs, unread = source_runs(np.concatenate(ws), of), 0
        for name in names:
            share, tokens = [], []  # its plain epochs' documents, in order
            for epoch in range(2, epochs + 1):
                docs, sizes = plain_share(counts, lengths[name], seed, name, epoch, rank, 3, window, len(names) == 1)
                share, tokens = share + docs, tokens + sizes
            got = [doc for doc, _ in runs[name]]
            n = next(n for n in range(min(len(got), len(share)), 0, -1) if got[-n:] == share[:n])
            assert len(got) - n > 0, f"new rank {rank}: no document of {name!r}'s epoch 1"
            first[name] += [t for _, toks in runs[name][:len(got) - n] for t in toks]
            unread += sum(tokens[n:])
        assert unread < W, (rank, unread)  # the later epochs' shares read to the batch that cannot be filled
    for name in names:
        every = sorted(t for t, (s, doc) in of.items() if s == name and doc < MIX_PER_FILE * (FILES - 1))
        assert sorted(first[name]) == every, f"source {name!r}: epoch 1 not read exactly once"
    for rank, at in ((0, 1), (1, 1), (2, len(mine[2]) - 3)):
        with shmloader.ShmLoader(mix(), helpers.IntTokenizer(), B, T, rank=rank, world_size=3, num_workers=2,
                                 resume_state=mine[rank][at], **kw) as loader, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a source's end
            again = windows(loader, 2)
        assert len(again) == 2 and all(np.array_equal(a, b) for a, b in zip(again, streams[rank][at + 1:])), (rank, at)
    with pytest.raises(ValueError, match="mixture changed at batch"):  # a second change of world size
        shmloader.ShmLoader(mix(), helpers.IntTokenizer(), B, T, rank=0, world_size=2, num_workers=1,
                            resume_state=mine[0][1], **kw)


def test_a_shuffled_one_source_mixture_at_2_ranks_resumes_on_3_reading_no_document_twice(mixshuf):
    root, of, _ = mixshuf
    check_another_world_size(root, of, ("a",), seed=5, k=4, saver=0, epochs=3)


def test_a_shuffled_mixture_at_2_ranks_resumes_on_3_each_source_every_document_once(mixshuf):
    root, of, _ = mixshuf
    check_another_world_size(root, of, ("a", "b"), seed=9, k=6, saver=1, epochs=2)


# ---- the window: small row groups, and the default window at another world size
def test_with_row_groups_of_10_the_window_keeps_few_file_neighbours(mixshuf, capsys):
    """Source "a" alone: 18 row groups of 10 documents. Shuffled within its row group alone
    (`shuffle_window=1`) about 2/10 of a document's stream neighbours are its file neighbours;
    the default window (256 documents: here the whole epoch's 18 row groups) takes them under
    10%, every document still once an epoch and the first batch drawing from several files."""
    root, of, n = mixshuf
    shares, files = {}, {}
    for window in (1, None):
        shares[window], files[window] = [], []
        for seed in (1, 2, 3):
            with load(root / "a", shuffle=True, seed=seed, shuffle_window=window) as loader:
                stream = np.concatenate(windows(loader, 40))
            seq = source_documents(stream, of)["a"]
            assert sorted(seq[:n]) == list(range(n)) and sorted(seq[n:2 * n]) == list(range(n))
            shares[window].append(neighbour_share(seq[:n]))
            files[window].append(len({d // MIX_PER_FILE for d in seq[:12]}))
    with capsys.disabled():
        print(f"\nrow groups of 10: window 1 {np.mean(shares[1]):.1%}, window 8 {np.mean(shares[None]):.1%} of "
              f"neighbouring documents were file neighbours; first 12 documents from {np.mean(files[1]):.1f} and "
              f"{np.mean(files[None]):.1f} files")
    assert max(shares[None]) <= 0.10 < np.mean(shares[1])
    assert min(files[None]) >= 2


@pytest.mark.parametrize("shuffled,k", [(True, 3), (False, 5)])
def test_a_one_source_mixture_at_2_ranks_read_to_its_end_on_3_reads_every_document_once(mixshuf, shuffled, k):
    """The default window, `Mixture(..., max_epochs=1)`: the old ranks' batches and every new
    rank's to the mixture's end hold every token of the epoch once (none twice, none left out).
    A new rank given none of the epoch (shuffled: the old ranks' windows in progress went to the
    others; unshuffled: the old ranks near the epoch's end) ends at once, as the others."""
    root, of, n = mixshuf
    mix = lambda: shmloader.Mixture({"a": str(root / "a")}, {"a": 1}, max_epochs={"a": 1})  # noqa: E731
    kw = dict(shuffle=shuffled, seed=7, device="cpu", timeout=60)
    got, states = [], []  # each batch's inputs: a rank's are its stream, one after another
    for rank in (0, 1):
        with shmloader.ShmLoader(mix(), helpers.IntTokenizer(), B, T, rank=rank, world_size=2, num_workers=2,
                                 **kw) as loader:
            got += [x.numpy().ravel() for x, _ in itertools.islice(loader, k)]
            states.append(loader.state_dict())
    for rank in range(3):
        with shmloader.ShmLoader(mix(), helpers.IntTokenizer(), B, T, rank=rank, world_size=3, num_workers=1,
                                 resume_state=states[1], **kw) as loader, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the source's end is said
            try:
                for x, _ in loader:
                    got.append(x.numpy().ravel())
            except shmloader.DataError as e:
                assert "nothing is left to read" in str(e), e
    tokens = [int(t) for w in got for t in w if t]
    want = {t for t, (s, doc) in of.items() if s == "a" and doc < n}
    assert len(tokens) == len(set(tokens)) and set(tokens) <= want  # none read twice
    # none left out but the ends: each rank's last batch that cannot be filled (and a target token)
    assert len(want - set(tokens)) <= 5 * (B * T + 1)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_bad_row_group_of_a_window_is_skipped_and_the_rest_of_its_window_read(tmp_path, packing):
    """Row group 1 of the first file is corrupt; with `on_bad_row_group="skip"` its documents
    are left out of its window (every epoch, with a warning naming it), the window's other row
    groups read, the same batches with 1 and 2 workers, and a state resumes exactly."""
    rng = random.Random(54)
    docs = helpers.position_documents([rng.randint(1, 12) for _ in range(4 * 60)])
    doc_of = {int(t): i for i, d in enumerate(docs) for t in d.split()}
    for f in range(4):
        helpers.write_snappy(tmp_path / f"shard_{f:05d}.parquet", docs[f * 60:(f + 1) * 60], 10)
    helpers.corrupt_row_group(tmp_path / "shard_00000.parquet", 1)
    kw = dict(shuffle=True, seed=3, packing=packing, on_bad_row_group="skip")
    if packing == "bos_bestfit":  # a buffer of a few documents, not of several epochs of this small corpus
        kw.update(buffer_size=8, tokenizer_batch_size=4)
    got = {}
    for workers in (1, 2):
        with pytest.warns(UserWarning, match="shard_00000.parquet.*row group 1"):
            with load(tmp_path, num_workers=workers, **kw) as loader:
                got[workers] = with_states(loader, 40)
                assert loader.stats()["bad_row_groups_skipped"] == 1
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(got[1], got[2]))
    seen, want = {doc_of[int(t)] for w, _ in got[1] for t in w if t}, set(range(180)) - set(range(10, 20))
    assert seen <= want  # the train files' documents but the bad row group's,
    assert len(want - seen) <= (0 if packing == "concat" else 8)  # all (best fit: but its buffer's)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with load(tmp_path, num_workers=2, resume_state=got[1][9][1], **kw) as loader:
            again = windows(loader, 10)
    assert all(np.array_equal(a, b) for a, (b, _) in zip(again, got[1][10:]))


# ---- a source's own order: Source(shuffle=)
def test_a_mixtures_source_says_its_own_order(mixshuf):
    """Source "a" says `shuffle=True` beside "b" in its files' order (the loader's default),
    and the other way round: the source that says it is shuffled (every document once an
    epoch, not in file order), the other reads 0, 1, 2, ...; the same batches with 1 and 3
    workers; a state resumes exactly, and one whose source said otherwise is refused."""
    root, of, n = mixshuf
    Source = shmloader.Source

    def mix(a=None, b=None):
        return shmloader.Mixture({"a": Source(str(root / "a"), shuffle=a), "b": Source(str(root / "b"), shuffle=b)},
                                 {"a": 0.5, "b": 0.5})

    for loader_shuffle, a, b, shuffled in ((False, True, None, "a"), (True, None, False, "a"), (False, None, True, "b")):
        got = {}
        for workers in (1, 3):
            with shmloader.ShmLoader(mix(a, b), helpers.IntTokenizer(), B, T, device="cpu", num_workers=workers,
                                     shuffle=loader_shuffle, seed=4) as loader:
                got[workers] = with_states(loader, 30)
        assert all(np.array_equal(x, y) for (x, _), (y, _) in zip(got[1], got[3]))
        docs = source_documents(np.concatenate([w for w, _ in got[1]]), of)
        plain = "b" if shuffled == "a" else "a"
        assert docs[plain][:60] == list(range(60))  # the files' order
        one = docs[shuffled][:n]
        assert len(one) == n and sorted(one) == list(range(n)) and one != sorted(one)
        with shmloader.ShmLoader(mix(a, b), helpers.IntTokenizer(), B, T, device="cpu", num_workers=2,
                                 shuffle=loader_shuffle, seed=4, resume_state=got[1][9][1]) as loader:
            again = windows(loader, 10)
        assert all(np.array_equal(x, y) for x, (y, _) in zip(again, got[1][10:]))
    state = got[1][9][1]  # b said shuffle=True, the loader's default off
    with pytest.raises(ValueError, match="mixture source 'b': resume state has shuffle 'on', this loader has "
                                         "\"the loader's\""):
        shmloader.ShmLoader(mix(), helpers.IntTokenizer(), B, T, device="cpu", shuffle=True, seed=4,
                            resume_state=state)
    with pytest.raises(ValueError, match="seed 4 window 256', this loader has shuffle 'seed 5 window 256'"):
        shmloader.ShmLoader(mix(None, True), helpers.IntTokenizer(), B, T, device="cpu", seed=5, resume_state=state)


def test_one_source_saying_shuffle_is_the_loaders_shuffle(shufdata):
    root = shufdata[0]
    with load(root, shuffle=True, seed=2) as loader:
        want = windows(loader, 12)
    with shmloader.ShmLoader(shmloader.Source(str(root), shuffle=True), helpers.IntTokenizer(), B, T, device="cpu",
                             num_workers=2, seed=2) as loader:
        got = windows(loader, 12)
        assert loader.state_dict()["config"]["shuffle"] == "seed 2 window 256"
    assert all(np.array_equal(x, y) for x, y in zip(got, want))
    with pytest.raises(ValueError, match="Source: shuffle must be True, False or None"):
        shmloader.Source(str(root), shuffle="yes")


def test_a_rank_whose_shuffled_shares_hold_no_document_for_epochs_reads_on(tmp_path):
    """6 row groups, one of 10 documents, the others empty or null: rank 0 of 2's shuffled
    shares of epochs 1-3 hold no document (seed 3), and it reads on to the epoch whose share
    does; a corpus of nulls alone is still a DataError (when the loader is made, its footers
    saying so: data/units.py)."""
    import pyarrow as pa

    def write(path, groups):
        writer = pq.ParquetWriter(path, pa.schema([("text", pa.string())]))
        for rows in groups:
            writer.write_table(pa.table({"text": pa.array(rows, pa.string())}))
        writer.close()
    docs = helpers.position_documents([3] * 10)
    write(tmp_path / "a.parquet", [docs, [], []])
    write(tmp_path / "b.parquet", [[None], [], []])
    write(tmp_path / "c.parquet", [["val"]])  # the val split's file
    counts = [[10, 0, 0], [1, 0, 0]]
    order = shuffle.Shuffle(3, 1)
    assert [sum(w.rows for w in order.shares(e, counts, 2)[0]) for e in (1, 2, 3)] == [1, 0, 1]  # no document
    with load(tmp_path, shuffle=True, seed=3, shuffle_window=1, world_size=2, rank=0, num_workers=1) as loader:
        got = windows(loader, 2)
    assert {int(t) for w in got for t in w if t} <= {int(t) for d in docs for t in d.split()}
    nulls = tmp_path / "nulls"
    nulls.mkdir()
    for name in ("a", "b", "c"):
        write(nulls / f"{name}.parquet", [[None, None], []])
    with pytest.raises(shmloader.DataError, match="every row group of the 2 files, read shuffled.* held no document"):
        load(nulls, shuffle=True, seed=3, num_workers=1, timeout=60)  # made: no next() (the review: it was inside)


def test_a_token_id_column_is_read_shuffled_in_windows_of_many_row_groups(tmp_path):
    """Documents stored as token ids (a list column) in row groups of 10: each shuffled window
    of 256 documents holds 26 row groups, read through a worker's kept units as `Ids`; every
    document once an epoch, twice over, in another order, and the same with 1 and 2 workers."""
    import pyarrow as pa

    rng = random.Random(55)
    docs = helpers.position_documents([rng.randint(1, 9) for _ in range(4 * 100)])
    ids = [[int(t) for t in d.split()] for d in docs]
    for f in range(4):
        part = slice(f * 100, (f + 1) * 100)
        pq.write_table(pa.table({"ids": pa.array(ids[part], pa.list_(pa.int32()))}), tmp_path / f"s{f}.parquet",
                       row_group_size=10)
    doc_of = {t: i for i, d in enumerate(ids) for t in d}
    got = {}
    for workers in (1, 2):
        with load(tmp_path, column="ids", shuffle=True, seed=5, num_workers=workers) as loader:
            got[workers] = windows(loader, 45)
    assert all(np.array_equal(a, b) for a, b in zip(got[1], got[2]))
    seq = documents(np.concatenate(got[1]), doc_of)
    one, two = seq[:300], seq[300:600]
    assert sorted(one) == sorted(two) == list(range(300)) and one != two and neighbour_share(one) < 0.05
