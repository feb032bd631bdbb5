"""The best-fit stream through the whole loader (docs/contract.md §2 `bos_bestfit`, §3).

- Parity: rows (inputs = rows[:, :-1], targets = rows[:, 1:]) AND each state's position
  `position[:4]` (epoch, file, row group, row) and `buffer` equal `oracle.bestfit_rows` (the scan
  oracle's rows, `last_end` and `runs`), over a pairwise grid of num_workers 1..4, rank 0/1
  of 1/2, T 7..2048, buffer_size 1/5/1000, tokenizer_batch_size 1/7/128, across epochs.
- Arithmetic on the loader's own output (token == position data, no empty documents, so a
  document is named by its first token): every row starts with BOS and is whole documents
  but for at most one cropped one at its end; documents entered == placed + buffered, so no
  document appears twice in an epoch and cropped tails never come back.
- Lockstep resume (state of batch k through JSON -> batches k+1.. byte for byte, states too)
  at row-group, file and epoch boundaries, from buffers holding documents of an earlier file
  or epoch, with another num_workers; also by `load_state_dict`; a SIGKILLed trainer
  restarted from its last checkpoint continues the oracle's stream.
- nanochat-format states resume like nanochat (empty buffer, next stride); states of another
  buffer_size / tokenizer_batch_size / packing are refused naming the field.
(`stats()["cropped_fraction"]` vs the oracle is tests/loader/test_observability.py's.)
"""
import contextlib
import hashlib
import itertools
import json
import os
import random
import subprocess
import sys
import time
import warnings
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import shmloader
from shmloader.cores import CoresWarning
from shmloader.demo import corpus
from shmloader.state import decode_runs
from tests import helpers
from tests.oracle import bestfit_rows
from tests.helpers import SCRIPTS, PosData, loader_children, shm_segments, sigkill_after

pytestmark = pytest.mark.usefixtures("watchdog")
FOLLOW = 30  # batches compared after each resume point


# ---------------------------------------------------------------- data

def _posdata(root, lengths, num_files, sizes) -> PosData:
    """`helpers.position_documents(lengths)` in `num_files` shards, read with IntTokenizer."""
    paths = corpus.write_shards(helpers.position_documents(lengths), root, num_files=num_files,
                                row_group_size=sizes)
    layout, pos, i = [], 0, 0
    for f, path in enumerate(paths):
        md = pq.ParquetFile(path).metadata
        for g in range(md.num_row_groups):
            for row in range(md.row_group(g).num_rows):
                if lengths[i] is not None:
                    layout.append((f, g, row, pos, lengths[i]))
                    pos += lengths[i] + 1
                i += 1
    assert i == len(lengths)
    tok = helpers.IntTokenizer()
    return PosData(root, paths, tok, lambda t: tok.encode(t), tok.get_bos_token_id(), [],
                   lengths=lengths, layout=layout)


@pytest.fixture(scope="module")
def fitdata(tmp_path_factory) -> PosData:
    """2400 documents, 5% null, none empty: 67% of 1-12 tokens (+BOS), 19% 13-60, 8% 61-400,
    1% 2000-3000 (longer than a T=2048 row); 4 files of 600 rows, row groups [50, 1, 13, 120]
    cycled (13 per file, the last of 48). Train ~105k tokens, ~26 batches of B=2, T=2048."""
    rng = random.Random(11)
    lengths = []
    for _ in range(2400):
        u = rng.random()
        lengths.append(None if u < 0.05 else rng.randint(1, 12) if u < 0.72 else rng.randint(13, 60)
                       if u < 0.91 else rng.randint(61, 400) if u < 0.99 else rng.randint(2000, 3000))
    return _posdata(tmp_path_factory.mktemp("fit"), lengths, 4, [50, 1, 13, 120])


@pytest.fixture(scope="module")
def lingerdata(tmp_path_factory) -> PosData:
    """600 documents, 5% null, 20% longer than a T=16 row (17-120 tokens): at buffer_size 5
    those linger in the buffer across row groups, files and epochs. 4 files of 150 rows, row
    groups [20, 1, 9, 45] x 2 per file; one train epoch is ~95 batches of B=2, T=16."""
    rng = random.Random(5)
    lengths = []
    for _ in range(600):
        u = rng.random()
        lengths.append(None if u < 0.05 else rng.randint(1, 9) if u < 0.65 else rng.randint(10, 16)
                       if u < 0.8 else rng.randint(17, 120))
    return _posdata(tmp_path_factory.mktemp("linger"), lengths, 4, [20, 1, 9, 45])


# ---------------------------------------------------------------- helpers

