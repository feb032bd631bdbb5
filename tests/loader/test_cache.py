"""The token cache through the whole loader (shmloader/data/cache.py,
worker._cached_or_tokenized, tools/pretokenize.py).

What is checked, against the single-process oracles (`oracle.concat_windows`,
`oracle.bestfit_rows`) and against entries written independently of the workers (each row
group tokenized here with `enc.encode_ordinary` and stored with `TokenCache.store`):

- a cold run, a warm run and an uncached run give the same bytes as the oracle, in both
  packings; the warm run is served from the cache (cache_hits > 0, cache_misses == 0) and
  every entry the loader wrote is byte-equal to the independent one (whole row groups only);
- resume is exact across turning the cache on or off, from a state in the middle of a row
  group (so the resumed run starts with a partial piece sliced out of a cached entry);
- a rewritten data file never gets the old tokens; a damaged entry (truncated, flipped byte,
  empty, extra byte, another row group's entry, only a writer's leftover temporary) is one
  miss, the stream stays right, and the entry is rewritten byte-equal;
- loaders filling one cache at once; tokenizers (and BOS ids) sharing a cache directory;
  2- and 4-byte tokens; tools/pretokenize.py.

- a restart (fresh, or resumed inside the first, ramped, row group or a later one) on a cache
  filled only by a shorter earlier run tokenizes nothing (no miss, every worker's `tokenized`
  count 0), in both packings: slices of row groups are kept as partial entries and merged
  into the whole entry once they cover it.

Regression tests: a piece cap is refused with a cache (pieces after the ramp are whole row
groups, so that they get cached), and an id that does not fit the cache's dtype (a negative id of
an object tokenizer) is never cached, so it is never served changed.

(The cache's file format on its own, in this process: tests/unit/data/test_cache.py.)

Data: 3 files x 200 documents (every 37th a null row), row groups of 24, 16, 16, ... rows.
The first row group of a run (24 rows) is read as two ramp pieces (16 + 8 documents), so a
run's first pieces are partial; every later concat piece of these tests is a whole row group.
Built here (module fixtures), not from conftest.py.
"""
import contextlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from shmloader import ShmLoader
from shmloader.data import cache as cachemod
from shmloader.data import tokenizer as tokmod
from shmloader.demo import corpus
from shmloader.state import decode_runs
from tests import helpers
from tests.helpers import REPO_ROOT, part_files, tmp_files
from tests.oracle import bestfit_rows, concat_windows

B, T = 2, 128
BUFFER, CHUNK = 16, 8          # best fit: buffer_size, tokenizer_batch_size
# batches a run with n_slots=2 may read past its last: 2 pieces in flight and a piece's tokens
# held, per worker. What a run has in flight when it is closed is not kept in the cache, so a run
# that fills the cache for a later one goes 2 * AHEAD batches further than the later one reads.
AHEAD = 30
RG_SIZES = (24, 16, 16)
N_DOCS, N_FILES = 600, 3
PACKINGS = ("concat", "bos_bestfit")
HEADER_BYTES = 64


pytestmark = pytest.mark.usefixtures("watchdog")  # conftest: fail past 60 s instead of hanging


# ---------------------------------------------------------------- data

def make_docs(seed: int) -> list:
    docs = list(corpus.synthetic_texts(N_DOCS, seed=seed, mean_words=20))
    for i in range(5, len(docs), 37):
        docs[i] = None
    return docs


def write_data(root: Path, seed: int = 1) -> list[str]:
    return [str(p) for p in corpus.write_shards(make_docs(seed), root, num_files=N_FILES,
                                                row_group_size=RG_SIZES)]


def row_texts(path: str, rg: int) -> list:
    return pq.ParquetFile(path).read_row_group(rg, columns=["text"]).column("text").to_pylist()


def n_row_groups(path: str) -> int:
    return pq.ParquetFile(path).num_row_groups


