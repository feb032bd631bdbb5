"""data/spm.py and its place in data/tokenizer.py and data/engine.py, in this process.

A SentencePiece `.model` (path, its directory, or a `SentencePieceProcessor`) resolves to one
spec of kind "sp" whose payload is the model's bytes and whose fingerprint is the same for
every form; BOS is the model's `bos_id()` unless `bos=` says otherwise; a model without BOS
and no `bos=` is a ValueError; a processor made with options that change its ids is refused;
the encoder rebuilt from the payload gives `sp.encode(text)`; no fast engine is built for it.
A file that is no tokenizer is a ValueError naming every kind accepted. (Through the loader's
workers: tests/loader/test_sentencepiece.py.)
"""
import pickle

import numpy as np
import pytest

from shmloader.data import engine as enginemod, spm, tokenizer as tokmod
from tests import helpers

sentencepiece = pytest.importorskip("sentencepiece")

TEXTS = ["hello world", "", "  spaces  and\ttabs\n", "naïve café 😀 <s> </s> <unk>", "1234 5678", "a" * 300]


@pytest.fixture(scope="module")
def sp(sp_model):
    return sentencepiece.SentencePieceProcessor(model_file=str(sp_model))


def test_every_form_of_one_model_is_one_spec(sp_model, sp):
    by_path, by_dir, by_obj = tokmod.resolve(str(sp_model)), tokmod.resolve(sp_model.parent), tokmod.resolve(sp)
    assert by_path.kind == "sp" and by_path.bos == sp.bos_id() == 1
    assert by_path.n_vocab == sp.get_piece_size() and by_path.dtype == np.uint32
    assert by_path.payload == sp.serialized_model_proto()
    assert by_path.fingerprint == by_dir.fingerprint == by_obj.fingerprint
    other = tokmod.resolve(sentencepiece.SentencePieceProcessor(model_proto=helpers.train_sp(vocab_size=300)))
    assert other.fingerprint != by_path.fingerprint, "another model must change the fingerprint"
    assert tokmod.resolve(sp, bos=2).fingerprint != by_path.fingerprint, "another BOS must change it"


def test_the_rebuilt_encoder_gives_the_models_ids(sp_model, sp):
    spec = pickle.loads(pickle.dumps(tokmod.resolve(str(sp_model))))  # as a worker gets it
    spm._PROCESSORS.pop(spec.fingerprint, None)  # a worker's process: built from the bytes
    encode = tokmod.build(spec)
    for text in TEXTS:
        ids = encode(text)
        assert ids.dtype == np.uint32 and ids.tolist() == sp.encode(text), text
    encoder = enginemod.build(spec)
    assert encoder.name == "sentencepiece" and encoder.reference is None
    ids, offsets = encoder.encode_batch(TEXTS)
    assert [ids[offsets[j]:offsets[j + 1]].tolist() for j in range(len(TEXTS))] == [sp.encode(t) for t in TEXTS]


def test_bos_is_the_models_unless_given(sp_model):
    assert tokmod.resolve(str(sp_model), bos=7).bos == 7
    no_bos = sentencepiece.SentencePieceProcessor(model_proto=helpers.train_sp(bos_id=-1))
    assert no_bos.bos_id() == -1
    with pytest.raises(ValueError, match=r"no BOS piece \(bos_id\(\) is -1.*pass bos="):
        tokmod.resolve(no_bos)
    assert tokmod.resolve(no_bos, bos=no_bos.eos_id()).bos == no_bos.eos_id()
    with pytest.raises(ValueError, match="not a piece of the SentencePiece model"):
        tokmod.resolve(str(sp_model), bos=10 ** 6)


def test_a_processor_whose_encode_differs_from_the_models_ids_is_refused(sp_model):
    for option in ("add_eos", "reverse"):
        proc = sentencepiece.SentencePieceProcessor(model_file=str(sp_model), **{option: True})
        with pytest.raises(ValueError, match=f"{option}=True"):
            tokmod.resolve(proc)
    # add_bos changes nothing: the loader puts BOS before every document itself
    with_bos = sentencepiece.SentencePieceProcessor(model_file=str(sp_model), add_bos=True)
    assert tokmod.resolve(with_bos).fingerprint == tokmod.resolve(str(sp_model)).fingerprint


def test_no_fast_engine_is_asked_of_it(sp_model):
    spec = tokmod.resolve(str(sp_model))
    for engine in ("fastokens", "gigatoken"):
        with pytest.raises(ValueError, match=f'engine="{engine}" cannot encode .*SentencePiece'):
            enginemod.available(engine, spec)
    enginemod.available("auto", spec)
    engines = enginemod.Engines(spec, "auto", at=0)
    assert engines.encoder.name == "sentencepiece" and enginemod.name(engines.state) == "sentencepiece"


@pytest.mark.parametrize("name, content", [("tok.bin", b"hello, not a tokenizer"),
                                           ("tokenizer.model", b"hello, not a model"),
                                           ("tokenizer.model", b""),
                                           ("tokenizer.json", b'{"not": "a tokenizer"}'),
                                           ("tokenizer.pkl", pickle.dumps({"a": "dict"}))])
def test_a_file_that_is_no_tokenizer_names_the_kinds_accepted(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises((ValueError, TypeError)) as info:
        tokmod.resolve(str(path))
    text = str(info.value)
    assert str(path) in text
    for kind in ("tiktoken", "tokenizer.pkl", "tokenizer.json", "SentencePiece .model", "encoding name"):
        assert kind in text, (kind, text)
