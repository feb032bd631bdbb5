"""packing/mixone.py without processes: when a mix passes its one source's pieces whole (`passes`),
and that a pass-through's concat mode announces what the stream would have (packing/mix.py):
the same tokens in the same places, positions, documents, row groups and points, character for
character, also resumed from a cut document, from a state that leaves a source out, ended for
want of documents, stopped at a piece that cannot be read, and resumed from its state as a mix
that is no pass-through (a second source added)."""
import inspect
import json
import random
from types import SimpleNamespace

import numpy as np
import pytest

from shmloader.data import mixrules
from shmloader.data.mixture import Mixer, Mixture
from shmloader.data.order import Piece
from shmloader.data.sources import Range
from shmloader.ipc.protocol import Counted, Ended, Error, MixArgs
from shmloader.ipc.runstart import CountTo, MixStart, RunStart, SourceStart
from shmloader.packing import mixbestfit, mixmode, placers
from shmloader.packing.base import SlotMap
from shmloader.packing.mixbestfit import MixBestFitMode
from shmloader.packing.mixmode import MixConcatMode
from shmloader.packing.mixone import passes
from shmloader.packing.mixtext import Packed
from tests.unit.packing.modes import hand_out, turn

ONE = Mixture({"x": "x"}, {"x": 1})
TWO = Mixture({"x": "x", "y": "y"}, {"x": 1, "y": 1})
X, Y = Range("x", 0, 2), Range("y", 2, 4)


def _mixer(mixture, point):
    return Mixer.resume(mixture, point["mixer"], 0).mixer if point else Mixer(mixture)


def _rule(mixture, ranges=(X,), point=None, plans=None):
    run = SimpleNamespace(mixture=MixArgs(mixture, ranges), start=RunStart(None, MixStart(point, plans)))
    return passes(run, _mixer(mixture, point))


def test_the_rule_of_a_pass_through():
    """One source read, one stage, no max_epochs, no change of world size: a pass-through; any
    of those otherwise, not."""
    assert _rule(ONE)
    assert not _rule(TWO, (X, Y))                                                    # a second source
    assert not _rule(Mixture({"x": "x", "y": "y"}, {"x": 1, "y": 0}), (X, Y))        # ... even of weight 0
    assert not _rule(Mixture({"x": "x"}, [(0, {"x": 1}), (5, {"x": 2})]))            # a schedule
    assert not _rule(Mixture({"x": "x"}, {"x": 1}, max_epochs={"x": 2}))             # the source ends
    assert not _rule(ONE, plans={"x": object()})                                     # a change of world size
    two_state = {"source": "y", "skip": 3, "sources": {"x": [1, 0, 0, 4], "y": [1, 0, 1, 2]},
                 "mixer": Mixer(TWO).state()}
    assert _rule(ONE, point=two_state)                                    # a state's second source left out
    assert not _rule(ONE, point={**two_state, "skips": {"x": 5}})         # an old rank's cut document


