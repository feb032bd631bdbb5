"""Tokenizers: resolved in the trainer into a small picklable spec, built once per worker.

Accepted (docs/contract.md §1, `KINDS`): a path to a pickled `tiktoken.Encoding` (nanochat's
tokenizer.pkl), a directory holding one (else a `tokenizer.json`, else a `tokenizer.model`), a
`tiktoken.Encoding`, an object with nanochat's tokenizer interface (`encode(text) ->
list[int]`, `get_bos_token_id()`; nanochat's RustBPETokenizer is unwrapped to its `.enc`, as is
any such object whose `encode` gives its `.enc`'s `encode_ordinary` ids on `PROBES`: `unwraps`), a
Hugging Face `tokenizer.json` (needs the optional `tokenizers` package) or a
`tokenizers.Tokenizer`, a SentencePiece `.model` or a `sentencepiece.SentencePieceProcessor`
(needs the optional `sentencepiece` package: data/spm.py), or a tiktoken encoding name
(`"gpt2"`, `"cl100k_base"`: downloaded by tiktoken on first use). A file that is none of these
is a ValueError naming them. BOS is `bos=` when given, else `<|bos|>`, else `<|endoftext|>`
(Hugging Face: also `<s>`, `[BOS]`, `<|begin_of_text|>`; SentencePiece: the model's `bos_id()`).
Documents are encoded as ordinary text: special-token strings inside a document are not
special. Workers rebuild the tokenizer once from the spec's bytes: a tiktoken Encoding is
unpickled once per process (`encoding`), for the definition and the fast engines' builds alike
(a 65k-token vocabulary takes ~40 ms to unpickle, a 200k one ~170 ms); the process that made a
spec (the trainer, whose head start tokenizes: procs/headstart.py) uses the Encoding it was
made from. The trainer loads a
tokenizer file once while it is unchanged (`_load`), so a new loader of the same file finds
its spec made (`_SPECS`).
"""
import base64
import contextlib
import dataclasses
import hashlib
import json
import numbers
import os
import pickle
import tempfile
import weakref
from dataclasses import dataclass

import numpy as np

from ..errors import warn
from . import spm
from .source import nanochat_base_dir, tilde

BOS_NAMES = ("<|bos|>", "<|endoftext|>")
HF_BOS_NAMES = BOS_NAMES + ("<|begin_of_text|>", "<s>", "[BOS]", "<bos>")
DIR_FILES = ("tokenizer.pkl", "tokenizer.json", "tokenizer.model")  # a directory's tokenizer: the first it holds
KINDS = ("a pickled tiktoken Encoding or tokenizer object (nanochat's tokenizer.pkl), a Hugging Face "
         "tokenizer.json, a SentencePiece .model, a directory holding one of them (" + ", ".join(DIR_FILES) +
         "), or a tiktoken encoding name (\"gpt2\")")


@dataclass(frozen=True)
class TokenizerSpec:
    kind: str          # "tiktoken", "hf", "sp" or "object"
    payload: bytes     # the pickled Encoding or object, the tokenizer.json text, the SentencePiece model
    bos: int
    fingerprint: str
    n_vocab: int = 0   # 0 when unknown

    @property
    def dtype(self):
        return np.int64 if self.kind == "object" else np.uint32


def default_path() -> str:
    return os.path.join(nanochat_base_dir(), "tokenizer", "tokenizer.pkl")


def resolve(tokenizer, bos: int | None = None) -> TokenizerSpec:
    """The spec of `tokenizer` (the module docstring lists the forms) with BOS `bos` (None: its
    own); a BOS that is not a token id of its vocabulary (`bos=` not an int, negative or past
    the vocabulary; or a tokenizer object's own) is a ValueError here, not an id the model has
    no row for at every document's start, nor a worker killed by it."""
    if bos is not None and (isinstance(bos, bool) or not isinstance(bos, numbers.Integral) or bos < 0):
        raise ValueError(f"bos= must be a token id of the tokenizer (an int >= 0), got {bos!r}")
    spec = _resolve(tokenizer, None if bos is None else int(bos))
    bound = spec.n_vocab or np.iinfo(spec.dtype).max + 1  # a tokenizer object's vocabulary is not known
    if not 0 <= spec.bos < bound:
        vocab = f"its vocabulary is ids 0 to {bound - 1}" if spec.n_vocab else f"its ids are {np.dtype(spec.dtype)}"
        raise ValueError(f"the BOS id {spec.bos} is not a token id of the tokenizer ({vocab}): pass bos= with "
                         f"the id of its BOS token")
    return spec


