"""The token cache's files in this process (shmloader/data/cache.py): an entry's rows as a
Python slice; the documented layout of an entry, round trip with 2- and 4-byte tokens; empty
and all-null row groups; an id too wide for the entry refused, leaving no file; an entry
belongs to one version of its data file (size and mtime); partial entries (slices of a row
group) serve their rows, are refused for other rows, and merge into the whole entry once they
cover it. (The cache through the loader and tools/pretokenize.py: tests/loader/test_cache.py.)
"""
import hashlib
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from shmloader.data import cache as cachemod
from shmloader.data.formats.column import TOKENS
from tests.helpers import part_files, tmp_files

HEADER_BYTES = 64  # an entry's header: 8 x uint64


def test_entry_rows_match_a_python_slice():
    lengths = np.array([3, 0, 2, 4, 0, 1], dtype=np.int64)
    tokens = np.arange(10, dtype=np.uint16) + 100
    rows, at = [], 0
    for n in lengths:
        rows.append(tokens[at:at + n].tolist())
        at += n
    cases = 0
    for start in range(len(lengths) + 1):
        for end in range(start, len(lengths) + 1):
            got_len, got_tok = cachemod._Entry(lengths, tokens).rows(start, end)
            assert got_len.tolist() == lengths[start:end].tolist(), (start, end)
            assert got_tok.tolist() == sum(rows[start:end], []), (start, end)
            assert got_tok.dtype == tokens.dtype
            cases += 1
    assert cases == 28


@pytest.mark.parametrize("n_vocab,width", [(300, 2), (1 << 16, 2), ((1 << 16) + 1, 4), (0, 4)],
                         ids=["vocab300-u16", "vocab65536-u16", "vocab65537-u32", "unknown-u32"])
def test_store_load_round_trip_and_layout(tmp_path, n_vocab, width):
    """The documented layout: 8 x uint64 header (magic, version, n_rows, n_tokens, width,
    crc32(body), identity, rg), int64 lengths, then the tokens in 2 or 4 bytes."""
    src = tmp_path / "f.parquet"
    src.write_bytes(b"not read, only stat()ed")
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, size=40)
    lengths[::7] = 0                                   # null rows
    top = (1 << 16) - 1 if width == 2 else (1 << 32) - 1
    tokens = rng.integers(0, top, size=int(lengths.sum()), endpoint=True)
    tokens[-1] = top                                   # the largest id that fits
    cache = cachemod.TokenCache(str(tmp_path / "c"), "fp", n_vocab)
    cache.store(str(src), 3, lengths, tokens)
    got = cache.load(str(src), 3)
    assert got is not None
    assert got[0].tolist() == lengths.tolist() and got[1].tolist() == tokens.tolist()
    assert got[1].dtype.itemsize == width
    name = Path(cache.path_of(str(src), 3))
    assert name.parent == tmp_path / "c" / "fp" and name.name.endswith("-rg00003.tok")
    raw = name.read_bytes()
    assert len(raw) == HEADER_BYTES + 8 * len(lengths) + width * tokens.size
    head = np.frombuffer(raw[:HEADER_BYTES], dtype="<u8").tolist()
    assert head == [cachemod.MAGIC, cachemod.VERSION, len(lengths), tokens.size, width,
                    zlib.crc32(raw[HEADER_BYTES:]), cachemod.identity(str(src)), 3]
    assert np.frombuffer(raw[HEADER_BYTES:HEADER_BYTES + 8 * len(lengths)], "<i8").tolist() == lengths.tolist()
    assert np.frombuffer(raw[HEADER_BYTES + 8 * len(lengths):], f"<u{width}").tolist() == tokens.tolist()
    assert cache.load(str(src), 4) is None, "row group 4 was never stored"
    assert tmp_files(tmp_path / "c") == []


def test_store_load_empty_and_all_null_row_groups(tmp_path):
    src = tmp_path / "f.parquet"
    src.write_bytes(b"x")
    cache = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300)
    cache.store(str(src), 0, np.zeros(0, np.int64), np.zeros(0, np.int64))
    cache.store(str(src), 1, np.zeros(5, np.int64), np.zeros(0, np.int64))
    for rg, n_rows in ((0, 0), (1, 5)):
        got = cache.load(str(src), rg)
        assert got is not None, f"rg {rg}: an empty entry is valid"
        assert got[0].tolist() == [0] * n_rows and got[1].size == 0


