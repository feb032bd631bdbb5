"""One source's part of a resume state (state.py's `Part`): where the next token is in the
split's files, and what the state knows of them.

Its fields, inside the envelope (state.py): "position" ([epoch, file, row group, row in the row
group, tokens of that document before the position]), nanochat's keys "pq_idx" (file), "rg_idx"
(row group) and "epoch" (the row group the last batch before the position was read up to, by
nanochat's rule: position.py `RowGroup`; the position's own before any batch), "files" ([name,
bytes, footer] of the split: footer is the digest of its parquet footer once the run had read
it, else None), "val" (the name of the data set's val file), "elastic" (None, or the plan of a
run that began at a change of world size: `state.plan_state`), plus best fit's "buffer": its
runs `[epoch, file, rg, row, count]` as one short text (`encode_runs`; `buffer_runs` reads them
back). Its digest (`digest`) is over the rank, the world size, the position, the batch count,
the shapes, the origin, the check, the elastic plan's crc and the buffer. Its position is
canonical (the same whatever the number of workers), so a loader given it yields the batch at
that position and onward exactly, and the envelope's `check` makes it say so: its first batch
is compared with it (loader.py) and a difference is a ValueError, the one change of the data
that the files' names, sizes and footers cannot show.

`Files.resume` turns such a state into a `Resume` for this loader (its `at` an `AtSource`: best
fit's buffer, the plan, the epoch's file order; its `step` what is left to do):
- this rank's own state resumes at its position (`Exact`);
- another rank's state (same world size) resumes at the same `batch` count (`Locate`): this rank
  replays `origin`, `shapes` and `batch` over its own document lengths (packing/mixcount.py `SourceCountMode`) to find
  its own position (or, with `other_rank="nanochat"`, resumes approximately as nanochat);
- a state of another world size (any old rank's) is a `Change`: the loader finds every old
  rank's position at the state's `batch` count (resume.py, replaying every other old rank's
  stream from its origin: `Files.old_rank`) and makes the elastic plan (`Files.shared`,
  data/elastic.py), for either packing; it needs the files the state was saved with, all of
  them unchanged (files added at a change, or to a run that began at one, are a ValueError);
  with `other_rank="nanochat"` it resumes approximately as nanochat;
- a state holding only nanochat's keys (`pq_idx`, `rg_idx`, `epoch`) resumes as nanochat
  does, and becomes the run's `origin` (`Files.unversioned`);
- files appended to the split are accepted with a warning naming them; any other
  difference (split, packing, tokenizer, best-fit settings, `on_bad_row_group`: the envelope's
  config; a file at or before the position: its name, its size, or, when the state knows it,
  its footer) is a ValueError naming each difference in words.
Older versions are read too (`READS`): 2 (files as [name, bytes], no footers), 3 (best fit's
buffer as a list of runs), 4 (no check) and 5 (the position in the fields `epoch`, `pq_idx`,
`rg_idx`, `doc_idx`, `skip`, no nanochat keys of their own); 6 is one source's state as it is
now (the version after it changed a mixture's only: data/mixrules.py). nanochat's keys are not the
position: they say what nanochat's loaders say with the same batch (for `print` and for a
resume with nanochat's own loader), and a loader resumes at `position`.

The steps of the one resume plan (resume.py) that are one source's are `Files`' too
(`resume.Part`): the catalogue takes the state's order of the epoch in progress and its footers
(`take_files`); a replay runs over the files the state was saved with, from the rank's origin or,
in a run that began at a change of world size, its first unit of the plan (`replay`,
`plan_start`), and finds a position and best fit's buffer (`replayed`).

Why the buffer is text: nanochat's loop takes a state with every batch, and best fit's buffer
holds ~1000 documents in a few hundred runs. As lists of Python ints that is thousands of
objects per batch (and garbage-collector work), several times the cost of the batch itself;
as text it is a few C calls on one small array.
"""
import dataclasses
import zlib

import numpy as np