def rows_of(inputs, targets, B, T) -> np.ndarray:
    """The (B, T+1) rows of a batch, checking dtype, shape, contiguity and the shift."""
    for t in (inputs, targets):
        assert t.dtype == torch.int64 and t.shape == (B, T) and t.is_contiguous()
    x, y = inputs.numpy(), targets.numpy()
    assert np.array_equal(x[:, 1:], y[:, :-1]), "targets are not the inputs shifted by one per row"
    return np.concatenate([x, y[:, -1:]], axis=1)


def position(state: dict) -> tuple:
    """((epoch, file, rg, row) of its position, buffer runs), as the oracle reports it (the state holds
    the runs as text: state.decode_runs)."""
    assert state["position"][4] == 0
    return tuple(state["position"][:4]), decode_runs(state["buffer"]).tolist()


def take(loader, n):
    """n batches: (rows, states)."""
    rows, states = [], []
    for inputs, targets in itertools.islice(loader, n):
        rows.append(rows_of(inputs, targets, loader.B, loader.T))
        states.append(loader.state_dict())
    assert len(rows) == n > 0
    return rows, states


def fit_loader(ds, B, T, split="train", *, buffer_size, chunk, **kw):
    kw.setdefault("timeout", 60)
    return ds.loader(B, T, split, packing="bos_bestfit", buffer_size=buffer_size,
                     tokenizer_batch_size=chunk, **kw)


def oracle(ds, B, T, split="train", *, buffer_size, chunk, rank=0, world=1, cursor=None, runs=()):
    """`oracle.bestfit_rows`: yields (rows, ((epoch, file, rg, doc), runs))."""
    for rows, (end, buf) in bestfit_rows(ds.files(split), ds.encode, ds.bos, B, T, buffer_size,
                                                   chunk, rank, world, cursor, runs):
        yield rows, (tuple(end), buf)


def expected(n, *args, **kw):
    got = list(itertools.islice(oracle(*args, **kw), n))
    assert len(got) == n
    return [r for r, _ in got], [p for _, p in got]


def batches_until(gen, reached, extra, limit=3000):
    for k, (_, pos) in enumerate(gen):
        if reached(pos):
            return k + 1 + extra
        assert k < limit, "the boundary is never reached; the test data is too big"


def assert_same(got_rows, got_states, want_rows, want_pos, first=0):
    assert len(got_rows) == len(want_rows) > 0
    for i, (g, w) in enumerate(zip(got_rows, want_rows)):
        assert g.shape == w.shape and np.array_equal(g, w), f"batch {first + i}: rows differ from the oracle"
        got, want = position(got_states[i]), want_pos[i]
        assert got[0] == want[0], f"state after batch {first + i}: position {got[0]} != oracle {want[0]}"
        assert got[1] == want[1], f"state after batch {first + i}: buffer runs differ from the oracle"


def epoch_at_least(e):
    def reached(pos):
        return pos[0][0] >= e
    reached.__name__ = f"epoch{e}"
    return reached


def file_at_least(f):
    def reached(pos):
        return pos[0][0] >= 2 or pos[0][1] >= f
    reached.__name__ = f"file{f}"
    return reached


def after(n):
    """A fixed run of n batches (for runs whose first batch already crosses boundaries)."""
    def reached(pos):
        return False
    reached.__name__ = f"n{n}"
    reached.n = n
    return reached


# ---------------------------------------------------------------- 1. parity with the oracle

PARITY = [  # data, split, B, T, buffer_size, chunk, num_workers, rank, world, until, options
    ("fitdata", "val", 2, 7, 1, 1, 1, 0, 1, epoch_at_least(2), {}),
    ("fitdata", "val", 3, 7, 5, 7, 2, 1, 2, epoch_at_least(3), {}),
    ("fitdata", "train", 2, 7, 1000, 128, 3, 0, 2, after(40), {}),
    ("fitdata", "val", 4, 2048, 1000, 128, 4, 1, 2, epoch_at_least(6), {}),
    ("fitdata", "train", 2, 2048, 5, 1, 2, 0, 1, epoch_at_least(2), {}),
    ("fitdata", "train", 2, 2048, 1000, 128, 1, 1, 2, epoch_at_least(2), {}),
    ("fitdata", "val", 2, 32, 5, 7, 4, 0, 1, epoch_at_least(2), {"n_slots": 2, "max_piece_docs": 7}),
    ("posdata", "val", 1, 1, 5, 7, 2, 0, 1, epoch_at_least(2), {}),
    ("synth", "val", 2, 32, 5, 128, 3, 0, 1, epoch_at_least(2), {}),
    ("synth", "train", 2, 32, 1, 7, 4, 1, 2, file_at_least(2), {}),
    ("synth", "train", 4, 2048, 1000, 7, 2, 0, 1, epoch_at_least(3), {}),
    ("posdata", "val", 2, 16, 5, 7, 1, 0, 2, epoch_at_least(2), {}),
    ("posdata", "train", 1, 7, 1000, 1, 2, 1, 2, after(40), {"n_slots": 3}),
    ("lingerdata", "train", 2, 16, 1, 128, 3, 1, 2, epoch_at_least(2), {}),
]


