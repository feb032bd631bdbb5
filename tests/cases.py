"""A parametrized test's cross product split between the default suite and the slow suite
(issue 50): the default suite runs a covering subset of the cases (every value of every
parameter at least once, and the cases a past bug was found in), the slow suite (`-m slow`,
also run on every landing) the rest. No case is dropped: each is in one of the two.

    @pytest.mark.parametrize("W,W2,packing", cross(
        [pytest.param(2, 3, id="2-3"), pytest.param(4, 2, id="4-2")], ["concat", "bos_bestfit"],
        default={"2-3-concat", "4-2-bos_bestfit"}))

Each axis is a list of plain values (id: `str(value)`) or `pytest.param`s (their values and
id); a case's values are its axes' in order and its id their ids joined with "-", the id that
stacked `parametrize` decorators give it when the first axis is the decorator nearest the
function. A case whose id is not in `default` is marked slow; an id in `default` that no case
has is an error, so a renamed case cannot leave the default suite unnoticed. A randomized
test's seeds: `seeds(n, default)`, the first `default` of `range(n)` in the default suite.
"""
from __future__ import annotations

import itertools

import pytest


def _values_and_id(value) -> tuple[tuple, str]:
    if isinstance(value, type(pytest.param(None))):
        if value.id is None:
            raise ValueError(f"a pytest.param in an axis needs an id: {value!r}")
        return tuple(value.values), value.id
    return (value,), str(value)


def cross(*axes, default: set[str]) -> list:
    """The cross product of `axes` as `pytest.param`s, those not in `default` marked slow."""
    out, ids = [], set()
    for combo in itertools.product(*([_values_and_id(v) for v in axis] for axis in axes)):
        values = tuple(x for vals, _ in combo for x in vals)
        case = "-".join(i for _, i in combo)
        ids.add(case)
        marks = () if case in default else (pytest.mark.slow,)
        out.append(pytest.param(*values, id=case, marks=marks))
    unknown = set(default) - ids
    if unknown:
        raise ValueError(f"tests/cases.py cross: default names cases that are not in the product: {sorted(unknown)}")
    return out


def seeds(n: int, default: int) -> list:
    """Seeds `range(n)` of a randomized test: the first `default` in the default suite, the rest slow."""
    return [s if s < default else pytest.param(s, marks=pytest.mark.slow) for s in range(n)]
