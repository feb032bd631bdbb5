"""The resume state: one envelope, written by one `Writer` and read by one `check`, whatever the
loader reads. Small, versioned, JSON-serialisable, checked against the loader.

The envelope is every state's: `{"version" (`VERSION`, the one place it is written), "rank",
"world_size", "config" (what must not change: the loader's fingerprint and its data's; over
token ids, data/catalogue.py `TOKEN_IDS`: a state of them without it is of the rule before, refused),
"shapes" ([first batch, B, T] of each batch shape the run used), "origin" (None, or the
nanochat keys the run started from), "batch" (batches of the run before the position), "check"
(the `ipc.ring.batch_check` of the batch it resumes at, as 8 hex digits; None in a state taken
before the run's first batch and in one that resumes with another shape, at another rank or
with other files: it cannot be known or does not apply there), "digest"}`. Inside it, the part
of what the loader reads (its `Part`), which says where the next token is:
- one source (sourcestate.py `Files`): its `position`, nanochat's keys, the split's `files` and
  `val` file, the `elastic` plan, best fit's `buffer`;
- a `Mixture` (mixstate.py `Mixed`): the position in its source, nanochat's keys, `mixture`
  (every source's place and files, the mixer's state, each source's plan).

`Writer` makes a state per progress mark (`procs.run.Mark`): the envelope's fields made once per
run (`Part.constant` adds the part's that stay the same), then per state the batch, the check
and the part's fields (`Part.fill`, which ends with the digest: each part's key over the
envelope's fields and its own, as its versions wrote it). Called with every batch in
nanochat's loop: a dict copy, a few fields, a crc32 of a short key.

`check` reads one: a dict (a state without `"version"` is the part's to read: nanochat's keys,
`Part.unversioned`), of the part's kind (`Part.own`) and a version it reads, the batch, the
rank and the shapes, the part's own fields (`Part.fields`), the digest (`Part.digest`; DCP keeps
one value per key across ranks, so a state saved under one key by every rank comes back with
fields of different ranks: the digest turns that, and hand edits, into an error, not a wrong
resume), the config against the loader's (each difference named in words), another B or T
(continues from the same place with a warning and a new `shapes` entry); then the part says
where the loader starts (`Part.resume`: a `Resume`, one record whatever its kind: the fields
every start has, what the loader's kind holds there, `AtSource` or `AtMix`, and the step left
before the run starts, `Exact`, `Locate` (a replay of this rank's stream) or `Change` (another
world size), on which resume.py `plan` dispatches once).
"""
from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Protocol

from .data.catalogue import TOKEN_IDS
from .data.elastic import Plan
from .data.order import start_position
from .errors import warn
from .packing.runs import decode_runs  # noqa: F401 (a best-fit state's buffer as runs: docs/contract.md §3)
from .position import Position, RowGroup

VERSION = 7
POSITION_FIELDS = ("epoch", "pq_idx", "rg_idx", "doc_idx", "skip")  # the position's fields, up to version 5


@dataclass(frozen=True)
class Loader:
    """What a state is checked against: the loader's fingerprint and place."""
    fingerprint: dict     # LoaderConfig.fingerprint(): split, packing, tokenizer, ... (the state's "config")
    files: list           # [[name, bytes, footer or None], ...] of the split, in order
    rank: int
    world: int
    B: int
    T: int
    buffered: bool = False  # the packing's state holds a buffer and its skip is 0 (its spec)
    other_rank: str = "exact"
    footers: object = None  # [file index] -> their footer digests now (data.source.footer_digests)
    val: str | None = None  # the name of the data set's val file (the last one)
    first: object = None    # (rank, world) -> the Position a fresh stream begins at, when not
    #                         `start_position`'s: a shuffled order's first window (data/shuffle.py)
    shuffled_sources: frozenset = frozenset()  # a mixture's sources read shuffled (their own
    #                         `Source(shuffle=)`, else the loader's `shuffle=`); `shuffled` is any

    @property
    def shuffled(self) -> bool:
        return "shuffle" in self.fingerprint

    def start_of(self, rank: int, world: int) -> Position:
        """Where a fresh stream of rank `rank` of `world` begins."""
        return start_position(rank) if self.first is None else self.first(rank, world)


@dataclass(frozen=True)
class AtSource:
    """One source's start beyond its position: best fit's buffer there (`runs`), the elastic plan
    its run began with (`plan`: data/elastic.py, None unless it began at a change of world size),
    and the loader's files (indices) in the order of the epoch in progress when it is not theirs
    (`order`: the state's, then files new to it; None: theirs)."""
    runs: list = field(default_factory=list)
    plan: Plan | None = None
    order: list | None = None


