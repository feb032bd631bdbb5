"""Whether a lost child is healed (procs/heal.py), pure: the budget counts the heals of the
last window; a loss makes its run of documents a suspect, and only a later loss inside a
suspect of the same epoch the stream has not passed (one document, or the same run again) is a
poison pill;
losses anywhere else in the row group (the trial's two OOM kills in one large row group) are
chance; the poisoned and suspect spans in a run's numbering of the files."""
from shmloader.ipc.protocol import Span
from shmloader.position import Position
from shmloader.procs.heal import Budget, Held, Poison, PoisonMemory, passed


def test_the_budget_counts_the_heals_within_its_window():
    budget = Budget(2, window_s=100.0)
    assert not budget.spent(0.0)
    assert budget.spend(0.0) == 1 and not budget.spent(10.0)
    assert budget.spend(10.0) == 2 and budget.spent(50.0)  # 2 within the last 100 s
    assert not budget.spent(100.5)  # the first one is out of the window
    assert budget.spend(100.5) == 2 and budget.used == 2


def test_no_budget_means_the_first_loss_is_the_error():
    assert Budget(0).spent(0.0)


def held(run, run_end, rg=3, doc=128, end=384, file=0, epoch=1, path="a.parquet"):
    return Held(path, rg, doc, end, epoch, file, run, run_end)


def test_two_losses_at_different_places_of_one_row_group_are_chance():
    """A worker SIGKILLed tokenizing documents 128-383 and the other, later, on documents from
    64 of the same row group: no document was at both deaths."""
    memory = PoisonMemory()
    assert memory.lost(held(200, 210), Position(1, 0, 3, 10)) is None
    assert memory.lost(held(70, 80, doc=64, end=128), Position(1, 0, 3, 10)) is None
    assert memory.lost(held(300, 340), Position(1, 0, 3, 10)) is None


def test_a_document_lost_again_inside_a_suspect_is_poison():
    memory = PoisonMemory()
    assert memory.lost(held(200, 210), Position(1, 0, 3, 10)) is None  # the run becomes a suspect
    poison = memory.lost(held(205, 206), Position(1, 0, 3, 100))       # its documents one at a time: 205
    assert poison == Poison("a.parquet", 3, 205, 206) and str(poison) == "a.parquet, row group 3, row 205"
    assert str(Poison("a.parquet", 3, 8, 10, 1, True)) == \
        "a.parquet, the shuffled window of row group 3 in epoch 1, its documents 8-9"
    # a JSON Lines file's place is its lines (unit 3 of 1024 lines: rows 205-206 are lines 3278-3279)
    assert str(Poison("a.jsonl", 3, 205, 207)) == "a.jsonl, lines 3278-3279"
    assert str(Poison("a.jsonl", 3, 8, 10, 1, True)) == \
        "a.jsonl, the shuffled window of lines 3073-4096 in epoch 1, its documents 8-9"


def test_a_piece_lost_twice_while_it_was_read_is_poison():
    """Lost while the piece was read (no document in the engine): read again, lost again."""
    memory = PoisonMemory()
    assert memory.lost(held(-1, -1), Position(1, 0, 3, 10)) is None
    assert memory.lost(held(-1, -1), Position(1, 0, 3, 10)) == Poison("a.parquet", 3, 128, 384)


def test_the_same_many_document_run_lost_again_is_not_yet_poison():
    """A worker given the piece before the suspect was known dies on the same run: the run is
    a suspect again, and only a single document inside it names the poison."""
    memory = PoisonMemory()
    assert memory.lost(held(0, 20), Position(1, 0, 3, 0)) is None
    assert memory.lost(held(0, 20), Position(1, 0, 3, 0)) is None
    assert memory.lost(held(5, 6), Position(1, 0, 3, 0)) == Poison("a.parquet", 3, 5, 6)


def test_a_loss_after_the_stream_passed_the_suspect_is_chance():
    memory = PoisonMemory()
    assert memory.lost(held(200, 210), Position(1, 0, 3, 10)) is None
    assert memory.lost(held(205, 206), Position(1, 0, 3, 210)) is None  # read whole since: chance again


