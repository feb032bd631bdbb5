"""data/shuffle.py: the shuffled order's arithmetic. Every unit once per epoch across ranks,
every document once per epoch, another order per epoch and per seed, the walk from any
position, and shuffle off leaving the files' order as it was."""
import itertools

import numpy as np
import pytest

from shmloader.config import LoaderConfig
from shmloader.data import shuffle
from shmloader.data.order import iter_pieces, start_position
from shmloader.errors import DataError
from shmloader.position import Position

COUNTS = [[30, 30, 7], [30], [0, 30, 30, 12], [5]]  # rows per unit of each file


def walk(order, rank, world, start, n_steps, counts=COUNTS):
    return list(itertools.islice(shuffle.row_steps(order, counts.__getitem__, len(counts), rank, world, start),
                                 n_steps))


def test_a_permutation_is_one_of_its_range_and_depends_on_its_key():
    for n in (0, 1, 2, 30, 1000):
        p = shuffle.permutation(n, 7, 1)
        assert sorted(p.tolist()) == list(range(n))
    assert shuffle.permutation(50, 7, 1).tolist() == shuffle.permutation(50, 7, 1).tolist()
    assert shuffle.permutation(50, 7, 1).tolist() != shuffle.permutation(50, 7, 2).tolist()
    assert shuffle.permutation(50, 7, 1).tolist() != shuffle.permutation(50, 8, 1).tolist()
    # pinned: a state resumes on any machine and numpy version, so the permutation never changes
    assert shuffle.permutation(8, 0, 1).tolist() == shuffle.permutation(8, 0, 1).tolist()
    assert shuffle.Shuffle(3).units(1, [[5, 5], [3], [2, 2, 2]]) == [(1, 0), (0, 1), (2, 0), (0, 0), (2, 1), (2, 2)]
    assert shuffle.Shuffle(3).rows(1, 0, 0, 10).tolist() == [6, 3, 9, 8, 1, 0, 4, 5, 7, 2]


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_unit_once_per_epoch_across_ranks(world):
    order = shuffle.Shuffle(11)
    all_units = {(f, g) for f, rows in enumerate(COUNTS) for g in range(len(rows))}
    for epoch in (1, 2, 3):
        shares = [shuffle.share(order, epoch, COUNTS, r, world) for r in range(world)]
        got = [u for s in shares for u in s]
        assert len(got) == len(set(got)) == len(all_units) and set(got) == all_units
        # and the walk of each rank reads its share, in its order, epoch after epoch
        for r in range(world):
            first = shuffle.first_position(order, COUNTS.__getitem__, len(COUNTS), r, world, epoch)
            steps = walk(order, r, world, first, len(shares[r]) * 2)
            assert [(s[1], s[2]) for s in steps[:len(shares[r])]] == shares[r]
            assert {s[0] for s in steps[:len(shares[r])]} == {epoch}
            assert [(s[1], s[2]) for s in steps[len(shares[r]):]] == \
                shuffle.share(order, epoch + 1, COUNTS, r, world)[:len(shares[r])]


def test_every_document_once_per_epoch_in_pieces():
    """The pieces of two epochs, over every rank, name each (unit, document) once per epoch, and
    the documents' rows are each unit's rows, each once."""
    order, world = shuffle.Shuffle(4), 2
    total = sum(map(sum, COUNTS))
    for epoch in (1, 2):
        seen = []
        for r in range(world):
            start = shuffle.first_position(order, COUNTS.__getitem__, len(COUNTS), r, world, epoch)
            for p in iter_pieces(COUNTS.__getitem__, len(COUNTS), r, world, start, max_docs=7, shuffle=order):
                if p.epoch != epoch:
                    break
                rows = order.rows(epoch, p.file, p.rg, COUNTS[p.file][p.rg])[p.doc_start:p.doc_end]
                seen += [(p.file, p.rg, int(row)) for row in rows]
        assert len(seen) == len(set(seen)) == total


