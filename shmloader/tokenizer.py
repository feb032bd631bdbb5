"""Tokenizers: resolved in the trainer into a small picklable spec, built once per worker.

Accepted (SPEC §1): a path to a pickled `tiktoken.Encoding` (nanochat's tokenizer.pkl), a
directory holding one, a `tiktoken.Encoding`, or an object with nanochat's tokenizer
interface (`encode(text) -> list[int]`, `get_bos_token_id()`; nanochat's RustBPETokenizer is
unwrapped to its `.enc`). BOS is `<|bos|>`, else `<|endoftext|>`. Documents are encoded as
ordinary text: special-token strings inside a document are not special.
"""
import hashlib
import os
import pickle
from dataclasses import dataclass

import numpy as np

BOS_NAMES = ("<|bos|>", "<|endoftext|>")


@dataclass(frozen=True)
class TokenizerSpec:
    kind: str          # "tiktoken" or "object"
    payload: bytes     # the pickled Encoding or object
    bos: int
    fingerprint: str
    n_vocab: int = 0   # 0 when unknown

    @property
    def dtype(self):
        return np.uint32 if self.kind == "tiktoken" else np.int64


def default_path() -> str:
    base = os.environ.get("NANOCHAT_BASE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nanochat")
    return os.path.join(base, "tokenizer", "tokenizer.pkl")


def resolve(tokenizer) -> TokenizerSpec:
    import tiktoken

    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = _load(os.fspath(tokenizer) if tokenizer is not None else default_path())
    enc = getattr(tokenizer, "enc", None)
    if isinstance(enc, tiktoken.Encoding) and hasattr(tokenizer, "get_bos_token_id"):
        return _tiktoken_spec(enc, int(tokenizer.get_bos_token_id()))
    if isinstance(tokenizer, tiktoken.Encoding):
        return _tiktoken_spec(tokenizer, None)
    if callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "get_bos_token_id", None)):
        payload = pickle.dumps(tokenizer)
        return TokenizerSpec("object", payload, int(tokenizer.get_bos_token_id()),
                             hashlib.sha256(payload).hexdigest()[:16])
    raise TypeError(f"tokenizer must be a path to tokenizer.pkl, a tiktoken.Encoding or an object "
                    f"with encode() and get_bos_token_id(); got {type(tokenizer).__name__}")


def _load(path: str):
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.pkl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tokenizer not found at {path}: pass tokenizer= (a tokenizer.pkl, "
                                f"its directory or a tiktoken.Encoding) or set NANOCHAT_BASE_DIR")
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception as exc:
        raise ValueError(f"{path}: not a pickled tokenizer ({type(exc).__name__}: {exc}); "
                         f"re-create it (nanochat: scripts/tok_train.py)") from exc


def _tiktoken_spec(enc, bos: int | None) -> TokenizerSpec:
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
    for piece, rank in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]):
        h.update(piece)
        h.update(rank.to_bytes(4, "little"))
    return TokenizerSpec("tiktoken", pickle.dumps(enc), int(bos), h.hexdigest()[:16], enc.n_vocab)


def build(spec: TokenizerSpec):
    """The per-document encoder a worker uses: `text -> integer array` (no BOS)."""
    obj = pickle.loads(spec.payload)
    if spec.kind == "tiktoken":
        encode = obj.encode_to_numpy
        return lambda text: encode(text, disallowed_special=())
    return lambda text: np.asarray(obj.encode(text), dtype=np.int64)
