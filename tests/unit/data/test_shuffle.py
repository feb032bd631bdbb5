"""data/shuffle.py: the shuffled order's arithmetic. Every unit once per epoch across ranks,
every document once per epoch, another order per epoch and per seed, the walk from any
position, and shuffle off leaving the files' order as it was."""
import itertools

import numpy as np
import pytest

from shmloader.config import LoaderConfig
from shmloader.data import mixrules, shuffle
from shmloader.data.order import Piece, iter_pieces, start_position
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
    assert shuffle.Shuffle(3, 40).rows(1, 0, 0, 10).tolist() == [6, 3, 9, 8, 1, 0, 4, 5, 7, 2]  # K: who is in it


def test_a_ranks_windows_are_its_share_of_the_order_of_units_each_the_fewest_holding_k_documents():
    for k in (1, 20, 60, 1000):
        order = shuffle.Shuffle(3, k)
        for world in (1, 2, 3):
            shares = order.shares(1, COUNTS, world)
            for rank, windows in enumerate(shares):
                units = [(m.file, m.unit) for w in windows for m in w.members]
                assert units == order.units(1, COUNTS)[rank::world]  # its share, cut into windows
                for w in windows[:-1] if k > 1 else ():  # the fewest units that hold k documents
                    assert w.rows >= k and (len(w.members) == 1 or w.rows - w.members[-1].rows < k)
                assert k > 1 or all(len(w.members) == 1 for w in windows)  # 1: every unit on its own
                assert all(w.rows == sum(COUNTS[m.file][m.unit] for m in w.members) for w in windows)
                assert [w.head for w in windows] == [(w.members[0].file, w.members[0].unit) for w in windows]
                assert windows == shuffle.share(order, 1, COUNTS, rank, world)


@pytest.mark.parametrize("k", [1, 60])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_unit_once_per_epoch_across_ranks(world, k):
    order = shuffle.Shuffle(11, k)
    all_units = {(f, g) for f, rows in enumerate(COUNTS) for g in range(len(rows))}
    for epoch in (1, 2, 3):
        shares = [shuffle.share(order, epoch, COUNTS, r, world) for r in range(world)]
        got = [(m.file, m.unit) for s in shares for w in s for m in w.members]
        assert len(got) == len(set(got)) == len(all_units) and set(got) == all_units
        # and the walk of each rank reads its share, in its order, epoch after epoch
        for r in range(world):
            first = shuffle.first_position(order, COUNTS.__getitem__, len(COUNTS), r, world, epoch)
            after = shuffle.share(order, epoch + 1, COUNTS, r, world)
            steps = walk(order, r, world, first, len(shares[r]) + len(after))
            assert [s.members for s in steps[:len(shares[r])]] == [w.members for w in shares[r]]
            assert [(s.file, s.rg, s.rows) for s in steps[:len(shares[r])]] == [(*w.head, w.rows) for w in shares[r]]
            assert {s.epoch for s in steps[:len(shares[r])]} == {epoch}
            assert [s.members for s in steps[len(shares[r]):]] == [w.members for w in after]


@pytest.mark.parametrize("k", [1, 60])
def test_every_document_once_per_epoch_in_pieces(k):
    """The pieces of two epochs, over every rank, name each (unit, document) once per epoch, and
    the documents' rows are each unit's rows, each once."""
    order, world = shuffle.Shuffle(4, k), 2
    total = sum(map(sum, COUNTS))
    for epoch in (1, 2):
        seen = []
        for r in range(world):
            start = shuffle.first_position(order, COUNTS.__getitem__, len(COUNTS), r, world, epoch)
            for p in iter_pieces(COUNTS.__getitem__, len(COUNTS), r, world, start, max_docs=7, shuffle=order):
                if p.epoch != epoch:
                    break
                which, rows = shuffle.locate(p.members, shuffle.rows_of(order, p))
                seen += [(p.members[w].file, p.members[w].unit, r) for w, r in zip(which.tolist(), rows.tolist())]
        assert len(seen) == len(set(seen)) == total
        assert all(r < COUNTS[f][g] for f, g, r in seen)