@dataclass(frozen=True)
class AtMix:
    """A mixture's start beyond its position: its `packing.mix.MixPoint` there as JSON (`point`,
    mixstate.py; None: a fresh run's), each source's `Plan` of a run that began at a change of
    world size (`plans`), and the rules of the state's run (`rules`: data/mixrules.py `Rules`;
    None: a fresh run's)."""
    point: dict | None = None
    plans: dict | None = None
    rules: object = None


@dataclass(frozen=True)
class Exact:
    """Nothing left to find: the run starts at the resume's position (a fresh run, this rank's
    own state, nanochat's keys, or where a replay or an elastic plan put it)."""


EXACT = Exact()


@dataclass(frozen=True)
class Locate:
    """This rank's position is found first, by a count-only replay of its stream (from the
    resume's position, or its run's `origin`) through its `shapes` to its `batch`, over the
    `n_files` files the state was saved with (resume.py `_replay`). `replayed`: a replay made in
    steps (a mixture's: one a batch shape), the batch it reached so far; 0: from the start."""
    replayed: int = 0


@dataclass(frozen=True)
class Change:
    """A state saved at another world size (`world`), by its rank `rank` at batch count `batch`:
    its position and (best fit) buffer; the loader finds the other old ranks' and makes the
    `Plan` (data/elastic.py; resume.py `_elastic`)."""
    world: int
    rank: int
    position: Position
    runs: list             # best fit: its buffer runs
    parent: Plan | None    # the plan the saved run began with, if it began at a change too


@dataclass
class Resume:
    """Where to start: the fields every resume has, what the data adds there (`at`: one
    source's `AtSource` or a mixture's `AtMix`, as the loader's kind reads), and what is still
    to do before the run starts (`step`: `Exact`, nothing; `Locate`, a replay of this rank's
    stream; `Change`, a state of another world size), which resume.py `plan` dispatches on once."""
    position: Position
    at: AtSource | AtMix
    step: Exact | Locate | Change = EXACT
    batch: int = 0
    shapes: list = field(default_factory=list)
    origin: dict | None = None  # nanochat's keys the run began from, or None
    n_files: int = 0      # files of the split when the state was saved (for `Locate`)
    check: int | None = None  # the batch_check the first batch must have (the state's own
    #                           rank, shape and files), else None: nothing to compare
    read: RowGroup | None = None  # nanochat's keys of the state it resumes (its own rank's, its files
    #                               numbered as the run's), for the states before its first batch


@dataclass(frozen=True)
class Envelope:
    """What `check` read of a state's envelope, for its part."""
    version: int
    rank: int
    world: object          # the state's `world_size` as it is (the part says what another one means)
    batch: int
    shapes: list           # as saved
    reshaped: list         # with this loader's B and T from `batch` on, if they changed


class Part(Protocol):
    """What the data a loader reads adds to the envelope (sourcestate.Files, mixstate.Mixed)."""
    reads: tuple  # the versions it reads

    def constant(self, identity: Loader, resume: Resume) -> dict:
        """Its fields that stay the same for every state of a run from `resume`."""

    def fill(self, state: dict, mark) -> None:
        """Its fields at `mark` into `state` (the envelope's are there), and the `digest`."""

    def keys(self, mark) -> dict:
        """nanochat's keys at `mark`."""

    def unversioned(self, state: dict, identity: Loader) -> Resume:
        """A state without a version: nanochat's keys, or a ValueError."""

    def own(self, state: dict) -> None:
        """A ValueError if `state` is of another kind of data (naming both)."""

    def version_hint(self) -> str:
        """What a message about a version it does not read adds."""

    def fields(self, state: dict, identity: Loader):
        """Its fields read (a malformed one named), for `resume`."""

    def digest(self, state: dict) -> str:
        """The digest `state`'s fields give (its versions' key)."""

    def resume(self, state: dict, identity: Loader, envelope: Envelope, fields) -> Resume:
        """Where the loader starts."""


def start(loader: Loader, at: AtSource | AtMix) -> Resume:
    """A fresh run: epoch 1, file 0, this rank's first row group (`at`: its kind's, empty, given
    always: one source's as a default would be a mixture's wrong start, silently)."""
    return Resume(loader.start_of(loader.rank, loader.world), at,
                  shapes=[[0, loader.B, loader.T]], n_files=len(loader.files))


class Writer:
    """The states of a loader from one start or resume on: the fields that stay the same, and
    one state per progress mark (`state`: the `procs.run.Mark` after a batch)."""

    def __init__(self, identity: Loader, resume: Resume, part: Part):
        self._base = {"version": VERSION, "rank": identity.rank, "world_size": identity.world,
                      "config": dict(identity.fingerprint), "shapes": [list(s) for s in resume.shapes],
                      "origin": resume.origin, **part.constant(identity, resume)}
        self._part = part

    def state(self, mark, check: int | None = None) -> dict:
        """The state at `mark`, with the check of the batch there if known."""
        state = dict(self._base)
        state["batch"] = mark.batch
        state["check"] = None if check is None else f"{check:08x}"
        self._part.fill(state, mark)
        return state

    def keys(self, mark) -> dict:
        """nanochat's keys at `mark` (the part's)."""
        return self._part.keys(mark)