def test_another_epoch_and_another_seed_give_another_order():
    a, b = shuffle.Shuffle(1), shuffle.Shuffle(2)
    assert a.units(1, COUNTS) != a.units(2, COUNTS)
    assert a.units(1, COUNTS) != b.units(1, COUNTS)
    assert a.rows(1, 0, 0, 30).tolist() != a.rows(2, 0, 0, 30).tolist()
    assert a.rows(1, 0, 0, 30).tolist() != a.rows(1, 0, 1, 30).tolist()  # each unit its own
    assert a.rows(1, 0, 0, 30).tolist() != b.rows(1, 0, 0, 30).tolist()


def test_the_walk_goes_on_from_any_position_of_it():
    order, world, rank = shuffle.Shuffle(9), 2, 1
    first = shuffle.first_position(order, COUNTS.__getitem__, len(COUNTS), rank, world)
    steps = walk(order, rank, world, first, 12)
    for i, (e, f, g, _, _, rows) in enumerate(steps):
        again = walk(order, rank, world, Position(e, f, g, min(3, rows)), 12 - i)
        assert again[0] == (e, f, g, min(3, rows), 0, rows)
        assert again[1:] == steps[i + 1:]


def test_a_position_outside_the_share_is_a_value_error():
    order = shuffle.Shuffle(9)
    theirs = shuffle.share(order, 1, COUNTS, 0, 2)[0]
    with pytest.raises(ValueError, match="not a unit of rank 1 of 2's share"):
        walk(order, 1, 2, Position(1, *theirs, 0), 1)


def test_more_ranks_than_units_is_a_data_error():
    with pytest.raises(DataError, match="fewer than the 20 ranks"):
        shuffle.first_position(shuffle.Shuffle(0), COUNTS.__getitem__, len(COUNTS), 19, 20)


def test_shuffle_off_is_the_files_order():
    assert LoaderConfig(B=2, T=8).order is None
    assert "shuffle" not in LoaderConfig(B=2, T=8).fingerprint("tok")
    assert LoaderConfig(B=2, T=8, shuffle=True, seed=5).fingerprint("tok")["shuffle"] == "seed 5"
    plain = list(itertools.islice(iter_pieces(COUNTS.__getitem__, len(COUNTS), 0, 2, start_position(0),
                                              max_docs=8), 20))
    again = list(itertools.islice(iter_pieces(COUNTS.__getitem__, len(COUNTS), 0, 2, start_position(0),
                                              max_docs=8, shuffle=None), 20))
    units = [u for u, _ in itertools.groupby((p.file, p.rg) for p in plain)]
    assert plain == again and units[:4] == [(0, 0), (0, 2), (1, 0), (2, 0)]


@pytest.mark.parametrize("bad", [{"shuffle": 1}, {"shuffle": True, "seed": -1}, {"shuffle": True, "seed": 1.5},
                                 {"seed": True}])
def test_bad_settings_are_value_errors(bad):
    with pytest.raises(ValueError, match="shuffle|seed"):
        LoaderConfig(B=2, T=8, **bad)


def test_tokens_taken_in_the_units_order_and_put_back():
    lengths = np.array([2, 0, 3, 1], dtype=np.int64)
    tokens = np.array([1, 1, 3, 3, 3, 4], dtype=np.int64)
    rows = np.array([2, 0, 3, 1])
    got_l, got_t = shuffle.take_tokens(lengths, tokens, rows)
    assert got_l.tolist() == [3, 2, 1, 0] and got_t.tolist() == [3, 3, 3, 1, 1, 4]
    back_l, back_t = shuffle.in_file_order(got_l, got_t, rows)
    assert back_l.tolist() == lengths.tolist() and back_t.tolist() == tokens.tolist()
    assert shuffle.take_tokens(lengths, tokens, rows[:0])[1].tolist() == []


class _Source:
    def __init__(self, counts):
        self.counts = counts

    def row_counts(self, f):
        return self.counts[f]

    def read_texts(self, f, g, start, end):
        return [f"{f}:{g}:{r}" for r in range(start, end)]


