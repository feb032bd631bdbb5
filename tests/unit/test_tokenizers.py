"""tokenizer.py: every tokenizer form, resolved here and rebuilt in the workers.

In this process: `resolve` (a `tiktoken.Encoding`, its pickle path and directory, a
nanochat-style wrapper, `IntTokenizer`, a Hugging Face tokenizer), the BOS rule (`<|bos|>`,
else `<|endoftext|>`, else an error; `bos=` overrides), bad paths and pickles, the fingerprint
and `build`, which encodes special-token text as ordinary text.

In the workers: for each form the loader's concat stream (2 workers) is compared window for
window with `oracle.concat_windows` run here with that tokenizer's own ordinary encode and BOS:
a `tiktoken.Encoding`, its `tokenizer.pkl` path and directory, a nanochat-style wrapper (`.enc`
+ `get_bos_token_id()`), a generic object with `encode()` defined in this module (unpickled
by the workers), `tests.helpers.IntTokenizer`, a Hugging Face `tokenizer.json` trained
offline with `tokenizers` (path, directory, `tokenizers.Tokenizer` object) and an explicit `bos=`.
The documents hold literal special-token text ("<|bos|>", "<|endoftext|>"): the stream must
hold the BOS id exactly at document starts and nowhere else. Also: a tiktoken name offline
is a quick error that says it needs a download; a missing path is a FileNotFoundError naming
it; the state's tokenizer fingerprint is the same for every form of one tokenizer.
"""
import itertools
import os
import pickle
import re
import time

import numpy as np
import pytest
import tiktoken

import shmloader
from shmloader.data.tokenizer import TokenizerSpec, build, resolve
from shmloader.demo import corpus
from tests import helpers, oracle
from tests.helpers import IntTokenizer


SPECIAL_TEXTS = ["<|bos|>", "a <|bos|> b", "<|endoftext|>", "x<|endoftext|>y<|bos|>",
                 "<|user_start|>hi<|assistant_end|>", "", "plain text, naïve café 😀"]


def train_enc():
    """The module's tiktoken BPE; training is deterministic, so a retrained one equals it."""
    return corpus.train_tokenizer(corpus.synthetic_texts(80, seed=4, mean_words=20), vocab_size=330)


@pytest.fixture(scope="module")
def enc():
    return train_enc()


@pytest.fixture(scope="module")
def enc_other():
    return corpus.train_tokenizer(corpus.synthetic_texts(300, seed=5), vocab_size=290)


def with_specials(enc, specials, name="custom"):
    """The same BPE ranks with another set of special tokens."""
    n = len(enc._mergeable_ranks)
    return tiktoken.Encoding(name, pat_str=enc._pat_str, mergeable_ranks=enc._mergeable_ranks,
                             special_tokens={s: n + i for i, s in enumerate(specials)})


class NanochatLike:
    """nanochat's RustBPETokenizer shape: a tiktoken Encoding in `.enc`, a BOS getter."""

    def __init__(self, enc, bos=None):
        self.enc = enc
        self._bos = bos if bos is not None else enc.encode_single_token("<|bos|>")

    def get_bos_token_id(self):
        return self._bos

    def encode(self, text, prepend=None, num_threads=None):
        raise AssertionError("resolve() must unwrap .enc, not pickle the wrapper")


# ================================================================== in this process

# ------------------------------------------------------------------ resolve

def test_resolve_encoding(enc):
    spec = resolve(enc)
    assert isinstance(spec, TokenizerSpec) and spec.kind == "tiktoken"
    assert spec.bos == enc.encode_single_token("<|bos|>") == len(enc._mergeable_ranks)
    assert spec.dtype == np.uint32
    assert pickle.loads(spec.payload).encode_ordinary("hello world") == enc.encode_ordinary("hello world")


