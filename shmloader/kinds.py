"""What a loader reads, decided once: one source, or a `Mixture` of several (`of`, the one place
in the training process's front that asks which). Each kind answers for itself what the front
used to branch on:

- `catalogue`: its files (`data.catalogue.Catalogue`, or `data.sources.Sources` of every source);
- `refuse(config)`: what it does not do yet with these settings, as a ValueError;
- `check_units(config, rank, world)`: a rank without a unit of its data (of a source of a
  mixture that can be drawn) refused when the loader is made (data/units.py), not at the first
  `next()` by the coordinator; one source's rank whose units the footers say hold no document
  too (a mixture's source is the mix's to judge: it may not be needed before the run ends);
- `shuffled(config)`: whether any of its data is read shuffled (the loader's `shuffle=`, or a
  mixture's source's own `Source(shuffle=)`);
- `first_positions(config)`: where a fresh shuffled stream begins (`shuffle.FirstPositions`,
  read in the training process), or None (the files' order; a mixture: each source's, found by
  its run's coordinator, procs/coordinator.py `_with_firsts`);
- `part`: its part of a state, which the one `state.Writer` writes, `state.check` reads (a state
  of the other kind refused naming both) and the one resume plan (resume.py `plan`) resumes
  with: what differs in a resume (the files the state's run read, a count-only replay's
  `RunArgs` and its answer, the elastic plan from the old ranks' places) is the part's
  (`sourcestate.Files`, or `mixstate.Mixed`);
- `run_args(resume)`: what a run starting at `resume` is given, as `RunArgs` fields: its start
  (`start`, one `ipc.runstart.RunStart`: the position, the batch count, and what its kind holds
  there, from `Resume.at`: `state.AtSource` into a `SourceStart`, best fit's buffer, the elastic
  plan and the catalogue's later order; `state.AtMix` into a `MixStart`, the point, each source's
  plan and later order), and a mixture's `MixArgs` (its sources and rules);
- `run_fields(config)`: what every run's `RunArgs` carries of the kind: the coordinator's
  modes (`modes`: the packing's and its count-only mode, or the mixture's), the files a
  process keeps open (`keep_open`) and how its shuffled order is made (`order_of`: one
  source's `shuffle.one_source`, a mixture's `mixrules.order`; both a `shuffle.Sourced`);
- `slot_buffer(config)`, `text_runs(args, config)`, `restarted(args, mark)`: for the runs
  (procs/run.py `Runs`): how a batch's slot's text for its state is copied out (best fit's
  buffer, a mixture's point, packed by concat: `mixstate.slot_point`), or None where it carries
  none, the room that text needs beyond the packing's (in 80-byte runs), and a
  run's arguments to start again at `mark` (a heal, an idle release);
- `start_mark(resume, spec, docs)`: the `Mark` at a start, its buffer the kind's
  (`start_buffer`: best fit's runs as text, or a mixture's point);
- `fresh()`: what it holds at a fresh start (`Resume.at`, empty);
- `stats(mark, seen)`: what it adds to `stats()` (a mixture: `sources`, and the furthest epoch);
- and alike for both, from the catalogue and the part: `identity(...)`, what a state is checked
  against, `args(...)`, what every run is given, and `resume(state, ...)`, the resume plan.

So no module outside the mixing stage asks which: the processes run the modes they are given
(a mixture's read `RunArgs.mixture`, its `MixArgs`). docs/design.md "Mixtures" says what is
left of the two pipelines.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Callable, NamedTuple

from . import mixstate, resume as resumemod, sourcestate, state as statemod
from .data import mixrules, shuffle as shufflemod, units
from .data.catalogue import Catalogue
from .data.mixture import Mixture
from .data.source import KEEP_OPEN, FilesystemRef
from .errors import DataError
from .ipc.protocol import RunArgs
from .ipc.runstart import MixStart, RunStart, SourceStart
from .data.sources import Sources, keep_open
from .packing import MODES
from .packing.mixcount import MixCountMode, SourceCountMode
from .packing.runs import BufferText, decode_runs, encode_buffer
from .procs.run import Mark, mix_text_bytes


class _Kind:
    """What both kinds answer alike, from their catalogue."""

    def identity(self, config, tokenizer, rank: int, world: int, first) -> statemod.Loader:
        """What a state is checked against, now (`first`: `first_positions`'s)."""
        cat = self.catalogue
        fingerprint = config.fingerprint(tokenizer.fingerprint, self.shuffled(config)) | cat.fingerprint()
        return statemod.Loader(fingerprint, cat.files, rank, world, config.B, config.T, config.spec.buffered,
                               config.other_rank, footers=cat.footers, val=cat.val, first=first,
                               shuffled_sources=self.shuffled_sources(config))

    def shuffled_sources(self, config) -> frozenset:
        """A mixture's sources read shuffled (none for one source: `shuffled` says)."""
        return frozenset()

    def args(self, config, tokenizer, rank: int, world: int, first) -> RunArgs:
        """What every run of the loader is given (a run's start is added: `run_args`)."""
        cat = self.catalogue
        return RunArgs(files=cat.paths, rank=rank, world=world, layout=None,
                       filesystem=FilesystemRef(cat.filesystem) if cat.filesystem else None, tokenizer=tokenizer,
                       columns=None if set(cat.columns) <= {"text"} else tuple(cat.columns),
                       counts=None if first is None else first.counts, **self.run_fields(config))

    def start_mark(self, resume: statemod.Resume, spec, docs: int) -> Mark:
        """The progress mark a run from `resume` starts at (`docs`: the documents delivered before;
        a mixture's place travels as best fit's buffer does)."""
        return Mark(resume.batch, resume.position, self.start_buffer(resume, spec), docs, resume.read)

    def restarted(self, args, mark):
        """`args` starting again at `mark` (a heal, an idle release): its position and batch count,
        its kind's start there from the mark's buffer (`restarted_at`)."""
        start = args.start
        return dataclasses.replace(args, start=dataclasses.replace(
            start, position=mark.position, batch=mark.batch, at=self.restarted_at(start.at, mark)))

    def resume(self, state, identity, config, args, heal=None) -> statemod.Resume:
        """`state` checked and planned into a `state.Resume` (resume.py `plan`, with the part)."""
        return resumemod.plan(state, identity, self.part, self.catalogue, config, args, heal)


class OneSource(_Kind):
    """One source: a directory, files, a glob, a URI or a `source.Source`."""

    def __init__(self, data, split: str, filesystem, column: str):
        self.catalogue = Catalogue(data, split, filesystem, column)
        self.part = sourcestate.Files(self.catalogue)

    def refuse(self, config):
        if (why := shufflemod.refusal(config)) is not None:
            raise ValueError(why)

    def shuffled(self, config) -> bool:
        return config.shuffle

    def check_units(self, config, rank: int, world: int):
        footers, n = _footers(self.catalogue), len(self.catalogue.paths)
        if config.order is None:  # shuffled: `first_positions` reads every footer and says so
            units.check(footers.units, n, rank, world, False)
        units.check_documents(footers.may_hold, n, rank, world, config.order is not None)

    def first_positions(self, config):
        cat = self.catalogue
        return (None if config.order is None else
                shufflemod.FirstPositions(config.order, functools.partial(cat.row_counts, on_bad=config.on_bad_row_group),
                                          len(cat.paths), 8 if cat.filesystem is not None else 1))
        # threads for a remote filesystem's footers; local ones read 4x faster alone (16 files: 2 ms, 8 ms with 8)

    def fresh(self) -> statemod.AtSource:
        return statemod.AtSource()

    def run_args(self, resume: statemod.Resume) -> dict:
        at = SourceStart(tuple(map(tuple, resume.at.runs)), resume.at.plan, self.catalogue.later)
        return {"start": RunStart(resume.position, at, resume.batch)}

    def start_buffer(self, resume: statemod.Resume, spec):
        return encode_buffer(resume.at.runs) if spec.buffered else None

    def run_fields(self, config) -> dict:
        return {"modes": (MODES[config.packing].source, SourceCountMode), "keep_open": KEEP_OPEN,
                "order_of": shufflemod.one_source}

    def slot_buffer(self, config):
        return _buffer_text if config.spec.buffered else None

    def text_runs(self, args, config) -> int:
        return 0

    def restarted_at(self, at: SourceStart, mark) -> SourceStart:
        """Best fit's buffer at `mark` (its plan and later order stay the run's)."""
        runs = decode_runs(mark.buffer.text).tolist() if mark.buffer is not None else []
        return dataclasses.replace(at, runs=tuple(map(tuple, runs)))

    def stats(self, mark, seen: dict | None, epoch: int) -> dict:
        return {}


class Mixed(_Kind):
    """A `Mixture`: several sources by weight (data/mixture.py, mixstate.py)."""

    def __init__(self, data: Mixture, split: str, filesystem, column: str):
        self.catalogue = Sources(data, split, filesystem, column)
        self.part = mixstate.Mixed(self.catalogue)

    def refuse(self, config):
        mixstate.refuse(config)
        if (why := shufflemod.refusal(config)) is not None:
            raise ValueError(why)

    def shuffled(self, config) -> bool:
        """Whether any source is read shuffled (`shuffled_sources`)."""
        return bool(self.shuffled_sources(config))

    def shuffled_sources(self, config) -> frozenset:
        """The sources read shuffled: their own `Source(shuffle=)`, else the loader's `shuffle=`."""
        return frozenset(name for name in self.catalogue.names
                         if shufflemod.source_shuffled(self.catalogue.mixture, name, config.shuffle))

    def first_positions(self, config):
        return None

    def check_units(self, config, rank: int, world: int):
        """Every source that a stage weighs, in its own order, named as the coordinator names it."""
        mix = self.catalogue.mixture
        for name, cat in self.catalogue.catalogues.items():
            if not any(stage.weights[name] > 0 for stage in mix.stages):
                continue  # never drawn under this mixture
            try:
                units.check(_footers(cat).units, len(cat.paths), rank, world,
                            shufflemod.source_shuffled(mix, name, config.shuffle))
            except DataError as e:
                raise DataError(f"mixture source {name!r}: {e}") from None

    def fresh(self) -> statemod.AtMix:
        return statemod.AtMix()

    def run_args(self, resume: statemod.Resume) -> dict:
        mix, at = mixstate.run_args(self.catalogue, resume.at)
        return {"mixture": mix, "start": RunStart(resume.position, at, resume.batch)}

    def start_buffer(self, resume: statemod.Resume, spec):
        return mixstate.point_text(resume.at.point)

    def run_fields(self, config) -> dict:
        return {"modes": (MODES[config.packing].mixture, MixCountMode),
                "keep_open": keep_open(len(self.catalogue.ranges)), "order_of": mixrules.order}

    def slot_buffer(self, config):
        return mixstate.slot_point  # its place (and best fit's buffer)

    def text_runs(self, args, config) -> int:
        return mix_text_bytes(args.mixture, args.start.at, config.max_runs) // 80 + 1

    def restarted_at(self, at: MixStart, mark) -> MixStart:
        """Every source from its place at `mark` (the mixer from its counts there: `RunStart.batch`)."""
        point = json.loads(mark.buffer.text) if mark.buffer is not None else None
        return dataclasses.replace(at, point=point)

    def stats(self, mark, seen: dict | None, epoch: int) -> dict:
        """`sources` ("share_recent": since `seen`, the caller's last call's) and the furthest
        source's epoch (`epoch`, the loader's, while none is known)."""
        sources = mixstate.source_stats(mark, seen)
        return {"sources": sources, "epoch": max((s["epoch"] for s in sources.values()), default=epoch)}


class _Footers(NamedTuple):
    """What data/units.py asks of a catalogue's files, each file opened once: `units(f, enough)`
    (`source.Reader.units`) and `may_hold(f)` (`source.Reader.may_hold`), None where the file
    cannot be read (the coordinator says what is wrong with it)."""
    units: Callable[[int, int], "int | None"]
    may_hold: Callable[[int], "list | None"]


def _footers(catalogue) -> _Footers:
    reader = catalogue.reader()

    def or_none(ask):
        def asked(*args):
            try:
                return ask(*args)
            except (DataError, OSError):
                return None
        return asked
    return _Footers(or_none(reader.units), or_none(reader.may_hold))


def _buffer_text(ring, slot: int) -> BufferText:
    """A buffered packing's buffer text in `slot`, copied out."""
    return tuple.__new__(BufferText, ring.buffer_of(slot))  # no Python frame: hot path


def of(data, split: str, filesystem=None, column: str = "text"):
    """The kind of `data`, its catalogue made (errors naming the data, or the mixture's source)."""
    return (Mixed if isinstance(data, Mixture) else OneSource)(data, split, filesystem, column)
