"""A token-id column whose documents already begin with BOS (what nanochat's own pretokenize
writes: `tokenizer.encode(text, prepend=bos)`, and what most pretokenized corpora carry) gives
the batches of the same documents as text, byte for byte: a document is `[BOS] + ids` only when
its ids do not already start with BOS, never `[BOS, BOS, ...]`.

Half the documents are written with their BOS, half without, in parquet (row groups of 128)
and JSON Lines; each is read under concat and best fit, with positions (each input token's
index in its document), and through the token cache cold then warm: every stream equals the
parquet text loader's, and a mixture with such a source mixes as with its text (and, beside
a `.jsonl.zst` source on a schedule, resumes through a JSON state). An empty list and a list of
BOS alone are both the document `[BOS]`.

Before the rule such ids read `[BOS, BOS, ...]`: a state saved then (no `token_ids` marker in
its config; tests/fixtures/token_ids_old_rule_states.json, written by that loader) is refused
naming the rule, with or without its first-batch check, and a token cache filled then is not
served (its entries, whole and partial, are keyed without the rule).
"""
import functools
import importlib.util
import itertools
import json
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers
from tests.cases import cross
from tests.helpers import REPO_ROOT, SCRIPTS

B, T = 4, 64
N = 40  # batches: several row groups of each file


@functools.lru_cache(maxsize=None)
def _texts() -> tuple:
    return tuple(corpus.synthetic_texts(700, seed=21, mean_words=10))


def _bos(tok) -> int:
    return tok.encode_single_token("<|bos|>")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, synth_tokenizer) -> dict:
    """The same documents as text (parquet) and as token ids, odd documents with their BOS
    already in front, in parquet and in JSON Lines."""
    root = tmp_path_factory.mktemp("ids_bos")
    bos = _bos(synth_tokenizer)
    texts = list(_texts())
    ids = [([bos] if i % 2 else []) + synth_tokenizer.encode_ordinary(t) for i, t in enumerate(texts)]
    out = {k: root / k for k in ("text", "parquet", "jsonl")}
    for d in out.values():
        d.mkdir()
    for f in range(2):
        part = slice(f * 350, (f + 1) * 350)
        pq.write_table(pa.table({"text": texts[part]}), out["text"] / f"{f}.parquet", row_group_size=128)
        pq.write_table(pa.table({"ids": pa.array(ids[part], pa.list_(pa.int32()))}),
                       out["parquet"] / f"{f}.parquet", row_group_size=128)
        (out["jsonl"] / f"{f}.jsonl").write_text("".join(json.dumps({"ids": d}) + "\n" for d in ids[part]))
    return {k: str(v) for k, v in out.items()}


def _read(data, tok, column, n=N, **kw) -> list:
    with shmloader.ShmLoader(data, tok, B, T, "all", column=column, device="cpu", num_workers=2,
                             timeout=60, **kw) as loader:
        return [[t.numpy().copy() for t in batch] for batch in itertools.islice(loader, n)]


def _same(got, want):
    assert len(want) == N and len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w)
        for a, b in zip(g, w):
            assert np.array_equal(a, b), f"batch {i} differs"


# default: parquet in concat, JSON Lines in best fit; the other two with -m slow
@pytest.mark.parametrize("packing,fmt", cross(["concat", "bos_bestfit"], ["parquet", "jsonl"],
                                              default={"concat-parquet", "bos_bestfit-jsonl"}))
def test_ids_that_begin_with_bos_give_the_text_batches(dirs, synth_tokenizer, watchdog, fmt, packing):
    want = _read(dirs["text"], synth_tokenizer, "text", packing=packing, positions=True)
    got = _read(dirs[fmt], synth_tokenizer, "ids", packing=packing, positions=True)
    _same(got, want)
    bos = _bos(synth_tokenizer)
    x, y, positions = got[0]
    assert not np.any((x[:, 1:] == bos) & (x[:, :-1] == bos)), "a document has two BOS"


# default: parquet in concat, JSON Lines in best fit; the other two with -m slow
@pytest.mark.parametrize("packing,fmt", cross(["concat", "bos_bestfit"], ["parquet", "jsonl"],
                                              default={"concat-parquet", "bos_bestfit-jsonl"}))
def test_the_token_cache_keeps_one_bos(dirs, synth_tokenizer, tmp_path, watchdog, fmt, packing):
    want = _read(dirs["text"], synth_tokenizer, "text", packing=packing, positions=True)
    cold = _read(dirs[fmt], synth_tokenizer, "ids", packing=packing, positions=True, cache_dir=str(tmp_path / "c"))
    warm = _read(dirs[fmt], synth_tokenizer, "ids", packing=packing, positions=True, cache_dir=str(tmp_path / "c"))
    _same(cold, want)
    _same(warm, want)


