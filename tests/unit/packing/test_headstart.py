"""packing.headstart.Stream (the trainer's head start, pure) and procs.headstart's rule.

Every token of the concatenation has a unique value (its index in it), so each batch's window,
each position after a batch, the documents begun and each token's position in its document are
checked by arithmetic against the concatenation itself: nothing here reuses the sequencer's
bookkeeping to say what is right."""
import random
from types import SimpleNamespace

import numpy as np
import pytest

from shmloader.data import shuffle
from shmloader.data.order import Piece
from shmloader.ipc.ring import batch_check
from shmloader.ipc.runstart import CountTo, RunStart, SourceStart
from shmloader.packing import headstart as packing_headstart
from shmloader.packing.headstart import Stream
from shmloader.packing.mixcount import MixCountMode
from shmloader.position import Position
from shmloader.procs import headstart as procs_headstart
from tests.cases import seeds


def corpus(rng: random.Random):
    """Row groups (file, rg, lengths): lengths 0 (a null), 1 (an empty text: its BOS) or more."""
    groups = []
    for f in range(rng.randint(1, 3)):
        for g in range(rng.randint(1, 3)):
            n = rng.choice([1, 1, 2, 5, 17, 60])
            groups.append((f, g, [rng.choice([0, 1, rng.randint(2, 9), rng.randint(10, 200)]) for _ in range(n)]))
    return groups


def cut(groups, rng: random.Random, whole: bool = False):
    """Pieces of the row groups in order (random slices, or whole row groups), each with its rows' lengths."""
    out = []
    for f, g, lengths in groups:
        doc = 0
        while doc < len(lengths):
            end = len(lengths) if whole else min(len(lengths), doc + rng.randint(1, 8))
            out.append((Piece(len(out), 1, f, g, doc, end), lengths[doc:end]))
            doc = end
    return out


def reference(groups, B, T, skip):
    """Per batch from the concatenation: (window, position after, documents begun, positions)."""
    W = B * T + 1
    starts, places, total = [], [], 0  # each non-null document's first token, and its (file, rg, row)
    for f, g, lengths in groups:
        for row, n in enumerate(lengths):
            if n:
                starts.append(total)
                places.append((f, g, row))
                total += n
    starts = np.asarray(starts, dtype=np.int64)
    owner = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, total)))  # token -> its document
    out, k = [], 0
    while skip + (k + 1) * W < total:  # the token after the batch exists: its position is known
        lo, end = skip + k * W, skip + (k + 1) * W
        doc = owner[end]
        f, g, row = places[doc]
        begun = int(np.count_nonzero(starts < end)) - (1 if skip else 0)
        positions = np.arange(lo, lo + B * T) - starts[owner[lo:lo + B * T]]
        out.append((np.arange(lo, end), Position(1, f, g, row, int(end - starts[doc])), begun, positions))
        k += 1
    return out


def made(groups, pieces, B, T, skip, most, positions=True):
    stream = Stream(B, T, skip, most, positions)
    base, out = 0, []
    offsets = {}
    for f, g, lengths in groups:
        offsets[(f, g)] = []
        for n in lengths:
            offsets[(f, g)].append(base)
            base += n
    for piece, lengths in pieces:
        lo = offsets[(piece.file, piece.rg)][piece.doc_start]
        n = int(sum(lengths))
        stream.add(piece, np.arange(lo, lo + n, dtype=np.int64), np.asarray(lengths, dtype=np.int64))
        while (m := stream.ready()) is not None:
            out.append(m)
    return out