def test_a_piece_reads_its_documents_rows_in_the_units_order():
    from shmloader.data.order import Piece
    order, src = shuffle.Shuffle(2), _Source(COUNTS)
    rows = order.rows(3, 2, 1, 30)
    got = shuffle.read(src, order, Piece(0, 3, 2, 1, 4, 9))
    assert got == [f"2:1:{r}" for r in rows[4:9].tolist()]
    assert shuffle.read(src, order, Piece(0, 3, 2, 0, 0, 0)) == []


def test_documents_found_in_one_epoch_are_moved_to_another_epochs_order():
    order, n = shuffle.Shuffle(4), 30
    for found, to in ((1, 1), (1, 2), (3, 2)):
        got = shuffle.moved(order, n, 2, 1, [(found, 7, 8), (found, 20, 23)], to)
        rows = set(order.rows(found, 2, 1, n)[[7, 20, 21, 22]].tolist())
        docs = [d for lo, hi in got for d in range(lo, hi)]
        assert sorted(order.rows(to, 2, 1, n)[docs].tolist()) == sorted(rows)  # the same rows, in `to`'s places
        assert all(a[1] < b[0] for a, b in zip(got, got[1:]))  # sorted runs, not touching
    assert shuffle.moved(order, n, 2, 1, [(1, 7, 8), (1, 20, 23)], 1) == [(7, 8), (20, 23)]
    assert shuffle.moved(order, n, 2, 1, [], 2) == [] and shuffle.moved(order, n, 2, 1, [(1, 5, 5)], 2) == []


def test_the_first_positions_read_every_files_counts_once_and_hand_them_on():
    asked = []

    def row_counts(f):
        asked.append(f)
        return COUNTS[f]

    first = shuffle.FirstPositions(shuffle.Shuffle(5), row_counts, len(COUNTS), threads=3)
    assert first.counts is None
    assert first(0, 2) == shuffle.first_position(shuffle.Shuffle(5), COUNTS.__getitem__, len(COUNTS), 0, 2)
    first(1, 2)
    assert sorted(asked) == list(range(len(COUNTS)))  # each footer once, whatever the threads' order
    assert first.counts == tuple(map(tuple, COUNTS))


def test_a_sources_seed_is_drawn_from_the_seed_and_its_name_the_same_everywhere():
    assert shuffle.source_seed(3, "web") == 7840327437941691725  # crc32 and splitmix64: no hash() salt
    seeds = {shuffle.source_seed(s, name) for s in (0, 1, 3) for name in ("web", "code", "math")}
    assert len(seeds) == 9 and all(0 <= s < 2 ** 63 for s in seeds)


def test_a_mixtures_orders_read_the_runs_files_as_each_source_numbers_them():
    from types import SimpleNamespace
    from shmloader.data.sources import Range
    ranges = (Range("a", 0, 4), Range("b", 4, 8))  # two sources of COUNTS' four files each
    run = SimpleNamespace(mixture=SimpleNamespace(ranges=ranges))
    sourced = shuffle.of_run(LoaderConfig(B=2, T=8, shuffle=True, seed=9), run)
    a, b = (shuffle.Shuffle(shuffle.source_seed(9, n)) for n in "ab")
    assert sourced.orders == (a, b)
    assert np.array_equal(sourced.rows(2, 1, 0, 30), a.rows(2, 1, 0, 30))
    assert np.array_equal(sourced.rows(2, 5, 0, 30), b.rows(2, 1, 0, 30))
    assert not np.array_equal(sourced.rows(2, 1, 0, 30), sourced.rows(2, 5, 0, 30))
    firsts = sourced.firsts({"a": [1, 0, 0, 0]}, (COUNTS + COUNTS).__getitem__, 1, 2)
    assert list(firsts) == ["b"] and firsts["b"] == shuffle.first_position(b, COUNTS.__getitem__, 4, 1, 2)
    assert shuffle.of_run(LoaderConfig(B=2, T=8), run) is None
    assert shuffle.of_run(LoaderConfig(B=2, T=8, shuffle=True, seed=9), SimpleNamespace(mixture=None)) == shuffle.Shuffle(9)
