"""Trials of a new user, and of an adversary, on data shaped like users' data (the bugs they found,
each a test that failed before its fix).

- A web dump in JSON Lines whose text holds a lone surrogate escape (`"\\ud83d"`: half an emoji,
  as a scraper that cut a UTF-16 string writes it; valid JSON syntax, not valid Unicode text) is a
  `DataError` naming the file and line, and `on_bad_row_group="skip"` skips its unit, as invalid
  UTF-8 in a parquet file is: it was a worker's bare `UnicodeEncodeError` from the tokenizer, with
  no line, that `"skip"` did not skip.
"""
import itertools
import json
import warnings

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers

B, T = 2, 32


def _stream(docs, encode, bos) -> np.ndarray:
    """The concat stream of `docs` (nulls skipped), each `[bos] + encode(text)`."""
    out = []
    for d in docs:
        if d is not None:
            out += [bos, *encode(d)]
    return np.array(out, dtype=np.int64)


def _windows(loader, n) -> list:
    return [helpers.window_of(x, y) for x, y in itertools.islice(loader, n)]


def _write_jsonl(path, values: list):
    """One object a line, `values` already as JSON text (so that a line can hold any escape)."""
    path.write_text("".join('{"text": %s}\n' % v for v in values), encoding="utf-8")


def test_a_lone_surrogate_in_json_lines_is_a_data_error_naming_the_line_and_skip_skips_it(
        tmp_path, synth_tokenizer, watchdog):
    docs = list(corpus.synthetic_texts(2100, seed=9, mean_words=6))
    bad = 1500  # in the second unit of 1024 lines
    values = [json.dumps(d) for d in docs]
    values[bad] = '"cut \\ud83d emoji"'
    values[bad + 1] = '"a whole pair \\ud83d\\ude00 reads as its emoji"'
    docs[bad + 1] = "a whole pair \U0001F600 reads as its emoji"
    (tmp_path / "web").mkdir()
    _write_jsonl(tmp_path / "web" / "dump.jsonl", values)
    bos = synth_tokenizer.encode_single_token("<|bos|>")

    with shmloader.ShmLoader(str(tmp_path / "web"), synth_tokenizer, B, T, "all", device="cpu",
                             num_workers=2) as ld:
        with pytest.raises(shmloader.DataError, match=rf"dump\.jsonl: line {bad + 1}\b.*surrogate"):
            for _ in ld:
                pass

    kept = docs[:1024] + docs[2048:]  # the second unit (lines 1025-2048) skipped whole
    expected = _stream(kept, synth_tokenizer.encode_ordinary, bos)
    n = len(expected) // (B * T + 1)
    assert n > 100
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with shmloader.ShmLoader(str(tmp_path / "web"), synth_tokenizer, B, T, "all", device="cpu",
                                 num_workers=2, on_bad_row_group="skip") as ld:
            got = _windows(ld, n)
            skipped = ld.stats()["bad_row_groups_skipped"]
    assert np.array_equal(np.concatenate(got), expected[:n * (B * T + 1)])
    assert skipped == 1
    assert any(f"line {bad + 1}" in str(w.message) for w in seen)
