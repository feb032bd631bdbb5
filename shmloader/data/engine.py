"""The engine a worker tokenizes with, and the checks that keep it equal to the definition.

tiktoken's `encode_ordinary` (a Hugging Face `tokenizer.json`: the `tokenizers` package, with
special-token text encoded as ordinary text) stays the definition of the stream (`tokenizer.build`).
A SentencePiece model is its own encoder (data/spm.py): the definition, with no faster engine.
A faster engine built from the same definition does the work when it is installed:
`LoaderConfig.engine` is `"auto"` (gigatoken where it is proven equal, data/giga.py, else
fastokens when importable, else the definition), `"tiktoken"` (always the definition),
`"fastokens"` or `"gigatoken"` (required). fastokens is built from the `Encoding`'s
ranks, pattern and special tokens (`Tokenizer.from_tiktoken`) or from the tokenizer.json text
(`Tokenizer.from_json_str`), encodes with `split_special_tokens=True` (special-token text is
ordinary text) and encodes on the worker's thread alone (`FASTOKENS_BPE_THREADS=1`: no pool of
its own; `RAYON_NUM_THREADS=1`: rayon's pool, which it starts on a long document, one thread;
both set in the worker before it is imported, over a value the user set for the trainer: a
worker is one process per core, and `num_workers` is how many tokenize at once). Its own
threads are told by their names (`OWN_THREADS`: /proc/self/task/*/comm), not by a count of the
process's threads around the build, which the worker's reads go on beside (pyarrow starts pool
threads of its own, named like the process); a pool of its own is warned of (`poll`).

`Engines`: a worker encodes with the definition until it has tokenized for about as long as
building the fast engine costs, then builds it on a thread of its own and lets it take over
between documents (so that a loader's first batch never waits for the build).

`Check`: the engine's ids must equal the definition's on the first `START_DOCS` non-null
documents it tokenizes in a worker (the run's own data; those of them that fit in `START_CHARS`
characters in all), then on one document in `SAMPLE_EVERY`;
a difference raises `EngineMismatch` naming the file, row group and row, and `engine="tiktoken"`.
A document longer than `CHECK_MAX_CHARS` that falls due is not compared (`too_long`): the
check would tokenize it a second time, with tiktoken's memory on top. Objects with only
`encode()` are encoded as they always were, unchecked.

`name(code)`: the engine a worker's published code names ("tokenizers, fast engine building"
while the definition encodes and the build runs), for `stats()` and the log.

Test hooks: `SHMLOADER_ENGINE_HOOK="module:function"` in a worker's environment replaces the
fast engine by `function(spec) -> (text -> ids)` (a deliberately wrong engine),
`SHMLOADER_ENGINE_CHECK="start,every"` sets the two counts, and `SHMLOADER_ENGINE_AT=k` makes
the engine take over at exactly the worker's k-th document (`Engines`); tests start their
workers with `start_method="spawn"` so that the environment reaches them.
"""
import importlib
import importlib.util
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from . import giga, spm, tokenizer as tokmod

START_DOCS = 64       # every engine id array is compared on a worker's first documents,
START_CHARS = 1 << 18  # as many of them as fit in this many characters (a slow definition, tokenizers'
#                        1.9 MB/s, made 64 source files of 12K characters a 0.4 s start check per worker)
CHECK_MAX_CHARS = 1 << 20  # a longer document is not re-encoded by the check (it would be tokenized twice)
SAMPLE_EVERY = 256    # then one document in this many
HOOK_ENV = "SHMLOADER_ENGINE_HOOK"
CHECK_ENV = "SHMLOADER_ENGINE_CHECK"
AT_ENV = "SHMLOADER_ENGINE_AT"
THREAD_ENV = {"FASTOKENS_BPE_THREADS": "1", "RAYON_NUM_THREADS": "1"}
OWN_THREADS = {"fastokens": "fastokens-"}  # engine -> what its own threads' names begin with
FORCE = 'engine="tiktoken"'
# the fast engine's build, estimated: seconds, plus seconds per vocabulary entry (fitted to the
# build times in docs/benchmarks.md)
BUILD_S = (0.025, 5.5e-6)
# definitions the fast engine outruns by tens of times (the `tokenizers` package: 1.9 MB/s where
# fastokens reads 200 MB/s, docs/benchmarks.md): the build pays for itself inside the first
# batch, so their rent counts from the worker's first engine call, not from the first batch on
EARLY = ("tokenizers",)
# what a worker publishes of its engine (`Engines.state`, the ring's WorkerCol.ENGINE): the code is
# the index here; "building" adds BUILDING (the definition encodes while the fast engine is built)
NAMES = ("", "tiktoken", "tokenizers", "object", "fastokens", "hook", "gigatoken", "sentencepiece")
DEFINITIONS = {"tiktoken": "tiktoken", "hf": "tokenizers", "sp": "sentencepiece"}  # a spec's kind -> its definition
ONLY_DEFINITION = ("object", "sp")  # kinds that no faster engine encodes
BUILDING = 16