def test_resolve_pickle_path_and_directory(enc, tmp_path):
    path = corpus.save_tokenizer(enc, tmp_path / "tokenizer.pkl")
    a, b, c, d = resolve(enc), resolve(str(path)), resolve(path), resolve(str(tmp_path))
    assert a.bos == b.bos == c.bos == d.bos
    assert a.fingerprint == b.fingerprint == c.fingerprint == d.fingerprint
    assert b.kind == d.kind == "tiktoken"


def test_resolve_nanochat_wrapper(enc):
    spec = resolve(NanochatLike(enc))
    assert spec.kind == "tiktoken"
    assert spec.bos == enc.encode_single_token("<|bos|>")
    assert spec.fingerprint == resolve(enc).fingerprint
    assert build(spec)("a b c").tolist() == enc.encode_ordinary("a b c")
    # the wrapper's BOS id is the one used
    assert resolve(NanochatLike(enc, bos=7)).bos == 7


def test_resolve_int_tokenizer():
    spec = resolve(IntTokenizer(bos=5))
    assert spec.kind == "object" and spec.bos == 5 and spec.dtype == np.int64
    ids = build(spec)("3 1 4 1 5 9")
    assert ids.dtype == np.int64 and ids.tolist() == [3, 1, 4, 1, 5, 9]
    assert build(spec)("").tolist() == []
    assert resolve(IntTokenizer(bos=5)).fingerprint == spec.fingerprint
    assert resolve(IntTokenizer(bos=6)).fingerprint != spec.fingerprint


def test_resolve_rejects_other_objects():
    with pytest.raises(TypeError, match="tokenizer"):
        resolve(12345)
    with pytest.raises(TypeError):
        resolve(object())


# ------------------------------------------------------------------ BOS rule

def test_bos_prefers_bos_over_endoftext(enc):
    e = with_specials(enc, ["<|endoftext|>", "<|bos|>"])
    assert resolve(e).bos == len(enc._mergeable_ranks) + 1


def test_bos_falls_back_to_endoftext(enc):
    e = with_specials(enc, ["<|user_start|>", "<|endoftext|>"])
    assert resolve(e).bos == len(enc._mergeable_ranks) + 1


def test_no_bos_token_is_a_value_error(enc):
    e = with_specials(enc, ["<|user_start|>"], name="nobos")
    with pytest.raises(ValueError, match="BOS") as ei:
        resolve(e)
    assert "<|bos|>" in str(ei.value) and "<|endoftext|>" in str(ei.value)


# ------------------------------------------------------------------ bad paths

def test_missing_path_names_it(tmp_path):
    path = tmp_path / "nope" / "tokenizer.pkl"
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        resolve(str(path))


def test_directory_without_tokenizer_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(os.path.join(str(tmp_path), "tokenizer.pkl"))):
        resolve(tmp_path)


def test_default_path_uses_nanochat_base_dir(tmp_path, monkeypatch, enc):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))
    expected = os.path.join(str(tmp_path), "tokenizer", "tokenizer.pkl")
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):
        resolve(None)
    corpus.save_tokenizer(enc, expected)
    assert resolve(None).fingerprint == resolve(enc).fingerprint


@pytest.mark.parametrize("content", [b"", b"not a pickle at all", pickle.dumps([1, 2])[:-3]])
def test_corrupt_pickle_is_a_value_error(tmp_path, content):
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        resolve(str(path))


def test_pickle_that_is_not_a_tokenizer_names_the_file(tmp_path):
    # docs/contract.md §4: an error names the file; a tokenizer.pkl holding something else is bad input
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(pickle.dumps({"not": "a tokenizer"}))
    with pytest.raises((TypeError, ValueError)) as ei:
        resolve(str(path))
    assert str(path) in str(ei.value)


# ------------------------------------------------------------------ fingerprint

