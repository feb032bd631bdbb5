"""nanochat's keys of a mixture, and a mixture of one source resumed from them as one source is.

- `of_mark`: a state's `epoch`, `pq_idx`, `rg_idx`. A mixture of one source says its source's,
  as sourcestate.py does (the row group its last batch's reading ended in, `Mark.read`, which
  a concat batch's announcement carries: packing/mixplace.py; best fit's, the position's; before
  any batch, the position's, or at a resume the state's: `read_of`), so they equal the source's
  own loader's at every batch (tests/loader/test_one_source_mixture_keys.py). Several sources
  say the position's: the document the next token is in, numbered within its source (their
  reading has no nanochat counterpart).
- `nanochat_state`: a state of nanochat's keys alone resumes a mixture of one source where one
  source resumes it (data/order.py `nanochat_position`: the next stride after its row group, in
  the source), its mixer fresh; the keys become the run's `origin` (`origin_point`: where each
  rank's stream began, which a replay of another rank's state starts from, mixstate.py).
- `approximately`: with `other_rank="nanochat"`, another rank's or world size's state of this
  one source (`of_one_source`) resumes a mixture of one source the same way from its keys, with
  a warning; a state of several sources resumes it exactly or is refused, as below.
Several sources refuse a state of nanochat's keys alone and ignore `other_rank` (exact).
"""
from __future__ import annotations

from . import state as statemod
from .data.mixture import Mixer
from .data.order import nanochat_position
from .errors import warn
from .packing.mix import MixPoint
from .position import Position, RowGroup
from .sourcestate import NANOCHAT_FIELDS, nanochat_keys


def of_mark(sources, mark, position: Position) -> tuple:
    """`(epoch, pq_idx, rg_idx)` at `mark` (`position`: its position, numbered within its source)."""
    if mark.read is not None and len(sources.names) == 1:
        return tuple(sources.local(Position(*mark.read)))[:3]
    return tuple(position[:3])


def read_of(sources, state: dict) -> RowGroup | None:
    """The row group (the run's numbering) a resumed run's states say before its first batch: a
    state of a mixture of one source and of this one, its keys; else None (the position's)."""
    if not of_one_source(sources, state):
        return None
    pq, rg, epoch = state_keys(sources, state)
    return RowGroup(*sources.to_run(sources.names[0], Position(epoch, pq, rg))[:3])


def of_one_source(sources, state: dict) -> bool:
    """Whether `state` is of a mixture of this loader's one source, and of it alone (its nanochat
    keys are then that source's; a state of several sources says where its next token is, in
    whichever source)."""
    return len(sources.names) == 1 and list(state["mixture"].get("sources") or ()) == list(sources.names)


def origin(sources, state: dict) -> dict | None:
    """A state's `origin`: None, or the nanochat keys a run of one source began from (checked)."""
    value = state.get("origin")
    if value is not None:
        if len(sources.names) != 1:
            raise ValueError("resume state field 'origin' is set (a run that began from nanochat's keys), and only a "
                             f"mixture of one source begins there: this loader's mixture has {len(sources.names)}; "
                             "resume with the state's one source")
        nanochat_keys(value, "origin", len(sources.source_files(sources.names[0])))
    return value


def state_keys(sources, state: dict) -> tuple:
    """`(pq_idx, rg_idx, epoch)`: a state's nanochat keys, checked against the one source's files."""
    return nanochat_keys({k: state.get(k) for k in NANOCHAT_FIELDS}, "state",
                         len(sources.source_files(sources.names[0])))


def nanochat_state(sources, state: dict, identity: statemod.Loader) -> statemod.Resume:
    """A state of nanochat's keys alone, resumed by a mixture of one source."""
    if identity.shuffled:
        raise ValueError("resume state with shuffle=True: a state of nanochat's keys alone (pq_idx, rg_idx, epoch) "
                         "names a row group of the files' order; resuming it shuffled is not built yet: resume it "
                         "without shuffle, or pass a state of a shuffled run")
    return _resume(sources, nanochat_keys(state, "state", len(sources.source_files(sources.names[0]))), identity)


def approximately(sources, state: dict, identity: statemod.Loader, envelope: statemod.Envelope) -> statemod.Resume:
    """Another rank's or world size's state of a mixture of one source, with `other_rank="nanochat"`."""
    warn(f"resume state was saved by rank {envelope.rank} of {envelope.world}, this is rank {identity.rank} of "
         f"{identity.world}: resuming as nanochat does (its file and row group, this rank's next stride), not "
         "exactly (other_rank='nanochat')")
    return _resume(sources, state_keys(sources, state), identity)


def _resume(sources, keys: tuple, identity: statemod.Loader) -> statemod.Resume:
    """From nanochat's keys `(pq_idx, rg_idx, epoch)`, which become the run's `origin`."""
    pq, rg, epoch = keys
    sources.reorder({}, {})  # nanochat's keys number the files in their sorted order, whatever a resume left
    start = {"pq_idx": pq, "rg_idx": rg, "epoch": epoch}
    point = origin_point(sources, start, identity.rank, identity.world)
    return statemod.Resume(sources.to_run(point.source, point.sources[point.source]), statemod.AtMix(point.to_json()),
                           shapes=[[0, identity.B, identity.T]], origin=start, n_files=len(identity.files))


def origin_point(sources, start: dict, rank: int, world: int) -> MixPoint:
    """Where rank `rank` of `world` of a mixture of one source begins from nanochat's keys `start`
    (data/order.py `nanochat_position`, in the source), its mixer fresh."""
    name = sources.names[0]
    position = nanochat_position(start["pq_idx"], start["rg_idx"], start.get("epoch", 1), rank, world)
    return MixPoint(name, 0, {name: position}, Mixer(sources.mixture, 0).state())


def check_row_group(sources, start: dict):
    """A state of nanochat's keys: its row group is one of its file's (the file's footer says)."""
    name, pq, rg = sources.names[0], start["pq_idx"], start["rg_idx"]
    n = len(sources.catalogues[name].row_counts(pq))
    if rg >= n:
        raise ValueError(f"resume state field 'rg_idx' is {rg}, but file {pq} of mixture source {name!r} (its "
                         f"'pq_idx') has {n} row groups: the state is not of these files")