class EngineMismatch(RuntimeError):
    """The fast engine's ids differ from the definition's on a document of the run."""


@dataclass
class Encoder:
    """What a worker encodes with: `encode(text) -> ids`; `reference` is the definition when
    `encode` is another engine (None when `encode` is the definition itself)."""
    name: str                     # "tiktoken", "tokenizers", "sentencepiece", "object", "fastokens", "gigatoken", "hook"
    encode: object
    reference: object = None
    definition: str = ""          # what `reference` is: "tiktoken" or "tokenizers"
    threads: int | None = None    # threads of the engine's own (fastokens: named fastokens-N), in /proc
    note: str | None = None       # why "auto" fell back to the definition, for a warning
    batch: object = None          # texts -> (ids, offsets) in one call (fastokens, gigatoken), else None

    def encode_batch(self, texts: list) -> tuple:
        """(ids, offsets) of non-null `texts`: their ids end to end, text j's at
        `ids[offsets[j]:offsets[j + 1]]`. fastokens encodes them in one call (no Python per
        document, and its per-call cost paid once); the others one by one."""
        if self.batch is not None:
            return self.batch(texts)
        parts = [self.encode(text) for text in texts]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(ids) for ids in parts], out=offsets[1:])
        return np.concatenate(parts), offsets


def available(engine: str, spec=None) -> None:
    """In the trainer: `engine="fastokens"` or `"gigatoken"` without the package is a quick
    ImportError; `"gigatoken"` for a tokenizer (`spec`) whose split pattern it does not
    implement, a quick ValueError (the probe and the checks run in the workers)."""
    if engine in ("fastokens", "gigatoken") and importlib.util.find_spec(engine) is None:
        raise ImportError(f'engine="{engine}" needs the {engine} package: pip install {engine} '
                          f'(or engine="auto", which uses it when installed)')
    if spec is not None and spec.kind in ONLY_DEFINITION:
        _wants_fast(spec, engine)  # the ValueError for an engine that cannot encode it
    elif engine == "gigatoken" and spec is not None and giga.scheme(spec) is None:
        raise ValueError('engine="gigatoken" cannot encode this tokenizer exactly: it implements the split '
                         'patterns of GPT-2, cl100k and o200k as tiktoken writes them, and this tokenizer\'s is '
                         'another (nanochat\'s differs from cl100k\'s in \\p{N}{1,2}); use engine="auto"')


def build(spec, engine: str = "auto") -> Encoder:
    """The encoder for `spec` (a `tokenizer.TokenizerSpec`), built at once (tools, tests; a
    worker builds the fast engine in the background instead: `Engines`)."""
    defined = definition(spec)
    if not _wants_fast(spec, engine):
        return defined
    _pin_threads()
    return _fast(spec, engine, defined)


def definition(spec) -> Encoder:
    """The definition's encoder for `spec`: the stream every engine is checked against."""
    if spec.kind == "sp":
        encode, batch = spm.encoders(spec)
        return Encoder("sentencepiece", encode, batch=batch)
    return Encoder(DEFINITIONS.get(spec.kind, "object"), tokmod.build(spec))