from .data import elastic, formats, shuffle
from .data.catalogue import described_files, listing, renamed
from .data.elastic import Plan, in_units
from .data.order import nanochat_position, start_position
from .errors import warn
from .ipc import runstart
from .packing.runs import BufferText, decode, decode_runs, encode_buffer, encode_runs, narrow  # noqa: F401 (the state's API)
from .position import Position, RowGroup
from .state import (EXACT, POSITION_FIELDS, VERSION, AtSource, Change, Envelope, Loader, Locate, Resume, check_field,
                    plan_of_state, plan_state)
from .state import int_field as _int_field

READS = (2, 3, 4, 5, 6, 7)  # 2 -> 3: the files' footers; 3 -> 4: best fit's buffer as text (`encode_runs`);
#                             4 -> 5: the check of the batch it resumes at; 5 -> 6: the position as
#                             `position`, nanochat's keys their own (the last batch's reading);
#                             6 -> 7: nothing of one source's (a mixture's rules: data/mixrules.py)
NANOCHAT_FIELDS = ("pq_idx", "rg_idx", "epoch")


class Files:
    """One source's part of a state (`state.Part`). `catalogue`: the loader's
    (data/catalogue.py), which numbers and describes the files as the epoch in progress orders
    them; None: the run's files are the state's, in their order (tests, tools)."""
    reads = READS

    def __init__(self, catalogue=None):
        self._catalogue = catalogue

    def constant(self, identity: Loader, resume: Resume) -> dict:
        return {"files": identity.files, "val": identity.val, "elastic": plan_state(resume.at.plan)}

    def fill(self, state: dict, mark):
        """The position at `mark` (in the run's numbering of the files), numbered and described
        as its epoch orders the files, nanochat's keys (the last batch's reading), best fit's
        buffer (an (n, 5) int64 array, a list of runs, or the `BufferText` the coordinator
        writes into the batch's slot), and the digest (its key formatted at once: every batch)."""
        position, buffer = mark.position, mark.buffer
        epoch, rg, doc, skip = position.epoch, position.rg, position.doc, position.skip
        if self._catalogue is not None:
            pq, files, renumber = self._catalogue.described(epoch, position.file)
            if buffer is not None and renumber is not None:  # the run's file numbers are not the state's
                runs = decode_runs(buffer.text)
                runs[:, 1] = renumber[runs[:, 1]]
                buffer = runs
        else:
            pq, files = position.file, described_files(state["files"], epoch, position.file)
        state["files"] = files
        state["position"] = [epoch, pq, rg, doc, skip]
        state["epoch"], state["pq_idx"], state["rg_idx"] = (epoch, pq, rg) if mark.read is None else self._read(mark.read)
        crc = 0
        if buffer is not None:
            text, crc = buffer if isinstance(buffer, BufferText) else encode_buffer(buffer)
            state["buffer"] = text
        plan = state["elastic"]
        key = (f"{state['rank']}:{state['world_size']}:{epoch}:{pq}:{rg}:{doc}:{skip}:{state['batch']}:"
               f"{state['shapes']}:{state['origin']}:{state['check']}:{plan['crc'] if plan else None}")
        state["digest"] = f"{zlib.crc32(key.encode(), crc):08x}"

    def keys(self, mark) -> dict:
        """nanochat's keys at `mark`: the row group the last batch's reading ended in (the
        position's before any batch), its file numbered as the state's."""
        epoch, pq, rg = self._read(mark.read or mark.position)
        return {"pq_idx": pq, "rg_idx": rg, "epoch": epoch}

    def _read(self, read) -> tuple:
        """`(epoch, pq_idx, rg_idx)` of a row group (the run's file numbers) as a state numbers it."""
        file = read.file if self._catalogue is None else self._catalogue.numbered(read.epoch, read.file)
        return read.epoch, file, read.rg

    def unversioned(self, state: dict, identity: Loader) -> Resume:
        return _nanochat(state, identity)

    def own(self, state: dict):
        if "mixture" in state:
            raise ValueError("resume state is of a Mixture and this loader reads one source: give it the Mixture")

    def version_hint(self) -> str:
        return " (to resume an older state approximately, pass only its nanochat keys {pq_idx, rg_idx, epoch})"

    def fields(self, state: dict, identity: Loader) -> tuple:
        """The position's fields and the state's files."""
        pos = position_fields(state)
        if (origin := state.get("origin")) is not None:
            nanochat_keys(origin, "origin", len(identity.files))
        return pos, _saved_files(state, pos)

    def digest(self, state: dict) -> str:
        runs = state.get("buffer")
        if state["version"] >= 4:
            if runs is not None and not isinstance(runs, str):
                raise ValueError(f"resume state field 'buffer' must be text (version {state['version']}), got "
                                 f"{type(runs).__name__}")
            prefix, raw, _ = decode(runs) if runs is not None else ("", b"", None)
            return digest(state, prefix.encode() + raw if raw else b"")
        try:
            return digest(state, _runs_bytes(runs) if runs is not None else b"")
        except (TypeError, ValueError):
            raise ValueError("resume state field 'buffer' is not a list of 5-integer runs") from None

    def resume(self, state: dict, identity: Loader, envelope: Envelope, fields: tuple) -> Resume:
        loader, (pos, saved_files) = identity, fields
        batch, rank, shapes, reshaped = envelope.batch, envelope.rank, envelope.shapes, envelope.reshaped
        origin = state.get("origin")
        plan = _plan_field(state)
        _check_val(state, loader)
        whole = plan is not None or envelope.world != loader.world  # other ranks' positions count too
        order, soft = _check_files(saved_files, loader, pos, whole)
        if plan is not None and (order != list(range(len(loader.files))) or len(saved_files) != len(loader.files)):
            raise ValueError(f"resume state is of a run that began at a change of world size, and the split's files "
                             f"changed since (it had {len(saved_files)}, this loader has {len(loader.files)}): files "
                             f"added to such a run are not supported yet; resume with the files it was saved with")
        order = None if order == list(range(len(loader.files))) else order
        common = dict(batch=batch, shapes=reshaped, origin=origin, n_files=len(saved_files))
        if loader.shuffled:
            _refuse_shuffled(state, loader, order, saved_files, origin, plan)
        if envelope.world != loader.world:
            return _changed_world(state, loader, pos, rank, common, order, saved_files, plan)
        if rank != loader.rank:
            return _other_rank(state, loader, pos, common, AtSource(plan=plan, order=order))
        check = check_field(state)
        if reshaped != shapes or soft or order is not None or len(saved_files) != len(loader.files):
            check = None  # another shape, or files changed after the position: the batch there may be another one
        if pos["rg_idx"] % loader.world != loader.rank and not in_units(plan, pos["epoch"]) and not loader.shuffled:
            raise ValueError(f"resume state {_named(state, 'rg_idx')} is {pos['rg_idx']}, not a row group of "
                             f"rank {loader.rank} of {loader.world}")
        if loader.buffered and pos["skip"]:
            raise ValueError(f"resume state {_named(state, 'skip')} is {pos['skip']}; a "
                             f"{loader.fingerprint.get('packing')} state has skip 0")
        runs = buffer_runs(state, len(loader.files)) if loader.buffered else []
        position = Position(*(pos[k] for k in POSITION_FIELDS))
        keys = _nanochat_of(state, pos)
        read = RowGroup(keys["epoch"], keys["pq_idx"], keys["rg_idx"]) if order is None else None
        return Resume(position, AtSource(runs, plan, order), check=check, read=read, **common)


    # resume.py's steps (`resume.Part`), over the loader's catalogue

    def take_files(self, state: dict, resume: Resume):
        """The files of the epoch in progress in the state's order (files new to it after them;
        nanochat's keys: their sorted order, which the keys number) and a nanochat state's row
        group checked against its file; the footers the state knows (version 2 has none,
        nanochat's states no files)."""
        if "version" not in state:  # nanochat's keys number the files in their sorted order, whatever an
            self._catalogue.reorder(self._catalogue.sorted_order())  # earlier resume of this loader left
            if resume.origin is not None:
                _check_row_group(resume.origin, self._catalogue)
        else:
            self._catalogue.reorder(resume.at.order)
        if state.get("version", 2) > 2:
            self._catalogue.with_footers(state["files"])

    def replay(self, resume: Resume, args, config):
        """From `resume`'s position and buffer (a run that began at a change of world size: from
        the rank's start in its plan), over the files the state was saved with, through its
        shapes, counting from the plan's batch count."""
        plan, position, runs = resume.at.plan, resume.position, resume.at.runs
        if plan is not None:
            position, runs = plan_start(plan, self._catalogue, config, args.rank, args.world, resume.n_files)
        at = runstart.SourceStart(tuple(map(tuple, runs)), plan)  # the files in the state's order: no later one
        return dataclasses.replace(args, files=args.files[:resume.n_files], start=runstart.RunStart(
            position, at, plan.batch if plan is not None else 0, runstart.CountTo(resume.shapes, resume.batch)))

    def replayed(self, resume: Resume, found) -> Resume:
        return dataclasses.replace(resume, position=Position(*found.position),
                                   at=dataclasses.replace(resume.at, runs=found.runs), step=EXACT)

    def old_rank(self, resume: Resume, rank: int, config) -> Resume:
        """The state's rank's position and buffer; another's stream from its origin (shuffled:
        its share's first unit), of the plan the run began with if it began at a change."""
        change = resume.step
        if rank == change.rank:
            return dataclasses.replace(resume, position=change.position,
                                       at=dataclasses.replace(resume.at, runs=change.runs), step=EXACT)
        return dataclasses.replace(resume, position=_origin(resume, self._catalogue, config, rank, change.world),
                                   at=dataclasses.replace(resume.at, runs=[], plan=change.parent), step=Locate())

    def shared(self, resume: Resume, places: list, config, args) -> tuple:
        """The `elastic.Plan` of the old ranks' positions (best fit: and buffers); this rank at
        its first unit with its share of the old buffers."""
        change, positions = resume.step, [tuple(p.position) for p in places]
        buffers = [p.at.runs for p in places] if config.spec.buffered else ()
        plan = Plan.of(change.world, resume.batch, positions, buffers, change.parent)
        position, runs = plan_start(plan, self._catalogue, config, args.rank, args.world, resume.n_files)
        words = f"the rest of epoch{'s up to' if plan.epoch > min(p[0] for p in positions) else ''} {plan.epoch}"
        at = dataclasses.replace(resume.at, runs=runs, plan=plan)
        return dataclasses.replace(resume, position=position, at=at, step=EXACT), words