def _resolve(tokenizer, bos: int | None) -> TokenizerSpec:
    import tiktoken

    origin = type(tokenizer).__name__
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        origin = os.fspath(tokenizer) if tokenizer is not None else default_path()
        tokenizer = _load(origin)
    if isinstance(tokenizer, _HFJson) or type(tokenizer).__module__.startswith("tokenizers"):
        return _hf_spec(tokenizer, bos)
    if spm.is_processor(tokenizer):
        return _sp_spec(tokenizer, bos)
    enc = getattr(tokenizer, "enc", None)
    if isinstance(enc, tiktoken.Encoding) and hasattr(tokenizer, "get_bos_token_id"):
        bos = int(tokenizer.get_bos_token_id()) if bos is None else bos
        if unwraps(tokenizer, enc, bos):
            return _tiktoken_spec(enc, bos)
    if isinstance(tokenizer, tiktoken.Encoding):
        return _tiktoken_spec(tokenizer, bos)
    if callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "get_bos_token_id", None)):
        if type(tokenizer).__module__ == "__main__":
            raise TypeError(f"tokenizer class {type(tokenizer).__name__} is defined in the script being "
                            f"run (__main__), which worker processes do not import: move it to a "
                            f"module, or pass a tiktoken.Encoding or a tokenizer.pkl")
        payload = pickle.dumps(tokenizer)
        bos = int(tokenizer.get_bos_token_id()) if bos is None else bos
        warn_if_adds_bos(tokenizer, bos)
        return TokenizerSpec("object", payload, bos, _fingerprint(hashlib.sha256(payload), bos))
    hint = ""
    if type(tokenizer).__module__.split(".")[0] == "transformers":  # AutoTokenizer's: its fast core is a tokenizers.Tokenizer
        hint = ("; for a transformers tokenizer pass its backend_tokenizer (a tokenizers.Tokenizer) or the "
                "tokenizer.json it was saved with, with bos=tok.bos_token_id where its BOS is not one of "
                f"{list(HF_BOS_NAMES)}")
    raise TypeError(f"{origin}: a tokenizer must be {KINDS}, a tiktoken.Encoding, a tokenizers.Tokenizer, a "
                    f"SentencePieceProcessor or an object with encode() and get_bos_token_id(); got "
                    f"{type(tokenizer).__name__}{hint}")


# texts on which a wrapper that changes the text before its Encoding (case, Unicode normalisation,
# spaces at the ends) encodes otherwise than `encode_ordinary`; `SPECIAL`, special tokens' text,
# which tiktoken's own `encode` refuses (a wrapper calling it is still its Encoding's)
PROBES = ("Hello World, MiXeD case ALL CAPS", "  spaces at both ends\t\r\n",
          "naïve café ﬁ ½ e\u0301 Ω 日本 😀", "", "x")
SPECIAL = "<|bos|> <|endoftext|> <s>"


