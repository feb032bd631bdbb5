"""data/tokenizer.py in this process: every tokenizer form resolved.

`resolve` (a `tiktoken.Encoding`, its pickle path and directory, a nanochat-style wrapper,
`IntTokenizer`, a Hugging Face tokenizer), the BOS rule (`<|bos|>`, else `<|endoftext|>`, else
an error; `bos=` overrides), bad paths and pickles, the fingerprint and `build`, which encodes
special-token text as ordinary text; the spec of one object and BOS is computed once. (Each
form rebuilt in the workers: tests/loader/test_tokenizers.py.)
"""
import os
import pickle
import re

import numpy as np
import warnings

import pytest
import tiktoken

from shmloader.data.tokenizer import TokenizerSpec, build, resolve
from shmloader.demo import corpus
from tests.helpers import IntTokenizer, train_enc


SPECIAL_TEXTS = ["<|bos|>", "a <|bos|> b", "<|endoftext|>", "x<|endoftext|>y<|bos|>",
                 "<|user_start|>hi<|assistant_end|>", "", "plain text, naïve café 😀"]


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
        return ([prepend] if prepend is not None else []) + self.enc.encode_ordinary(text)


class Normalising(NanochatLike):
    """A wrapper of the same shape whose encode normalises the text first (NFKC, stripped)."""

    def encode(self, text, prepend=None, num_threads=None):
        import unicodedata
        return self.enc.encode_ordinary(unicodedata.normalize("NFKC", text).strip())


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


class CallsEncode(NanochatLike):
    """The common wrapper: tiktoken's own `encode`, which refuses special tokens' text."""

    def encode(self, text, prepend=None, num_threads=None):
        return self.enc.encode(text)


class PrependsBos(NanochatLike):
    """A wrapper whose encode begins each text with its BOS."""

    def encode(self, text, prepend=None, num_threads=None):
        return [self.get_bos_token_id()] + self.enc.encode_ordinary(text)


