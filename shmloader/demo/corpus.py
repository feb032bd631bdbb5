"""Offline corpora, a small BPE tokenizer, and parquet shard writing.

Used by the demo, the tests and ``tools/make_shards.py``; nothing here needs a network,
a GPU or torch (worker processes import this package and must stay torch-free).

Corpora
    ``stdlib_texts`` returns documents that ship with Python itself: the 79 pydoc topic
    texts (sorted by key) then the source of every standard-library ``.py`` file (sorted by
    relative path; ``site-packages`` and test directories skipped). On CPython 3.11 that
    is 813 documents: ~0.5 MB of English plus ~12 MB of code (734 files); the order is
    fixed for a given Python install.
    ``synthetic_texts`` returns seeded pseudo-random documents. Docs come in blocks of 20,
    shuffled within the block; every full block holds exactly 1 empty string, 1 long
    document (15..40 x ``mean_words`` words, 3000..8000 at the default) and 2 documents
    containing literal special-token strings such as ``<|bos|>`` and ``<|endoftext|>``.
    The other 16 have Exp(``mean_words``) words (at least 1). About 8% of words are
    non-ASCII (accents, Cyrillic, Greek, CJK, emoji). Same ``(n_docs, seed, mean_words)``
    gives the same list; a shorter ``n_docs`` gives a prefix of a longer one.

Tokenizer
    ``train_tokenizer`` trains a byte-level BPE with rustbpe (the ``demo`` extra, not a
    requirement of the loader: without it, ``require_rustbpe`` says in one line to ``pip
    install shmloader[demo]``) using nanochat's GPT-4-style
    split pattern and wraps it in a ``tiktoken.Encoding``: ranks 0..255 are the single
    bytes, merges follow, then the 9 nanochat special tokens with ``<|bos|>`` first, at id
    ``len(mergeable_ranks)``. ``n_vocab <= vocab_size`` (equal unless the text is too
    small to support that many merges). Training is deterministic: the same texts give
    the same ranks. ``save_tokenizer`` pickles it the way nanochat stores
    ``tokenizer.pkl``.

Shards
    ``write_shards`` splits documents into ``num_files`` consecutive parts whose sizes
    differ by at most 1 and writes each as a parquet file with one string column ``text``
    (``None`` becomes null). Row groups are written one at a time, so their sizes are
    exactly the requested ones (a cycled list of sizes, restarting in each file; the last
    group of a file holds whatever is left). With ``row_group_sizes`` (the size of every
    row group in order, summing to ``len(docs)``) the row groups are exactly those, and the
    files are consecutive runs of them whose counts of row groups differ by at most 1.

Benchmark corpora (``tools/bench/corpora.py``, the topics' ``--corpus``), each ``(docs, row_group_sizes)`` for
``write_shards(docs, ..., row_group_sizes=sizes)``, deterministic from ``seed`` for a given
Python install (their words and code come from its standard library):
    ``nanochat_corpus`` has nanochat's shard geometry: row groups of 1024 documents whose
    lengths are log-normal (median ~2.85K characters, mean ~4.7K, a long tail past 100K),
    prose made of runs of words from the pydoc topic texts, in paragraphs. Write it with
    ``SHARD_FORMAT`` (zstd level 3, no dictionary), as ``write_shards`` does.
    ``skewed_corpus`` has row groups of 1 to ``max_row_group_docs`` (500) documents,
    log-uniform, each row group of one kind of source: web pages (prose, some pages of
    20K-100K characters), code (slices of standard-library sources, 500 to 100K characters),
    chat (mostly one-liners) or a mix; every kind holds some empty strings. Documents run
    from empty to ``max_chars`` (100K) characters.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import pickle
import random
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

if TYPE_CHECKING:
    import tiktoken

SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}|"""
    r""" ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
SPECIAL_TOKENS = (
    "<|bos|>",
    "<|user_start|>",
    "<|user_end|>",
    "<|assistant_start|>",
    "<|assistant_end|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|output_start|>",
    "<|output_end|>",
)
TOKENIZER_FILENAME = "tokenizer.pkl"

_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests",
                        "idle_test"})
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when "
    "if so no what up out more about into than them can only other new some could time "
    "these two may then do first any my now such like our over man me even most made after "
    "also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own "
    "data loader token shard parquet window batch memory worker ring epoch resume"
).split() + [
    "naïve", "café", "über", "señor", "Привет", "мир", "Ωμέγα", "λόγος",
    "日本語", "中文", "한국어", "😀", "🚀", "→", "∑", "€",
]
_SPECIAL_STRINGS = ("<|bos|>", "<|endoftext|>", "<|user_start|>", "<|assistant_end|>")
_BLOCK_KINDS = ("empty", "long", "special", "special") + ("normal",) * 16


def stdlib_texts(limit: int | None = None) -> list[str]:
    """Pydoc topic texts (sorted by key), then stdlib ``.py`` sources (sorted by path)."""
    from pydoc_data.topics import topics

    texts = [topics[key] for key in sorted(topics)]
    if limit is not None and len(texts) >= limit:
        return texts[:limit]
    for path in _stdlib_sources():
        if limit is not None and len(texts) >= limit:
            break
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return texts


def _stdlib_sources() -> list[Path]:
    """Standard-library ``.py`` files outside site-packages and test dirs, by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        rel_dir = Path(dirpath).relative_to(root)
        found += [(rel_dir / f).as_posix() for f in filenames if f.endswith(".py")]
    return [root / rel for rel in sorted(found)]