def test_fingerprint_stable_and_distinct(enc, enc_other):
    a1, a2 = resolve(enc).fingerprint, resolve(enc).fingerprint
    copy = pickle.loads(pickle.dumps(enc))
    assert a1 == a2 == resolve(copy).fingerprint
    assert isinstance(a1, str) and len(a1) >= 8
    assert resolve(enc_other).fingerprint != a1
    # same ranks, other special tokens
    assert resolve(with_specials(enc, ["<|bos|>"])).fingerprint != a1
    # retrained from the same texts: deterministic, so the same fingerprint
    again = train_enc()
    assert resolve(again).fingerprint == a1


def test_fingerprint_depends_on_bos(enc):
    # docs/contract.md §3: a state made under another tokenizer is refused. The BOS id is part of every
    # document, so a state made with bos=X must not resume silently under bos=Y.
    default = resolve(enc)
    other = resolve(enc, bos=7)
    assert other.bos == 7 and default.bos != 7
    assert other.fingerprint != default.fingerprint


def test_bos_override(enc):
    assert resolve(enc, bos=11).bos == 11
    assert resolve(NanochatLike(enc), bos=12).bos == 12
    assert resolve(IntTokenizer(bos=1), bos=13).bos == 13
    # an explicit bos= also rescues an encoding with no BOS token
    assert resolve(with_specials(enc, ["<|user_start|>"]), bos=3).bos == 3


def test_unknown_name_is_not_found():
    with pytest.raises(FileNotFoundError, match="no_such_tokenizer_name"):
        resolve("no_such_tokenizer_name")


# ------------------------------------------------------------------ build

def test_build_equals_encode_ordinary(enc):
    encode = build(resolve(enc))
    texts = [t for t in corpus.synthetic_texts(300) if t is not None] + SPECIAL_TEXTS
    assert sum("<|bos|>" in t for t in texts) > 5  # guard: special strings are present
    for text in texts:
        got = encode(text)
        assert got.dtype == np.uint32
        assert got.tolist() == enc.encode_ordinary(text), text
    bos = resolve(enc).bos
    assert bos not in encode("<|bos|>").tolist()


def test_build_from_pickle_path_matches(enc, tmp_path):
    path = corpus.save_tokenizer(enc, tmp_path)
    encode = build(resolve(str(path)))
    for text in SPECIAL_TEXTS:
        assert encode(text).tolist() == enc.encode_ordinary(text)


# ------------------------------------------------------------------ Hugging Face tokenizers

@pytest.fixture(scope="module")
def hf_tok():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([t for t in corpus.synthetic_texts(300) if t], trainer)
    return tok


def test_hf_resolve_object_path_and_directory(hf_tok, tmp_path):
    spec = resolve(hf_tok)
    assert spec.kind == "hf" and spec.dtype == np.uint32 and spec.n_vocab == hf_tok.get_vocab_size()
    assert spec.bos == hf_tok.token_to_id("<|endoftext|>")  # before "<s>" in the BOS order
    hf_tok.save(str(tmp_path / "tokenizer.json"))
    for source in (str(tmp_path / "tokenizer.json"), tmp_path):
        other = resolve(source)
        assert (other.kind, other.bos) == ("hf", spec.bos)
        assert build(other)("hello world").tolist() == build(spec)("hello world").tolist()
    assert resolve(hf_tok, bos=5).bos == 5


def test_hf_fingerprint_same_for_object_and_its_file(hf_tok, tmp_path):
    # the same tokenizer passed as a Tokenizer or as its tokenizer.json must resume each
    # other's states; Tokenizer.save() writes pretty JSON, to_str() compact JSON
    path = tmp_path / "tokenizer.json"
    hf_tok.save(str(path))
    assert resolve(str(path)).fingerprint == resolve(hf_tok).fingerprint
    assert resolve(hf_tok).fingerprint == resolve(hf_tok).fingerprint


def test_directory_with_both_files_prefers_tokenizer_pkl(hf_tok, enc, tmp_path):
    hf_tok.save(str(tmp_path / "tokenizer.json"))
    corpus.save_tokenizer(enc, tmp_path / "tokenizer.pkl")
    spec = resolve(tmp_path)
    assert spec.kind == "tiktoken" and spec.fingerprint == resolve(enc).fingerprint


