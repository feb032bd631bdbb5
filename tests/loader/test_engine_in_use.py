"""The engine in use, as the client sees it: `stats()["workers"][i]["engine"]`, best fit.

With a Hugging Face `tokenizer.json` (trained offline here) a best-fit loader's workers read
with fastokens from their first batch on: the `tokenizers` package, the definition, is tens
of times slower, so a worker builds the fast engine once it has tokenized for about as long
as the build costs, first batch included (data/engine.py `EARLY`; before, best fit tokenized
its whole first buffer with the definition). With the repo's tiktoken test tokenizer the
engine takes over after the first batch, as documented. Either way the batches equal, byte for
byte, those of `engine="tiktoken"` (the definition alone), whose workers name the definition.
No test knob here: the takeover is the loader's own (the suite's SHMLOADER_ENGINE_AT is unset,
and the fast loaders' workers start with `spawn` to see that).
"""
import time

import numpy as np
import pytest

import shmloader
from shmloader.data import engine as enginemod
from shmloader.demo import corpus

pytest.importorskip("fastokens")
pytest.importorskip("tokenizers")

B, T = 4, 64
BESTFIT = dict(packing="bos_bestfit", buffer_size=200, tokenizer_batch_size=16)
DEFINITION = {"hf": "tokenizers", "tiktoken": "tiktoken"}


@pytest.fixture(scope="module")
def docs_root(tmp_path_factory):
    """600 documents of ~300 words: the first batch's buffer holds 200, so a worker tokenizes
    well over the build's estimated cost with the definition before the first batch."""
    root = tmp_path_factory.mktemp("engine_in_use")
    docs = corpus.synthetic_texts(600, seed=35, mean_words=300)
    docs[4] = "special text <|endoftext|> is ordinary <|bos|> text"
    corpus.write_shards(docs, root, num_files=3, row_group_size=[50, 30])
    return root


def _read(root, tokenizer, engine, n=None, deadline_s=60.0):
    """(batches, engines at the first batch of the workers that had read by then, engines at the
    end): `n` batches, or (n None) batches until every worker names fastokens."""
    out = []
    method = "forkserver" if engine == "tiktoken" else "spawn"  # the definition alone needs no knob unset
    with shmloader.ShmLoader(str(root), tokenizer, B, T, "train", num_workers=2, device="cpu", timeout=60,
                             engine=engine, start_method=method, **BESTFIT) as loader:
        end = time.monotonic() + deadline_s
        for x, y in loader:
            out.append(np.concatenate([x.numpy().ravel(), y.numpy().ravel()]))
            workers = loader.stats()["workers"]
            names = [w["engine"] for w in workers]
            if len(out) == 1:  # a worker that has read nothing yet may not have started (None)
                first = [w["engine"] for w in workers if w["tokens"]]
            if len(out) == n or (n is None and names == ["fastokens"] * 2):
                return out, first, names
            assert time.monotonic() < end, f"after {len(out)} batches in {deadline_s} s the workers name {names}"
    raise AssertionError("the loader ended")


@pytest.mark.parametrize("kind", ["hf", "tiktoken"])
def test_bestfit_reads_with_the_fast_engine_and_the_definitions_batches(kind, docs_root, hf_json,
                                                                        synth_tokenizer, monkeypatch, watchdog):
    monkeypatch.delenv(enginemod.AT_ENV, raising=False)
    tokenizer = str(hf_json) if kind == "hf" else synth_tokenizer
    fast, first, last = _read(docs_root, tokenizer, "auto")
    assert last == ["fastokens", "fastokens"]
    assert first, "no worker had read anything at the first batch"
    if kind == "hf":  # the fast engine does the first batch's work too (on a busy machine one
        #               worker may make it all while the other still starts)
        assert set(first) == {"fastokens"}, f"at the first batch the workers that read named {first}"
    else:  # the first batch is the definition's, then the engine takes over
        assert set(first) <= {"tiktoken", "tiktoken, fast engine building", "fastokens"}, first
    reference, _, named = _read(docs_root, tokenizer, "tiktoken", n=max(len(fast), 3))
    assert named == [DEFINITION[kind]] * 2
    assert len(fast) >= 1 and len(reference) == max(len(fast), 3)
    for k, (a, b) in enumerate(zip(fast, reference)):
        assert a.tobytes() == b.tobytes(), f"batch {k} differs from the definition's"
