"""Which worker gets the next piece (packing/affinity.py `pick`), alone and through `SourceBestFitMode`
as the coordinator drives it: a row group's slices stay with the workers that read it when the
loads allow, an idle worker never waits for a holder, and the batches are the same whatever the
rule (the plan is made from lengths alone)."""
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from shmloader import cores
from shmloader.config import LoaderConfig
from shmloader.data.order import Piece
from shmloader.ipc.protocol import Counted
from shmloader.packing.affinity import Worker, pick
from shmloader.packing.base import SlotMap
from shmloader.packing.mixbestfit import SourceBestFitMode
from shmloader.ipc.runstart import RunStart, SourceStart
from shmloader.position import Position
from tests.unit.packing.modes import turn

X, Y = (0, 3), (0, 4)  # two row groups (file, rg)


def worker(index, flight=1, takes=True, continues=False, holds=None, held=0):
    return Worker(index, (flight, held), takes, continues, holds)


def test_an_idle_worker_comes_first_a_holder_among_them():
    workers = [worker(0, flight=1, holds=X), worker(1, flight=0, holds=Y)]
    assert pick(X, workers) == 1, "an idle worker waited while a holder queued a second piece"
    workers = [worker(0, flight=2, takes=False, continues=True, holds=X), worker(1, flight=0, holds=Y)]
    assert pick(X, workers) == 1, "an idle worker waited for a holder past its pair"
    both = [worker(0, flight=0, holds=Y), worker(1, flight=0, holds=X)]
    assert pick(X, both) == 1, "not the idle holder"


def test_a_busy_holder_comes_before_the_least_loaded():
    workers = [worker(0, flight=1, holds=Y), worker(1, flight=1, holds=X, held=10_000)]
    assert pick(X, workers) == 1
    both = [worker(0, flight=1, holds=X, held=5), worker(1, flight=1, holds=X)]
    assert pick(X, both) == 1, "not the least loaded of the holders"


def test_a_busy_holder_continues_its_row_group_when_no_one_is_idle():
    workers = [worker(0, flight=2, takes=False, continues=True, holds=X), worker(1, flight=1, holds=Y)]
    assert pick(X, workers) == 0
    assert pick(Y, workers) == 1
    workers[0] = workers[0]._replace(continues=False)  # at the read-ahead cap, or MAX_IN_FLIGHT
    assert pick(X, workers) == 1, "the least loaded that may take one, as before"


def test_no_holder_the_least_loaded_and_none_when_no_one_may_take():
    workers = [worker(0, flight=1, held=500), worker(1, flight=1, held=20), Worker(2, None, False, False, None)]
    assert pick(X, workers) == 1
    assert pick(X, [Worker(0, None, False, False, X), Worker(1, None, False, False, None)]) is None
    assert pick(X, []) is None


def test_with_the_cores_all_taken_a_busy_holder_comes_before_an_idle_worker():
    """More workers than the cores, as many busy as the cores: an idle worker would not run
    before a core frees, and would read the row group again (4 workers on 2 cores read each
    nanochat row group 3 times, a slice each)."""
    workers = [worker(0, flight=1, holds=X), worker(1, flight=1, holds=Y), worker(2, flight=0, holds=None)]
    assert pick(X, workers) == 2, "rule 1 as before: an idle worker first"
    assert pick(X, workers, cores_busy=True) == 0, "an idle worker read the row group again while the cores were taken"
    workers[2] = worker(2, flight=0, holds=X)
    assert pick(X, workers, cores_busy=True) == 2, "not the idle holder"
    no_holder = [worker(0, flight=2, takes=False, holds=X), worker(1, flight=1, holds=Y), worker(2, flight=0)]
    assert pick(X, no_holder, cores_busy=True) == 2, "no holder may take it: the idle worker"
    assert pick(Y, workers, cores_busy=True) == 1


