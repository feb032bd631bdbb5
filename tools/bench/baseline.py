"""The nanochat-style baseline: the algorithms of nanochat's own loaders, in the training
process (`shmloader.demo.baseline`: tiktoken batch encoding on 4 threads, 128 documents a
chunk; best fit with a 1000-document buffer), read with the same tokenizer as shmloader.

`prefetched(gen, depth)`: the same loader moved to a background thread that keeps a queue of
`depth` batches (the approach of nanochat PR #832, what nanochat users are offered instead of
processes): the thread runs the generator, the caller's `next()` takes from the queue. A
stand-in written for the bench, not nanochat's code.
"""
from __future__ import annotations

import pickle
import queue
import threading

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


def on_device(batches, device: str):
    """`batches` moved to `device` as nanochat's loader moves its own: on CUDA each tensor is
    page-locked first and copied without blocking (`pin_memory`, `non_blocking`); elsewhere as
    they come."""
    import torch

    if torch.device(device).type != "cuda":
        yield from batches
        return
    for batch in batches:
        yield tuple(t.pin_memory().to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t
                    for t in batch)


def prefetched(gen, depth: int = 2):
    """`gen`'s items from a daemon thread through a queue of `depth`; an exception in the thread
    is raised at the caller's `next()`. The thread stops when the generator returned is closed."""
    items, stop = queue.Queue(maxsize=depth), threading.Event()

    def fill():
        try:
            for item in gen:
                while not stop.is_set():
                    try:
                        items.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 (handed to the caller)
            items.put((None, exc))

    thread = threading.Thread(target=fill, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, exc = items.get()
            if exc is not None:
                raise exc
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
