"""data/engine.py in this process: the fast tokenizer engine (fastokens) and its checks against
tiktoken.

The engine's ids equal `encode_ordinary` on hard texts (special-token text, long whitespace
and digit runs, non-ASCII, random fuzz) and, for a Hugging Face tokenizer.json, the
`tokenizers` package's; `engine="tiktoken"` and objects with only `encode()` use the
definition unchecked; a bad `engine` value and `engine="fastokens"` without the package are
quick errors; `engine` is not part of the resume fingerprint. A worker's `Engines`: the
definition encodes until the worker has tokenized for about as long as the fast engine's
build costs, the build runs on a thread, the engine takes over between documents and its
start check begins there; the test knob `SHMLOADER_ENGINE_AT` makes the takeover exact; a
failed build (the test hook `SHMLOADER_ENGINE_HOOK` naming `broken` in this module) is raised
at the takeover. (The engine's threads in a fresh interpreter, and the engine in the
workers: tests/loader/test_engine.py.)
"""
import random

import numpy as np
import pytest

from shmloader.data import engine as enginemod
from shmloader.data import tokenizer as tokmod
from shmloader.config import ENGINES, LoaderConfig
from shmloader.demo import corpus
from tests.helpers import IntTokenizer, hard_texts

pytest.importorskip("fastokens")


def broken(spec):
    raise RuntimeError("this engine cannot be built")


def test_fastokens_equals_encode_ordinary(synth_tokenizer):
    enc = synth_tokenizer
    encoder = enginemod.build(tokmod.resolve(enc), "fastokens")
    assert encoder.name == "fastokens" and encoder.definition == "tiktoken"
    texts = hard_texts() + [t for t in corpus.synthetic_texts(200, seed=5) if t is not None]
    assert sum("<|bos|>" in t for t in texts) > 3
    for text in texts:
        got = encoder.encode(text)
        assert got.dtype == np.uint32
        assert got.tolist() == enc.encode_ordinary(text), repr(text[:80])


def test_fastokens_equals_tokenizers_for_tokenizer_json():
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus.synthetic_texts(80, seed=4, mean_words=20),
                            trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<s>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                show_progress=False))
    encoder = enginemod.build(tokmod.resolve(tok), "fastokens")
    assert encoder.name == "fastokens" and encoder.definition == "tokenizers"
    for text in hard_texts() + ["x <|endoftext|> y <s>"]:
        assert encoder.encode(text).tolist() == encoder.reference(text).tolist(), repr(text[:80])


def test_tiktoken_forced_and_objects_are_the_definition_unchecked(synth_tokenizer):
    forced = enginemod.build(tokmod.resolve(synth_tokenizer), "tiktoken")
    assert forced.name == "tiktoken" and forced.reference is None
    assert forced.encode("a <|bos|> b").tolist() == synth_tokenizer.encode_ordinary("a <|bos|> b")
    obj = enginemod.build(tokmod.resolve(IntTokenizer(bos=5)), "auto")
    assert obj.name == "object" and obj.reference is None
    with pytest.raises(ValueError, match="fastokens"):
        enginemod.build(tokmod.resolve(IntTokenizer(bos=5)), "fastokens")


def test_auto_falls_back_with_a_note_when_the_engine_cannot_be_built(synth_tokenizer, monkeypatch):
    import fastokens

    def refuse(*args, **kwargs):
        raise ValueError("unsupported pattern")

    monkeypatch.setattr(fastokens.Tokenizer, "from_tiktoken", refuse, raising=False)
    spec = tokmod.resolve(synth_tokenizer)
    auto = enginemod.build(spec, "auto")
    assert auto.name == "tiktoken" and auto.reference is None and "unsupported pattern" in auto.note
    with pytest.raises(ValueError, match="unsupported pattern"):
        enginemod.build(spec, "fastokens")


def test_engine_option_checked_and_not_in_the_fingerprint(monkeypatch):
    with pytest.raises(ValueError, match="engine"):
        LoaderConfig(2, 8, engine="fast")
    prints = {e: LoaderConfig(2, 8, engine=e).fingerprint("tok") for e in ENGINES}
    assert len({str(p) for p in prints.values()}) == 1
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fastokens" else real(name, *a))
    with pytest.raises(ImportError, match="pip install fastokens"):
        enginemod.available("fastokens")
    enginemod.available("auto")  # "auto" falls back, no error


def test_check_counts_start_then_one_in_every():
    seen = []
    encoder = enginemod.Encoder("fake", lambda t: np.array([1]), lambda t: seen.append(t) or np.array([1]))
    check = enginemod.Check(encoder, start=4, every=8)
    for i in range(40):
        check(str(i), np.array([1]), lambda: "nowhere")
    assert seen == ["0", "1", "2", "3", "11", "19", "27", "35"]
    assert check.checked == 8


