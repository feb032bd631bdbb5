"""The state a real loader writes is the one docs/contract.md §3 describes: the format table
lists exactly the keys a concat and a best-fit loader's states hold (a mixture's adds only
`mixture`, whose keys the mixture paragraph names), state.py's, sourcestate.py's and mixstate.py's
docstrings name them too, and the `digest` row (and the mixture's digest sentence) name exactly the keys the
digest covers, found by changing each key of a real state in turn."""
import itertools
import re
import zlib

import pytest

import shmloader
from shmloader import mixstate, sourcestate, state as statemod
from shmloader.demo import corpus
from shmloader.packing.runs import encode_runs
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.usefixtures("watchdog")
CONTRACT = (REPO_ROOT / "docs" / "contract.md").read_text()
B, T = 2, 16


def _states(loader, n=3) -> dict:
    for _ in itertools.islice(loader, n):
        pass
    return loader.state_dict()


@pytest.fixture(scope="module")
def states(synth, tmp_path_factory) -> dict:
    """A state of each kind: concat, best fit, a mixture (concat), each after 3 batches."""
    out = {}
    for packing in ("concat", "bos_bestfit"):
        with synth.loader(B, T, packing=packing, num_workers=1) as loader:
            out[packing] = _states(loader)
    root = tmp_path_factory.mktemp("mixsources")
    for i, name in enumerate(("a", "b")):
        corpus.write_shards(list(corpus.synthetic_texts(60, seed=40 + i, mean_words=20)), root / name,
                            num_files=2, row_group_size=20)
    mix = shmloader.Mixture({name: str(root / name) for name in ("a", "b")}, {"a": 0.5, "b": 0.5})
    with shmloader.ShmLoader(mix, synth.tokenizer, B, T, num_workers=1, device="cpu") as loader:
        out["mixture"] = _states(loader)
    return out


def _squash(text: str) -> str:
    return " ".join(text.split())


def _table() -> dict[str, str]:
    """The format table: each key (a row may name several) -> its row's second cell."""
    start = CONTRACT.index("| key | holds |")
    rows = {}
    for line in CONTRACT[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        keys, holds = line.split(" | ", 1)
        for key in re.findall(r"`(\w+)`", keys):
            rows[key] = holds
    return rows


def _mixture_paragraph() -> str:
    start = CONTRACT.index("**A mixture's state**")
    return _squash(CONTRACT[start:CONTRACT.index("\n- ", start)])


def test_the_format_table_lists_exactly_the_keys_a_state_holds(states):
    single = set(states["concat"]) | set(states["bos_bestfit"])
    assert "buffer" in states["bos_bestfit"] and "buffer" not in states["concat"]
    assert set(_table()) == single, "docs/contract.md §3's format table"
    assert set(states["mixture"]) - single == {"mixture"}
    assert set(states["mixture"]) <= single | {"mixture"}
    paragraph = _mixture_paragraph()
    for key in set(states["mixture"]["mixture"]) | {"plans"}:  # plans: a run begun at a change of world size
        assert f'"{key}"' in paragraph or f"`mixture.{key}`" in CONTRACT, f"mixture.{key} in the mixture paragraph"


def test_the_docstrings_name_every_key_a_state_holds(states):
    single = set(states["concat"]) | set(states["bos_bestfit"])
    docs = statemod.__doc__ + sourcestate.__doc__
    assert [k for k in sorted(single) if f'"{k}"' not in docs] == [], "state.py's and sourcestate.py's docstrings"
    keys = set(states["mixture"]["mixture"]) | {"plans"}
    assert [k for k in sorted(keys) if f'"{k}"' not in mixstate.__doc__] == [], "mixstate.py's docstring"


def _other(key: str, value):
    """Another value for `key`, of a kind its field may hold."""
    if key == "buffer":
        return encode_runs([[9, 0, 0, 0, 1]]) if value != encode_runs([[9, 0, 0, 0, 1]]) else ""
    if key == "elastic":
        return {"crc": "0badcafe"} if value is None else dict(value, crc="0badcafe")
    if key == "check":
        return "0badcafe" if value != "0badcafe" else "00000000"
    if key == "mixture":
        return dict(value, point=value["point"] + " ", sources=dict(value["sources"], x={}))
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return value + [[1, 1, 1]]
    if isinstance(value, dict):
        return dict(value, x=1)
    return {"pq_idx": 0, "rg_idx": 0, "epoch": 1}


def _single_ok(state: dict) -> bool:
    try:
        return sourcestate.Files().digest(state) == state["digest"]
    except ValueError:
        return False


def _mixture_ok(state: dict) -> bool:
    point = state["mixture"]["point"]
    return state["digest"] == mixstate.digest(state, zlib.crc32(point.encode()), state.get("check"))


def _covered(state: dict, ok) -> set[str]:
    assert ok(state)
    return {key for key in state if key != "digest" and not ok(dict(state, **{key: _other(key, state[key])}))}


def _named(text: str) -> set[str]:
    """The keys a text names in backticks (`a.b`: a), "the position" its `position`."""
    keys = {name.split(".")[0] for name in re.findall(r"`([\w.]+)`", text)}
    return keys | ({"position"} if "the position" in text else set())


def test_the_digest_row_names_exactly_what_the_digest_covers(states):
    covered = _covered(states["concat"], _single_ok) | _covered(states["bos_bestfit"], _single_ok)
    assert {"batch", "buffer", "elastic"} <= covered
    row = _table()["digest"]
    over, _, not_over = row.partition("; not over")
    assert _named(over) & set(_table()) == covered, "the digest row: what the digest covers"
    rest = set(states["concat"]) | set(states["bos_bestfit"])
    assert _named(not_over) == rest - covered - {"digest"}, "the digest row: what it does not cover"


def test_the_mixture_paragraph_names_exactly_what_its_digest_covers(states):
    covered = _covered(states["mixture"], _mixture_ok)
    assert "mixture" in covered
    sentence = re.search(r"Its `digest` is over (.*?)\.(?:\s|$)", _mixture_paragraph()).group(1)
    assert _named(sentence) & set(states["mixture"]) == covered