@dataclass
class Data:
    root: Path
    paths: list       # every file (the last one is val)
    enc: object       # the tiktoken Encoding given to the loader
    spec: object      # its TokenizerSpec (fingerprint, n_vocab)
    bos: int

    @property
    def train(self) -> list[str]:
        return self.paths[:-1]

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def cache(self, cache_dir) -> cachemod.TokenCache:
        return cachemod.TokenCache(str(cache_dir), self.spec.fingerprint, self.spec.n_vocab)


def fill_independently(data: Data, cache_dir, files=None):
    """Store every row group of `files`, tokenized here (not by a worker)."""
    cache = data.cache(cache_dir)
    for path in files or data.paths:
        for rg in range(n_row_groups(path)):
            lengths, parts = [], []
            for text in row_texts(path, rg):
                ids = [] if text is None else [data.bos] + data.encode(text)
                lengths.append(len(ids))
                parts += ids
            cache.store(path, rg, np.array(lengths, dtype=np.int64), np.array(parts, dtype=np.int64))


@pytest.fixture(scope="module")
def enc():
    return corpus.train_tokenizer(corpus.synthetic_texts(300), vocab_size=300)


@pytest.fixture(scope="module")
def data(tmp_path_factory, enc) -> Data:
    root = tmp_path_factory.mktemp("cache_data")
    paths = write_data(root)
    spec = tokmod.resolve(enc)
    d = Data(root, paths, enc, spec, enc.encode_single_token("<|bos|>"))
    assert spec.bos == d.bos
    return d


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, data) -> Path:
    """A complete cache for `data` (all files), written independently of the loader."""
    root = tmp_path_factory.mktemp("pristine_cache")
    fill_independently(data, root)
    return root


