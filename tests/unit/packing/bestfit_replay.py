"""Best fit replayed as the coordinator drives its mode, one source's (`packing.MODES["bos_bestfit"]
.source`) and a mixture's (`.mixture`, `mixture_runs`), without processes, over a grid of runs;
each run's trace is everything the mode says:
the pieces it hands out and to whom, every `Rows` order (worker, batch, slot, placements), every
batch's `Complete` (position, buffer runs, documents) and what its slot carries for the state
(`buffer_of`: the state's buffer text and crc), what each worker holds (`holding`), the messages
(`Ended`) and the stats. Importable from any checkout (it asks only `shmloader`'s public names),
so the same grid can be traced under main's code and this one's and compared: run as a script it
prints every run's trace digest as JSON (`PYTHONPATH=<checkout> python tests/unit/packing/bestfit_replay.py`);
tests/fixtures/bestfit_traces.json holds the digests recorded from main's `BestFitMode` and
`MixBestFitMode` before they became one (issue 50; main at 62f3280), which test_bestfit_replay.py
checks; a mixture's runs (`mixture_runs`: one source passing through and two sources, fresh and
resumed from its point and buffer) are traced the same way, what a batch's slot carries there a
packed point and buffer.

The grid (`RUNS`): 1-3 workers; three shapes of row groups (mixed lengths with nulls; one-row
and empty row groups; documents longer than a row); two batch geometries; a fresh run and a run
resumed from batch 11 of the fresh one (inside a non-empty buffer, its pieces re-read first);
no bad piece, or one or two that cannot be read at several places (index 0 and 1: in the resumed
buffer); three slots, and two (`runs`).
Every choice of the driver (which counts come back, which batches are freed) is drawn from a
generator seeded by the run, so a run's trace is the same whenever the mode decides the same.
"""
import hashlib
import itertools
import json
import random
import sys
from types import SimpleNamespace

import numpy as np

SHAPES = ("mixed", "one_row", "long")
GEOMETRIES = ((2, 9, 6, 4, 8, None), (3, 16, 10, 4, 4, 2))  # B, T, buffer_size, chunk, max_piece_docs, workers at once
BADS = ((), (0,), (25,), (40, 61))
BADS_SINCE = ((1,),)  # added to the grid after the first recording (the same checkout recorded them)
RESUME_AT = 11
BATCHES = 60
N_SLOTS = 3


def row_counts(shape: str):
    """Rows of each row group of file `f` (4 files of 5 row groups)."""
    def counts(f: int) -> list:
        if shape == "one_row":
            return [(f * 5 + g) % 3 for g in range(5)]   # 0, 1 or 2 rows: empty and one-row row groups
        return [3 + (f * 7 + g * 5) % 17 for g in range(5)]
    return counts


def lengths_of(shape: str, piece) -> np.ndarray:
    """Each row's tokens (0: a null row), the same in every run."""
    rows = np.arange(piece.doc_start, piece.doc_end, dtype=np.int64)
    h = (rows * 7919 + piece.file * 131 + piece.rg * 17 + piece.epoch * 3) % 97
    if shape == "long":
        n = h % 40 + 1
    else:
        n = h % 12 + 1
    n[h % 5 == 0] = 0
    return n.astype(np.int64)


