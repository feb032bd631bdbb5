"""The nanochat-style baseline: the algorithms of nanochat's own loaders, in the training
process (`shmloader.demo.baseline`: tiktoken batch encoding on 4 threads, 128 documents a
chunk; best fit with a 1000-document buffer), read with the same tokenizer as shmloader."""
from __future__ import annotations

import pickle

BOS_NAMES = ("<|bos|>", "<|endoftext|>")  # the BOS token shmloader takes by default (README)


def load_tiktoken(path: str):
    """The pickled tiktoken.Encoding at `path` (nanochat's RustBPETokenizer: the Encoding it wraps)."""
    import tiktoken

    with open(path, "rb") as f:
        tok = pickle.load(f)
    tok = getattr(tok, "enc", tok)
    if not isinstance(tok, tiktoken.Encoding):
        raise SystemExit(f"bench: {path} holds a {type(tok).__name__}; the baseline needs a pickled tiktoken.Encoding")
    return tok


def bos_id(enc) -> int:
    for name in BOS_NAMES:
        if name in enc.special_tokens_set:
            return enc.encode_single_token(name)
    raise SystemExit(f"bench: the tokenizer has none of the BOS tokens {BOS_NAMES}")


def loader(files, enc, B: int, T: int, packing: str = "concat"):
    """A nanochat-style loader over `files`: an iterator of `(inputs, targets)`."""
    from shmloader.demo.baseline import nanochat_style_batches, nanochat_style_bestfit_batches

    if packing == "bos_bestfit":
        return nanochat_style_bestfit_batches(files, enc, B, T, bos_id(enc), buffer_size=1000, tokenizer_batch_size=128)
    return nanochat_style_batches(files, enc, B, T, bos_id(enc))
