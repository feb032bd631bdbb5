"""The engine a worker tokenizes with, and the checks that keep it equal to the definition.

tiktoken's `encode_ordinary` (a Hugging Face `tokenizer.json`: the `tokenizers` package, with
special-token text encoded as ordinary text) stays the definition of the stream (`tokenizer.build`).
A faster engine built from the same definition does the work when it is installed:
`LoaderConfig.engine` is `"auto"` (fastokens when importable, else the definition), `"tiktoken"`
(always the definition) or `"fastokens"` (required). fastokens is built from the `Encoding`'s
ranks, pattern and special tokens (`Tokenizer.from_tiktoken`) or from the tokenizer.json text
(`Tokenizer.from_json_str`), encodes with `split_special_tokens=True` (special-token text is
ordinary text) and is pinned to one thread of its own (`FASTOKENS_BPE_THREADS=1`,
`RAYON_NUM_THREADS=1`, set before it is imported; the threads it starts are counted).

`Check`: the engine's ids must equal the definition's on the first `START_DOCS` non-null
documents a worker tokenizes (the run's own data), then on one document in `SAMPLE_EVERY`;
a difference raises `EngineMismatch` naming the file, row group and row, and `engine="tiktoken"`.
Objects with only `encode()` are encoded as they always were, unchecked.

Test hook: `SHMLOADER_ENGINE_HOOK="module:function"` in a worker's environment replaces the
fast engine by `function(spec) -> (text -> ids)` (a deliberately wrong engine), and
`SHMLOADER_ENGINE_CHECK="start,every"` sets the two counts; tests start their workers with
`start_method="spawn"` so that the environment reaches them.
"""
import base64
import importlib
import importlib.util
import os
import pickle
import tempfile
from dataclasses import dataclass

import numpy as np

from . import tokenizer as tokmod

START_DOCS = 64       # every engine id array is compared on a worker's first documents
SAMPLE_EVERY = 256    # then one document in this many
HOOK_ENV = "SHMLOADER_ENGINE_HOOK"
CHECK_ENV = "SHMLOADER_ENGINE_CHECK"
THREAD_ENV = {"FASTOKENS_BPE_THREADS": "1", "RAYON_NUM_THREADS": "1"}
FORCE = 'engine="tiktoken"'


class EngineMismatch(RuntimeError):
    """The fast engine's ids differ from the definition's on a document of the run."""


@dataclass
class Encoder:
    """What a worker encodes with: `encode(text) -> ids`; `reference` is the definition when
    `encode` is another engine (None when `encode` is the definition itself)."""
    name: str                     # "tiktoken", "tokenizers", "object", "fastokens" or "hook"
    encode: object
    reference: object = None
    definition: str = ""          # what `reference` is: "tiktoken" or "tokenizers"
    threads: int | None = None    # threads the engine started (fastokens), counted in /proc
    note: str | None = None       # why "auto" fell back to the definition, for a warning


def available(engine: str) -> None:
    """In the trainer: `engine="fastokens"` without the package is a quick ImportError."""
    if engine == "fastokens" and importlib.util.find_spec("fastokens") is None:
        raise ImportError('engine="fastokens" needs the fastokens package: pip install fastokens '
                          '(or engine="auto", which uses it when installed)')


def build(spec, engine: str = "auto") -> Encoder:
    """The encoder of one worker for `spec` (a `tokenizer.TokenizerSpec`)."""
    definition = tokmod.build(spec)
    base = {"tiktoken": "tiktoken", "hf": "tokenizers"}.get(spec.kind, "object")
    if spec.kind == "object" or engine == "tiktoken":
        if engine == "fastokens":
            raise ValueError(f'engine="fastokens" cannot encode a {type(spec).__name__} of kind '
                             f'{spec.kind!r} (an object with encode()): use engine="auto"')
        return Encoder(base, definition)
    hook = os.environ.get(HOOK_ENV)
    if hook:
        module, _, func = hook.partition(":")
        return Encoder("hook", getattr(importlib.import_module(module), func)(spec), definition, base)
    for key, value in THREAD_ENV.items():  # before fastokens is imported: one thread of its own
        os.environ[key] = value
    try:
        import fastokens
    except ImportError as exc:
        if engine == "fastokens":
            raise ImportError('engine="fastokens" needs the fastokens package: pip install fastokens') from exc
        return Encoder(base, definition)
    before = _threads()
    try:
        fast = _fastokens(fastokens, spec)
        fast("warm up 0123, the engine's threads " * 1000)  # long enough to start its pool
    except Exception as exc:  # noqa: BLE001 - "auto" falls back, with a warning
        if engine == "fastokens":
            raise
        return Encoder(base, definition, note=f"fastokens could not be built for this tokenizer "
                                              f"({type(exc).__name__}: {exc}); using {base}")
    return Encoder("fastokens", fast, definition, base, threads=_threads() - before)


def _fastokens(fastokens, spec):
    if spec.kind == "hf":
        tok = fastokens.Tokenizer.from_json_str(spec.payload.decode())
    else:
        enc = pickle.loads(spec.payload)
        with tempfile.NamedTemporaryFile("wb", suffix=".tiktoken") as f:
            ranks = enc._mergeable_ranks
            f.write(b"".join(base64.b64encode(piece) + b" %d\n" % rank
                             for piece, rank in sorted(ranks.items(), key=lambda kv: kv[1])))
            f.flush()
            tok = fastokens.Tokenizer.from_tiktoken(f.name, pattern=enc._pat_str,
                                                    special_tokens=dict(enc._special_tokens))
    flat = tok.encode_batch_flat

    def encode(text):
        return np.frombuffer(flat([text], split_special_tokens=True)[0], dtype=np.uint32)
    return encode


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


class Check:
    """Compares the engine with the definition on the documents a worker tokenizes: the first
    `start` non-null ones, then every `every`-th (by a per-worker counter, so deterministic)."""

    def __init__(self, encoder: Encoder, start: int = START_DOCS, every: int = SAMPLE_EVERY):
        spec = os.environ.get(CHECK_ENV)
        if spec:
            start, every = (int(x) for x in spec.split(","))
        self.encoder, self.start, self.every = encoder, start, every
        self.seen, self.checked = 0, 0

    def __call__(self, text: str, ids, where) -> None:
        """`where()` names the document (called only on a mismatch)."""
        n = self.seen
        self.seen += 1
        if n >= self.start and (n - self.start) % self.every != self.every - 1:
            return
        self.checked += 1
        ref = np.asarray(self.encoder.reference(text))
        ids = np.asarray(ids)
        if len(ref) == len(ids) and np.array_equal(ref, ids):
            return
        diff = np.flatnonzero(ref[:len(ids)] != ids[:len(ref)])
        at = int(diff[0]) if len(diff) else min(len(ref), len(ids))
        phase = "start check" if n < self.start else f"sampled check, 1 in {self.every}"
        raise EngineMismatch(
            f"the {self.encoder.name} engine's tokens differ from {self.encoder.definition}'s on "
            f"{where()} ({phase}; {len(ids)} vs {len(ref)} tokens, first difference at token {at}): "
            f"pass {FORCE} to tokenize with the reference, and please report the document")