def plan_start(plan: Plan, catalogue, config, rank: int, world: int, n_files: int) -> tuple:
    """`(position, runs)`: where rank `rank` of `world`'s stream of `plan` begins, its first unit
    and its share of the old buffers (best fit)."""
    def row_counts(f: int) -> list:  # as the coordinator reads them (a bad file: none)
        return catalogue.row_counts(f, config.on_bad_row_group)

    position = elastic.start(plan, rank, world, row_counts, n_files, shuffle=config.order)
    return position, elastic.buffer(plan, rank, world) if config.spec.buffered else []


def _origin(resume: Resume, catalogue, config, rank: int, world: int) -> Position:
    """Where old rank `rank` of `world`'s stream began: `origin_position`, or a shuffled
    stream's share's first unit (data/shuffle.py)."""
    if config.order is None:
        return origin_position(resume.origin, rank, world)
    return shuffle.first_position(config.order, lambda f: catalogue.row_counts(f, config.on_bad_row_group),
                                  resume.n_files, rank, world)


def _check_row_group(origin: dict, catalogue):
    """A nanochat state's row group must be one of its file's (the file's footer says)."""
    f, rg = origin["pq_idx"], origin["rg_idx"]
    n = len(catalogue.row_counts(f))
    if rg >= n:
        raise ValueError(f"resume state field 'rg_idx' is {rg}, but {catalogue.paths[f]} (its 'pq_idx' "
                         f"{f}) has {n} row groups: the state is not of these files")


