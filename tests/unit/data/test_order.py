"""plan.iter_pieces: the canonical document order, cut into pieces, checked against an
independent brute-force enumeration; ramp sizes; resume cursors; nanochat_position; DataError
for a rank with no row group anywhere."""

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shmloader.errors import DataError
from shmloader.position import Position
from shmloader.data.order import (RAMP, buffer_pieces, iter_pieces, nanochat_position, ramp_for,
                           start_position)

EMPTY = "empty"  # marker unit: a row group with no rows (one 0-doc piece)


def brute_units(counts, rank, world, start, n_units):
    """The canonical order as a flat list of units, enumerated the obvious way:
    `(epoch, file, rg, doc)` per document, `(epoch, file, rg, EMPTY)` per empty row group,
    from `start` on, until n_units are collected (the caller makes sure there are units)."""
    out, epoch = [], start.epoch
    while len(out) < n_units:
        for f, rgs in enumerate(counts):
            for rg in range(rank, len(rgs), world):
                for d in ([EMPTY] if rgs[rg] == 0 else range(rgs[rg])):
                    key = (f, rg, 0 if d == EMPTY else d)
                    if epoch == start.epoch and key < (start.file, start.rg, start.doc):
                        continue
                    out.append((epoch, f, rg, d))
        epoch += 1
    return out[:n_units]


def piece_units(pieces, n_units):
    """Flatten pieces into the same units; consumes pieces until n_units are covered."""
    out, taken = [], []
    for p in pieces:
        taken.append(p)
        if p.n_docs == 0:
            assert p.doc_start == p.doc_end == 0, p
            out.append((p.epoch, p.file, p.rg, EMPTY))
        else:
            out += [(p.epoch, p.file, p.rg, d) for d in range(p.doc_start, p.doc_end)]
        if len(out) >= n_units:
            break
    return out[:n_units], taken


def counts_fn(counts, calls=None):
    def row_counts(f):
        if calls is not None:
            calls.append(f)
        return counts[f]
    return row_counts


def ramp_cap(j, max_docs, ramp=RAMP):
    return min(ramp[j], max_docs) if j < len(ramp) else max_docs


def check_sizes(pieces, counts, max_docs, ramp=RAMP):
    """The j-th non-empty piece holds min(ramp cap j, docs left in its row group)."""
    j = 0
    for p in pieces:
        if p.n_docs == 0:
            continue
        left = counts[p.file][p.rg] - p.doc_start
        assert p.n_docs == min(ramp_cap(j, max_docs, ramp), left), (j, p)
        j += 1


def has_rg(counts, rank):
    return any(len(rgs) > rank for rgs in counts)


# ------------------------------------------------------------------ concrete examples

def test_order_files_then_strided_row_groups_then_epochs():
    counts = [[2, 3, 1, 4], [1, 2], [5]]
    pieces = list(itertools.islice(iter_pieces(counts_fn(counts), 3, 1, 2, start_position(1)), 4))
    # rank 1 of 2: file 0 rg 1, 3; file 1 rg 1; file 2 has no rg 1; then epoch 2
    assert [(p.epoch, p.file, p.rg, p.doc_start, p.doc_end) for p in pieces] == [
        (1, 0, 1, 0, 3), (1, 0, 3, 0, 4), (1, 1, 1, 0, 2), (2, 0, 1, 0, 3)]
    assert [p.index for p in pieces] == [0, 1, 2, 3]


def test_ramp_then_capped_at_max_docs():
    n = 16 + 32 + 64 + 128 + 256 + 512 + 3 * 1000 + 7
    pieces = list(itertools.islice(iter_pieces(counts_fn([[n]]), 1, 0, 1, start_position(0),
                                               max_docs=1000), 11))
    assert [p.n_docs for p in pieces[:10]] == [16, 32, 64, 128, 256, 512, 1000, 1000, 1000, 7]
    assert pieces[9].doc_end == n and pieces[9].epoch == 1
    assert (pieces[10].epoch, pieces[10].doc_start, pieces[10].n_docs) == (2, 0, 1000)


