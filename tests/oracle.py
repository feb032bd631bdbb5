"""The obvious single-process implementation of the stream (docs/contract.md §2): the tests' oracle.

`concat_windows` packs the canonical document order (`documents`, plain nested loops,
independent of the loader's own order) with a Python list, one window of B*T+1 tokens at a
time, and reports the same canonical position as the loader's state (the document holding
the next token and how many of its tokens were already used). `bestfit_rows` plans best-fit
rows with `plan_batch_scan`, nanochat's linear scans; `nanochat_keys` says what nanochat's own
loaders yield as their state. Slow on purpose: no shared memory, no
processes, nothing clever.
"""
import itertools

import numpy as np
import pyarrow.parquet as pq

from shmloader.demo.baseline import documents
from shmloader.packing.planner import BatchPlan, Drained


def concat_windows(files, encode, bos, B, T, rank=0, world=1, cursor=None, skip=0, docs=None):
    """Yield `(window, position)`: int64 windows of B*T+1 tokens and the position after each,
    `(epoch, file, rg, doc, skip)`. `cursor` is `(epoch, file, rg, doc)`. `docs`, if given,
    replaces the canonical order from the cursor: `(meta, text, skip)` of each document, its
    first `skip` tokens already read elsewhere (an elastic resume's units: tests/loader/test_elastic.py)."""
    epoch, file, rg, doc = cursor or (1, 0, rank, 0)
    if docs is None:
        docs = ((meta, text, 0) for meta, text in documents(files, rank, world, epoch, file, rg, doc))
    need = B * T + 1
    buffer = []       # [(meta, tokens, tokens dropped before them)] of documents not fully used
    used = skip       # tokens of buffer[0] already used
    ended = False     # `docs` ran out (a mixture whose sources all ended): the complete windows left, then stop
    while True:
        while not ended and sum(len(t) for _, t, _ in buffer) - used < need + 1:
            try:
                meta, text, dropped = next(docs)
            except StopIteration:
                ended = True
                break
            if text is not None:
                buffer.append((meta, ([bos] + list(encode(text)))[dropped:], dropped))
        if ended and sum(len(t) for _, t, _ in buffer) - used < need:
            return
        window = []
        while len(window) < need:
            meta, tokens, _ = buffer[0]
            take = tokens[used:used + need - len(window)]
            window.extend(take)
            used += len(take)
            if used == len(tokens):
                buffer.pop(0)
                used = 0
        if not buffer:  # the stream's last token ended this window
            yield np.array(window, dtype=np.int64), None
            return
        (e, f, g, d), _, dropped = buffer[0]
        yield np.array(window, dtype=np.int64), (e, f, g, d, used + dropped)


def _chunks(files, rank, world, cursor, chunk_docs, docs=None):
    """Yield `((epoch, file, rg, row_end), [(row, text), ...])`: up to `chunk_docs`
    consecutive rows of one row group (nanochat's tokenizer batches); `docs` replaces the
    canonical order (as `concat_windows`'s, without skips)."""
    key, rows = None, []
    docs = documents(files, rank, world, *cursor) if docs is None else ((m, t) for m, t, _ in docs)
    for (e, f, g, row), text in docs:
        if rows and ((e, f, g) != key or len(rows) == chunk_docs):
            yield key + (rows[-1][0] + 1,), rows
            rows = []
        key = (e, f, g)
        rows.append((row, text))


def bestfit_rows(files, encode, bos, B, T, buffer_size=1000, chunk_docs=128, rank=0, world=1,
                 cursor=None, runs=(), docs=None):
    """Yield `(rows, position)`: (B, T+1) int64 best-fit rows, planned by the scan oracle
    `plan_batch_scan`, and the position after them: `((epoch, file, rg, doc), runs)`,
    where doc is the end of the last chunk read and runs the buffer
    `[[epoch, file, rg, row, count], ...]` in arrival order. Resumes from `cursor` and `runs`."""
    cursor = tuple(cursor or (1, 0, rank, 0))
    meta, buffer, next_id = {}, [], 0
    for e, f, g, row, count in runs:
        texts = pq.ParquetFile(files[f]).read_row_group(g, columns=["text"]).column("text").to_pylist()
        for r in range(row, row + count):
            meta[next_id] = ((e, f, g, r), [bos] + list(encode(texts[r])))
            buffer.append([next_id, len(meta[next_id][1])])
            next_id += 1
    chunks = _chunks(files, rank, world, cursor, chunk_docs, docs)
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