def digest(state: dict, buffer_bytes: bytes = b"") -> str:
    """crc32 of the rank, the world size, the position, the batch count, the shapes, the origin,
    the check and the elastic plan's crc (in the versions that have them) and the buffer; not of
    the config, the files or the val file, which `check` compares with the loader's, nor (from
    this version on) of nanochat's keys, which a resume reads only as nanochat would. DCP keeps
    one value per key across ranks, so a state saved under one key by every rank comes back
    with fields of different ranks; the digest turns that (and hand edits) into an error, not a
    wrong resume.

    `buffer_bytes`: from version 4 on, the buffer's width name and values (b"u2" and the bytes
    its hex spells), taken first and the fields after them (so that whoever writes the buffer
    can take its crc32 apart from the fields); versions 2 and 3, its runs' int64 bytes, after
    the fields. Without a buffer both are the fields' crc32."""
    version = state.get("version")
    if type(version) is int and version >= 6:
        values = [state.get("rank"), state.get("world_size"), *_listed(state.get("position")), state.get("batch"),
                  state.get("shapes"), state.get("origin")]
    else:
        values = [state.get(k) for k in ("rank", "world_size", *POSITION_FIELDS, "batch", "shapes", "origin")]
    if type(version) is int and version >= 5:
        plan = state.get("elastic")
        values += [state.get("check"), plan.get("crc") if isinstance(plan, dict) else None]
    key = ":".join(map(str, values)).encode()
    if type(version) is int and version >= 4:
        return f"{zlib.crc32(key, zlib.crc32(buffer_bytes)):08x}"
    return f"{zlib.crc32(buffer_bytes, zlib.crc32(key)):08x}"

