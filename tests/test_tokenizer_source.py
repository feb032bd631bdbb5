"""tokenizer.py (resolve, BOS rule, fingerprint, build) and source.py (list_files,
split_files, ParquetSource errors). Tokenizers are trained offline with shmloader_dev.corpus;
all data lives in tmp_path."""

import os
import pickle
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken

from shmloader_dev import corpus
from shmloader.errors import DataError
from shmloader.source import ParquetSource, list_files, split_files
from shmloader_dev.testing import IntTokenizer
from shmloader.tokenizer import TokenizerSpec, build, resolve

SPECIAL_TEXTS = ["<|bos|>", "a <|bos|> b", "<|endoftext|>", "x<|endoftext|>y<|bos|>",
                 "<|user_start|>hi<|assistant_end|>", "", "plain text, naïve café 😀"]


@pytest.fixture(scope="module")
def enc():
    return corpus.train_tokenizer(corpus.synthetic_texts(300), vocab_size=300)


@pytest.fixture(scope="module")
def enc_other():
    return corpus.train_tokenizer(corpus.synthetic_texts(300, seed=5), vocab_size=290)


def with_specials(enc, specials, name="custom"):
    """The same BPE ranks with another set of special tokens."""
    n = len(enc._mergeable_ranks)
    return tiktoken.Encoding(name, pat_str=enc._pat_str, mergeable_ranks=enc._mergeable_ranks,
                             special_tokens={s: n + i for i, s in enumerate(specials)})


class NanochatLike:
    """nanochat's RustBPETokenizer shape: a tiktoken Encoding in `.enc`, a BOS getter."""

    def __init__(self, enc, bos=None):
        self.enc = enc
        self._bos = bos if bos is not None else enc.encode_single_token("<|bos|>")

    def get_bos_token_id(self):
        return self._bos

    def encode(self, text, prepend=None, num_threads=None):
        raise AssertionError("resolve() must unwrap .enc, not pickle the wrapper")


# ------------------------------------------------------------------ resolve

def test_resolve_encoding(enc):
    spec = resolve(enc)
    assert isinstance(spec, TokenizerSpec) and spec.kind == "tiktoken"
    assert spec.bos == enc.encode_single_token("<|bos|>") == len(enc._mergeable_ranks)
    assert spec.dtype == np.uint32
    assert pickle.loads(spec.payload).encode_ordinary("hello world") == enc.encode_ordinary("hello world")


def test_resolve_pickle_path_and_directory(enc, tmp_path):
    path = corpus.save_tokenizer(enc, tmp_path / "tokenizer.pkl")
    a, b, c, d = resolve(enc), resolve(str(path)), resolve(path), resolve(str(tmp_path))
    assert a.bos == b.bos == c.bos == d.bos
    assert a.fingerprint == b.fingerprint == c.fingerprint == d.fingerprint
    assert b.kind == d.kind == "tiktoken"


def test_resolve_nanochat_wrapper(enc):
    spec = resolve(NanochatLike(enc))
    assert spec.kind == "tiktoken"
    assert spec.bos == enc.encode_single_token("<|bos|>")
    assert spec.fingerprint == resolve(enc).fingerprint
    assert build(spec)("a b c").tolist() == enc.encode_ordinary("a b c")
    # the wrapper's BOS id is the one used
    assert resolve(NanochatLike(enc, bos=7)).bos == 7


def test_resolve_int_tokenizer():
    spec = resolve(IntTokenizer(bos=5))
    assert spec.kind == "object" and spec.bos == 5 and spec.dtype == np.int64
    ids = build(spec)("3 1 4 1 5 9")
    assert ids.dtype == np.int64 and ids.tolist() == [3, 1, 4, 1, 5, 9]
    assert build(spec)("").tolist() == []
    assert resolve(IntTokenizer(bos=5)).fingerprint == spec.fingerprint
    assert resolve(IntTokenizer(bos=6)).fingerprint != spec.fingerprint