def test_the_cores_are_all_taken_when_as_many_workers_as_cores_have_a_piece_in_flight():
    cfg = LoaderConfig(2, 24, packing="bos_bestfit", num_workers=4, buffer_size=16, tokenizer_batch_size=SLICE,
                       max_piece_docs=RG_DOCS, max_piece_bytes=TEXT)
    run = SimpleNamespace(layout=SimpleNamespace(n_slots=4), start=RunStart(Position(1, 0, 0), SourceStart()))
    mode = SourceBestFitMode(cfg, run, 4, slices)
    pieces = slices(None, None, 0)
    first, second, other = next(pieces), next(pieces), Piece(99, 1, 5, 0, 0, SLICE, text_bytes=TEXT)
    mode.take(0, first)
    assert mode.pick(second, mode.candidates(range(4))) != 0, "one busy worker of 2 cores: an idle one takes it"
    mode.take(1, other)
    assert mode.pick(second, mode.candidates(range(4))) == 0, "both cores taken: the holder queues its next slice"
    two = SourceBestFitMode(LoaderConfig(2, 24, packing="bos_bestfit", num_workers=2, buffer_size=16,
                                         tokenizer_batch_size=SLICE, max_piece_docs=RG_DOCS, max_piece_bytes=TEXT),
                            run, 2, slices)
    two.take(0, first)
    assert two.pick(second, two.candidates(range(2))) == 1, "no more workers than cores: an idle one, as before"


# ---- through SourceBestFitMode: two workers, each tokenizing its queue a piece a tick

RG_DOCS, SLICE = 40, 8  # row groups of 40 documents cut into 5 slices of one best-fit chunk
TEXT = 1 << 20          # each slice about max_piece_bytes of text: a worker queues 2 (nanochat's)


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    monkeypatch.setattr(cores, "share", lambda: 2)


def lengths(piece) -> np.ndarray:
    """Document d of row group g: 1 to 30 tokens (a null every 13th), the same in every run."""
    docs = np.arange(piece.doc_start, piece.doc_end)
    out = (docs * 7 + piece.rg * 5) % 30 + 1
    out[(docs + piece.rg) % 13 == 0] = 0
    return out