def _listed(value) -> list:
    """A `position` field's values for the digest (a malformed one as itself: `check` names it)."""
    return list(value) if isinstance(value, list) and len(value) == 5 else [value]

def position_fields(state: dict) -> dict:
    """The state's position as `{epoch, pq_idx, rg_idx, doc_idx, skip}` (`POSITION_FIELDS`): its
    `position` from this version on, its fields before; a ValueError naming what is malformed."""
    if state["version"] < 6:
        return {name: _int_field(state, name, 1 if name == "epoch" else 0) for name in POSITION_FIELDS}
    value = state.get("position")
    if not (isinstance(value, list) and len(value) == 5
            and all(type(v) is int and v >= (1 if i == 0 else 0) for i, v in enumerate(value))):
        raise ValueError(f"resume state field 'position' must be [epoch >= 1, file, row group, row, skip] "
                         f"(integers >= 0), got {value!r}")
    return dict(zip(POSITION_FIELDS, value))

def _named(state: dict, field: str) -> str:
    """How a message names the position's `field` (one of `POSITION_FIELDS`) in `state`."""
    if state["version"] < 6:
        return f"field {field!r}"
    part = ("epoch", "file", "row group", "row", "skip")[POSITION_FIELDS.index(field)]
    return f"field 'position' ({part})"

def _nanochat_of(state: dict, pos: dict) -> dict:
    """The keys nanochat would resume from: the state's own from this version on, else the position's."""
    if state["version"] >= 6:
        return {key: _int_field(state, key, 1 if key == "epoch" else 0) for key in NANOCHAT_FIELDS}
    return {key: pos[key] for key in NANOCHAT_FIELDS}

def _runs_bytes(runs) -> bytes:
    return np.asarray(runs, dtype=np.int64).reshape(-1, 5).tobytes()

def _plan_field(state: dict) -> Plan | None:
    d = state.get("elastic") if state["version"] >= 5 else None
    return None if d is None else plan_of_state(d, "elastic")

