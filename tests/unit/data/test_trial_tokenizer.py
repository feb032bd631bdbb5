"""The adversarial new-user trial (December 2026): a tokenizer object whose encode() adds the
BOS itself (a Llama-style wrapper; transformers' add_special_tokens=True) made every document
[BOS, BOS, ...] without a word (the loader gives each document its own BOS). It is said once,
when the loader is made, with what to pass instead; the stream is unchanged."""
import warnings

import pytest

from shmloader.data import tokenizer as tokmod


class AddsBos:
    """encode() puts BOS (1) first, as Llama-style wrappers do by default."""

    def get_bos_token_id(self) -> int:
        return 1

    def encode(self, text):
        return [1] + [2 + ord(c) % 200 for c in text]


class NoBos(AddsBos):
    def encode(self, text):
        return [2 + ord(c) % 200 for c in text]


def test_an_encode_that_adds_bos_itself_is_told():
    with pytest.warns(UserWarning, match=r"AddsBos's encode\(\) begins every text with the BOS id 1 itself .*"
                                         r"every document begins \[BOS, BOS\]"):
        spec = tokmod.resolve(AddsBos())
    assert (spec.kind, spec.bos) == ("object", 1)


def test_an_encode_without_bos_and_bos_as_text_are_not_told():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokmod.resolve(NoBos())
        tokmod.resolve(AddsBos(), bos=7)  # another BOS: its first id is not the loader's BOS