def test_hf_build_treats_special_text_as_ordinary(hf_tok):
    encode = build(resolve(hf_tok))
    specials = {hf_tok.token_to_id("<|endoftext|>"), hf_tok.token_to_id("<s>")}
    for text in SPECIAL_TEXTS + ["a <s> b"]:
        ids = encode(text)
        assert ids.dtype == np.uint32
        assert not specials & set(ids.tolist()), text
        assert hf_tok.decode(ids.tolist(), skip_special_tokens=False) == text


def test_hf_without_bos_token_is_a_value_error(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["hello world"] * 10, trainers.BpeTrainer(vocab_size=300,
                                                                      special_tokens=["<pad>"],
                                                                      show_progress=False))
    with pytest.raises(ValueError, match="bos"):
        resolve(tok)
    assert resolve(tok, bos=0).bos == 0


# ================================================================== in the workers

B, T = 2, 24
N = 10
SPECIAL_TEXT = ("<|bos|>", "<|endoftext|>")


class NanochatStyle:
    """nanochat's RustBPETokenizer interface: a tiktoken Encoding in `.enc`."""

    def __init__(self, enc):
        self.enc = enc
        self.bos = enc.encode_single_token("<|bos|>")

    def get_bos_token_id(self):
        return self.bos

    def encode(self, text, prepend=None, num_threads=8):
        ids = self.enc.encode_ordinary(text)
        return ([prepend] if prepend is not None else []) + ids


class OrdinaryObject:
    """A tokenizer object the loader cannot unwrap: pickled, and unpickled by each worker."""

    def __init__(self, enc, bos):
        self._tiktoken = enc
        self._bos = bos

    def get_bos_token_id(self):
        return self._bos

    def encode(self, text, prepend=None, num_threads=None):
        return self._tiktoken.encode_ordinary(text)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok_shards")
    docs = corpus.synthetic_texts(100, seed=11, mean_words=10)
    docs[3] = None
    docs[1] = "<|bos|> starts this one, <|endoftext|> ends it <|endoftext|>"
    docs[5] = "a <|endoftext|> b <|bos|><|endoftext|>"  # early, so the compared batches hold them
    paths = [str(p) for p in corpus.write_shards(docs, root, num_files=3, row_group_size=[12, 5])]
    return root, paths


@pytest.fixture(scope="module")
def pkl(enc, tmp_path_factory):
    return corpus.save_tokenizer(enc, tmp_path_factory.mktemp("tok_pkl"))