def test_a_window_interleaves_the_documents_of_its_units():
    """With windows of 80 documents (8 units of 10), a window's neighbouring documents are
    mostly of different units; with one unit to a window, all of one."""
    counts = [[10] * 8 for _ in range(6)]  # 48 units of 10 rows
    for k, most in ((1, 1.0), (80, 0.35)):
        order = shuffle.Shuffle(5, k)
        same = pairs = 0
        for w in order.shares(1, counts, 1)[0]:
            which, _ = shuffle.locate(w.members, order.rows(1, *w.head, w.rows))
            same += int(np.count_nonzero(which[1:] == which[:-1]))
            pairs += len(which) - 1
        assert same / pairs <= most and (k == 1) == (same == pairs)


def test_another_epoch_and_another_seed_give_another_order():
    a, b = shuffle.Shuffle(1), shuffle.Shuffle(2)
    assert a.units(1, COUNTS) != a.units(2, COUNTS)
    assert a.units(1, COUNTS) != b.units(1, COUNTS)
    assert a.rows(1, 0, 0, 30).tolist() != a.rows(2, 0, 0, 30).tolist()
    assert a.rows(1, 0, 0, 30).tolist() != a.rows(1, 0, 1, 30).tolist()  # each window its own
    assert a.rows(1, 0, 0, 30).tolist() != b.rows(1, 0, 0, 30).tolist()


@pytest.mark.parametrize("k", [1, 40])
def test_the_walk_goes_on_from_any_position_of_it(k):
    order, world, rank = shuffle.Shuffle(9, k), 2, 1
    first = shuffle.first_position(order, COUNTS.__getitem__, len(COUNTS), rank, world)
    steps = walk(order, rank, world, first, 12)
    for i, step in enumerate(steps):
        again = walk(order, rank, world, Position(step.epoch, step.file, step.rg, min(3, step.rows)), 12 - i)
        assert again[0] == step._replace(doc=min(3, step.rows))
        assert again[1:] == steps[i + 1:]


def test_a_position_outside_the_share_is_a_value_error():
    order = shuffle.Shuffle(9, 40)
    theirs = shuffle.share(order, 1, COUNTS, 0, 2)[0]
    with pytest.raises(ValueError, match="does not head a window of rank 1 of 2's share"):
        walk(order, 1, 2, Position(1, *theirs.head, 0), 1)
    second = theirs.members[1]  # a unit of the window, not its head
    with pytest.raises(ValueError, match="does not head a window of rank 0 of 2's share"):
        walk(order, 0, 2, Position(1, second.file, second.unit, 0), 1)


def test_more_ranks_than_units_is_a_data_error():
    with pytest.raises(DataError, match="fewer than the 20 ranks"):
        shuffle.first_position(shuffle.Shuffle(0), COUNTS.__getitem__, len(COUNTS), 19, 20)
    # a window is of one rank's share: every rank with a unit has one, whatever K
    assert shuffle.first_position(shuffle.Shuffle(0, 200), COUNTS.__getitem__, len(COUNTS), 8, 9).epoch == 1


def test_shuffle_off_is_the_files_order():
    assert LoaderConfig(B=2, T=8).order is None
    assert "shuffle" not in LoaderConfig(B=2, T=8).fingerprint("tok")
    assert LoaderConfig(B=2, T=8, shuffle=True, seed=5).fingerprint("tok")["shuffle"] == "seed 5 window 256"
    assert LoaderConfig(B=2, T=8, shuffle=True, seed=5, shuffle_window=3).order == shuffle.Shuffle(5, 3)
    # one unit to a window is the order states were saved with before the window
    assert LoaderConfig(B=2, T=8, shuffle=True, seed=5, shuffle_window=1).fingerprint("tok")["shuffle"] == "seed 5"
    plain = list(itertools.islice(iter_pieces(COUNTS.__getitem__, len(COUNTS), 0, 2, start_position(0),
                                              max_docs=8), 20))
    again = list(itertools.islice(iter_pieces(COUNTS.__getitem__, len(COUNTS), 0, 2, start_position(0),
                                              max_docs=8, shuffle=None), 20))
    units = [u for u, _ in itertools.groupby((p.file, p.rg) for p in plain)]
    assert plain == again and units[:4] == [(0, 0), (0, 2), (1, 0), (2, 0)]
    assert all(p.members == () for p in plain)


@pytest.mark.parametrize("bad", [{"shuffle": 1}, {"shuffle": True, "seed": -1}, {"shuffle": True, "seed": 1.5},
                                 {"seed": True}, {"shuffle_window": 0}, {"shuffle_window": True},
                                 {"shuffle_window": 2.0}])
