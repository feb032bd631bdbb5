"""Where a loader starts from a state: one call, `plan`, from (the state, the loader's
catalogue and settings) to a `state.Resume` whose position the next run starts at.

1. `state.check` validates the state against this loader (its envelope, then the part of what
   the loader reads: sourcestate.py, mixstate.py), naming each difference in words,
   and says what kind it is: this rank's own (its position), another rank's of the same world
   size (`locate`), one of another world size (`change`), or nanochat's own (where nanochat
   resumes; it becomes the run's `origin`).
2. The catalogue takes the order of the epoch in progress (files added since the save are read
   after the saved ones, and in their sorted place from the next epoch on) and the footers the
   state knows.
3. Another world size: every old rank's position (the state's own rank's from the state, every
   other one by a count-only replay of its stream up to the batch count) makes the elastic
   plan (data/elastic.py); this rank starts at its first unit with its share of the old
   best-fit buffers (`_plan_start`).
4. Another rank's state: this rank's own position at the state's batch count, by a count-only
   run (packing/count.py) over the files the state was saved with; a run that began elastic
   replays from its plan's start. So every rank resumes exactly from rank 0's state.

A count-only run is started and stopped like a loader's run (procs/children.py
`locate_position`, procs/locate.py) and raises if no word comes for `timeout`. Its progress (done of total
batches, the rate, the time left: progress.py) is labelled with whose stream it replays ("rank
2 of 3 (new): replaying old rank 1 of 2's stream to batch 40") and shows at the default log
level from one rank, the lowest that replays (`_shows`), at INFO from the others.

`check_first` is the other half of the resume check: a resumed loader's first batch must have
the check the state carries (`Ahead` takes it, and the batch a state looks ahead at).
"""
import dataclasses
import json
import logging
import os
import time

from . import mixstate, progress, sourcestate, state as statemod
from .data import elastic, mixelastic
from .data import shuffle as shufflemod
from .errors import DataError
from .position import Position
from .procs.locate import locate_position
from .ipc.ring import RingLayout

log = logging.getLogger("shmloader")


def plan(state, identity: statemod.Loader, part, catalogue, config, args, heal=None) -> statemod.Resume:
    """The `Resume` of `state` for this loader (`identity`: what the state is checked against;
    `part`: its part of a state, sourcestate.Files;
    `args`: the loader's `RunArgs`, for count-only runs; `heal(lost, paths)`: a count-only run's
    lost child, healed within the loader's budget: procs/run.py). Raises `ValueError` naming
    what does not match."""
    resume = statemod.check(state, identity, part)
    if resume.origin is not None and "version" not in state:
        _check_row_group(resume.origin, catalogue)
    catalogue.reorder(resume.order)
    args = dataclasses.replace(args, files=catalogue.paths)
    if resume.change is not None:
        resume = _elastic(resume, catalogue, config, args, heal)
    elif resume.locate and resume.plan is not None:  # another rank's state of a run that began elastic
        resume = _plan_start(resume, resume.plan, catalogue, config, args.rank, args.world)
    if resume.locate:
        resume = _locate(resume, config, args, heal, shows=_shows(state, args))
    if state.get("version", 2) > 2:  # version 2 has no footers; nanochat's states no files
        catalogue.with_footers(state["files"])
    return resume


def plan_mixture(state, identity: statemod.Loader, part, sources, config, args, heal=None) -> statemod.Resume:
    """`plan` for a mixture's loader (`sources`: its `data.sources.Sources`; `part`: its part of a
    state, mixstate.Mixed): every source's place."""
    resume = statemod.check(state, identity, part)
    sources.with_footers(state["mixture"]["sources"])
    if resume.change is not None:  # another world size's: every old rank's place, each source's plan
        resume = _elastic_mix(resume, sources, config, args, heal)
    elif resume.locate:  # another rank's: this rank's place at its batch count, replayed
        position, point = _locate_mix(resume, sources, config, args, heal, args.rank, args.world,
                                      _shows(state, args))
        resume = dataclasses.replace(resume, position=position, mix=point, locate=False)
    return resume


class Mismatch(ValueError):
    """A resumed run's first batch is not the one its state was saved before (`check_first`)."""


