"""Users' data as it ships (issue 51): every format and column kind gives the parquet `text`
loader's batches, byte for byte.

The same documents are written as parquet (`text`, and `content` read with `column=`), JSON
Lines plain, .gz and .zst, Arrow IPC file and stream, and a token-id column (each text's ids
under the same tokenizer); every one gives the batches of the parquet `text` loader, under
concat and best fit, with 1 and 3 workers. A `.jsonl.zst` state resumes exactly with another
worker count; on 2 ranks each document of an epoch is read once; a mixture of a parquet source
and a JSON Lines `Source` with another column gives the batches of the same mixture in
parquet; bad lines are `DataError`s naming the file and the line (or skipped, and counted);
a state of one column is refused by a loader of another.
"""
import functools
import itertools
import json
import os

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import formats_data, helpers, oracle

B, T = 4, 64
N_BATCHES = 120  # past the first unit of 1024 documents and into the second file


@functools.lru_cache(maxsize=None)
def documents() -> tuple:
    """3 files of 1100 documents (units of 1024 and 76); train is the first two."""
    docs = corpus.synthetic_texts(3300, seed=5, mean_words=12)
    return tuple(tuple(docs[i * 1100:(i + 1) * 1100]) for i in range(3))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, synth_tokenizer) -> dict:
    """Every format's directory of the same documents."""
    root = tmp_path_factory.mktemp("formats")
    files = [list(f) for f in documents()]
    out = {}
    for fmt in formats_data.SUFFIX:
        out[fmt] = str(root / fmt)
        formats_data.write_set(out[fmt], files, fmt, column="ids" if fmt == "tokens" else "text",
                               encode=synth_tokenizer.encode_ordinary)
    out["content"] = str(root / "content")
    formats_data.write_set(out["content"], files, "parquet", column="content")
    return out


COLUMN = {"tokens": "ids", "content": "content"}


def batches(data, tok, packing="concat", workers=1, n=N_BATCHES, **kw) -> list:
    with shmloader.ShmLoader(data, tok, B, T, packing=packing, num_workers=workers, device="cpu",
                             timeout=60, **kw) as loader:
        return [np.concatenate([x.numpy().ravel(), y.numpy().ravel()]) for x, y in itertools.islice(loader, n)]


_REFERENCE = {}


def reference(dirs, tok, packing) -> list:
    """The parquet `text` loader's batches (made once a packing)."""
    if packing not in _REFERENCE:
        _REFERENCE[packing] = batches(dirs["parquet"], tok, packing, workers=2)
    return _REFERENCE[packing]


def same(got, want):
    assert len(want) == N_BATCHES and len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"batch {i} differs"


CASES = [(fmt, "concat", 1) for fmt in ("content", "jsonl", "jsonl.gz", "arrow", "arrow-stream", "tokens")]
CASES += [(fmt, "bos_bestfit", 3) for fmt in ("content", "jsonl", "jsonl.gz", "arrow", "arrow-stream", "tokens")]
CASES += [("jsonl.zst", "concat", 1), ("jsonl.zst", "bos_bestfit", 3)]
CASES += [pytest.param("jsonl.zst", p, w, marks=pytest.mark.slow, id=f"jsonl.zst-{p}-{w}")  # the rest of its cross
          for p, w in (("concat", 3), ("bos_bestfit", 1))]


@pytest.mark.parametrize("fmt,packing,workers", CASES)
def test_every_format_gives_the_parquet_batches(dirs, synth_tokenizer, fmt, packing, workers):
    got = batches(dirs[fmt], synth_tokenizer, packing, workers, column=COLUMN.get(fmt, "text"))
    same(got, reference(dirs, synth_tokenizer, packing))


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_jsonl_zst_state_resumes_exactly_with_another_worker_count(dirs, synth_tokenizer, packing):
    want = reference(dirs, synth_tokenizer, packing)
    with shmloader.ShmLoader(dirs["jsonl.zst"], synth_tokenizer, B, T, packing=packing, num_workers=1,
                             device="cpu", timeout=60) as loader:
        for _ in range(70):
            next(loader)
        state = loader.state_dict()
    got = batches(dirs["jsonl.zst"], synth_tokenizer, packing, workers=3, n=N_BATCHES - 70, resume_state=state)
    assert state["config"].get("format") == "jsonl" and state["files"][0][2] is not None
    for i, (g, w) in enumerate(zip(got, want[70:])):
        assert np.array_equal(g, w), f"batch {70 + i} after the resume differs"


