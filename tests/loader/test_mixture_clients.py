"""A Mixture as its clients use it: real tokenizers built offline (nanochat's rustbpe-trained
tiktoken BPE, a SentencePiece model, a Hugging Face `tokenizer.json`), sources in the formats and
columns data ships in, mixed in one `Mixture`, and the loops that train with them.

The data (`clientmix`): `web`, parquet `text` in row groups of 7, holding an empty document,
nulls, unicode (CJK, emoji, Greek, a NUL, a zero-width space), every tokenizer's special-token
text and a document longer than T; `code`, `.jsonl.zst` whose documents are in `content`
(`Source(column="content")`), files of 3 units (1024, 1024 and 52 lines); `hf`, a Hugging
Face `save_to_disk` directory (Arrow stream, 3 record batches); `tiny`, plain `.jsonl` whose
train split is one file of one document (an epoch every few batches). Every source but `web`
also as a parquet twin in 1024-row row groups (the other formats' units), so a mixture of the
twins names every batch the mixture of formats must give, byte for byte (tests/loader/
test_formats.py checks each format alone; test_mixture.py the twins' mixing against the oracle).

Checked, both packings, shuffled and not, each tokenizer:
- the mixture of formats gives its twins' batches (concat: the oracle's, tests/oracle.py, with the
  tokenizer's own encode: the workers' engine encodes as it does); a state taken mid-run (`state_dict()`),
  loaded into a fresh loader (`load_state_dict`, another worker count, through JSON), goes on
  with the uninterrupted run's batches; every source is read, `tiny` for many epochs;
- on 2 ranks, a JSON Lines source with no unit for rank 1 is named, a unit said in its words;
  each rank's stream (without it) is its twins' and rank 1 resumed from rank 0's state (nanochat's
  checkpoints) gives rank 1's own batches;
- a schedule over the formats, resumed on each side of a stage's first batch, and new weights at
  a resume, are the twins';
- nanochat's drop-in over the mixture in nanochat's prefetch-and-save loop: the state yielded
  with batch k resumes at batch k;
- positions over the mixture: 0 exactly at the tokenizer's BOS (every row start too, best fit),
  the same after a resume;
- a worker and the coordinator killed over the compressed, shuffled sources: the same batches;
- a val mixture made at every evaluation, and one idly released, gives the same batches;
- one source of four formats (parquet, `.jsonl.zst`, Arrow, `.jsonl` in one directory) is its twin;
- JSON Lines as other tools write it (raw UTF-8 line separators, CRLF, blank lines) is its twin;
- two sources over the same files, each its own column, with a token cache: each its column's;
- `bos=` that is not a token id of the tokenizer is refused when the loader is made;
- slow: saved on 2 ranks and resumed on 3, each new rank is its twins'.
"""
import itertools
import json
import os
import signal
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shmloader
from shmloader import nanochat
from shmloader.demo import corpus
from tests import formats_data, helpers, oracle

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 2, 32
FIT = dict(packing="bos_bestfit", buffer_size=16, tokenizer_batch_size=4)
SHUFFLED = dict(shuffle=True, seed=3, shuffle_window=16)
WEIGHTS = {"web": 0.4, "code": 0.3, "hf": 0.2, "tiny": 0.1}
TEXT = "naïve café 日本語のテキスト 😀😀 Ελληνικά \x00\u200b <|bos|> <s> </s> <|endoftext|> [BOS]"
N = 60


def documents(seed: int, n: int, words: int) -> list:
    """`n` synthetic documents with every 29th null, an empty one, the hard text and one longer
    than T in every tokenizer."""
    docs = list(corpus.synthetic_texts(n, seed=seed, mean_words=words))
    for i in range(4, n, 29):
        docs[i] = None
    docs[1], docs[2], docs[7] = "", TEXT, " ".join(["lengthy"] * 200)
    return docs


