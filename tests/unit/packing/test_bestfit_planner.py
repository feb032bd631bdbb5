"""Best-fit planner: equal to the scan oracle, every row full and BOS-aligned, exact resume."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmloader.packing import planner as planner_mod
from shmloader.packing.planner import BestFitPlanner
from tests.oracle import plan_batch_scan

FIELDS = ("row", "row_offset", "doc_id", "n_tokens")


# A compact checkpoint of a planner's buffer ids, for the resume tests below.
def ids_to_runs(doc_ids) -> list[list[int]]:
    """Compress ids into [[start, count], ...] runs of consecutive +1 ids, order kept."""
    ids = np.asarray(doc_ids, dtype=np.int64).ravel()
    if ids.size == 0:
        return []
    starts = np.flatnonzero(np.diff(ids) != 1) + 1
    bounds = np.concatenate(([0], starts, [ids.size]))
    return [[int(ids[a]), int(b - a)] for a, b in zip(bounds[:-1], bounds[1:])]


def runs_to_ids(runs) -> np.ndarray:
    """Expand [[start, count], ...] back into the int64 id array `ids_to_runs` compressed."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(s, s + c, dtype=np.int64) for s, c in runs])


class Source:
    """Endless chunk source. Doc k has id 5 + 3k (opaque, increasing, not contiguous) and a
    length from `kind`, seeded, so two Sources with equal arguments give equal streams."""

    def __init__(self, kind, row_len, chunk, seed):
        self.kind, self.row_len, self.chunk = kind, row_len, chunk
        self.rng, self.pulled, self.length_of = np.random.default_rng(seed), 0, {}
        self.values = self.rng.integers(1, 3 * row_len + 1, size=3)  # for "ties"

    def _lengths(self, n):
        hi, rng = 3 * self.row_len, self.rng
        if self.kind == "uniform":
            x = rng.integers(1, hi + 1, size=n)
        elif self.kind == "lognormal":
            x = np.rint(rng.lognormal(np.log(max(1, self.row_len / 3)), 1.0, size=n))
        elif self.kind == "ties":
            x = rng.choice(self.values, size=n)
        else:  # "tiny": mostly short docs, a few long ones
            tiny = rng.integers(1, max(2, self.row_len // 8) + 1, size=n)
            x = np.where(rng.random(n) < 0.1, rng.integers(1, hi + 1, size=n), tiny)
        return np.clip(x, 1, hi).astype(np.int64)

    def __call__(self):
        k = np.arange(self.pulled, self.pulled + self.chunk, dtype=np.int64)
        ids, lengths = 5 + 3 * k, self._lengths(self.chunk)
        self.pulled += self.chunk
        self.length_of.update(zip(ids.tolist(), lengths.tolist()))
        return ids, lengths


def fixed_source(*chunks):
    """Chunks given as lists of lengths; ids count from 0 across chunks. Fails when exhausted."""
    it, next_id = iter(chunks), [0]

    def next_chunk():
        lengths = np.array(next(it), dtype=np.int64)
        ids = np.arange(next_id[0], next_id[0] + lengths.size, dtype=np.int64)
        next_id[0] += lengths.size
        return ids, lengths

    return next_chunk


def same_plan(a, b):
    return a.n_cropped == b.n_cropped and all(
        np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def check_rows(plan, B, row_len, length_of):
    """Each row tiles [0, row_len) in order; only its last placement may be a cropped prefix."""
    for f in FIELDS:
        assert getattr(plan, f).dtype == np.int64
    assert np.all(np.diff(plan.row) >= 0)
    assert np.array_equal(np.unique(plan.row), np.arange(B))
    cropped = 0
    for r in range(B):
        sel = plan.row == r
        offs, ids, ntok = plan.row_offset[sel], plan.doc_id[sel], plan.n_tokens[sel]
        lengths = np.array([length_of[i] for i in ids.tolist()], dtype=np.int64)
        assert offs[0] == 0  # the row opens with a document's token 0: its BOS
        assert np.array_equal(offs[1:], offs[:-1] + ntok[:-1])
        assert offs[-1] + ntok[-1] == row_len
        assert np.all(ntok >= 1) and np.all(ntok <= lengths)
        assert np.array_equal(ntok[:-1], lengths[:-1])  # all whole but the last
        cropped += int(lengths[-1] - ntok[-1])
    assert plan.n_cropped == cropped


configs = st.fixed_dictionaries({
    "kind": st.sampled_from(["uniform", "lognormal", "ties", "tiny"]),
    "row_len": st.sampled_from([1, 2, 8, 2049]),
    "buffer_size": st.sampled_from([1, 3, 50, 1000]),
    "chunk": st.sampled_from([1, 7, 128]),
    "B": st.integers(1, 8),
    "batches": st.integers(1, 4),
    "seed": st.integers(0, 2**32 - 1),
})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs)
def test_equals_scan_oracle_and_rows_are_full(c):
    B, row_len, size = c["B"], c["row_len"], c["buffer_size"]
    src = Source(c["kind"], row_len, c["chunk"], c["seed"])
    ref_src = Source(c["kind"], row_len, c["chunk"], c["seed"])
    planner, ref_buffer, placed, cropped = BestFitPlanner(B, row_len, size), [], [], 0
    for _ in range(c["batches"]):
        plan = planner.plan_batch(src)
        ref = plan_batch_scan(ref_buffer, ref_src, B, row_len, size)
        assert same_plan(plan, ref)
        check_rows(plan, B, row_len, src.length_of)
        placed += plan.doc_id.tolist()
        cropped += plan.n_cropped
    assert len(placed) >= B * c["batches"]  # not vacuous
    assert len(set(placed)) == len(placed)  # no document used twice
    assert planner.tokens_placed == c["batches"] * B * row_len
    assert planner.tokens_cropped == cropped
    # conservation: every pulled doc is placed or buffered; the buffer keeps arrival order
    ids, lengths = planner.buffered()
    pulled = sorted(src.length_of)
    assert sorted(placed + ids.tolist()) == pulled
    assert np.all(np.diff(ids) > 0)
    assert lengths.tolist() == [src.length_of[i] for i in ids.tolist()]
    assert [[d, n] for d, n in zip(ids.tolist(), lengths.tolist())] == ref_buffer


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, st.integers(0, 3))
def test_rebuild_from_buffer_plans_the_same_batches(c, split):
    """Checkpoint after `split` batches (ids as JSON runs), rebuild, continue: same plans."""
    B, row_len, size, after = c["B"], c["row_len"], c["buffer_size"], c["batches"]
    src_a = Source(c["kind"], row_len, c["chunk"], c["seed"])
    src_b = Source(c["kind"], row_len, c["chunk"], c["seed"])
    a, b = BestFitPlanner(B, row_len, size), BestFitPlanner(B, row_len, size)
    for _ in range(split):
        assert same_plan(a.plan_batch(src_a), b.plan_batch(src_b))
    ids, lengths = b.buffered()
    state = json.loads(json.dumps({"runs": ids_to_runs(ids), "lengths": lengths.tolist(),
                                   "placed": b.tokens_placed, "cropped": b.tokens_cropped}))
    b = BestFitPlanner.from_buffer(B, row_len, size, runs_to_ids(state["runs"]),
                                   np.array(state["lengths"]), state["placed"], state["cropped"])
    assert np.array_equal(b.buffered()[0], ids) and np.array_equal(b.buffered()[1], lengths)
    for _ in range(after):
        assert same_plan(a.plan_batch(src_a), b.plan_batch(src_b))
    assert (a.tokens_placed, a.tokens_cropped) == (b.tokens_placed, b.tokens_cropped)
    assert a.tokens_placed == (split + after) * B * row_len


@pytest.mark.parametrize("kind", ["lognormal", "ties"])
def test_nanochat_scale_equals_scan_oracle(kind):
    """The default shape: B=8, T=2048, buffer 1000, chunks of 128, 6 batches."""
    B, row_len, size = 8, 2049, 1000
    src, ref_src = Source(kind, row_len, 128, 7), Source(kind, row_len, 128, 7)
    planner, ref_buffer = BestFitPlanner(B, row_len, size), []
    for _ in range(6):
        plan = planner.plan_batch(src)
        assert same_plan(plan, plan_batch_scan(ref_buffer, ref_src, B, row_len, size))
        check_rows(plan, B, row_len, src.length_of)
    assert len(planner) >= size - 1 and src.pulled > size


def test_ties_go_to_the_earliest_buffered():
    """One chunk [3, 9, 3, 9], row 8: fit takes 3 (id 0, not 2), then 3 (id 2); nothing fits
    the 2 left, so the shortest is a 9, id 1 (not 3), cropped to 2 tokens, 7 dropped.
    Latest-on-ties would give ids [2, 0, 3]."""
    planner = BestFitPlanner(1, 8, 1)
    plan = planner.plan_batch(fixed_source([3, 9, 3, 9]))
    assert plan.doc_id.tolist() == [0, 2, 1]
    assert plan.row_offset.tolist() == [0, 3, 6]
    assert plan.n_tokens.tolist() == [3, 3, 2]
    assert plan.n_cropped == 7
    assert [x.tolist() for x in planner.buffered()] == [[3], [9]]
    ref = plan_batch_scan([], fixed_source([3, 9, 3, 9]), 1, 8, 1)
    assert same_plan(plan, ref)


def test_whole_fit_tie_and_crop_tie_in_two_rows():
    """Row len 10, one chunk [5, 5, 5, 5, 12, 12], buffer_size 1: batch 1 is ids 0, 1 | 2, 3
    (earliest 5s first); batch 2 crops the 12s earliest first: id 4 in row 0, id 5 in row 1."""
    planner = BestFitPlanner(2, 10, 1)
    plan = planner.plan_batch(fixed_source([5, 5, 5, 5, 12, 12]))
    assert plan.doc_id.tolist() == [0, 1, 2, 3] and plan.row.tolist() == [0, 0, 1, 1]
    assert plan.row_offset.tolist() == [0, 5, 0, 5] and plan.n_cropped == 0
    plan = planner.plan_batch(fixed_source())  # the buffer never runs dry: no pull
    assert plan.doc_id.tolist() == [4, 5] and plan.n_tokens.tolist() == [10, 10]
    assert plan.n_cropped == 4 and len(planner) == 0
    assert (planner.tokens_placed, planner.tokens_cropped) == (40, 4)


def test_top_up_before_every_placement_whole_chunks():
    """buffer_size 2, chunks of 3: [1,1,1] then [7,7,7]. Row 10 takes id 0, id 1; the buffer
    then holds 1 < 2, so a whole chunk comes in before the third placement, which takes the
    7 (id 3) and then the last 1 (id 2). Topping up once per row would give [0, 1, 2, ...]."""
    calls = []
    inner = fixed_source([1, 1, 1], [7, 7, 7])

    def src():
        calls.append(1)
        return inner()

    planner = BestFitPlanner(1, 10, 2)
    plan = planner.plan_batch(src)
    assert plan.doc_id.tolist() == [0, 1, 3, 2]
    assert plan.row_offset.tolist() == [0, 1, 2, 9]
    assert len(calls) == 2 and len(planner) == 2
    assert planner.buffered()[0].tolist() == [4, 5]


def test_rows_do_not_continue_into_the_next_batch():
    """Row 4, docs of 3: each row is a whole 3 and 1 cropped token of the next doc."""
    planner, src = BestFitPlanner(1, 4, 1), fixed_source([3], [3], [3], [3])
    first, second = planner.plan_batch(src), planner.plan_batch(src)
    assert first.doc_id.tolist() == [0, 1] and first.n_tokens.tolist() == [3, 1]
    assert second.doc_id.tolist() == [2, 3] and second.row_offset.tolist() == [0, 3]
    assert (first.n_cropped, second.n_cropped, planner.tokens_cropped) == (2, 2, 4)


def test_huge_lengths_do_not_overflow():
    big = 2**45
    planner = BestFitPlanner(1, 8, 1)
    plan = planner.plan_batch(fixed_source([big, 3]))
    assert plan.doc_id.tolist() == [1, 0] and plan.n_tokens.tolist() == [3, 5]
    assert plan.n_cropped == big - 5


@given(st.lists(st.one_of(st.integers(1, 5000), st.integers(2**21 - 3, 2**21 + 3), st.integers(2**22, 2**24),
                          st.integers(1, 2**62)), max_size=40),
       st.integers(0, 2**20))
@settings(max_examples=300, deadline=None)
def test_keys_split_back_into_lengths_and_arrivals(lengths, a0):
    """`_keys` (sorted; floats below 2**21, whole-array, Python ints above) and `_split`
    (whole-array while the keys fit int64) agree with the key's definition, `length * 2**32 -
    arrival`, both ways; a float key is exact."""
    keys = planner_mod._keys(np.array(lengths, dtype=np.int64), a0)
    by_key = sorted(enumerate(lengths, a0), key=lambda an: (an[1] << 32) - an[0])
    assert keys == [(n << 32) - a for a, n in by_key]
    assert [type(k) for k in keys] == [float if n < 2**21 else int for _, n in by_key]
    got_lengths, arrivals = planner_mod._split(keys)
    assert got_lengths.tolist() == [n for _, n in by_key] and arrivals.tolist() == [a for a, _ in by_key]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 3), st.integers(1, 6))