def unwraps(tokenizer, enc, bos: int) -> bool:
    """Whether a tokenizer object holding a tiktoken Encoding in `.enc` (nanochat's
    RustBPETokenizer) is that Encoding's `encode_ordinary`: its `encode` gives the same ids on
    every text of `PROBES` (or `[bos]` and them: the loader's BOS), and on `SPECIAL` unless it
    raises there (tiktoken's `encode` refuses special tokens' text: a wrapper calling it is its
    Encoding's, whose documents quoting them are read as text, as before). Then the workers use
    the Encoding (and its fast engines); else the object itself, pickled, so that a wrapper's own
    `encode` (one that lowercases, say) makes the tokens, said once with the text it differs on.
    A wrapper that differs only on texts unlike the probes is not told apart."""
    def differs(text: str):
        got, want = [int(t) for t in tokenizer.encode(text)], enc.encode_ordinary(text)
        return None if got in (want, [bos] + want) else got
    try:
        text, got = next(((t, g) for t in PROBES if (g := differs(t)) is not None), (None, None))
    except Exception as exc:  # noqa: BLE001 - its own encode fails on an ordinary text: no plain Encoding
        text, got = PROBES[0], f"{type(exc).__name__}: {exc}"
    if text is None:
        try:
            got = differs(text := SPECIAL)
        except Exception:  # noqa: BLE001 - tiktoken's encode refuses special tokens' text
            got = None
    if got is None:
        return True
    warn(f"shmloader: tokenizer {type(tokenizer).__name__} holds a tiktoken Encoding (.enc), but its encode("
         f"{text!r}) gives {got[:12] if isinstance(got, list) else got}{' ...' if isinstance(got, list) and len(got) > 12 else ''}, not the Encoding's encode_ordinary ids: its own encode tokenizes, "
         f"in each worker's Python (slower than the Encoding's engines)")
    return False


def warn_if_adds_bos(tokenizer, bos: int) -> None:
    """A tokenizer object used as it is (kind "object") whose `encode` begins every text of
    `PROBES` with `bos` adds a BOS itself (a Llama-style wrapper, transformers'
    `add_special_tokens=True`): the loader gives each document its own, so each would begin
    `[BOS, BOS]`, silently. Said once, with what to pass instead; the stream is unchanged
    (documents are `[BOS] + encode(text)`, docs/contract.md). A probe whose `encode` fails is
    left out (its worker names the failure): said where every other probe, two at least, begins
    with `bos`."""
    began = []  # (text, ids) of each probe encoded, all beginning with `bos`
    for text in filter(None, PROBES):
        try:
            ids = [int(t) for t in tokenizer.encode(text)]
        except Exception:  # noqa: BLE001 - its worker reports an encode that fails
            continue
        if not ids or ids[0] != bos:
            return
        began.append((text, ids))
    if len(began) < 2:
        return
    text, ids = began[0]
    warn(f"shmloader: tokenizer {type(tokenizer).__name__}'s encode() begins every text with the BOS id {bos} "
         f"itself (encode({text!r}) gives {ids[:8]}{' ...' if len(ids) > 8 else ''}), and the loader gives "
         f"each document its own BOS: every document begins [BOS, BOS]. Pass an encode() that adds none "
         f"(add_special_tokens=False in a wrapper), or the tokenizer's own file (tokenizer.json, a "
         f"SentencePiece .model) or its tokenizers.Tokenizer / SentencePieceProcessor")


def _sp_spec(sp, bos: int | None) -> TokenizerSpec:
    payload, bos, n_vocab = spm.describe(sp, bos)
    return TokenizerSpec("sp", payload, bos, _fingerprint(hashlib.sha256(payload), bos), n_vocab)


def _fingerprint(h, bos: int) -> str:
    """What identifies a tokenizer's output: its definition and the BOS id."""
    h.update(f"bos={bos}".encode())
    return h.hexdigest()[:16]


class _HFJson(str):
    """The text of a Hugging Face tokenizer.json."""


# the tokenizer files loaded, while unchanged: (path, inode, size, mtime) -> the object
_LOADED: dict[tuple, object] = {}
LOADED_KEPT = 4


def _load(path: str):
    if os.path.isdir(path):
        held = [os.path.join(path, name) for name in DIR_FILES if os.path.isfile(os.path.join(path, name))]
        path = held[0] if held else os.path.join(path, DIR_FILES[0])
    if not os.path.isfile(path):
        if os.sep not in path and not path.endswith((".pkl", ".json", ".model")):
            return _named_encoding(path)
        raise FileNotFoundError(f"tokenizer not found at {path}{tilde(path)}: pass tokenizer= ({KINDS}; or a "
                                f"tokenizer object) or set NANOCHAT_BASE_DIR")
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _LOADED:
        while len(_LOADED) >= LOADED_KEPT:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = _read(path)
    return _LOADED[key]


