"""The packings' locators (packing/concat.py, packing/bestfit.py) on their own: the position after a batch count, from lengths alone.

Concat against a brute-force walk of the token stream; both locators against piece layouts
(the same documents cut into pieces differently must give the same answer); best fit against
the planner run batch by batch, with and without a change of shape."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader.packing.planner import BestFitPlanner
from shmloader.packing.bestfit import BestFitLocator
from shmloader.packing.concat import ConcatLocator, concat_tokens
from shmloader.position import Position
from shmloader.data.order import Piece

START = Position(1, 0, 0, 0)


def pieces_of(lengths, cuts):
    """One row group of `lengths`, cut into pieces at `cuts`."""
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(lengths))), len(lengths)]
    return [(Piece(i, 1, 0, 0, a, b), np.array(lengths[a:b], dtype=np.int64))
            for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]


def run(locator, pieces):
    for piece, lengths in pieces:
        locator.feed(piece, lengths)
    return locator.result


def test_concat_tokens_sums_each_shape():
    assert concat_tokens([[0, 2, 16]], 5) == 5 * 33
    assert concat_tokens([[0, 2, 16], [3, 4, 8]], 5) == 3 * 33 + 2 * 33
    assert concat_tokens([[0, 1, 4], [2, 2, 4]], 2) == 2 * 5


@settings(deadline=None, max_examples=200)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=80), batch=st.integers(0, 20),
       cuts=st.lists(st.integers(0, 80), max_size=6))
def test_concat_position_is_the_first_document_holding_the_token(lengths, batch, cuts):
    target = batch * 9  # B=2, T=4
    got = run(ConcatLocator([[0, 2, 4]], batch, START), pieces_of(lengths, cuts))
    ends = np.cumsum(lengths)
    if target == 0:
        assert got == ((1, 0, 0, 0, 0), [])
    elif target >= ends[-1]:
        assert got is None  # needs more documents
    else:
        row = next(i for i, e in enumerate(ends) if e > target)
        assert got == ((1, 0, 0, row, target - (ends[row] - lengths[row])), [])


@settings(deadline=None, max_examples=60)
@given(lengths=st.lists(st.integers(0, 40), min_size=60, max_size=200), batch=st.integers(1, 6),
       cuts=st.lists(st.integers(0, 200), max_size=5), reshape=st.booleans())
def test_bestfit_replays_the_planner_whatever_the_pieces(lengths, batch, cuts, reshape):
    chunk, size = 3, 5
    cuts = [c - c % chunk for c in cuts]  # pieces are cut at chunk boundaries
    shapes = [[0, 2, 8], [batch // 2, 3, 6]] if reshape and batch // 2 else [[0, 2, 8]]
    whole = run(BestFitLocator(shapes, batch, START, size, chunk), pieces_of(lengths, []))
    cut = run(BestFitLocator(shapes, batch, START, size, chunk), pieces_of(lengths, cuts))
    assert whole == cut
    if whole is None:
        return
    # the same by hand: the planner fed chunks, rebuilt at the change of shape
    arr = np.array(lengths, dtype=np.int64)
    chunks = [(np.flatnonzero(arr[i:i + chunk]) + i, arr[i:i + chunk][arr[i:i + chunk] > 0], i + len(arr[i:i + chunk]))
              for i in range(0, len(arr), chunk)]
    it, last = iter(chunks), [0]

    def next_chunk():
        ids, lens, end = next(it)
        last[0] = end
        return ids, lens

    planner = BestFitPlanner(2, 9, size)
    for k in range(batch):
        if len(shapes) > 1 and k == shapes[1][0]:
            planner = BestFitPlanner.from_buffer(3, 7, size, *planner.buffered())
        planner.plan_batch(next_chunk)
    ids = planner.buffered_ids().tolist()
    runs = [[1, 0, 0, i, 1] for i in ids]
    merged = []
    for r in runs:
        if merged and merged[-1][3] + merged[-1][4] == r[3]:
            merged[-1][4] += 1
        else:
            merged.append(list(r))
    assert whole == ((1, 0, 0, last[0], 0), merged)