def _order(n_rows: int = 7, unreadable: int | None = None):
    """A source's order (files 0-1 of x, 2-3 of y): row groups of `n_rows` rows, a piece each;
    the piece `unreadable` of x's cannot be read by its worker."""
    def order(ramp, cap, first_index, files=None, start=None, plan=None, later=None):
        lo, _ = files
        s = start or SimpleNamespace(epoch=1, rg=0, doc=0)
        first = s.rg if s.doc < n_rows else s.rg + 1
        for i in range(10**6):
            rg = first + i
            yield Piece(i, s.epoch + rg // 50, lo, rg % 50, s.doc if i == 0 and s.doc < n_rows else 0, n_rows)
    return order


def _lengths(piece, seed: int, nulls: bool) -> np.ndarray:
    rng = np.random.default_rng([seed, piece.file, piece.epoch, piece.rg, piece.doc_start])
    out = rng.integers(1, 40, piece.n_docs) + 1
    if nulls:
        out[rng.random(piece.n_docs) < 0.3] = 0
    return out


def _drive(mixture, ranges, point, seed: int, *, passing: bool, batches: int = 40, nulls: bool = True,
           workers: int = 2, bad=None, empty: bool = False, monkeypatch=None, packing: str = "concat") -> tuple:
    """`(announced, tokens, said)`: each batch as `(batch, position, docs, read, point text)`, the
    tokens each batch's slot would hold (as `(piece's file, rg, offset, n)` segments at their batch
    offsets; best fit: its placements), and the `Ended` said; pieces counted by `workers` in an
    order shuffled by `seed`."""
    module, kind = (mixmode, MixConcatMode) if packing == "concat" else (mixbestfit, MixBestFitMode)
    if not passing:
        monkeypatch.setattr(module, "passes", lambda mix, mixer: False)
    run = SimpleNamespace(mixture=MixArgs(mixture, ranges), start=RunStart(None, MixStart(point)), rank=0,
                          layout=SimpleNamespace(window=33, n_slots=3))
    cfg = SimpleNamespace(max_piece_bytes=None, max_piece_docs=1024, workers_at_once=None,
                          B=2, T=15, buffer_size=12, tokenizer_batch_size=3)
    mode = kind(cfg, run, workers, _order())
    one = type(mode.stream).__name__ == "OneStream"
    if not passing:
        assert not one
        monkeypatch.undo()
    slots, rng, given = SlotMap(3), random.Random(seed), []
    announced, placed, said, specs = [], {}, [], {}
    for _ in range(10**4):
        new = hand_out(mode, workers)
        specs.update((p.index, p) for p in new)
        given += new
        rng.shuffle(given)
        for piece in given[:rng.randint(1, max(1, len(given)))]:
            given.remove(piece)
            if bad is not None and piece.file < 2 and piece.rg == bad:
                mode.failed(piece.index, Error("data", f"worker 0 (pid 1): DataError: x{bad}: unreadable", "tb"))
                continue
            lengths = _lengths(piece, 0, nulls) if piece.file < 2 else _lengths(piece, 1, False)
            if empty:
                lengths[:] = 0
            mode.counted(Counted(piece.index, lengths, None))
        orders, done = turn(mode, slots)
        for order in orders:
            if hasattr(order, "placements"):  # best fit's `Rows`
                for index, row, batch_row, off, n in order.placements.tolist():
                    p = specs[index]
                    placed.setdefault(order.batch, []).append((batch_row, off, p.file, p.epoch, p.rg,
                                                               p.doc_start + row, n))
                continue
            rows = (order.segments.tolist() if hasattr(order, "counts")
                    else [(order.piece, *seg) for seg in order.segments])
            for index, k, _, off, src, n in rows:
                p = specs[index]
                placed.setdefault(k, []).append((off, p.file, p.epoch, p.rg, p.doc_start, src, n))
        for c in done:
            data, crc = mode.buffer_of(c)
            text = Packed(data).text if type(data) is bytes else data
            announced.append((c.batch, c.position, c.docs, c.read, text))
        said += [m.text for m in mode.messages() if isinstance(m, Ended)]
        if said or len(announced) >= batches:
            return announced, {k: sorted(v) for k, v in placed.items() if k < len(announced)}, said
    raise AssertionError("the mode went no further")


def _both(mixture, ranges, point, seed, monkeypatch, **kw):
    passing = _drive(mixture, ranges, point, seed, passing=True, **kw)
    run = SimpleNamespace(mixture=MixArgs(mixture, ranges), start=RunStart(None, MixStart(point)))
    assert passes(run, _mixer(mixture, point))
    stream = _drive(mixture, ranges, point, seed, passing=False, monkeypatch=monkeypatch, **kw)
    assert passing[0] == stream[0]
    assert passing[1] == stream[1]
    assert passing[2] == stream[2]
    return passing


def _point(text: str) -> dict:
    return json.loads(text)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("nulls", [False, True])
def test_a_pass_through_announces_what_the_stream_would(seed, nulls, monkeypatch):
    announced, tokens, said = _both(ONE, (X,), None, seed, monkeypatch, nulls=nulls)
    assert len(announced) >= 40 and not said and len(tokens) == len(announced)
    # resumed inside a document (the cut one comes first) and at a document's start, passed again
    cut = next(a for a in announced[5:] if a[1].skip)
    start = next(a for a in announced[5:] if not a[1].skip)
    for a in (cut, start):
        again, _, _ = _both(ONE, (X,), _point(a[4]), seed, monkeypatch, nulls=nulls, batches=20)
        assert _drive(ONE, (X,), _point(a[4]), seed, passing=True, nulls=nulls, batches=20)[0] == again


def test_a_state_that_left_a_source_out_is_resumed_as_the_stream_resumes_it(monkeypatch):
    """A two-source run's point, resumed by a mixture of its first source alone: a pass-through,
    the point's other source kept in every point as the stream keeps it."""
    announced, _, _ = _drive(TWO, (X, Y), None, 0, passing=False, monkeypatch=monkeypatch)
    for a in announced[10:14]:
        again, _, _ = _both(ONE, (X,), _point(a[4]), 0, monkeypatch, batches=15)
        assert all('"y":' in b[4] for b in again)


def test_a_pass_throughs_state_resumed_with_a_second_source_is_the_streams(monkeypatch):
    """A pass-through's points, resumed by a mixture of two sources (no pass-through then): the
    same batches as from the stream's points, since they are the same points."""
    announced, _, _ = _both(ONE, (X,), None, 1, monkeypatch)
    for a in (announced[7], announced[20]):
        after, _, _ = _drive(TWO, (X, Y), _point(a[4]), 1, passing=False, monkeypatch=monkeypatch, batches=20)
        assert len(after) >= 20 and any('"y":[1,' in b[4] for b in after)


def test_a_source_without_documents_ends_a_pass_through_as_it_ends_the_stream(monkeypatch):
    """Every row null: the mix ends once the source has read an epoch and most of another (the
    feed's rule), no batch made, the end's words said."""
    announced, _, said = _both(ONE, (X,), None, 0, monkeypatch, empty=True)
    assert announced == [] and len(said) == 1 and "held no document" in said[0]


def test_a_piece_that_cannot_be_read_stops_a_pass_through_where_it_stops_the_stream(monkeypatch):
    announced, _, said = _both(ONE, (X,), None, 2, monkeypatch, bad=12)
    assert 0 < len(announced) < 40 and len(said) == 1 and "x12: unreadable" in said[0]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("nulls", [False, True])
def test_best_fits_pass_through_announces_what_the_stream_would(seed, nulls, monkeypatch):
    """Best fit: the chunks cut from its pieces are the stream's, and so are the batches, the
    points (the mixer settled each batch) and the buffers; resumed from its points, again."""
    announced, placed, said = _both(ONE, (X,), None, seed, monkeypatch, nulls=nulls, packing="bos_bestfit")
    assert len(announced) >= 40 and not said and len(placed) == len(announced)
    for a in (announced[9], announced[23]):
        _both(ONE, (X,), _point(a[4]), seed, monkeypatch, nulls=nulls, batches=15, packing="bos_bestfit")


def test_best_fits_pass_through_of_a_state_that_left_a_source_out(monkeypatch):
    announced, _, _ = _drive(TWO, (X, Y), None, 0, passing=False, monkeypatch=monkeypatch, packing="bos_bestfit")
    for a in announced[10:13]:
        point = {**_point(a[4]), "buffer": {"sources": [], "runs": ""}}  # (y's buffered documents are refused)
        again, _, _ = _both(ONE, (X,), point, 0, monkeypatch, batches=15, packing="bos_bestfit")
        assert all('"y":' in b[4] for b in again)


def test_best_fits_pass_through_stops_and_ends_where_the_stream_does(monkeypatch):
    announced, _, said = _both(ONE, (X,), None, 2, monkeypatch, bad=12, packing="bos_bestfit")
    assert 0 < len(announced) < 40 and len(said) == 1 and "x12: unreadable" in said[0]
    announced, _, said = _both(ONE, (X,), None, 0, monkeypatch, empty=True, packing="bos_bestfit")
    assert announced == [] and len(said) == 1 and "held no document" in said[0]


def _head(mixture, ranges, point, shuffle=False, plans=None):
    run = SimpleNamespace(mixture=MixArgs(mixture, ranges), start=RunStart(None, MixStart(point, plans)), rank=0,
                          order_of=mixrules.order)
    return MixConcatMode.head_start(SimpleNamespace(shuffle=shuffle, seed=0, shuffle_window=None), run)


@pytest.mark.parametrize("resumed", [False, True])
def test_a_pass_throughs_head_start_makes_the_modes_points(monkeypatch, resumed):
    """`MixConcatMode.head_start` (the trainer's head start, procs/headstart.py): where the run's
    one source starts (numbered within it, the cut document's tokens as its skip) and each batch's
    point made from its position, stream end and documents as the mode announces it, character for
    character, fresh and resumed inside a document; shuffled, in its own order, from its share's
    first window where the point does not place it; a mix of two sources and a change of world
    size get none."""
    point = None
    if resumed:
        first = _drive(ONE, (X,), None, 3, passing=True, batches=12)[0]
        point = json.loads(next(text for *_, text in first[5:] if json.loads(text)["skip"]))
    announced, _, _ = _drive(ONE, (X,), point, 4, passing=True, batches=30)
    begin = _head(ONE, (X,), point)
    assert (begin.lo, begin.hi, begin.later, begin.order) == (0, 2, None, None)
    assert begin.start.skip == (point["skip"] if point else 0)
    if point:
        assert list(begin.start[:4]) == point["sources"]["x"] and begin.start.skip > 0
    for batch, position, docs, _, text in announced:
        assert begin.point(position, (batch + 1) * 33, docs).text == text, batch
    assert _head(TWO, (X, Y), None) is None
    shuffled = _head(ONE, (X,), point, shuffle=True)
    assert shuffled.order is not None and shuffled.reads.of(0).order is not None
    assert (shuffled.first is None) == resumed  # a fresh source: its first window, from its row counts
    assert _head(ONE, (X,), None, plans={"x": object()}) is None


def _two_row_groups(ramp, cap, first_index, files=None, start=None, plan=None, later=None):
    """A source whose epoch is two row groups of 3 rows, a piece each (row group 1's rows null)."""
    for i in range(10**6):
        yield Piece(i, 1 + i // 2, files[0], i % 2, 0, 3)


def _counted_out_of_order(passing: bool, monkeypatch, end: str | None = None) -> tuple:
    """`(positions announced, Ended said)` of a mixture of one whose 4 workers' pieces are counted
    the null ones first (the latest first), then the others in order; `end`: the mix is ended
    (`finish`, as the feed ends it) before any count."""
    if not passing:
        monkeypatch.setattr(mixmode, "passes", lambda mix, mixer: False)
    run = SimpleNamespace(mixture=MixArgs(ONE, (X,)), start=RunStart(None, MixStart()), rank=0,
                          layout=SimpleNamespace(window=5, n_slots=3))
    cfg = SimpleNamespace(max_piece_bytes=None, max_piece_docs=1024, workers_at_once=None, B=2, T=2)
    mode = MixConcatMode(cfg, run, 4, _two_row_groups)
    monkeypatch.undo()
    assert (type(mode.stream).__name__ == "OneStream") == passing
    slots, out, said = SlotMap(3), [], []
    given = hand_out(mode, 4)
    assert len({p.epoch for p in given}) >= 3  # past the epoch after the first: the feed's rule could end it
    if end is not None:
        mode.stream.finish(end)
    nulls = sorted((p for p in given if p.rg == 1), key=lambda p: -p.index)
    for p in nulls + [p for p in given if p.rg == 0] + [None] * 3:
        if p is not None:
            mode.counted(Counted(p.index, np.zeros(3, np.int64) if p.rg else np.array([4, 3, 5]), None))
        _, done = turn(mode, slots)
        out += [c.position for c in done]
        said += [m.text for m in mode.messages() if isinstance(m, Ended)]
    return out, said


def test_a_source_whose_later_null_pieces_are_counted_first_goes_on(monkeypatch):
    """The feed judges a source without documents over its pieces in its order, not in the order
    they are counted: later epochs' null row groups counted before the earlier pieces that hold
    documents do not end the mix (they did, the pass-through's and the stream's alike)."""
    passing = _counted_out_of_order(True, monkeypatch)
    assert passing == _counted_out_of_order(False, monkeypatch)
    out, said = passing
    assert len(out) >= 5 and said == []


def test_a_pass_through_places_no_piece_counted_after_its_end(monkeypatch):
    """Pieces counted after the mix ended are not placed (the stream takes none either): the
    end comes with no batch, as the stream's."""
    passing = _counted_out_of_order(True, monkeypatch, end="the end")
    assert passing == _counted_out_of_order(False, monkeypatch, end="the end") == ([], ["the end"])


def test_one_sources_modes_are_the_mixtures_made_of_other_parts():
    """One source's concat, best-fit and count-only modes (kinds.py `OneSource`) are the mixture's
    modes with only their making (and concat's head start, where one source's run reads) of their
    own: what they do is the mixture's code, so no behaviour is built twice (issue 50 step 4)."""
    from shmloader.packing import MODES
    from shmloader.packing.mixcount import MixCountMode, SourceCountMode

    for own, of, allowed in ((MODES["concat"].source, MixConcatMode, {"__init__", "head_start"}),
                             (MODES["bos_bestfit"].source, MixBestFitMode, {"__init__"}),
                             (SourceCountMode, MixCountMode, {"__init__"})):
        assert issubclass(own, of)
        mine = {name for name in vars(own) if not (name.startswith("__") and name != "__init__")}
        assert mine == allowed, f"{own.__name__} defines {sorted(mine - allowed)} beside {of.__name__}'s"


def _order_of(n_docs: int):
    return lambda ramp, cap, first: (Piece(i, 1, 0, i - first, 0, n_docs) for i in range(first, 10**6))


def test_one_sources_modes_override_no_method_on_the_instance():
    """What `vars` of the class cannot see: a method assigned on the instance where the mode is
    made (`_begin`) would be one source's own behaviour too (the review found best fit's
    `can_take`/`can_continue` swapped so). Beside the sink (`buffer_of`), an instance holds no
    method but concat's placer's own (`ready`, `orders`, `_spec`: bound in `MixConcatMode._begin`
    for every kind of run)."""
    from shmloader.config import LoaderConfig
    from shmloader.packing.mixbestfit import SourceBestFitMode
    from shmloader.packing.mixcount import SourceCountMode
    from shmloader.position import Position

    fit = SimpleNamespace(B=2, T=9, buffer_size=6, tokenizer_batch_size=4, max_piece_docs=8, max_piece_bytes=None,
                          workers_at_once=None)
    cfg = LoaderConfig(1, 7, n_slots=3)
    start = RunStart(Position(1, 0, 0), SourceStart())
    modes = ((SourceBestFitMode(fit, SimpleNamespace(layout=SimpleNamespace(n_slots=3), start=start), 2,
                                _order_of(8)), set()),
             (mixmode.SourceConcatMode(cfg, SimpleNamespace(layout=SimpleNamespace(window=cfg.window, n_slots=3),
                                                            start=start), 2, _order_of(4)),
              {"ready", "orders", "_spec"}),
             (SourceCountMode(cfg, SimpleNamespace(start=RunStart(Position(1, 0, 0), SourceStart(), 0,
                                                                  CountTo([[0, 1, 7]], 20)), layout=None),
                              2, _order_of(4)), set()))
    for mode, placer in modes:
        bound = {name for name, value in vars(mode).items()
                 if inspect.ismethod(value) or inspect.isbuiltin(value) or inspect.isfunction(value)}
        assert bound <= {"buffer_of"} | placer, f"{type(mode).__name__} binds {sorted(bound - {'buffer_of'} - placer)}"
        for name in placer:
            assert getattr(mode, name).__self__ in (mode.placer, mode.specs), f"{name} is not the placer's own"


def test_concats_placer_is_chosen_once_and_only_a_mix_has_an_end(monkeypatch):
    """What differs between pieces passing whole and a mix of several's runs is the placer's,
    chosen once where the mode is made (`placers.WholePieces`, `PassThrough`, `Runs`), its
    `ready` and `orders` the mode's own; only a mix can end: one source's order (`Passing`) has
    no `finish`, so its placer makes no end of a mix (the review found the mode's one branch
    for both asking one source's `Passing` for `OneStream.end_point`, which it lacks)."""
    from shmloader.position import Position

    cfg = SimpleNamespace(max_piece_bytes=None, max_piece_docs=1024, workers_at_once=None, B=2, T=2)
    layout = SimpleNamespace(window=5, n_slots=3)
    run = SimpleNamespace(layout=layout, start=RunStart(Position(0, 0, 0, 0), SourceStart()))
    source = mixmode.SourceConcatMode(cfg, run, 1, _two_row_groups)
    run = SimpleNamespace(mixture=MixArgs(ONE, (X,)), start=RunStart(None, MixStart()), rank=0, layout=layout)
    through = MixConcatMode(cfg, run, 1, _two_row_groups)
    monkeypatch.setattr(mixmode, "passes", lambda mix, mixer: False)
    several = MixConcatMode(cfg, run, 1, _two_row_groups)
    assert [type(m.placer) for m in (source, through, several)] == [placers.WholePieces, placers.PassThrough,
                                                                    placers.Runs]
    for mode in (source, through, several):
        assert mode.ready == mode.placer.ready and mode.orders == mode.placer.orders
    assert not hasattr(source.stream, "finish") and not hasattr(source.stream, "end_point")
    assert hasattr(through.stream, "finish") and hasattr(through.stream, "end_point")


def test_best_fits_one_source_and_pass_through_share_their_chunks_and_its_bad_piece_is_the_streams():
    """One source's best fit is a pass-through's path (issue 50): its run's pieces are counted into
    its `Passing` (the feed's, as concat's one source's) and cut into chunks from what passes
    (`PassingChunks`, a pass-through's too), only the cut its own (`RowCut`; a pass-through's
    `DocumentCut`: chosen once where the chunks are made); the sequencer's own order is only a
    resumed buffer's. A piece of its order that cannot be read stops its `Passing` once every piece
    before it is counted, and is said from the stream (`Said`), as concat's one source's, not from
    the mode's `stops` (which hold only the resumed buffer's)."""
    from shmloader.packing.mixbestfit import SourceBestFitMode
    from shmloader.packing.mixchunks import DocumentCut, PassingChunks, RowCut
    from shmloader.position import Position

    fit = SimpleNamespace(B=2, T=9, buffer_size=6, tokenizer_batch_size=4, max_piece_docs=8, max_piece_bytes=None,
                          workers_at_once=None)
    source = SourceBestFitMode(fit, SimpleNamespace(layout=SimpleNamespace(n_slots=3),
                                                    start=RunStart(Position(1, 0, 0), SourceStart())), 2, _order_of(8))
    run = SimpleNamespace(mixture=MixArgs(ONE, (X,)), start=RunStart(None, MixStart()), rank=0,
                          layout=SimpleNamespace(n_slots=3))
    through = MixBestFitMode(fit, run, 2, lambda ramp, cap, first, **_: _order_of(8)(ramp, cap, 0))
    assert type(source.seq.chunks) is type(through.seq.chunks) is PassingChunks
    assert source.seq.chunks.cut is RowCut and type(through.seq.chunks.cut) is DocumentCut
    assert not source.seq.chunks.ordered(0), "one source's order is the sequencer's own, not its stream's"

    given = hand_out(source, 2)
    assert len(given) >= 3
    lengths = np.array([5, 0, 3, 9, 2, 4, 1, 6], dtype=np.int64)
    source.counted(Counted(given[2].index, lengths, None))  # waits for pieces 0 and 1, in its stream
    assert set(source.stream.waiting()) == {given[2].index}
    assert source.failed(given[1].index, Error("data", "piece 1 cannot be read", ""))
    assert source.stream.stopped is None and source.stops.first() is None  # piece 0 is not counted yet
    source.counted(Counted(given[0].index, lengths, None))
    assert source.stream.stopped is not None and source.stops.first() is None
    said, slots = [], SlotMap(3)
    for _ in range(20):
        turn(source, slots)
        said += [m for m in source.messages() if isinstance(m, Ended)]
    assert [m.text for m in said] == ["piece 1 cannot be read"]
