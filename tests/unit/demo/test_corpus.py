"""Tests for shmloader.demo.corpus in this process: exact row groups, nulls, naming, corpus
determinism, tokenizer determinism / round trip / special ids, pickle save-load. (The
tokenizer retrained in another process, and tools/make_shards.py run as a user runs it:
tests/loader/test_corpus.py.)

Inputs are small so the whole file runs in a few seconds on 2 cores; no conftest needed.
"""

from __future__ import annotations

import pickle
import sysconfig
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from shmloader.demo import corpus
from tests.helpers import read_texts, row_group_sizes

SPECIAL_STRINGS = ("<|bos|>", "<|endoftext|>", "<|user_start|>", "<|assistant_end|>")


# ---------------------------------------------------------------- write_shards

def test_uneven_row_groups_exact_per_file_and_order_kept(tmp_path):
    docs = [f"doc {i}" for i in range(23)]
    paths = corpus.write_shards(docs, tmp_path, num_files=3, row_group_size=[5, 1, 2])
    assert [pq.ParquetFile(p).metadata.num_rows for p in paths] == [8, 8, 7]
    # the size cycle restarts in every file; the last group takes what is left
    assert [row_group_sizes(p) for p in paths] == [[5, 1, 2], [5, 1, 2], [5, 1, 1]]
    assert read_texts(paths) == docs


def test_int_row_group_size_and_single_row_groups(tmp_path):
    docs = [str(i) for i in range(10)]
    (path,) = corpus.write_shards(docs, tmp_path / "a", num_files=1, row_group_size=4)
    assert row_group_sizes(path) == [4, 4, 2]
    (path,) = corpus.write_shards(docs, tmp_path / "b", num_files=1, row_group_size=1)
    assert row_group_sizes(path) == [1] * 10
    assert read_texts([path]) == docs


@settings(max_examples=25, deadline=None)
@given(n_docs=st.integers(1, 40), num_files=st.integers(1, 6),
       sizes=st.lists(st.integers(1, 7), min_size=1, max_size=4))
def test_row_groups_property(n_docs, num_files, sizes):
    num_files = min(num_files, n_docs)
    docs = [f"d{i}" for i in range(n_docs)]
    with tempfile.TemporaryDirectory() as d:
        paths = corpus.write_shards(docs, d, num_files=num_files, row_group_size=sizes)
        counts = [pq.ParquetFile(p).metadata.num_rows for p in paths]
        assert sum(counts) == n_docs and max(counts) - min(counts) <= 1
        for path, count in zip(paths, counts):
            got = row_group_sizes(path)
            expected, left, k = [], count, 0
            while left > 0:
                expected.append(min(sizes[k % len(sizes)], left))
                left -= expected[-1]
                k += 1
            assert got == expected
        assert read_texts(paths) == docs


def test_nulls_written_as_nulls(tmp_path):
    docs = ["a", None, "", None, "b"]
    paths = corpus.write_shards(docs, tmp_path, num_files=2, row_group_size=2)
    column = pa.concat_arrays([pq.read_table(p).column("text").combine_chunks() for p in paths])
    assert column.null_count == 2
    assert column.to_pylist() == docs  # "" stays an empty string, not a null


def test_schema_naming_and_sorting(tmp_path):
    calls = []
    paths = corpus.write_shards([str(i) for i in range(12)], tmp_path / "new" / "dir",
                                num_files=12, prefix="part-", on_file_written=calls.append)
    names = [p.name for p in paths]
    assert names == [f"part-{i:05d}.parquet" for i in range(12)]
    assert calls == paths
    assert sorted(p.name for p in (tmp_path / "new" / "dir").iterdir()) == names
    schema = pq.read_schema(paths[0])
    assert schema.names == ["text"] and schema.field("text").type == pa.string()


@pytest.mark.parametrize("kwargs", [dict(num_files=0), dict(num_files=4),
                                    dict(num_files=1, row_group_size=0),
                                    dict(num_files=1, row_group_size=[])])
def test_write_shards_rejects_bad_args(tmp_path, kwargs):
    with pytest.raises(ValueError, match="expected|row_group_size"):
        corpus.write_shards(["a", "b", "c"], tmp_path, **kwargs)


# ---------------------------------------------------------------- corpora

