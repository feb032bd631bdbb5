"""SentencePiece tokenizers: a `.model` file or a `sentencepiece.SentencePieceProcessor`.

A document is `[BOS] + sp.encode(text)`: the model's ids as `encode` gives them with
sentencepiece's defaults (no BOS or EOS added by sentencepiece, no sampling, not reversed),
where BOS is `bos=` when given, else the model's `bos_id()`; a model without one
(`bos_id() == -1`) needs `bos=`. A processor made with options that change `encode`'s ids
(`add_eos`, `reverse`, `enable_sampling`, ...) is refused rather than encoded otherwise than it
encodes. Control symbols (`<s>`, `</s>`) never come from text; user-defined symbols do, as the
model defines.

The spec's payload is the model's bytes (`serialized_model_proto()`; Llama-2's 32k pieces are
~500 KB, so they reach the workers in a file: data/tokenizer.py `spilled`) and each process
builds its processor from them once (`processor`; a 32k-piece model loads in milliseconds).
The fingerprint is the SHA-256 of those bytes with the BOS, so a
path, its directory and the processor of one model are one tokenizer to a resume state.
sentencepiece is both the definition and the engine (no faster engine is built or checked:
data/engine.py), one thread per worker (`num_threads=1`: a worker is a process per core).
Needs the optional package: `pip install shmloader[sp]`.
"""
import itertools

import numpy as np

# encode options a processor may carry (its constructor's keywords, kept in these attributes by
# sentencepiece 0.2) that would make its `encode` differ from the model's plain ids
_OPTIONS = {"_add_eos": "add_eos", "_reverse": "reverse", "_enable_sampling": "enable_sampling",
            "_emit_unk_piece": "emit_unk_piece"}

# fingerprint -> this process's processor, built once from a spec's bytes (with encode's defaults)
_PROCESSORS: dict[str, object] = {}


def _module():
    try:
        import sentencepiece
    except ImportError as exc:
        raise ImportError("a SentencePiece .model needs the 'sentencepiece' package: "
                          "pip install sentencepiece (or shmloader[sp])") from exc
    return sentencepiece


def is_processor(obj) -> bool:
    """Whether `obj` is a `sentencepiece.SentencePieceProcessor` (without importing sentencepiece)."""
    return type(obj).__module__.split(".")[0] == "sentencepiece" and hasattr(obj, "serialized_model_proto")


def read(path: str):
    """The processor of the `.model` file at `path` (sentencepiece's RuntimeError when the file is
    not a model it can parse)."""
    sentencepiece = _module()
    with open(path, "rb") as f:
        model = f.read()
    if not model:
        raise ValueError("an empty file")
    sp = sentencepiece.SentencePieceProcessor(model_proto=model)
    if sp.get_piece_size() <= 0:
        raise ValueError("not a SentencePiece model (it holds no pieces)")
    return sp


def describe(sp, bos: int | None) -> tuple[bytes, int, int]:
    """`(payload, bos, n_vocab)` of processor `sp`: its model's bytes, the BOS id (`bos`, else
    the model's `bos_id()`), its number of pieces."""
    options = [name for attr, name in _OPTIONS.items() if getattr(sp, attr, False)]
    if options:
        raise ValueError(f"the SentencePieceProcessor was made with {', '.join(f'{o}=True' for o in options)}, "
                         f"which changes its encode(); the loader encodes each document as the model's plain ids "
                         f"after BOS: pass the .model file, or a processor made without those options")
    n = sp.get_piece_size()
    if bos is None:
        bos = sp.bos_id()
        if bos < 0:
            raise ValueError(f"the SentencePiece model has no BOS piece (bos_id() is {bos}; it was trained "
                             f"with bos_id=-1): pass bos=<token id>, e.g. its eos_id() {sp.eos_id()}")
    if not 0 <= int(bos) < n:
        raise ValueError(f"bos={bos} is not a piece of the SentencePiece model (ids 0 to {n - 1})")
    return sp.serialized_model_proto(), int(bos), n


def processor(spec):
    """The processor of a spec of kind "sp", built from its bytes once per process."""
    sp = _PROCESSORS.get(spec.fingerprint)
    if sp is None:
        sp = _PROCESSORS[spec.fingerprint] = _module().SentencePieceProcessor(model_proto=spec.payload)
    return sp


def encoders(spec) -> tuple:
    """`(encode, batch)` of a spec of kind "sp": `text -> ids` and `texts -> (ids, offsets)`
    (uint32, no BOS), on this thread alone."""
    sp = processor(spec)

    def encode(text: str) -> np.ndarray:
        return np.asarray(sp.encode(text, out_type=int, num_threads=1), dtype=np.uint32)

    def batch(texts: list) -> tuple:
        lists = sp.encode(texts, out_type=int, num_threads=1)
        offsets = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum([len(ids) for ids in lists], out=offsets[1:])
        ids = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.uint32, count=int(offsets[-1]))
        return ids, offsets
    return encode, batch