def test_ramp_capped_by_small_max_docs_and_by_row_group_end():
    counts = [[10, 100, 40]]
    pieces = list(itertools.islice(iter_pieces(counts_fn(counts), 1, 0, 1, start_position(0),
                                               max_docs=24), 9))
    got = [(p.rg, p.doc_start, p.doc_end) for p in pieces]
    # ramp 16 (cut at the rg end: 10), 24 (32 capped), 24, 24, 24, 4 (rg end), 24, 16, then epoch 2
    assert got == [(0, 0, 10), (1, 0, 24), (1, 24, 48), (1, 48, 72), (1, 72, 96),
                   (1, 96, 100), (2, 0, 24), (2, 24, 40), (0, 0, 10)]
    assert pieces[-1].epoch == 2


def test_empty_row_group_yields_one_zero_doc_piece():
    counts = [[3, 0, 2], [0]]
    pieces = list(itertools.islice(iter_pieces(counts_fn(counts), 2, 0, 1, start_position(0)), 5))
    assert [(p.epoch, p.file, p.rg, p.doc_start, p.doc_end) for p in pieces] == [
        (1, 0, 0, 0, 3), (1, 0, 1, 0, 0), (1, 0, 2, 0, 2), (1, 1, 0, 0, 0), (2, 0, 0, 0, 3)]
    # an empty row group does not use up a ramp size
    assert pieces[2].n_docs == 2 and pieces[4].n_docs == 3


def test_start_mid_row_group_and_mid_file():
    counts = [[50, 50, 50, 50], [50, 50, 50]]
    it = iter_pieces(counts_fn(counts), 2, 1, 2, Position(epoch=4, file=0, rg=3, doc=37))
    pieces = list(itertools.islice(it, 6))
    got = [(p.epoch, p.file, p.rg, p.doc_start, p.doc_end) for p in pieces]
    assert got == [(4, 0, 3, 37, 50), (4, 1, 1, 0, 32), (4, 1, 1, 32, 50),
                   (5, 0, 1, 0, 50), (5, 0, 3, 0, 50), (5, 1, 1, 0, 50)]
    assert pieces[0].n_docs == 13  # ramp 16 cut at the row group end


def test_start_cursor_past_last_row_group_moves_to_next_file():
    # nanochat's resume: the next stride may not exist in this file; then the next file, rg=rank
    counts = [[5, 5, 5], [6, 6, 6, 6]]
    cur = nanochat_position(pq_idx=0, rg_idx=1, epoch=1, rank=1, world=2)
    assert cur == Position(1, 0, 3, 0)
    first = next(iter_pieces(counts_fn(counts), 2, 1, 2, cur))
    assert (first.epoch, first.file, first.rg, first.doc_start) == (1, 1, 1, 0)


def test_last_file_wraps_to_next_epoch_at_rank():
    counts = [[4, 4, 4], [4, 4, 4]]
    it = iter_pieces(counts_fn(counts), 2, 2, 3, Position(epoch=1, file=1, rg=2, doc=0))
    a, b = next(it), next(it)
    assert (a.epoch, a.file, a.rg) == (1, 1, 2)
    assert (b.epoch, b.file, b.rg, b.doc_start) == (2, 0, 2, 0)


# ------------------------------------------------------------------ nanochat_position

def test_nanochat_cursor_examples():
    assert nanochat_position(2, 5, 3, rank=1, world=4) == Position(3, 2, 9, 0)
    assert nanochat_position(0, 0, 1, rank=0, world=1) == Position(1, 0, 1, 0)
    assert nanochat_position(1, 7, 2, rank=0, world=8) == Position(2, 1, 8, 0)
    assert nanochat_position(1, 8, 2, rank=7, world=8) == Position(2, 1, 23, 0)


