"""A SentencePiece model through the loader's workers (data/spm.py).

Each document is `[bos_id] + sp.encode(text)`: the loader's batches equal the oracle's
(`oracle.concat_windows`, `oracle.bestfit_rows` run here with the model's own `encode`) in
concat and best fit, with 1 and 3 workers, for the `.model` path and the processor object; a
state resumes exactly with another worker count; `bos=` replaces the model's BOS; a state
saved with another model or BOS is refused naming the tokenizer. The model's bytes (~245 KB)
reach the workers in a file (data/tokenizer.py `spilled`). (`resolve` and `build` in this
process: tests/unit/data/test_spm.py.)
"""
import itertools

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers, oracle

sentencepiece = pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.usefixtures("watchdog")

B, T = 2, 24
N = 8


@pytest.fixture(scope="module")
def sp(sp_model):
    return sentencepiece.SentencePieceProcessor(model_file=str(sp_model))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("sp_shards")
    docs = corpus.synthetic_texts(100, seed=11, mean_words=10)
    docs[3] = None
    docs[1] = "<s> starts this one, </s> ends it <unk> 😀"
    paths = [str(p) for p in corpus.write_shards(docs, root, num_files=3, row_group_size=[12, 5])]
    return root, paths


def _batches(root, tokenizer, n, packing="concat", workers=1, resume=None, **kw):
    with shmloader.ShmLoader(str(root), tokenizer, B, T, "train", packing=packing, num_workers=workers,
                             device="cpu", timeout=60, resume_state=resume, **kw) as loader:
        got = [(x.numpy().copy(), y.numpy().copy()) for x, y in itertools.islice(loader, n)]
        return got, loader.state_dict()


def _concat_expected(paths, encode, bos, n):
    return [w for w, _ in itertools.islice(oracle.concat_windows(paths[:-1], encode, bos, B, T), n)]


@pytest.mark.parametrize("workers", [1, 3])
def test_concat_is_bos_then_the_models_ids(shards, sp_model, sp, workers):
    root, paths = shards
    expected = _concat_expected(paths, sp.encode, sp.bos_id(), N)
    for form in (str(sp_model), sp):
        got, state = _batches(root, form, N, workers=workers)
        assert len(got) == N
        for k, ((x, y), window) in enumerate(zip(got, expected)):
            assert np.array_equal(x.reshape(-1), window[:-1]) and np.array_equal(y.reshape(-1), window[1:]), k
    stream = np.concatenate(expected)
    assert (stream == sp.bos_id()).sum() >= 3, "the compared batches should hold several documents"


@pytest.mark.parametrize("workers", [1, 3])
def test_bestfit_matches_the_oracle(shards, sp_model, sp, workers):
    root, paths = shards
    kw = dict(buffer_size=10, tokenizer_batch_size=4)
    expected = list(itertools.islice(oracle.bestfit_rows(paths[:-1], sp.encode, sp.bos_id(), B, T,
                                                          buffer_size=10, chunk_docs=4), N))
    got, _ = _batches(root, str(sp_model), N, packing="bos_bestfit", workers=workers, **kw)
    assert len(got) == N
    for k, ((x, y), (rows, _)) in enumerate(zip(got, expected)):
        assert np.array_equal(x, rows[:, :-1]) and np.array_equal(y, rows[:, 1:]), k
        assert (x[:, 0] == sp.bos_id()).all(), "every best-fit row starts with BOS"


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_resume_is_exact_with_another_worker_count(shards, sp_model, packing):
    root, _ = shards
    whole, _ = _batches(root, str(sp_model), 2 * N, packing=packing, workers=3)
    _, state = _batches(root, str(sp_model), N, packing=packing, workers=3)
    rest, _ = _batches(root, str(sp_model), N, packing=packing, workers=1, resume=state)
    assert len(rest) == N
    for k, ((x, y), (wx, wy)) in enumerate(zip(rest, whole[N:])):
        assert np.array_equal(x, wx) and np.array_equal(y, wy), f"batch {N + k} after the resume"


def test_bos_given_replaces_the_models(shards, sp_model, sp):
    root, paths = shards
    used = {t for _, text in oracle.documents(paths[:-1], epochs=1) if text for t in sp.encode(text)}
    unused = [i for i in range(3, sp.get_piece_size()) if i not in used]
    assert unused, "the test needs a piece that the documents never use"
    bos = unused[0]
    got, state = _batches(root, str(sp_model), N, workers=3, bos=bos)
    expected = _concat_expected(paths, sp.encode, bos, N)
    assert all(np.array_equal(np.concatenate([x.reshape(-1)[:1], y.reshape(-1)]), w)
               for (x, y), w in zip(got, expected)) and len(got) == N
    assert not any((x == sp.bos_id()).any() for x, _ in got), "the model's BOS is no document start now"
    with pytest.raises(ValueError, match="tokenizer"):  # the state knows its BOS
        _batches(root, str(sp_model), 1, resume=state)


def test_a_state_of_another_model_is_refused(shards, sp_model, tmp_path):
    root, _ = shards
    _, state = _batches(root, str(sp_model), 2)
    other = tmp_path / "other.model"
    other.write_bytes(helpers.train_sp(vocab_size=300))
    with pytest.raises(ValueError, match="tokenizer: the state was saved with another tokenizer"):
        _batches(root, str(other), 1, resume=state)
    assert _batches(root, str(sp_model), 1, resume=state)[0], "its own model resumes"