def test_huge_and_small_lengths_mixed_equal_the_scan(seed, B):
    """Lengths of 2**21 and more (Python-int keys, not floats: the planner's int paths), about
    half of them 2**31 and more (keys past int64: `_keys`' and `_split`'s Python paths), among
    small ones, with renumbering: the plans equal the scan's."""
    rng = np.random.default_rng(seed)
    huge = rng.integers(2**21, 2**22, 400) << rng.integers(0, 19, 400)  # [2**21, 2**41)
    lengths = np.where(rng.random(400) < 0.05, huge, rng.integers(1, 40, 400))
    assert (lengths >= 2**31).any() and ((lengths >= 2**21) & (lengths < 2**31)).any()
    chunks = [lengths[i:i + 8].tolist() for i in range(0, 400, 8)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(planner_mod, "RENUMBER_SLACK", 0)
        planner, src = BestFitPlanner(B, 33, 6), fixed_source(*chunks)
        ref_buffer, ref_src = [], fixed_source(*chunks)
        for _ in range(12):
            assert same_plan(planner.plan_batch(src), plan_batch_scan(ref_buffer, ref_src, B, 33, 6))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 3))
def test_rows_of_2_to_the_21_tokens_or_more_equal_the_scan(seed, B):
    """A row past a float's exact keys (2**21 tokens and more: exact Python ints throughout,
    keys, space and offsets) with lengths about a row's and small ones: the plans equal the scan's."""
    rng = np.random.default_rng(seed)
    row_len = 2**21 + int(rng.integers(0, 4))
    pick = rng.random(240)
    lengths = np.where(pick < 0.3, rng.integers(2**20, 2**22, 240),
                       np.where(pick < 0.6, rng.integers(2**21 - 3, 2**21 + 3, 240), rng.integers(1, 2**19, 240)))
    chunks = [lengths[i:i + 4].tolist() for i in range(0, 240, 4)]
    planner, src = BestFitPlanner(B, row_len, 5), fixed_source(*chunks)
    ref_buffer, ref_src = [], fixed_source(*chunks)
    for _ in range(6):
        assert same_plan(planner.plan_batch(src), plan_batch_scan(ref_buffer, ref_src, B, row_len, 5))


