"""The third engine (gigatoken, data/giga.py) in the loader's workers: with a GPT-2-pattern
tokenizer trained offline, `engine="auto"` picks it, and the stream, concat and best fit, is
byte for byte the one `engine="tiktoken"` makes and the oracle's, the engine taking over at a
worker's first document (`SHMLOADER_ENGINE_AT=0`, workers started with spawn to get it).
The documents include special-token text, empty ones, nulls and the texts engines get wrong
first. (The engine in this process: tests/unit/data/test_giga.py.)"""
import itertools

import numpy as np
import pytest

import shmloader
from shmloader.data import engine as enginemod
from shmloader.data import giga
from shmloader.demo import corpus
from tests import oracle
from tests.helpers import hard_texts, small_texts

pytestmark = pytest.mark.usefixtures("watchdog")
B, T, N = 2, 32, 300


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("giga")
    docs = list(corpus.synthetic_texts(400, seed=8, mean_words=12))
    for k, i in enumerate(range(3, 390, 13)):
        docs[i] = hard_texts()[k]
    for i in range(5, len(docs), 31):
        docs[i] = None
    paths = [str(p) for p in corpus.write_shards(docs, root, num_files=3, row_group_size=[50, 3, 120])]
    enc = corpus.train_tokenizer(small_texts(), 1024, pattern=giga._R50K)
    return root, paths, enc


def stream(root, enc, packing, **kw):
    extra = dict(buffer_size=12, tokenizer_batch_size=4) if packing == "bos_bestfit" else {}
    with shmloader.ShmLoader(str(root), enc, B, T, "train", packing=packing, device="cpu", num_workers=2,
                             timeout=60, **extra, **kw) as loader:
        got = [np.concatenate([x.numpy().reshape(-1), y.numpy().reshape(-1)]) for x, y in itertools.islice(loader, N)]
        # the engine of each worker that tokenized (one slow to start may have had no piece: Ready)
        return got, [w["engine"] for w in loader.stats()["workers"] if w["tokens"]]


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_the_stream_with_gigatoken_is_tiktokens(data, packing, monkeypatch):
    root, paths, enc = data
    monkeypatch.setenv(enginemod.AT_ENV, "0")
    assert enginemod.build(shmloader.data.tokenizer.resolve(enc), "auto").name == "gigatoken"
    fast, engines = stream(root, enc, packing, engine="auto", start_method="spawn")
    assert engines and set(engines) == {"gigatoken"}, engines  # each worker's engine, as stats() names it
    ref, engines = stream(root, enc, packing, engine="tiktoken")
    assert engines and set(engines) == {"tiktoken"}, engines
    assert len(fast) == len(ref) == N
    for k, (a, b) in enumerate(zip(fast, ref)):
        assert a.tobytes() == b.tobytes(), f"batch {k}"
    bos = enc.encode_single_token("<|bos|>")
    if packing == "concat":
        want = [w for w, _ in itertools.islice(oracle.concat_windows(paths[:-1], enc.encode_ordinary, bos, B, T), N)]
        for k, (got, w) in enumerate(zip(fast, want)):
            assert np.array_equal(np.concatenate([got[:1], got[B * T:]]), w), f"batch {k}"


def test_a_loader_asking_for_it_where_it_cannot_says_so_at_once(data, synth_tokenizer):
    """engine="gigatoken" with nanochat's pattern: a ValueError when the loader is built, not in a worker."""
    root, _, _ = data
    with pytest.raises(ValueError, match='engine="gigatoken" cannot encode this tokenizer exactly'):
        shmloader.ShmLoader(str(root), synth_tokenizer, B, T, engine="gigatoken", device="cpu")