def synthetic_texts(n_docs: int, seed: int = 0, *, mean_words: int = 200) -> list[str | None]:
    """Seeded documents of varied length; see the module docstring for the mix."""
    if n_docs < 0 or mean_words < 1:
        raise ValueError(f"expected n_docs >= 0 and mean_words >= 1, got n_docs={n_docs}, "
                         f"mean_words={mean_words}")
    rng = random.Random(seed)
    docs: list[str | None] = []
    while len(docs) < n_docs:
        kinds = list(_BLOCK_KINDS)
        rng.shuffle(kinds)
        docs += [_synthetic_doc(rng, kind, mean_words) for kind in kinds]
    return docs[:n_docs]


def _synthetic_doc(rng: random.Random, kind: str, mean_words: int) -> str:
    """One document of the given kind: "empty", "long", "special" or "normal"."""
    if kind == "empty":
        return ""
    if kind == "long":
        n_words = rng.randint(15 * mean_words, 40 * mean_words)
    else:
        n_words = max(1, round(rng.expovariate(1.0 / mean_words)))
    words = rng.choices(_WORDS, k=n_words)
    if kind == "special":
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(words) + 1)
            words.insert(pos, rng.choice(_SPECIAL_STRINGS))
    return _punctuate(rng, words)


def _punctuate(rng: random.Random, words: list[str]) -> str:
    """Join words into capitalised sentences of 4..18 words; ~15% end a paragraph."""
    parts, start = [], 0
    while start < len(words):
        end = min(len(words), start + rng.randint(4, 18))
        sentence = " ".join(words[start:end])
        parts.append(sentence[:1].upper() + sentence[1:] + rng.choice(".?!,;:"))
        parts.append("\n\n" if rng.random() < 0.15 else " ")
        start = end
    return "".join(parts[:-1])


DEMO_EXTRA = "pip install shmloader[demo]"