_NOT_A_DICT = (  # (types, what a resume state given as one of them was meant to be)
    ((str, bytes, os.PathLike), ": a path or JSON text is not read; pass the dict, e.g. json.load(open(path))"),
    ((list, tuple), ": give one state, this rank's (or rank 0's, from which every rank finds its own place)"),
)


def _not_a_dict(state) -> str:
    """What a resume state that is no dict was meant to be, for the error ("" when unknown)."""
    return next((said for kinds, said in _NOT_A_DICT if isinstance(state, kinds)), "")


def _not_a_checkpoint(state: dict, rank: int):
    """A checkpoint holding a state (`{"dataloader_state_dict": state, ...}`) given whole: a
    ValueError naming the key to pass (it was "has field 'dataloader_state_dict'"); of one key a
    rank's ('loader_rank0', 'loader_rank1'), this `rank`'s: by its state's rank, else its name's
    last number, else every key."""
    held = [key for key, value in state.items()
            if isinstance(value, dict) and ("version" in value or {"pq_idx", "rg_idx"} <= set(value))]
    if len(held) > 1:
        by_rank = [key for key in held if state[key].get("rank") == rank]
        by_name = [key for key in held if re.search(rf"(?<!\d){rank}$", str(key))]
        held = by_rank if len(by_rank) == 1 else by_name if len(by_name) == 1 else held
    if len(held) == 1:
        raise ValueError(f"resume state is a checkpoint holding a loader state under {held[0]!r}: pass that "
                         f"state, resume_state=checkpoint[{held[0]!r}] (nanochat's drop-in: "
                         f"resume_state_dict=checkpoint[{held[0]!r}])")
    if held:
        raise ValueError(f"resume state is a checkpoint holding {len(held)} loader states (under "
                         f"{', '.join(map(repr, held))}): pass this rank's (rank {rank}) as resume_state= "
                         f"(nanochat's drop-in: resume_state_dict=)")


def check(state, identity: Loader, part: Part) -> Resume:
    """Validate `state` for this loader (`identity`, reading `part`'s data) and say where to
    start (see the module docstring)."""
    if not isinstance(state, dict):
        raise ValueError(f"resume state must be a dict, got {type(state).__name__}{_not_a_dict(state)}")
    if "version" not in state:
        _not_a_checkpoint(state, identity.rank)
        return part.unversioned(state, identity)
    part.own(state)
    version = state["version"]
    if type(version) is not int or version not in part.reads:
        raise ValueError(f"resume state field 'version' is {version!r}; this shmloader reads versions "
                         f"{' and '.join(map(str, part.reads))} of it{part.version_hint()}")
    batch = int_field(state, "batch")
    rank = int_field(state, "rank")
    shapes = _shapes(state, batch)
    fields = part.fields(state, identity)
    expected = part.digest(state)
    if state.get("digest") != expected:
        raise ValueError(f"resume state field 'digest' is {state.get('digest')!r}, but its fields give "
                         f"{expected!r}: the state was edited, or mixes the states of several ranks "
                         f"(torch.distributed.checkpoint keeps one value per key: save each rank's "
                         f"loader under a key of its own, e.g. f'loader_rank{{rank}}')")
    _check_config(state, identity)
    envelope = Envelope(version, rank, state.get("world_size"), batch, shapes, _reshaped(shapes, batch, identity))
    return part.resume(state, identity, envelope, fields)


def int_field(state: dict, name: str, lo: int = 0) -> int:
    """`state[name]`, an integer >= `lo`, else a ValueError naming it."""
    value = state.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"resume state field {name!r} must be an integer >= {lo}, got {value!r}")
    return value


def check_field(state: dict) -> int | None:
    """The state's `check` as an int (None when it has none, or its version predates it)."""
    text = state.get("check") if state["version"] >= 5 else None
    if text is None:
        return None
    if not isinstance(text, str) or len(text) != 8 or text.strip("0123456789abcdef"):
        raise ValueError(f"resume state field 'check' must be None or 8 lowercase hex digits, got {text!r}")
    return int(text, 16)


def plan_state(plan: Plan | None) -> dict | None:
    """A plan as a state holds it: `Plan.to_state` and a crc32 of it (`crc`), which the state's
    digest covers (so that a batch's digest need not read the whole plan)."""
    if plan is None:
        return None
    d = plan.to_state()
    d["crc"] = f"{zlib.crc32(json.dumps(d, sort_keys=True).encode()):08x}"
    return d


