"""data/giga.py, the third engine (gigatoken), in this process: which tokenizers it takes, that
its ids equal tiktoken's `encode_ordinary` on three shapes of text, that a pattern it would get
wrong is refused by the probe, and how `engine=` picks it. (Through the loader's workers:
tests/loader/test_giga.py.)"""
import numpy as np
import pytest

from shmloader.data import engine as enginemod
from shmloader.data import giga
from shmloader.data import tokenizer as tokmod
from shmloader.demo import corpus
from tests.helpers import hard_texts, small_texts

GPT2, CL100K = giga._R50K, giga._CL100K


@pytest.fixture(scope="module")
def tokenizers():
    """A GPT-2-pattern, a cl100k-pattern and a nanochat-pattern BPE, trained offline, with nanochat's specials."""
    texts = small_texts()
    return {name: corpus.train_tokenizer(texts, 1024, pattern=pattern)
            for name, pattern in (("gpt2", GPT2), ("cl100k", CL100K), ("nanochat", corpus.SPLIT_PATTERN))}


def spec(enc):
    return tokmod.resolve(enc)


def shapes() -> dict:
    """Three shapes of text: stdlib documents, synthetic prose, and the skewed corpus's (empty to
    ~100K characters: code, long pages, one-liners), and the texts engines get wrong first."""
    skewed = [t for t in corpus.skewed_corpus(120, seed=5)[0] if t is not None]
    return {"stdlib": corpus.split_documents(corpus.stdlib_texts(60), 4000),
            "synthetic": [t for t in corpus.synthetic_texts(300, seed=4) if t is not None],
            "skewed": skewed, "hard": hard_texts()}


def test_the_schemes_are_the_patterns_it_implements(tokenizers):
    assert giga.scheme(spec(tokenizers["gpt2"])) == "gpt2"
    assert giga.scheme(spec(tokenizers["cl100k"])) == "cl100k"
    assert giga.scheme(spec(tokenizers["nanochat"])) is None  # \p{N}{1,2}: not cl100k's


@pytest.mark.parametrize("name", ["gpt2", "cl100k"])
def test_its_ids_equal_tiktokens_on_three_shapes_of_text(tokenizers, name):
    enc = tokenizers[name]
    built = giga.build(spec(enc), enc.encode_ordinary)
    assert isinstance(built, giga.Built) and built.scheme == name, built
    for shape, texts in shapes().items():
        ids, offsets = built.batch(texts)
        assert len(offsets) == len(texts) + 1 and offsets[0] == 0 and offsets[-1] == len(ids)
        assert ids.dtype == np.uint32 and offsets.dtype == np.int64
        for j, text in enumerate(texts):
            want = enc.encode_ordinary(text)
            assert ids[offsets[j]:offsets[j + 1]].tolist() == want, f"{name}, {shape}, text {j}: {text[:60]!r}"
        assert sum(len(t) for t in texts) > 10_000, shape


def test_special_token_text_is_ordinary_text(tokenizers):
    enc = tokenizers["gpt2"]
    built = giga.build(spec(enc), enc.encode_ordinary)
    text = "a <|bos|> b <|user_start|>"
    assert built.encode(text).tolist() == enc.encode_ordinary(text)
    assert enc.encode_single_token("<|bos|>") not in built.encode(text).tolist()


def test_a_pattern_it_would_get_wrong_is_refused_by_the_probe(tokenizers, monkeypatch):
    """nanochat's pattern passed off as cl100k's: the probe's digits tell them apart."""
    enc = tokenizers["nanochat"]
    monkeypatch.setitem(giga.SCHEMES, enc._pat_str, "cl100k")
    got = giga.build(spec(enc), enc.encode_ordinary)
    assert isinstance(got, giga.Refused) and "differs from this tokenizer's definition" in got.why, got


def test_auto_picks_it_where_it_is_proven_and_fastokens_elsewhere(tokenizers):
    assert enginemod.build(spec(tokenizers["gpt2"]), "auto").name == "gigatoken"
    assert enginemod.build(spec(tokenizers["cl100k"]), "auto").name == "gigatoken"
    assert enginemod.build(spec(tokenizers["nanochat"]), "auto").name == "fastokens"
    assert enginemod.build(spec(tokenizers["gpt2"]), "fastokens").name == "fastokens"
    assert enginemod.build(spec(tokenizers["gpt2"]), "tiktoken").name == "tiktoken"


def test_asking_for_it_where_it_cannot_encode_says_why(tokenizers):
    with pytest.raises(ValueError, match=r'engine="gigatoken": gigatoken does not implement this tokenizer\'s '
                                         r'split pattern'):
        enginemod.build(spec(tokenizers["nanochat"]), "gigatoken")


def test_the_engine_encodes_as_a_worker_calls_it(tokenizers):
    """`Encoder.encode_batch` and `encode`, as `Engines` calls them."""
    enc = tokenizers["cl100k"]
    e = enginemod.build(spec(enc), "gigatoken")
    texts = ["x" * 3, "", "hello world", "<|bos|>"]
    ids, offsets = e.encode_batch(texts)
    assert [ids[offsets[j]:offsets[j + 1]].tolist() for j in range(len(texts))] == [enc.encode_ordinary(t) for t in texts]
    assert e.encode("hello world").tolist() == enc.encode_ordinary("hello world")
    assert e.threads == 0  # parallel=False: none of its own