def test_resolve_rejects_other_objects():
    with pytest.raises(TypeError, match="tokenizer"):
        resolve(12345)
    with pytest.raises(TypeError):
        resolve(object())


# ------------------------------------------------------------------ BOS rule

def test_bos_prefers_bos_over_endoftext(enc):
    e = with_specials(enc, ["<|endoftext|>", "<|bos|>"])
    assert resolve(e).bos == len(enc._mergeable_ranks) + 1


def test_bos_falls_back_to_endoftext(enc):
    e = with_specials(enc, ["<|user_start|>", "<|endoftext|>"])
    assert resolve(e).bos == len(enc._mergeable_ranks) + 1


def test_no_bos_token_is_a_value_error(enc):
    e = with_specials(enc, ["<|user_start|>"], name="nobos")
    with pytest.raises(ValueError, match="BOS") as ei:
        resolve(e)
    assert "<|bos|>" in str(ei.value) and "<|endoftext|>" in str(ei.value)


# ------------------------------------------------------------------ bad paths

def test_missing_path_names_it(tmp_path):
    path = tmp_path / "nope" / "tokenizer.pkl"
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        resolve(str(path))


def test_directory_without_tokenizer_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(os.path.join(str(tmp_path), "tokenizer.pkl"))):
        resolve(tmp_path)


def test_default_path_uses_nanochat_base_dir(tmp_path, monkeypatch, enc):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))
    expected = os.path.join(str(tmp_path), "tokenizer", "tokenizer.pkl")
    with pytest.raises(FileNotFoundError, match=re.escape(expected)):
        resolve(None)
    corpus.save_tokenizer(enc, expected)
    assert resolve(None).fingerprint == resolve(enc).fingerprint


@pytest.mark.parametrize("content", [b"", b"not a pickle at all", pickle.dumps([1, 2])[:-3]])
def test_corrupt_pickle_is_a_value_error(tmp_path, content):
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        resolve(str(path))


def test_pickle_that_is_not_a_tokenizer_names_the_file(tmp_path):
    # SPEC 4: an error names the file; a tokenizer.pkl holding something else is bad input
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(pickle.dumps({"not": "a tokenizer"}))
    with pytest.raises((TypeError, ValueError)) as ei:
        resolve(str(path))
    assert str(path) in str(ei.value)


# ------------------------------------------------------------------ fingerprint

def test_fingerprint_stable_and_distinct(enc, enc_other):
    a1, a2 = resolve(enc).fingerprint, resolve(enc).fingerprint
    copy = pickle.loads(pickle.dumps(enc))
    assert a1 == a2 == resolve(copy).fingerprint
    assert isinstance(a1, str) and len(a1) >= 8
    assert resolve(enc_other).fingerprint != a1
    # same ranks, other special tokens
    assert resolve(with_specials(enc, ["<|bos|>"])).fingerprint != a1
    # retrained from the same texts: deterministic, so the same fingerprint
    again = corpus.train_tokenizer(corpus.synthetic_texts(300), vocab_size=300)
    assert resolve(again).fingerprint == a1


def test_fingerprint_depends_on_bos(enc):
    # SPEC 3: a state made under another tokenizer is refused. The BOS id is part of every
    # document, so a state made with bos=X must not resume silently under bos=Y.
    default = resolve(enc)
    other = resolve(enc, bos=7)
    assert other.bos == 7 and default.bos != 7
    assert other.fingerprint != default.fingerprint


def test_bos_override(enc):
    assert resolve(enc, bos=11).bos == 11
    assert resolve(NanochatLike(enc), bos=12).bos == 12
    assert resolve(IntTokenizer(bos=1), bos=13).bos == 13
    # an explicit bos= also rescues an encoding with no BOS token
    assert resolve(with_specials(enc, ["<|user_start|>"]), bos=3).bos == 3