def test_bad_settings_are_value_errors(bad):
    with pytest.raises(ValueError, match="shuffle|seed"):
        LoaderConfig(B=2, T=8, **bad)


class _Source:
    def __init__(self, counts, bad=()):
        self.counts, self.bad, self.reads = counts, bad, []

    def row_counts(self, f):
        return self.counts[f]

    def read_texts(self, f, g, start, end):
        self.reads.append((f, g, start, end))
        if (f, g) in self.bad:
            return None  # as `read_or_skip` gives a bad unit skipped
        return [f"{f}:{g}:{r}" for r in range(start, end)]


def _pieces(order, counts, rank=0, world=1, max_docs=7, ramp=(16, 32)):
    start = shuffle.first_position(order, counts.__getitem__, len(counts), rank, world)
    return iter_pieces(counts.__getitem__, len(counts), rank, world, start, max_docs=max_docs, ramp=ramp,
                       shuffle=order)


def test_a_piece_reads_its_documents_rows_in_the_windows_order():
    """Every document of a piece is its row of its member, in the window's order; each member it
    takes is read as one span, or as the runs of its rows when they are few in the span."""
    order = shuffle.Shuffle(2, 60)
    for piece in itertools.islice(_pieces(order, COUNTS), 12):
        which, rows = shuffle.locate(piece.members, shuffle.rows_of(order, piece))
        want = [f"{piece.members[w].file}:{piece.members[w].unit}:{r}" for w, r in zip(which.tolist(), rows.tolist())]
        src = _Source(COUNTS)
        assert shuffle.read(src.read_texts, order, piece) == want
        for m in set(which.tolist()):  # each member it takes: one span, or the runs of its rows when few
            mine = sorted(rows[which == m].tolist())
            reads = [(lo, hi) for f, g, lo, hi in src.reads if (f, g) == piece.members[m][:2]]
            runs = [(r[0], r[-1] + 1) for r in np.split(np.array(mine), np.flatnonzero(np.diff(mine) != 1) + 1)]
            assert reads in ([(mine[0], mine[-1] + 1)], runs), (reads, mine)
        units, src = shuffle.Units(3), _Source(COUNTS)
        assert shuffle.read(src.read_texts, order, piece, units) == want
        assert shuffle.read(src.read_texts, order, piece, units) == want
        assert all(lo == 0 for _, _, lo, _ in src.reads) and len(src.reads) == len(set(which.tolist()))
        assert [shuffle.row_of(piece, order, i) for i in range(piece.n_docs)] == \
            [(piece.members[w].file, piece.members[w].unit, r) for w, r in zip(which.tolist(), rows.tolist())]


def test_a_few_rows_of_a_large_unit_are_read_alone_not_its_span():
    """The first pieces of a run (16 documents of a row group of 1,000) read their rows, not
    the span that holds them (nearly the whole row group)."""
    order, reads = shuffle.Shuffle(1, 1), []

    def read_unit(f, g, lo, hi):
        reads.append((lo, hi))
        return [f"{r}" for r in range(lo, hi)]
    piece = Piece(0, 1, 0, 0, 0, 16, members=(shuffle.Member(0, 0, 1000),))
    assert shuffle.read(read_unit, order, piece) == [str(r) for r in order.rows(1, 0, 0, 1000)[:16].tolist()]
    assert sum(hi - lo for lo, hi in reads) == 16
    reads.clear()
    piece = Piece(0, 1, 0, 0, 0, 900, members=(shuffle.Member(0, 0, 1000),))
    assert len(shuffle.read(read_unit, order, piece)) == 900 and len(reads) == 1  # most of it: one span


def test_a_bad_member_gives_nulls_for_its_documents_only():
    order = shuffle.Shuffle(2, 60)
    piece = next(p for p in _pieces(order, COUNTS, max_docs=1000) if len(p.members) >= 2 and p.n_docs > 20)
    bad = (piece.members[1].file, piece.members[1].unit)
    got = shuffle.read(_Source(COUNTS, bad=(bad,)).read_texts, order, piece)
    which, _ = shuffle.locate(piece.members, shuffle.rows_of(order, piece))
    assert [t is None for t in got] == (which == 1).tolist()
    assert shuffle.skipped(piece, order, [(bad, "boom")]) == [(bad, "boom", int((which == 1).sum()))]


