"""Bare engine processes: what N cores tokenize with nothing else to do, the ceiling of N workers.

`side_by_side(corpus, n, seconds, engine, checkout)` starts `n` single-thread processes that
each read the split's first epoch (up to 64 M characters, so that their mix of documents is the
loader's) into memory, then, once all of them have (a barrier of files), call the loaders' engine as a worker
calls it (`in_chunks`: runs of documents of the worker's CHUNK_CHARS characters a call) for
`seconds`: no loader, no parquet, no trainer. Their total tokens/s is what a loader with `n`
workers is measured against ("of bare").

The engine is built as a worker builds it (`shmloader.data.engine.build`), and the chunk size
is the worker's (`shmloader.procs.worker.CHUNK_CHARS`): both are the package's internals.
"""
from __future__ import annotations

import os
import tempfile
import time

from tools.bench import children

MAX_CHARS = 64e6  # a bare process's documents: its split's first epoch, up to this many characters


def engine_encoder(tokenizer_path: str, engine: str):
    """The encoder a loader worker uses with `engine`, built at once (`.name`: "fastokens" or "tiktoken")."""
    from shmloader.data import engine as enginemod
    from shmloader.data import tokenizer as tokmod

    return enginemod.build(tokmod.resolve(tokenizer_path), engine)


def in_chunks(encoder):
    """`texts -> number of tokens`, calling the engine as a worker does: `encode_batch` on runs
    of documents of about the worker's CHUNK_CHARS characters."""
    from shmloader.procs.worker import CHUNK_CHARS

    def run(texts) -> int:
        n, start, size = 0, 0, 0
        for i, text in enumerate(texts):
            size += len(text)
            if size >= CHUNK_CHARS or i == len(texts) - 1:
                n += len(encoder.encode_batch(texts[start:i + 1])[0])
                start, size = i + 1, 0
        return n
    return run


def split_texts(files, max_chars: float = MAX_CHARS) -> list[str]:
    """The split's documents in order (nulls left out), its first epoch up to `max_chars` characters."""
    from shmloader.demo.baseline import documents

    texts, chars = [], 0
    for _, text in documents(files, epochs=1):
        if text is not None:
            texts.append(text)
            chars += len(text)
        if chars >= max_chars:
            break
    return texts


def bare_child(cfg: dict) -> dict:
    """One bare process (a child): once all `cfg["n"]` are ready, tokenize for `cfg["seconds"]`."""
    encoder = engine_encoder(cfg["tokenizer"], cfg["engine"])
    encode, texts = in_chunks(encoder), split_texts(cfg["files"])
    encode(texts[:1])  # the engine's first call, before the clock
    open(os.path.join(cfg["barrier"], str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(cfg["barrier"])) < cfg["n"]:
        if time.monotonic() > deadline:
            raise SystemExit("bench: the other bare processes never got ready")
        time.sleep(0.001)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < cfg["seconds"]:
        n += encode(texts[:100])
        texts = texts[100:] + texts[:100]
    return {"tokens_per_s": n / (time.perf_counter() - t0), "docs": len(texts), "engine": encoder.name}


def side_by_side(files, tokenizer: str, n: int, seconds: float, engine: str, checkout) -> dict:
    """`n` bare processes side by side for `seconds`: their tokens/s in total and each."""
    with tempfile.TemporaryDirectory(prefix="shmloader-bare-") as barrier:
        cfg = {"files": files, "tokenizer": tokenizer, "engine": engine, "seconds": seconds, "n": n,
               "barrier": barrier}
        got = [children.result(p, "bare engine process")
               for p in [children.start("bare:bare_child", cfg, checkout) for _ in range(n)]]
    rates = [g["tokens_per_s"] for g in got]
    return {"kind": "bare", "workers": n, "processes": n, "seconds": seconds, "tokens_per_s": sum(rates),
            "per_process": rates, "docs": got[0]["docs"], "engine": got[0]["engine"]}