@pytest.fixture(scope="module")
def hf_json(tmp_path_factory):
    """A byte-level BPE tokenizer.json trained offline; '<|endoftext|>' is its only special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus.synthetic_texts(80, seed=4, mean_words=20), trainer)
    path = tmp_path_factory.mktemp("tok_hf") / "tokenizer.json"
    tok.save(str(path))
    return path


def _hf_encode(path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.encode_special_tokens = True
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def _loader_windows(shards, tokenizer, n=N, **kw):
    root, _ = shards
    out = []
    with shmloader.ShmLoader(str(root), tokenizer, B, T, "train", num_workers=2, device="cpu",
                             timeout=60, **kw) as loader:
        for x, y in itertools.islice(loader, n):
            x, y = x.reshape(-1).numpy(), y.reshape(-1).numpy()
            assert np.array_equal(x[1:], y[:-1])
            out.append(np.concatenate([x[:1], y]))
        config = dict(loader.state_dict()["config"])
    return out, config


def _check_stream(shards, tokenizer, encode, bos_id, **kw):
    """Loader windows == oracle windows; BOS only at document starts. Returns the config."""
    _, paths = shards
    got, config = _loader_windows(shards, tokenizer, **kw)
    expected = [w for w, _ in itertools.islice(
        oracle.concat_windows(paths[:-1], encode, bos_id, B, T), N)]
    assert len(got) == N
    for k, (g, o) in enumerate(zip(got, expected)):
        assert np.array_equal(g, o), f"batch {k}: the workers tokenize differently from this process"
    stream = np.concatenate(got)
    starts, pos, special_seen = [], 0, 0
    for _, text in oracle.documents(paths[:-1]):
        if pos >= len(stream):
            break
        if text is None:
            continue
        starts.append(pos)
        special_seen += any(s in text for s in SPECIAL_TEXT)
        pos += 1 + len(encode(text))
    assert special_seen >= 2, "the compared batches should hold documents with special-token text"
    assert np.flatnonzero(stream == bos_id).tolist() == starts, "BOS must appear at document starts only"
    return config


def test_tiktoken_encoding_object(shards, enc):
    _check_stream(shards, enc, enc.encode_ordinary, enc.encode_single_token("<|bos|>"))


def test_pickle_path_and_directory(shards, enc, pkl):
    bos = enc.encode_single_token("<|bos|>")
    _check_stream(shards, str(pkl), enc.encode_ordinary, bos)
    _check_stream(shards, pkl.parent, enc.encode_ordinary, bos)  # a PathLike directory


def test_nanochat_style_wrapper(shards, enc):
    wrapper = NanochatStyle(enc)
    _check_stream(shards, wrapper, enc.encode_ordinary, wrapper.get_bos_token_id())


def test_object_defined_in_a_test_module(shards, enc):
    obj = OrdinaryObject(enc, enc.encode_single_token("<|bos|>"))
    _check_stream(shards, obj, enc.encode_ordinary, obj.get_bos_token_id())


def test_int_tokenizer(tmp_path):
    lengths = [(i * 5) % 17 for i in range(90)]
    paths = [str(p) for p in corpus.write_shards(helpers.position_documents(lengths), tmp_path,
                                                num_files=3, row_group_size=[7, 4])]
    tok = helpers.IntTokenizer(bos=0)
    got, _ = _loader_windows((tmp_path, paths), tok, n=6)
    stream = np.concatenate(got)
    # token == position in the stream, except BOS (0)
    nonbos = np.flatnonzero(stream != 0)
    assert len(nonbos) > 100 and np.array_equal(stream[nonbos], nonbos)
    expected = [w for w, _ in itertools.islice(oracle.concat_windows(paths[:-1], tok.encode, 0, B, T), 6)]
    assert all(np.array_equal(g, o) for g, o in zip(got, expected))


def test_hf_tokenizer_json_path_directory_and_object(shards, hf_json):
    from tokenizers import Tokenizer

    encode = _hf_encode(hf_json)
    bos = Tokenizer.from_file(str(hf_json)).token_to_id("<|endoftext|>")
    assert bos is not None
    assert bos not in encode("x <|endoftext|> y"), "oracle: special text must be ordinary text"
    by_path = _check_stream(shards, str(hf_json), encode, bos)
    by_dir = _check_stream(shards, str(hf_json.parent), encode, bos)
    by_obj = _check_stream(shards, Tokenizer.from_file(str(hf_json)), encode, bos)
    assert by_path["tokenizer"] == by_dir["tokenizer"]
    assert by_obj["tokenizer"] == by_path["tokenizer"]


def test_hf_bestfit_matches_oracle(shards, hf_json):
    from tokenizers import Tokenizer

    root, paths = shards
    encode = _hf_encode(hf_json)
    bos = Tokenizer.from_file(str(hf_json)).token_to_id("<|endoftext|>")
    kw = dict(buffer_size=10, tokenizer_batch_size=4)
    expected = list(itertools.islice(oracle.bestfit_rows(paths[:-1], encode, bos, B, T,
                                                          buffer_size=10, chunk_docs=4), 5))
    with shmloader.ShmLoader(str(root), str(hf_json), B, T, "train", packing="bos_bestfit",
                             num_workers=2, device="cpu", timeout=60, **kw) as loader:
        got = [(x.numpy().copy(), y.numpy().copy()) for x, y in itertools.islice(loader, 5)]
    assert len(got) == 5
    for (x, y), (rows, _) in zip(got, expected):
        assert np.array_equal(x, rows[:, :-1]) and np.array_equal(y, rows[:, 1:])
        assert (x[:, 0] == bos).all(), "every best-fit row starts with BOS"


def test_explicit_bos(shards, enc, hf_json):
    user_start = enc.encode_single_token("<|user_start|>")
    _check_stream(shards, enc, enc.encode_ordinary, user_start, bos=user_start)
    # Hugging Face: an ordinary token id that no document uses, so any misplaced BOS shows
    _, paths = shards
    encode = _hf_encode(hf_json)
    used = {t for _, text in oracle.documents(paths[:-1], epochs=1) if text for t in encode(text)}
    unused = [i for i in range(1, 400) if i not in used]
    assert unused, "the test needs a token id that the documents never use"
    _check_stream(shards, str(hf_json), encode, unused[0], bos=unused[0])


def test_state_with_another_bos_is_refused(shards, enc):
    root, _ = shards
    with shmloader.ShmLoader(str(root), enc, B, T, "train", num_workers=1, device="cpu") as first:
        next(first)
        state = first.state_dict()
    other = enc.encode_single_token("<|user_start|>")
    with pytest.raises(ValueError, match="tokenizer"):
        shmloader.ShmLoader(str(root), enc, B, T, "train", num_workers=1, device="cpu", bos=other,
                            resume_state=state).close()


def test_tiktoken_name_offline_is_a_quick_clear_error(shards, monkeypatch, tmp_path):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))
    root, _ = shards
    began = time.monotonic()
    try:
        loader = shmloader.ShmLoader(str(root), "gpt2", B, T, "train", num_workers=1, device="cpu")
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        elapsed = time.monotonic() - began
        text = str(exc).lower()
        assert "download" in text or "network" in text, f"unclear error: {type(exc).__name__}: {exc}"
        assert "gpt2" in text
        assert elapsed < 30, f"took {elapsed:.1f} s to fail offline"
        return
    loader.close()
    pytest.skip("tiktoken could download 'gpt2' here (network access): nothing to check offline")


def test_missing_path_is_file_not_found_naming_it(shards, tmp_path):
    root, _ = shards
    for missing in (tmp_path / "nope" / "tokenizer.pkl", tmp_path / "nope.json", tmp_path / "no_dir",
                    "no_such_encoding_name"):
        began = time.monotonic()
        with pytest.raises(FileNotFoundError) as info:
            shmloader.ShmLoader(str(root), str(missing), B, T, "train", num_workers=1, device="cpu")
        assert str(missing) in str(info.value)
        assert time.monotonic() - began < 5


def test_fingerprint_is_the_same_across_forms(shards, enc, pkl):
    prints = {}
    for name, form in (("object", enc), ("pkl", str(pkl)), ("dir", str(pkl.parent)),
                       ("wrapper", NanochatStyle(enc))):
        _, config = _loader_windows(shards, form, n=1)
        prints[name] = config["tokenizer"]
    assert len(set(prints.values())) == 1, prints
    other = corpus.train_tokenizer(corpus.synthetic_texts(80, seed=9, mean_words=20), vocab_size=300)
    _, config = _loader_windows(shards, other, n=1)
    assert config["tokenizer"] != prints["object"], "a different tokenizer must change the fingerprint"


def test_spec_of_an_encoding_is_computed_once_per_object_and_bos(enc):
    # nanochat builds a val loader with the same tokenizer object at every evaluation
    from shmloader.data import tokenizer as tokmod

    first = tokmod.resolve(enc)
    assert tokmod.resolve(enc) is first
    other = tokmod.resolve(enc, bos=first.bos + 1)
    assert other is not first and other.bos == first.bos + 1 and other.fingerprint != first.fingerprint
    assert tokmod.resolve(enc, bos=first.bos + 1) is other
