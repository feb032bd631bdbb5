"""The obvious single-process implementation of SPEC §2: the tests' oracle, the tools' baseline.

`documents` walks the canonical order with plain nested loops (independently of plan.py);
`concat_windows` packs it with a Python list, one window of B*T+1 tokens at a time, and
reports the same canonical position as the loader's state (the document holding the next
token and how many of its tokens were already used). `nanochat_style_batches` is the
baseline that the benchmarks compare against: the algorithm of the loader nanochat users
run today (tiktoken batch encoding on `tokenizer_threads` threads in the training process, a
deque of tokens popped one at a time, one tensor per batch), written for this project.
Slow on purpose: no shared memory, no processes, nothing clever.
"""
from collections import deque

import numpy as np
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


def concat_windows(files, encode, bos, B, T, rank=0, world=1, cursor=None, skip=0):
    """Yield `(window, position)`: int64 windows of B*T+1 tokens and the position after each,
    `(epoch, file, rg, doc, skip)`. `cursor` is `(epoch, file, rg, doc)`."""
    epoch, file, rg, doc = cursor or (1, 0, rank, 0)
    docs = documents(files, rank, world, epoch, file, rg, doc)
    need = B * T + 1
    buffer = []       # [(meta, tokens)] of documents not fully used
    used = skip       # tokens of buffer[0] already used
    while True:
        while sum(len(t) for _, t in buffer) - used < need + 1:
            meta, text = next(docs)
            if text is not None:
                buffer.append((meta, [bos] + list(encode(text))))
        window = []
        while len(window) < need:
            meta, tokens = buffer[0]
            take = tokens[used:used + need - len(window)]
            window.extend(take)
            used += len(take)
            if used == len(tokens):
                buffer.pop(0)
                used = 0
        (e, f, g, d), _ = buffer[0]
        yield np.array(window, dtype=np.int64), (e, f, g, d, used)


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


def _chunks(files, rank, world, cursor, chunk_docs):
    """Yield `((epoch, file, rg, row_end), [(row, text), ...])`: up to `chunk_docs`
    consecutive rows of one row group (nanochat's tokenizer batches)."""
    key, rows = None, []
    for (e, f, g, row), text in documents(files, rank, world, *cursor):
        if rows and ((e, f, g) != key or len(rows) == chunk_docs):
            yield key + (rows[-1][0] + 1,), rows
            rows = []
        key = (e, f, g)
        rows.append((row, text))


def bestfit_rows(files, encode, bos, B, T, buffer_size=1000, chunk_docs=128, rank=0, world=1,
                 cursor=None, runs=()):
    """Yield `(rows, position)`: (B, T+1) int64 best-fit rows, planned by the scan oracle
    `bestfit.plan_batch_scan`, and the position after them: `((epoch, file, rg, doc), runs)`,
    where doc is the end of the last chunk read and runs the buffer
    `[[epoch, file, rg, row, count], ...]` in arrival order. Resumes from `cursor` and `runs`."""
    from shmloader.bestfit import plan_batch_scan

    cursor = tuple(cursor or (1, 0, rank, 0))
    meta, buffer, next_id = {}, [], 0
    for e, f, g, row, count in runs:
        texts = pq.ParquetFile(files[f]).read_row_group(g, columns=["text"]).column("text").to_pylist()
        for r in range(row, row + count):
            meta[next_id] = ((e, f, g, r), [bos] + list(encode(texts[r])))
            buffer.append([next_id, len(meta[next_id][1])])
            next_id += 1
    chunks = _chunks(files, rank, world, cursor, chunk_docs)
    last_end = cursor

    def next_chunk():
        nonlocal last_end, next_id
        last_end, rows = next(chunks)
        ids, lengths = [], []
        for (e, f, g, _), text, row in ((last_end, t, r) for r, t in rows):
            if text is not None:
                meta[next_id] = ((e, f, g, row), [bos] + list(encode(text)))
                ids.append(next_id)
                lengths.append(len(meta[next_id][1]))
                next_id += 1
        return np.array(ids, dtype=np.int64), np.array(lengths, dtype=np.int64)

    while True:
        plan = plan_batch_scan(buffer, next_chunk, B, T + 1, buffer_size)
        rows = np.zeros((B, T + 1), dtype=np.int64)
        for r, off, doc, n in zip(plan.row, plan.row_offset, plan.doc_id, plan.n_tokens):
            rows[r, off:off + n] = meta.pop(int(doc))[1][:n]
        yield rows, (last_end, _runs([meta[d][0] for d, _ in buffer]))


def _runs(coords) -> list[list[int]]:
    runs = []
    for e, f, g, row in coords:
        if runs and runs[-1][:3] == [e, f, g] and runs[-1][3] + runs[-1][4] == row:
            runs[-1][4] += 1
        else:
            runs.append([e, f, g, row, 1])
    return runs


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