def slices(ramp, cap, first):
    i = first
    for rg in range(10**6):
        for lo in range(0, RG_DOCS, SLICE):
            yield Piece(i, 1, rg // 4, rg % 4, lo, lo + SLICE, text_bytes=TEXT)
            i += 1


def least_loaded(piece, candidates):
    """The rule before affinity: the least loaded worker that may take a piece."""
    able = [w for w in candidates if w.takes]
    return min(able, key=lambda w: (w.load, w.index)).index if able else None


def simulate(workers: int, rule=None, ticks: int = 400, slow=(), cores: int | None = None) -> dict:
    """A coordinator's turns over `SourceBestFitMode` (procs/coordinator.py `_assign`), every batch freed
    at once; each worker counts the first piece of its queue each tick (a worker in `slow` every
    other tick; with `cores`, only that many of the workers with a queue, taken in turn from the
    tick's index, as a scheduler shares the cores). Returns the placements of every batch in order (without their workers), the row
    groups each worker read (a read whenever its next piece is of another row group than its
    last), the pieces each counted, the ticks a worker sat idle while a piece waited to go out,
    and the most pieces given and not counted at once."""
    cfg = LoaderConfig(2, 24, packing="bos_bestfit", n_slots=4, num_workers=workers, buffer_size=16,
                       tokenizer_batch_size=SLICE, max_piece_docs=RG_DOCS, max_piece_bytes=TEXT)
    run = SimpleNamespace(layout=SimpleNamespace(n_slots=4), start=RunStart(Position(1, 0, 0), SourceStart()))
    mode = SourceBestFitMode(cfg, run, workers, slices)
    if rule is not None:
        mode.pick = rule
    slots, queues = SlotMap(4), [deque() for _ in range(workers)]
    last, reads, counted, idle, batches, ahead = [None] * workers, [0] * workers, [0] * workers, 0, {}, None
    most = 0  # pieces given and not counted, at most
    for tick in range(ticks):
        orders, _ = turn(mode, slots)
        for order in orders:  # a batch's placements come in one order a worker
            batches.setdefault(order.batch, []).extend(order.placements.tolist())
        while True:  # the coordinator's _assign: its turns
            w, ahead = mode.hand_out(range(workers), ahead)
            if w is None:
                break
            queues[w].append(ahead)
            ahead = None
        idle += sum(1 for q in queues if not q) if ahead is not None else 0
        most = max(most, sum(len(q) for q in queues))
        runnable = [w for w, queue in enumerate(queues) if queue and not (w in slow and tick % 2)]
        if cores is not None and runnable:
            turn_of = tick % len(runnable)
            runnable = (runnable[turn_of:] + runnable[:turn_of])[:cores]
        for w in runnable:
            queue = queues[w]
            if queue:
                piece = queue.popleft()
                if (piece.file, piece.rg) != last[w]:
                    reads[w], last[w] = reads[w] + 1, (piece.file, piece.rg)
                counted[w] += 1
                mode.counted(Counted(piece.index, lengths(piece), None))
    batches = [sorted(batches[k], key=lambda p: (p[2], p[3])) for k in sorted(batches)]  # by row, column
    return {"batches": batches, "reads": reads, "counted": counted, "idle": idle, "most": most}


@pytest.mark.parametrize("slow", [(), (1,)])
def test_a_row_group_is_read_once_past_the_start_and_the_batches_do_not_change(slow):
    new, old = simulate(2, slow=slow), simulate(2, least_loaded, slow=slow)
    n = min(len(new["batches"]), len(old["batches"]))
    assert n > 50
    assert new["batches"][:n] == old["batches"][:n], "the worker a piece went to changed a batch"
    pieces, read = sum(new["counted"]), sum(new["reads"])
    groups = pieces / (RG_DOCS // SLICE)
    assert read <= groups + 4, f"{read} row-group reads for {groups:.0f} row groups"
    assert sum(old["reads"]) >= 1.5 * groups, "the old rule read row groups once too: a vacuous test"
    assert new["idle"] == 0, "a worker sat idle while a piece waited"
    assert abs(pieces - sum(old["counted"])) <= 4, "fewer pieces tokenized than with the old rule"


def test_more_workers_than_cores_read_a_row_group_once_as_many_as_the_cores_at_once():
    """4 and 8 workers on 2 cores (the scheduler sharing them): as many workers as the cores have
    pieces at once, and a row group is read about once, as with 2 workers; the batches are the
    same. (When one piece more than the cores went out instead, a holder with its pair in flight
    left the next slice to an idle worker, which read the row group again: 1.6 reads a row group
    with 4 workers in a live loader, docs/benchmarks.md.)"""
    assert LoaderConfig(2, 24, packing="bos_bestfit", num_workers=4).workers_at_once == 2
    two = simulate(2, ticks=300, cores=2)
    for workers in (4, 8):
        out = simulate(workers, ticks=300, cores=2)
        groups = sum(out["counted"]) / (RG_DOCS // SLICE)
        assert sum(out["counted"]) > 150
        assert sum(out["reads"]) <= groups + 4, f"{workers} workers: {sum(out['reads'])} reads for {groups:.0f} row groups"
        assert sum(1 for n in out["counted"] if n) == 2, f"{workers} workers: more than the cores tokenized"
        n = min(len(out["batches"]), len(two["batches"]))
        assert n > 50 and out["batches"][:n] == two["batches"][:n], "the worker a piece went to changed a batch"
        assert sum(out["counted"]) >= 0.95 * sum(two["counted"]), f"{workers} workers: the cores did less work"


@pytest.mark.parametrize("seed", range(4))
def test_each_workers_flight_is_the_one_pass_it_was_asked_by(seed):
    """`Mode._flight` (pieces and text in flight on a worker, the largest text on another's)
    made for every worker at once and kept until a piece is given, counted or forgotten, equals
    the pass over the pieces in flight each question made (ties of the largest on one worker
    and on two included), after each of those changes."""
    rng = np.random.default_rng(seed)

    def by_pass(mode, worker):
        n = text = behind = 0
        for w, b in mode._in_flight.values():  # noqa: SLF001 (the record under test)
            if w == worker:
                n, text = n + 1, text + b
            elif b > behind:
                behind = b
        return n, text, behind

    n_workers = 5
    cfg = LoaderConfig(B=2, T=8, num_workers=n_workers, packing="bos_bestfit")
    run = SimpleNamespace(start=RunStart(Position(0, 0, 0, 0), SourceStart()), layout=SimpleNamespace(n_slots=4))
    mode = SourceBestFitMode(cfg, run, n_workers, lambda *a: iter(()))
    given = []
    for index in range(60):
        if given and rng.random() < 0.5:
            i = given.pop(int(rng.integers(len(given))))
            if rng.random() < 0.5:
                mode._counted_by(mode.owner.pop(i), mode.specs.pop(i), 0)  # noqa: SLF001
            else:  # it cannot be read: forgotten
                mode._forget(i)  # noqa: SLF001
        else:
            text = int(rng.choice([0, 5, 5, 7, 100, 100]))
            mode.take(int(rng.integers(n_workers)), Piece(index, 0, 0, 0, 0, 1, text_bytes=text))
            given.append(index)
        flights = [mode._flight(w) for w in range(n_workers)]  # noqa: SLF001
        assert flights == [by_pass(mode, w) for w in range(n_workers)]