def _changed_world(state: dict, loader: Loader, pos: dict, rank: int, common: dict, order: list | None,
                   saved_files: list, plan: Plan | None) -> Resume:
    """A state of another world size: the change the loader makes a plan of (data/elastic.py)."""
    world = state["world_size"]
    if type(world) is not int or not 0 <= rank < world:
        raise ValueError(f"resume state fields 'rank' {rank!r} and 'world_size' {world!r} do not name a rank")
    if order is not None or len(saved_files) != len(loader.files):
        raise ValueError(f"resume state was saved at world_size {world} and this loader has {loader.world}: a "
                         f"change of world size needs the files the state was saved with ({len(saved_files)}; "
                         f"this loader has {len(loader.files)}): files added at a change are not supported yet; "
                         f"resume at world_size {world} to read them, or without them to change the world size")
    if loader.other_rank == "nanochat":  # approximately, as nanochat resumes any state
        return _as_nanochat(_nanochat_of(state, pos), loader, f"resume state was saved at world_size {world}, this loader has "
                                         f"{loader.world}: resuming as nanochat does (the state's file and row "
                                         f"group, this rank's next stride)")
    if pos["rg_idx"] % world != rank and not in_units(plan, pos["epoch"]) and not loader.shuffled:
        raise ValueError(f"resume state {_named(state, 'rg_idx')} is {pos['rg_idx']}, not a row group of rank {rank} of {world}")
    if loader.buffered and pos["skip"]:
        raise ValueError(f"resume state {_named(state, 'skip')} is {pos['skip']}; a {loader.fingerprint.get('packing')} "
                         f"state has skip 0")
    runs = buffer_runs(state, len(loader.files)) if loader.buffered else []
    change = Change(world, rank, Position(*(pos[k] for k in POSITION_FIELDS)), runs, plan)
    return Resume(origin_position(common["origin"], rank, world), AtSource(), change, **common)

def _other_rank(state: dict, loader: Loader, pos: dict, common: dict, at: AtSource) -> Resume:
    if loader.other_rank == "nanochat":
        return _as_nanochat(_nanochat_of(state, pos), loader, f"resume state was saved by rank {state['rank']}, this is rank "
                                         f"{loader.rank}: resuming as nanochat does (rank {state['rank']}'s file "
                                         f"and row group, next stride for this rank)")
    if common["origin"] is None:
        return Resume(loader.start_of(loader.rank, loader.world), at, Locate(), **common)
    return Resume(origin_position(common["origin"], loader.rank, loader.world), at, Locate(), **common)

def _as_nanochat(keys: dict, loader: Loader, why: str) -> Resume:
    """Resume approximately, as nanochat would from the state's nanochat keys `keys` (`other_rank="nanochat"`),
    with a warning saying `why`; those keys become the run's origin."""
    warn(f"{why}, not exactly (other_rank='nanochat')")
    origin = {"pq_idx": keys["pq_idx"], "rg_idx": keys["rg_idx"], "epoch": keys["epoch"]}
    position = nanochat_position(keys["pq_idx"], keys["rg_idx"], keys["epoch"], loader.rank, loader.world)
    return Resume(position, AtSource(), shapes=[[0, loader.B, loader.T]], origin=origin, n_files=len(loader.files))

def origin_position(origin: dict | None, rank: int, world: int) -> Position:
    """Where this rank's stream began: the start, or where nanochat resumes `origin`."""
    if origin is None:
        return start_position(rank)
    return nanochat_position(origin["pq_idx"], origin["rg_idx"], origin.get("epoch", 1), rank, world)

def buffer_runs(state, n_files: int) -> list[list[int]]:
    """The best-fit buffer of a state: runs [epoch, file, rg, row, count] in arrival order
    (version 4: decoded from its text; versions 2 and 3: its list)."""
    runs = state.get("buffer")
    if state.get("version", VERSION) >= 4:
        if not isinstance(runs, str):
            raise ValueError(f"resume state field 'buffer' must be the buffer's text (encode_runs), got "
                             f"{type(runs).__name__}")
        runs = decode_runs(runs).tolist()
    elif not isinstance(runs, list):
        raise ValueError(f"resume state field 'buffer' must be a list of [epoch, file, rg, row, "
                         f"count] runs, got {type(runs).__name__}")
    for run in runs:
        if (not isinstance(run, list) or len(run) != 5
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in run)
                or run[0] < 1 or run[4] < 1 or run[1] >= n_files):
            raise ValueError(f"resume state field 'buffer' has a bad run {run!r}: expected "
                             f"[epoch >= 1, file < {n_files}, rg, row, count >= 1]")
    return runs