def test_tokens_from_the_cache_in_the_windows_order_and_a_whole_window_put_back():
    order = shuffle.Shuffle(6, 60)
    rng = np.random.default_rng(0)
    cache = {}  # (file, unit) -> (lengths, tokens) in file order
    for f, rows in enumerate(COUNTS):
        for g, n in enumerate(rows):
            lengths = rng.integers(0, 5, n)
            cache[(f, g)] = (lengths, rng.integers(0, 100, int(lengths.sum())))
    load = lambda m: cache.get((m.file, m.unit))  # noqa: E731
    whole = 0  # pieces that are a whole window, put back in file order
    for piece in itertools.islice(_pieces(order, COUNTS, max_docs=1000), 6):  # 16, 32 documents, then windows
        lengths, tokens = shuffle.cached(load, piece, order)
        which, rows = shuffle.locate(piece.members, shuffle.rows_of(order, piece))
        want = []
        for w, r in zip(which.tolist(), rows.tolist()):
            ls, ts = cache[(piece.members[w].file, piece.members[w].unit)]
            want.append(ts[ls[:r].sum():ls[:r + 1].sum()])
        assert tokens.tolist() == np.concatenate(want).tolist() if want else tokens.size == 0
        if piece.doc_start == 0 and piece.doc_end == sum(m.rows for m in piece.members):
            whole += 1
            for member, ls, ts in shuffle.in_file_order(piece, order, lengths, tokens):
                assert ls.tolist() == cache[(member.file, member.unit)][0].tolist()
                assert ts.tolist() == cache[(member.file, member.unit)][1].tolist()
    assert whole >= 2
    piece = next(_pieces(order, COUNTS, max_docs=1000))
    assert shuffle.cached(lambda m: None, piece, order) is None


@pytest.mark.parametrize("k", [1, 60])
@pytest.mark.parametrize("world", [1, 2])
def test_documents_found_in_one_epoch_are_moved_to_another_epochs_window(k, world):
    """A poisoned span (documents of a window as its epoch orders them) is the same rows in any
    other epoch's window that holds them, wherever they are there; and no other rows."""
    order = shuffle.Shuffle(4, k)
    windows = shuffle.Windows(shuffle.Sourced.one(order, len(COUNTS)), COUNTS.__getitem__, world)
    found = next(w for w in order.shares(1, COUNTS, world)[world - 1] if w.rows >= 10)
    span = (1, *found.head, 2, 6)
    which, rows = shuffle.locate(found.members, order.rows(1, *found.head, found.rows)[2:6])
    bad = {(found.members[w].file, found.members[w].unit, r) for w, r in zip(which.tolist(), rows.tolist())}
    for epoch in (1, 2, 3):
        hit = set()
        for w in (w for share in order.shares(epoch, COUNTS, world) for w in share):
            piece = Piece(0, epoch, *w.head, 0, w.rows, members=w.members)
            assert windows.members(epoch, *w.head) == w.members
            assert windows.filled(Piece(0, epoch, *w.head, 0, w.rows)) == piece
            runs = windows.moved(piece, [span])
            assert all(a[1] < b[0] for a, b in zip(runs, runs[1:]))  # sorted runs, not touching
            ww, rr = shuffle.locate(w.members, order.rows(epoch, *w.head, w.rows))
            hit |= {(w.members[ww[d]].file, w.members[ww[d]].unit, int(rr[d])) for lo, hi in runs for d in range(lo, hi)}
        assert hit == bad
    piece = Piece(0, 1, *found.head, 0, found.rows, members=found.members)
    assert windows.moved(piece, [span]) == [(2, 6)] and windows.moved(piece, []) == []
    assert windows.moved(piece, [(1, *found.head, 5, 5)]) == []


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
    run = SimpleNamespace(mixture=SimpleNamespace(ranges=ranges, mixture=SimpleNamespace(sources={"a": "a", "b": "b"}),
                                                rules=None), order_of=mixrules.order)
    sourced = shuffle.of_run(LoaderConfig(B=2, T=8, shuffle=True, seed=9, shuffle_window=2), run)
    a, b = (shuffle.Shuffle(shuffle.source_seed(9, n), 2) for n in "ab")
    assert sourced.orders == (a, b)
    assert np.array_equal(sourced.rows(2, 1, 0, 30), a.rows(2, 1, 0, 30))
    assert np.array_equal(sourced.rows(2, 5, 0, 30), b.rows(2, 1, 0, 30))
    assert not np.array_equal(sourced.rows(2, 1, 0, 30), sourced.rows(2, 5, 0, 30))
    firsts = sourced.firsts({"a": [1, 0, 0, 0]}, (COUNTS + COUNTS).__getitem__, 1, 2)
    assert list(firsts) == ["b"] and firsts["b"] == shuffle.first_position(b, COUNTS.__getitem__, 4, 1, 2)
    assert shuffle.of_run(LoaderConfig(B=2, T=8), run) is None
    from shmloader import Source  # a source's own setting over the loader's, either way
    own = SimpleNamespace(mixture=SimpleNamespace(ranges=ranges, mixture=SimpleNamespace(
        sources={"a": Source("a", shuffle=False), "b": Source("b")}), rules=None), order_of=mixrules.order)
    assert shuffle.of_run(LoaderConfig(B=2, T=8, shuffle=True, seed=9, shuffle_window=2), own).orders == (None, b)
    assert shuffle.of_run(LoaderConfig(B=2, T=8), own) is None
    own.mixture.mixture.sources["a"] = Source("a", shuffle=True)
    assert shuffle.of_run(LoaderConfig(B=2, T=8, seed=9, shuffle_window=2), own).orders == (a, None)
    windows = shuffle.Windows(sourced, (COUNTS + COUNTS).__getitem__, 1)
    w = b.shares(2, COUNTS, 1)[0][0]
    assert windows.members(2, w.head[0] + 4, w.head[1]) == tuple(m._replace(file=m.file + 4) for m in w.members)