def test_synthetic_texts_mix_and_determinism():
    docs = corpus.synthetic_texts(100, seed=3)
    assert len(docs) == 100 and all(isinstance(d, str) for d in docs)
    assert docs == corpus.synthetic_texts(100, seed=3)
    assert docs[:37] == corpus.synthetic_texts(37, seed=3)
    assert docs != corpus.synthetic_texts(100, seed=4)
    n_words = [len(d.split()) for d in docs]
    assert docs.count("") == 5  # one per block of 20
    assert sum(n >= 3000 for n in n_words) == 5
    assert sum(any(s in d for s in SPECIAL_STRINGS) for d in docs) == 10
    assert sum(any(ord(c) > 127 for c in d) for d in docs) > 50
    assert corpus.synthetic_texts(0) == []


def test_stdlib_texts_order_and_limit():
    from pydoc_data.topics import topics

    texts = corpus.stdlib_texts(len(topics) + 20)
    assert texts[:len(topics)] == [topics[k] for k in sorted(topics)]
    code = texts[len(topics):]
    assert len(code) == 20 and sum("def " in t or "import " in t for t in code) >= 10
    assert corpus.stdlib_texts(5) == texts[:5]
    root = Path(sysconfig.get_paths()["stdlib"])
    rel = [p.relative_to(root).as_posix() for p in corpus._stdlib_sources()]
    assert len(rel) > 100 and rel == sorted(rel)
    assert not any(part in ("site-packages", "test", "tests")
                   for r in rel for part in r.split("/"))


# ---------------------------------------------------------------- tokenizer

def test_tokenizer_ids_and_specials(enc):
    n_ranks = len(enc._mergeable_ranks)
    assert enc.n_vocab == 1024 and n_ranks == 1024 - len(corpus.SPECIAL_TOKENS)
    assert enc.encode_single_token("<|bos|>") == n_ranks
    assert [enc.encode_single_token(s) for s in corpus.SPECIAL_TOKENS] == \
        list(range(n_ranks, n_ranks + len(corpus.SPECIAL_TOKENS)))
    assert all(enc.encode_single_token(bytes([b])) < n_ranks for b in range(256))
    assert enc.encode("<|bos|>hi", allowed_special="all")[0] == n_ranks


def test_tokenizer_deterministic(small_texts, enc):
    again = corpus.train_tokenizer(iter(small_texts), 1024)  # any iterable, e.g. a generator
    assert again._mergeable_ranks == enc._mergeable_ranks
    assert again._special_tokens == enc._special_tokens and again._pat_str == enc._pat_str


def test_round_trip_including_special_strings_as_text(enc):
    bos = enc.encode_single_token("<|bos|>")
    texts = corpus.stdlib_texts(100)[75:] + corpus.synthetic_texts(60, seed=9)
    texts += ["<|bos|>", "a<|endoftext|>b", "<|bos|><|user_start|>", "naïve 日本語 🚀\r\n\t x"]
    assert any(s in t for t in texts for s in SPECIAL_STRINGS)
    for text in texts:
        ids = enc.encode_ordinary(text)
        assert enc.decode(ids) == text
        assert all(i < bos for i in ids)  # special-token strings are plain text here


def test_tokenizer_rejects_tiny_vocab():
    with pytest.raises(ValueError, match="vocab_size must be >= 265"):
        corpus.train_tokenizer(["abc"], 264)


def test_save_tokenizer_file_and_directory(enc, tmp_path):
    as_file = corpus.save_tokenizer(enc, tmp_path / "sub" / "tok.pkl")
    assert as_file == tmp_path / "sub" / "tok.pkl"
    as_dir = corpus.save_tokenizer(enc, tmp_path)
    assert as_dir == tmp_path / "tokenizer.pkl"
    sample = "def f(x):\n    return x + 1  # café <|bos|>"
    for path in (as_file, as_dir):
        with open(path, "rb") as f:
            loaded = pickle.load(f)
        assert loaded.encode_ordinary(sample) == enc.encode_ordinary(sample)
        assert loaded.encode_single_token("<|bos|>") == enc.encode_single_token("<|bos|>")


# ---------------------------------------------------------------- exact row groups, benchmark corpora

def test_row_group_sizes_exact_and_files_are_runs_of_them(tmp_path):
    docs = [f"doc {i}" for i in range(20)]
    sizes = [3, 1, 7, 2, 5, 2]
    paths = corpus.write_shards(docs, tmp_path, num_files=4, row_group_sizes=sizes)
    # 6 row groups over 4 files: 2, 2, 1, 1 of them, in order
    assert [row_group_sizes(p) for p in paths] == [[3, 1], [7, 2], [5], [2]]
    assert read_texts(paths) == docs
    (one,) = corpus.write_shards(docs, tmp_path / "one", num_files=1, row_group_sizes=sizes,
                                 row_group_size=4)  # row_group_sizes replaces row_group_size
    assert row_group_sizes(one) == sizes