def test_store_rejects_an_id_too_wide_and_leaves_no_file(tmp_path):
    src = tmp_path / "f.parquet"
    src.write_bytes(b"x")
    cache = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300)
    with pytest.raises(ValueError, match="65536"):
        cache.store(str(src), 0, np.array([2]), np.array([1, 1 << 16]))
    assert cache.load(str(src), 0) is None
    assert list((tmp_path / "c").rglob("*")) in ([], [tmp_path / "c" / "fp"])


def test_an_entry_belongs_to_one_version_of_the_data_file(tmp_path):
    src = tmp_path / "f.parquet"
    src.write_bytes(b"version one")
    cache = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300)
    cache.store(str(src), 0, np.array([2]), np.array([1, 2]))
    assert cache.load(str(src), 0) is not None
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))     # touched
    assert cachemod.TokenCache(str(tmp_path / "c"), "fp", 300).load(str(src), 0) is None
    src.write_bytes(b"version two!")                                        # other size
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))                      # old mtime (cp -p)
    assert cachemod.TokenCache(str(tmp_path / "c"), "fp", 300).load(str(src), 0) is None


def test_partial_entries_serve_their_rows_and_merge_when_complete(tmp_path):
    src = tmp_path / "f.parquet"
    src.write_bytes(b"x")
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 9, size=20)
    lengths[[3, 11]] = 0                                    # null rows
    tokens = rng.integers(0, 300, size=int(lengths.sum()))
    ends = np.concatenate(([0], np.cumsum(lengths)))
    rows = lambda a, b: (lengths[a:b], tokens[ends[a]:ends[b]])  # noqa: E731
    cache = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300)
    assert cache.load_rows(str(src), 0, 0, 5) is None
    assert cache.store_rows(str(src), 0, 5, 12, 20, *rows(5, 12)) is False
    assert cache.store_rows(str(src), 0, 0, 7, 20, *rows(0, 7)) is False     # overlapping
    for a, b in ((0, 12), (2, 9), (6, 7), (5, 12)):
        got = cache.load_rows(str(src), 0, a, b)
        assert got is not None and got[0].tolist() == lengths[a:b].tolist(), (a, b)
        assert got[1].tolist() == tokens[ends[a]:ends[b]].tolist() and got[1].dtype == np.uint16
    assert cache.load_rows(str(src), 0, 10, 13) is None and cache.load(str(src), 0) is None
    # a part renamed to other rows is never valid for them (the crc32 is seeded with its start)
    Path(cache.part_path(str(src), 0, 5, 12)).rename(cache.part_path(str(src), 0, 6, 13))
    assert cache.load_rows(str(src), 0, 7, 9) is None
    Path(cache.part_path(str(src), 0, 6, 13)).rename(cache.part_path(str(src), 0, 5, 12))
    assert cache.store_rows(str(src), 0, 12, 20, 20, *rows(12, 20)) is True   # complete: merged
    got = cache.load(str(src), 0)
    assert got[0].tolist() == lengths.tolist() and got[1].tolist() == tokens.tolist()
    whole = tmp_path / "whole"
    cachemod.TokenCache(str(whole), "fp", 300).store(str(src), 0, lengths, tokens)
    assert Path(cache.path_of(str(src), 0)).read_bytes() == next(whole.rglob("*.tok")).read_bytes()
    assert part_files(tmp_path / "c") == [] and not os.path.exists(cache.parts_dir(str(src), 0))
    assert tmp_files(tmp_path / "c") == []


def test_two_columns_of_one_file_are_two_entries(tmp_path):
    """`cache.File`: one file read in two columns (two sources of one mixture) keeps two entries,
    each found again by its own column (also by a new cache), never the other's; a path alone is
    its `text` column."""
    src = tmp_path / "f.parquet"
    src.write_bytes(b"two columns")
    text, ids = cachemod.File(str(src)), cachemod.File(str(src), "ids")
    cache = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300)
    cache.store(text, 0, np.array([2, 1]), np.array([1, 2, 3]))
    assert cache.load(ids, 0) is None, "the other column's tokens were served"
    cache.store(ids, 0, np.array([3]), np.array([7, 8, 9]))
    assert cache.path_of(text, 0) != cache.path_of(ids, 0) and cache.path_of(text, 0) == cache.path_of(str(src), 0)
    again = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300)
    for key, lengths, tokens in ((text, [2, 1], [1, 2, 3]), (str(src), [2, 1], [1, 2, 3]), (ids, [3], [7, 8, 9])):
        got = again.load(key, 0)
        assert got is not None and got[0].tolist() == lengths and got[1].tolist() == tokens, key
    assert tmp_files(tmp_path / "c") == []