@pytest.fixture(scope="module")
def clientmix(tmp_path_factory):
    """`{name: directory}` of the sources, and `{name: its parquet twin}` (module docstring)."""
    root = tmp_path_factory.mktemp("clientmix")
    files = {"web": [documents(1, 300, 8), documents(2, 200, 8), documents(3, 50, 8)],
             "code": [documents(4, 2100, 3), documents(5, 2100, 3), documents(6, 30, 3)],
             "hf": [documents(7, 2100, 3), documents(8, 60, 3)],
             "tiny": [["just one small document"], ["the val document"]]}
    os.makedirs(root / "web")
    for i, docs in enumerate(files["web"]):
        pq.write_table(pa.table({"text": pa.array(docs, pa.string())}), root / "web" / f"s{i}.parquet",
                       row_group_size=7)
    formats_data.write_set(str(root / "code"), files["code"], "jsonl.zst", column="content")
    formats_data.write_hf_saved(str(root / "hf"), files["hf"])
    formats_data.write_set(str(root / "tiny"), files["tiny"], "jsonl")
    for name in ("code", "hf", "tiny"):
        formats_data.write_set(str(root / f"twin_{name}"), files[name], "parquet")
    given = {"web": str(root / "web"), "code": shmloader.Source(str(root / "code"), column="content"),
             "hf": str(root / "hf"), "tiny": str(root / "tiny")}
    twins = {name: str(root / ("web" if name == "web" else f"twin_{name}")) for name in files}
    return given, twins


def mixture(sources, weights=WEIGHTS, **kw):
    return shmloader.Mixture(sources, weights, **kw)


class Tok(NamedTuple):
    tokenizer: object  # as a client passes it
    bos: int
    encode: object     # its own encode of a document's text (ordinary text, no BOS), for the oracle


@pytest.fixture
def tok(request) -> Tok:
    if request.param == "rustbpe":
        enc = request.getfixturevalue("synth_tokenizer")
        return Tok(enc, enc.encode_single_token("<|bos|>"), enc.encode_ordinary)
    if request.param == "sentencepiece":
        sentencepiece = pytest.importorskip("sentencepiece")
        path = request.getfixturevalue("sp_model")
        sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        return Tok(str(path), sp.bos_id(), sp.encode)
    path = request.getfixturevalue("hf_json")
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(str(path))
    hf.encode_special_tokens = True
    return Tok(str(path), hf.token_to_id("<|endoftext|>"), lambda text: hf.encode(text, add_special_tokens=False).ids)


def loader(data, tokenizer, workers=2, **kw):
    return shmloader.ShmLoader(data, tokenizer, B, T, num_workers=workers, device="cpu", timeout=60, **kw)


def flat(batch) -> np.ndarray:
    return np.concatenate([t.numpy().ravel() for t in batch])


def run(data, tokenizer, n, workers=2, **kw) -> tuple[list, list]:
    """The first `n` batches (flattened copies) and the state after each."""
    got, states = [], []
    with loader(data, tokenizer, workers, **kw) as ld:
        for batch in itertools.islice(ld, n):
            got.append(flat(batch))
            states.append(ld.state_dict())
    assert len(got) == n > 0
    return got, states


def same(got, want) -> bool:
    return len(got) == len(want) > 0 and all(np.array_equal(a, b) for a, b in zip(got, want))


def epochs(state) -> dict:
    """Each source's epoch at `state` (its mixer's count)."""
    return {name: v[2] for name, v in json.loads(state["mixture"]["point"])["mixer"]["totals"].items()}


KINDS = {"concat": {}, "bestfit": FIT, "concat-shuffled": SHUFFLED, "bestfit-shuffled": {**FIT, **SHUFFLED}}
# every tokenizer in concat (against the oracle) and shuffled best fit; the other two with one
CASES = [(t, k) for t in ("rustbpe", "sentencepiece", "hf") for k in ("concat", "bestfit-shuffled")]
CASES += [("rustbpe", "bestfit"), ("sentencepiece", "concat-shuffled")]
SLOW_CASES = {("rustbpe", "bestfit-shuffled"), ("sentencepiece", "bestfit-shuffled")}  # -m slow: hf's is the default's


@pytest.mark.parametrize("tok,kind", [pytest.param(t, k, id=f"{t}-{k}", marks=pytest.mark.slow if (t, k) in SLOW_CASES else ())
                                      for t, k in CASES], indirect=["tok"])
