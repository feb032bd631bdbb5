"""The demo: shmloader next to today's nanochat loader, on data built offline, in one run.

    python -m shmloader.demo [--out-dir ./demo_data] [--workers 2] [--batches 200]

1. Data (cached in `--out-dir`, nanochat's layout so `NANOCHAT_BASE_DIR=demo_data` works):
   the text that ships with Python (`corpus.stdlib_texts`: ~12.6 MB on CPython 3.11) cut at
   blank lines into ~4000-character documents (~1000 tokens each, like web text; 2968
   documents) as 4 parquet shards with row groups of 256 documents in `base_data/`
   (train = the first 3 files), and a byte-level BPE of `--vocab-size` tokens in
   `tokenizer/tokenizer.pkl`. Building takes a few seconds; a second run reuses it
   (`demo.json` records what was built and for which Python). A directory holding shards or a
   tokenizer that the demo did not write is refused, never overwritten.
2. The same B x T batches from the same files, one loader after the other: `ShmLoader` on the
   CPU with `--workers` worker processes, then `baseline.nanochat_style_batches` (4 tokenizer
   threads, chunks of 128 documents, all in the training process).
3. A table (docs/contract.md §5): tokens read per second (B*T+1 per batch, counted from the first batch
   to the last), the training process's CPU time per batch (getrusage RUSAGE_SELF, user +
   system; the baseline tokenizes in that process, shmloader does not), and the wall time
   from constructing the loader to its first batch (torch already imported).
4. The first `--verify` shmloader batches are compared token for token with the baseline's
   first batches (one process: every document tokenized with tiktoken, concatenated, cut
   into windows: the stream of docs/contract.md §2); the run fails (exit 1) if any differs.
5. Exact resume: a loader's state after a few batches goes through JSON into a new loader
   with another worker count, whose batches must equal the uninterrupted run's (exit 1 if not).

B=16, T=2048 by default, as the README's figures. `prepare_data` is reused by the tools
(tools/bench/, tools/gpu_check.py, ...).
"""
from __future__ import annotations

import argparse
import json
import pickle
import resource
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from . import corpus
from ..cores import usable

NUM_FILES = 4
ROW_GROUP_DOCS = 256
DOC_CHARS = 4000  # documents of ~1000 tokens, like web text
MANIFEST = "demo.json"
OWNER = "shmloader.demo"


@dataclass(frozen=True)
class DemoData:
    data_dir: Path        # the parquet shards (pass as data=)
    tokenizer_path: Path  # the pickled tiktoken.Encoding (pass as tokenizer=)
    n_docs: int
    n_files: int
    vocab_size: int       # n_vocab of the tokenizer (<= the requested size)


def _corpus_key(num_files: int, row_group_docs: int) -> dict:
    return {"corpus": "stdlib", "python": sys.version, "stdlib": sysconfig.get_paths()["stdlib"],
            "num_files": num_files, "row_group_docs": row_group_docs, "doc_chars": DOC_CHARS,
            "format": corpus.SHARD_FORMAT}


def prepare_data(out_dir, vocab_size: int = 4096, *, num_files: int = NUM_FILES,
                 row_group_docs: int = ROW_GROUP_DOCS, log=print) -> DemoData:
    """Write (or reuse) the stdlib corpus shards and a trained tokenizer under `out_dir`."""
    out_dir = Path(out_dir)
    data_dir, tok_path = out_dir / "base_data", out_dir / "tokenizer" / corpus.TOKENIZER_FILENAME
    manifest_path = out_dir / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    key = _corpus_key(num_files, row_group_docs)
    shards_ok = manifest.get("shards") == key and len(list(data_dir.glob("*.parquet"))) == num_files
    tok_ok = shards_ok and manifest.get("tokenizer", {}).get("requested") == vocab_size and tok_path.is_file()
    if shards_ok and tok_ok:
        return DemoData(data_dir, tok_path, manifest["n_docs"], num_files, manifest["tokenizer"]["n_vocab"])
    ours = manifest.get("owner") == OWNER or "shards" in manifest
    if not ours and (any(data_dir.glob("*.parquet")) or tok_path.exists()):
        raise ValueError(f"{out_dir} holds parquet shards or a tokenizer that the demo did not write "
                         f"(no {MANIFEST} of ours): pick an empty or new --out-dir")
    corpus.require_rustbpe()  # before any work: the tokenizer is to be trained
    started = time.perf_counter()
    texts = corpus.split_documents(corpus.stdlib_texts(), DOC_CHARS)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not shards_ok:
        manifest_path.write_text(json.dumps({"owner": OWNER}) + "\n")  # ours, even if interrupted
        for old in data_dir.glob("*.parquet"):
            old.unlink()
        log(f"writing {len(texts)} documents that ship with Python as {num_files} parquet files "
            f"(row groups of {row_group_docs} documents) into {data_dir} ...")
        corpus.write_shards(texts, data_dir, num_files=num_files, row_group_size=row_group_docs)
    log(f"training a {vocab_size}-token BPE tokenizer on them ...")
    enc = corpus.train_tokenizer(texts, vocab_size)
    corpus.save_tokenizer(enc, tok_path)
    manifest = {"owner": OWNER, "shards": key, "n_docs": len(texts),
                "tokenizer": {"requested": vocab_size, "n_vocab": enc.n_vocab}}
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"data ready in {time.perf_counter() - started:.1f} s (cached for the next run)")
    return DemoData(data_dir, tok_path, len(texts), num_files, enc.n_vocab)