def require_rustbpe():
    """The rustbpe module, which only ``train_tokenizer`` needs (the ``demo`` extra); without it
    an ImportError (``name`` "rustbpe") whose message says in one line what to install."""
    try:
        import rustbpe
    except ImportError as exc:
        raise ImportError(f"training a BPE tokenizer needs rustbpe, which is not installed: {DEMO_EXTRA}",
                          name="rustbpe") from exc
    return rustbpe


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024, *, name: str = "shmloader-bpe",
                    pattern: str = SPLIT_PATTERN) -> "tiktoken.Encoding":
    """Train a byte-level BPE on ``texts``; return a tiktoken Encoding with nanochat specials
    (``pattern``: the split pattern, nanochat's by default)."""
    rustbpe = require_rustbpe()
    import tiktoken

    n_special = len(SPECIAL_TOKENS)
    if vocab_size < 256 + n_special:
        raise ValueError(f"vocab_size must be >= {256 + n_special} (256 bytes + {n_special} "
                         f"special tokens), got {vocab_size}; pass a larger vocab_size")
    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(iter(texts), vocab_size - n_special, pattern=pattern)
    ranks = {bytes(k): v for k, v in tok.get_mergeable_ranks()}
    special = {s: len(ranks) + i for i, s in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(name, pat_str=tok.get_pattern(), mergeable_ranks=ranks,
                             special_tokens=special)


def save_tokenizer(enc: "tiktoken.Encoding", path: str | os.PathLike) -> Path:
    """Pickle ``enc`` to ``path`` (or ``path/tokenizer.pkl`` if a directory); return the file."""
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(enc, f)
    return path


def write_shards(docs: Sequence[str | None], out_dir: str | os.PathLike, *, num_files: int,
                 row_group_size: int | Sequence[int] = 1024,
                 prefix: str = "shard_",
                 on_file_written: Callable[[Path], None] | None = None,
                 row_group_sizes: Sequence[int] | None = None) -> list[Path]:
    """Write ``docs`` as ``num_files`` parquet shards ``{prefix}{i:05d}.parquet``; return paths.

    ``on_file_written(path)``, if given, is called after each file is closed (progress bars).
    ``row_group_sizes``, if given, replaces ``row_group_size``: every row group's size in
    order across the files (summing to ``len(docs)``); each file gets a consecutive run of
    them, the files' counts of row groups differing by at most 1.
    """
    if row_group_sizes is not None:
        return _write_shards_exact(docs, Path(out_dir), num_files, row_group_sizes, prefix, on_file_written)
    sizes = _check_shard_args(len(docs), num_files, row_group_size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    for i, count in enumerate(_split_counts(len(docs), num_files)):
        path = out_dir / f"{prefix}{i:05d}.parquet"
        _write_one_shard(path, docs[start:start + count], sizes)
        paths.append(path)
        start += count
        if on_file_written is not None:
            on_file_written(path)
    return sorted(paths)


def _write_shards_exact(docs: Sequence[str | None], out_dir: Path, num_files: int,
                        row_group_sizes: Sequence[int], prefix: str,
                        on_file_written: Callable[[Path], None] | None) -> list[Path]:
    """``write_shards`` with every row group's size given: files are runs of row groups."""
    sizes = list(row_group_sizes)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes) or sum(sizes) != len(docs):
        raise ValueError(f"row_group_sizes must be positive ints summing to len(docs) = {len(docs)}, got "
                         f"{len(sizes)} sizes summing to {sum(s for s in sizes if isinstance(s, int))}")
    if num_files < 1 or num_files > len(sizes):
        raise ValueError(f"expected 1 <= num_files <= len(row_group_sizes), got num_files={num_files} "
                         f"with {len(sizes)} row groups; lower num_files or pass more row groups")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, start, first = [], 0, 0
    for i, n_groups in enumerate(_split_counts(len(sizes), num_files)):
        mine = sizes[first:first + n_groups]
        path = out_dir / f"{prefix}{i:05d}.parquet"
        _write_one_shard(path, docs[start:start + sum(mine)], tuple(mine))
        paths.append(path)
        start, first = start + sum(mine), first + n_groups
        if on_file_written is not None:
            on_file_written(path)
    return sorted(paths)


def _check_shard_args(n_docs: int, num_files: int,
                      row_group_size: int | Sequence[int]) -> tuple[int, ...]:
    """Validate shard arguments; return row-group sizes as a tuple."""
    if num_files < 1 or n_docs < num_files:
        raise ValueError(f"expected 1 <= num_files <= len(docs), got num_files={num_files} "
                         f"with {n_docs} docs; lower num_files or pass more docs")
    sizes = (row_group_size,) if isinstance(row_group_size, int) else tuple(row_group_size)
    if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"row_group_size must be a positive int or a non-empty sequence of "
                         f"positive ints, got {row_group_size!r}")
    return sizes