def test_the_same_rows_lost_in_another_epoch_are_chance():
    """Best fit counts epochs ahead of the stream on a small corpus (the flaky heal test: a worker
    killed at batch 10 in epoch 5's read of a row group and again at batch 60 in epoch 6's, the
    stream still in epoch 1): another epoch's read of the rows is not the replacement's read of
    the lost piece. A second loss in the lost piece's own epoch still names the poison."""
    memory = PoisonMemory()
    at = Position(1, 0, 3, 48)
    assert memory.lost(held(0, 30, epoch=5), at) is None
    assert memory.lost(held(29, 30, epoch=6), at) is None            # epoch 6's read: chance, a suspect too
    assert memory.lost(held(-1, -1, epoch=5), at) is None            # reading it in epoch 5 (first time)
    assert memory.lost(held(-1, -1, epoch=7), at) is None            # and in epoch 7
    assert memory.lost(held(29, 30, epoch=5), at) == Poison("a.parquet", 3, 29, 30)
    assert memory.lost(held(-1, -1, epoch=7), at) == Poison("a.parquet", 3, 128, 384)


def test_losses_in_other_row_groups_or_files_never_meet():
    memory = PoisonMemory()
    assert memory.lost(held(5, 6), Position(1, 0, 0, 0)) is None
    assert memory.lost(held(5, 6, rg=5), Position(1, 0, 0, 0)) is None
    assert memory.lost(held(5, 6, path="b.parquet", file=1), Position(1, 0, 0, 0)) is None


def test_passed_compares_the_stream_with_the_runs_end():
    h = held(10, 20, epoch=2, file=1, rg=4)
    assert not passed(h, Position(2, 1, 4, 19)) and passed(h, Position(2, 1, 4, 20))
    assert passed(h, Position(2, 2, 0, 0)) and passed(h, Position(3, 0, 0, 0))
    assert not passed(h, Position(1, 5, 9, 99))


def test_spans_name_the_files_as_the_run_numbers_them():
    memory = PoisonMemory()
    memory.skip(Poison("/d/b.parquet", 3, 7, 8))
    memory.skip(Poison("/d/gone.parquet", 1, 0, 1))
    memory.lost(held(20, 30, rg=2, path="/d/a.parquet"), Position(1, 0, 0, 0))
    memory.lost(held(-1, -1, rg=4, doc=0, end=64, path="/d/a.parquet"), Position(1, 0, 0, 0))  # lost reading
    poisoned, suspects = memory.spans(["/d/a.parquet", "/d/b.parquet"])
    assert poisoned == (Span(1, 3, 7, 8),) and suspects == (Span(0, 2, 20, 30), Span(0, 4, 0, 64))


def test_a_shuffled_stream_passes_a_suspect_in_a_later_epoch_or_past_it_in_its_unit():
    """A shuffled order's units are not in file order: a later unit of the file order says nothing."""
    h = held(10, 20, epoch=2, file=1, rg=4)
    assert not passed(h, Position(2, 2, 0, 0), shuffled=True) and not passed(h, Position(2, 1, 4, 19), shuffled=True)
    assert passed(h, Position(2, 1, 4, 20), shuffled=True) and passed(h, Position(3, 0, 0, 0), shuffled=True)


def test_poisoned_rows_reach_a_piece_in_its_epochs_order():
    """Found in epoch 1 as document 7 of its window's shuffled order: in epoch 2 the same row,
    at its place in epoch 2's window that holds it; without a shuffle, as found."""
    from shmloader.data.order import Piece
    from shmloader.data.shuffle import Shuffle, Sourced, Windows, locate
    from shmloader.procs.heal import spans_in
    counts = [[30, 30, 30], [30, 30]]
    for k in (1, 40):
        order = Shuffle(3, k)
        windows = Windows(Sourced.one(order, len(counts)), counts.__getitem__, 1)
        found = order.shares(1, counts, 1)[0][0]
        spans = (Span(*found.head, 7, 8, 1),)
        which, rows = locate(found.members, order.rows(1, *found.head, found.rows)[7:8])
        bad = (found.members[int(which[0])].file, found.members[int(which[0])].unit, int(rows[0]))
        hits = []
        for w in order.shares(2, counts, 1)[0]:
            for lo, hi in spans_in(Piece(0, 2, *w.head, 0, w.rows), spans, windows):
                ww, rr = locate(w.members, order.rows(2, *w.head, w.rows)[lo:hi])
                hits += [(w.members[a].file, w.members[a].unit, int(r)) for a, r in zip(ww.tolist(), rr.tolist())]
        assert hits == [bad]
    piece = Piece(0, 2, 0, 2, 0, 30)
    assert spans_in(piece, (Span(0, 2, 7, 8, 1), Span(0, 3, 1, 2, 1)), None) == ((7, 8),)