def test_a_mixture_of_formats_is_its_twins_and_resumes_in_a_fresh_loader(clientmix, tok, kind):
    given, twins = clientmix
    kw = KINDS[kind]
    tokenizer, bos = tok.tokenizer, tok.bos
    want, _ = run(mixture(twins), tokenizer, N, **kw)
    assert bos not in tok.encode(TEXT), "special-token text is ordinary text: no BOS inside a document"
    if not kw:  # the twins' stream is the oracle's, each document its tokenizer's own encode
        files = {name: sorted(str(p) for p in Path(d).iterdir())[:-1] for name, d in twins.items()}
        docs = oracle.mixed_documents(files, tok.encode, bos, mixture(twins), B * T + 1)
        windows = [w for w, _ in itertools.islice(oracle.concat_windows([], tok.encode, bos, B, T, docs=docs), N)]
        assert same([np.concatenate([b[:1], b[B * T:]]) for b in want], windows), "not the oracle's stream"
    with loader(mixture(given), tokenizer, 2, **kw) as ld:
        got = [flat(b) for b in itertools.islice(ld, 23)]
        state = json.loads(json.dumps(ld.state_dict()))
        got += [flat(b) for b in itertools.islice(ld, N - 23)]
        end, stats = ld.state_dict(), ld.stats()
    assert same(got, want), "the mixture of formats is not its parquet twins' stream"
    assert all(stats["sources"][name]["tokens"] > 0 for name in WEIGHTS), stats["sources"]
    assert epochs(end)["tiny"] > 5 and epochs(end)["web"] == 1
    assert sum(int((g == bos).sum()) for g in got) > 100
    with loader(mixture(given), tokenizer, 1, **kw) as ld:  # a fresh loader, then its state loaded
        ld.load_state_dict(state)
        resumed = [flat(b) for b in itertools.islice(ld, N - 23)]
    assert same(resumed, want[23:]), "the state loaded into a fresh loader did not go on as the run"


@pytest.mark.parametrize("kw", [{}, {**FIT, **SHUFFLED}], ids=["concat", "bestfit-shuffled"])
def test_on_two_ranks_each_is_its_twins_and_another_ranks_state_resumes_it(clientmix, synth_tokenizer, kw):
    """(Without `tiny`: rank 1 has no unit of its one file.)"""
    given, twins = ({name: d for name, d in sources.items() if name != "tiny"} for sources in clientmix)
    untiny = {name: w for name, w in WEIGHTS.items() if name != "tiny"}
    ranks = dict(world_size=2, **kw)
    own, _ = run(mixture(given, untiny), synth_tokenizer, 40, rank=1, **ranks)
    assert same(own, run(mixture(twins, untiny), synth_tokenizer, 40, rank=1, **ranks)[0])
    zero, states = run(mixture(given, untiny), synth_tokenizer, 25, rank=0, **ranks)
    assert not same(zero, own[:25])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the replay's progress
        got, _ = run(mixture(given, untiny), synth_tokenizer, 15, workers=1, rank=1, resume_state=states[-1], **ranks)
    assert same(got, own[25:]), "rank 1 from rank 0's state is not rank 1's own stream"


@pytest.mark.parametrize("kw", [{}, SHUFFLED], ids=["files-order", "shuffled"])
def test_a_jsonl_source_with_no_unit_for_a_rank_says_what_a_unit_is(clientmix, synth_tokenizer, kw):
    """`tiny`'s one train file is one unit of lines: rank 1 of 2 has none, and is told that a JSON
    Lines file's unit is 1024 lines, not to write more row groups, which it has none of."""
    given, _ = clientmix
    with pytest.raises(shmloader.DataError, match=r"mixture source 'tiny': rank 1 of 2 has no .*1024 lines"):
        run(mixture(given), synth_tokenizer, 5, rank=1, world_size=2, **kw)


SCHEDULE = [(0, WEIGHTS), (20, {"web": 0.1, "code": 0.1, "hf": 0.8}), (35, {"web": 1, "code": 0, "hf": 1, "tiny": 1})]