def test_unknown_name_is_not_found():
    with pytest.raises(FileNotFoundError, match="no_such_tokenizer_name"):
        resolve("no_such_tokenizer_name")


# ------------------------------------------------------------------ build

def test_build_equals_encode_ordinary(enc):
    encode = build(resolve(enc))
    texts = [t for t in corpus.synthetic_texts(300) if t is not None] + SPECIAL_TEXTS
    assert sum("<|bos|>" in t for t in texts) > 5  # guard: special strings are present
    for text in texts:
        got = encode(text)
        assert got.dtype == np.uint32
        assert got.tolist() == enc.encode_ordinary(text), text
    bos = resolve(enc).bos
    assert bos not in encode("<|bos|>").tolist()


def test_build_from_pickle_path_matches(enc, tmp_path):
    path = corpus.save_tokenizer(enc, tmp_path)
    encode = build(resolve(str(path)))
    for text in SPECIAL_TEXTS:
        assert encode(text).tolist() == enc.encode_ordinary(text)


# ================================================================== source

def write(path, texts, row_group_size=None, schema=None):
    table = pa.table({"text": texts}) if schema is None else pa.table(texts, schema=schema)
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def test_list_files_directory_sorted_and_parquet_only(tmp_path):
    for name in ["b.parquet", "a.parquet", "c.parquet", "notes.txt", "a.parquet.tmp"]:
        (tmp_path / name).write_bytes(b"x")
    got = list_files(tmp_path)
    assert got == [os.path.join(str(tmp_path), n) for n in ["a.parquet", "b.parquet", "c.parquet"]]
    assert list_files(str(tmp_path)) == got


def test_list_files_glob_and_list(tmp_path):
    for name in ["s2.parquet", "s10.parquet", "s1.parquet", "t1.parquet"]:
        (tmp_path / name).write_bytes(b"x")
    got = list_files(str(tmp_path / "s*.parquet"))
    assert [os.path.basename(f) for f in got] == ["s1.parquet", "s10.parquet", "s2.parquet"]
    paths = [str(tmp_path / n) for n in ["t1.parquet", "s2.parquet", "s1.parquet"]]
    assert list_files(paths) == sorted(paths)
    assert list_files([tmp_path / "s1.parquet"]) == [str(tmp_path / "s1.parquet")]


def test_list_files_local_file_uris(tmp_path):
    for name in ["b.parquet", "a.parquet"]:
        (tmp_path / name).write_bytes(b"x")
    expected = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert list_files("file://" + str(tmp_path)) == expected
    assert list_files(["file://" + p for p in reversed(expected)]) == expected


def test_list_files_single_file(tmp_path):
    path = write(tmp_path / "one.parquet", ["a"])
    assert list_files(path) == [path]


def test_list_files_missing_dir(tmp_path):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(DataError, match=re.escape(str(missing))):
        list_files(missing)