def _parity_id(p):
    return (f"{p[0]}-{p[1]}-B{p[2]}T{p[3]}-buf{p[4]}-ch{p[5]}-w{p[6]}-r{p[7]}of{p[8]}-{p[9].__name__}"
            + ("-opts" if p[10] else ""))


@pytest.mark.parametrize("data,split,B,T,buffer_size,chunk,num_workers,rank,world,until,options",
                         PARITY, ids=[_parity_id(p) for p in PARITY])
def test_parity_with_oracle(request, data, split, B, T, buffer_size, chunk, num_workers, rank, world,
                            until, options):
    ds = request.getfixturevalue(data)
    kw = dict(buffer_size=buffer_size, chunk=chunk)
    o = dict(kw, rank=rank, world=world)
    n = getattr(until, "n", None) or batches_until(oracle(ds, B, T, split, **o), until, extra=8)
    want_rows, want_pos = expected(n, ds, B, T, split, **o)
    if not hasattr(until, "n"):
        assert until(want_pos[-1]) and not until(want_pos[0]), "the run does not cross the boundary"
    with fit_loader(ds, B, T, split, num_workers=num_workers, rank=rank, world_size=world,
                    **kw, **options) as loader:
        assert position(loader.state_dict()) == ((1, 0, rank, 0), [])
        got_rows, got_states = take(loader, n)
    assert_same(got_rows, got_states, want_rows, want_pos)
    assert all(json.loads(json.dumps(s)) == s for s in got_states)
    if buffer_size > 1 or chunk > 1:  # else the buffer is empty after every batch
        assert any(p[1] for p in want_pos), "the buffer is never non-empty: the state check is vacuous"


def test_drop_in_functions_positional_arguments(lingerdata):
    """nanochat's call, positionally: (tokenizer, B, T, split, tokenizer_threads,
    tokenizer_batch_size, device, resume_state_dict, buffer_size); num_workers defaults to
    tokenizer_threads, at most the cores; the state-less variant yields the same batches."""
    ds, B, T = lingerdata, 2, 16
    want_rows, want_pos = expected(40, ds, B, T, "train", buffer_size=5, chunk=3, rank=1, world=2)
    gen = shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit(
        ds.tokenizer, B, T, "train", 3, 3, "cpu", None, 5, data=str(ds.root), rank=1, world_size=2)
    got_rows, got_states = [], []
    with contextlib.closing(gen):
        for inputs, targets, state in itertools.islice(gen, 40):
            if not got_rows:
                assert len(loader_children()) == 1 + min(3, len(os.sched_getaffinity(0))), \
                    "num_workers does not default to tokenizer_threads (at most the cores)"
            got_rows.append(rows_of(inputs, targets, B, T))
            got_states.append(json.loads(json.dumps(state)))
    at = [((1, 0, 1, 0), [])] + want_pos[:-1]  # the state that resumes AT each batch
    assert_same(got_rows, got_states, want_rows, at)
    gen = shmloader.tokenizing_distributed_data_loader_bos_bestfit(
        ds.tokenizer, B, T, "train", 2, 3, torch.device("cpu"), None, 5, data=str(ds.root), rank=1,
        world_size=2, num_workers=1)
    with contextlib.closing(gen):
        got = [rows_of(x, y, B, T) for x, y in itertools.islice(gen, 40)]
    assert len(got) == 40 and all(np.array_equal(g, w) for g, w in zip(got, want_rows))


# ---------------------------------------------------------------- 2. arithmetic on the output

def canonical(ds: PosData, split, rank, world) -> list:
    """One epoch of this rank's documents: (file in split, rg, row, length with BOS, first token)."""
    first = 0 if split == "train" else len(ds.paths) - 1
    files = range(0, len(ds.paths) - 1) if split == "train" else [first]
    return [(f - first, g, row, n + 1, bos + 1) for f, g, row, bos, n in ds.layout
            if f in files and g % world == rank]