@pytest.mark.parametrize("start,every", [(4, 8), (64, 256), (0, 1), (3, 5)])
def test_check_in_batches_compares_what_one_by_one_compares(start, every):
    """Documents encoded together (a worker's chunks, of any size) are sampled exactly as
    one by one; `where(j)` names the j-th of its batch."""
    texts = [str(i) for i in range(700)]
    single, batched = [], []
    for seen, check in ((single, None), (batched, None)):
        encoder = enginemod.Encoder("fake", None, lambda t, seen=seen: seen.append(t) or np.array([int(t)]))
        checker = enginemod.Check(encoder, start=start, every=every)
        if seen is single:
            for t in texts:
                checker(t, np.array([int(t)]), lambda: "nowhere")
        else:
            rng, i = random.Random(start * 1000 + every), 0
            while i < len(texts):
                k = rng.randint(1, 40)
                chunk = texts[i:i + k]
                checker.batch(chunk, np.array([int(t) for t in chunk]), np.arange(len(chunk) + 1), lambda j: "nowhere")
                i += k
    assert batched == single and len(single) > 0
    encoder = enginemod.Encoder("fake", None, lambda t: np.array([0]), "tiktoken")
    ids = np.zeros(10, dtype=np.uint32)
    ids[7] = 1
    with pytest.raises(enginemod.EngineMismatch, match="document 7 of the batch"):
        enginemod.Check(encoder, start=100, every=1).batch(texts[:10], ids, np.arange(11),
                                                            lambda j: f"document {j} of the batch")


def test_worker_chunks_cut_at_about_chunk_chars():
    from shmloader.procs.worker import _chunks

    texts = ["a" * 10, None, "b" * 25, "c" * 100, "", "d" * 5, None, "e" * 30]
    got = list(_chunks(texts, 30))
    assert got == [(0, 3), (3, 4), (4, 8)]  # 35 characters, a long one alone, the rest (35)
    assert list(_chunks([None, None], 30)) == [(0, 2)] and list(_chunks([], 30)) == []
    # a long document is alone also when short ones come before it in the run
    assert list(_chunks(["a" * 10, "c" * 100, "b" * 5], 30)) == [(0, 1), (1, 2), (2, 3)]


def _take_over(engines, deadline_s=30.0):
    """Poll (as a worker does between documents) until the fast engine has taken over."""
    import time

    end = time.monotonic() + deadline_s
    while engines.encoder.reference is None:
        assert time.monotonic() < end, "the fast engine never took over"
        time.sleep(0.005)
        engines.poll()


def test_engines_build_once_the_definition_has_cost_as_much(synth_tokenizer, monkeypatch):
    monkeypatch.delenv(enginemod.AT_ENV, raising=False)
    enc = synth_tokenizer
    engines = enginemod.Engines(tokmod.resolve(enc), "fastokens", warn=pytest.fail)
    texts = [t for t in corpus.synthetic_texts(200, seed=8) if t]
    for text in texts[:20]:
        assert engines.encode(text, lambda: "?").tolist() == enc.encode_ordinary(text)
    assert engines.encoder.name == "tiktoken" and engines.check is None and engines._todo is not None
    engines.worked(0.6 * engines.price)
    assert engines._todo is not None  # not started
    engines.worked(0.6 * engines.price, may_start=False)  # another loader starts: the build waits
    assert engines._todo is not None
    engines.worked(0.0)
    assert engines._todo is None  # started
    _take_over(engines)
    assert engines.encoder.name == "fastokens" and engines.check.seen == 0  # the start check begins here
    for text in texts[20:20 + enginemod.START_DOCS + 10]:
        assert engines.encode(text, lambda: "?").tolist() == enc.encode_ordinary(text)
    assert engines.check.checked == enginemod.START_DOCS
    assert engines.docs == 20 + enginemod.START_DOCS + 10


def test_engines_knob_takes_over_at_the_document(synth_tokenizer, monkeypatch):
    monkeypatch.setenv(enginemod.AT_ENV, "3")
    engines = enginemod.Engines(tokmod.resolve(synth_tokenizer), "auto", warn=pytest.fail)
    assert engines._todo is None  # started at once, under the knob
    used = []
    for i in range(5):
        engines.encode(f"document {i}", lambda: "?")
        used.append(engines.encoder.name)
    assert used == ["tiktoken"] * 3 + ["fastokens"] * 2