def _split_counts(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` consecutive chunks of ``n`` items, differing by at most 1."""
    base, extra = divmod(n, parts)
    return [base + (i < extra) for i in range(parts)]


SHARD_FORMAT = {"use_dictionary": False, "compression": "zstd", "compression_level": 3,
                "write_statistics": False}


def _write_one_shard(path: Path, docs: Sequence[str | None], sizes: tuple[int, ...]) -> None:
    """Write one parquet file, one explicit row group per cycled size, as nanochat writes its
    shards (`dev/repackage_data_reference.py`: no dictionary, zstd level 3, no statistics)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("text", pa.string())])
    start = 0
    with pq.ParquetWriter(path, schema, **SHARD_FORMAT) as writer:
        for size in itertools.cycle(sizes):
            if start >= len(docs):
                break
            chunk = list(docs[start:start + size])
            writer.write_table(pa.table({"text": pa.array(chunk, pa.string())}, schema=schema),
                               row_group_size=len(chunk))
            start += size


def split_documents(texts: Iterable[str], target_chars: int = 4000) -> list[str]:
    """Cut long texts at blank lines into documents of about `target_chars` characters.

    Web pretraining documents (FineWeb-Edu, nanochat's data) average about a thousand tokens;
    whole source files are several times longer. Splitting makes per-document costs weigh
    what they weigh on real data. Deterministic; no text is lost or reordered."""
    docs = []
    for text in texts:
        current, size = [], 0
        for para in text.split("\n\n"):
            current.append(para)
            size += len(para) + 2
            if size >= target_chars:
                docs.append("\n\n".join(current))
                current, size = [], 0
        if current:
            docs.append("\n\n".join(current))
    return docs


# ---------------------------------------------------------------- benchmark corpora

NANOCHAT_ROW_GROUP_DOCS = 1024   # nanochat's shards (dev/repackage_data_reference.py)
NANOCHAT_MEAN_CHARS = 4700       # its documents' mean length in characters
NANOCHAT_SIGMA = 1.0             # log-normal shape: median = mean / e^(sigma^2 / 2)
SKEWED_MAX_ROW_GROUP_DOCS = 500
SKEWED_MAX_CHARS = 100_000
# each skewed row group comes from one kind of source; weights of its documents' kinds
_SKEWED_FLAVORS = {  # flavor: (weight, {kind: weight})
    "web": (35, {"empty": 2, "line": 15, "prose": 50, "page": 30, "code": 3}),
    "code": (20, {"empty": 3, "line": 10, "prose": 7, "code": 80}),
    "chat": (20, {"empty": 10, "line": 75, "prose": 15}),
    "mixed": (25, {"empty": 5, "line": 35, "prose": 35, "page": 13, "code": 12}),
}


@functools.lru_cache(maxsize=1)
def _prose_words() -> tuple[str, ...]:
    """The words of the pydoc topic texts in order (~65K on CPython 3.11): English prose."""
    from pydoc_data.topics import topics

    return tuple(" ".join(topics[key] for key in sorted(topics)).split())


@functools.lru_cache(maxsize=1)
def _code_text() -> str:
    """The standard library's sources (``_stdlib_sources``), concatenated: ~12 MB of code."""
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in _stdlib_sources())


def _prose(rng: random.Random, n_chars: int, *, paragraphs: bool = True) -> str:
    """About ``n_chars`` characters (exactly, cut at the end) of runs of 8..60 consecutive
    prose words, a paragraph break after ~1 run in 6 (none with ``paragraphs=False``)."""
    if n_chars <= 0:
        return ""
    words, parts, size = _prose_words(), [], 0
    while size < n_chars:
        span = rng.randint(8, 60)
        start = rng.randrange(len(words) - span)
        run = " ".join(words[start:start + span])
        parts.append(run)
        parts.append("\n\n" if paragraphs and rng.random() < 1 / 6 else " ")
        size += len(run) + 1
    text = "".join(parts)[:n_chars]
    return text[:1].upper() + text[1:]


def _code(rng: random.Random, n_chars: int) -> str:
    """``n_chars`` characters of standard-library source from a random line on."""
    code = _code_text()
    start = code.find("\n", rng.randrange(max(1, len(code) - n_chars))) + 1
    return code[start:start + n_chars]


def _log_uniform(rng: random.Random, lo: float, hi: float) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def nanochat_corpus(n_docs: int, seed: int = 0, *, row_group_docs: int = NANOCHAT_ROW_GROUP_DOCS,
                    mean_chars: float = NANOCHAT_MEAN_CHARS, sigma: float = NANOCHAT_SIGMA,
                    max_chars: int = 1_000_000) -> tuple[list[str], list[int]]:
    """nanochat's shard geometry: ``(docs, row_group_sizes)``, row groups of ``row_group_docs``
    (the last one what is left), document lengths log-normal with mean ``mean_chars`` and
    shape ``sigma`` (clipped to 32..``max_chars``), prose (``_prose``)."""
    if n_docs < 1 or row_group_docs < 1 or mean_chars <= 0 or sigma < 0:
        raise ValueError(f"expected n_docs >= 1, row_group_docs >= 1, mean_chars > 0, sigma >= 0, got "
                         f"{n_docs}, {row_group_docs}, {mean_chars}, {sigma}")
    rng = random.Random(f"nanochat-{seed}")
    mu = math.log(mean_chars) - sigma ** 2 / 2
    docs = [_prose(rng, min(max_chars, max(32, round(rng.lognormvariate(mu, sigma))))) for _ in range(n_docs)]
    full, rest = divmod(n_docs, row_group_docs)
    return docs, [row_group_docs] * full + ([rest] if rest else [])


def skewed_corpus(n_docs: int, seed: int = 0, *, max_row_group_docs: int = SKEWED_MAX_ROW_GROUP_DOCS,
                  max_chars: int = SKEWED_MAX_CHARS) -> tuple[list[str], list[int]]:
    """Skewed shards: ``(docs, row_group_sizes)``, row groups of 1..``max_row_group_docs``
    documents (log-uniform; the last one what is left), each of one flavor of source
    (``_SKEWED_FLAVORS``); documents: empty strings, one-liners (10..200 characters), prose
    (log-normal, median 1,500), web pages (20K..``max_chars``, log-uniform) and code
    (500..``max_chars``, log-uniform), at most ``max_chars`` characters."""
    if n_docs < 1 or max_row_group_docs < 1 or max_chars < 1:
        raise ValueError(f"expected n_docs, max_row_group_docs and max_chars >= 1, got "
                         f"{n_docs}, {max_row_group_docs}, {max_chars}")
    rng = random.Random(f"skewed-{seed}")
    flavors = list(_SKEWED_FLAVORS)
    docs: list[str] = []
    sizes: list[int] = []
    while len(docs) < n_docs:
        size = min(_log_uniform(rng, 1, max_row_group_docs), n_docs - len(docs))
        flavor = rng.choices(flavors, weights=[_SKEWED_FLAVORS[f][0] for f in flavors])[0]
        kinds = _SKEWED_FLAVORS[flavor][1]
        for kind in rng.choices(list(kinds), weights=list(kinds.values()), k=size):
            if kind == "empty":
                doc = ""
            elif kind == "line":
                doc = _prose(rng, _log_uniform(rng, 10, 200), paragraphs=False).strip()
                doc = doc.rsplit(" ", 1)[0] if " " in doc else doc  # end on a whole word
            elif kind == "prose":
                doc = _prose(rng, max(32, round(rng.lognormvariate(math.log(1500), 0.8))))
            elif kind == "page":
                doc = _prose(rng, _log_uniform(rng, 20_000, max_chars))
            else:
                doc = _code(rng, _log_uniform(rng, 500, max_chars))
            docs.append(doc[:max_chars])
        sizes.append(size)
    return docs, sizes