@settings(deadline=None)
@given(pq_idx=st.integers(0, 50), rg_idx=st.integers(0, 500), epoch=st.integers(1, 9),
       data=st.data(), world=st.integers(1, 16))
def test_nanochat_cursor_is_this_ranks_row_group_in_the_next_stride(pq_idx, rg_idx, epoch, data, world):
    rank = data.draw(st.integers(0, world - 1))
    c = nanochat_position(pq_idx, rg_idx, epoch, rank, world)
    assert (c.epoch, c.file, c.doc) == (epoch, pq_idx, 0)
    # this rank's row group in the stride after the one holding rg_idx
    stride_start = rg_idx - rg_idx % world
    assert c.rg == stride_start + world + rank
    assert c.rg > rg_idx and c.rg % world == rank
    # the original's arithmetic (reference loader), written out
    assert c.rg == (rg_idx // world + 1) * world + rank


# ------------------------------------------------------------------ DataError

def test_rank_with_no_row_group_anywhere_raises():
    counts = [[5, 5], [5], [5, 5]]
    with pytest.raises(DataError) as ei:
        next(iter_pieces(counts_fn(counts), 3, 2, 3, start_position(2)))
    msg = str(ei.value)
    assert "rank 2 of 3" in msg and "3 files" in msg


def test_no_files_raises():
    with pytest.raises(DataError):
        next(iter_pieces(counts_fn([]), 0, 0, 1, start_position(0)))


def test_rank_with_row_groups_in_only_some_files_is_fine():
    counts = [[5], [5, 5, 5], [5], [5]]
    it = iter_pieces(counts_fn(counts), 4, 2, 3, start_position(2))
    pieces = list(itertools.islice(it, 5))
    assert [(p.epoch, p.file, p.rg) for p in pieces] == [(e, 1, 2) for e in range(1, 6)]


def test_rank_with_row_group_only_in_first_file_started_in_a_barren_file():
    counts = [[5, 5], [5], [5], [5]]
    it = iter_pieces(counts_fn(counts), 4, 1, 2, Position(epoch=1, file=2, rg=1))
    pieces = list(itertools.islice(it, 3))
    assert [(p.epoch, p.file, p.rg) for p in pieces] == [(2, 0, 1), (3, 0, 1), (4, 0, 1)]


def test_rank_with_row_group_only_in_first_file_started_past_it():
    # start in file 0 past this rank's last row group: every file of the pass is barren
    # until the wrap brings the order back to file 0, rg 1 -- that is not "no row group"
    counts = [[5, 5], [5], [5]]
    it = iter_pieces(counts_fn(counts), 3, 1, 2, Position(epoch=1, file=0, rg=3))
    pieces = list(itertools.islice(it, 2))
    assert [(p.epoch, p.file, p.rg) for p in pieces] == [(2, 0, 1), (3, 0, 1)]


# ------------------------------------------------------------------ against brute force

counts_st = st.lists(st.lists(st.integers(0, 40), max_size=6), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(counts=counts_st, world=st.integers(1, 5), data=st.data(),
       max_docs=st.integers(1, 70), epochs=st.integers(1, 3))
def test_matches_brute_force_from_start(counts, world, data, max_docs, epochs):
    rank = data.draw(st.integers(0, world - 1), label="rank")
    ramp = data.draw(st.sampled_from([RAMP, (1, 2, 3), ()]), label="ramp")
    it = iter_pieces(counts_fn(counts), len(counts), rank, world, start_position(rank),
                     max_docs=max_docs, ramp=ramp)
    if not has_rg(counts, rank):
        with pytest.raises(DataError):
            next(it)
        return
    # units of one epoch: every document plus one per empty row group
    one_epoch = sum(max(1, rgs[rg]) for rgs in counts for rg in range(rank, len(rgs), world))
    assert one_epoch > 0
    n = one_epoch * epochs
    expected = brute_units(counts, rank, world, start_position(rank), n)
    got, pieces = piece_units(it, n)
    assert got == expected
    assert [p.index for p in pieces] == list(range(len(pieces)))
    check_sizes(pieces, counts, max_docs, ramp)
    # tiling: per (epoch, file, rg), the pieces are contiguous, disjoint and cover [0, count)
    by_rg = {}
    for p in pieces:
        by_rg.setdefault((p.epoch, p.file, p.rg), []).append((p.doc_start, p.doc_end))
    for (e, f, rg), spans in by_rg.items():
        if e > epochs:
            continue
        assert rg % world == rank and rg < len(counts[f])
        assert spans[0][0] == 0 and spans[-1][1] == counts[f][rg]
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert all(lo < hi for lo, hi in spans) or spans == [(0, 0)]
    assert {k for k in by_rg if k[0] <= epochs} == {
        (e, f, rg) for e in range(1, epochs + 1) for f, rgs in enumerate(counts)
        for rg in range(rank, len(rgs), world)}


@settings(max_examples=300, deadline=None)
@given(counts=counts_st, world=st.integers(1, 4), data=st.data(), max_docs=st.integers(1, 50))
def test_matches_brute_force_from_a_cursor(counts, world, data, max_docs):
    rank = data.draw(st.integers(0, world - 1), label="rank")
    if not has_rg(counts, rank):
        return
    # a cursor at any document of any of this rank's row groups (or just past its end)
    spots = [(f, rg) for f, rgs in enumerate(counts) for rg in range(rank, len(rgs), world)]
    # ... or this rank's first row group past the end of a file (a nanochat resume cursor)
    spots += [(f, rank + world * -(-max(0, len(rgs) - rank) // world)) for f, rgs in enumerate(counts)]
    f, rg = data.draw(st.sampled_from(spots), label="spot")
    n_rows = counts[f][rg] if rg < len(counts[f]) else 0
    doc = data.draw(st.integers(0, max(0, n_rows - 1)), label="doc")
    epoch = data.draw(st.integers(1, 5), label="epoch")
    start = Position(epoch, f, rg, doc)
    one_epoch = sum(max(1, rgs[r]) for rgs in counts for r in range(rank, len(rgs), world))
    n = 2 * one_epoch + 1
    expected = brute_units(counts, rank, world, start, n)
    got, pieces = piece_units(iter_pieces(counts_fn(counts), len(counts), rank, world, start,
                                          max_docs=max_docs), n)
    assert got == expected
    if rg < len(counts[f]):
        assert got[0][:3] == (epoch, f, rg)
    check_sizes(pieces, counts, max_docs)


def test_brute_force_oracle_sanity():
    # the oracle itself, by hand: rank 0 of 2, from file 0 rg 2 doc 1
    counts = [[1, 9, 2], [0, 9]]
    assert brute_units(counts, 0, 2, Position(3, 0, 2, 1), 5) == [
        (3, 0, 2, 1), (3, 1, 0, EMPTY), (4, 0, 0, 0), (4, 0, 2, 0), (4, 0, 2, 1)]


# ------------------------------------------------------------------ first_index, ramp_for, buffer_pieces

def test_first_index_offsets_piece_indices():
    it = iter_pieces(counts_fn([[40, 3]]), 1, 0, 1, start_position(0), first_index=17)
    assert [p.index for p in itertools.islice(it, 5)] == [17, 18, 19, 20, 21]


def test_ramp_for_examples():
    assert ramp_for(128, 1024) == ((128, 128, 128, 128, 256, 512), 1024)
    assert ramp_for(1, 1000) == (RAMP, 1000)
    assert ramp_for(100, 1000) == ((100, 100, 100, 200, 300, 600), 1000)
    assert ramp_for(7, 10) == ((21, 35, 70, 133, 259, 518), 14)


def test_ramp_for_best_fit_fill_is_one_chunk_pieces():
    # best fit's first batch waits for its buffer (1000 documents): one-chunk pieces cover it
    # and one chunk more, spread over the workers; then the ramp resumes above a chunk
    assert ramp_for(128, 1024, 1000) == ((128,) * 9 + (256, 512), 1024)
    assert ramp_for(100, 1000, 150) == ((100, 100, 100, 200, 300, 600), 1000)
    assert ramp_for(128, 1024, 0) == ramp_for(128, 1024)


@settings(deadline=None)
@given(chunk=st.integers(1, 600), max_docs=st.integers(1, 3000))
def test_ramp_for_rounds_up_to_whole_chunks(chunk, max_docs):
    ramp, cap = ramp_for(chunk, max_docs)
    assert len(ramp) == len(RAMP)
    for r, orig in zip(ramp + (cap,), RAMP + (max_docs,)):
        assert r % chunk == 0 and orig <= r < orig + chunk


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.lists(st.integers(0, 300), min_size=1, max_size=4), min_size=1, max_size=3),
       chunk=st.integers(1, 50), max_docs=st.integers(1, 200))
def test_pieces_never_split_a_chunk_with_ramp_for(counts, chunk, max_docs):
    ramp, cap = ramp_for(chunk, max_docs)
    it = iter_pieces(counts_fn(counts), len(counts), 0, 1, start_position(0), max_docs=cap, ramp=ramp)
    one_epoch = sum(max(1, c) for rgs in counts for c in rgs)
    _, pieces = piece_units(it, one_epoch)
    for p in pieces:
        assert p.doc_start % chunk == 0
        assert p.n_docs % chunk == 0 or p.doc_end == counts[p.file][p.rg]


def test_buffer_pieces_examples():
    runs = [[1, 0, 2, 5, 3], [2, 1, 0, 0, 7]]
    got = [(p.index, p.epoch, p.file, p.rg, p.doc_start, p.doc_end) for p in buffer_pieces(runs, 3)]
    assert got == [(0, 1, 0, 2, 5, 8), (1, 2, 1, 0, 0, 3), (2, 2, 1, 0, 3, 6), (3, 2, 1, 0, 6, 7)]
    assert buffer_pieces([], 10) == []


@settings(deadline=None)
@given(runs=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3), st.integers(0, 9),
                               st.integers(0, 50), st.integers(1, 40)).map(list), max_size=8),
       max_docs=st.integers(1, 16))