@given(st.lists(st.integers(-2**40, 2**40), max_size=50))
@settings(max_examples=200, deadline=None)
def test_runs_round_trip(ids):
    runs = ids_to_runs(ids)
    assert runs_to_ids(runs).tolist() == ids
    assert sum(c for _, c in runs) == len(ids)
    assert json.loads(json.dumps(runs)) == runs


def test_runs_are_compact():
    assert ids_to_runs([5, 6, 7, 10, 11, 3]) == [[5, 3], [10, 2], [3, 1]]
    assert ids_to_runs(np.arange(1000, 2000)) == [[1000, 1000]]
    assert ids_to_runs([]) == [] and runs_to_ids([]).dtype == np.int64


def test_bad_input_raises():
    with pytest.raises(ValueError, match="lengths must be >= 1"):
        BestFitPlanner(1, 8, 2).plan_batch(fixed_source([3, 0]))
    with pytest.raises(ValueError, match="one length per document"):
        BestFitPlanner(1, 8, 2).plan_batch(lambda: (np.arange(3), np.ones(2)))
    with pytest.raises(ValueError, match="buffer_size must be a positive integer"):
        BestFitPlanner(1, 8, 0)
    with pytest.raises(ValueError, match="lengths must be >= 1"):
        BestFitPlanner.from_buffer(1, 8, 2, [0], [0])