def _refuse_shuffled(state: dict, loader: Loader, order: list | None, saved_files: list, origin, plan):
    """What a shuffled loader does not resume yet (data/shuffle.py), as a ValueError naming it."""
    world = state.get("world_size")
    why = None
    if world != loader.world and plan is not None:
        why = (f"the state was saved at world_size {world} by a run that began at a change of world size, and this "
               f"loader has {loader.world}: a second change of world size of a shuffled run is not built yet; "
               f"resume at world_size {world}")
    elif order is not None or len(saved_files) != len(loader.files):
        why = (f"the split has {len(loader.files)} files and the state was saved with {len(saved_files)}: files "
               f"added to a shuffled run are not built yet (its order is over every unit of the split); "
               f"resume with the files it was saved with")
    elif origin is not None:
        why = ("the state's run began from nanochat's keys, which a shuffled run never does: the state is not of "
               "a shuffled run")
    if why is not None:
        raise ValueError(f"resume state with shuffle=True: {why}")

def _saved_files(state: dict, pos: dict) -> list:
    """The state's files as [name, bytes, footer or None] (version 2 has no footers)."""
    saved = state.get("files")
    width = 2 if state["version"] == 2 else 3
    if not (isinstance(saved, list) and saved and all(
            isinstance(f, list) and len(f) == width and isinstance(f[0], str) and type(f[1]) is int
            and (width == 2 or f[2] is None or isinstance(f[2], str)) for f in saved)):
        raise ValueError(f"resume state field 'files' must be a non-empty list of "
                         f"{'[name, bytes]' if width == 2 else '[name, bytes, footer or null]'}, got "
                         f"{str(saved)[:80]}")
    if pos["pq_idx"] >= len(saved):
        raise ValueError(f"resume state {_named(state, 'pq_idx')} is {pos['pq_idx']} but the state's split has "
                         f"{len(saved)} files")
    return [list(f) + [None] * (3 - len(f)) for f in saved]

def _check_files(saved: list, loader: Loader, pos: dict, whole: bool = False) -> tuple[list[int], bool]:
    """The saved files, by name, must be the loader's, unchanged, up to the position (in epoch 1)
    or all of them (later epochs have read every file; `whole`: other ranks' positions, which
    may lie past this one's, matter too). Returns the order of the epoch in progress, as indices
    into the loader's files: the state's files (those still there), then the files new to it, by
    name; a file that arrived anywhere in the sort order (shards land out of order while they
    download) is read after the state's, with a warning naming it, and in its sorted place from
    the next epoch on. And whether a file after the position changed (read as it is now)."""
    now = {f[0]: i for i, f in enumerate(loader.files)}
    order, added, _ = listing(saved, loader.files)  # first: a file renamed by a late namesake is refused so
    must = len(saved) if pos["epoch"] > 1 or whole else pos["pq_idx"] + 1
    hard = [d for i, f in enumerate(saved[:must]) if (d := _diff(i, f, loader.files, now))]
    hard = hard or _rewritten(saved[:must], loader, now)
    if hard:
        raise ValueError(f"resume state's data differs from this loader's {loader.fingerprint.get('split')} "
                         f"split at or before its position (file {pos['pq_idx']}, epoch "
                         f"{pos['epoch']}): " + "; ".join(hard)
                         + ". Resume with the files the state was saved with")
    soft = [d for i, f in enumerate(saved[must:], must) if (d := _diff(i, f, loader.files, now))]
    if soft:
        warn("resume state's files after its position changed since it was saved (they are read as "
             "they are now): " + "; ".join(soft))
    if added:
        shown = ", ".join(loader.files[i][0] for i in added[:5]) + (", ..." if len(added) > 5 else "")
        warn(f"{len(added)} file(s) added to the split since the state was saved: {shown}; they are "
             f"read after the state's files in the epoch in progress, and in their sorted place "
             f"from the next epoch on")
    return order, bool(soft)

def _diff(i: int, old: list, files: list, index: dict) -> str | None:
    """What differs between saved file `i` and the loader's file of its name, or None."""
    if old[0] not in index:
        return f"file {i}: state has {_file_text(old)}, loader has no file of that name"
    new = files[index[old[0]]]
    if old[1] != new[1]:
        return f"file {i}: state has {_file_text(old)}, loader has {_file_text(new)}"
    return None