def test_an_empty_list_and_bos_alone_are_each_one_bos(tmp_path, synth_tokenizer, watchdog):
    bos = _bos(synth_tokenizer)
    a, b = synth_tokenizer.encode_ordinary("one two"), synth_tokenizer.encode_ordinary("three")
    docs = [[bos, *a], [], [bos], a, [bos, *b, bos, *a]] * 60  # a BOS inside a document stays
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"ids": pa.array(docs, pa.list_(pa.int64()))}), tmp_path / "d" / "x.parquet",
                   row_group_size=7)
    stream = np.array([t for d in docs for t in (d if d[:1] == [bos] else [bos, *d])], dtype=np.int64)
    n = len(stream) // (B * T + 1)
    assert n >= 3
    with shmloader.ShmLoader(str(tmp_path / "d"), synth_tokenizer, B, T, "all", column="ids", device="cpu",
                             num_workers=2, timeout=60) as loader:
        got = [helpers.window_of(x, y) for x, y in itertools.islice(loader, n)]
    for i, w in enumerate(got):
        assert np.array_equal(w, stream[i * (B * T + 1):(i + 1) * (B * T + 1)]), f"batch {i} differs"


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_mixtures_token_id_source_weighs_as_its_text(dirs, synth_tokenizer, watchdog, packing):
    """A mixture counts its weights in tokens: a source of ids with their BOS mixes as the same
    source in text (a second BOS would have changed every share, and every batch)."""
    def mix(web):
        return shmloader.Mixture({"web": web, "more": dirs["text"]}, [(0, {"web": 3, "more": 1}), (15, {"web": 1, "more": 2})])
    want = _read(mix(dirs["text"]), synth_tokenizer, "text", packing=packing, positions=True)
    got = _read(mix(shmloader.Source(dirs["parquet"], column="ids")), synth_tokenizer, "text", packing=packing,
                positions=True)
    _same(got, want)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_mixture_with_a_jsonl_zst_source_resumes_through_json(dirs, synth_tokenizer, tmp_path, watchdog, packing):
    """The README's calls as a new user makes them: a mixture of the ids (with their BOS) and a
    `.jsonl.zst` source of another column, on a schedule, with positions; its state through
    JSON resumes on another worker count exactly where the run without a stop goes on; the same
    state as a loader before the BOS rule wrote it (no `token_ids` marker) is refused."""
    zst = tmp_path / "zst"
    zst.mkdir()
    for f in range(2):
        with pa.CompressedOutputStream(str(zst / f"{f}.jsonl.zst"), "zstd") as out:
            out.write("".join(json.dumps({"content": t}) + "\n" for t in _texts()[f * 350:(f + 1) * 350]).encode())

    def mix():
        return shmloader.Mixture({"ids": shmloader.Source(dirs["parquet"], column="ids"),
                                  "code": shmloader.Source(str(zst), column="content")},
                                 [(0, {"ids": 3, "code": 1}), (12, {"ids": 1, "code": 2})])
    kw = dict(packing=packing, positions=True)
    want = _read(mix(), synth_tokenizer, "text", **kw)
    with shmloader.ShmLoader(mix(), synth_tokenizer, B, T, "all", device="cpu", num_workers=2, timeout=60,
                             **kw) as loader:
        for _ in range(15):
            next(loader)
        state = json.loads(json.dumps(loader.state_dict()))
    with pytest.raises(ValueError, match="token ids: the state was saved by a shmloader that gave token ids"):
        with shmloader.ShmLoader(mix(), synth_tokenizer, B, T, "all", device="cpu", num_workers=1, timeout=60,
                                 resume_state=_as_before_the_rule(state), **kw) as loader:
            next(loader)
    with shmloader.ShmLoader(mix(), synth_tokenizer, B, T, "all", device="cpu", num_workers=1, timeout=60,
                             resume_state=state, **kw) as loader:
        got = [[t.numpy().copy() for t in batch] for batch in itertools.islice(loader, N - 15)]
    assert len(got) == N - 15
    for i, (g, w) in enumerate(zip(got, want[15:])):
        assert all(np.array_equal(a, b) for a, b in zip(g, w)), f"batch {15 + i} after the resume differs"


def _as_before_the_rule(state: dict) -> dict:
    """`state` as a shmloader before the BOS rule wrote it: the same envelope, without the
    fingerprint's `token_ids` marker (the digest does not cover the config). A state of that
    loader also stood elsewhere in the stream (its documents were a token longer); a refusal
    does not read it."""
    old = json.loads(json.dumps(state))
    popped = []

    def drop(part):  # one source's config, or a mixture's source's own part
        if isinstance(part, dict):
            if "token_ids" in part:
                popped.append(part.pop("token_ids"))
            for value in part.values():
                drop(value)
    drop(old)
    assert popped and set(popped) == {"own BOS kept"}
    return old