def nanochat_keys(files, encode, bos, B, T, packing, rank=0, world=1, chunk_docs=128, buffer_size=1000):
    """Yield the state nanochat's own loaders yield with each batch, `(pq_idx, rg_idx, epoch)`:
    by their rule, the row group of the last tokenizer batch (up to `chunk_docs` rows of one row
    group, this rank's row groups in turn) read when the batch was made. Concat (the original
    loader, each batch B*T+1 tokens of the stream) reads them until its buffer holds the batch:
    the one holding the batch's last token. Best fit tops its buffer up to `buffer_size`
    documents, a tokenizer batch at a time, before every placement (`bestfit_rows`)."""
    if packing == "bos_bestfit":
        for _, ((epoch, file, rg, _), _) in bestfit_rows(files, encode, bos, B, T, buffer_size, chunk_docs,
                                                         rank, world):
            yield file, rg, epoch
        return
    need = B * T + 1
    read, end = 0, need  # tokens read; the end of the batch being made
    for (epoch, file, rg, _), text in documents(files, rank, world):
        if text is None:
            continue
        read += 1 + len(encode(text))
        while read >= end:
            yield file, rg, epoch
            end += need


def _runs(coords) -> list[list[int]]:
    runs = []
    for e, f, g, row in coords:
        if runs and runs[-1][:3] == [e, f, g] and runs[-1][3] + runs[-1][4] == row:
            runs[-1][4] += 1
        else:
            runs.append([e, f, g, row, 1])
    return runs


def plan_batch_scan(buffer: list, next_chunk, B: int, row_len: int,
                    buffer_size: int) -> BatchPlan:
    """The reference: nanochat's linear scans over `buffer`, a list of [doc_id, length] in
    arrival order that this call mutates and the next call continues from. A `next_chunk` that
    raises `Drained` has no document left: the buffer is topped up no more, and a row it cannot
    fill raises `Drained` (the batch is not made)."""
    rows, offs, ids, ntok, cropped = [], [], [], [], 0
    drained = False
    for r in range(B):
        pos = 0
        while pos < row_len:
            while len(buffer) < buffer_size and not drained:
                try:
                    chunk = next_chunk()
                except Drained:
                    drained = True
                    break
                chunk_ids, chunk_lengths = (np.asarray(a, dtype=np.int64).ravel() for a in chunk)
                for doc_id, length in zip(chunk_ids.tolist(), chunk_lengths.tolist()):
                    buffer.append([doc_id, length])
            if not buffer:
                raise Drained
            space = row_len - pos
            best, best_len = -1, 0
            for i, (_, length) in enumerate(buffer):  # ">" keeps the earliest on ties
                if length <= space and length > best_len:
                    best, best_len = i, length
            if best < 0:  # nothing fits: the shortest; min keeps the earliest on ties
                best = min(range(len(buffer)), key=lambda i: buffer[i][1])
            doc_id, length = buffer.pop(best)
            n = min(length, space)
            rows.append(r)
            offs.append(pos)
            ids.append(doc_id)
            ntok.append(n)
            cropped += length - n
            pos += n
    return _as_plan(rows, offs, ids, ntok, cropped)


def _as_plan(rows, offs, ids, ntok, cropped) -> BatchPlan:
    as64 = lambda xs: np.array(xs, dtype=np.int64)  # noqa: E731
    return BatchPlan(as64(rows), as64(offs), as64(ids), as64(ntok), int(cropped))