class Ahead:
    """The next batch's announcement, taken before `next()` returns it: by `state_dict()`, whose
    state carries that batch's check (`peek`); and a resumed run's first one, checked against
    its state's (`check_first`). Holds the runs, never the loader."""

    def __init__(self, runs, config, catalogue):
        self._runs, self._timeout, self._catalogue = runs, config.timeout, catalogue
        self._skipping = config.on_bad_row_group == "skip"
        self.begin(None)

    def begin(self, verify: int | None):
        """A run starts; `verify`: the check its first batch must have, if known."""
        self._ahead, self._failed, self._verify = None, None, verify

    def take(self, mark):
        """The next batch's announcement: the one `peek` took, else the run's next (what `peek`
        met is raised here); the first one of a resumed run checked (a `Mismatch`)."""
        if (got := self._ahead) is not None:
            self._ahead = None
            return got
        if self._failed is None and self._verify is None:  # every batch's path
            return self._runs.take(mark, self._timeout)
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        ann = self._runs.take(mark, self._timeout)
        expected, self._verify = self._verify, None
        check_first(ann.check, expected, mark, self._catalogue.paths[mark.position.file], self._skipping)
        return ann

    def peek(self, mark):
        """The next batch's announcement, taken and kept for `take`; None where it cannot be had
        (what it raised is `take`'s to raise)."""
        try:
            self._ahead = self.take(mark)
        except Exception as exc:  # noqa: BLE001
            self._failed = exc.with_traceback(None)
            return None
        return self._ahead


def check_first(check: int, expected: int, mark, path: str, skipping: bool):
    """The first batch of a resumed run, at `mark` (in file `path`), has `check`; the state said
    `expected`: a difference is a `Mismatch` (a ValueError) naming the batch and its position."""
    if check == expected:
        return
    p = mark.position
    at = (f"batch {mark.batch} (epoch {p.epoch}, {os.path.basename(path)}, row group {p.rg}, document {p.doc}"
          + (f", token {p.skip}" if p.skip else "") + ")")
    also = ("; with on_bad_row_group='skip', a row group skipped as bad in the saved run and readable now (or the "
            "other way round) changes it too" if skipping else "")
    raise Mismatch(
        f"resume check: the batch this loader resumed at, {at}, is not the one the state was saved before "
        f"(its check is {check:08x}, the state's 'check' is {expected:08x}): the data at or after that position "
        f"differs from the run's although the files' names and sizes (and footers, where the state has them) "
        f"match, e.g. a file replaced by another of the same name and size, or a tokenizer that encodes "
        f"differently under the same name{also}; resume with the data and tokenizer the run used, or start "
        f"a new run. This loader is closed")


def _check_row_group(origin: dict, catalogue):
    """A nanochat state's row group must be one of its file's (the file's footer says)."""
    f, rg = origin["pq_idx"], origin["rg_idx"]
    n = len(catalogue.row_counts(f))
    if rg >= n:
        raise ValueError(f"resume state field 'rg_idx' is {rg}, but {catalogue.paths[f]} (its 'pq_idx' "
                         f"{f}) has {n} row groups: the state is not of these files")


def _locate(resume: statemod.Resume, config, args, heal, rank: int | None = None, world: int | None = None,
            shows: bool = False) -> statemod.Resume:
    """The position at `resume.batch` of this rank (or of `rank` of `world`: an old rank at a
    change of world size), by replaying the run over its document lengths (the token cache's,
    or counted by the workers), from the files the state was saved with; a run that began
    elastic replays from its plan's batch count."""
    rank, world = (args.rank, args.world) if rank is None else (rank, world)
    layout = RingLayout(2, 1, config.num_workers)
    first = resume.plan.batch if resume.plan is not None else 0
    count = dataclasses.replace(args, files=args.files[:resume.n_files], rank=rank, world=world, layout=layout,
                                start=resume.position, buffer_runs=tuple(map(tuple, resume.runs)),
                                locate=(resume.shapes, resume.batch, first), later=None, plan=resume.plan,
                                plans=resume.plan)
    found = _counted(config, layout, count, heal, args, resume.batch - first, resume.batch, shows)
    return dataclasses.replace(resume, position=Position(*found.position), runs=found.runs, locate=False)