def test_a_mixture_resumed_without_or_with_a_token_id_source_is_not_refused(dirs, synth_tokenizer, watchdog):
    """The marker is a source's (its part of a mixture's state), compared only for sources in
    both the state and the loader: a source of token ids left out at a resume, or added to a
    mixture whose state had none, resumes as a mixture does (the review found both refused when
    the marker was the loader's: the second naming a rule the state was not saved under)."""
    def mix(names):
        sources = {"ids": shmloader.Source(dirs["parquet"], column="ids"), "text": dirs["text"]}
        return shmloader.Mixture({n: sources[n] for n in names}, {n: 1 for n in names})
    for saved_with, resumed_with in ((["ids", "text"], ["text"]), (["text"], ["ids", "text"])):
        with shmloader.ShmLoader(mix(saved_with), synth_tokenizer, B, T, "all", device="cpu", num_workers=1,
                                 timeout=60) as loader:
            for _ in range(5):
                next(loader)
            state = json.loads(json.dumps(loader.state_dict()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the mixture's sources differ from the state's: said
            with shmloader.ShmLoader(mix(resumed_with), synth_tokenizer, B, T, "all", device="cpu", num_workers=1,
                                     timeout=60, resume_state=state) as loader:
                assert next(loader)[0].shape == (B, T)


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_a_state_saved_before_the_bos_rule_is_refused_with_or_without_its_check(dirs, synth_tokenizer, watchdog,
                                                                                packing):
    """The review's case: a state of token ids saved before the rule resumed one token off
    without a word when it carried no check (taken after close(), or in a signal handler), and
    with one was refused naming the first batch. Now both are refused at once, naming the
    cause; the loader's own states (with the marker) resume exactly, with or without a check;
    a text loader's state holds no marker."""
    want = _read(dirs["parquet"], synth_tokenizer, "ids", n=12, packing=packing)
    states = []
    for inside in (True, False):
        with shmloader.ShmLoader(dirs["parquet"], synth_tokenizer, B, T, "all", column="ids", device="cpu",
                                 num_workers=2, timeout=60, packing=packing) as loader:
            for _ in range(6):
                next(loader)
            if inside:
                states.append(json.loads(json.dumps(loader.state_dict())))
        if not inside:
            states.append(json.loads(json.dumps(loader.state_dict())))  # after close(): no first-batch check
    checked, unchecked = states
    assert checked["check"] is not None and unchecked["check"] is None
    for state in (checked, unchecked):
        with pytest.raises(ValueError, match=r"token ids: the state was saved by a shmloader that gave token ids "
                                             r"already beginning with BOS a second one") as ei:
            _read(dirs["parquet"], synth_tokenizer, "ids", n=1, packing=packing, resume_state=_as_before_the_rule(state))
        assert "one token off" in str(ei.value) and "first batch" not in str(ei.value)
        got = _read(dirs["parquet"], synth_tokenizer, "ids", n=6, packing=packing, resume_state=state)
        for i, (g, w) in enumerate(zip(got, want[6:])):
            assert all(np.array_equal(a, b) for a, b in zip(g, w)), f"batch {6 + i} after the resume differs"
    with shmloader.ShmLoader(dirs["text"], synth_tokenizer, B, T, "all", device="cpu", num_workers=1, timeout=60,
                             packing=packing) as loader:
        next(loader)
        assert "token_ids" not in loader.state_dict()["config"]


def test_a_cache_filled_before_the_bos_rule_is_not_served(dirs, synth_tokenizer, tmp_path, watchdog):
    """A cache that a loader of token ids filled before the rule holds [BOS, BOS, ...] for ids
    that begin with BOS, keyed as text is: those entries, whole (row group 0 of each file) and
    partial (the first 64 rows of row group 1), are never found; the loader reads the text's
    batches and keeps entries of its own beside them."""
    from shmloader.data import cache as cachemod, source as sourcemod, tokenizer as tokmod
    spec = tokmod.resolve(synth_tokenizer)
    bos = _bos(synth_tokenizer)
    assert spec.bos == bos
    cache = cachemod.TokenCache(str(tmp_path / "c"), spec.fingerprint, spec.n_vocab)
    doubled = old = 0
    for f in range(2):
        path = f"{dirs['parquet']}/{f}.parquet"
        reader = sourcemod.Reader([path], columns="ids", n_vocab=spec.n_vocab)
        counts = reader.row_counts(0)
        for rg, end in ((0, counts[0]), (1, 64)):
            docs = reader.read_texts(0, rg, 0, end)
            lengths = np.array([len(d) + 1 for d in docs], dtype=np.int64)  # the old rule: a BOS before each
            tokens = np.concatenate([np.concatenate(([bos], d)) for d in docs])
            doubled += sum(d[:1].tolist() == [bos] for d in docs)
            cache.store_rows(cachemod.File(path, "ids"), rg, 0, end, counts[rg], lengths, tokens)  # keyed as text was
            old += 1
    assert doubled > 100
    before = sorted(p.name for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert len(before) == old == 4
    want = _read(dirs["text"], synth_tokenizer, "text")
    _same(_read(dirs["parquet"], synth_tokenizer, "ids", cache_dir=str(tmp_path / "c")), want)
    after = sorted(p.name for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert set(before) <= set(after) and len(after) > len(before)


def test_states_the_loader_before_the_rule_saved_are_refused(tmp_path, synth_tokenizer, watchdog):
    """tests/fixtures/token_ids_old_rule_states.json, saved by main before the rule (d0a87ac;
    tests/scripts/token_ids_old_rule_states.py) over the data its script writes: concat and best
    fit, during the run (with a check) and after close() (without one; that loader's fix without
    a marker resumed these one token off without a word). Each is refused naming the rule."""
    spec = importlib.util.spec_from_file_location("token_ids_old_rule_states", SCRIPTS / "token_ids_old_rule_states.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    states = json.loads((REPO_ROOT / "tests" / "fixtures" / "token_ids_old_rule_states.json").read_text())
    data = script.write_data(tmp_path, synth_tokenizer)
    assert sorted(states) == ["bos_bestfit-checked", "bos_bestfit-unchecked", "concat-checked", "concat-unchecked"]
    for name, state in states.items():
        assert state["files"][0][:2] == ["0.parquet", (tmp_path / "data" / "0.parquet").stat().st_size], name
        assert (state["check"] is None) == name.endswith("-unchecked") and "token_ids" not in state["config"]
        with pytest.raises(ValueError) as ei:
            with shmloader.ShmLoader(data, synth_tokenizer, script.B, script.T, "all", column="ids", device="cpu",
                                     num_workers=1, timeout=60, packing=name.split("-")[0], resume_state=state) as loader:
                next(loader)
        msg = str(ei.value)
        assert msg == ("resume state does not match this loader: token ids: the state was saved by a shmloader that "
                       "gave token ids already beginning with BOS a second one ([BOS, BOS, ...], before December "
                       "2026); this one gives them none, so resuming would put every such document one token off. "
                       "Start the run's loader without this state (a fresh pass over the data), or with its "
                       "nanochat keys alone (one source: 'pq_idx', 'rg_idx' and 'epoch', which resume at that row "
                       "group as nanochat's loader does, not at the token), or finish the run with the shmloader "
                       "that saved it"), name
        keys = {k: state[k] for k in ("pq_idx", "rg_idx", "epoch")}  # the way on the message names
        with shmloader.ShmLoader(data, synth_tokenizer, script.B, script.T, "all", column="ids", device="cpu",
                                 num_workers=1, timeout=60, packing=name.split("-")[0], resume_state=keys) as loader:
            x, _ = next(loader)
            assert x.shape == (script.B, script.T) and loader.state_dict()["config"]["token_ids"] == "own BOS kept"


def test_a_cache_pretokenize_filled_of_token_ids_serves_the_loader(dirs, synth_tokenizer, tmp_path, watchdog):
    """tools/pretokenize.py keys token ids' entries as the workers do (`cache.File.of`): a loader
    on the cache it filled reads every piece from it (no miss), the text's batches."""
    import subprocess
    import sys
    pkl = corpus.save_tokenizer(synth_tokenizer, tmp_path / "tok")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "pretokenize.py"), "--data", dirs["parquet"],
                           "--tokenizer", str(pkl), "--cache-dir", str(tmp_path / "c"), "--column", "ids",
                           "--workers", "2"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "6 row groups: 6 tokenized" in proc.stdout, proc.stdout
    with shmloader.ShmLoader(dirs["parquet"], str(pkl), B, T, "all", column="ids", device="cpu", num_workers=2,
                             timeout=60, cache_dir=str(tmp_path / "c")) as loader:
        got = [[t.numpy().copy() for t in batch] for batch in itertools.islice(loader, N)]
        stats = loader.stats()
    _same(got, _read(dirs["text"], synth_tokenizer, "text"))
    assert stats["cache_misses"] == 0 and stats["cache_hits"] > 0, stats