def test_buffer_pieces_rereads_exactly_the_runs_in_order(runs, max_docs):
    pieces = buffer_pieces(runs, max_docs)
    assert [p.index for p in pieces] == list(range(len(pieces)))
    assert all(1 <= p.n_docs <= max_docs for p in pieces)
    got = [(p.epoch, p.file, p.rg, d) for p in pieces for d in range(p.doc_start, p.doc_end)]
    want = [(e, f, rg, d) for e, f, rg, row, n in runs for d in range(row, row + n)]
    assert got == want


# ------------------------------------------------------------------ pieces bounded by text bytes

def test_pieces_are_cut_by_text_bytes_examples():
    # row group 0: 100 docs of 10 bytes, 1: 4 docs of 1000 bytes, 2: one doc of 5000 bytes
    counts, sizes = [[100, 4, 1]], [[1000, 4000, 5000]]
    it = iter_pieces(counts_fn(counts), 1, 0, 1, start_position(0), ramp=(), row_bytes=lambda f: sizes[f],
                     max_bytes=250)
    got = [(p.rg, p.doc_start, p.doc_end, p.text_bytes) for p in itertools.islice(it, 9)]
    assert got == [(0, 0, 25, 250), (0, 25, 50, 250), (0, 50, 75, 250), (0, 75, 100, 250),
                   (1, 0, 1, 1000), (1, 1, 2, 1000), (1, 2, 3, 1000), (1, 3, 4, 1000),
                   (2, 0, 1, 5000)]  # a piece holds one document at least