def mixed_documents(sources: dict, encode, bos, mixture, window: int, rank=0, world=1, point=None, batch=0,
                    log=None, stage_batch=None, cap=None, streams=None, mixer=None):
    """Yield `((epoch, file, rg, row), text, 0)`: the documents of a mixture (docs/design.md
    "Mixtures"), from each source's `documents` and the mixing rule, for `concat_windows(docs=...)`.
    `sources`: name -> its split's files. `point`: a state's `mixture.point` (parsed) to resume
    from at batch `batch`: every source from its document, the mixer from its counts, the cut
    document first (concat_windows' `skip` drops its tokens before the point). `log`, a list:
    `(source, tokens, (epoch, file, rg, row))` of each document is appended to it.
    `stage_batch()`: the batch whose stage the next pick is in (best fit's: the batch being
    planned), instead of the batch its first token lands in. `cap`: the mixer counts a document's
    tokens up to it (best fit's: a row). `streams`:
    name -> that source's `((epoch, file, rg, row), text)` in its order (a new rank's units after a
    change of world size, then its plain epochs), instead of its `documents` from the point.
    `mixer`: the mixer to pick with (None: one made from the point at the first pick)."""
    from shmloader.data.mixture import Mixer

    starts = {name: (1, 0, rank, 0) for name in sources}
    skip, first = 0, None
    if mixer is None:
        mixer = Mixer(mixture, batch) if point is None else Mixer.resume(mixture, point["mixer"], batch).mixer
    if point is not None:
        starts.update({name: tuple(p) for name, p in point["sources"].items() if name in sources})
        if point["skip"] and point["source"] in sources:
            skip, first = point["skip"], point["source"]
    streams = streams or {name: documents(files, rank, world, *starts[name], epochs=mixture.max_epochs.get(name))
                          for name, files in sources.items()}
    ahead = {}

    def peek(name):
        while name not in ahead:
            meta, text = next(streams[name])
            if text is not None:
                ahead[name] = (meta, text, 1 + len(encode(text)))
        return ahead[name]

    def live(name) -> bool:
        try:
            peek(name)
            return True
        except StopIteration:  # its max_epochs are read: it ends (with no source left, the mixer is over)
            mixer.end(name)
            return False

    tokens = 0
    at = stage_batch or (lambda: batch + (tokens - skip) // window)
    while True:
        mixer.enter(at())
        while not all(live(n) for n in ([first] if first is not None else list(mixer.shares()))):
            pass
        if first is None and mixer.over() is not None:  # nothing is left to read
            return
        if first is not None:
            name, first = first, None
        else:
            name = mixer.choose(at(), lambda n: min(peek(n)[2], cap or peek(n)[2])).source
        meta, text, n = peek(name)
        del ahead[name]
        mixer.took(name, min(n, cap or n), meta[0])
        tokens += n
        if log is not None:
            log.append((name, n, meta))
        yield meta, text, 0


def mixed_bestfit_rows(sources: dict, encode, bos, mixture, B, T, buffer_size=1000, chunk_docs=128, point=None,
                       batch=0, log=None, placed=None, streams=None):
    """Yield `(rows, buffer)`: (B, T+1) best-fit rows over a mixture (docs/design.md "Mixtures"),
    planned by `plan_batch_scan` over chunks of `mixed_documents`, each up to the first document
    that ends one of its source's own chunks (its source's next document is in another
    `chunk_docs` rows of its row group), `chunk_docs` documents at most, each picked when a plan
    asks for it (a schedule's stage is the batch being planned); and
    the buffer after them, `[[source, epoch, file, rg, row, count], ...]` in arrival order.
    `point`: a state's `mixture.point` (parsed), with its `"buffer"`, to resume from at `batch`.
    `placed`, a dict: the tokens placed in the rows of each source are added to it. `streams`: as
    `mixed_documents`'."""
    from shmloader.data.mixture import Mixer

    planning = [batch]
    read = [] if log is None else log
    # made now, not at the stream's first pick: a resumed buffer may plan batches before it
    mixer = Mixer(mixture, batch) if point is None else Mixer.resume(mixture, point["mixer"], batch).mixer
    docs = mixed_documents(sources, encode, bos, mixture, 1, point=point, batch=batch, log=read,
                           stage_batch=lambda: planning[0], cap=T + 1, streams=streams, mixer=mixer)
    meta, buffer = {}, []
    from shmloader.packing.mixbestfit import buffer_entries

    for name, e, f, g, row, count in buffer_entries(point):
        texts = pq.ParquetFile(sources[name][f]).read_row_group(g, columns=["text"]).column("text").to_pylist()
        for r in range(row, row + count):
            meta[len(meta)] = ((name, e, f, g, r), [bos] + list(encode(texts[r])))
            buffer.append([len(meta) - 1, len(meta[len(meta) - 1][1])])
    next_id = len(meta)

    texts = {}

    def ends_chunk(name, f, g, row) -> bool:
        """Whether the rows of `name`'s row group after `row` up to the end of its chunk (rows
        `[k·chunk_docs, (k+1)·chunk_docs)` of the row group) are nulls: its next document is in
        another chunk, and the mixed chunk ends here."""
        if (name, f, g) not in texts:
            group = pq.ParquetFile(sources[name][f]).read_row_group(g, columns=["text"])
            texts[name, f, g] = group.column("text").to_pylist()
        rows = texts[name, f, g]
        return all(t is None for t in rows[row + 1:(row // chunk_docs + 1) * chunk_docs])

    def next_chunk():
        nonlocal next_id
        ids, lengths = [], []
        for (e, f, g, row), text, _ in docs:  # up to the document that ends its source's chunk, or chunk_docs
            meta[next_id] = ((read[-1][0], e, f, g, row), [bos] + list(encode(text)))
            ids.append(next_id)
            lengths.append(len(meta[next_id][1]))
            next_id += 1
            if len(ids) == chunk_docs or ends_chunk(read[-1][0], f, g, row):
                break
        if not ids:  # the mix ended: the buffer is placed while it fills the rows
            raise Drained
        return np.array(ids, dtype=np.int64), np.array(lengths, dtype=np.int64)

    while True:
        try:
            plan = plan_batch_scan(buffer, next_chunk, B, T + 1, buffer_size)
        except Drained:
            return
        rows = np.zeros((B, T + 1), dtype=np.int64)
        this = {}
        for r, off, doc, n in zip(plan.row, plan.row_offset, plan.doc_id, plan.n_tokens):
            (name, *_), tokens = meta.pop(int(doc))
            rows[r, off:off + n] = tokens[:n]
            this[name] = this.get(name, 0) + int(n)
        for name, n in this.items():
            if placed is not None:
                placed[name] = placed.get(name, 0) + n
        mixer.settle(this)  # the mixer counts what was delivered
        planning[0] += 1
        runs = []
        for name, e, f, g, row in (meta[d][0] for d, _ in buffer):
            if runs and runs[-1][:4] == [name, e, f, g] and runs[-1][4] + runs[-1][5] == row:
                runs[-1][5] += 1
            else:
                runs.append([name, e, f, g, row, 1])
        yield rows, runs