def parse_row(row, bos, docs_by_first):
    """Segments of a row: [(doc key or None, tokens used)]. Checks BOS at 0, consecutive
    positions after each BOS, whole documents but for the last segment."""
    assert row[0] == bos, "row does not start with BOS"
    starts = np.flatnonzero(row == bos)
    ends = np.append(starts[1:], len(row))
    segments = []
    for i, (a, b) in enumerate(zip(starts, ends)):
        used, last = b - a, i == len(starts) - 1
        if used == 1:  # a lone BOS: only a document cropped to its first token
            assert last, f"a lone BOS inside the row at {a} (fitdata has no empty document)"
            segments.append((None, 1))
            continue
        p = int(row[a + 1])
        assert p in docs_by_first, f"token {p} after a BOS is not a document's first token"
        key, length = docs_by_first[p]
        assert used <= length, f"document {key} holds {length} tokens, {used} placed"
        assert np.array_equal(row[a + 1:b], np.arange(p, p + used - 1)), f"document {key} not contiguous"
        assert last or used == length, f"document {key} cropped ({used}/{length}) but not at the row's end"
        segments.append((key, used))
    return segments


ARITH = [  # split, B, T, buffer_size, chunk, num_workers, rank, world, until, crops
    ("val", 3, 7, 5, 7, 2, 1, 2, epoch_at_least(3), True),
    ("train", 2, 32, 1, 1, 3, 0, 1, file_at_least(2), True),
    # a 1000-document buffer of mostly short documents always has one that fits: no crop
    ("train", 2, 2048, 1000, 128, 4, 0, 1, epoch_at_least(2), False),
]


@pytest.mark.parametrize("split,B,T,buffer_size,chunk,num_workers,rank,world,until,crops", ARITH,
                         ids=[f"{a[0]}-B{a[1]}T{a[2]}-buf{a[3]}-ch{a[4]}-w{a[5]}-r{a[6]}of{a[7]}" for a in ARITH])
def test_rows_are_whole_documents_and_each_is_used_once(fitdata, split, B, T, buffer_size, chunk,
                                                        num_workers, rank, world, until, crops):
    ds = fitdata
    epoch_docs = canonical(ds, split, rank, world)
    docs_by_first = {first: ((f, g, row), length) for f, g, row, length, first in epoch_docs}
    length_of = {key: length for key, length in docs_by_first.values()}
    n = batches_until(oracle(ds, B, T, split, buffer_size=buffer_size, chunk=chunk, rank=rank,
                             world=world), until, extra=3)
    with fit_loader(ds, B, T, split, buffer_size=buffer_size, chunk=chunk, num_workers=num_workers,
                    rank=rank, world_size=world) as loader:
        batches, states = take(loader, n)
    placed, lone, cropped_tokens, whole_docs, checked_epoch1 = Counter(), 0, 0, 0, 0
    for k, (rows, state) in enumerate(zip(batches, states)):
        for row in rows:
            for key, used in parse_row(row, ds.bos, docs_by_first):
                if key is None:
                    lone += 1
                    continue
                placed[key] += 1
                cropped_tokens += length_of[key] - used
                whole_docs += used == length_of[key]
        (E, F, G, D), runs = position(state)
        entered = Counter((f, g, row) for e in range(1, E + 1) for f, g, row, _, _ in epoch_docs
                          if (e, f, g, row) < (E, F, G, D))
        buffered = Counter()
        for e, f, g, row, count in runs:
            for r in range(row, row + count):
                assert (e, f, g, r) < (E, F, G, D), f"batch {k}: buffered document past the position"
                assert (f, g, r) in length_of, f"batch {k}: buffered ({f}, {g}, {r}) is not a document"
                buffered[(f, g, r)] += 1
        over = placed + buffered - entered
        assert not over, f"batch {k}: documents placed or buffered more often than read: {dict(over)}"
        missing = entered - placed - buffered  # only documents cropped to their BOS
        assert sum(missing.values()) == lone, f"batch {k}: documents lost: {dict(missing)}"
        assert all(length_of[key] >= 2 for key in missing)
        if E == 1:
            assert max(placed.values(), default=0) <= 1, f"batch {k}: a document appears twice in epoch 1"
            checked_epoch1 += 1
    assert E >= 2 or F >= 2, "the run crosses no file or epoch boundary"
    assert checked_epoch1 > 0 and whole_docs > 50 and len(placed) > 50
    assert (cropped_tokens > 0) == crops, f"{cropped_tokens} tokens cropped"


# ---------------------------------------------------------------- 3. lockstep resume

LINGER = dict(B=2, T=16, buffer_size=5, chunk=3)