def test_on_two_ranks_each_document_of_an_epoch_is_read_once(tmp_path):
    """Token = position data (IntTokenizer) as .jsonl.zst: files of 2100 documents (units 1024,
    1024, 52); the ranks' first epochs hold every train token once, none on both ranks, and each
    rank's stream is the oracle's for its rank (over the same documents in 1024-row parquet)."""
    lengths = [(i * 7) % 11 for i in range(6300)]
    docs = helpers.position_documents(lengths)
    files = [docs[i * 2100:(i + 1) * 2100] for i in range(3)]
    paths = formats_data.write_set(str(tmp_path / "z"), files, "jsonl.zst")
    twins = formats_data.write_set(str(tmp_path / "p"), files, "parquet")
    tok, b, t = helpers.IntTokenizer(), 2, 32
    seen = []
    for rank in (0, 1):
        tokens, windows = set(), []
        with shmloader.ShmLoader(str(tmp_path / "z"), tok, b, t, num_workers=2, device="cpu", timeout=60,
                                 rank=rank, world_size=2) as loader:
            for x, y in loader:
                windows.append(helpers.window_of(x, y))
                if loader.state_dict()["epoch"] > 1:
                    break
        want = [w for w, _ in itertools.islice(oracle.concat_windows(twins[:2], tok.encode, 0, b, t, rank=rank,
                                                                     world=2), len(windows))]
        assert len(windows) > 10 and all(np.array_equal(g, w) for g, w in zip(windows, want))
        for w in windows:
            tokens.update(int(v) for v in w if v)
        seen.append(tokens)
    every = {int(v) for d in docs[:4200] if d for v in d.split()}
    assert seen[0] | seen[1] >= every and not (seen[0] & seen[1] & every) and paths


def test_a_mixture_of_parquet_and_a_jsonl_source_with_another_column(tmp_path, synth_tokenizer):
    web = [list(f) for f in documents()]
    code = [[d.upper() if d else d for d in f[:400]] for f in web]
    formats_data.write_set(str(tmp_path / "web"), web, "parquet")
    formats_data.write_set(str(tmp_path / "code"), code, "jsonl", column="content")
    formats_data.write_set(str(tmp_path / "code_p"), code, "parquet")
    weights = {"web": 0.7, "code": 0.3}
    mixed = shmloader.Mixture({"web": str(tmp_path / "web"),
                               "code": shmloader.Source(str(tmp_path / "code"), column="content")}, weights)
    twin = shmloader.Mixture({"web": str(tmp_path / "web"), "code": str(tmp_path / "code_p")}, weights)
    got = batches(mixed, synth_tokenizer, workers=2, n=60)
    want = batches(twin, synth_tokenizer, workers=2, n=60)
    assert len(got) == 60 and all(np.array_equal(g, w) for g, w in zip(got, want))


def _bad_jsonl(tmp_path) -> list:
    d = tmp_path / "bad"
    good = [f"{i} {i + 1}" for i in range(1, 40)]
    formats_data.write(str(d / "a.jsonl"), good, "jsonl")
    lines = (d / "a.jsonl").read_text().splitlines()
    lines[6] = "{not json"
    lines[20] = '{"title": "no text here"}'
    (d / "b.jsonl").write_text("\n".join(lines) + "\n")
    formats_data.write(str(d / "c.jsonl"), good, "jsonl")
    return [str(d / "a.jsonl"), str(d / "b.jsonl"), str(d / "c.jsonl")]


def test_bad_lines_are_data_errors_naming_the_file_and_line(tmp_path):
    paths = _bad_jsonl(tmp_path)
    with shmloader.ShmLoader([paths[1], paths[2]], helpers.IntTokenizer(), 2, 8, num_workers=1, device="cpu",
                             timeout=30, split="val", head_start=False) as loader:
        pass
    with shmloader.ShmLoader(paths, helpers.IntTokenizer(), 2, 8, num_workers=1, device="cpu", timeout=30) as loader:
        with pytest.raises(shmloader.DataError, match=r"b\.jsonl: line 7 is not JSON"):
            for _ in range(200):
                next(loader)


def test_bad_lines_are_skipped_and_counted_with_skip(tmp_path):
    paths = _bad_jsonl(tmp_path)
    with pytest.warns(UserWarning, match=r"b\.jsonl: line 7 is not JSON"):
        with shmloader.ShmLoader(paths, helpers.IntTokenizer(), 2, 8, num_workers=1, device="cpu", timeout=30,
                                 on_bad_row_group="skip") as loader:
            got = [helpers.window_of(x, y) for x, y in itertools.islice(loader, 30)]
            assert loader.stats()["bad_row_groups_skipped"] >= 1
    assert len(got) == 30


def test_a_missing_field_names_the_line(tmp_path):
    paths = _bad_jsonl(tmp_path)
    lines = open(paths[1]).read().splitlines()
    lines[6] = lines[5]
    open(paths[1], "w").write("\n".join(lines) + "\n")
    with shmloader.ShmLoader(paths, helpers.IntTokenizer(), 2, 8, num_workers=1, device="cpu", timeout=30) as loader:
        with pytest.raises(shmloader.DataError, match=r"b\.jsonl: line 21 has no 'text' field"):
            for _ in range(200):
                next(loader)


