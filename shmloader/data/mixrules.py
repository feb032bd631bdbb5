"""Which of a mixture's rules a run keeps: the one place a mixed stream's rules depend on the
state it resumes (issue 50, docs/design.md "The one pipeline"), and a mixture's run's shuffled
order by them (`order`).

From `RULES` (the state version that brought them) on, a mixture of one source is that
source's stream, byte for byte, in both packings, shuffled or not, for any number of workers:
- best fit's chunks end where one of a source's own chunks ends (rows `[k·c, (k+1)·c)` of a row
  group or shuffled window, c = `tokenizer_batch_size`: packing/mix.py `ends_chunk`), and at c
  documents; up to version 6 a chunk was the next c documents the mix picked, across row groups;
- the source a fresh run of a one-source mixture reads is shuffled with the loader's `seed` as it
  is (`plain`); every other source with `shuffle.source_seed(seed, name)`, as up to version 6.
A run keeps the rules of the state it resumes, and its states say so: a state of version 5 or 6
resumes with the old chunks and seeds (its run's states record `"rules": 6`), and a source keeps
the seed its run began with whatever sources a resume adds or leaves out (`"plain"`: the name of
the source read with the loader's seed). Another rank's state and another world size's replay
with the rules of the state.
"""
from __future__ import annotations

from typing import NamedTuple

from . import shuffle

RULES = 7       # the state version whose rules a fresh run follows
_CHUNKS = 7     # from this version on, best fit's chunks end with a source's own chunks


class Rules(NamedTuple):
    """The rules of a run: the state version they are of, and the source shuffled with the
    loader's seed as it is (None: none)."""
    version: int
    plain: str | None


def fresh(mixture) -> Rules:
    """A fresh run's: a mixture of one source reads it with the loader's seed."""
    names = tuple(mixture.names)
    return Rules(RULES, names[0] if len(names) == 1 else None)


def of_state(state: dict) -> Rules:
    """The rules a mixture's state's run followed (its `version`, `mixture.rules`, `mixture.plain`);
    a ValueError names a malformed field."""
    mixed = state["mixture"]
    version = mixed.get("rules", state["version"])
    plain = mixed.get("plain")
    if type(version) is not int or not 5 <= version <= RULES or (plain is not None and not isinstance(plain, str)):
        raise ValueError(f"resume state field 'mixture.rules' / 'mixture.plain' is malformed: "
                         f"{mixed.get('rules')!r} / {plain!r} (a state version from 5 to {RULES}, a source's name)")
    return Rules(6 if version < _CHUNKS else version, plain)  # versions 5 and 6 mix alike


def fields(rules: Rules | None) -> dict:
    """What a run's states record of its rules (nothing for a fresh run of several sources)."""
    if rules is None:
        return {}
    out = {"rules": rules.version} if rules.version < RULES else {}
    return {**out, "plain": rules.plain} if rules.plain is not None else out


def chunk(rules: Rules | None, chunk_docs: int) -> int | None:
    """The chunk a mixed best fit's documents end at (packing/mix.py `MixStream(chunk=)`), or
    None: the next `chunk_docs` documents the mix picks (version 6)."""
    return chunk_docs if rules is None or rules.version >= _CHUNKS else None


def seed(rules: Rules | None, seed: int, name: str, drawn) -> int:
    """Source `name`'s shuffle seed in a run with `seed`: the loader's for its `plain` source,
    else `drawn(seed, name)` (data/shuffle.py `source_seed`)."""
    return seed if rules is not None and rules.plain == name else drawn(seed, name)


def order(config, run) -> "shuffle.Sourced | None":
    """A mixture's run's shuffled order (`RunArgs.mixture`: its `MixArgs`), its kind's
    `RunArgs.order_of` (kinds.py; `shuffle.of_run` reads it): a `shuffle.Sourced` of each source,
    shuffled as its own `Source(shuffle=)` says, else as the loader's `shuffle=`, with the seed its
    rules give it (`seed`); None: no source is shuffled."""
    mix = run.mixture
    names = tuple(r.name for r in mix.ranges)
    window = config.shuffle_window or shuffle.WINDOW
    orders = tuple(shuffle.Shuffle(seed(mix.rules, config.seed, name, shuffle.source_seed), window)
                   if shuffle.source_shuffled(mix.mixture, name, config.shuffle)
                   else None for name in names)
    if not any(orders):
        return None
    return shuffle.Sourced(names, tuple(r.lo for r in mix.ranges), tuple(r.hi for r in mix.ranges), orders)