class FitRun:
    """An uninterrupted best-fit run (2 workers), checked against the oracle: rows[k] and
    states[k] (the state yielded with batch k); k = -1 means the loader's initial state."""

    def __init__(self, ds, n, rank=0, world=1, B=2, T=16, buffer_size=5, chunk=3):
        self.ds, self.B, self.T, self.rank, self.world = ds, B, T, rank, world
        self.kw = dict(buffer_size=buffer_size, chunk=chunk)
        with fit_loader(ds, B, T, "train", num_workers=2, rank=rank, world_size=world, **self.kw) as loader:
            self.initial = loader.state_dict()
            self.rows, self.states = take(loader, n)
        self.positions = [position(s) for s in self.states]
        want_rows, want_pos = expected(n, ds, B, T, "train", rank=rank, world=world, **self.kw)
        assert_same(self.rows, self.states, want_rows, want_pos)
        md = [pq.ParquetFile(p).metadata for p in ds.files("train")]
        self.rg_rows = [[m.row_group(g).num_rows for g in range(m.num_row_groups)] for m in md]

    def state(self, k):
        return json.loads(json.dumps(self.initial if k < 0 else self.states[k]))  # as checkpointed

    def loader(self, **kw):
        return fit_loader(self.ds, self.B, self.T, "train", rank=self.rank, world_size=self.world,
                          **self.kw, **kw)

    def points(self) -> dict:
        """Resume points (after batch k) by kind, found from the positions."""
        pts = {}
        for k in range(1, len(self.positions) - FOLLOW):
            (e0, f0, g0, _), _ = self.positions[k - 1]
            (e, f, g, d), runs = self.positions[k]
            if e != e0:
                pts.setdefault("epoch", k)
            elif f != f0:
                pts.setdefault("file", k)
            elif g != g0:
                pts.setdefault("rg", k)
            if d == self.rg_rows[f][g]:
                pts.setdefault("rg-end", k)
                last_rg = max(x for x in range(len(self.rg_rows[f])) if x % self.world == self.rank)
                if g == last_rg:
                    pts.setdefault("file-end", k)
                    if f == len(self.rg_rows) - 1:
                        pts.setdefault("epoch-end", k)
            if any(r[0] < e for r in runs):
                pts.setdefault("linger-epoch", k)
            if any(r[0] == e and r[1] < f for r in runs):
                pts.setdefault("linger-file", k)
        return pts

    def check_follow(self, loader, k, n=FOLLOW):
        n = min(n, len(self.rows) - k - 1)
        assert n >= 10, "too few batches left after the resume point"
        got_rows, got_states = take(loader, n)
        for i in range(n):
            assert np.array_equal(got_rows[i], self.rows[k + 1 + i]), \
                f"resumed after batch {k}: batch {k + 1 + i} differs"
            assert position(got_states[i]) == self.positions[k + 1 + i], \
                f"resumed after batch {k}: state of batch {k + 1 + i} differs"


@pytest.fixture(scope="module")
def lingerrun(lingerdata):
    return FitRun(lingerdata, 200)


RESUME_KINDS = {"start": 1, "rg": 3, "rg-end": 4, "file": 1, "file-end": 3, "epoch-end": 2,
                "epoch": 4, "linger-file": 1, "linger-epoch": 3, "random": 4}


def test_resume_points_exist(lingerrun):
    pts = lingerrun.points()
    assert set(RESUME_KINDS) - {"start", "random"} <= set(pts), pts
    k = pts["linger-epoch"]
    (e, _, _, _), runs = lingerrun.positions[k]
    assert any(r[0] < e for r in runs)


@pytest.mark.parametrize("kind", list(RESUME_KINDS))
def test_resume_is_lockstep(lingerrun, kind):
    pts = lingerrun.points()
    pts.update(start=-1, random=random.Random(4).randrange(len(lingerrun.rows) - FOLLOW))
    k = pts[kind]
    state = lingerrun.state(k)
    options = {"n_slots": 2, "max_piece_docs": 3} if kind == "random" else {}  # not in the state
    with lingerrun.loader(num_workers=RESUME_KINDS[kind], resume_state=state, **options) as loader:
        assert position(loader.state_dict()) == position(state)
        lingerrun.check_follow(loader, k)


@pytest.mark.parametrize("kind", ["epoch", "linger-epoch"])
def test_resume_via_load_state_dict(lingerrun, kind):
    k = lingerrun.points()[kind]
    with lingerrun.loader(num_workers=4) as loader:
        loader.load_state_dict(lingerrun.state(k))
        assert position(loader.state_dict()) == lingerrun.positions[k]
        lingerrun.check_follow(loader, k)


def test_load_state_dict_rewinds_a_running_loader(lingerrun):
    k = lingerrun.points()["linger-file"]
    with lingerrun.loader(num_workers=1) as loader:
        take(loader, k + 25)
        loader.load_state_dict(lingerrun.state(k))
        lingerrun.check_follow(loader, k)