def test_list_files_dir_without_parquet(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(DataError, match="parquet"):
        list_files(tmp_path)
    with pytest.raises(DataError):
        list_files(str(tmp_path / "*.parquet"))
    with pytest.raises(DataError):
        list_files([])


def test_list_files_default_is_nanochat_base_data(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(tmp_path))
    with pytest.raises(DataError, match=re.escape(os.path.join(str(tmp_path), "base_data"))):
        list_files(None)
    corpus.write_shards(["a", "b", "c"], tmp_path / "base_data", num_files=2)
    assert [os.path.basename(f) for f in list_files(None)] == ["shard_00000.parquet", "shard_00001.parquet"]


def test_split_files():
    files = ["a", "b", "c"]
    assert split_files(files, "train") == ["a", "b"]
    assert split_files(files, "val") == ["c"]
    assert split_files(["a", "b"], "train") == ["a"]
    assert split_files(["a"], "val") == ["a"]
    with pytest.raises(DataError, match="2 files"):
        split_files(["a"], "train")
    with pytest.raises(ValueError, match="split"):
        split_files(files, "test")


def test_parquet_source_reads_rows_with_nulls(tmp_path):
    docs = ["d0", None, "d2", "", "d4", "d5", "d6"]
    (path,) = corpus.write_shards(docs, tmp_path, num_files=1, row_group_size=[3, 4])
    src = ParquetSource([str(path)])
    assert src.row_counts(0) == [3, 4]
    assert src.read_texts(0, 0, 0, 3) == ["d0", None, "d2"]
    assert src.read_texts(0, 1, 1, 3) == ["d4", "d5"]
    assert src.read_texts(0, 0, 2, 3) == ["d2"]  # back to an earlier row group
    assert src.read_texts(0, 1, 0, 4) == ["", "d4", "d5", "d6"]


def test_parquet_source_large_string_is_fine(tmp_path):
    schema = pa.schema([("text", pa.large_string())])
    path = write(tmp_path / "l.parquet", {"text": ["x", "y"]}, schema=schema)
    assert ParquetSource([path]).read_texts(0, 0, 0, 2) == ["x", "y"]


def test_no_text_column_names_file_and_row_group(tmp_path):
    path = str(tmp_path / "notext.parquet")
    pq.write_table(pa.table({"content": ["a", "b", "c"]}), path, row_group_size=1)
    src = ParquetSource([path])
    assert src.row_counts(0) == [1, 1, 1]
    with pytest.raises(DataError) as ei:
        src.read_texts(0, 2, 0, 1)
    msg = str(ei.value)
    assert path in msg and "row group 2" in msg and "'text'" in msg and "content" in msg


def test_int_text_column_is_a_data_error(tmp_path):
    path = str(tmp_path / "ints.parquet")
    pq.write_table(pa.table({"text": [1, 2, 3]}), path, row_group_size=2)
    with pytest.raises(DataError) as ei:
        ParquetSource([path]).read_texts(0, 1, 0, 1)
    msg = str(ei.value)
    assert path in msg and "row group 1" in msg and "int64" in msg and "string" in msg


def test_truncated_file_is_a_data_error_naming_it(tmp_path):
    good = corpus.write_shards([f"doc {i}" for i in range(200)], tmp_path, num_files=1,
                               row_group_size=50)[0]
    data = good.read_bytes()
    bad = tmp_path / "truncated.parquet"
    bad.write_bytes(data[: len(data) // 2])
    src = ParquetSource([str(good), str(bad)])
    assert src.row_counts(0) == [50, 50, 50, 50]
    with pytest.raises(DataError, match=re.escape(str(bad))):
        src.row_counts(1)
    with pytest.raises(DataError, match=re.escape(str(bad))):
        ParquetSource([str(bad)]).read_texts(0, 0, 0, 1)


def test_non_parquet_file_is_a_data_error_naming_it(tmp_path):
    bad = tmp_path / "junk.parquet"
    bad.write_text("this is not parquet\n" * 100)
    with pytest.raises(DataError, match=re.escape(str(bad))):
        ParquetSource([str(bad)]).row_counts(0)
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=re.escape(str(empty))):
        ParquetSource([str(empty)]).row_counts(0)


def test_missing_file_is_a_data_error_naming_it(tmp_path):
    gone = tmp_path / "gone.parquet"
    with pytest.raises(DataError, match=re.escape(str(gone))):
        ParquetSource([str(gone)]).row_counts(0)


def test_corrupt_data_page_is_a_data_error_naming_file_and_row_group(tmp_path):
    # footer intact, the bytes of the data pages overwritten: opening works, reading fails
    path = tmp_path / "pages.parquet"
    texts = [f"document number {i} " * 20 for i in range(100)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=50, compression="snappy")
    md = pq.ParquetFile(path).metadata
    col = md.row_group(1).column(0)
    start = col.dictionary_page_offset or col.data_page_offset
    raw = bytearray(path.read_bytes())
    raw[start:start + col.total_compressed_size] = b"\xff" * col.total_compressed_size
    path.write_bytes(bytes(raw))
    src = ParquetSource([str(path)])
    assert src.read_texts(0, 0, 0, 2) == texts[:2]  # row group 0 is intact
    with pytest.raises(DataError) as ei:
        src.read_texts(0, 1, 0, 1)
    assert str(path) in str(ei.value) and "row group 1" in str(ei.value)


# ------------------------------------------------------------------ Hugging Face tokenizers

@pytest.fixture(scope="module")
def hf_tok():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([t for t in corpus.synthetic_texts(300) if t], trainer)
    return tok


def test_hf_resolve_object_path_and_directory(hf_tok, tmp_path):
    spec = resolve(hf_tok)
    assert spec.kind == "hf" and spec.dtype == np.uint32 and spec.n_vocab == hf_tok.get_vocab_size()
    assert spec.bos == hf_tok.token_to_id("<|endoftext|>")  # before "<s>" in the BOS order
    hf_tok.save(str(tmp_path / "tokenizer.json"))
    for source in (str(tmp_path / "tokenizer.json"), tmp_path):
        other = resolve(source)
        assert (other.kind, other.bos) == ("hf", spec.bos)
        assert build(other)("hello world").tolist() == build(spec)("hello world").tolist()
    assert resolve(hf_tok, bos=5).bos == 5


def test_hf_fingerprint_same_for_object_and_its_file(hf_tok, tmp_path):
    # the same tokenizer passed as a Tokenizer or as its tokenizer.json must resume each
    # other's states; Tokenizer.save() writes pretty JSON, to_str() compact JSON
    path = tmp_path / "tokenizer.json"
    hf_tok.save(str(path))
    assert resolve(str(path)).fingerprint == resolve(hf_tok).fingerprint
    assert resolve(hf_tok).fingerprint == resolve(hf_tok).fingerprint


def test_directory_with_both_files_prefers_tokenizer_pkl(hf_tok, enc, tmp_path):
    hf_tok.save(str(tmp_path / "tokenizer.json"))
    corpus.save_tokenizer(enc, tmp_path / "tokenizer.pkl")
    spec = resolve(tmp_path)
    assert spec.kind == "tiktoken" and spec.fingerprint == resolve(enc).fingerprint


def test_hf_build_treats_special_text_as_ordinary(hf_tok):
    encode = build(resolve(hf_tok))
    specials = {hf_tok.token_to_id("<|endoftext|>"), hf_tok.token_to_id("<s>")}
    for text in SPECIAL_TEXTS + ["a <s> b"]:
        ids = encode(text)
        assert ids.dtype == np.uint32
        assert not specials & set(ids.tolist()), text
        assert hf_tok.decode(ids.tolist(), skip_special_tokens=False) == text


def test_hf_without_bos_token_is_a_value_error(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["hello world"] * 10, trainers.BpeTrainer(vocab_size=300,
                                                                      special_tokens=["<pad>"],
                                                                      show_progress=False))
    with pytest.raises(ValueError, match="bos"):
        resolve(tok)
    assert resolve(tok, bos=0).bos == 0


def test_invalid_utf8_is_a_data_error_naming_file_and_row_group(tmp_path):
    path = str(tmp_path / "bad_utf8.parquet")
    offsets = pa.py_buffer(np.array([0, 2, 4], dtype=np.int32).tobytes())
    arr = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"ok\xff\xfe")])
    pq.write_table(pa.table({"text": arr}), path)
    src = ParquetSource([path])
    assert src.read_texts(0, 0, 0, 1) == ["ok"]
    with pytest.raises(DataError) as ei:
        src.read_texts(0, 0, 0, 2)
    assert path in str(ei.value) and "row group 0" in str(ei.value) and "UTF-8" in str(ei.value)