def _check_val(state: dict, loader: Loader):
    """A state remembers the val file; a train split whose val file changed says what it means.
    The val file a state names must be one of the data set's: a shard added after it makes it
    a train file; one that is nowhere is not this data set (or an edited state)."""
    old, new = state.get("val"), loader.val
    if old is None or new is None or old == new:
        return
    if isinstance(old, str):
        renamed([old], {new, *(f[0] for f in loader.files)})
    if not isinstance(old, str) or (loader.fingerprint.get("split") == "train"
                                    and old not in {f[0] for f in loader.files}):
        raise ValueError(f"resume state field 'val' is {old!r}, a file this data set does not have (its val "
                         f"file is {new}, its train files {', '.join(f[0] for f in loader.files[:5])}"
                         f"{', ...' if len(loader.files) > 5 else ''}): the state is not of these files")
    if loader.fingerprint.get("split") == "train":
        warn(f"the val file was {old} when the state was saved and is {new} now (a shard that sorts "
             f"after it was added): {old} is read as training data from here on, and the val split "
             f"reads {new}")
    else:
        raise ValueError(f"resume state's val split read {old}; this loader's val file is {new} (a shard "
                         f"that sorts after it was added): resume the val split with the files of the state")

def _rewritten(saved: list, loader: Loader, index: dict) -> list[str]:
    """The saved files (of the same name and size as the loader's; `index`: name -> the loader's
    index) whose identity digest the state knows and that now have another one, each in the
    words of what its format's digest is of (`formats.identity_of`: a parquet file's footer, a
    JSON Lines or Arrow file's first and last 64 KiB)."""
    known = [i for i, f in enumerate(saved) if f[2] is not None]
    if not known or loader.footers is None:
        return []
    now = dict(zip(known, loader.footers([index[saved[i][0]] for i in known])))
    return [f"file {i}: {saved[i][0]} was rewritten with the same name and size "
            f"({formats.identity_of(saved[i][0])} was {saved[i][2]}, it is {now[i]})"
            for i in known if now[i] != saved[i][2]]

def _file_text(f) -> str:
    return "no file" if f is None else f"{f[0]} ({f[1]:,} bytes)"

def nanochat_keys(state: dict, what: str, n_files: int) -> tuple[int, int, int]:
    if not isinstance(state, dict):
        raise ValueError(f"resume state field {what!r} must be a dict of nanochat keys, got {state!r}")
    for key in state:
        if key not in NANOCHAT_FIELDS:
            raise ValueError(f"resume state has no 'version' (a nanochat state) but has field "
                             f"{key!r}; nanochat states hold only pq_idx, rg_idx and epoch"
                             if what == "state" else
                             f"resume state field {what!r} has field {key!r}; it holds only "
                             f"pq_idx, rg_idx and epoch")
    pq_idx, rg_idx = _int_field(state, "pq_idx"), _int_field(state, "rg_idx")
    epoch = _int_field(state, "epoch", 1) if "epoch" in state else 1
    if pq_idx >= n_files:
        raise ValueError(f"resume state field 'pq_idx' is {pq_idx} but the split has {n_files} files")
    return pq_idx, rg_idx, epoch

def _nanochat(state: dict, loader: Loader) -> Resume:
    """A state of nanochat's own loader: resume where nanochat resumes; it is the run's origin."""
    if loader.shuffled:
        raise ValueError("resume state with shuffle=True: a state of nanochat's keys alone (pq_idx, rg_idx, epoch) "
                         "names a row group of the files' order; resuming it shuffled is not built yet: resume it "
                         "without shuffle, or pass a state of a shuffled run")
    pq_idx, rg_idx, epoch = nanochat_keys(state, "state", len(loader.files))
    return Resume(nanochat_position(pq_idx, rg_idx, epoch, loader.rank, loader.world), AtSource(),
                  shapes=[[0, loader.B, loader.T]], n_files=len(loader.files),
                  origin={"pq_idx": pq_idx, "rg_idx": rg_idx, "epoch": epoch})
