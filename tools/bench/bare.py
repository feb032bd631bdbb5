"""Bare engine processes: what N cores tokenize with nothing else to do, the ceiling of N workers.

`side_by_side(corpus, n, seconds, engine, checkout)` starts `n` single-thread processes that
each read the split's first epoch (up to 64 M characters, so that their mix of documents is the
loader's) into memory, then, once all of them have (a barrier of files), call the loaders' engine as a worker
calls it (`in_chunks`: runs of documents of the worker's CHUNK_CHARS characters a call) for
`seconds`: no loader, no parquet, no trainer. Their total tokens/s is what a loader with `n`
workers is measured against ("of bare").

The engine is built as a worker builds it (`shmloader.data.engine.build`), and the chunk size
is the worker's (`shmloader.procs.worker.CHUNK_CHARS`): both are the package's internals.

`side_by_side(..., read=True)`: bare processes that also read. Process i of n owns row groups
i, i+n, ... of the split (files in order, their row groups in order), and for `seconds` reads
each of its row groups from parquet (`Reader.read_texts`, as a worker reads: the text
column, decompressed, one thread), then tokenizes its documents as above, round after round:
the work a worker cannot avoid, with no ring, coordinator or trainer. Its total is the ceiling
that counts reading ("of bare read").
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
    _ready(cfg)
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < cfg["seconds"]:
        n += encode(texts[:100])
        texts = texts[100:] + texts[:100]
    return {"tokens_per_s": n / (time.perf_counter() - t0), "tokens_per_cpu_s": n / (time.process_time() - c0),
            "docs": len(texts), "engine": encoder.name}


def _ready(cfg: dict) -> None:
    """Wait until all `cfg["n"]` bare processes are ready (a barrier of files)."""
    open(os.path.join(cfg["barrier"], str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(cfg["barrier"])) < cfg["n"]:
        if time.monotonic() > deadline:
            raise SystemExit("bench: the other bare processes never got ready")
        time.sleep(0.001)


def row_groups(files, i: int, n: int) -> list[tuple[int, int]]:
    """`(file, row group)` of process i of n: every n-th row group of the split, from the i-th
    (a split of fewer row groups than processes: all of them, from the (i % count)-th)."""
    import pyarrow.parquet as pq

    every = [(f, g) for f, path in enumerate(files) for g in range(pq.ParquetFile(path).metadata.num_row_groups)]
    return every[i::n] or every[i % len(every):] + every[:i % len(every)]


def bare_read_child(cfg: dict) -> dict:
    """One bare process that reads too (a child): its row groups read from parquet and
    tokenized, round after round, for `cfg["seconds"]` once all `cfg["n"]` are ready."""
    from shmloader.data.source import Reader

    encoder = engine_encoder(cfg["tokenizer"], cfg["engine"])
    encode, source = in_chunks(encoder), Reader(cfg["files"])
    mine = row_groups(cfg["files"], cfg["i"], cfg["n"])
    counts = {f: source.row_counts(f) for f in {f for f, _ in mine}}
    encode(["warm up"])  # the engine's first call, before the clock
    _ready(cfg)
    n = rgs = docs = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < cfg["seconds"]:
        f, g = mine[rgs % len(mine)]
        texts = [t for t in source.read_texts(f, g, 0, counts[f][g]) if t is not None]
        source._last = None  # noqa: SLF001 (read again next round, as a worker would read a new row group)
        n += encode(texts) if texts else 0
        rgs, docs = rgs + 1, docs + len(texts)
    return {"tokens_per_s": n / (time.perf_counter() - t0), "tokens_per_cpu_s": n / (time.process_time() - c0),
            "row_groups": rgs, "docs": docs, "engine": encoder.name}


def side_by_side(files, tokenizer: str, n: int, seconds: float, engine: str, checkout, read: bool = False) -> dict:
    """`n` bare processes side by side for `seconds` (`read`: reading their row groups too):
    their tokens/s in total and each."""
    with tempfile.TemporaryDirectory(prefix="shmloader-bare-") as barrier:
        cfg = {"files": files, "tokenizer": tokenizer, "engine": engine, "seconds": seconds, "n": n,
               "barrier": barrier}
        target = "bare:bare_read_child" if read else "bare:bare_child"
        got = [children.result(p, "bare engine process")
               for p in [children.start(target, dict(cfg, i=i), checkout) for i in range(n)]]
    rates = [g["tokens_per_s"] for g in got]
    return {"kind": "bare_read" if read else "bare", "workers": n, "processes": n, "seconds": seconds,
            "tokens_per_s": sum(rates), "per_process": rates, "docs": got[0]["docs"], "engine": got[0]["engine"],
            "tokens_per_cpu_s": sum(g["tokens_per_cpu_s"] for g in got) / n}  # a process's, per second of its CPU