def _read(path: str):
    """The tokenizer in the file at `path`, by its name: `.json` a Hugging Face tokenizer.json,
    `.model` a SentencePiece model, anything else a pickle; a ValueError naming `KINDS` when it
    is not what its name says."""
    try:
        if path.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            parsed = json.loads(text)
            if not isinstance(parsed, dict) or "model" not in parsed:
                raise ValueError("JSON without a tokenizer's 'model'")
            return _HFJson(text)
        if path.endswith(".model"):
            return spm.read(path)
        with open(path, "rb") as f:
            return pickle.load(f)
    except ImportError:
        raise
    except Exception as exc:
        raise ValueError(f"{path}: not a tokenizer file ({type(exc).__name__}: {exc}); expected {KINDS}. "
                         f"Pass one of those (nanochat's tokenizer.pkl: scripts/tok_train.py re-creates it)") from exc


def _named_encoding(name: str):
    import tiktoken

    if name not in tiktoken.list_encoding_names():
        raise FileNotFoundError(f"tokenizer {name!r} is neither a file nor a tiktoken encoding name "
                                f"({', '.join(tiktoken.list_encoding_names())})")
    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:
        raise RuntimeError(f"tiktoken encoding {name!r} is downloaded on first use and could not be "
                           f"({type(exc).__name__}: {exc}); run once with network access (it is "
                           f"cached in TIKTOKEN_CACHE_DIR) or pass a tokenizer.pkl") from exc


def _hf_spec(tokenizer, bos: int | None) -> TokenizerSpec:
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ImportError("a tokenizer.json needs the 'tokenizers' package: pip install tokenizers") from exc
    text = str(tokenizer) if isinstance(tokenizer, _HFJson) else tokenizer.to_str()
    tok = Tokenizer.from_str(text)
    if bos is None:
        found = [tok.token_to_id(n) for n in HF_BOS_NAMES if tok.token_to_id(n) is not None]
        if not found:
            raise ValueError(f"the Hugging Face tokenizer has none of the BOS tokens {HF_BOS_NAMES}: "
                             f"pass bos=<token id>")
        bos = found[0]
    payload = text.encode()
    canonical = hashlib.sha256(tok.to_str().encode())  # save() pretty-prints, to_str() does not
    return TokenizerSpec("hf", payload, int(bos), _fingerprint(canonical, int(bos)),
                         tok.get_vocab_size())


# fingerprint -> the tiktoken Encoding of a spec in this process: the one a spec was made from
# (the trainer's), else unpickled from it once (a worker's)
_ENCODINGS: dict[str, object] = {}

# Encoding -> {bos: spec}: nanochat builds a new val loader, with the same tokenizer object, at
# every evaluation; pickling and fingerprinting a 65k-token vocabulary each time would delay each one
_SPECS = weakref.WeakKeyDictionary()


def _tiktoken_spec(enc, bos: int | None) -> TokenizerSpec:
    try:
        known = _SPECS.setdefault(enc, {})
    except TypeError:  # not weak-referenceable
        known = {}
    if bos in known:
        return known[bos]
    known[bos] = spec = _make_tiktoken_spec(enc, bos)
    return spec


def _make_tiktoken_spec(enc, bos: int | None) -> TokenizerSpec:
    if bos is None:
        names = [n for n in BOS_NAMES if n in enc.special_tokens_set]
        if not names:
            raise ValueError(f"tokenizer {enc.name!r} has neither of the BOS tokens {BOS_NAMES}; "
                             f"its special tokens are {sorted(enc.special_tokens_set)}")
        bos = enc.encode_single_token(names[0])
    h = hashlib.sha256()
    h.update(enc._pat_str.encode())
    for name, tok in sorted(enc._special_tokens.items()):
        h.update(f"{name}={tok};".encode())
    ranks = enc._mergeable_ranks
    for piece in sorted(ranks, key=ranks.__getitem__):  # no (piece, rank) tuple per entry
        h.update(piece)
        h.update(ranks[piece].to_bytes(4, "little"))
    spec = TokenizerSpec("tiktoken", pickle.dumps(enc), int(bos), _fingerprint(h, int(bos)), enc.n_vocab)
    _ENCODINGS.setdefault(spec.fingerprint, enc)  # this process has it: never unpickled here again
    return spec