@pytest.mark.parametrize("seed", seeds(40, 10))  # seeds 10-39: -m slow
def test_every_batch_is_the_concatenations_window_with_its_position_and_documents(seed):
    rng = random.Random(seed)
    groups = corpus(rng)
    B, T = rng.randint(1, 3), rng.choice([1, 3, 8, 20])
    total = sum(sum(lengths) for _, _, lengths in groups)
    skip = rng.choice([0, 0, rng.randint(0, max(total // 3, 0))])
    most = rng.randint(1, 5)
    want = reference(groups, B, T, skip)[:most]
    got = made(groups, cut(groups, rng), B, T, skip, most)
    assert len(got) == len(want)
    for k, (m, (window, after, begun, positions)) in enumerate(zip(got, want)):
        W = B * T + 1
        assert m.batch == k
        assert np.array_equal(m.row[:W], window), f"batch {k}'s window"
        assert np.array_equal(m.row[W:], positions), f"batch {k}'s positions"
        assert m.position == after and m.docs == begun, (k, m.position, after, m.docs, begun)
        assert m.check == batch_check(window)


@pytest.mark.parametrize("seed", range(10))
def test_piece_boundaries_change_nothing(seed):
    rng = random.Random(100 + seed)
    groups = corpus(rng)
    B, T, most = 2, 5, 4
    sliced = made(groups, cut(groups, rng), B, T, 3, most)
    whole = made(groups, cut(groups, rng, whole=True), B, T, 3, most)
    assert [(m.batch, m.position, m.docs, m.check) for m in sliced] == [(m.batch, m.position, m.docs, m.check)
                                                                       for m in whole]
    assert all(np.array_equal(a.row, b.row) for a, b in zip(sliced, whole))


def test_a_batch_handed_out_keeps_its_row_and_no_more_than_most_are_made():
    groups = [(0, 0, [30] * 40)]
    stream = Stream(2, 4, 0, 2)
    pieces = cut(groups, random.Random(1))
    first = None
    for piece, lengths in pieces:
        lo = piece.doc_start * 30
        stream.add(piece, np.arange(lo, lo + 30 * len(lengths)), np.asarray(lengths))
        if first is None:
            first = stream.ready()
    kept = first.row.copy()
    rest = []
    while (m := stream.ready()) is not None:
        rest.append(m)
    assert [m.batch for m in rest] == [1] and np.array_equal(first.row, kept)
    assert not np.shares_memory(first.row, rest[0].row), "two batches share a row"
    assert stream.exhausted, "a stream that made all it may still asks for pieces"


def test_pieces_come_in_order_and_whole():
    stream = Stream(1, 4, 0, 2)
    with pytest.raises(ValueError, match="in order"):
        stream.add(Piece(1, 1, 0, 0, 0, 2), np.arange(4), np.asarray([2, 2]))
    with pytest.raises(ValueError, match="whole"):
        stream.add(Piece(0, 1, 0, 0, 0, 2, skip=1), np.arange(4), np.asarray([2, 2]))


def config(**kw):
    base = dict(head_start=True, packing="concat", cache_dir=None)
    return SimpleNamespace(**dict(base, **kw))


def args(**kw):
    from shmloader.packing.mixmode import SourceConcatMode
    from shmloader.packing.mixcount import SourceCountMode

    base = dict(modes=(SourceConcatMode, SourceCountMode), start=RunStart(Position(1, 0, 0), SourceStart()),
                order_of=shuffle.one_source, poisoned=(), suspects=(), tokenizer=SimpleNamespace(kind="tiktoken"))
    return SimpleNamespace(**dict(base, **kw))


@pytest.mark.parametrize("what, cfg, run", [
    ("head_start=False", config(head_start=False), args()),
    ("packing 'bos_bestfit'", config(packing="bos_bestfit"), args()),
    ("a count-only run", config(), args(start=RunStart(Position(1, 0, 0), SourceStart(), 0, CountTo([[0, 1, 7]], 1)))),
    ("poisoned", config(), args(poisoned=(1,))),
    ("a token cache", config(cache_dir="/tmp/x"), args()),
    ("other than tiktoken", config(), args(tokenizer=SimpleNamespace(kind="hf"))),
    ("other than tiktoken", config(), args(tokenizer=SimpleNamespace(kind="object"))),
])
def test_runs_the_trainer_cannot_make_get_no_head_start(what, cfg, run):
    assert what in procs_headstart.refusal(cfg, run)
    assert procs_headstart.refusal(config(), args()) is None


def test_where_a_head_start_reads_is_its_packings_modes_to_say():
    """`begin`: one source's concat reads every file from the run's start in the loader's order,
    and none at a change of world size (its elastic plan's order); a mixture's mode answers for
    a mixture (tests/unit/packing/test_mixone.py); a run `refusal` refuses reads nothing."""
    from shmloader.packing.base import Begin

    start = Position(1, 2, 0, 5, 7)
    run = args(files=["a", "b", "c"], start=RunStart(start, SourceStart()))
    assert procs_headstart.begin(config(order=None), run) == Begin(0, 3, start, None, None, None)
    order = shuffle.Shuffle(seed=5, window=4)  # shuffled: read as the workers read, the run's `Sourced` of one
    assert procs_headstart.begin(config(order=order), run) == Begin(0, 3, start, None, order, None,
                                                                    shuffle.Sourced.one(order, 3))
    elastic = RunStart(start, SourceStart(plan=object()))
    assert procs_headstart.begin(config(order=None), args(files=["a"], start=elastic)) is None
    assert procs_headstart.begin(config(order=None, head_start=False), run) is None
    assert procs_headstart.begin(config(), args(modes=(MixCountMode, MixCountMode))) is None  # a mode without one


def _rule(given: int = 0):
    head = procs_headstart.HeadStart.__new__(procs_headstart.HeadStart)
    head.over, head.given, head.stream, head.until = False, given, None, None
    head._source = head._pieces = head._encoder = None
    return head


def test_the_rule_makes_batches_only_before_the_rings_first_and_at_most_most():
    head = _rule()
    head.started()  # the children started with the first batch made (a process's later loader)
    assert head.wanted(announced=0, pending=0)
    head.given = procs_headstart.MOST
    assert not head.wanted(0, 0) and head.over
    for announced, pending in ((1, 0), (0, 1)):
        head = _rule()
        head.started()
        assert not head.wanted(announced, pending)
        assert not head.wanted(0, 0), "the head start came back after it ended"


def test_while_the_children_wait_for_the_forkserver_the_rule_has_no_count_but_the_streams():
    head = _rule(given=procs_headstart.MOST + 3)  # not started: the forkserver boots
    assert head.wanted(0, 0), "the trainer waited although its children had not even started"
    head.started()  # now they are: MOST more at most
    head.given += procs_headstart.MOST - 1
    assert head.wanted(0, 0)
    head.given += 1
    assert not head.wanted(0, 0) and head.over
    assert procs_headstart.BOOTING_MOST > procs_headstart.MOST


# ---------------------------------------------------------------- piece sizes

def test_short_is_what_the_next_batch_still_needs():
    B, T, skip = 2, 8, 3
    W = B * T + 1
    s = Stream(B, T, skip, most=4)
    assert s.short == W + skip, "before any piece: a window and the skipped tokens"
    s.add(Piece(0, 1, 0, 0, 0, 2), np.arange(10, dtype=np.int64), np.array([4, 6]))
    assert s.short == W + skip - 10
    s.add(Piece(1, 1, 0, 0, 2, 3), np.arange(30, dtype=np.int64), np.array([30]))
    # 37 tokens past the skip: batches 0 and 1 are made, batch 2 needs 3 windows' worth
    assert s.ready().batch == 0 and s.ready().batch == 1 and s.ready() is None
    assert s.short == 3 * W + skip - 40
    assert (s.docs_added, s.tokens_added) == (3, 40)


def sizes_for(lengths, B, T, most=8):
    """The pieces PieceSizes cuts from one row group of documents of `lengths` tokens, fed to a
    stream until it has made its first batch: [(docs, tokens)]."""
    s = Stream(B, T, 0, most=most)
    sizes, doc, out = packing_headstart.PieceSizes(s), 0, []
    while s.ready() is None:
        n = next(sizes)
        part = np.asarray(lengths[doc:doc + n], dtype=np.int64)
        assert len(part), "the test's row group ran out"
        s.add(Piece(len(out), 1, 0, 0, doc, doc + len(part)), np.arange(int(part.sum()), dtype=np.int64), part)
        out.append((len(part), int(part.sum())))
        doc += len(part)
    return out


def test_pieces_read_little_more_than_the_first_batch_needs():
    """Documents of a steady length: the first batch is made in a few pieces, and what was
    read past it is under MARGIN's share of a window plus a document."""
    B, T = 16, 2048
    W = B * T + 1
    for length in (50, 750, 3000):
        got = sizes_for([length] * 2000, B, T)
        assert got[0][0] == 1
        read = sum(t for _, t in got)
        assert W <= read <= 1.3 * W + 2 * length, (length, got)
        assert len(got) <= 6, (length, got)


def test_a_short_first_document_does_not_make_a_huge_second_piece():
    """A first document far shorter than the rest (skewed shards: documents of 0 to 100K
    characters): the estimate from it alone would ask for hundreds; the next piece takes at
    most GROWTH times the documents read, and the first batch reads a few windows at most."""
    B, T = 4, 256
    W = B * T + 1
    got = sizes_for([3] + [900] * 5000, B, T)
    docs = [n for n, _ in got]
    for k in range(1, len(docs)):
        assert docs[k] <= packing_headstart.GROWTH * sum(docs[:k]), docs
    assert sum(t for _, t in got) <= 4 * W, got
    # and a run of nulls (no tokens yet) keeps asking for one document at a time
    s = Stream(2, 8, 0, most=2)
    sizes = packing_headstart.PieceSizes(s)
    s.add(Piece(0, 1, 0, 0, 0, 3), np.zeros(0, dtype=np.int64), np.zeros(3, dtype=np.int64))
    assert next(sizes) == 1