def test_engines_knob_splits_a_batch_at_the_document(synth_tokenizer, monkeypatch):
    monkeypatch.setenv(enginemod.AT_ENV, "3")
    enc = synth_tokenizer
    engines = enginemod.Engines(tokmod.resolve(enc), "auto", warn=pytest.fail)
    texts = [t for t in corpus.synthetic_texts(40, seed=9) if t][:5] + ["", "a <|bos|> b"]
    ids, offsets = engines.encode_batch(texts, lambda j: "?")
    assert [ids[offsets[j]:offsets[j + 1]].tolist() for j in range(len(texts))] == \
        [enc.encode_ordinary(t) for t in texts]
    assert engines.encoder.name == "fastokens" and engines.check.seen == len(texts) - 3
    assert engines.docs == len(texts)


def test_engines_never_build_for_tiktoken_or_objects(synth_tokenizer, monkeypatch):
    monkeypatch.setenv(enginemod.AT_ENV, "0")
    for tok, engine in ((synth_tokenizer, "tiktoken"), (IntTokenizer(bos=5), "auto")):
        engines = enginemod.Engines(tokmod.resolve(tok), engine, warn=pytest.fail)
        engines.worked(1e9)
        engines.encode("12 34", lambda: "?")
        assert engines._thread is None and engines.check is None and engines.encoder.reference is None


def test_engines_raise_a_failed_build_at_the_takeover(synth_tokenizer, monkeypatch):
    monkeypatch.setenv(enginemod.AT_ENV, "1")
    monkeypatch.setenv(enginemod.HOOK_ENV, f"{__name__}:broken")
    engines = enginemod.Engines(tokmod.resolve(synth_tokenizer), "auto", warn=pytest.fail)
    engines.encode("the definition's document", lambda: "?")
    with pytest.raises(RuntimeError, match="cannot be built"):
        engines.encode("the engine's document", lambda: "?")


def test_engines_warn_when_auto_falls_back(synth_tokenizer, monkeypatch):
    import fastokens

    def refuse(*args, **kwargs):
        raise ValueError("unsupported pattern")

    monkeypatch.setattr(fastokens.Tokenizer, "from_tiktoken", refuse, raising=False)
    monkeypatch.setenv(enginemod.AT_ENV, "0")
    warned = []
    engines = enginemod.Engines(tokmod.resolve(synth_tokenizer), "auto", warn=warned.append)
    engines.encode("text", lambda: "?")
    assert engines.encoder.name == "tiktoken" and engines.check is None
    assert len(warned) == 1 and "unsupported pattern" in warned[0]


def test_a_long_document_is_encoded_while_write_orders_are_served():
    """A document of LONG_CHARS or more is encoded beside the worker's loop: `between()` (which
    answers write orders) runs while the engine works on it. The fake engine returns only once
    `between()` has run 3 times, as a long encode outlasts several service periods; before, it
    was never called inside a run, and this timed out."""
    import threading

    from shmloader.procs import worker

    served = threading.Semaphore(0)

    def slow_engine(texts, where):
        if len(texts[0]) >= worker.LONG_CHARS:
            for _ in range(3):
                assert served.acquire(timeout=10), "write orders were not served during a long document"
        ids = np.arange(sum(len(t) for t in texts), dtype=np.uint32)
        offsets = np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)
        return ids, offsets

    texts = ["short"] * 3 + ["x" * worker.LONG_CHARS] + ["tail"]
    tokens, lengths = worker.encode_texts(texts, slow_engine, 7, np.uint32, str, between=lambda beat=True: served.release())
    assert lengths.tolist() == [6, 6, 6, worker.LONG_CHARS + 1, 5]
    assert len(tokens) == int(lengths.sum()) and tokens[18] == 7  # the long one's BOS
    with pytest.raises(ZeroDivisionError):  # an engine's error reaches the worker's thread
        worker.encode_texts(["y" * worker.LONG_CHARS], lambda t, w: 1 / 0, 7, np.uint32, str, between=lambda beat=True: None)


def test_the_check_does_not_encode_a_huge_document_twice():
    calls = []
    encoder = enginemod.Encoder("fast", None, reference=lambda text: calls.append(len(text)) or [1], definition="x")
    check = enginemod.Check(encoder, start=2, every=1)
    huge = "z" * (enginemod.CHECK_MAX_CHARS + 1)
    check.batch(["a", huge, "b"], np.array([1, 1], dtype=np.uint32), np.array([0, 1, 1, 2]), lambda j: "?")
    assert calls == [1, 1] and check.too_long == 1 and check.checked == 2


