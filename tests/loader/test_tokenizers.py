"""data/tokenizer.py in the workers: every tokenizer form, rebuilt by the workers.

For each form the loader's concat stream (2 workers) is compared window for window with
`oracle.concat_windows` run here with that tokenizer's own ordinary encode and BOS: a
`tiktoken.Encoding`, its `tokenizer.pkl` path and directory, a nanochat-style wrapper (`.enc`
+ `get_bos_token_id()`), a generic object with `encode()` defined in this module (unpickled
by the workers), `tests.helpers.IntTokenizer`, a Hugging Face `tokenizer.json` trained
offline with `tokenizers` (path, directory, `tokenizers.Tokenizer` object) and an explicit `bos=`.
The documents hold literal special-token text ("<|bos|>", "<|endoftext|>"): the stream must
hold the BOS id exactly at document starts and nowhere else. Also: a tiktoken name offline
is a quick error that says it needs a download; a missing path is a FileNotFoundError naming
it; the state's tokenizer fingerprint is the same for every form of one tokenizer.
(`resolve` and `build` in this process: tests/unit/data/test_tokenizers.py.)
"""
import itertools
import time

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers, oracle
from tests.helpers import train_enc


@pytest.fixture(scope="module")
def enc():
    return train_enc()


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


class UpperCasing(NanochatStyle):
    """A user's wrapper of nanochat's shape (a tiktoken Encoding in `.enc`) whose encode
    changes the text first: its tokens are not `.enc.encode_ordinary`'s."""

    def encode(self, text, prepend=None, num_threads=8):
        return self.enc.encode_ordinary(text.upper())


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


def test_a_wrapper_whose_encode_changes_the_text_tokenizes_with_its_own_encode(shards, enc):
    """A wrapper holding its Encoding in `.enc`, as nanochat's does, was unwrapped to it whatever
    its encode did: the batches held `enc.encode_ordinary(text)`, not the wrapper's ids (here
    upper-cased text), without a word."""
    wrapper = UpperCasing(enc)
    _check_stream(shards, wrapper, wrapper.encode, wrapper.get_bos_token_id())


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


@pytest.mark.parametrize("form", ["tiktoken", "object", "hf"])
def test_a_large_tokenizer_reaches_the_workers_as_a_file(shards, enc, hf_json, form, monkeypatch):
    """A payload above `SPILL_BYTES` (a 65k-token vocabulary pickles to 870 KB) goes to the
    workers in a file of the training process's temporary directory, not in every start's
    pickle: here every payload does. The stream is the oracle's, also after a worker is
    killed and replaced (the replacement reads the file too)."""
    import multiprocessing.util
    import os
    import signal

    from shmloader.data import tokenizer as tokmod
    from tokenizers import Tokenizer

    monkeypatch.setattr(tokmod, "SPILL_BYTES", 0)
    bos = enc.encode_single_token("<|bos|>")
    tokenizer, encode = {"tiktoken": (enc, enc.encode_ordinary),
                         "object": (OrdinaryObject(enc, bos), enc.encode_ordinary),
                         "hf": (str(hf_json), _hf_encode(hf_json))}[form]
    if form == "hf":
        bos = Tokenizer.from_file(str(hf_json)).token_to_id("<|endoftext|>")
    root, paths = shards
    got, killed = [], None
    with shmloader.ShmLoader(str(root), tokenizer, B, T, "train", num_workers=2, device="cpu", timeout=60,
                             n_slots=2) as loader:
        until = time.monotonic() + 30
        while len(got) < N or loader.stats()["heals"] < 1:  # a death is seen at the next liveness check
            x, y = next(loader)
            got.append(np.concatenate([x.reshape(-1).numpy()[:1], y.reshape(-1).numpy()]))
            busy = [w["pid"] for w in loader.stats()["workers"] if w["tokens"]]  # Ready, and given pieces
            if killed is None and len(got) >= 3 and busy:
                files = [f for f in os.listdir(multiprocessing.util.get_temp_dir()) if f.startswith("tokenizer_")]
                assert f"tokenizer_{loader.tokenizer.kind}_{loader.tokenizer.fingerprint}.bin" in files, files
                os.kill(killed := busy[0], signal.SIGKILL)
            assert time.monotonic() < until, f"no heal in 30 s ({len(got)} batches)"
    expected = [w for w, _ in itertools.islice(oracle.concat_windows(paths[:-1], encode, bos, B, T), len(got))]
    assert all(np.array_equal(g, o) for g, o in zip(got, expected)) and len(got) == len(expected)