def test_bytes_bound_keeps_whole_units():
    it = iter_pieces(counts_fn([[100]]), 1, 0, 1, start_position(0), ramp=(), row_bytes=lambda f: [1000],
                     max_bytes=250, unit=7)
    assert [p.n_docs for p in itertools.islice(it, 5)] == [21, 21, 21, 21, 16]
    it = iter_pieces(counts_fn([[100]]), 1, 0, 1, start_position(0), ramp=(), row_bytes=lambda f: [1000],
                     max_bytes=30, unit=7)
    assert next(it).n_docs == 7  # one unit even when it is larger than max_bytes


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.lists(st.integers(0, 400), min_size=1, max_size=4), min_size=1, max_size=3),
       per_doc=st.lists(st.integers(0, 5000), min_size=12, max_size=12),
       max_bytes=st.integers(1, 20000), unit=st.integers(1, 9), max_docs=st.integers(1, 300),
       rank_world=st.sampled_from([(0, 1), (1, 2), (0, 3)]))
def test_bytes_bound_changes_only_the_cuts(counts, per_doc, max_bytes, unit, max_docs, rank_world):
    """With a text size per row group, the pieces still cover exactly the order the pieces
    without it cover; each holds at most max_bytes of text (or one unit), whole units."""
    rank, world = rank_world
    assume(has_rg(counts, rank))
    sizes = [[c * per_doc[(f * 4 + g) % 12] for g, c in enumerate(rgs)] for f, rgs in enumerate(counts)]
    ramp, cap = ramp_for(unit, max_docs)
    one_epoch = sum(max(1, c) for rgs in counts for g, c in enumerate(rgs) if g % world == rank)
    plain = iter_pieces(counts_fn(counts), len(counts), rank, world, start_position(rank), max_docs=cap, ramp=ramp)
    cut = iter_pieces(counts_fn(counts), len(counts), rank, world, start_position(rank), max_docs=cap, ramp=ramp,
                      row_bytes=lambda f: sizes[f], max_bytes=max_bytes, unit=unit)
    want, _ = piece_units(plain, 2 * one_epoch)
    got, pieces = piece_units(cut, 2 * one_epoch)
    assert got == want
    for p in pieces:
        n_rows = counts[p.file][p.rg]
        each = sizes[p.file][p.rg] / n_rows if n_rows else 0
        assert p.doc_start % unit == 0 and (p.n_docs % unit == 0 or p.doc_end == n_rows)
        assert p.n_docs <= max(unit, max_bytes / each if each else cap) + 1e-9
        assert p.text_bytes == round(each * p.n_docs)