def test_token_ids_outside_the_vocabulary_name_file_and_row(tmp_path, synth_tokenizer):
    docs = [f"doc {i}" for i in range(30)]
    ids = [synth_tokenizer.encode_ordinary(d) for d in docs]
    ids[12] = ids[12] + [synth_tokenizer.n_vocab + 5]
    formats_data.write(str(tmp_path / "t" / "a.parquet"), docs, "tokens", "ids", ids)
    formats_data.write(str(tmp_path / "t" / "b.parquet"), docs, "tokens", "ids", ids)
    with shmloader.ShmLoader(str(tmp_path / "t"), synth_tokenizer, 2, 8, num_workers=1, device="cpu", timeout=30,
                             column="ids") as loader:
        with pytest.raises(shmloader.DataError, match=r"a\.parquet: row group 0, row 12: token id \d+ is outside"):
            for _ in range(100):
                next(loader)


def test_a_state_of_one_column_is_refused_by_a_loader_of_another(tmp_path):
    docs = helpers.position_documents([5] * 60)
    for i in range(3):
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"text": docs[i * 20:(i + 1) * 20], "content": docs[i * 20:(i + 1) * 20]}),
                       tmp_path / f"s{i}.parquet")
    tok = helpers.IntTokenizer()
    with shmloader.ShmLoader(str(tmp_path), tok, 2, 8, num_workers=1, device="cpu", timeout=30) as loader:
        next(loader)
        state = loader.state_dict()
    assert "column" not in state["config"]  # the default: older states match it
    with pytest.raises(ValueError, match=r"column: the state was saved reading column 'text', this loader reads "
                                         r"'content'"):
        shmloader.ShmLoader(str(tmp_path), tok, 2, 8, num_workers=1, device="cpu", column="content",
                            resume_state=state)
    with shmloader.ShmLoader(shmloader.Source(str(tmp_path), column="content"), tok, 2, 8, num_workers=1,
                             device="cpu", timeout=30) as loader:
        next(loader)
        other = loader.state_dict()
    assert other["config"]["column"] == "content"
    with pytest.raises(ValueError, match=r"column: the state was saved reading column 'content'"):
        shmloader.ShmLoader(str(tmp_path), tok, 2, 8, num_workers=1, device="cpu", resume_state=other)


def test_a_directory_of_another_format_is_no_longer_a_corrupt_parquet(tmp_path):
    formats_data.write(str(tmp_path / "d" / "a.jsonl.zst"), ["1 2", "3 4"], "jsonl.zst")
    (tmp_path / "d" / "b.jsonl.zst.tmp").write_bytes(b"partial")
    formats_data.write(str(tmp_path / "d" / "b.jsonl.zst"), ["5 6", "7 8"], "jsonl.zst")
    loader = shmloader.ShmLoader(str(tmp_path / "d"), helpers.IntTokenizer(), 1, 3, num_workers=1, device="cpu",
                                 timeout=30)
    with loader:
        assert [os.path.basename(f) for f in loader.files] == ["a.jsonl.zst"]
        x, y = next(loader)
        assert helpers.window_of(x, y).tolist() == [0, 1, 2, 0]


def test_a_hugging_face_saved_dataset_reads_only_its_data_files(tmp_path):
    """A `save_to_disk` directory (state.json, dataset_info.json beside data-0000N-of-00003.arrow):
    two epochs of its train split are the oracle's over its first two data files (the metadata
    was read as JSON Lines: "dataset_info.json: line 1 is not JSON" at the end of the data)."""
    docs = helpers.position_documents([(i * 7) % 11 for i in range(300)])
    files = [docs[i * 100:(i + 1) * 100] for i in range(3)]
    paths = formats_data.write_hf_saved(str(tmp_path / "saved"), files)
    twins = formats_data.write_set(str(tmp_path / "p"), files, "parquet")
    tok, b, t = helpers.IntTokenizer(), 2, 16
    windows = []
    with shmloader.ShmLoader(str(tmp_path / "saved"), tok, b, t, num_workers=2, device="cpu", timeout=60) as loader:
        assert loader.files == paths[:2]
        for x, y in loader:
            windows.append(helpers.window_of(x, y))
            if loader.state_dict()["epoch"] > 2:
                break
    want = [w for w, _ in itertools.islice(oracle.concat_windows(twins[:2], tok.encode, 0, b, t), len(windows))]
    assert len(windows) > 20 and all(np.array_equal(g, w) for g, w in zip(windows, want))


@pytest.mark.parametrize("max_piece_docs", [1024, 1])
def test_text_and_token_ids_in_one_file_fail_at_the_same_line_whatever_the_pieces(tmp_path, max_piece_docs):
    """issue 51: with max_piece_docs=1 the batches mixed tokenized text and raw ids."""
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a.jsonl").write_text("".join(json.dumps({"t": f"{i} {i}" if i % 2 else [i, i]}) + "\n" for i in range(1, 31)))
    with shmloader.ShmLoader(str(d), helpers.IntTokenizer(), 2, 8, split="all", column="t", num_workers=2,
                             device="cpu", timeout=30, max_piece_docs=max_piece_docs) as loader:
        with pytest.raises(shmloader.DataError, match=r"a\.jsonl: line 2: 't' is list, expected text \(a string\) "
                                                      r"like the file's first value \(line 1\)"):
            for _ in range(50):
                next(loader)
