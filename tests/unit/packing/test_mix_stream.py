"""A mixture's stream (shmloader/packing/mix.py), pure: counted pieces of three sources, in
any order of arrival, become runs whose documents are the mixing rule's order; every piece
ends with one last run; a place anywhere in the stream resumes it exactly, under the same
mixture or another."""
import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader.data.mixture import Mixer, Mixture
from shmloader.data.order import Piece
from shmloader.packing.mix import MixPoint, MixStream, ends_chunk, first_end, point_at
from shmloader.packing.mixruns import Rows, point_of, start_of, where_at
from shmloader.position import Position
from tests.cases import seeds

W = 8 * 16 + 1
SCHEDULE = [(0, {"web": 0.5, "code": 0.3, "math": 0.2}), (12, {"web": 0.2, "code": 0.2, "math": 0.6})]


def row_groups(name: str, seed: int, n: int = 40) -> list:
    """A source's order: `(epoch, file, rg, lengths)` of each row group; nulls (0), all-null
    and empty row groups among them, documents of 1 (an empty text) to 400 tokens."""
    rng = random.Random(f"{name}{seed}")
    out = []
    for i in range(n):
        rows = rng.choice([0, 1, 3, 7, 20, 50])
        kind = rng.random()
        lengths = [0 if kind < 0.1 or rng.random() < 0.1 else rng.randint(1, 400) for _ in range(rows)]
        out.append((1 + i // 20, (i // 4) % 5, i % 4, np.array(lengths, dtype=np.int64)))
    return out


def cut(groups, rng, start: Position | None = None) -> list:
    """The pieces (with their lengths) of a source's row groups from `start`, cut at random."""
    pieces = []
    for epoch, file, rg, lengths in groups:
        lo = 0
        if start is not None:
            if (epoch, file, rg) < start[:3]:
                continue
            if (epoch, file, rg) == start[:3]:
                lo = start.doc
        if lo >= len(lengths) and len(lengths):
            continue
        while True:
            hi = min(len(lengths), lo + rng.choice([1, 2, 5, 16]))
            pieces.append((Piece(len(pieces), epoch, file, rg, lo, hi), lengths[lo:hi]))
            lo = hi
            if lo >= len(lengths):
                break
    return pieces


def drive(stream: MixStream, orders: dict, rng) -> list:
    """Count every source's pieces in a random order of arrival; the runs made."""
    arrivals = [(name, seq) for name, pieces in orders.items() for seq in range(len(pieces))]
    rng.shuffle(arrivals)
    runs = []
    for name, seq in arrivals:
        piece, lengths = orders[name][seq]
        stream.counted(name, seq, piece, lengths)
        runs += stream.runs()
    return runs


def documents(runs) -> list:
    """`(source, epoch, file, rg, row, tokens)` of every document of the runs, in order."""
    out = []
    for r in runs:
        for i, n in enumerate(r.lengths):
            if n:
                p = r.piece
                out.append((r.source, p.epoch, p.file, p.rg, p.doc_start + r.row_lo + i, int(n)))
    return out


def reference(mixture: Mixture, groups: dict, limit: int) -> list:
    """The rule applied by hand over each source's documents (no pieces, no runs)."""
    docs = {name: [(name, e, f, g, row, int(n)) for e, f, g, lengths in rgs for row, n in enumerate(lengths) if n]
            for name, rgs in groups.items()}
    mixer, at, out, tokens = Mixer(mixture), dict.fromkeys(docs, 0), [], 0
    while len(out) < limit:
        if any(at[name] >= len(docs[name]) for name in mixer.shares()):
            break
        source = mixer.choose(tokens // W, lambda name: docs[name][at[name]][5]).source
        doc = docs[source][at[source]]
        at[source] += 1
        mixer.took(source, doc[5])
        tokens += doc[5]
        out.append(doc)
    return out


def setup(seed: int):
    groups = {name: row_groups(name, seed) for name in ("web", "code", "math")}
    mixture = Mixture({name: f"/data/{name}" for name in groups}, SCHEDULE)
    starts = {name: Position(1, 0, 0) for name in groups}
    return groups, mixture, starts


@pytest.mark.parametrize("seed", range(6))
def test_runs_follow_the_rule_whatever_the_order_of_arrival(seed):
    groups, mixture, starts = setup(seed)
    got = []
    for arrival in range(2):
        rng = random.Random(seed * 10 + arrival)
        orders = {name: cut(rgs, random.Random(seed)) for name, rgs in groups.items()}
        stream = MixStream(Mixer(mixture), starts, lambda tokens: tokens // W)
        runs = drive(stream, orders, rng)
        got.append(runs)
        docs = documents(runs)
        assert len(docs) > 200
        assert docs == reference(mixture, groups, len(docs))
        assert any(note.startswith("mixture: stage from batch 12") for note in stream.notes)
        assert len(runs) < len(docs)  # documents picked in a row share a run
        by_piece = {}
        for r in runs:
            by_piece.setdefault((r.source, r.piece.index), []).append(r)
        for (name, index), rs in by_piece.items():  # the stream stops where a source's pieces end
            piece, lengths = orders[name][index]
            assert not any(r.last for r in rs[:-1])
            assert rs[0].row_lo == 0 and rs[0].base == 0 and all(a.row_hi == b.row_lo for a, b in zip(rs, rs[1:]))
            assert all(a.base + a.tokens == b.base for a, b in zip(rs, rs[1:]))
            assert rs[-1].last == (rs[-1].row_hi == len(lengths))
        for name in orders:  # every piece passed ended with its last run
            seen = [i for n, i in by_piece if n == name]
            assert all(by_piece[name, i][-1].last for i in range(max(seen)))
        finished = [(name, i) for name, pieces in orders.items() for i, (p, n) in enumerate(pieces)
                    if (name, i) in by_piece and by_piece[name, i][-1].last]
        assert len(finished) > 100
        assert any(len(n) == 0 or not n.any() for name, i in finished for n in [orders[name][i][1]])
    assert [documents([r]) for r in got[0]] == [documents([r]) for r in got[1]]


def place(runs, offset: int):
    """The run, row and skip of the stream's token at `offset`."""
    at = 0
    for r in runs:
        for i, n in enumerate(r.lengths):
            if at <= offset < at + n:
                return r, r.row_lo + i, offset - at
            at += int(n)
    raise AssertionError(offset)


def tokens_from(runs, skip: int = 0) -> list:
    """The stream's tokens as `(source, epoch, file, rg, row, token)`, after the first `skip`."""
    out = []
    for source, e, f, g, row, n in documents(runs):
        out += [(source, e, f, g, row, t) for t in range(n)]
    return out[skip:]


@pytest.mark.parametrize("seed", seeds(4, 2))  # seeds 2-3: -m slow
def test_a_place_anywhere_resumes_exactly(seed):
    groups, mixture, starts = setup(seed)
    rng = random.Random(seed)
    stream = MixStream(Mixer(mixture), starts, lambda tokens: tokens // W)
    runs = drive(stream, {name: cut(rgs, random.Random(seed)) for name, rgs in groups.items()}, rng)
    whole = tokens_from(runs)
    for offset in [rng.randrange(len(whole) * 3 // 4) for _ in range(6)] + [0, 11 * W, 12 * W - 1]:
        run, row, skip = place(runs, offset)
        point = MixPoint.from_json(point_at(run, row, skip).to_json())
        batch, cut_at = divmod(offset, W)
        resumed = Mixer.resume(mixture, point.mixer, batch)
        assert resumed.notes == ()
        again = MixStream(resumed.mixer, point.sources, lambda tokens: batch + (tokens - skip + cut_at) // W,
                          first=point.source if skip else None)
        # a real resume starts at a batch's first token; here anywhere, so the batch is told apart
        orders = {name: cut(groups[name], random.Random(seed + 1), point.sources[name]) for name in groups}
        more = tokens_from(drive(again, orders, random.Random(seed + 2)), skip)
        n = min(len(more), len(whole) - offset)
        assert n > 1000
        assert more[:n] == whole[offset:offset + n], offset


def test_new_weights_at_a_place_go_on_with_every_source():
    groups, mixture, starts = setup(9)
    stream = MixStream(Mixer(mixture), starts, lambda tokens: tokens // W)
    runs = drive(stream, {name: cut(rgs, random.Random(1)) for name, rgs in groups.items()}, random.Random(2))
    whole = documents(runs)
    offset = 5 * W + 17
    run, row, skip = place(runs, offset)
    point = point_at(run, row, skip)
    other = Mixture(mixture.sources, {"web": 0.1, "code": 0.1, "math": 0.8})
    resumed = Mixer.resume(other, point.mixer, 5)
    assert any("weights differ" in note for note in resumed.notes)
    again = MixStream(resumed.mixer, point.sources, lambda tokens: 5 + (tokens - skip + 17) // W,
                      first=point.source if skip else None)
    orders = {name: cut(groups[name], random.Random(3), point.sources[name]) for name in groups}
    more = documents(drive(again, orders, random.Random(4)))
    assert skip > 0 and more[0][:5] == (run.source, run.piece.epoch, run.piece.file, run.piece.rg,
                                        run.piece.doc_start + row)  # the cut document goes on first
    before = {d[:5] for d in tokens_from(runs)[:offset]}
    seen = set()
    for doc in more:  # no document of any source read twice or skipped
        assert doc[:5] not in before or doc == more[0]
        seen.add(doc[:5])
    for name in groups:
        own = [d for d in whole if d[0] == name]
        after = [d for d in more if d[0] == name]
        k = next(i for i, d in enumerate(own) if d[:5] not in before or (d == more[0]))
        assert after == own[k:k + len(after)]  # each source in its own order, from where it stood


def test_a_source_that_ends_hands_its_weight_on():
    groups, _, starts = setup(5)
    mixture = Mixture({name: name for name in groups}, {"web": 1, "code": 1, "math": 1}, max_epochs={"math": 1})
    stream = MixStream(Mixer(mixture), starts, lambda tokens: tokens // W)
    orders = {name: cut(rgs, random.Random(5)) for name, rgs in groups.items()}
    orders["math"] = [(p, n) for p, n in orders["math"] if p.epoch == 1]
    stream.exhausted("math", len(orders["math"]))
    runs = drive(stream, orders, random.Random(6))
    notes = [n for n in stream.notes if "'math'" in n]
    assert len(notes) == 1 and "goes to the others" in notes[0]
    docs = documents(runs)
    last_math = max(i for i, d in enumerate(docs) if d[0] == "math")
    assert sum(d[5] for d in docs if d[0] == "math") == sum(int(n.sum()) for p, n in orders["math"])
    assert last_math < len(docs) - 50


def test_a_source_paused_before_its_next_piece_is_counted_is_placed_past_what_it_gave():
    """code's only counted piece is used up in stage 0 and its next piece is never counted;
    from batch 1 on code weighs 0: a place there has code reading after that piece."""
    mixture = Mixture({"web": "w", "code": "c"}, [(0, {"web": 1, "code": 1}), (1, {"web": 1})])
    stream = MixStream(Mixer(mixture), {"web": Position(1, 0, 0), "code": Position(1, 0, 0)}, lambda t: t // 10)
    code = Piece(0, 1, 0, 0, 0, 2)
    stream.counted("code", 0, code, np.array([3, 4]))
    for seq in range(6):
        stream.counted("web", seq, Piece(seq, 1, 0, seq, 0, 1), np.array([5]))
    runs = stream.runs()
    assert [r.source for r in runs][:3] == ["code", "web", "code"] and runs[2].last and not runs[0].last
    later = [point_at(r, r.row_lo, 0) for r in runs]
    later = [p for p in later if p.mixer["stage"] == 1]
    assert later and all(p.sources["code"] == Position(1, 0, 0, 2) for p in later)


class OneAtATime(MixStream):
    """The stream deciding a document at a time (`Mixer.pick`, `_take`): the reference of the
    block a `MixStream` decides in one call (`_pick_block`)."""

    def _pick_block(self, names, heads):
        heads, mixer = dict(zip(names, heads)), self.mixer
        staged = len(mixer.mixture.stages) > 1
        n = sum(mixer.counted.values())

        def length_of(name):
            length = heads[name].rows.sizes[heads[name].row]
            return length if self.cap is None else min(length, self.cap)
        while True:
            if staged and mixer.mixture.stage_at(self.batch_of(self.tokens)) != mixer.stage:
                return
            best = mixer.pick(n, length_of)
            n += length_of(best)
            if self._take(best, heads[best]) or self._room == 0:
                return


def seen(runs, rng) -> list:
    """Each run with where the mix stood before it and at one of its rows, as plain values."""
    out = []
    for r in runs:
        sources, snapshot = where_at(r.at)
        row = rng.randrange(r.row_lo, max(r.row_hi, r.row_lo + 1))
        points = [point_at(r, r.row_lo, 0).to_json(), point_at(r, row, 0).to_json()] if r.row_hi > r.row_lo else []
        out.append((r.source, r.piece, r.row_lo, r.row_hi, r.base, r.lengths, r.last, sources,
                    Mixer.state_of_snapshot(snapshot), points))
    return out


# (1, 0, 0), (0, 1, 0): one source takes part (a mixture of one: its blocks are slices, no rule run)
BLOCK_CASES = given(seed=st.integers(0, 10**6), weights=st.sampled_from([(1, 1, 1), (5, 3, 2), (1, 0, 1),
                                                                        (0.8, 0.15, 0.05), (1, 0, 0), (0, 1, 0)]),
                    staged=st.booleans(), cap=st.sampled_from([None, None, 100, 401]), ends=st.booleans(),
                    limits=st.sampled_from([None, (1, 7, 128)]), first=st.booleans(),
                    chunk=st.sampled_from([None, 4, 16]))


@settings(max_examples=12, deadline=None)  # ~0.3 s an example; the slow suite draws 150
@BLOCK_CASES
def test_a_block_decided_at_once_is_the_rule_a_document_at_a_time(seed, weights, staged, cap, ends, limits, first,
                                                                  chunk):
    block_rule_is_the_document_rule(seed, weights, staged, cap, ends, limits, first, chunk)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@BLOCK_CASES
def test_a_block_decided_at_once_is_the_rule_a_document_at_a_time_many_draws(seed, weights, staged, cap, ends,
                                                                             limits, first, chunk):
    block_rule_is_the_document_rule(seed, weights, staged, cap, ends, limits, first, chunk)


def block_rule_is_the_document_rule(seed, weights, staged, cap, ends, limits, first, chunk=None):
    """`MixStream` decides a block of documents in one call (`Mixer.picks`) and makes its runs
    with whole-array calls, each run's `at` made when asked; the reference decides a document at
    a time. Same runs, same places before and inside each, same mixer, notes and tokens: under
    schedules, a cap (best fit's), sources that end, limits (best fit's chunks), stops after a
    document that ends its source's chunk (`chunk`), and a resumed cut document that comes first."""
    groups, _, starts = setup(seed % 97)
    names = sorted(groups)
    mixture = Mixture({n: n for n in names}, [(0, dict(zip(names, weights)))]
                      + ([(3, dict(zip(names, weights[::-1]))), (7, dict(zip(names, (1, 1, 1))))] if staged else []),
                      max_epochs={"math": 1} if ends else None)
    rng = random.Random(seed)
    orders = {name: cut(rgs, random.Random(seed)) for name, rgs in groups.items()}
    if ends:
        orders["math"] = [(p, n) for p, n in orders["math"] if p.epoch == 1]
    arrivals = [(name, seq) for name, pieces in orders.items() for seq in range(len(pieces))]
    rng.shuffle(arrivals)
    made = []
    for kind in (MixStream, OneAtATime):
        stream = kind(Mixer(mixture), starts, lambda tokens: tokens // W, cap=cap,
                      first="code" if first and weights[0] else None, chunk=chunk)
        if ends:
            stream.exhausted("math", len(orders["math"]))
        runs, draw, points_rng = [], random.Random(seed + 1), random.Random(seed + 3)
        for name, seq in arrivals:
            stream.counted(name, seq, *orders[name][seq])
            while True:
                got = stream.stretches(draw.choice(limits) if limits else None)
                if chunk is not None and stream.chunk_ended:  # it stopped after a document that ends a chunk
                    last = got[-1].last_run()
                    p, live = last.piece, np.flatnonzero(last.lengths)
                    assert ends_chunk(p.doc_start, last.row_lo + live[-1], last.row_hi, p.n_docs, chunk)
                for stretch in got:  # its documents, as best fit takes them, are its runs'
                    which, rows, lengths = stretch.documents()
                    assert [(stretch.rows[w].piece, r, n) for w, r, n in zip(which.tolist(), rows.tolist(),
                                                                             lengths.tolist())] == \
                        [(r.piece, r.row_lo + i, n) for r in stretch.runs() for i, n in enumerate(r.lengths) if n]
                    made_here = stretch.runs()
                    assert stretch.rows_covered() == sum(r.row_hi - r.row_lo for r in made_here)
                    assert stretch.used_up() == [(r.source, r.piece) for r in made_here if r.last]
                    if len(which):
                        assert stretch.last_run() == made_here[-1]
                    if kind is MixStream and stretch.block is not None and stretch.first is None:
                        points_of_block_are_its_runs(stretch, made_here, points_rng)
                    runs += made_here
                if not got or (limits is None and not stream.chunk_ended):
                    break
        made.append((seen(runs, random.Random(seed + 2)), stream.mixer.state(), stream.notes, stream.tokens,
                     stream.finished))
    # not vacuous: over 100 documents, or, where math alone takes part and ends, all of its epoch (81-99 here)
    alone = ends and not (weights[0] or weights[2])
    assert sum(len(r[5]) for r in made[1][0]) >= (sum(p.n_docs for p, _ in orders["math"]) if alone else 101)
    assert made[0] == made[1]


def points_of_block_are_its_runs(stretch, runs: list, rng):
    """A batch's end in a block's stretch names its point from the block (`point_of`, from where
    the mix stood at the block's start, `start_of`, made once a block): the point inside the run
    that document is in (`point_at`), at its first, last and some pick. (With a `cap`, best
    fit's, the two mixers differ: `point_at` counts a run's earlier documents whole, the block
    as the rule counted them; best fit's points take the mixer's state at the batch's end.)"""
    block = stretch.block
    opened = stretch.arrays.opened
    start = start_of(block)
    n = len(block.picks)
    for j in sorted({0, n - 1, rng.randrange(n)}):
        run = runs[int(np.searchsorted(opened, j, side="right")) - 1]
        skip = rng.randrange(3)
        want = point_at(run, int(block.doc_rows[j]), skip).to_json()
        got = point_of(block, j, skip, start).to_json()
        assert json.loads(json.dumps(got["mixer"])) == mixer_pick_by_pick(block, start, j)
        if block.cap is not None:
            del want["mixer"], got["mixer"]
        assert got == want
    assert start == start_of(block)  # not changed by the points made from it


def mixer_pick_by_pick(block, start, j: int) -> dict:
    """The mixer's state before the block's pick `j`, counted one pick at a time from where it
    stood at the block's start (not as `point_of` sums each source's picks): each earlier pick's
    document counted as the rule counts it (up to the block's cap), and its source's totals
    `[tokens, documents, epoch]`; pick j's source at its piece's epoch."""
    mixer = json.loads(json.dumps(start.mixer))
    for i in range(j + 1):
        s = int(block.picks[i])
        name, epoch = block.names[s], block.rows[s].piece.epoch
        if i == j:
            mixer["totals"][name][2] = epoch
            break
        n = int(block.doc_lengths[i]) if block.cap is None else min(int(block.doc_lengths[i]), block.cap)
        t = mixer["totals"][name]
        mixer["counted"][name] += n
        mixer["totals"][name] = [t[0] + n, t[1] + 1, epoch]
    return mixer


@pytest.mark.parametrize("seed", seeds(40, 10))  # seeds 10-39: -m slow
def test_the_first_pick_that_ends_a_chunk_of_one_head_is_found_by_one_search(seed):
    """`first_end` of one head (a mixture of one) searches its picks' next rows; it is the first
    pick `ends_chunk` names (or the picks' number), with nulls, a piece starting inside its step,
    any first pick, picks to the piece's end or fewer."""
    rng = random.Random(seed)
    n = rng.randrange(1, 60)
    lengths = np.array([0 if rng.random() < 0.3 else rng.randint(1, 9) for _ in range(n)], dtype=np.int64)
    if not lengths.any():
        lengths[rng.randrange(n)] = 1
    piece = Piece(0, 1, 0, 0, rng.randrange(40), 0)
    rows = Rows(piece, lengths)
    chunk = rng.choice([1, 3, 4, 16])
    q = rng.randrange(len(rows.live))
    m = rng.randrange(1, len(rows.live) - q + 1)  # a limit may stop the picks before the piece's end
    doc_rows, nexts = rows.live[q:q + m], rows.after[q:q + m]
    picked = np.zeros(m, dtype=np.intp)
    hits = np.flatnonzero(ends_chunk(piece.doc_start, doc_rows, nexts, n, chunk))
    assert first_end([rows], picked, doc_rows, nexts, chunk) == (int(hits[0]) if len(hits) else m)