def make_mode(workers: int, geometry, shape: str, start, buffer_runs, sources: int = 0, n_slots: int = N_SLOTS,
              point=None, first_batch: int = 0):
    """One source's mode (`sources` 0), or a mixture's of `sources` sources (1: a pass-through),
    resumed from `point` (its JSON with its buffer, at the state's batch `first_batch`) if given."""
    from shmloader.data.order import Piece, iter_pieces
    from shmloader.packing import MODES

    B, T, buffer_size, chunk, max_docs, at_once = geometry
    cfg = SimpleNamespace(B=B, T=T, buffer_size=buffer_size, tokenizer_batch_size=chunk, max_piece_docs=max_docs,
                          max_piece_bytes=None, workers_at_once=at_once)
    if sources:
        from shmloader.data.mixture import Mixture
        from shmloader.data.sources import Range
        from shmloader.ipc.protocol import MixArgs
        from shmloader.ipc.runstart import MixStart, RunStart

        names = ("a", "b")[:sources]
        mix = Mixture({n: n for n in names}, {n: 1.0 / (i + 1) for i, n in enumerate(names)})
        ranges = tuple(Range(n, 2 * i, 2 * i + 2) for i, n in enumerate(names))
        run = SimpleNamespace(mixture=MixArgs(mix, ranges), start=RunStart(None, MixStart(point), first_batch),
                              rank=0, layout=SimpleNamespace(window=0, n_slots=n_slots))

        def mixed(ramp, cap, first, files=None, start=None, plan=None, later=None):
            """A source's order from `start` (numbered within the source): a piece a row group of its
            one file, row group i with the rows `row_counts` says (at least 1), the first from `start.doc`."""
            lo, _ = files
            counts = row_counts(shape)
            rg, doc = (0, 0) if start is None else (start.rg, start.doc)
            assert start is None or (start.epoch, start.file) == (1, 0), f"a source's order starts at {start}"

            def rows(i: int) -> int:
                return max(1, counts(lo + i // 5)[i % 5])
            if doc >= rows(rg):  # at the end of its row group: the next one's start
                rg, doc = rg + 1, 0
            return itertools.chain([Piece(0, 1, lo, rg, doc, rows(rg))],
                                   (Piece(i - rg, 1, lo, i, 0, rows(i)) for i in range(rg + 1, rg + 10**6)))
        return MODES["bos_bestfit"].mixture(cfg, run, workers, mixed)
    from shmloader.ipc.runstart import RunStart, SourceStart

    run = SimpleNamespace(layout=SimpleNamespace(n_slots=n_slots), start=RunStart(start, SourceStart(buffer_runs)))

    def pieces(ramp, cap, first):
        return iter_pieces(row_counts(shape), 4, 0, 1, start, cap, ramp, first)
    return MODES["bos_bestfit"].source(cfg, run, workers, pieces)


def _plain(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    if isinstance(x, dict):
        return [[k, _plain(v)] for k, v in sorted(x.items())]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, bytes):  # a mixture's packed point and buffer (packing/mixtext.py)
        return x.hex()
    return x


def replay(workers: int, geometry, shape: str, bad, seed: int, start=None, buffer_runs=(), batches=BATCHES,
           sources: int = 0, n_slots: int = N_SLOTS, point=None, first_batch: int = 0):
    """`(trace, completes)`: the run's trace (a list of JSON-able records) and its `Complete`s."""
    from shmloader.ipc.protocol import Counted, Error
    from shmloader.packing.base import SlotMap
    from shmloader.position import Position

    start = Position(1, 0, 0, 0) if start is None else start
    mode = make_mode(workers, geometry, shape, start, buffer_runs, sources, n_slots, point, first_batch)
    slots, rng, trace, done = SlotMap(n_slots), random.Random(seed), [], []
    queues = [[] for _ in range(workers)]
    unacked = [[] for _ in range(workers)]
    unfreed, ahead = [], None
    for turn in range(3000):
        while True:
            w, ahead = mode.hand_out(list(range(workers)), ahead)
            if w is None:
                break
            trace.append(["take", w, [ahead.index, ahead.epoch, ahead.file, ahead.rg, ahead.doc_start, ahead.doc_end]])
            queues[w].append(ahead)
            ahead = None
        for w in range(workers):
            for _ in range(min(len(queues[w]), rng.randint(0, 2))):
                piece = queues[w].pop(0)
                if piece.index in bad:
                    held = mode.failed(piece.index, Error("data", f"piece {piece.index} cannot be read", ""))
                    trace.append(["failed", piece.index, bool(held)])
                    if not held:
                        return trace, done
                else:
                    mode.counted(Counted(piece.index, lengths_of(shape, piece), None))
        for w, order in mode.orders(slots.take_slot):
            trace.append(["rows", w, order.batch, order.slot, _plain(order.placements)])
            unacked[w].append(order)
        if turn % 5 == 0:
            trace.append(["holding", [_plain(mode.holding(w, unacked[w])) for w in range(workers)]])
        for w in range(workers):
            if unacked[w] and rng.random() < 0.7:
                for order in unacked[w]:
                    mode.written([(order.batch, int(np.asarray(order.placements)[:, 4].sum()))])
                unacked[w] = []
        for c in mode.ready():
            done.append(c)
            trace.append(["complete", c.batch, _plain(tuple(c.position)), _plain(c.runs), c.docs,
                          _plain(mode.buffer_of(c))])
            unfreed.append(c.batch)
        while unfreed and rng.random() < 0.6:
            k = unfreed.pop(rng.randrange(len(unfreed)))
            slots.release(k)
            mode.freed(k)
        said = [[type(m).__name__, *m] for m in mode.messages()]
        trace += [["said", *m] for m in said]
        if said or len(done) >= batches:
            break
    trace.append(["stats", _plain(tuple(mode.stats()))])
    return trace, done


def runs():
    """Every run of the grid: `(name, workers, geometry index, shape, bad, resumed, n_slots)`; a
    bad piece at index 1 (`BADS_SINCE`) and two slots (the shapes "mixed" and "long") since."""
    for workers in (1, 2, 3):
        for g in range(len(GEOMETRIES)):
            for shape in SHAPES:
                for bad in BADS + BADS_SINCE:
                    for resumed in (False, True):
                        yield _name(workers, g, shape, bad, resumed, N_SLOTS), workers, g, shape, bad, resumed, N_SLOTS
            for shape in ("mixed", "long"):
                for bad in ((), (1,), (25,)):
                    for resumed in (False, True):
                        yield _name(workers, g, shape, bad, resumed, 2), workers, g, shape, bad, resumed, 2


def _name(workers: int, g: int, shape: str, bad, resumed: bool, n_slots: int) -> str:
    name = "_".join(map(str, bad)) or "none"
    slots = "" if n_slots == N_SLOTS else f"-slots{n_slots}"
    return f"w{workers}-g{g}-{shape}-bad{name}-{'resumed' if resumed else 'fresh'}{slots}"


def trace_of(workers: int, g: int, shape: str, bad, resumed: bool, n_slots: int = N_SLOTS) -> list:
    """The run's trace; a resumed one starts where the fresh run without a bad piece stood after
    batch `RESUME_AT` (its position and buffer), its trace after that one's."""
    geometry, seed = GEOMETRIES[g], workers * 100 + g * 10 + SHAPES.index(shape)
    if not resumed:
        return replay(workers, geometry, shape, bad, seed, n_slots=n_slots)[0]
    first, done = replay(workers, geometry, shape, (), seed, batches=RESUME_AT + 1, n_slots=n_slots)
    at = done[RESUME_AT]
    runs_ = _plain(at.runs)
    assert runs_, "the resumed buffer is empty: the run resumes at no buffer"
    trace, _ = replay(workers, geometry, shape, bad, seed + 1, start=at.position, buffer_runs=runs_, n_slots=n_slots)
    return [["resumed from", _plain(tuple(at.position)), runs_]] + trace


def mixture_runs():
    """A mixture's runs: `(name, workers, geometry index, shape, bad, sources, resumed)`; resumed
    ones (their pieces re-read first, at index 1 one that cannot be read) since the first recording."""
    for workers in (1, 2, 3):
        for g in range(len(GEOMETRIES)):
            for shape in ("mixed", "long"):
                for sources in (1, 2):
                    for bad in ((), (25,)):
                        yield (f"mix{sources}-w{workers}-g{g}-{shape}-bad{'_'.join(map(str, bad)) or 'none'}",
                               workers, g, shape, bad, sources, False)
                    for bad in ((), (1,), (25,)):
                        yield (f"mix{sources}-w{workers}-g{g}-{shape}-bad{'_'.join(map(str, bad)) or 'none'}-resumed",
                               workers, g, shape, bad, sources, True)


def mixture_trace(workers: int, g: int, shape: str, bad, sources: int, resumed: bool = False) -> list:
    """A mixture's trace; a resumed one starts where the fresh run without a bad piece stood after
    batch `RESUME_AT` (its point and buffer, the state's JSON: `mixbestfit.buffer_text`)."""
    seed = workers * 7 + g
    if not resumed:
        return replay(workers, GEOMETRIES[g], shape, bad, seed, sources=sources)[0]
    from shmloader.packing.mixbestfit import buffer_text

    _, done = replay(workers, GEOMETRIES[g], shape, (), seed, batches=RESUME_AT + 1, sources=sources)
    text = buffer_text(done[RESUME_AT].runs, {n: 2 * i for i, n in enumerate(("a", "b")[:sources])})
    point = json.loads(text)
    assert point.get("buffer"), "the resumed buffer is empty: the run resumes at no buffer"
    trace, _ = replay(workers, GEOMETRIES[g], shape, bad, seed + 1, sources=sources, point=point,
                      first_batch=RESUME_AT + 1)
    return [["resumed from", text]] + trace


def digest(trace: list) -> str:
    return hashlib.sha256(json.dumps(trace, separators=(",", ":")).encode()).hexdigest()


def digests() -> dict:
    """`{run name: [digest, records, batches complete]}` of every run of the grid."""
    out = {}
    for name, *args in runs():
        out[name] = _summary(trace_of(*args))
    for name, *args in mixture_runs():
        out[name] = _summary(mixture_trace(*args))
    return out


def _summary(trace: list) -> list:
    return [digest(trace), len(trace), sum(1 for r in trace if r[0] == "complete")]


if __name__ == "__main__":
    json.dump(digests(), sys.stdout, indent=0, sort_keys=True)