@pytest.mark.parametrize("start_doc", [0, 5, 16, 31])
def test_aligned_pieces_end_at_whole_units_of_their_row_group(start_doc):
    """A mixture's source (`aligned=True`) resumed inside a unit of best fit's chunks: its first
    piece runs to the next whole unit, every later one ends at a whole unit or its row group's end;
    the same documents in order as without."""
    counts = {0: [40, 7, 70]}
    kw = dict(max_docs=32, ramp=(16, 32), unit=16)
    start = Position(1, 0, 0, start_doc)
    aligned = list(itertools.islice(iter_pieces(counts.__getitem__, 1, 0, 1, start, aligned=True, **kw), 12))
    plain = list(itertools.islice(iter_pieces(counts.__getitem__, 1, 0, 1, start, **kw), 12))
    rows = lambda pieces: [(p.epoch, p.rg, d) for p in pieces for d in range(p.doc_start, p.doc_end)]  # noqa: E731
    n = min(len(rows(aligned)), len(rows(plain)))
    assert n > 100 and rows(aligned)[:n] == rows(plain)[:n]
    sizes = dict(enumerate(counts[0]))
    assert all(p.doc_end % 16 == 0 or p.doc_end == sizes[p.rg] for p in aligned)
    assert aligned[0].doc_end == min(sizes[0], -(-(start_doc + 1) // 16) * 16)