def _wants_fast(spec, engine: str) -> bool:
    """Whether `engine` asks for another engine than the definition (a ValueError when it
    asks for one that cannot encode `spec`)."""
    if spec.kind in ONLY_DEFINITION and engine in ("fastokens", "gigatoken"):
        what = "a SentencePiece model" if spec.kind == "sp" else "an object with encode()"
        raise ValueError(f'engine="{engine}" cannot encode a {type(spec).__name__} of kind '
                         f'{spec.kind!r} ({what}): use engine="auto"')
    return spec.kind not in ONLY_DEFINITION and engine != "tiktoken"


def _pin_threads() -> None:
    """Before fastokens is imported: one thread of its own."""
    for key, value in THREAD_ENV.items():
        os.environ[key] = value


def _fast(spec, engine: str, definition: Encoder) -> Encoder:
    """The fast engine checked against `definition`; `definition` itself (with a note) when
    "auto" cannot build it, or when fastokens is not installed."""
    base = definition.name
    hook = os.environ.get(HOOK_ENV)
    if hook:
        module, _, func = hook.partition(":")
        return Encoder("hook", getattr(importlib.import_module(module), func)(spec), definition.encode, base)
    if engine in ("auto", "gigatoken"):
        got = giga.build(spec, definition.encode)
        if isinstance(got, giga.Built):  # built `parallel=False`: it encodes on the caller's thread, with
            #                              none of its own (none started by a build and a 1M-word document)
            return Encoder("gigatoken", got.encode, definition.encode, base, threads=0, batch=got.batch)
        if engine == "gigatoken":
            raise (ImportError if "not installed" in got.why else ValueError)(f'engine="gigatoken": {got.why}')
    try:
        import fastokens
    except ImportError as exc:
        if engine == "fastokens":
            raise ImportError('engine="fastokens" needs the fastokens package: pip install fastokens') from exc
        return definition
    try:
        fast, batch = _fastokens(fastokens, spec)
        fast("warm up 0123, the engine's threads " * 1000)  # long enough to start its pool
    except Exception as exc:  # noqa: BLE001 - "auto" falls back, with a warning
        if engine == "fastokens":
            raise
        return Encoder(base, definition.encode, note=f"fastokens could not be built for this tokenizer "
                                                     f"({type(exc).__name__}: {exc}); using {base}")
    return Encoder("fastokens", fast, definition.encode, base, threads=len(own_threads("fastokens")), batch=batch)


def _fastokens(fastokens, spec):
    if spec.kind == "hf":
        tok = fastokens.Tokenizer.from_json_str(spec.payload.decode())
    else:
        enc = tokmod.encoding(spec)
        with tokmod.ranks_file(enc) as path:
            tok = fastokens.Tokenizer.from_tiktoken(path, pattern=enc._pat_str,
                                                    special_tokens=dict(enc._special_tokens))
    flat = tok.encode_batch_flat

    def encode(text):
        return np.frombuffer(flat([text], split_special_tokens=True)[0], dtype=np.uint32)

    def batch(texts):
        ids, offsets = flat(texts, split_special_tokens=True)
        return np.frombuffer(ids, dtype=np.uint32), np.frombuffer(offsets, dtype=np.uint64).view(np.int64)
    return encode, batch


def name(code: int) -> str | None:
    """The engine a worker's `Engines.state` code names; None before the worker has one."""
    base = NAMES[code % BUILDING] if 0 < code % BUILDING < len(NAMES) else None
    return f"{base}, fast engine building" if base and code >= BUILDING else base


def own_threads(engine: str) -> list[str]:
    """The names of this process's threads that are `engine`'s own (`OWN_THREADS`; its threads
    are named so by the engine itself): none for an engine that names none, or off Linux."""
    prefix, names = OWN_THREADS.get(engine), []
    try:
        tasks = os.listdir("/proc/self/task") if prefix else []
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                name = comm.read().strip()
        except OSError:  # a thread that ended meanwhile
            continue
        if name.startswith(prefix):
            names.append(name)
    return sorted(names)


