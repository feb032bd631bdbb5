"""The loader nanochat users run today, written for this project: the demo's and the benches'
baseline.

`nanochat_style_batches` is the algorithm of nanochat's original loader (tiktoken batch
encoding on `tokenizer_threads` threads in the training process, a deque of tokens popped one
at a time, one tensor per batch); `nanochat_style_bestfit_batches` that of its BOS-aligned
best-fit loader. In its first epoch the first yields the stream shmloader's `concat` packing
defines (docs/contract.md §2), so the demo checks shmloader's batches against it.
`documents` walks the canonical document order with plain nested loops (independently of the
loader's own order), for these baselines, the tests' oracle and the tools. Slow on purpose:
no shared memory, no processes, nothing clever.
"""
from collections import deque

import pyarrow.parquet as pq


def documents(files, rank=0, world=1, epoch=1, file=0, rg=None, doc=0, epochs=None):
    """Yield `((epoch, file, rg, row), text_or_None)` in canonical order, from a cursor."""
    rg = rank if rg is None else rg
    while epochs is None or epoch < epochs + 1:
        for f in range(file, len(files)):
            pf = pq.ParquetFile(files[f])
            for g in range(rg, pf.num_row_groups, world):
                texts = pf.read_row_group(g, columns=["text"]).column("text").to_pylist()
                for row in range(doc, len(texts)):
                    yield (epoch, f, g, row), texts[row]
                doc = 0
            rg = rank
        epoch, file = epoch + 1, 0


def nanochat_style_batches(files, enc, B, T, bos, tokenizer_threads=4, tokenizer_batch_size=128):
    """Yield `(inputs, targets)` torch tensors the way today's nanochat loader makes them."""
    import torch

    need = B * T + 1
    tokens = deque()
    texts = (text for _, text in documents(files))
    while True:
        while len(tokens) < need:
            chunk = [t for t in (next(texts) for _ in range(tokenizer_batch_size)) if t is not None]
            for ids in enc.encode_ordinary_batch(chunk, num_threads=tokenizer_threads):
                tokens.append(bos)
                tokens.extend(ids)
        window = torch.tensor([tokens.popleft() for _ in range(need)], dtype=torch.long)
        yield window[:-1].view(B, T), window[1:].view(B, T)


def nanochat_style_bestfit_batches(files, enc, B, T, bos, buffer_size=1000, tokenizer_threads=4,
                                   tokenizer_batch_size=128):
    """Yield `(inputs, targets)` the way nanochat's BOS-aligned best-fit loader makes them: a
    buffer of `buffer_size` tokenized documents (refilled `tokenizer_batch_size` documents at a
    time, batch-encoded on threads), each row filled with the largest document that fits, else
    the shortest one cropped. The baseline for first-batch latency, not the tests' oracle."""
    import torch

    texts = (text for _, text in documents(files))
    buffer = []

    def refill():
        chunk = [t for t in (next(texts) for _ in range(tokenizer_batch_size)) if t is not None]
        buffer.extend([bos] + ids for ids in enc.encode_ordinary_batch(chunk, num_threads=tokenizer_threads))

    while True:
        rows = torch.empty((B, T + 1), dtype=torch.long)
        for r in range(B):
            pos = 0
            while pos < T + 1:
                while len(buffer) < buffer_size:
                    refill()
                room = T + 1 - pos
                best, best_len = -1, 0
                for i, doc in enumerate(buffer):
                    if best_len < len(doc) <= room:
                        best, best_len = i, len(doc)
                if best < 0:
                    best = min(range(len(buffer)), key=lambda i: len(buffer[i]))
                doc = buffer.pop(best)[:room]
                rows[r, pos:pos + len(doc)] = torch.tensor(doc, dtype=torch.long)
                pos += len(doc)
        yield rows[:, :-1], rows[:, 1:]