def _counted(config, layout, count, heal, args, total: int, batch: int, shows: bool):
    """A count-only run (`count`: its args) to `batch`, `total` batches of replay, its progress
    shown (progress.py) under a label that says whose stream it replays; at the default log level
    when `shows`, else at INFO."""
    if (count.rank, count.world) == (args.rank, args.world):
        label = f"rank {args.rank} of {args.world}: finding its place at batch {batch} of another rank's state"
    else:
        label = (f"rank {args.rank} of {args.world} (new): replaying old rank {count.rank} of {count.world}'s "
                 f"stream to batch {batch}")
    report = progress.Report(label, total, "batches", time.monotonic(), progress.log_emitter(log, shows), bar=shows)
    try:
        found = locate_position(config, layout, count, heal, report.update)
    except BaseException:
        report.close()
        raise
    where = "the mixture ended first" if found.position is None else "at " + _where(Position(*found.position))
    report.finish(time.monotonic(), f"{where} (row groups from the token cache: {found.cached}, "
                                    f"counted: {found.tokenized}, with {config.num_workers} "
                                    f"worker{'s' if config.num_workers != 1 else ''})")
    return found


def _shows(state: dict, args) -> bool:
    """Whether this rank's replay of its own place shows its progress at the default log level:
    the lowest rank that replays does (rank 1 when the state is rank 0's, nanochat's way, since
    the state's own rank replays nothing); the others, at INFO. At a change of world size every
    new rank replays the old ranks, and new rank 0 shows."""
    return args.rank == (1 if state.get("rank", 0) == 0 else 0)


def _where(p: Position) -> str:
    return (f"epoch {p.epoch}, file {p.file}, row group {p.rg}, document {p.doc}"
            + (f", token {p.skip}" if p.skip else ""))


def _locate_mix(resume: statemod.Resume, catalogue, config, args, heal, rank: int, world: int,
                shows: bool) -> tuple:
    """`(position, point)`: where rank `rank` of `world`'s mix stands at `resume.batch` (its
    `MixPoint` as the state's JSON), by replaying its mixed stream from the run's start over its
    own document lengths (packing/mixcount.py)."""
    layout = RingLayout(2, 1, config.num_workers)
    start = statemod.start_position(rank)
    mix = mixstate.run_args(catalogue, statemod.Resume(start))._replace(plans=None)
    count = dataclasses.replace(args, files=catalogue.paths, layout=layout, start=start, mixture=mix, rank=rank,
                                world=world, locate=(resume.shapes[:1], resume.batch, 0))
    found = _counted(config, layout, count, heal, args, resume.batch, resume.batch, shows)
    if found.position is None:
        raise DataError(f"rank {rank} of {world}: the mixture ended before batch {resume.batch} of the state: "
                        f"{found.runs}")
    return Position(*found.position), json.loads(found.runs)


def _elastic_mix(resume: statemod.Resume, catalogue, config, args, heal) -> statemod.Resume:
    """A mixture's state saved at another world size W: every old rank's point (the state's
    own, the others replayed), then for each source the elastic plan of its files from the old
    ranks' places in it (data/elastic.py: what they had not consumed, shared out over the new
    ranks; shuffled, in each source's own order: `_shuffles`); this rank starts every source at
    its first unit (a cut document's tokens before its place dropped, `"skips"`), with a mixer
    whose counting stage begins at the change and whose totals are the old ranks' together."""
    change, batch = resume.change, resume.batch
    log.warning("rank %d of %d: resuming a mixture's state saved at world_size %d (batch %d): finding where %s "
                "stood in every source, replaying %s", args.rank, args.world, change.world, batch,
                _old_ranks(change.world), _replays(change.world))
    points = [resume.mix if r == change.rank else
              _locate_mix(resume, catalogue, config, args, heal, r, change.world, args.rank == 0)[1]
              for r in range(change.world)]
    start = mixelastic.plan(points, catalogue.mixture, batch, args.rank, args.world,
                            lambda name: lambda f: catalogue.catalogues[name].row_counts(f, config.on_bad_row_group),
                            lambda name: len(catalogue.catalogues[name].paths), _shuffles(catalogue, config, args))
    log.warning("rank %d of %d: every source's rest of its epoch in progress is shared out over %s",
                args.rank, args.world, _new_ranks(args.world))
    first = start.point["source"]
    position = Position(*start.point["sources"][first], start.point["skips"].get(first, 0))
    return dataclasses.replace(resume, position=catalogue.to_run(first, position), mix=start.point,
                               mix_plans=start.plans, change=None, locate=False, check=None)