def test_chained_resumes(lingerrun):
    """Resume, run 20 batches, save, resume again with another num_workers: still lockstep,
    through the epoch boundary (~batch 95)."""
    k = 50
    for workers in (3, 1, 4, 2, 3):
        with lingerrun.loader(num_workers=workers, resume_state=lingerrun.state(k)) as loader:
            got_rows, got_states = take(loader, 20)
        for i, r in enumerate(got_rows):
            assert np.array_equal(r, lingerrun.rows[k + 1 + i]), f"hop from {k}: batch {k + 1 + i} differs"
        k += 20
        assert position(got_states[-1]) == lingerrun.positions[k]
    assert lingerrun.positions[k][0][0] == 2


def test_resume_rank1_of_2_with_lingering_buffer(lingerdata):
    r = FitRun(lingerdata, 150, rank=1, world=2)
    pts = r.points()
    assert "epoch" in pts and "linger-epoch" in pts, pts
    for kind, workers in (("epoch", 3), ("linger-epoch", 1)):
        k = pts[kind]
        with r.loader(num_workers=workers, resume_state=r.state(k)) as loader:
            r.check_follow(loader, k, n=20)


def test_resume_default_buffer_across_epochs(fitdata):
    """buffer_size 1000 at T=2048: the buffer spans files and epochs; resume at each
    epoch boundary with 3 workers."""
    r = FitRun(fitdata, 40, B=2, T=2048, buffer_size=1000, chunk=128)
    ks = [k for k in range(1, 25) if r.positions[k][0][0] != r.positions[k - 1][0][0]]
    assert ks and any(run[0] < r.positions[ks[0]][0][0] for run in r.positions[ks[0]][1])
    with r.loader(num_workers=3, resume_state=r.state(ks[0])) as loader:
        r.check_follow(loader, ks[0], n=12)


# ---------------------------------------------------------------- 4. restart after SIGKILL

@pytest.mark.deadline(240)  # two trainer processes, each a start of Python, torch and a loader: at load 20 past 60 s
def test_restart_after_sigkill(lingerdata, tmp_path):
    total, B, T, buffer_size, chunk = 150, 2, 16, 5, 3
    seed = random.randrange(1 << 30)
    kill_at = random.Random(seed).randrange(5, total - 30)
    info = f"(seed {seed}, kill after {kill_at} batches)"
    cmd = [sys.executable, str(SCRIPTS / "restart_trainer_bestfit.py"), "--data", str(lingerdata.root),
           "--tokenizer", "int", "--out", str(tmp_path), "--total", str(total), "--batch-size", str(B),
           "--seq-len", str(T), "--workers", "2", "--buffer-size", str(buffer_size), "--chunk", str(chunk),
           "--step-s", "0.01"]
    log = tmp_path / "log.jsonl"
    first_pid = sigkill_after(cmd, tmp_path, log, kill_at, info, timeout=100)
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["state"]["buffer"], f"the checkpoint resumed from has an empty buffer {info}"

    second = subprocess.run(cmd, capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert second.returncode == 0, f"{info}\n{second.stderr}"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["k"] for r in records] == list(range(total)), info
    second_pid = helpers.second_pid(tmp_path, first_pid)
    assert {r["pid"] for r in records} == {first_pid, second_pid}, info
    resumed_at = next(r["k"] for r in records if r["pid"] != first_pid)
    assert resumed_at >= kill_at - 1, info
    want_rows, want_pos = expected(total, lingerdata, B, T, "train", buffer_size=buffer_size, chunk=chunk)
    assert want_pos[-1][0][0] >= 2, "the run does not cross an epoch"
    at = [((1, 0, 0, 0), [])] + want_pos[:-1]  # the drop-in yields the state that resumes AT a batch
    for r, w, p in zip(records, want_rows, at):
        assert r["sha"] == hashlib.sha256(w.tobytes()).hexdigest(), f"batch {r['k']} differs {info}"
        assert tuple(r["pos"]) == p[0] and r["buffer_docs"] == sum(run[4] for run in p[1]), \
            f"state of batch {r['k']} differs {info}"
    assert not shm_segments(first_pid) and not shm_segments(second_pid), f"shared memory left {info}"


# ---------------------------------------------------------------- 5. nanochat states, refusals

NANOCHAT = [  # state, rank, world, (B, T, buffer_size, chunk)
    ({"pq_idx": 1, "rg_idx": 2}, 0, 1, (2, 16, 5, 3)),
    ({"pq_idx": 0, "rg_idx": 0}, 0, 1, (2, 16, 1000, 128)),       # next: the 1-row row group
    ({"pq_idx": 0, "rg_idx": 2, "epoch": 2}, 1, 2, (2, 16, 5, 3)),
    ({"pq_idx": 2, "rg_idx": 6}, 1, 2, (3, 7, 5, 1)),             # row group 9 > 7: next epoch
]