@pytest.mark.parametrize("kwargs", [dict(num_files=1, row_group_sizes=[2, 2]),  # sums to 4, not 3
                                    dict(num_files=1, row_group_sizes=[3, 0]),
                                    dict(num_files=1, row_group_sizes=[]),
                                    dict(num_files=3, row_group_sizes=[1, 2]),  # fewer groups than files
                                    dict(num_files=0, row_group_sizes=[3])])
def test_row_group_sizes_rejects_bad_args(tmp_path, kwargs):
    with pytest.raises(ValueError, match="row_group_sizes|num_files"):
        corpus.write_shards(["a", "b", "c"], tmp_path, **kwargs)


def _letters_share(docs) -> float:
    text = "".join(docs)
    return sum(c.isalpha() or c == " " for c in text) / len(text)


def test_nanochat_corpus_geometry_lengths_and_determinism(enc):
    docs, sizes = corpus.nanochat_corpus(3000, seed=1)
    assert sizes == [1024, 1024, 952] and len(docs) == sum(sizes) == 3000
    assert (docs, sizes) == corpus.nanochat_corpus(3000, seed=1)
    assert docs != corpus.nanochat_corpus(3000, seed=2)[0]
    lengths = sorted(map(len, docs))
    mean, median = sum(lengths) / len(lengths), lengths[len(lengths) // 2]
    assert 4000 < mean < 5400 and 2400 < median < 3300  # log-normal: mean 4.7K, median 2.85K
    assert lengths[0] >= 32 and lengths[-1] > 10 * median  # a long tail
    assert lengths[int(0.99 * len(lengths))] > 5 * median
    assert _letters_share(docs[:200]) > 0.8 and sum("\n\n" in d for d in docs) > 1500  # prose, in paragraphs
    # BPE reads it like the prose it was made from: about as many characters per token
    from pydoc_data.topics import topics

    prose = " ".join(topics[k] for k in sorted(topics))[:200_000]
    ours = "".join(docs[:100])[:200_000]
    rate = lambda text: len(text) / len(enc.encode_ordinary(text))  # noqa: E731
    assert 0.8 < rate(ours) / rate(prose) < 1.25


def test_nanochat_corpus_sizes_are_configurable():
    docs, sizes = corpus.nanochat_corpus(50, seed=0, row_group_docs=16, mean_chars=500)
    assert sizes == [16, 16, 16, 2] and 300 < sum(map(len, docs)) / 50 < 800
    with pytest.raises(ValueError, match="n_docs"):
        corpus.nanochat_corpus(0)


def test_skewed_corpus_row_groups_and_lengths():
    docs, sizes = corpus.skewed_corpus(4000, seed=0)
    assert sum(sizes) == len(docs) == 4000 and all(1 <= s <= 500 for s in sizes)
    assert (docs, sizes) == corpus.skewed_corpus(4000, seed=0)
    assert docs != corpus.skewed_corpus(4000, seed=1)[0]
    # log-uniform counts: tiny, middling and large row groups alike
    assert min(sizes) <= 5 and max(sizes) >= 200 and any(20 <= s <= 100 for s in sizes)
    lengths = [len(d) for d in docs]
    assert max(lengths) <= 100_000 and max(lengths) > 80_000
    assert docs.count("") > 20
    assert sum(0 < n <= 200 for n in lengths) > 400  # one-liners
    assert sum(n >= 20_000 for n in lengths) > 100  # long web pages and code
    assert sum("def " in d or "import " in d for d in docs) > 200  # code-like documents
    # row groups far apart in characters, not only in documents
    chars, start = [], 0
    for n in sizes:
        chars.append(sum(lengths[start:start + n]))
        start += n
    assert min(chars) < 1000 and max(chars) > 20 * sorted(chars)[len(chars) // 2] > 1_000_000


def test_skewed_corpus_limits_are_configurable():
    docs, sizes = corpus.skewed_corpus(300, seed=3, max_row_group_docs=10, max_chars=2000)
    assert all(1 <= s <= 10 for s in sizes) and max(map(len, docs)) <= 2000 and sum(sizes) == 300


def test_benchmark_corpora_written_as_nanochat_writes_its_shards(tmp_path):
    docs, sizes = corpus.nanochat_corpus(2100, seed=0)
    paths = corpus.write_shards(docs, tmp_path, num_files=2, row_group_sizes=sizes)
    assert [row_group_sizes(p) for p in paths] == [[1024, 1024], [52]]
    column = pq.ParquetFile(paths[0]).metadata.row_group(0).column(0)
    assert column.compression == "ZSTD" and not any("DICTIONARY" in e for e in column.encodings)
    assert read_texts(paths) == docs
