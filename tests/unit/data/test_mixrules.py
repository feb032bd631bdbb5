"""Which of a mixture's rules a run keeps (shmloader/data/mixrules.py): a fresh run's, a state's
of each version, what its states record, and what each rule decides."""
import pytest

from shmloader.data import mixrules
from shmloader.data.mixture import Mixture
from shmloader.data.mixrules import RULES, Rules
from shmloader.data.shuffle import source_seed


def state(version, **mixed):
    return {"version": version, "mixture": {"point": None, "sources": {}, **mixed}}


def test_a_fresh_run_follows_this_versions_rules_and_a_lone_source_the_loaders_seed():
    assert mixrules.fresh(Mixture({"x": "d"}, {"x": 1})) == Rules(RULES, "x")
    assert mixrules.fresh(Mixture({"x": "d", "y": "e"}, {"x": 1, "y": 2})) == Rules(RULES, None)


@pytest.mark.parametrize("saved, rules", [
    (state(5), Rules(6, None)), (state(6), Rules(6, None)), (state(RULES), Rules(RULES, None)),
    (state(RULES, plain="x"), Rules(RULES, "x")), (state(RULES, rules=6), Rules(6, None)),
    (state(RULES, rules=5), Rules(6, None)),
])
def test_a_state_says_the_rules_of_its_run_and_its_run_records_them_again(saved, rules):
    assert mixrules.of_state(saved) == rules
    assert mixrules.of_state(state(RULES, **mixrules.fields(rules))) == rules  # the resumed run's states


@pytest.mark.parametrize("mixed", [{"rules": "6"}, {"rules": 4}, {"rules": RULES + 1}, {"plain": 3}])
def test_malformed_rules_are_refused_naming_the_field(mixed):
    with pytest.raises(ValueError, match="mixture.rules"):
        mixrules.of_state(state(RULES, **mixed))


def test_what_each_rule_decides():
    assert mixrules.fields(None) == {} and mixrules.fields(Rules(RULES, None)) == {}
    assert mixrules.chunk(Rules(RULES, None), 16) == 16 and mixrules.chunk(None, 16) == 16
    assert mixrules.chunk(Rules(6, None), 16) is None
    assert mixrules.seed(Rules(RULES, "x"), 5, "x", source_seed) == 5
    assert mixrules.seed(Rules(RULES, "x"), 5, "y", source_seed) == source_seed(5, "y") != 5
    assert mixrules.seed(Rules(6, None), 5, "x", source_seed) == source_seed(5, "x")
    assert mixrules.seed(None, 5, "x", source_seed) == source_seed(5, "x")
