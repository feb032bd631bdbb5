"""The README's newcomer example, as a new user runs it: a directory that is one split (`split="all"`)
of `.jsonl.zst` files whose documents are in `content`, given as a `shmloader.Source`, read with a
SentencePiece model. Its batches are the oracle's (`oracle.concat_windows` over the same documents
written as parquet `text`, every file, the model's `[bos_id] + encode`) and a state resumes exactly
with another worker count."""
import itertools
import json

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import formats_data, oracle

B, T = 4, 64


@pytest.fixture(scope="module")
def corpus_dirs(tmp_path_factory):
    docs = corpus.synthetic_texts(1500, seed=11, mean_words=15)
    files = [docs[:150], docs[150:300], docs[300:]]  # the batches reach the last file, which "train" leaves out
    root = tmp_path_factory.mktemp("newcomer")
    formats_data.write_set(str(root / "code"), files, "jsonl.zst", column="content")
    formats_data.write_set(str(root / "as_parquet"), files, "parquet", column="text")
    return root


def _windows(loader, n):
    return [np.concatenate([x.numpy().ravel()[:1], y.numpy().ravel()]) for x, y in itertools.islice(loader, n)]


def test_the_readme_example_reads_every_file_as_the_oracle(corpus_dirs, sp_model):
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_model))
    parquet = sorted(str(p) for p in (corpus_dirs / "as_parquet").glob("*.parquet"))
    n = 60
    want = [w for w, _ in itertools.islice(oracle.concat_windows(parquet, sp.encode, sp.bos_id(), B, T), n)]
    assert len(want) == n
    code = shmloader.Source(str(corpus_dirs / "code"), column="content")
    with shmloader.ShmLoader(code, str(sp_model), B=B, T=T, split="all", num_workers=2, device="cpu") as loader:
        got = _windows(loader, 20)
        state = json.loads(json.dumps(loader.state_dict()))
        got += _windows(loader, n - 20)
    assert all(np.array_equal(g, w) for g, w in zip(got, want)) and len(got) == n
    with shmloader.ShmLoader(code, str(sp_model), B=B, T=T, split="all", num_workers=3, device="cpu",
                             resume_state=state) as again:
        assert all(np.array_equal(g, w) for g, w in zip(_windows(again, n - 20), want[20:]))