def test_one_sources_shuffled_order_is_a_sourced_of_one_as_a_mixtures_is(tmp_path):
    """Issue 50: one source's run is given its order as a mixture's is (kinds.py `run_fields`:
    `order_of`), a `Sourced` of one source (`ONE_SOURCE`, every file) whose rows are its
    `Shuffle`'s; its start places its source, so it finds no first positions; unshuffled: None."""
    from types import SimpleNamespace

    from shmloader import kinds
    from shmloader.demo import corpus
    from shmloader.ipc.runstart import ONE_SOURCE, MixStart, SourceStart
    corpus.write_shards([f"doc {i}" for i in range(40)], tmp_path / "one", num_files=5, row_group_size=4)
    kind = kinds.of(str(tmp_path / "one"), "train")
    config = LoaderConfig(B=2, T=8, shuffle=True, seed=9, shuffle_window=2)
    files = kind.catalogue.paths
    run = SimpleNamespace(files=files, mixture=None, **kind.run_fields(config))
    order = shuffle.of_run(config, run)
    assert type(order) is shuffle.Sourced and order == shuffle.Sourced.one(shuffle.Shuffle(9, 2), len(files))
    assert order.names == (ONE_SOURCE,) and (order.los, order.his) == ((0,), (len(files),))
    for epoch, file, unit, n in ((1, 0, 0, 30), (2, 3, 1, 7), (3, len(files) - 1, 2, 1)):
        assert np.array_equal(order.rows(epoch, file, unit, n), shuffle.Shuffle(9, 2).rows(epoch, file, unit, n))
    at = SourceStart()
    assert order.firsts(at.placed, COUNTS.__getitem__, 0, 1) == {} and at.with_firsts({}) is at
    with pytest.raises(ValueError, match="'b'"):  # one source's start places its source: no first to add
        at.with_firsts({"b": Position(1, 0, 0, 0)})
    mixed = MixStart(point={"sources": {"a": [1, 0, 0, 0]}})
    # both kinds' `placed`: the same type, the names (ipc/runstart.py)
    assert type(at.placed) is type(mixed.placed) is type(MixStart().placed) is frozenset
    assert at.placed == {ONE_SOURCE} and mixed.placed == {"a"} and MixStart().placed == frozenset()
    assert mixed.with_firsts({"b": 1}) == MixStart(point=mixed.point, firsts={"b": 1})
    plain = LoaderConfig(B=2, T=8)
    assert shuffle.of_run(plain, SimpleNamespace(files=files, **kind.run_fields(plain))) is None