def load_encoding(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def cpu_seconds() -> float:
    """User + system CPU time of this process, all its threads (docs/contract.md §5)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class Timing:
    name: str
    first_batch_s: float
    tokens_per_s: float
    cpu_us_per_batch: float
    batches: int


def time_loader(name: str, make, n_batches: int, window: int, keep: int = 0, progress=True):
    """Construct with `make()`, take one batch (first-batch latency), then time `n_batches`
    more. Returns the Timing and the first `keep` batches (the loader is closed)."""
    started = time.perf_counter()
    it = make()
    try:
        first = next(it)
        first_s = time.perf_counter() - started
        kept = [first][:keep]
        c0, t0 = cpu_seconds(), time.perf_counter()
        for _ in range(n_batches):
            batch = next(it)
            if len(kept) < keep:
                kept.append(batch)
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    finally:
        it.close()
    return Timing(name, first_s, n_batches * window / wall, cpu / n_batches * 1e6, n_batches), kept


def verify(ours, theirs) -> int:
    """Compare shmloader's batches with the baseline's, token for token; return how many
    matched, raise if one differs."""
    import torch

    for k, ((x, y), (bx, by)) in enumerate(zip(ours, theirs)):
        if not (torch.equal(x, bx) and torch.equal(y, by)):
            raise AssertionError(f"batch {k} differs from the nanochat-style baseline's batch {k}")
    return min(len(ours), len(theirs))


def resume_round_trip(make, workers: int, save_after: int = 5, follow: int = 8) -> str:
    """Save a loader's state after `save_after` batches, through JSON, resume it in a new loader
    with another worker count, and compare `follow` batches with the uninterrupted run's."""
    import numpy as np

    with make(workers) as loader:
        for _ in range(save_after):
            next(loader)
        saved = json.dumps(loader.state_dict())  # as a checkpoint stores it
        run = [next(loader) for _ in range(follow)]
    other = 1 if workers > 1 else 2
    with make(other, resume_state=json.loads(saved)) as loader:
        for k, (x, y) in enumerate(run):
            got_x, got_y = next(loader)
            if not (np.array_equal(got_x.numpy(), x.numpy()) and np.array_equal(got_y.numpy(), y.numpy())):
                raise AssertionError(f"resumed batch {save_after + k} differs from the uninterrupted run's")
    return (f"resume verified: the state after batch {save_after - 1} ({len(saved):,} bytes of JSON) "
            f"resumed in a new loader with {other} worker{'s' * (other > 1)} instead of {workers}; "
            f"its {follow} batches equal the uninterrupted run's batches {save_after}-{save_after + follow - 1}")


def _si(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e5 else f"{x / 1e3:.1f} k"


def _compare(ours: float, theirs: float, better_high: bool, less: str = "") -> str:
    """`ours` against `theirs` in words: '1.53x faster', '7.0x slower', '35.6x less'."""
    ratio = ours / theirs if better_high else theirs / ours
    if less:
        return f"{ratio:.1f}x {less}" if ratio >= 1 else f"{1 / ratio:.1f}x more"
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"


def format_table(base: Timing, shm: Timing) -> str:
    rows = [(base.name, _si(base.tokens_per_s), f"{base.cpu_us_per_batch:,.0f}", f"{base.first_batch_s * 1e3:,.0f}"),
            (shm.name, _si(shm.tokens_per_s), f"{shm.cpu_us_per_batch:,.0f}", f"{shm.first_batch_s * 1e3:,.0f}"),
            ("shmloader against the baseline", _compare(shm.tokens_per_s, base.tokens_per_s, True),
             _compare(shm.cpu_us_per_batch, base.cpu_us_per_batch, False, less="less"),
             _compare(shm.first_batch_s, base.first_batch_s, False))]
    head = ("loader", "tokens/s", "trainer CPU us/batch", "first batch ms")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    line = lambda r: "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))
    return "\n".join([line(head), "-" * (sum(widths) + 6)] + [line(r) for r in rows])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shmloader.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", type=Path, default=Path("demo_data"),
                   help="where the shards and tokenizer are built and cached (directory; default ./demo_data)")
    p.add_argument("--batch-size", type=int, default=16, help="B, rows per batch (rows; default 16)")
    p.add_argument("--seq-len", type=int, default=2048, help="T, tokens per row (tokens; default 2048)")
    p.add_argument("--workers", type=int, default=2, help="shmloader worker processes (processes; default 2)")
    p.add_argument("--batches", type=int, default=200,
                   help="batches timed per loader after the first (batches; default 200)")
    p.add_argument("--vocab-size", type=int, default=4096,
                   help="tokenizer size incl. 9 special tokens (tokens; default 4096)")
    p.add_argument("--verify", type=int, default=8,
                   help="first shmloader batches checked against the baseline's (batches; default 8)")
    args = p.parse_args(argv)
    for name in ("batch_size", "seq_len", "workers", "batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.verify < 0:
        p.error(f"--verify must be >= 0, got {args.verify}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    B, T, window = args.batch_size, args.seq_len, args.batch_size * args.seq_len + 1
    try:
        data = prepare_data(args.out_dir, args.vocab_size)
    except ValueError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # rustbpe, to train the tokenizer: one line, not a traceback
        if exc.name != "rustbpe":
            raise
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    import torch  # noqa: F401  (imported before any timing: docs/contract.md §5)

    from ..data import source
    from ..loader import ShmLoader
    from .baseline import nanochat_style_batches

    files = source.split_files(source.list_files(str(data.data_dir)), "train")
    enc = load_encoding(data.tokenizer_path)
    bos = enc.encode_single_token("<|bos|>")
    cores = usable()
    print(f"shmloader demo: B={B}, T={T} ({window:,} tokens read per batch), {args.batches} batches "
          f"timed per loader, {cores} cores")
    print(f"data: {data.data_dir} ({data.n_files} files, {data.n_docs} documents; train = first "
          f"{len(files)}), tokenizer: {data.tokenizer_path} ({data.vocab_size} tokens)\n")

    shm, kept = time_loader(
        f"shmloader, {args.workers} worker{'s' * (args.workers > 1)}",
        lambda: ShmLoader(str(data.data_dir), str(data.tokenizer_path), B, T, "train",
                          num_workers=args.workers, device="cpu"),
        args.batches, window, keep=min(args.verify, args.batches + 1))
    base, theirs = time_loader("nanochat-style baseline (4 threads)",
                               lambda: nanochat_style_batches(files, enc, B, T, bos),
                               args.batches, window, keep=len(kept))
    print(format_table(base, shm))
    print("(tokens/s: tokens read, B*T+1 per batch; trainer CPU: getrusage of this process per batch;\n"
          " first batch: wall time from constructing the loader; shmloader's includes starting its\n"
          " processes, the first time in a process also multiprocessing's forkserver)")
    make = lambda workers, **kw: ShmLoader(str(data.data_dir), str(data.tokenizer_path), B, T, "train",
                                           num_workers=workers, device="cpu", **kw)
    try:
        n = verify(kept, theirs)
        print(f"stream verified: shmloader's first {n} batches equal, token for token, those of "
              f"the nanochat-style baseline (the stream of docs/contract.md §2)")
        print(resume_round_trip(make, args.workers))
    except AssertionError as exc:
        print(f"MISMATCH: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
