"""Where a run starts: one record, `RunArgs.start` (protocol.py), read where the run's parts are
made: by the coordinator and its packing's modes (procs/coordinator.py, packing/), and in the
trainer by its room and children (procs/run.py, children.py), its head start (headstart.py)
and a count-only run's (locate.py). It is the run's counterpart of the trainer's
`state.Resume`, from which it is made (kinds.py `run_args`, a restart's `restarted`, a
count-only run's `Part.replay`: sourcestate.py, mixstate.py).

- `RunStart.position`: the canonical position of the run's first token (`Position`, its `skip`:
  tokens of its document the run drops; a mixture's: in the source that the next token is in,
  in the run's numbering of the files), and `batch`: the stream's batch count there (the run's
  batch 0: a mixture's schedule counts from it; a count-only run counts its replay from it).
- `RunStart.at`: what the loader's kind holds there, one of two records with the same
  answers, of the same type, where the coordinator and the runs ask it of either kind
  (`order_plans`: `{source: elastic.Plan}` or None, one source's under `ONE_SOURCE`;
  `docs_as_runs`: an int; `placed`: the names of the sources its start places, a frozenset;
  `with_firsts`: the start with the others' first positions, the coordinator's
  `_with_firsts`, one source's refusing any): one source's
  `SourceStart` (best fit's buffer, the elastic plan, the files' later order; its start places
  its one source) or a mixture's `MixStart` (its point, each source's plan, first unit and
  later order).
- `RunStart.locate`: None for a run that packs batches; a `CountTo` for a count-only run that
  finds the position at a batch count, its request (resume.py `_replay`, procs/locate.py,
  packing/mixcount.py).

So a reader of a run's start reads one field, and each variant is a named record: no tuple read
by index, no field that means one thing for one kind and another for the other.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

ONE_SOURCE = ""  # one source's key in `order_plans` (a mixture's source's name is never empty)


class CountTo(NamedTuple):
    """A count-only run's request: it replays the stream from the start's position (its batch
    count `RunStart.batch`) through the batch shapes `shapes` (`[first batch, B, T]` each, a
    state's `shapes`; a mixture's replay: one shape a run) and answers (`Located`) where the
    stream stands at batch count `until`. (Not `state.Locate`, a resume's step that asks for
    such a run.)"""
    shapes: list
    until: int


@dataclass(frozen=True)
class SourceStart:
    """One source's start beyond its position: best fit's resumed buffer there (`runs`, as
    `[epoch, file, rg, row, count]`), the elastic plan the run began with (`plan`:
    data/elastic.py `Plan`; None unless at a change of world size), and the files' order after
    the epoch it resumed in where it is not theirs (`later`: data/order.py `Later`, files added
    among the state's; None: theirs)."""
    runs: tuple = ()
    plan: object = None
    later: object = None

    @property
    def order_plans(self) -> dict | None:
        """The elastic plans the run's order reads (data/shuffle.py `Windows`), as a mixture's:
        `{ONE_SOURCE: plan}`; None without a plan."""
        return None if self.plan is None else {ONE_SOURCE: self.plan}

    @property
    def placed(self) -> frozenset:
        """The names of the sources whose start the run's start places: its one source
        (`ONE_SOURCE`), always: its position is where it begins (a fresh shuffled run's, its
        share's first window, found by the trainer: data/shuffle.py `FirstPositions`)."""
        return frozenset((ONE_SOURCE,))

    def with_firsts(self, firsts: dict) -> SourceStart:
        """This start: its one source is `placed`, so data/shuffle.py `Sourced.firsts` finds no
        other first position; a `firsts` that is not empty names a source this run does not
        read, and is refused (ValueError), not dropped."""
        if firsts:
            raise ValueError(f"one source's start places its source, yet first positions were found for "
                             f"{sorted(firsts)} (a mixture's, given to one source's run?)")
        return self

    @property
    def docs_as_runs(self) -> int:
        """The documents of the resumed buffer carried as runs (`runs`; a run each at most, in a
        slot's buffer area)."""
        return sum(count for _epoch, _file, _rg, _row, count in self.runs)


@dataclass(frozen=True)
class MixStart:
    """A mixture's start beyond its position: its `packing.mix.MixPoint` there as JSON (`point`,
    in the run's numbering of the files; None: every source from its start; best fit's buffer
    is in it), each source's `elastic.Plan` of a run that began at a change of world size
    (`plans`), where each source the point does not place begins (`firsts`: a shuffled run's,
    numbered within the source, data/shuffle.py `Sourced.firsts`, found by the coordinator;
    None: (1, 0, rank, 0)), and `{source: data.order.Later}` (`laters`, indices within it): a
    source resumed with files added among its own reads its files in their sorted order after
    the epoch it resumed in (data/sources.py; None: none)."""
    point: dict | None = None
    plans: dict | None = None
    firsts: dict | None = None
    laters: dict | None = None

    @property
    def order_plans(self) -> dict | None:
        """The elastic plans the run's order reads (data/shuffle.py `Windows`): each source's
        (`plans`)."""
        return self.plans

    @property
    def placed(self) -> frozenset:
        """The names of the sources whose start the run's start places: those its point places
        (its `sources`; none without a point)."""
        return frozenset((self.point or {}).get("sources") or ())

    def with_firsts(self, firsts: dict) -> MixStart:
        """This start with each source it does not place beginning at `firsts`' position."""
        return dataclasses.replace(self, firsts=firsts)

    @property
    def docs_as_runs(self) -> int:
        """0: no buffer is carried as runs (best fit's is in its point, kinds.py `text_runs`)."""
        return 0


@dataclass(frozen=True)
class RunStart:
    """Where a run starts (the module docstring): its `position`, the stream's batch count there
    (`batch`), its kind's start (`at`: `SourceStart` or `MixStart`) and, for a count-only run,
    what it finds (`locate`: a `CountTo`; None: a run that packs batches)."""
    position: object               # position.Position
    at: SourceStart | MixStart
    batch: int = 0
    locate: CountTo | None = None