@pytest.mark.parametrize("wrapper", [CallsEncode, PrependsBos])
def test_a_wrapper_of_its_encodings_ids_is_unwrapped_whatever_it_does_with_special_tokens_or_bos(enc, wrapper):
    """The review's cases: a wrapper calling tiktoken's `encode` (it raises on the special-token
    probe) or giving `[BOS] + ids` (the loader's BOS) is its Encoding's: unwrapped, the same
    fingerprint as the Encoding's (a state saved before resumes), no warning. Each was kept as an
    object when a raise or a BOS counted as a difference: the first then failed on a document
    quoting a special token, the second read [BOS, BOS, ...]."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = resolve(wrapper(enc))
    assert spec.kind == "tiktoken" and spec.fingerprint == resolve(enc).fingerprint


def test_a_wrapper_whose_encode_is_not_its_encodings_is_kept_whole(enc):
    """A wrapper of nanochat's shape whose encode is not `.enc.encode_ordinary` is an object
    (pickled, its own encode in the workers), not unwrapped to its Encoding, and says so once,
    with the text it differs on."""
    wrapper = Normalising(enc)
    with pytest.warns(UserWarning, match=r"tokenizer Normalising holds a tiktoken Encoding .*its own encode tokenizes"):
        spec = resolve(wrapper)
    assert spec.kind == "object" and spec.bos == enc.encode_single_token("<|bos|>")
    assert spec.fingerprint != resolve(enc).fingerprint
    assert build(spec)(" ﬁne \n").tolist() == enc.encode_ordinary("fine") != enc.encode_ordinary(" ﬁne \n")


def test_resolve_int_tokenizer():
    spec = resolve(IntTokenizer(bos=5))
    assert spec.kind == "object" and spec.bos == 5 and spec.dtype == np.int64
    ids = build(spec)("3 1 4 1 5 9")
    assert ids.dtype == np.int64 and ids.tolist() == [3, 1, 4, 1, 5, 9]
    assert build(spec)("").tolist() == []
    assert resolve(IntTokenizer(bos=5)).fingerprint == spec.fingerprint
    assert resolve(IntTokenizer(bos=6)).fingerprint != spec.fingerprint


def test_a_transformers_tokenizer_is_told_to_pass_its_backend_tokenizer():
    """A `transformers` tokenizer (AutoTokenizer's; its encode adds special tokens and it has no
    get_bos_token_id) is refused with what to pass instead: its backend_tokenizer or its
    tokenizer.json, and bos= (the new-user trial: it got the generic list of kinds)."""
    Fast = type("PreTrainedTokenizerFast", (), {"__module__": "transformers.tokenization_utils_fast",
                                                "encode": lambda self, text: [1]})
    with pytest.raises(TypeError, match=r"got PreTrainedTokenizerFast; for a transformers tokenizer pass its "
                                        r"backend_tokenizer .* bos=tok\.bos_token_id"):
        resolve(Fast())


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


def test_a_bos_that_is_no_token_id_is_a_value_error(enc):
    """bos= an int of the vocabulary (numpy's too); a tokenizer object's own BOS is bounded by its
    ids' dtype, its vocabulary being unknown (tests/loader/test_mixture_clients.py: the loader)."""
    assert resolve(enc, bos=np.int64(5)).bos == 5 and resolve(enc, bos=enc.n_vocab - 1).bos == enc.n_vocab - 1
    for bad in (-1, enc.n_vocab, 2.0, True, "5"):
        with pytest.raises(ValueError, match="bos="):
            resolve(enc, bos=bad)
    with pytest.raises(ValueError, match=r"the BOS id -3 is not a token id .*int64"):
        resolve(IntTokenizer(bos=-3))
    assert resolve(IntTokenizer(bos=2 ** 40)).bos == 2 ** 40


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


def test_spec_of_an_encoding_is_computed_once_per_object_and_bos(enc):
    # nanochat builds a val loader with the same tokenizer object at every evaluation
    from shmloader.data import tokenizer as tokmod

    first = tokmod.resolve(enc)
    assert tokmod.resolve(enc) is first
    other = tokmod.resolve(enc, bos=first.bos + 1)
    assert other is not first and other.bos == first.bos + 1 and other.fingerprint != first.fingerprint
    assert tokmod.resolve(enc, bos=first.bos + 1) is other


def test_a_tokenizer_file_is_loaded_once_while_it_is_unchanged(enc, tmp_path):
    # ShmLoader(tokenizer=path) at every evaluation: the file's Encoding, and so its spec, once
    from shmloader.data import tokenizer as tokmod

    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(pickle.dumps(enc))
    first = resolve(str(path))
    assert resolve(str(path)) is first and resolve(str(tmp_path)) is first  # its directory too
    other = corpus.train_tokenizer(corpus.synthetic_texts(300, seed=6), vocab_size=300)
    path.write_bytes(pickle.dumps(other))  # replaced: another size, another mtime
    os.utime(path, ns=(1, 1))
    changed = resolve(str(path))
    assert changed is not first and changed.fingerprint == resolve(other).fingerprint
    for i in range(tokmod.LOADED_KEPT + 2):  # a few files kept, not every one ever loaded
        (tmp_path / f"t{i}.pkl").write_bytes(pickle.dumps(enc))
        resolve(str(tmp_path / f"t{i}.pkl"))
    assert len(tokmod._LOADED) <= tokmod.LOADED_KEPT


def test_a_workers_encoding_is_unpickled_once_for_every_use(enc, monkeypatch):
    """The definition, gigatoken's pattern check and a fast engine's build each need the
    Encoding: a 65k-token one takes ~40 ms to unpickle, once per worker."""
    from shmloader.data import giga, tokenizer as tokmod

    spec = resolve(with_specials(enc, ["<|bos|>", "<|fresh|>"], name="unpickled-once"))
    tokmod._ENCODINGS.pop(spec.fingerprint)  # a worker's process: it has only the spec
    loads = []
    real = pickle.loads
    monkeypatch.setattr(tokmod.pickle, "loads", lambda data: loads.append(len(data)) or real(data))
    assert build(spec)("a b").tolist() == enc.encode_ordinary("a b")
    giga.scheme(spec)
    giga.build(spec, build(spec))
    try:
        import fastokens
    except ImportError:
        fastokens = None
    if fastokens is not None:
        from shmloader.data import engine as enginemod

        enginemod._fastokens(fastokens, spec)
    assert tokmod.encoding(spec) is tokmod.encoding(spec) and len(loads) == 1


def test_the_process_that_made_a_spec_encodes_with_its_own_encoding(enc, monkeypatch):
    """The trainer's head start tokenizes with the Encoding it was given (procs/headstart.py):
    never a 65k-token vocabulary unpickled again in the training process."""
    from shmloader.data import tokenizer as tokmod

    mine = with_specials(enc, ["<|bos|>", "<|own|>"], name="made-here")
    loads = []
    real = pickle.loads
    monkeypatch.setattr(tokmod.pickle, "loads", lambda data: loads.append(len(data)) or real(data))
    spec = resolve(mine)
    assert tokmod.encoding(spec) is mine and loads == []
    assert build(spec)("a b").tolist() == mine.encode_ordinary("a b") and loads == []


def test_a_large_payload_is_spilled_once_to_a_file_and_read_back_whole(enc, tmp_path, monkeypatch):
    from shmloader.data import tokenizer as tokmod

    spec = resolve(enc)
    assert tokmod.spilled(spec, str(tmp_path)) is spec  # small: sent as it is
    monkeypatch.setattr(tokmod, "SPILL_BYTES", 16)
    ref = tokmod.spilled(spec, str(tmp_path))
    assert isinstance(ref, tokmod.SpecFile) and tokmod.spilled(spec, str(tmp_path)) is ref  # written once
    assert len(pickle.dumps(ref)) < 500 < len(spec.payload)
    assert tokmod.loaded(pickle.loads(pickle.dumps(ref))) == spec and tokmod.loaded(spec) is spec
    with open(ref.path, "r+b") as f:
        f.truncate(ref.size - 1)
    with pytest.raises(RuntimeError, match="cut short"):
        ref.load()
    os.remove(ref.path)  # gone (another temporary directory's sweep): written again
    again = tokmod.spilled(spec, str(tmp_path))
    assert tokmod.loaded(again) == spec


# ----------------------------------------------------------------
# a tokenizer object whose encode() adds the BOS itself (a Llama-style wrapper; transformers'
# add_special_tokens=True) made every document [BOS, BOS, ...] without a word (the loader gives
# each document its own BOS). It is said once, when the loader is made, with what to pass instead;
# the stream is unchanged.

class AddsBos:
    """encode() puts BOS (1) first, as Llama-style wrappers do by default."""

    def get_bos_token_id(self) -> int:
        return 1

    def encode(self, text):
        return [1] + [2 + ord(c) % 200 for c in text]


class NoBos(AddsBos):
    def encode(self, text):
        return [2 + ord(c) % 200 for c in text]


def test_an_encode_that_adds_bos_itself_is_told():
    with pytest.warns(UserWarning, match=r"AddsBos's encode\(\) begins every text with the BOS id 1 itself .*"
                                         r"every document begins \[BOS, BOS\]"):
        spec = resolve(AddsBos())
    assert (spec.kind, spec.bos) == ("object", 1)


class AddsBosAsciiOnly(AddsBos):
    def encode(self, text):
        text.encode("ascii")  # raises on the non-ASCII probe
        return AddsBos.encode(self, text)


class AddsBosOnceOnly(AddsBos):
    def encode(self, text):
        if text != "x":
            raise ValueError("cannot encode it")
        return AddsBos.encode(self, text)


def test_an_encode_that_adds_bos_and_fails_on_one_probe_is_told():
    """An encode that raised on one probe (a non-ASCII text) said nothing, though every other
    probe began with the BOS: probes that raise are left out, two that do not are enough."""
    with pytest.warns(UserWarning, match=r"AddsBosAsciiOnly's encode\(\) begins every text with the BOS id 1"):
        resolve(AddsBosAsciiOnly())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve(AddsBosOnceOnly())  # one probe encoded: too few to say


def test_an_encode_without_bos_and_bos_as_text_are_not_told():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve(NoBos())
        resolve(AddsBos(), bos=7)  # another BOS: its first id is not the loader's BOS
