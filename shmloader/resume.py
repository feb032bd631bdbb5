"""Where a loader starts from a state: one call, `plan`, from (the state, the loader's
catalogue and settings) to a `state.Resume` whose position the next run starts at, the same
flow for one source and a mixture: what differs between them is the part's (`Part`:
sourcestate.Files, mixstate.Mixed), and this module names neither.

1. `state.check` validates the state against this loader (its envelope, then the part of what
   the loader reads), naming each difference in words, and says what is left to do
   (`Resume.step`): nothing (`Exact`: this rank's own state, or nanochat's own, where nanochat
   resumes, which becomes the run's `origin`), a replay (`Locate`: another rank's of the same
   world size), or a plan (`Change`: a state of another world size); `plan` dispatches on it once.
2. The catalogue reads as the state's run did (`Part.take_files`): one source's files in the
   order of the epoch in progress (files added since the save after the saved ones, in their
   sorted place from the next epoch on), and the footers the state knows.
3. Another world size (`_elastic`): every old rank's place (`Part.old_rank`: the state's own
   rank's from the state, every other one by a count-only replay of its stream up to the batch
   count) makes the elastic plan (`Part.shared`: data/elastic.py, a mixture's per source
   data/mixelastic.py), and this rank starts at its first unit.
4. Another rank's state (`_replay`): this rank's own place at the state's batch count, by a
   count-only run (`Part.replay`: its `RunArgs`, packing/mixcount.py; its
   answer read by `Part.replayed`, which may ask for another from there: a mixture's replay is
   one run a batch shape) over the files the state was saved with; a run that began elastic
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
import logging
import time
from typing import Protocol

from . import progress, state as statemod
from .data import formats
from .errors import DataError
from .ipc.protocol import RunArgs
from .position import Position
from .procs.locate import locate_position
from .ipc.ring import RingLayout

log = logging.getLogger("shmloader")


class Part(statemod.Part, Protocol):
    """A state's part as `plan` resumes with it: `state.Part`, and the steps of a resume that
    differ with what the loader reads (sourcestate.Files, mixstate.Mixed), over its catalogue."""

    def take_files(self, state: dict, resume: statemod.Resume) -> None:
        """The catalogue reads the files as the checked `state`'s run did (their order, the
        footers it knows)."""

    def replay(self, resume: statemod.Resume, args: RunArgs, config) -> RunArgs:
        """The count-only run that finds where rank `args.rank` of `args.world` stands at
        `resume.batch` (`args`: the loader's, with that rank, world and layout); its start's batch
        count (`RunStart.batch`) is where its replay's count of batches begins, its `CountTo`'s
        `until` where it ends."""

    def replayed(self, resume: statemod.Resume, found) -> statemod.Resume:
        """`resume` at the place a replay found (`found`: its `Located`, with a position); with
        its step still a `Locate`, not there yet: `replay` is asked again from it (one step a
        batch shape, a mixture's)."""

    def old_rank(self, resume: statemod.Resume, rank: int, config) -> statemod.Resume:
        """Old rank `rank`'s place at a change of world size (`resume.step`, a `Change`): the
        state's own rank's, from the state (`Exact`); any other's stream from its start, to
        replay (`Locate`)."""

    def shared(self, resume: statemod.Resume, places: list, config, args: RunArgs) -> tuple:
        """`(resume, words)`: the elastic plan made from every old rank's place (`places`, old
        rank order), where rank `args.rank` of `args.world` starts in it, and what it shares out
        (words for the log)."""


def plan(state, identity: statemod.Loader, part: Part, catalogue, config, args, heal=None) -> statemod.Resume:
    """The `Resume` of `state` for this loader (`identity`: what the state is checked against;
    `part`: its part of a state, over `catalogue`; `args`: the loader's `RunArgs`, for
    count-only runs; `heal(lost, paths)`: a count-only run's lost child, healed within the
    loader's budget: procs/run.py). Raises `ValueError` naming what does not match."""
    resume = statemod.check(state, identity, part)
    part.take_files(state, resume)
    args = dataclasses.replace(args, files=catalogue.paths)
    match resume.step:
        case statemod.Change():
            return _elastic(resume, part, config, args, heal)
        case statemod.Locate():
            return _replay(resume, part, config, args, heal, args.rank, args.world, _shows(state, args))
    return resume


class Mismatch(ValueError):
    """A resumed run's first batch is not the one its state was saved before (`check_first`)."""


class Ahead:
    """The next batch's announcement, taken before `next()` returns it: by `state_dict()`, whose
    state carries that batch's check (`peek`); and a resumed run's first one, checked against
    its state's (`check_first`). Holds the runs, never the loader."""

    def __init__(self, runs, config, catalogue, shuffled: bool):
        """`shuffled`: the run reads a shuffled order (a position's documents are then counted in
        a window's order, not its unit's rows)."""
        self._runs, self._timeout, self._catalogue = runs, config.timeout, catalogue
        self._skipping, self._shuffled = config.on_bad_row_group == "skip", shuffled
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
        check_first(ann.check, expected, mark, self._catalogue.files[mark.position.file][0], self._skipping,
                    self._shuffled)
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


def check_first(check: int, expected: int, mark, name: str, skipping: bool, shuffled: bool):
    """The first batch of a resumed run, at `mark` (in the file a state names `name`:
    `source.file_names`, its path below the data's root where basenames repeat), has `check`; the state said
    `expected`: a difference is a `Mismatch` (a ValueError) naming the batch and its position (its
    document as a row of its unit, or, `shuffled`, in the order read: `formats.docs_of_unit`)."""
    if check == expected:
        return
    p = mark.position
    place = formats.docs_of_unit(name, p.rg, p.doc, ordered=not shuffled)
    at = f"batch {mark.batch} (epoch {p.epoch}, {name}, {place}" + (f", token {p.skip}" if p.skip else "") + ")"
    also = ("; with on_bad_row_group='skip', a row group skipped as bad in the saved run and readable now (or the "
            "other way round) changes it too" if skipping else "")
    raise Mismatch(
        f"resume check: the batch this loader resumed at, {at}, is not the one the state was saved before "
        f"(its check is {check:08x}, the state's 'check' is {expected:08x}): the data at or after that position "
        f"differs from the run's although the files' names and sizes (and footers, where the state has them) "
        f"match, e.g. a file replaced by another of the same name and size, or a tokenizer that encodes "
        f"differently under the same name{also}; resume with the data and tokenizer the run used, or start "
        f"a new run. This loader is closed")


def _replay(resume: statemod.Resume, part: Part, config, args, heal, rank: int, world: int,
            shows: bool) -> statemod.Resume:
    """`resume` at rank `rank` of `world`'s place at `resume.batch`: a count-only run of its
    stream over its own document lengths (the token cache's, or counted by the workers), as the
    part makes it (`Part.replay`) and reads its answer (`Part.replayed`); again from there while
    the part says it is not there yet (its step still a `Locate`: a mixture replays one batch
    shape at a time)."""
    layout = RingLayout(2, 1, config.num_workers)
    while True:
        count = part.replay(resume, dataclasses.replace(args, rank=rank, world=world, layout=layout), config)
        end, first = count.start.locate.until, count.start.batch  # this step's: a mixture's is one a batch shape
        found = _counted(config, layout, count, heal, args, end - first, end, shows)
        if found.position is None:  # a mixture ends (one source's epochs go on)
            raise DataError(f"rank {rank} of {world}: its stream ended before batch {resume.batch} of the state: "
                            f"{found.runs}")
        resume = part.replayed(resume, found)
        if not isinstance(resume.step, statemod.Locate):
            return resume


def _elastic(resume: statemod.Resume, part: Part, config, args, heal) -> statemod.Resume:
    """A state saved at another world size W (`resume.step`, a `Change`): find where every old rank
    stood at its batch count (`Part.old_rank`, replayed where the state does not say), make
    the plan that shares out what they had not consumed and start this rank at its first unit
    (`Part.shared`)."""
    change = resume.step
    log.warning("rank %d of %d: resuming a state saved at world_size %d (batch %d): finding where %s stood, "
                "replaying %s%s", args.rank, args.world, change.world, resume.batch, _old_ranks(change.world),
                _replays(change.world), "" if config.cache_dir else " (tokenized afresh: tools/pretokenize.py "
                "and cache_dir make it fast)")
    began = time.monotonic()
    places = []
    for r in range(change.world):
        old = part.old_rank(resume, r, config)
        places.append(_replay(old, part, config, args, heal, r, change.world, shows=args.rank == 0)
                      if isinstance(old.step, statemod.Locate) else old)
    resume, shared = part.shared(resume, places, config, args)
    log.warning("rank %d of %d: the old ranks' places found in %.1f s; %s is shared out over %s", args.rank,
                args.world, time.monotonic() - began, shared, _new_ranks(args.world))
    return resume


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
    where = "its stream ended first" if found.position is None else "at " + _where(Position(*found.position))
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


def _old_ranks(world: int) -> str:
    return "the old rank" if world == 1 else f"each of the {world} old ranks"


def _new_ranks(world: int) -> str:
    return "the 1 new rank" if world == 1 else f"the {world} new ranks"


def _replays(world: int) -> str:
    """What a change of world size replays: every old rank's stream but the state's own."""
    return ("no stream (the state is the only old rank's)" if world == 1 else
            "1 old rank's stream" if world == 2 else f"{world - 1} old ranks' streams")