class Check:
    """Compares the engine with the definition on the documents a worker tokenizes: the first
    `start` non-null ones, then every `every`-th (by a per-worker counter, so deterministic)."""

    def __init__(self, encoder: Encoder, start: int = START_DOCS, every: int = SAMPLE_EVERY):
        spec = os.environ.get(CHECK_ENV)
        if spec:
            start, every = (int(x) for x in spec.split(","))
        self.encoder, self.start, self.every = encoder, start, every
        self.seen, self.checked, self.too_long = 0, 0, 0
        self.start_chars = START_CHARS  # characters the start check may still compare

    def __call__(self, text: str, ids, where) -> None:
        """One document; `where()` names it (called only on a mismatch)."""
        n = self.seen
        self.seen += 1
        if n < self.start or (n - self.start) % self.every == self.every - 1:
            self._compare(text, ids, where, n)

    def batch(self, texts: list, ids, offsets, where) -> None:
        """Documents encoded together (`Encoder.encode_batch`); `where(j)` names text j."""
        n = self.seen
        self.seen += len(texts)
        for j in self._due(n, len(texts)):
            self._compare(texts[j], ids[offsets[j]:offsets[j + 1]], lambda: where(j), n + j)

    def _due(self, n: int, k: int) -> list:
        """Which of the documents counted n .. n + k - 1 are compared, as offsets from n."""
        due = list(range(min(max(self.start - n, 0), k)))
        first = max(n, self.start)
        first += (self.every - 1 - (first - self.start)) % self.every
        return due + list(range(first - n, k, self.every))

    def _compare(self, text: str, ids, where, n: int) -> None:
        if len(text) > CHECK_MAX_CHARS:
            self.too_long += 1
            return
        if n < self.start:  # the start check: documents while they fit in its characters
            if len(text) > self.start_chars:
                return
            self.start_chars -= len(text)
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


