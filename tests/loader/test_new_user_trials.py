"""Trials of a new user, and of an adversary, on data shaped like users' data (the bugs they found,
each a test that failed before its fix).

- A web dump in JSON Lines whose text holds a lone surrogate escape (`"\\ud83d"`: half an emoji,
  as a scraper that cut a UTF-16 string writes it; valid JSON syntax, not valid Unicode text) is a
  `DataError` naming the file and line, and `on_bad_row_group="skip"` skips its unit, as invalid
  UTF-8 in a parquet file is: it was a worker's bare `UnicodeEncodeError` from the tokenizer, with
  no line, that `"skip"` did not skip.
- A `Mixture` of a source read in its files' order beside one read shuffled (`Source(shuffle=True)`,
  the loader's `shuffle=False`) takes files added to the unshuffled source at a resume, as a
  mixture without a shuffled source does (from its own rank's state and from another rank's): it
  refused them, "the source is shuffled", taking any shuffled source for every source's setting.
  Files added to the shuffled source are still refused (not built yet).
- A loader pickled (as a torch `DataLoader` over it with spawned workers, or a `multiprocessing`
  process given it, does) is a `TypeError` saying what to do instead: it was "cannot pickle
  '_thread.lock' object". (The drop-ins' generator, like nanochat's, is a generator: "cannot
  pickle 'generator' object".)
"""
import itertools
import json
import pickle
import random
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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


def _mix_data(root):
    """Sources `a` (its tokens 1..) and `b` (100001..), 4 files each of row groups of 7, 25, 40 and 7
    documents of 0-25 tokens (`IntTokenizer`: each token its own number, so a source's tokens say
    which document they are of)."""
    for name, off in (("a", 0), ("b", 100000)):
        (root / name).mkdir(parents=True)
        rng = random.Random(off)
        docs = [" ".join(str(off + 1 + 1000 * i + j) for j in range(rng.randint(0, 25))) for i in range(400)]
        for f in range(4):
            pq.write_table(pa.table({"text": docs[f * 100:(f + 1) * 100]}), root / name / f"s_{2 * f + 1:03d}.parquet",
                           row_group_size=(7, 25, 40)[f % 3])