@pytest.mark.parametrize("kw", [{}, FIT], ids=["concat", "bestfit"])
def test_a_schedule_and_new_weights_over_the_formats_are_the_twins(clientmix, sp_model, kw):
    given, twins = clientmix
    tokenizer = str(sp_model)
    want, twin_states = run(mixture(twins, SCHEDULE), tokenizer, N, **kw)
    got, states = run(mixture(given, SCHEDULE), tokenizer, N, workers=1, **kw)
    assert same(got, want)
    for k in (19, 20, 35):  # a stage's last batch, its first batch's state, the third stage's
        assert same(run(mixture(given, SCHEDULE), tokenizer, N - k, resume_state=states[k - 1], **kw)[0], want[k:]), k
    other = {"web": 0.2, "code": 0.6, "hf": 0.1, "tiny": 0.1}
    with pytest.warns(UserWarning, match="weights"):
        later, _ = run(mixture(given, other), tokenizer, 30, resume_state=states[29], **kw)
    with pytest.warns(UserWarning, match="weights"):
        twin_later, _ = run(mixture(twins, other), tokenizer, 30, resume_state=twin_states[29], **kw)
    assert same(later, twin_later) and not same(later, got[30:])


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_nanochats_loop_over_the_formats_resumes_at_the_batch_in_hand(clientmix, hf_json, packing):
    """nanochat's loop: prefetch, save the state of the batch in hand (not trained on), resume
    from it (through JSON, another worker count): the resumed loader's first batch is that one."""
    given, _ = clientmix

    def dropin(resume=None, workers=2):
        kw = dict(device="cpu", resume_state_dict=resume, num_workers=workers, data=mixture(given), timeout=60)
        if packing == "concat":
            return nanochat.tokenizing_distributed_data_loader_with_state(B, T, "train", tokenizer=str(hf_json), **kw)
        return nanochat.tokenizing_distributed_data_loader_with_state_bos_bestfit(str(hf_json), B, T, "train",
                                                                                   buffer_size=16, **kw)

    gen = dropin()
    seen = [(flat((x, y)), json.dumps(state)) for x, y, state in itertools.islice(gen, 40)]
    gen.close()
    assert len(seen) == 40
    for k in (0, 17):
        gen = dropin(json.loads(seen[k][1]), workers=1)
        got = [flat((x, y)) for x, y, _ in itertools.islice(gen, 40 - k)]
        gen.close()
        assert same(got, [b for b, _ in seen[k:]]), k


@pytest.mark.parametrize("kw", [{}, {**FIT, **SHUFFLED}], ids=["concat", "bestfit-shuffled"])
def test_positions_restart_at_every_bos_of_the_tokenizer_and_resume(clientmix, sp_model, kw):
    given, _ = clientmix
    bos = pytest.importorskip("sentencepiece").SentencePieceProcessor(model_file=str(sp_model)).bos_id()
    got, states = run(mixture(given), str(sp_model), 40, positions=True, **kw)
    for batch in got:
        x, p = batch[:B * T].reshape(B, T), batch[2 * B * T:].reshape(B, T)
        assert np.array_equal(p == 0, x == bos), "a position 0 that is not the BOS, or a BOS that is not 0"
        assert (p[:, 1:][x[:, 1:] != bos] == p[:, :-1][x[:, 1:] != bos] + 1).all(), "a document's positions skip"
        if kw:  # best fit: every row begins with a BOS
            assert (x[:, 0] == bos).all()
    resumed, _ = run(mixture(given), str(sp_model), 25, workers=1, positions=True, resume_state=states[14], **kw)
    assert same(resumed, got[15:])


@pytest.mark.parametrize("fmt,kw", [("parquet", {}), ("jsonl.zst", {**FIT, **SHUFFLED})],
                         ids=["parquet-concat", "jsonl.zst-bestfit-shuffled"])