def copy_cache(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def entry_files(cache_dir) -> list[Path]:
    return sorted(Path(cache_dir).rglob("*.tok"))


def assert_entries_pristine(data: Data, cache_dir, pristine: Path, files=None, rgs=None):
    """Every listed row group has a valid entry, byte-equal to the independent one."""
    cache, ref = data.cache(cache_dir), data.cache(pristine)
    checked = 0
    for path in files or data.train:
        for rg in (rgs if rgs is not None else range(n_row_groups(path))):
            assert cache.load(path, rg) is not None, f"no valid entry for {path} rg {rg}"
            got = Path(cache.path_of(path, rg)).read_bytes()
            want = Path(ref.path_of(path, rg)).read_bytes()
            assert got == want, f"entry for {path} rg {rg} differs from the independent one"
            checked += 1
    assert checked > 0


# ---------------------------------------------------------------- oracle and loader

def oracle(data: Data, packing: str, files=None, encode=None, bos=None):
    """Yield (window, position) from the single-process oracle."""
    files = files or data.train
    encode = encode or data.encode
    bos = data.bos if bos is None else bos
    if packing == "concat":
        yield from concat_windows(files, encode, bos, B, T)
    else:
        for rows, ((e, f, g, d), runs) in bestfit_rows(files, encode, bos, B, T, BUFFER, CHUNK):
            yield rows, (e, f, g, d, runs)


def expected(n: int, packing: str, data: Data, **kw):
    got = list(itertools.islice(oracle(data, packing, **kw), n))
    assert len(got) == n
    return [w for w, _ in got], [p for _, p in got]


def first_batch(packing: str, data: Data, reached, limit=5000, **kw) -> int:
    """1 + the index of the first oracle batch whose position satisfies `reached`."""
    for k, (_, pos) in enumerate(oracle(data, packing, **kw)):
        if reached(pos):
            return k + 1
        assert k < limit, "the condition is never reached; the test data is too big"


def window_of(packing: str, inputs, targets) -> np.ndarray:
    x, y = inputs.numpy(), targets.numpy()
    assert x.shape == y.shape and x.shape[0] == B
    if packing == "concat":
        x, y = x.reshape(-1), y.reshape(-1)
        assert np.array_equal(x[1:], y[:-1]), "targets are not inputs shifted by one"
        return np.concatenate([x[:1], y])
    assert np.array_equal(x[:, 1:], y[:, :-1]), "targets are not inputs shifted by one"
    return np.concatenate([x, y[:, -1:]], axis=1)


def position_of(packing: str, state: dict) -> tuple:
    pos = tuple(state["position"])
    return pos if packing == "concat" else pos[:4] + (decode_runs(state["buffer"]).tolist(),)


def make_loader(data_root, tokenizer, packing: str, cache_dir, **kw) -> ShmLoader:
    kw.setdefault("num_workers", 2)
    if packing == "bos_bestfit":
        kw.update(buffer_size=BUFFER, tokenizer_batch_size=CHUNK)
    return ShmLoader(str(data_root), tokenizer, B, T, "train", packing=packing, device="cpu",
                     cache_dir=None if cache_dir is None else str(cache_dir), timeout=30, **kw)


def run(data: Data, packing: str, cache_dir, n: int, tokenizer=None, root=None, **kw):
    """n batches: (windows, states, stats read before closing)."""
    tokenizer = data.enc if tokenizer is None else tokenizer
    windows, states = [], []
    with make_loader(root or data.root, tokenizer, packing, cache_dir, **kw) as loader:
        for inputs, targets in itertools.islice(loader, n):
            windows.append(window_of(packing, inputs, targets))
            states.append(loader.state_dict())
        stats = loader.stats()
    assert len(windows) == n > 0
    return windows, states, stats


def assert_stream(got, want, what: str):
    assert len(got) == len(want) > 0
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and np.array_equal(g, w), f"{what}: batch {k} differs from the oracle"


def past_epoch1(pos) -> bool:
    """Epoch 1 done and the first row group of epoch 2 (read whole this time) consumed."""
    return pos[0] >= 2 and (pos[1], pos[2]) >= (0, 1)


# ---------------------------------------------------------------- cold, warm, uncached

@pytest.mark.parametrize("packing", PACKINGS)
def test_cold_warm_and_uncached_runs_equal_the_oracle(data, pristine, tmp_path, packing):
    n = first_batch(packing, data, past_epoch1) + 3
    want, want_pos = expected(n, packing, data)
    cache = tmp_path / "cache"

    plain, plain_states, plain_stats = run(data, packing, None, n)
    assert_stream(plain, want, "uncached")
    assert plain_stats["cache_hits"] == plain_stats["cache_misses"] == 0

    cold, cold_states, cold_stats = run(data, packing, cache, n)
    assert_stream(cold, want, "cold cache")
    assert cold_stats["cache_misses"] > 0      # (epoch 2 may already hit what epoch 1 stored)
    assert [position_of(packing, s) for s in cold_states] == want_pos
    assert cold_states == plain_states, "the cache changed the resume states"
    # Every train row group was read whole at least once: each has an entry of the whole
    # row group (a partial ramp piece must never be stored as the entry).
    assert_entries_pristine(data, cache, pristine)
    assert len(entry_files(cache)) == sum(n_row_groups(p) for p in data.train)
    assert tmp_files(cache) == []

    warm, warm_states, warm_stats = run(data, packing, cache, n)
    assert_stream(warm, want, "warm cache")
    assert warm_stats["cache_hits"] > 0 and warm_stats["cache_misses"] == 0, warm_stats
    assert warm_states == plain_states


@pytest.mark.parametrize("packing", PACKINGS)
def test_a_partial_first_row_group_is_merged_into_its_whole_entry(data, pristine, tmp_path, packing):
    """A short cold run reads file 0's row group 0 (24 rows) only as ramp pieces (16 + 8, or
    best fit's one-chunk pieces): they are kept as partial entries and merged into the whole
    entry, byte-equal to the independent one, with no partial entry left; later row groups
    are cached whole."""
    n = first_batch(packing, data, lambda pos: (pos[0], pos[1], pos[2]) >= (1, 0, 4))
    want, _ = expected(n, packing, data)
    cache = tmp_path / "cache"
    got, _, stats = run(data, packing, cache, n)
    assert_stream(got, want, "cold cache")
    assert stats["cache_misses"] >= 4
    assert_entries_pristine(data, cache, pristine, files=data.train[:1], rgs=[0, 1, 2, 3])
    assert part_files(cache) == [] and tmp_files(cache) == []


def tokenized(stats) -> int:
    """Tokens the workers tokenized (not served by the cache)."""
    return sum(w["tokenized"] for w in stats["workers"])


@pytest.mark.parametrize("packing", PACKINGS)
def test_a_restart_on_a_cache_filled_by_a_previous_run_tokenizes_nothing(data, tmp_path, packing):
    """A cold run shorter than an epoch (so that no row group is read whole a second time)
    fills the cache; restarting it, fresh or resumed inside the first (ramped) row group or
    inside a later one, tokenizes nothing and gives the oracle's bytes. The restarts take
    fewer batches than the filling run by more than a run reads ahead."""
    epoch = first_batch(packing, data, lambda p: p[0] >= 2)
    inside_first = first_batch(packing, data, lambda p: p[:3] == (1, 0, 0) and p[3] > 0)
    inside_later = resume_point(packing, data)
    m = 6
    n = max(inside_first, inside_later) + m + 2 * AHEAD
    assert n < epoch, "the filling run would reach epoch 2, which reads the first row group whole"
    want, _ = expected(n, packing, data)
    cache = tmp_path / "cache"
    fill, states, st = run(data, packing, cache, n, n_slots=2)
    assert_stream(fill, want, "filling run")
    assert st["cache_misses"] > 0 and tokenized(st) > 0, st
    c = data.cache(cache)
    assert c.load(data.train[0], 0) is not None, "the ramped first row group was not kept"

    got, _, st = run(data, packing, cache, m + AHEAD // 2, n_slots=2)
    assert_stream(got, want[:len(got)], "fresh restart")
    assert st["cache_misses"] == 0 and st["cache_hits"] > 0 and tokenized(st) == 0, st
    for k in (inside_first, inside_later):
        got, _, st = run(data, packing, cache, m, resume_state=states[k - 1], n_slots=2)
        assert_stream(got, want[k:k + m], f"resumed after batch {k}")
        assert st["cache_misses"] == 0 and st["cache_hits"] > 0 and tokenized(st) == 0, (k, st)


# ---------------------------------------------------------------- resume across the switch

def resume_point(packing: str, data: Data) -> int:
    """A batch after which the state lies inside a row group other than the first, so the
    resumed run starts with a partial piece (best fit: and a non-empty buffer)."""
    if packing == "concat":
        return first_batch(packing, data, lambda p: p[:3] >= (1, 0, 3) and p[3] > 0 and p[4] > 0)
    return first_batch(packing, data, lambda p: p[:3] >= (1, 0, 3) and p[3] > 0 and len(p[4]) > 1)


@pytest.mark.parametrize("packing", PACKINGS)
def test_resume_is_exact_across_turning_the_cache_on_and_off(data, pristine, tmp_path, packing):
    k, m = resume_point(packing, data), 40
    want, _ = expected(k + m, packing, data)
    warm = copy_cache(pristine, tmp_path / "warm")

    head_plain, states_plain, _ = run(data, packing, None, k)
    head_cached, states_cached, st = run(data, packing, warm, k)
    assert_stream(head_plain, want[:k], "uncached head")
    assert_stream(head_cached, want[:k], "cached head")
    assert st["cache_hits"] > 0 and st["cache_misses"] == 0
    assert states_plain[-1] == states_cached[-1], "a cached run saves a different state"
    state = states_plain[-1]

    tail, _, st = run(data, packing, warm, m, resume_state=state)        # uncached -> warm
    assert_stream(tail, want[k:], "uncached state resumed with a warm cache")
    # The first piece starts inside a row group: it was sliced out of a cached entry.
    assert st["cache_hits"] > 0 and st["cache_misses"] == 0, st

    tail, _, st = run(data, packing, tmp_path / "cold", m, resume_state=state)   # -> cold
    assert_stream(tail, want[k:], "uncached state resumed with an empty cache")
    assert st["cache_misses"] > 0

    tail, _, st = run(data, packing, None, m, resume_state=states_cached[-1])    # cached -> off
    assert_stream(tail, want[k:], "cached state resumed without a cache")


# ---------------------------------------------------------------- stale and damaged entries

@pytest.mark.parametrize("keep_mtime", [False, True], ids=["rewritten", "rewritten-old-mtime"])
def test_a_rewritten_data_file_is_never_served_old_tokens(data, tmp_path, keep_mtime):
    root = tmp_path / "data"
    paths = write_data(root, seed=1)
    cache = tmp_path / "cache"
    n = first_batch("concat", data, lambda p: (p[0], p[1]) >= (1, 1), files=paths[:-1]) + 2
    old, _ = expected(n, "concat", data, files=paths[:-1])
    got, _, _ = run(data, "concat", cache, n, root=root)
    assert_stream(got, old, "before the rewrite")
    old_id = cachemod.identity(paths[0])
    old_entries = [p for p in entry_files(cache) if p.name.startswith(f"{old_id:016x}-")]
    assert len(old_entries) >= 10, "file 0 was not cached before the rewrite"

    st = os.stat(paths[0])
    fresh = tmp_path / "fresh"
    corpus.write_shards(make_docs(seed=2)[:N_DOCS // N_FILES], fresh, num_files=1, row_group_size=RG_SIZES)
    os.replace(fresh / "shard_00000.parquet", paths[0])
    if keep_mtime:
        os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(paths[0]).st_size != st.st_size
    want, _ = expected(n, "concat", data, files=paths[:-1])
    assert not np.array_equal(want[0], old[0]), "the rewrite did not change the data"

    got, _, stats = run(data, "concat", cache, n, root=root)
    assert_stream(got, want, "after the rewrite")
    assert stats["cache_misses"] > 0
    assert all(p.exists() for p in old_entries)     # still there, just never used
    c = data.cache(cache)
    assert c.load(paths[0], 1) is not None and Path(c.path_of(paths[0], 1)) not in old_entries


def _truncate(p: Path):
    raw = p.read_bytes()
    p.write_bytes(raw[:len(raw) // 2])


def _flip_body_byte(p: Path):
    raw = bytearray(p.read_bytes())
    raw[-3] ^= 0xFF                      # a token byte: only the crc32 can tell
    p.write_bytes(bytes(raw))


def _flip_length_byte(p: Path):
    raw = bytearray(p.read_bytes())
    raw[HEADER_BYTES] ^= 0x01            # row 0's length
    p.write_bytes(bytes(raw))


def _zero_length(p: Path):
    p.write_bytes(b"")


def _header_only(p: Path):
    p.write_bytes(p.read_bytes()[:HEADER_BYTES])


def _append_byte(p: Path):
    p.write_bytes(p.read_bytes() + b"\0")


def _extra_token_crc_fixed(p: Path):
    raw = p.read_bytes() + b"\x07\x00"       # one more token than the header says ...
    head = np.frombuffer(raw[:HEADER_BYTES], "<u8").copy()
    head[5] = zlib.crc32(raw[HEADER_BYTES:])  # ... with a crc32 that matches the longer body
    p.write_bytes(head.tobytes() + raw[HEADER_BYTES:])


def _other_row_group(p: Path):
    shutil.copyfile(p.with_name(p.name.replace("-rg00001", "-rg00002")), p)


def _only_a_leftover_tmp(p: Path):
    raw = p.read_bytes()
    p.unlink()
    Path(f"{p}.tmp-999999-deadbeef").write_bytes(raw[:len(raw) // 2])    # a killed writer


DAMAGE = {"truncated": _truncate, "flipped_token_byte": _flip_body_byte,
          "flipped_length_byte": _flip_length_byte, "zero_length": _zero_length,
          "header_only": _header_only, "extra_byte": _append_byte,
          "extra_token_crc_fixed": _extra_token_crc_fixed,
          "other_row_groups_entry": _other_row_group, "leftover_tmp_only": _only_a_leftover_tmp}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_entry_is_one_miss_and_is_rewritten(data, pristine, tmp_path, damage):
    cache = copy_cache(pristine, tmp_path / "cache")
    c = data.cache(cache)
    target = Path(c.path_of(data.train[0], 1))
    DAMAGE[damage](target)
    assert c.load(data.train[0], 1) is None, "the damage was not detected by TokenCache.load"
    leftovers = tmp_files(cache)

    n = first_batch("concat", data, lambda p: p[:3] >= (1, 0, 3))
    want, _ = expected(n, "concat", data)
    got, _, stats = run(data, "concat", cache, n)
    assert_stream(got, want, f"with a {damage} entry")
    assert stats["cache_misses"] == 1 and stats["cache_hits"] > 0, stats
    assert_entries_pristine(data, cache, pristine, files=data.train[:1], rgs=[1])
    # a dead writer's temporary (pid 999999) is swept when the loader starts
    assert tmp_files(cache) == [p for p in leftovers if "tmp-999999-" not in p.name], \
        "a writer left a temporary file behind, or a dead writer's was not swept"


# ---------------------------------------------------------------- sharing a cache

def test_loaders_filling_one_cache_at_once(data, pristine, tmp_path):
    """Three loaders (6 worker processes) started together on an empty cache, iterated in
    turn: every stream is right, every entry valid and complete, no temporary file left."""
    cache = tmp_path / "cache"
    plans = [("concat", {}), ("concat", {"num_workers": 1}), ("bos_bestfit", {})]
    n = max(first_batch(p, data, past_epoch1) for p, _ in plans) + 2
    wants = [expected(n, p, data)[0] for p, _ in plans]
    got = [[] for _ in plans]
    with contextlib.ExitStack() as stack:
        loaders = [stack.enter_context(make_loader(data.root, data.enc, p, cache, **kw)) for p, kw in plans]
        for _ in range(n):
            for i, (p, _) in enumerate(plans):
                got[i].append(window_of(p, *next(loaders[i])))
        stats = [loader.stats() for loader in loaders]
    for i, (p, kw) in enumerate(plans):
        assert_stream(got[i], wants[i], f"loader {i} ({p}, {kw})")
        assert stats[i]["cache_hits"] + stats[i]["cache_misses"] > 0
    assert sum(s["cache_misses"] for s in stats) > 0
    assert_entries_pristine(data, cache, pristine)
    assert tmp_files(cache) == []


def test_another_tokenizer_gets_its_own_entries(data, tmp_path):
    enc2 = corpus.train_tokenizer(corpus.synthetic_texts(300, seed=7), vocab_size=290)
    spec2 = tokmod.resolve(enc2)
    assert spec2.fingerprint != data.spec.fingerprint
    bos2 = enc2.encode_single_token("<|bos|>")
    cache = tmp_path / "cache"
    n = first_batch("concat", data, lambda p: (p[0], p[1]) >= (1, 1))
    fill = n + 2 * AHEAD   # the filling runs go further than the warm ones read (see AHEAD)
    for enc in (data.enc, enc2):
        epoch = first_batch("concat", data, lambda p: p[0] >= 2, encode=enc.encode_ordinary,
                            bos=enc.encode_single_token("<|bos|>"))
        assert fill < epoch, "a filling run would reach epoch 2 and hit what it stored itself"
    want1, _ = expected(fill, "concat", data)
    want2, _ = expected(fill, "concat", data, encode=enc2.encode_ordinary, bos=bos2)
    assert not np.array_equal(want1[0], want2[0])

    got, _, _ = run(data, "concat", cache, fill, n_slots=2)
    assert_stream(got, want1, "tokenizer 1")
    got, _, st = run(data, "concat", cache, fill, tokenizer=enc2, n_slots=2)
    assert_stream(got, want2, "tokenizer 2, cold")
    assert st["cache_hits"] == 0 and st["cache_misses"] > 0, "tokenizer 2 was served tokenizer 1's entries"
    got, _, st = run(data, "concat", cache, n, tokenizer=enc2, n_slots=2)
    assert_stream(got, want2[:n], "tokenizer 2, warm")
    # misses: at most file 0's row group 0, read in epoch 1 only as two ramp pieces
    assert st["cache_hits"] > 0 and st["cache_misses"] <= 2, st
    assert sorted(p.name for p in cache.iterdir()) == sorted([data.spec.fingerprint, spec2.fingerprint])
    got, _, st = run(data, "concat", cache, n, n_slots=2)
    assert_stream(got, want1[:n], "tokenizer 1, warm again")
    assert st["cache_hits"] > 0 and st["cache_misses"] <= 2, st


def test_another_bos_gets_its_own_entries(data, pristine, tmp_path):
    """Entries hold each row as [BOS] + tokens, so the same tokenizer with another `bos=`
    must not be served them."""
    other = data.enc.encode_single_token("<|user_start|>")
    cache = copy_cache(pristine, tmp_path / "cache")          # complete, written with <|bos|>
    n = first_batch("concat", data, lambda p: (p[0], p[1]) >= (1, 1))
    want, _ = expected(n, "concat", data, bos=other)
    assert np.count_nonzero(want[0] == other) > 0
    for what in ("cold", "warm"):
        got, _, st = run(data, "concat", cache, n, bos=other)
        assert_stream(got, want, f"bos=<|user_start|> on a cache written with <|bos|>, {what}")
    assert st["cache_hits"] > 0
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2
    want, _ = expected(n, "concat", data)
    got, _, st = run(data, "concat", cache, n)
    assert_stream(got, want, "<|bos|> again")
    assert st["cache_hits"] > 0 and st["cache_misses"] == 0


def test_a_piece_cap_with_a_cache_is_refused_and_whole_row_groups_are_cached(data, pristine, tmp_path):
    """A row group cut into pieces would never be cached whole (the regression this guards): with
    a cache, pieces past the ramp are whole row groups, and a piece cap is refused."""
    cache = tmp_path / "cache"
    for cap in ({"max_piece_docs": 8}, {"max_piece_bytes": 1000}):
        with pytest.raises(ValueError, match=f"{next(iter(cap))}=.* acts only without cache_dir"):
            make_loader(data.root, data.enc, "concat", cache, **cap)
    n = first_batch("concat", data, past_epoch1) + 2
    want, _ = expected(n, "concat", data)
    got, _, _ = run(data, "concat", cache, n)
    assert_stream(got, want, "first run")
    got, _, st = run(data, "concat", cache, n)
    assert_stream(got, want, "second run")
    assert st["cache_hits"] > 0 and st["cache_misses"] == 0, st
    assert_entries_pristine(data, cache, pristine)


# ---------------------------------------------------------------- token width

def test_a_small_vocabulary_stores_two_byte_tokens(data, tmp_path):
    assert data.spec.n_vocab == 300
    cache = tmp_path / "cache"
    n = first_batch("concat", data, lambda p: p[:3] >= (1, 0, 3))
    run(data, "concat", cache, n)
    c = data.cache(cache)
    checked = 0
    for rg in (1, 2):
        raw = Path(c.path_of(data.train[0], rg)).read_bytes()
        head = np.frombuffer(raw[:HEADER_BYTES], "<u8")
        n_rows, n_tokens, width = int(head[2]), int(head[3]), int(head[4])
        assert width == 2 and n_rows == 16
        assert len(raw) == HEADER_BYTES + 8 * n_rows + 2 * n_tokens
        checked += n_tokens
    assert checked > 100


def int_docs(seed: int = 0) -> list:
    """Documents of IntTokenizer ids across the whole uint32 range."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(240):
        ids = rng.integers(1, 1 << 32, size=int(rng.integers(0, 30)), dtype=np.int64)
        if i % 11 == 3:
            ids = np.append(ids, [65535, 65536, (1 << 32) - 1])
        docs.append(None if i % 29 == 7 else " ".join(map(str, ids.tolist())))
    return docs


def test_an_object_tokenizer_stores_four_byte_tokens(tmp_path):
    root, cache = tmp_path / "data", tmp_path / "cache"
    paths = [str(p) for p in corpus.write_shards(int_docs(), root, num_files=3, row_group_size=16)]
    tok = helpers.IntTokenizer(bos=0)
    n = 60
    want = [w for w, _ in itertools.islice(concat_windows(paths[:-1], tok.encode, 0, B, T), n)]
    assert max(int(w.max()) for w in want) == (1 << 32) - 1
    for name, cdir in (("uncached", None), ("cold", cache), ("warm", cache)):
        got = []
        with make_loader(root, tok, "concat", cdir) as loader:
            for inputs, targets in itertools.islice(loader, n):
                got.append(window_of("concat", inputs, targets))
            stats = loader.stats()
        assert_stream(got, want, f"IntTokenizer, {name}")
    assert stats["cache_hits"] > 0 and stats["cache_misses"] == 0
    files = entry_files(cache)
    assert len(files) >= 5
    for p in files:
        raw = p.read_bytes()
        head = np.frombuffer(raw[:HEADER_BYTES], "<u8")
        assert int(head[4]) == 4, f"{p.name}: width {int(head[4])}"
        assert len(raw) == HEADER_BYTES + 8 * int(head[2]) + 4 * int(head[3])


def test_an_id_that_does_not_fit_is_never_served_changed(tmp_path):
    root, cache = tmp_path / "data", tmp_path / "cache"
    docs = [f"1 2 {-(i + 1)} 3" if i % 4 == 0 else "4 5 6" for i in range(96)]
    paths = [str(p) for p in corpus.write_shards(docs, root, num_files=3, row_group_size=16)]
    tok = helpers.IntTokenizer(bos=0)
    n = 10
    want = [w for w, _ in itertools.islice(concat_windows(paths[:-1], tok.encode, 0, B, 16), n)]
    for _ in range(2):                                   # cold, then warm
        with ShmLoader(str(root), tok, B, 16, device="cpu", num_workers=1, cache_dir=str(cache),
                       timeout=30) as loader:
            got = [window_of("concat", x, y) for x, y in itertools.islice(loader, n)]
        assert_stream(got, want, "negative ids")


# ---------------------------------------------------------------- tools/pretokenize.py

def pretokenize(data_dir, tokenizer_pkl, cache_dir) -> tuple[int, int]:
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "pretokenize.py"), "--data", str(data_dir),
                           "--tokenizer", str(tokenizer_pkl), "--cache-dir", str(cache_dir),
                           "--workers", "2"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"(\d+) row groups: (\d+) tokenized", proc.stdout)
    assert m, f"unexpected output: {proc.stdout!r}"
    assert f"pretokenize: done, {m.group(1)} row groups in " in proc.stderr, proc.stderr  # not a terminal: lines
    return int(m.group(1)), int(m.group(2))


def test_pretokenize_fills_every_row_group_once(data, pristine, tmp_path):
    pkl = corpus.save_tokenizer(data.enc, tmp_path / "tokenizer.pkl")
    cache = tmp_path / "cache"
    total = sum(n_row_groups(p) for p in data.paths)
    assert pretokenize(data.root, pkl, cache) == (total, total)
    assert_entries_pristine(data, cache, pristine, files=data.paths)      # val too (--split all)
    assert len(entry_files(cache)) == total and tmp_files(cache) == []
    mtimes = {p: p.stat().st_mtime_ns for p in entry_files(cache)}

    assert pretokenize(data.root, pkl, cache) == (total, 0)
    assert {p: p.stat().st_mtime_ns for p in entry_files(cache)} == mtimes, "a second run rewrote entries"

    # A loader afterwards tokenizes nothing: even its partial ramp pieces are sliced out of
    # the pretokenized entries.
    for packing in PACKINGS:
        n = first_batch(packing, data, lambda p: (p[0], p[1]) >= (1, 1))
        want, _ = expected(n, packing, data)
        got, _, st = run(data, packing, cache, n, tokenizer=str(pkl))
        assert_stream(got, want, f"{packing} after pretokenize")
        assert st["cache_misses"] == 0 and st["cache_hits"] > 0, st
    assert {p: p.stat().st_mtime_ns for p in entry_files(cache)} == mtimes
