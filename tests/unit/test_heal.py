"""Whether a lost child is healed (procs/heal.py), pure: the budget counts the heals of the
last window; a second loss in a row group is a poison pill only while the stream has not passed
the piece of the first (unrelated deaths far apart are not); the poisoned row groups as a run's
file indices."""
from shmloader.position import Position
from shmloader.procs.heal import Budget, Held, PoisonMemory, passed


def test_the_budget_counts_the_heals_within_its_window():
    budget = Budget(2, window_s=100.0)
    assert not budget.spent(0.0)
    assert budget.spend(0.0) == 1 and not budget.spent(10.0)
    assert budget.spend(10.0) == 2 and budget.spent(50.0)  # 2 within the last 100 s
    assert not budget.spent(100.5)  # the first one is out of the window
    assert budget.spend(100.5) == 2 and budget.used == 2


def test_no_budget_means_the_first_loss_is_the_error():
    assert Budget(0).spent(0.0)


def held(rg=3, doc=128, end=384, file=0, epoch=1, path="a.parquet"):
    return Held(path, rg, doc, end, epoch, file)


def test_a_second_loss_before_the_stream_passed_the_first_piece_is_poison():
    memory = PoisonMemory()
    assert not memory.lost(held(), Position(1, 0, 3, 10))           # the first loss: chance
    assert memory.lost(held(doc=200), Position(1, 0, 3, 100))       # the stream is still inside it


def test_a_second_loss_after_the_stream_passed_the_first_piece_is_chance():
    memory = PoisonMemory()
    assert not memory.lost(held(), Position(1, 0, 3, 10))
    assert not memory.lost(held(doc=400, end=600), Position(1, 0, 3, 384))  # read whole since
    assert memory.lost(held(doc=500, end=600), Position(1, 0, 3, 450))      # but this one was not


def test_losses_in_other_row_groups_or_files_never_meet():
    memory = PoisonMemory()
    assert not memory.lost(held(rg=3), Position(1, 0, 3, 0))
    assert not memory.lost(held(rg=5), Position(1, 0, 3, 0))
    assert not memory.lost(held(rg=3, path="b.parquet", file=1), Position(1, 0, 3, 0))


def test_passed_compares_the_stream_with_the_pieces_end():
    h = held(doc=10, end=20, epoch=2, file=1, rg=4)
    assert not passed(h, Position(2, 1, 4, 19)) and passed(h, Position(2, 1, 4, 20))
    assert passed(h, Position(2, 2, 0, 0)) and passed(h, Position(3, 0, 0, 0))
    assert not passed(h, Position(1, 5, 9, 99))


def test_poisoned_row_groups_are_named_by_the_runs_file_indices():
    memory = PoisonMemory()
    memory.skip(held(rg=3, path="/d/b.parquet"))
    memory.skip(held(rg=1, path="/d/gone.parquet"))
    assert memory.in_files(["/d/a.parquet", "/d/b.parquet"]) == ((1, 3),)