def _shuffles(catalogue, config, args) -> dict | None:
    """`{name: Shuffle}`: each source's shuffled order as its run reads it (`shuffle.of_run`), or
    None (the files' order)."""
    mix = mixstate.run_args(catalogue, statemod.Resume(statemod.start_position(args.rank)))
    order = shufflemod.of_run(config, dataclasses.replace(args, mixture=mix))
    return None if order is None else dict(zip(order.names, order.orders))


def _elastic(resume: statemod.Resume, catalogue, config, args, heal) -> statemod.Resume:
    """A state saved at another world size W (`resume.change`): find where every old rank
    stood at its batch count, make the plan that shares out what they had not consumed, and
    start this rank at its first unit, with its share of the old ranks' best-fit buffers."""
    change = resume.change
    log.warning("rank %d of %d: resuming a state saved at world_size %d (batch %d): finding where %s stood, "
                "replaying %s%s", args.rank, args.world, change.world, resume.batch, _old_ranks(change.world),
                _replays(change.world), "" if config.cache_dir else " (tokenized afresh: tools/pretokenize.py "
                "and cache_dir make it fast)")
    began = time.monotonic()
    positions, buffers = [], []
    for r in range(change.world):
        if r == change.rank:
            position, runs = change.position, change.runs
        else:
            old = dataclasses.replace(resume, position=_origin(resume, catalogue, config, r, change.world),
                                      runs=[], change=None, locate=True, plan=change.parent)
            if change.parent is not None:  # the old run began at a change too: r's stream of its plan
                old = _plan_start(old, change.parent, catalogue, config, r, change.world)
            found = _locate(old, config, args, heal, r, change.world, shows=args.rank == 0)
            position, runs = found.position, found.runs
        positions.append(tuple(position))
        buffers.append(runs)
    buffered = config.spec.buffered
    plan = elastic.Plan.of(change.world, resume.batch, positions, buffers if buffered else (), change.parent)
    log.warning("rank %d of %d: the old ranks' positions found in %.1f s; the rest of epoch%s %s is shared "
                "out over %s", args.rank, args.world, time.monotonic() - began,
                "s up to" if plan.epoch > min(p[0] for p in positions) else "", plan.epoch, _new_ranks(args.world))
    resume = dataclasses.replace(resume, change=None, locate=False)
    return _plan_start(resume, plan, catalogue, config, args.rank, args.world)


def _origin(resume: statemod.Resume, catalogue, config, rank: int, world: int) -> Position:
    """Where old rank `rank` of `world`'s stream began: `sourcestate.origin_position`, or a shuffled
    stream's share's first unit (data/shuffle.py)."""
    if config.order is None:
        return sourcestate.origin_position(resume.origin, rank, world)
    return shufflemod.first_position(config.order, lambda f: catalogue.row_counts(f, config.on_bad_row_group),
                                     resume.n_files, rank, world)


def _old_ranks(world: int) -> str:
    return "the old rank" if world == 1 else f"each of the {world} old ranks"


def _new_ranks(world: int) -> str:
    return "the 1 new rank" if world == 1 else f"the {world} new ranks"


def _replays(world: int) -> str:
    """What a change of world size replays: every old rank's stream but the state's own."""
    return ("no stream (the state is the only old rank's)" if world == 1 else
            "1 old rank's stream" if world == 2 else f"{world - 1} old ranks' streams")


def _plan_start(resume: statemod.Resume, plan, catalogue, config, rank: int, world: int) -> statemod.Resume:
    """`resume` from where `rank` of `world`'s stream of `plan` begins: its first unit and its
    share of the old buffers (at the plan's batch count)."""
    n_files = resume.n_files

    def row_counts(f: int) -> list:  # as the coordinator reads them (a bad file: none)
        return catalogue.row_counts(f, config.on_bad_row_group)

    position = elastic.start(plan, rank, world, row_counts, n_files, shuffle=config.order)
    runs = elastic.buffer(plan, rank, world) if config.spec.buffered else []
    return dataclasses.replace(resume, position=position, runs=runs, plan=plan)