def plan_of_state(d, field: str) -> Plan:
    """The `Plan` a state holds (`plan_state`), checked against its crc; else a ValueError
    naming the state's `field`."""
    try:
        plan = Plan.from_state(d)
        body = {k: v for k, v in d.items() if k != "crc"}
        ok = (d.get("crc") == f"{zlib.crc32(json.dumps(body, sort_keys=True).encode()):08x}"
              and len(plan.positions) == plan.world and all(len(p) == 5 for p in plan.positions))
    except (KeyError, TypeError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise ValueError(f"resume state field {field!r} is malformed or edited (its crc does not match it)")
    return plan


def _shapes(state: dict, batch: int) -> list:
    shapes = state.get("shapes")
    ok = isinstance(shapes, list) and shapes and all(
        isinstance(s, list) and len(s) == 3 and all(type(v) is int for v in s) for s in shapes)
    if ok:
        firsts = [s[0] for s in shapes]
        ok = (firsts[0] == 0 and firsts == sorted(set(firsts)) and firsts[-1] <= batch
              and all(s[1] >= 1 and s[2] >= 1 for s in shapes))
    if not ok:
        raise ValueError(f"resume state field 'shapes' must list [first batch, B, T] from batch 0 "
                         f"on, in order, up to 'batch' {batch}; got {shapes!r}")
    return [list(s) for s in shapes]


def _reshaped(shapes: list, batch: int, loader: Loader) -> list:
    """The shapes with this loader's B and T from `batch` on; warns when they changed."""
    _, B, T = shapes[-1]
    if (B, T) == (loader.B, loader.T):
        return shapes
    changed = ", ".join(f"{n}: state has {old}, loader has {new}"
                        for n, old, new in (("B", B, loader.B), ("T", T, loader.T)) if old != new)
    warn(f"resume state was saved with another batch shape ({changed}): continuing from "
         f"the same place in the data with the new shape")
    if shapes[-1][0] == batch:
        shapes = shapes[:-1]
    return shapes + [[batch, loader.B, loader.T]]


def _check_config(state: dict, loader: Loader):
    saved = state.get("config")
    if not isinstance(saved, dict):
        raise ValueError(f"resume state field 'config' must be a dict, got {saved!r}")
    now = {**DATA_DEFAULTS, **ORDER_DEFAULTS, **loader.fingerprint}
    saved = {**DATA_DEFAULTS, **ORDER_DEFAULTS, **saved}
    diffs = [_config_diff(key, saved.get(key), value) for key, value in now.items() if saved.get(key) != value]
    diffs += [f"{key}: state has {saved[key]!r}, loader has none" for key in saved if key not in now]
    if diffs:
        raise ValueError("resume state does not match this loader: " + "; ".join(diffs))


DATA_DEFAULTS = {"column": "text", "format": "parquet"}  # a state without them was of these (Catalogue.fingerprint)
ORDER_DEFAULTS = {"shuffle": "off"}  # a state without it was read in the files' order (LoaderConfig.fingerprint)


def token_ids_refused() -> str:
    """Why a state of token ids without their marker (data/catalogue.py `TOKEN_IDS`: one
    source's config, a mixture's source's part, mixchecks.py) is refused, and what to do."""
    return ("token ids: the state was saved by a shmloader that gave token ids already beginning "
            "with BOS a second one ([BOS, BOS, ...], before December 2026); this one gives them none, "
            "so resuming would put every such document one token off. Start the run's loader without "
            "this state (a fresh pass over the data), or with its nanochat keys alone (one source: 'pq_idx', "
            "'rg_idx' and 'epoch', which resume at that row group as nanochat's loader does, not at the token), "
            "or finish the run with the shmloader that saved it")


def _config_diff(key: str, saved, now) -> str:
    if key == "tokenizer":
        return (f"tokenizer: the state was saved with another tokenizer (its vocabulary, merges, "
                f"special tokens or BOS differ; fingerprint {saved!r}, this loader's {now!r})")
    if key in TOKEN_IDS and saved is None:
        return token_ids_refused()
    if key in ORDER_DEFAULTS:
        return (f"shuffle: the state was saved with shuffle {saved!r}, this loader has shuffle {now!r} (pass "
                f"the shuffle=, seed= and shuffle_window= the state was saved with; a state saved before "
                f"the window is of shuffle_window=1)")
    if key in DATA_DEFAULTS:
        return (f"{key}: the state was saved reading {key} {saved!r}, this loader reads {now!r} (pass "
                f"{'column=' if key == 'column' else 'the data'} the state was saved with)")
    return f"{key}: state has {saved!r}, loader has {now!r}"