def test_a_drained_source_is_planned_to_its_end_as_the_scan_plans_it():
    """A chunk source that runs out for good (a mixture that ended) raises `Drained`: the buffer
    is topped up no more and planned while it fills the rows, even below `buffer_size`, and a
    row it cannot fill raises `Drained`. The scan oracle plans the same batches."""
    from shmloader.packing.planner import Drained

    lengths = np.random.default_rng(7).integers(1, 40, 300)

    def source():
        chunks = iter(range(0, 300, 20))

        def next_chunk():
            lo = next(chunks, None)
            if lo is None:
                raise Drained
            return np.arange(lo, lo + 20), lengths[lo:lo + 20]
        return next_chunk

    for buffer_size in (50, 1000):  # below the documents there are, and above all of them
        planner, fast, slow, buffer, got, want = BestFitPlanner(3, 33, buffer_size), source(), source(), [], [], []
        while True:
            try:
                want.append(plan_batch_scan(buffer, slow, 3, 33, buffer_size))
            except Drained:
                break
        while True:
            try:
                got.append(planner.plan_batch(fast))
            except Drained:
                break
        assert len(got) == len(want) > 30, buffer_size
        for p, q in zip(got, want):
            assert p.doc_id.tolist() == q.doc_id.tolist() and p.n_tokens.tolist() == q.n_tokens.tolist()
        used = sum(int(p.n_tokens.sum()) + p.n_cropped for p in got)
        assert int(lengths.sum()) - used < 3 * 33 + 3 * int(lengths.max())  # what is left cannot fill a batch


