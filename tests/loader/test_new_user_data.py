"""A new user's data, shaped unlike the other tests' (December 2026 trial; each locks a shape
in): every loader's concat stream is `[BOS] + encode(text)` of its documents in order, byte
for byte.

- parquet files of every string layout in one directory: `large_string` holding a 10 MB
  document (a run of its own, tokenized on the worker's thread), a dictionary-encoded column,
  row groups of one row, a file of zero row groups, `string_view`;
- JSON Lines as Windows and other tools write it: a UTF-8 BOM, CRLF line ends, blank CRLF
  lines, no newline after the last line, raw U+2028/U+2029/NEL inside strings
  (`ensure_ascii=False`: a line splitter on Unicode line breaks would cut them), CJK, emoji
  and right-to-left text; plain, `.gz` of two gzip members (`cat a.gz b.gz`) and `.zst` of two
  frames (pzstd, `cat`), the members' seam inside the second unit of 1024 lines;
- a `.json` file that is one JSON array, with a UTF-8 BOM first, is told how to convert it, as
  without one (the one bug the trial found: the BOM hid the `[`).
"""
import gzip
import itertools
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 4, 256
W = B * T + 1
UNICODE = ["日本語のテキスト、漢字とかな。", "emoji 😀🎉👩‍👩‍👧 family", "עברית מימין לשמאל", "العربية نص",
           "line\u2028sep\u2029para\x85nel", "tab\tcr\r", ""]


def _stream(docs, tok) -> np.ndarray:
    bos = tok.encode_single_token("<|bos|>")
    return np.array([t for d in docs if d is not None for t in (bos, *tok.encode_ordinary(d))], dtype=np.int64)


def _check(data, docs, tok, n_max=None):
    want = _stream(docs, tok)
    n = len(want) // W if n_max is None else min(n_max, len(want) // W)
    assert n >= 5
    with shmloader.ShmLoader(data, tok, B, T, "all", device="cpu", num_workers=2, timeout=120) as loader:
        got = [helpers.window_of(x, y) for x, y in itertools.islice(loader, n)]
    assert len(got) == n
    for i, w in enumerate(got):
        assert np.array_equal(w, want[i * W:(i + 1) * W]), f"batch {i} differs"


@pytest.mark.deadline(180)  # 10 MB of text to tokenize: 7.5 s at load 15 on 2 cores
def test_parquet_of_every_string_layout_in_one_directory(tmp_path, synth_tokenizer):
    docs = list(corpus.synthetic_texts(400, seed=8, mean_words=12)) + UNICODE * 3
    docs[40] = ("lorem ipsum dolor sit amet " * 400_000)[:10_000_000]
    d = tmp_path / "d"
    d.mkdir()
    parts = [docs[:100], docs[100:200], docs[200:230], [], docs[230:]]
    pq.write_table(pa.table({"text": pa.array(parts[0], pa.large_string())}), d / "0.parquet", row_group_size=16)
    pq.write_table(pa.table({"text": pa.array(parts[1]).dictionary_encode()}), d / "1.parquet", row_group_size=32)
    pq.write_table(pa.table({"text": parts[2]}), d / "2.parquet", row_group_size=1)
    pq.ParquetWriter(d / "3.parquet", pa.schema([("text", pa.string())])).close()  # zero row groups
    pq.write_table(pa.table({"text": pa.array(parts[4], pa.string()).cast(pa.string_view())}), d / "4.parquet",
                   row_group_size=50)
    assert pq.ParquetFile(d / "3.parquet").metadata.num_row_groups == 0
    _check(str(d), docs, synth_tokenizer)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "jsonl.zst"])
def test_json_lines_as_other_tools_write_it(tmp_path, synth_tokenizer, fmt):
    docs = list(corpus.synthetic_texts(2400, seed=9, mean_words=4))
    docs[::97] = UNICODE * (len(docs[::97]) // len(UNICODE)) + UNICODE[:len(docs[::97]) % len(UNICODE)]
    lines = [json.dumps({"text": t}, ensure_ascii=False) for t in docs]
    lines[500:500] = ["", "  "]  # blank lines (CRLF ends), skipped
    halves = ["\ufeff" + "\r\n".join(lines[:1500]) + "\r\n", "\r\n".join(lines[1500:])]  # no final newline
    raw = [h.encode("utf-8") for h in halves]
    d = tmp_path / "d"
    d.mkdir()
    path = d / f"a.{fmt}"
    if fmt == "jsonl":
        path.write_bytes(b"".join(raw))
    elif fmt == "jsonl.gz":
        path.write_bytes(b"".join(gzip.compress(r) for r in raw))  # two members
    else:
        frames = []
        for r in raw:
            sink = pa.BufferOutputStream()
            with pa.CompressedOutputStream(sink, "zstd") as f:
                f.write(r)
            frames.append(sink.getvalue().to_pybytes())
        path.write_bytes(b"".join(frames))
    _check(str(d), docs, synth_tokenizer)


@pytest.mark.parametrize("bom", [False, True], ids=["plain", "bom"])
def test_a_json_array_file_is_told_to_convert_with_or_without_a_bom(tmp_path, synth_tokenizer, bom):
    """A `.json` file that is one JSON array (`json.dump(list)`), as Windows tools write it with
    a UTF-8 BOM first: the same advice (`jq -c '.[]'`) as without (with one it was "line 1 has
    no 'text' field (found a JSON list)")."""
    d = tmp_path / "d"
    d.mkdir()
    for name in ("a", "b"):
        (d / f"{name}.json").write_bytes((b"\xef\xbb\xbf" if bom else b"") + json.dumps([{"text": "x"}] * 3).encode())
    with pytest.raises(shmloader.DataError, match=r"a\.json: the file is one JSON array .*jq -c"):
        with shmloader.ShmLoader(str(d), synth_tokenizer, B, T, device="cpu", num_workers=1, timeout=60) as loader:
            next(loader)