@pytest.mark.parametrize("state,rank,world,shape", NANOCHAT,
                         ids=[f"{json.dumps(s[0], separators=(',', ':'))}-r{s[1]}of{s[2]}" for s in NANOCHAT])
def test_nanochat_state_resumes_like_nanochat(lingerdata, state, rank, world, shape):
    B, T, buffer_size, chunk = shape
    rg = (state["rg_idx"] // world + 1) * world + rank
    cursor = (state.get("epoch", 1), state["pq_idx"], rg, 0)
    want_rows, want_pos = expected(25, lingerdata, B, T, "train", buffer_size=buffer_size, chunk=chunk,
                                   rank=rank, world=world, cursor=cursor)
    with fit_loader(lingerdata, B, T, buffer_size=buffer_size, chunk=chunk, num_workers=3, rank=rank,
                    world_size=world, resume_state=dict(state)) as loader:
        assert position(loader.state_dict()) == (cursor, [])
        got_rows, got_states = take(loader, 25)
    assert_same(got_rows, got_states, want_rows, want_pos)
    assert got_states[0]["version"] >= 1 and got_states[0]["rank"] == rank


def test_nanochat_state_through_the_drop_in(lingerdata):
    state = {"pq_idx": 1, "rg_idx": 4, "epoch": 1}
    want_rows, want_pos = expected(20, lingerdata, 2, 16, "train", buffer_size=5, chunk=3, cursor=(1, 1, 5, 0))
    gen = shmloader.tokenizing_distributed_data_loader_with_state_bos_bestfit(
        lingerdata.tokenizer, 2, 16, "train", 2, 3, "cpu", dict(state), 5, data=str(lingerdata.root))
    with contextlib.closing(gen):
        got = [(rows_of(x, y, 2, 16), s) for x, y, s in itertools.islice(gen, 20)]
    at = [((1, 1, 5, 0), [])] + want_pos[:-1]  # the state that resumes AT each batch
    assert_same([r for r, _ in got], [s for _, s in got], want_rows, at)


@pytest.mark.parametrize("k", [1, 30])
def test_other_ranks_state_resumes_exactly_at_its_batch_count(lingerdata, k):
    """Rank 1 given rank 0's best-fit state finds its own position and buffer at the state's
    batch count (replaying the planner over its own lengths) and continues exactly."""
    with fit_loader(lingerdata, 2, 16, buffer_size=5, chunk=3, rank=0, world_size=2) as loader:
        _, states = take(loader, k)
    state = json.loads(json.dumps(states[-1]))
    assert state["buffer"] and state["batch"] == k
    want_rows, want_pos = expected(k + 20, lingerdata, 2, 16, "train", buffer_size=5, chunk=3, rank=1,
                                   world=2)
    assert any(want_pos[k - 1][1]), "rank 1's buffer at the resume point is empty: the check is vacuous"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", CoresWarning)  # 3 workers on a 2-core machine: not this test's matter
        loader = fit_loader(lingerdata, 2, 16, buffer_size=5, chunk=3, num_workers=3, rank=1,
                            world_size=2, resume_state=state)
    with loader:
        assert position(loader.state_dict()) == want_pos[k - 1]
        got_rows, got_states = take(loader, 20)
    assert_same(got_rows, got_states, want_rows[k:], want_pos[k:], first=k)


def test_other_ranks_state_with_other_rank_nanochat_resumes_like_nanochat(lingerdata):
    with fit_loader(lingerdata, 2, 16, buffer_size=5, chunk=3, rank=0, world_size=2) as loader:
        _, states = take(loader, 30)
    state = json.loads(json.dumps(states[-1]))
    assert state["buffer"], "the state should carry a buffer that must NOT be used on rank 1"
    e, p, g = state["epoch"], state["pq_idx"], state["rg_idx"]
    cursor = (e, p, (g // 2 + 1) * 2 + 1, 0)
    want_rows, want_pos = expected(20, lingerdata, 2, 16, "train", buffer_size=5, chunk=3, rank=1, world=2,
                                   cursor=cursor)
    with pytest.warns(UserWarning, match="rank"):
        loader = fit_loader(lingerdata, 2, 16, buffer_size=5, chunk=3, num_workers=3, rank=1, world_size=2,
                            resume_state=state, other_rank="nanochat")
    with loader:
        assert position(loader.state_dict()) == (cursor, [])
        got_rows, got_states = take(loader, 20)
    assert_same(got_rows, got_states, want_rows, want_pos)


@pytest.mark.parametrize("field,kwargs", [
    ("buffer_size", dict(buffer_size=6)),
    ("tokenizer_batch_size", dict(tokenizer_batch_size=4)),
    ("packing", dict(packing="concat")),
])  # another world_size resumes elastically (tests/loader/test_elastic.py)
def test_state_of_other_config_is_refused(lingerrun, field, kwargs):
    args = dict(B=2, T=16, split="train", packing="bos_bestfit", buffer_size=5, tokenizer_batch_size=3)
    args.update(kwargs)
    B, T, split = args.pop("B"), args.pop("T"), args.pop("split")
    state = lingerrun.state(20)
    assert state["buffer"]
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        lingerrun.ds.loader(B, T, split, resume_state=state, **args)
    with lingerrun.ds.loader(B, T, split, **args) as loader:
        with pytest.raises(ValueError, match=rf"\b{field}\b"):
            loader.load_state_dict(state)


def test_concat_state_is_refused_by_bestfit(lingerdata):
    with lingerdata.loader(2, 16, "train") as loader:
        next(loader)
        state = loader.state_dict()
    with pytest.raises(ValueError, match=r"\bpacking\b"):
        fit_loader(lingerdata, 2, 16, buffer_size=5, chunk=3, resume_state=state)


# ---------------------------------------------------------------- read-ahead, lending, back-pressure

def test_batch_needing_more_documents_than_the_readahead_cap(tmp_path):
    """One batch of 4 rows of 129 tokens needs 129 four-token documents; the read-ahead cap is
    5 + 2 * 16 = 37 waiting documents: past it the coordinator reads on while a plan starves,
    so next() gets its batch instead of timing out."""
    ds = _posdata(tmp_path, [3] * 600, 2, [300])
    B, T = 4, 128
    want_rows, want_pos = expected(3, ds, B, T, buffer_size=5, chunk=8)
    with fit_loader(ds, B, T, buffer_size=5, chunk=8, num_workers=1, n_slots=2, max_piece_docs=16,
                    timeout=4) as loader:
        got_rows, got_states = take(loader, 3)
    assert_same(got_rows, got_states, want_rows, want_pos)


def test_batches_kept_out_of_order_stay_whole(fitdata):
    """Best-fit CPU batches are lent from the ring too: batches kept while later ones are
    dropped (their slots come back out of order) keep their rows, and so does the stream."""
    B, T = 2, 64
    want_rows, want_pos = expected(40, fitdata, B, T, buffer_size=20, chunk=8)
    kept, got_rows, got_states = {}, [], []
    with fit_loader(fitdata, B, T, buffer_size=20, chunk=8, num_workers=2, n_slots=4) as loader:
        for k, (inputs, targets) in enumerate(itertools.islice(loader, 40)):
            got_rows.append(rows_of(inputs, targets, B, T))
            got_states.append(loader.state_dict())
            if k % 5 == 1:
                kept[k] = (inputs, targets)
            if len(kept) > 2:
                kept.pop(min(kept))
    assert_same(got_rows, got_states, want_rows, want_pos)
    for k, (inputs, targets) in kept.items():
        assert np.array_equal(rows_of(inputs, targets, B, T), want_rows[k]), f"kept batch {k} changed"


def test_read_ahead_stops_while_the_trainer_pauses(tmp_path):
    """With the ring full and the trainer away, workers stop reading: what was read stays
    bounded, also after a plan has starved. Full is n_slots - 2 here:
    the last two batches taken keep their slots until the next next()."""
    ds = _posdata(tmp_path, [3, 40, 5, 300, 9] * 2000, 2, [64])
    with fit_loader(ds, 4, 128, buffer_size=50, chunk=8, num_workers=2, n_slots=4,
                    max_piece_docs=64) as loader:
        take(loader, 3)
        deadline = time.monotonic() + 20
        while loader.stats()["ring_ready"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        settled = loader.stats()["docs_read"]
        time.sleep(1.5)
        assert loader.stats()["ring_ready"] == 2
        assert loader.stats()["docs_read"] == settled, "workers kept reading while the ring was full"
        assert settled <= 50 + 8 + 2 * 64 + 3 * 4 * 129 + 4 * 64, settled  # buffer, chunk, caps, batches


def test_large_pieces_with_many_placements_do_not_deadlock(tmp_path):
    """A piece of 30,000 rows (its lengths message is bigger than a socket buffer) while
    write orders of thousands of placements queue up for the same worker: the coordinator must
    not block sending to a worker that is blocked sending to it."""
    ds = _posdata(tmp_path, [3] * 60_000, 2, [30_000])
    B, T = 16, 1024
    want_rows, want_pos = expected(12, ds, B, T, buffer_size=1000, chunk=128)
    with fit_loader(ds, B, T, buffer_size=1000, chunk=128, num_workers=2, max_piece_docs=30_000,
                    timeout=30) as loader:
        got_rows, got_states = take(loader, 12)
    assert_same(got_rows, got_states, want_rows, want_pos)