def _keyed_before_the_bos_rule(path: str, column: str) -> int:
    """An entry's identity as the cache computed it before token ids were keyed by their BOS
    rule (of every column, text or ids): path, size, mtime and the column when not "text"."""
    st = os.stat(path)
    key = f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
    key = key if column == "text" else f"{key}\0{column}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def test_text_entries_keep_their_key_and_token_id_entries_made_before_the_bos_rule_are_misses(tmp_path):
    """Token ids already beginning with BOS were cached as [BOS, BOS, ...] before the worker
    stopped giving them a second: those entries, whole and partial, are keyed without the rule
    (`TOKEN_IDS_KEY`), so a cache of token ids never finds them and makes them again; text
    entries (of "text" and of another column) keep the key they had, found as they were."""
    src = tmp_path / "f.parquet"
    src.write_bytes(b"stat()ed")
    for column in ("text", "content"):
        assert cachemod.identity(str(src), None, column) == _keyed_before_the_bos_rule(str(src), column)
    assert cachemod.identity(str(src), None, "ids", TOKENS) != _keyed_before_the_bos_rule(str(src), "ids")
    old = cachemod.File(str(src), "ids", cachemod.TEXT)   # how the cache keyed token ids before the rule
    new = cachemod.File(str(src), "ids", TOKENS)
    cache = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300)
    two = np.array([3, 3]), np.array([7, 7, 1, 7, 7, 2])    # [BOS, BOS, id] twice: the old rule's
    cache.store(old, 0, *two)                                # a whole entry
    cache.store_rows(old, 1, 0, 1, 2, two[0][:1], two[1][:3])  # a partial entry
    assert cache.load(old, 0) is not None and cache.load_rows(old, 1, 0, 1) is not None
    again = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300)
    assert again.load(new, 0) is None and again.load_rows(new, 0, 0, 1) is None, "an old whole entry was served"
    assert again.load_rows(new, 1, 0, 1) is None, "an old partial entry was served"
    one = np.array([2, 2]), np.array([7, 1, 7, 2])
    again.store_rows(new, 1, 0, 1, 2, one[0][:1], one[1][:2])
    assert again.store_rows(new, 1, 1, 2, 2, one[0][1:], one[1][2:]) is True  # its parts merged
    got = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300).load(new, 1)
    assert got is not None and got[1].tolist() == [7, 1, 7, 2]


def test_partial_entries_merge_over_a_whole_entry_that_is_not_valid(tmp_path):
    """A whole entry that is there but not valid (torn, of another format version, another
    data file's) is a miss: the partial entries that cover its row group are merged into it,
    written again, not dropped at every store with the whole entry never made."""
    src = tmp_path / "f.parquet"
    src.write_bytes(b"x")
    lengths, tokens = np.array([2, 3]), np.array([1, 2, 3, 4, 5])
    cache = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300)
    cache.store(str(src), 0, lengths, tokens)
    name = Path(cache.path_of(str(src), 0))
    raw = bytearray(name.read_bytes())
    raw[8:16] = np.array([cachemod.VERSION + 1], dtype="<u8").tobytes()  # the header's version
    name.write_bytes(bytes(raw))
    cache = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300)
    assert cache.load_rows(str(src), 0, 0, 1) is None
    assert cache.store_rows(str(src), 0, 0, 1, 2, lengths[:1], tokens[:2]) is False
    assert cache.store_rows(str(src), 0, 1, 2, 2, lengths[1:], tokens[2:]) is True
    got = cachemod.TokenCache(str(tmp_path / "c"), "fp", 300).load(str(src), 0)
    assert got is not None and got[1].tolist() == tokens.tolist()
    assert part_files(tmp_path / "c") == [] and tmp_files(tmp_path / "c") == []