def build(spec: TokenizerSpec):
    """The per-document encoder a worker uses: `text -> integer array` (no BOS)."""
    if spec.kind == "hf":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(spec.payload.decode())
        tok.encode_special_tokens = True  # special-token text in a document is ordinary text
        return lambda text: np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)
    if spec.kind == "sp":
        return spm.encoders(spec)[0]
    if spec.kind == "tiktoken":
        encode = encoding(spec).encode_to_numpy
        return lambda text: encode(text, disallowed_special=())
    obj = pickle.loads(spec.payload)
    return lambda text: np.asarray(obj.encode(text), dtype=np.int64)


SPILL_BYTES = 64 << 10  # a larger payload reaches a child as a file (`spilled`), not in its start's pickle


@dataclass(frozen=True)
class SpecFile:
    """A spec whose payload waits in a file (`spilled`): what a worker is started with, so that
    starting one does not push the payload (870 KB for a 65k-token vocabulary) through the
    forkserver's socket again; the worker `load`s it."""
    spec: TokenizerSpec  # without its payload
    path: str
    size: int

    def load(self) -> TokenizerSpec:
        with open(self.path, "rb") as f:
            payload = f.read()
        if len(payload) != self.size:
            raise RuntimeError(f"{self.path}: the tokenizer's payload file holds {len(payload)} bytes, not "
                               f"{self.size}: it was replaced or cut short")
        return dataclasses.replace(self.spec, payload=payload)


_SPILLED: dict[tuple, SpecFile] = {}  # (directory, fingerprint, kind) -> its file, written once


def spilled(spec: TokenizerSpec | None, directory: str):
    """`spec` as a child gets it: a `SpecFile` in `directory` (the training process's own
    temporary directory, removed at its exit) when the payload is larger than `SPILL_BYTES`,
    written once per tokenizer; else `spec` itself."""
    if spec is None or len(spec.payload) <= SPILL_BYTES:
        return spec
    key = (directory, spec.fingerprint, spec.kind)
    ref = _SPILLED.get(key)
    if ref is None or not os.path.isfile(ref.path):
        path = os.path.join(directory, f"tokenizer_{spec.kind}_{spec.fingerprint}.bin")
        with open(path + ".new", "wb") as f:
            f.write(spec.payload)
        os.replace(path + ".new", path)
        ref = _SPILLED[key] = SpecFile(dataclasses.replace(spec, payload=b""), path, len(spec.payload))
    return ref


def loaded(spec):
    """A child's spec whole: a `SpecFile` read back, anything else as it is."""
    return spec.load() if isinstance(spec, SpecFile) else spec




def encoding(spec: TokenizerSpec):
    """The `tiktoken.Encoding` of a spec of kind "tiktoken", unpickled once per process (the
    definition, gigatoken's check and the fast engines' builds read the same one)."""
    enc = _ENCODINGS.get(spec.fingerprint)
    if enc is None:
        enc = _ENCODINGS[spec.fingerprint] = pickle.loads(spec.payload)
    return enc


@contextlib.contextmanager
def ranks_file(enc):
    """A `.tiktoken` file of `enc`'s mergeable ranks (base64 piece, rank: one a line), for the
    engines that load one (fastokens, gigatoken); its path, while the context lasts."""
    with tempfile.NamedTemporaryFile("wb", suffix=".tiktoken") as f:
        f.write(b"".join(base64.b64encode(piece) + b" %d\n" % rank
                         for piece, rank in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1])))
        f.flush()
        yield f.name