def test_a_tokenizer_json_builds_the_engine_in_the_first_calls_and_names_it(monkeypatch):
    """The `tokenizers` definition (EARLY) pays rent from its first call, first batch included,
    and builds at once when it adds up; `state` names the engine in use at every step."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    monkeypatch.delenv(enginemod.AT_ENV, raising=False)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus.synthetic_texts(60, seed=3), trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    spec = tokmod.resolve(tok)
    engines = enginemod.Engines(spec, "auto", warn=pytest.fail)
    assert enginemod.name(engines.state) == "tokenizers" and enginemod.name(0) is None
    engines.price = 1e9  # not yet: the definition encodes
    text = " ".join(corpus.synthetic_texts(40, seed=5))
    engines.encode_batch([text], lambda j: "?")
    assert enginemod.name(engines.state) == "tokenizers" and engines._rent > 0
    engines.price = engines._rent  # the next call's rent reaches it: built and taken over at once
    engines.encode_batch([text], lambda j: "?")
    assert enginemod.name(engines.state) == "fastokens" and engines.check.seen == 0
    ids, offsets = engines.encode_batch([text, "a <|endoftext|> b"], lambda j: "?")
    reference = tokmod.build(spec)
    assert ids[offsets[0]:offsets[1]].tolist() == reference(text).tolist() and engines.check.checked == 2
    assert enginemod.name(enginemod.NAMES.index("tokenizers") + enginemod.BUILDING) == \
        "tokenizers, fast engine building"


def test_the_start_check_compares_what_fits_in_its_characters(synth_tokenizer):
    """Of the first START_DOCS documents, those that fit in START_CHARS characters in all are
    compared (a slow definition's start check stays short); the sampled check is unchanged."""
    encoder = enginemod.build(tokmod.resolve(synth_tokenizer), "fastokens")
    check = enginemod.Check(encoder)
    big = "word " * (enginemod.START_CHARS // 5 - 10)  # nearly all of them
    for text in [big, "small one", big, "another small one"]:
        check(text, encoder.encode(text), lambda: "?")
    assert check.checked == 3 and check.start_chars == enginemod.START_CHARS - len(big) - 26


def test_worker_pays_the_rent_per_run_and_may_build_once_past_its_first_piece(monkeypatch):
    """procs/worker.py `_rent`: each run of documents is rent, from the first; the build may
    start once the run has a batch (announced, or made by the head start), the worker has
    counted a piece or had a write order (or counts only), never while another loader of the
    process starts (docs/benchmarks.md, "More workers than cores")."""
    from types import SimpleNamespace

    from shmloader.ipc.ring import Counter
    from shmloader.procs import worker

    calls = []
    rent = SimpleNamespace(worked=lambda seconds, may_start=True: calls.append((seconds, may_start)))
    counters = np.zeros(max(Counter) + 1, dtype=np.int64)
    ctx = SimpleNamespace(ordered=False, counted=0, ring=SimpleNamespace(counters=counters))
    keep, count_only = SimpleNamespace(keep=True), SimpleNamespace(keep=False)
    worker._rent(ctx, rent, 0.01, keep)        # its first piece, no order yet: rent, no build
    worker._rent(ctx, rent, 0.01, count_only)  # a count-only run: nothing waits for a batch
    ctx.counted = 1
    worker._rent(ctx, rent, 0.02, keep)        # past its first piece
    ctx.counted, ctx.ordered = 0, True
    worker._rent(ctx, rent, 0.03, keep)        # a write order came: the first batch is planned
    ctx.ordered = False
    for counter in (Counter.ANNOUNCED, Counter.HEAD):  # on its first piece, the run's first batch made
        counters[counter] = 1
        worker._rent(ctx, rent, 0.05, keep)
        counters[counter] = 0
    ctx.ordered = True
    monkeypatch.setattr(worker, "pause_left_us", lambda counters: 1000)  # another loader starts
    worker._rent(ctx, rent, 0.04, keep)
    assert calls == [(0.01, False), (0.01, True), (0.02, True), (0.03, True), (0.05, True), (0.05, True),
                     (0.04, False)]


def test_worker_runs_say_when_they_begin_and_end():
    """`encode_texts` calls `running` before and `between` after every run of documents: the
    hooks the worker's rent is timed by (a run is about CHUNK_CHARS characters)."""
    from shmloader.procs import worker

    texts = ["a" * (worker.CHUNK_CHARS // 3)] * 9
    events = []
    worker.encode_texts(texts, lambda docs, where: (np.zeros(0, np.uint32), np.zeros(len(docs) + 1, np.int64)),
                        0, np.uint32, str, lambda: events.append("end"), lambda lo, hi: events.append("run"))
    assert events == ["run", "end"] * (len(events) // 2) and len(events) // 2 >= 3
