"""The third engine: gigatoken, for the tiktoken tokenizers whose split pattern it implements.

gigatoken (an optional package: `pip install shmloader[giga]`) encodes a byte-level BPE with
its own native pretokenizers, one per known split pattern (GPT-2's, cl100k's, o200k's, ...);
it does not take a pattern as a regex. So it is used only where it is proven equal:

- **The pattern.** A tokenizer's split pattern (`Encoding._pat_str`) must be, character for
  character, one of `SCHEMES`' (tiktoken's GPT-2/r50k, cl100k and o200k patterns and the
  original GPT-2 release's); nanochat's own pattern (cl100k's with `\\p{N}{1,2}`) is not one,
  and neither is a Hugging Face `tokenizer.json` (its added tokens would be special to
  gigatoken), so those stay with fastokens.
- **Special tokens.** The engine is built from the ranks alone, with no special tokens, so
  special-token text in a document ("<|bos|>") is ordinary text, as the stream's definition
  (`encode_ordinary`) has it: no document needs another engine.
- **A probe at build time.** `PROBE`'s texts (letters of several scripts, digits, contractions,
  whitespace runs, code, special-token text) are encoded by both; a difference refuses the
  engine (`Refused`), and "auto" goes on to fastokens.
- **The live check** (data/engine.py `Check`) then compares it with the definition on the
  run's own documents, as for any engine.

`build(spec) -> Built | Refused`: `Built.encode(text) -> ids` and `Built.batch(texts) -> (ids,
offsets)` on the calling thread (`parallel=False`: a worker is one process per core).
"""
from typing import Callable, NamedTuple

import numpy as np

from . import tokenizer as tokmod

# split pattern -> gigatoken's pretokenizer for it (tiktoken_ext/openai_public.py's patterns)
_R50K = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_GPT2_RELEASE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_CL100K = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$"""
           r"""|\s*[\r\n]|\s+(?!\S)|\s""")
_O200K = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+""",
])
SCHEMES = {_R50K: "gpt2", _GPT2_RELEASE: "gpt2", _CL100K: "cl100k", _O200K: "o200k"}

PROBE = [
    "Hello, world! It's 2026; we'll see what they've done — isn't it?",
    "  leading and trailing spaces   \n\n\tTabs\tand\r\nCRLF lines\n   \n",
    "digits 1 12 123 1234 12345 3.14159 -7e10 0x1F 1,000,000",
    " ".join(str(n) for n in range(0, 10000, 37)) + " 2026-12-02 15:39:48 1234567890 9876543210",
    "Ünïcödé: naïve café, Москва, 東京, 서울, العربية, हिन्दी, emoji 🙂🚀 and ‍joiners‍",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # code\n\n\nclass A(B): pass\n",
    "special-token text is ordinary here: <|bos|> <|endoftext|> <|user_start|>",
    "", " ", "\n", "a", "'s 'T 'Re 'vE 'm 'LL 'd", "CamelCaseWords HTTPServer iPhone ABCdef",
]


class Built(NamedTuple):
    scheme: str                                  # gigatoken's pretokenizer: "gpt2", "cl100k", ...
    encode: Callable                             # text -> ids (uint32)
    batch: Callable                              # texts -> (ids uint32, offsets int64)


class Refused(NamedTuple):
    why: str                                     # for "auto"'s note, or engine="gigatoken"'s error


def scheme(spec) -> str | None:
    """gigatoken's pretokenizer for `spec`'s split pattern, or None (not one it implements)."""
    if spec.kind != "tiktoken":
        return None
    return SCHEMES.get(tokmod.encoding(spec)._pat_str)


def build(spec, reference: Callable) -> Built | Refused:
    """gigatoken for `spec` (a tiktoken tokenizer), checked on `PROBE` against `reference` (the
    definition's `text -> ids`), or why not."""
    if spec.kind != "tiktoken":
        return Refused(f"gigatoken is used for tiktoken tokenizers only (this one is of kind {spec.kind!r})")
    enc = tokmod.encoding(spec)
    name = SCHEMES.get(enc._pat_str)
    if name is None:  # before the import: most tokenizers stop here at no cost
        return Refused("gigatoken does not implement this tokenizer's split pattern (it implements GPT-2's, "
                       "cl100k's and o200k's; nanochat's own differs from cl100k's in \\p{N}{1,2})")
    try:
        import gigatoken
    except ImportError:
        return Refused("gigatoken is not installed (pip install gigatoken)")
    with tokmod.ranks_file(enc) as path:
        tok = gigatoken.Tokenizer.from_tiktoken(path, pretokenizer=name)  # no special tokens: ordinary text

    def batch(texts: list) -> tuple:
        return _flat(tok.encode_batch(texts, parallel=False))

    def encode(text: str) -> np.ndarray:
        return batch([text])[0]

    for text in PROBE:
        ids, ref = encode(text), np.asarray(reference(text))
        if len(ids) != len(ref) or not np.array_equal(ids, ref):
            return Refused(f"gigatoken's {name} pretokenizer differs from this tokenizer's definition on "
                           f"{text[:40]!r}")
    return Built(name, encode, batch)


def _flat(arr) -> tuple:
    """(ids, offsets) of gigatoken's jagged result without a Python list per document."""
    layout = arr.layout
    if hasattr(layout, "offsets") and hasattr(layout.content, "data"):  # a ListOffsetArray of numbers
        offsets = np.asarray(layout.offsets.data).astype(np.int64, copy=False)
        ids = np.asarray(layout.content.data)
        if offsets[0]:
            ids, offsets = ids[offsets[0]:offsets[-1]], offsets - offsets[0]
        return ids.astype(np.uint32, copy=False), offsets
    import awkward as ak
    counts = np.asarray(ak.num(arr), dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return np.asarray(ak.flatten(arr), dtype=np.uint32), offsets