def _add_file(root, name, off):
    """`s_004.parquet` (sorting among the source's files) of 60 documents of tokens off+900000+...,
    in row groups of 9; the tokens of rank 1 of 2's row groups (1, 3, ...)."""
    docs = [" ".join(str(off + 900000 + 1000 * i + j) for j in range(10)) for i in range(60)]
    pq.write_table(pa.table({"text": docs}), root / name / "s_004.parquet", row_group_size=9)
    return {off + 900000 + 1000 * i + j for i in range(60) for j in range(10) if (i // 9) % 2 == 1}


def _half_shuffled(root, rank, state=None, packing="concat"):
    mix = shmloader.Mixture({"a": str(root / "a"), "b": shmloader.Source(str(root / "b"), shuffle=True)},
                            {"a": 0.6, "b": 0.4})
    return shmloader.ShmLoader(mix, helpers.IntTokenizer(), B, 16, "all", device="cpu", num_workers=2, rank=rank,
                               world_size=2, packing=packing, resume_state=state)


def _grab(ld, n) -> list:
    return [np.concatenate([x.numpy().ravel(), y.numpy().ravel()]) for x, y in itertools.islice(ld, n)]


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_files_added_to_the_unshuffled_source_beside_a_shuffled_one_are_read(tmp_path, packing, watchdog):
    _mix_data(tmp_path)
    states, later = {}, None
    for rank in (0, 1):
        with _half_shuffled(tmp_path, rank, packing=packing) as ld:
            _grab(ld, 7)
            states[rank] = json.loads(json.dumps(ld.state_dict()))
            if rank == 1:
                later = _grab(ld, 300)  # the run without the file added
    new_tokens = _add_file(tmp_path, "a", 0)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with _half_shuffled(tmp_path, 1, states[1], packing) as ld:
            own = _grab(ld, 300)
    assert any("1 file(s) added" in str(w.message) and "s_004.parquet" in str(w.message) for w in seen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the file added, said above
        with _half_shuffled(tmp_path, 1, states[0], packing) as ld:  # another rank's state (nanochat's way)
            other = _grab(ld, 300)
    assert all(np.array_equal(a, b) for a, b in zip(own, other))

    # the state's files first: the batches are the run's without the file until source a reaches
    # it (best fit: until it enters the buffer), and the file is read
    first_diff = next(k for k, (a, b) in enumerate(zip(own, later)) if not np.array_equal(a, b))
    assert first_diff > 0
    read = set(np.concatenate(own).tolist()) & set(range(900000, 1000000))
    if packing == "concat":  # each token once, in the stream's order: the first batch that differs reads it
        assert set(own[first_diff].tolist()) & new_tokens
        assert read == new_tokens
    else:  # whole documents or their starts (a cropped one's)
        assert {t - t % 1000 for t in read} == {t - t % 1000 for t in new_tokens}

    _add_file(tmp_path, "b", 100000)
    with pytest.raises(ValueError, match=r"mixture source 'b'.*added.*the source is shuffled"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # source a's file added, said above
        _half_shuffled(tmp_path, 1, states[1], packing)


def test_pickling_a_loader_says_what_to_do_instead(posdata):
    with posdata.loader(2, 16, num_workers=1) as ld:
        next(ld)
        with pytest.raises(TypeError, match="a ShmLoader cannot be pickled.*Make the loader in the process"):
            pickle.dumps(ld)
        assert next(ld)[0].shape == (2, 16)  # still reads


def _put(folder, name, first_doc, n, rows):
    """`n` documents `first_doc`, ... as `folder/name` in row groups of `rows`: document i's tokens
    are 1000 * i + 1, ... (5 to 11 of them), so a token says its document."""
    docs = [" ".join(str(1000 * (first_doc + i) + j + 1) for j in range(5 + (first_doc + i) % 7)) for i in range(n)]
    pq.write_table(pa.table({"text": docs}), folder / name, row_group_size=rows)


def _share(folder, rank: int, world: int) -> set:
    """The documents of rank `rank` of `world` in `folder`'s files (its row groups rank, rank + world, ...)."""
    out = set()
    for path in sorted(folder.iterdir()):
        texts, md, i = pq.read_table(path).column("text").to_pylist(), pq.ParquetFile(path).metadata, 0
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            if g % world == rank:
                out.update(int(t.split()[0]) // 1000 for t in texts[i:i + n])
            i += n
    return out


@pytest.mark.parametrize("kind", ["source", "mixture"])
def test_shards_added_at_two_resumes_in_one_epoch_are_each_read_once_in_it(tmp_path, kind, watchdog):
    """Trial that passed: shards land twice (one sorting first, others among and after the files)
    within one epoch, each time resumed from the rank's own state; every document of the rank's share
    of all the files is read once in that epoch (concat; a mixture's source as one source)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for f in range(3):
        _put(a, f"s_{10 * f + 5:03d}.parquet", 100 * f, 40, 6)
    _put(b, "s_001.parquet", 5000, 200, 10)
    data = str(a) if kind == "source" else shmloader.Mixture({"a": str(a), "b": str(b)}, {"a": 0.7, "b": 0.3})

    def run(rank, state, n):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the files added, said once
            with shmloader.ShmLoader(data, helpers.IntTokenizer(), B, 16, "all", device="cpu", num_workers=2,
                                     rank=rank, world_size=2, resume_state=state) as ld:
                return [helpers.window_of(x, y) for x, y in itertools.islice(ld, n)], ld.state_dict()

    read, states = {0: [], 1: []}, {0: None, 1: None}
    for shards in ([], [("s_001.parquet", 300), ("s_012.parquet", 400)], [("s_007.parquet", 500), ("s_099.parquet", 600)]):
        for name, first in shards:
            _put(a, name, first, 30, 5)
        for rank in (0, 1):
            got, states[rank] = run(rank, states[rank], 10 if not shards or shards[0][1] == 300 else 150)
            read[rank] += got
    for rank in (0, 1):
        tokens = np.concatenate(read[rank])
        docs = tokens[(tokens > 0) & (tokens < 5_000_000)] // 1000  # source a's documents, in stream order
        order = [int(d) for k, d in enumerate(docs) if k == 0 or d != docs[k - 1]]
        epoch = order[:next((k for k in range(len(order)) if order[k] in order[:k]), len(order))]
        assert len(epoch) == len(set(epoch)) == len(_share(a, rank, 2)), rank
        assert set(epoch) == _share(a, rank, 2)
        assert len(order) > len(epoch)  # the stream went past the epoch: it was whole