class OutOfChunks(Exception):
    """A chunk source with nothing counted yet (the sequencer's `_NeedMore`)."""


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, st.integers(2, 12), st.integers(0, 4), st.sampled_from([0, 3, 1024]))
def test_renumbering_and_undone_plans_keep_the_plans_and_the_buffer(c, batches, limit, slack):
    """Over longer runs, with arrivals renumbered as often as possible (`RENUMBER_SLACK` 0: each
    time more documents have left than the buffer holds) or rarely, and every batch first tried
    with at most `limit` new chunks and undone (`snapshot`, `restore`) when it runs out, which
    undoes a renumbering made inside that plan: the plans and the buffer (in arrival order,
    with lengths) are the scan oracle's, batch after batch."""
    B, row_len, size = c["B"], c["row_len"], c["buffer_size"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(planner_mod, "RENUMBER_SLACK", slack)
        src, ref_src = Source(c["kind"], row_len, c["chunk"], c["seed"]), Source(c["kind"], row_len, c["chunk"], c["seed"])
        planner, ref_buffer, queue, undone = BestFitPlanner(B, row_len, size), [], [], 0
        for _ in range(batches):
            want = plan_batch_scan(ref_buffer, ref_src, B, row_len, size)
            given_ = []

            def limited():
                if len(given_) == limit:
                    raise OutOfChunks
                given_.append(queue.pop(0) if queue else src())
                return given_[-1]

            snapshot = planner.snapshot()
            try:
                got = planner.plan_batch(limited)
            except OutOfChunks:
                undone += 1
                planner.restore(snapshot)
                queue[:0] = given_
                got = planner.plan_batch(lambda: queue.pop(0) if queue else src())
            assert same_plan(got, want)
            ids, lengths = planner.buffered()
            assert [[d, n] for d, n in zip(ids.tolist(), lengths.tolist())] == ref_buffer
            assert np.array_equal(planner.buffered_ids(), ids) and len(planner) == len(ids)
        assert undone or limit >= 1  # with no chunk allowed, every batch that pulls one is undone


def test_a_lingering_document_does_not_grow_the_planner():
    """A document longer than every row stays buffered while shorter ones come and go (rule 2
    takes the shortest): the planner's record of arrivals is renumbered, so it stays within
    about twice the buffer over 3,000 batches (it would hold every document ever read)."""
    lengths = iter(np.concatenate(([10**6], np.random.default_rng(3).integers(1, 30, 10**6))).tolist())
    next_id = iter(range(10**7))

    def src():
        n = [next(lengths) for _ in range(16)]
        return np.array([next(next_id) for _ in n]), np.array(n)

    planner = BestFitPlanner(2, 64, 20)
    sizes = []
    for _ in range(3000):
        planner.plan_batch(src)
        sizes.append(len(planner._ids))  # noqa: SLF001 (the record under test)
    assert planner.buffered()[0][0] == 0 and planner.buffered()[1][0] == 10**6  # still there
    assert next(next_id) > 20_000  # many more documents went through than the record holds
    assert max(sizes) <= 2 * 36 + planner_mod.RENUMBER_SLACK + 16


def test_any_snapshot_can_be_restored_in_any_order():
    """An older snapshot restored, then a newer one: each gives back its own planner (from an
    adversarial review: the newer one's ids were cut off by the older one's restore)."""
    def src(start):
        nxt = [start]

        def next_chunk():
            ids = np.arange(nxt[0], nxt[0] + 2)
            nxt[0] += 2
            return ids, np.array([1, 1])
        return next_chunk

    planner = BestFitPlanner(1, 2, 2)
    first = planner.snapshot()
    planner.plan_batch(src(100))
    planner.plan_batch(src(102))
    second = planner.snapshot()
    planner.restore(first)
    other = src(900)
    assert planner.plan_batch(other).doc_id.tolist() == [900, 901]
    planner.plan_batch(other)
    planner.restore(second)
    assert planner.buffered()[0].tolist() == [102, 103]
    assert planner.plan_batch(src(104)).doc_id.tolist() == [102, 103]
    planner.restore(first)
    assert planner.plan_batch(src(7)).doc_id.tolist() == [7, 8] and planner.buffered()[0].tolist() == [9, 10]