def test_two_columns_of_the_same_files_share_a_token_cache_each_its_own(tmp_path, synth_tokenizer, fmt, kw):
    """Two sources over one directory, each its own column (`text` and `content`, a question and
    its answer), with `cache_dir`: each source's tokens are its column's, as its twins' in two
    directories, in the run that fills the cache and in the next, which reads it."""
    texts = [documents(20 + f, 1100, 4) for f in range(3)]
    upper = [[d.upper() if d else d for d in docs] for docs in texts]
    os.makedirs(tmp_path / "both")
    for f in range(3):
        name = str(tmp_path / "both" / f"s{f}.{fmt}")
        if fmt == "parquet":
            pq.write_table(pa.table({"text": texts[f], "content": upper[f]}), name, row_group_size=100)
        else:
            with pa.CompressedOutputStream(name, "zstd") as out:
                out.write("".join(json.dumps({"text": a, "content": b}) + "\n" for a, b in zip(texts[f], upper[f])).encode())
    unit = 100 if fmt == "parquet" else formats_data.UNIT
    for name, files in (("a", texts), ("b", upper)):
        os.makedirs(tmp_path / name)
        for f, docs in enumerate(files):
            pq.write_table(pa.table({"text": docs}), tmp_path / name / f"s{f}.parquet", row_group_size=unit)
    both = str(tmp_path / "both")
    mixed = mixture({"a": shmloader.Source(both, column="text"), "b": shmloader.Source(both, column="content")},
                    {"a": 1, "b": 1})
    want, _ = run(mixture({"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}, {"a": 1, "b": 1}), synth_tokenizer,
                  N, **kw)
    for _ in ("filled", "read back"):
        assert same(run(mixed, synth_tokenizer, N, cache_dir=str(tmp_path / "cache"), **kw)[0], want)


def test_jsonl_as_other_tools_write_it_is_its_twin(clientmix, tmp_path, sp_model):
    """A `.jsonl.gz` source written with raw UTF-8 (`ensure_ascii=False`: U+2028, NEL, form feed
    inside strings, which `str.splitlines` would cut at), CRLF line ends, blank lines for nulls and
    no newline after the last line, beside the other sources: its twin's batches, both packings."""
    import gzip
    docs = ["line \u2028 separator", "nel \x85 here", "form \x0c feed", None, "tab\tand \x0b", "", TEXT]
    files = [(docs * 200)[i * 500:(i + 1) * 500] for i in range(3)]
    os.makedirs(tmp_path / "raw")
    for f, part in enumerate(files):
        lines = ("" if d is None else json.dumps({"text": d}, ensure_ascii=False) for d in part)
        (tmp_path / "raw" / f"s{f}.jsonl.gz").write_bytes(gzip.compress("\r\n".join(lines).encode()))
    formats_data.write_set(str(tmp_path / "twin"), files, "parquet")
    given, twins = clientmix
    weights = {**WEIGHTS, "raw": 0.5}
    for kw in ({}, FIT):
        got, _ = run(mixture({**given, "raw": str(tmp_path / "raw")}, weights), str(sp_model), 40, **kw)
        assert same(got, run(mixture({**twins, "raw": str(tmp_path / "twin")}, weights), str(sp_model), 40, **kw)[0])


@pytest.mark.parametrize("bos", [-1, 512, 2 ** 32 + 5, 3.5, True], ids=["negative", "past-vocab", "past-uint32",
                                                                       "float", "bool"])
def test_a_bos_that_is_no_token_id_is_refused_when_the_loader_is_made(clientmix, synth_tokenizer, bos):
    """`bos=` overrides the tokenizer's BOS; one that is not a token id of its vocabulary would
    put an id the model has no embedding for at every document start (or kill every worker)."""
    given, _ = clientmix
    assert synth_tokenizer.n_vocab == 512
    with pytest.raises(ValueError, match="bos="):
        loader(mixture(given), synth_tokenizer, bos=bos)


def test_a_killed_worker_and_coordinator_over_compressed_shuffled_sources_change_no_batch(clientmix, synth_tokenizer):
    """A replaced worker reads a `.jsonl.zst` unit again from the file's top, whatever unit of the
    shuffled order it is given: the same batches as a run left alone."""
    given, _ = clientmix
    kw = {**FIT, **SHUFFLED}
    want, _ = run(mixture(given), synth_tokenizer, N, **kw)
    with loader(mixture(given), synth_tokenizer, 2, **kw) as ld:
        got = [flat(b) for b in itertools.islice(ld, 10)]
        os.kill(ld.debug().workers[0].pid, signal.SIGKILL)
        got += [flat(b) for b in itertools.islice(ld, 15)]
        os.kill(ld.debug().coordinator.pid, signal.SIGKILL)
        got += [flat(b) for b in itertools.islice(ld, N - 25)]
        assert ld.stats()["heals"] == 2
    assert same(got, want)


def test_a_val_mixture_at_every_evaluation_and_after_an_idle_release_is_the_same(clientmix, sp_model):
    """nanochat's evaluations: a new best-fit val loader over the mixture at each one (each
    source's last file; `tiny`'s holds one document), read in part; one loader left idle past
    `idle_release_s` lets its processes go and goes on exactly."""
    given, twins = clientmix
    kw = dict(split="val", **FIT)
    want, _ = run(mixture(twins), str(sp_model), 30, **kw)
    for _ in range(2):
        assert same(run(mixture(given), str(sp_model), 12, **kw)[0], want[:12])
    with loader(mixture(given), str(sp_model), 2, idle_release_s=0.3, **kw) as ld:
        got = [flat(b) for b in itertools.islice(ld, 12)]
        d = ld.debug()
        pids = [d.coordinator.pid, *(p.pid for p in d.workers)]
        del d
        assert helpers.wait_gone(pids, 20.0) == [], "the idle val loader kept its processes"
        got += [flat(b) for b in itertools.islice(ld, 18)]
        assert ld.stats()["idle_releases"] == 1
    assert same(got, want)


def test_a_source_of_four_formats_is_its_twin(clientmix, tmp_path, hf_json):
    """One source whose directory holds parquet, `.jsonl.zst`, Arrow and `.jsonl` files, sorted by
    name as one split, beside the others: its files are read in name order, each in its format."""
    given, twins = clientmix
    docs = [documents(10 + i, n, 4) for i, n in enumerate((40, 1100, 30, 20))]
    formats_data.write(str(tmp_path / "both" / "a.parquet"), docs[0], "parquet", column="content")
    formats_data.write(str(tmp_path / "both" / "b.jsonl.zst"), docs[1], "jsonl.zst", column="content")
    formats_data.write(str(tmp_path / "both" / "c.arrow"), docs[2], "arrow", column="content")
    formats_data.write(str(tmp_path / "both" / "d.jsonl"), docs[3], "jsonl", column="content")
    formats_data.write_set(str(tmp_path / "twin"), docs, "parquet")
    weights = {**WEIGHTS, "both": 0.5}
    mixed = mixture({**given, "both": shmloader.Source(str(tmp_path / "both"), column="content")}, weights)
    for kw in ({}, {**FIT, **SHUFFLED}):
        got, states = run(mixed, str(hf_json), N, **kw)
        assert same(got, run(mixture({**twins, "both": str(tmp_path / "twin")}, weights), str(hf_json), N, **kw)[0])
        assert states[-1]["mixture"]["sources"]["both"].get("format") == "arrow+jsonl+parquet", states[-1]["mixture"]
        assert same(run(mixed, str(hf_json), 20, workers=1, resume_state=states[39], **kw)[0], got[40:])


@pytest.mark.slow  # 2 packings x 2 orders x 12 loaders: ~25 s
@pytest.mark.parametrize("kw", [{}, FIT, SHUFFLED, {**FIT, **SHUFFLED}],
                         ids=["concat", "bestfit", "concat-shuffled", "bestfit-shuffled"])
def test_at_another_world_size_a_mixture_of_formats_is_its_twins(clientmix, synth_tokenizer, kw):
    """Saved on 2 ranks, resumed on 3 from rank 0's state: each new rank's batches are its twins'
    (the plans of every source, best fit's buffers dealt out, the same over any format), and a state
    of the new run resumes on its own rank with another worker count. (Without `tiny`: one unit.)"""
    given, twins = ({name: d for name, d in sources.items() if name != "tiny"} for sources in clientmix)
    untiny = {name: w for name, w in WEIGHTS.items() if name != "tiny"}
    new = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the replay's progress
        for which, sources in (("given", given), ("twins", twins)):
            old = run(mixture(sources, untiny), synth_tokenizer, 30, rank=0, world_size=2, **kw)[1][-1]
            new[which] = [run(mixture(sources, untiny), synth_tokenizer, 25, rank=j, world_size=3,
                              resume_state=json.loads(json.dumps(old)), **kw) for j in range(3)]
        for j in range(3):
            assert same(new["given"][j][0], new["twins"][j][0]), f"new rank {j}"
        got, states = new["given"][1]
        assert states[9]["world_size"] == 3 and states[9]["mixture"]["plans"]
        again, _ = run(mixture(given, untiny), synth_tokenizer, 15, workers=1, rank=1, world_size=3,
                       resume_state=states[9], **kw)
    assert same(again, got[10:])
