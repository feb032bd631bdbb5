"""tests/cases.py: a parametrized test's cross product split between the default suite and
the slow suite (issue 50), no case dropped."""
import pytest

from tests.cases import cross, seeds


def _slow(param) -> bool:
    return any(m.name == "slow" for m in param.marks)


def test_every_case_is_in_one_suite_with_the_ids_of_stacked_decorators():
    got = cross(["concat", "bos_bestfit"], [pytest.param(2, 3, id="2-3"), pytest.param(1, 4, id="1-4")],
                default={"concat-2-3", "bos_bestfit-1-4"})
    assert [(p.id, p.values, _slow(p)) for p in got] == [
        ("concat-2-3", ("concat", 2, 3), False), ("concat-1-4", ("concat", 1, 4), True),
        ("bos_bestfit-2-3", ("bos_bestfit", 2, 3), True), ("bos_bestfit-1-4", ("bos_bestfit", 1, 4), False)]


def test_a_default_case_that_is_not_in_the_product_is_an_error():
    with pytest.raises(ValueError, match="concat-9"):
        cross(["concat"], [1], default={"concat-1", "concat-9"})


def test_seeds_past_the_default_ones_are_slow():
    got = seeds(4, 2)
    assert got[:2] == [0, 1] and [p.values for p in got[2:]] == [(2,), (3,)] and all(_slow(p) for p in got[2:])