class Engines:
    """A worker's engines: the definition at once, the fast engine once it has paid for itself.

    Building fastokens takes about `BUILD_S` (mostly `from_tiktoken`), and a worker that waited for it put that on every loader's first batch, while nanochat builds
    a new validation loader at every evaluation and takes a few batches from it. So a worker
    encodes with the definition, which is the stream by definition, and starts the build, on a
    thread of its own, only once it has spent about as long tokenizing as the build costs
    (`worked`, which the worker calls after each run of documents, and lets start the build
    only once the worker is past its first piece or has had a write order: procs/worker.py
    `_rent`; rent until the rent adds up to the price, then buy, never more than twice the
    better choice's cost): a short loader never pays for a build, a long run pays once, early. A
    definition in `EARLY` (`tokenizers`, tens of times slower than the fast engine) pays rent
    from its first call on (`encode_batch` times each one), and its worker waits for the build
    (about its price): best fit's first batch tokenizes a whole buffer of documents, which
    with it took seconds to tens of seconds. Not at
    once on a thread: the build holds the GIL (so does tiktoken's encode), so beside the first
    batch's tokenizing it only shares one core with it (docs/engines.md: what each choice cost
    a first batch).
    `poll()`, between documents, lets the fast engine take over once it is built; its `Check`
    starts there: its first `START_DOCS` documents are the start check, then one in
    `SAMPLE_EVERY`.

    `warn(text)` is called (by the worker's thread, in `poll`) when "auto" fell back to the
    definition or the engine runs threads of its own (`own_threads`); an error of `engine="fastokens"`'s
    build is raised by `poll`. `at=k` starts the build at once, before anything is read, and
    makes the fast engine take over exactly at the `k`-th non-null document (0: before the
    first): a tool that tokenizes a whole split (shmloader/tools/pretokenize.py) passes 0, and tests set
    it for workers through the environment (`SHMLOADER_ENGINE_AT=k`), so that they know which
    documents it encodes.
    """

    def __init__(self, spec, engine: str = "auto", warn=print, at: int | None = None):
        self.encoder, self.check = definition(spec), None
        self.docs = 0            # non-null documents encoded, by either engine
        self._warn = warn
        self._todo = (spec, engine) if _wants_fast(spec, engine) else None  # a build not started
        self._rent = 0.0         # seconds tokenized with the definition while no build started
        self.price = BUILD_S[0] + BUILD_S[1] * (spec.n_vocab or 32768)  # the build's, estimated (s)
        self._thread = None      # the build, until the engine takes over
        self._early = self._todo is not None and self.encoder.name in EARLY  # rent from the first call
        self._built = None       # (Encoder, None) or (None, exception), set by the build thread
        if at is None and os.environ.get(AT_ENV):
            at = int(os.environ[AT_ENV])
        self._at = at
        if self._at is not None:  # built before the worker reads anything
            self.start()
            if self._thread is not None:
                self._thread.join()

    @property
    def state(self) -> int:
        """The engine in use as a code (`NAMES`' index, plus `BUILDING` while a build runs): what
        the worker publishes for `stats()` (`name`)."""
        return NAMES.index(self.encoder.name) + (BUILDING if self._thread is not None else 0)

    def worked(self, seconds: float, may_start: bool = True) -> None:
        """The worker tokenized a piece in `seconds`: the build starts once these add up to its
        estimated cost, at the first call that says it `may_start` (not while another loader
        of the process starts: a 65k-token vocabulary's build takes ~0.4 s of a core)."""
        if self._todo is not None:
            self._rent += seconds
            if self._rent >= self.price and may_start:
                self.start()
                if self._early:  # a slow definition's calls hold the GIL for long: the build
                    self._thread.join()  # would take many of them to finish beside them
                    self.poll()

    def start(self) -> None:
        """Start building the fast engine (once; nothing when there is none to build)."""
        if self._todo is None:
            return
        spec, engine = self._todo
        self._todo = None
        _pin_threads()  # in the worker's thread, before fastokens is imported
        self._thread = threading.Thread(target=self._build, args=(spec, engine, self.encoder),
                                        name="shmloader-engine-build", daemon=True)
        self._thread.start()

    def _build(self, spec, engine, definition):
        try:
            self._built = (_fast(spec, engine, definition), None)
        except BaseException as exc:  # noqa: BLE001 - raised in the worker's thread, by poll()
            self._built = (None, exc)

    def poll(self) -> None:
        """Between documents: the fast engine takes over if it is built (with the test knob,
        exactly at the knob's document)."""
        if self._thread is None or (self._built is None and self._at is None):
            return
        if self._at is not None:
            if self.docs < self._at:
                return
            self._thread.join()
        self._thread = None
        fast, error = self._built
        if error is not None:
            raise error
        if fast.note:
            self._warn(fast.note)
        if fast.threads:  # a pool of its own beside the worker's thread: the pin did not hold
            self._warn(f"the {fast.name} engine runs {fast.threads} thread{'s' if fast.threads > 1 else ''} of "
                       f"its own ({', '.join(own_threads(fast.name))} in /proc/{os.getpid()}/task) beside "
                       f"the worker's (pid {os.getpid()}), which should encode alone "
                       f"({', '.join(f'{k}={v}' for k, v in THREAD_ENV.items())} did not hold it): "
                       f"this worker may take more than its core")
        if fast.reference is not None:
            self.encoder, self.check = fast, Check(fast)

    def encode(self, text: str, where):
        """The ids of one non-null document (no BOS): `encode_batch` of one."""
        return self.encode_batch([text], lambda j: where())[0]

    def encode_batch(self, texts: list, where) -> tuple:
        """(ids, offsets) of non-null `texts` (`Encoder.encode_batch`; no BOS) by the engine in
        use, checked when it is not the definition; `where(j)` names text j (called only on a
        mismatch). The fast engine takes over between two calls (under the test knob, exactly
        at its document: the call is split there)."""
        if self._thread is not None:
            cut = self._at - self.docs if self._at is not None else 0
            if 0 < cut < len(texts):
                return _joined(self.encode_batch(texts[:cut], where),
                               self.encode_batch(texts[cut:], lambda j: where(cut + j)))
            self.poll()
        began = time.perf_counter() if self._early and self._todo is not None else None
        ids, offsets = self.encoder.encode_batch(texts)
        if self.check is not None:
            self.check.batch(texts, ids, offsets, where)
        self.docs += len(texts)
        if began is not None:  # an early definition's rent: it may build and take over here
            self.worked(time.perf_counter() - began)
        return ids, offsets


def _joined(a: tuple, b: tuple) -> tuple:
    """Two (ids, offsets) results as one."""
    return np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1][1:] + a[1][-1]])
