"""A mixture's resume state: where every source stands and the mixer's counts, checked against
the loader; and what `stats()["sources"]` says.

A mixture's state is a state (state.py) whose `position` is that of the document the next token
is in, numbered within its source; whose nanochat keys `epoch`, `pq_idx`, `rg_idx` are, over one
source, that source's (as sourcestate.py says them: the row group its last batch's reading ended
in, equal to the source's own loader's at every batch), over several, the position's (their
reading has no nanochat counterpart); whose `origin` is set in a run of one source that began
from nanochat's keys only; and whose `"mixture"` holds:
- `"point"`: the `packing.mix.MixPoint` there as JSON text (every source's next document,
  numbered within the source; the source and skip of the next token; the mixer's state before
  that document was picked; best fit: after the last chunk planned, and `"buffer"`, the
  buffer's documents by source: packing/mixbestfit.py), made by the coordinator with each
  batch (the batch's slot carries it, as best fit's buffer) and not parsed per batch;
- `"sources"`: each source's files `[name, bytes, footer]` (footers up to the source's position
  only, so that states do not depend on timing), its val file, and its `column` and `format`
  where they are not "text" and "parquet" (`Catalogue.fingerprint`; another one is refused);
- `"plans"`, in a run that began at a change of world size only: each source's elastic plan
  (`state.plan_state`, with its crc; no buffers: a best-fit run's first buffer is its point's);
- `"plain"`, in a run that began as a mixture of one source: its name (shuffled with the
  loader's seed as it is), and `"rules": 6`, in a run resumed from a state of version 5 or 6,
  which keeps those versions' chunks and seeds (data/mixrules.py: `of_state` reads them, a
  resume, a replay and an elastic plan follow them).
Its `files` is empty and its `val` None. Its `digest` covers the rank, the world size, the
batch, the shapes, the check, the position, the point, the rules, the origin and the plans' crcs.

Resuming (`check`): this rank's own state; another rank's state, or one of another world size,
either packing, shuffled or not (each source in its own order: data/mixelastic.py; best fit's
buffers dealt out run by run as one source's, each new rank's share its point's first
`"buffer"`), of a run that used this mixture from batch 0 (this rank's place, or every old
rank's, is then replayed, a batch shape at a time: resume.py with `Mixed.replay`, `Mixed.shared`;
other runs are refused, `mixchecks.replayable`, and so is a second change of world size: the mixer
of a run that began at one counts from there, its `since`); a mixture of one source, also a state
of nanochat's keys alone and, with `other_rank="nanochat"`, another rank's or world size's
state approximately, as one source (mixkeys.py: the keys become the run's `origin`, where a
replay of its other ranks starts, also at a change of world size, as one source's);
the config as state.py checks it; another B or T as there; every source the state and the loader
share must list the state's files (name, size, footer where both know it), and may list more,
wherever they sort (`mixchecks.check_sources`: shards that landed among a source's files, or after
its last, as a shard that sorts last makes its val file a train file); said once
(`mixchecks.take_added`), they are read as that source alone reads them: after the state's files
in the source's epoch in progress, and in their sorted place from its next epoch on
(data/sources.py `reorder`; the states number and list a source's files in the order of its own
epoch, `numbered` renumbering the coordinator's point; another rank's state of the same world
size, as one source's: its place replayed over the state's files of each source, whose epochs
then say where each source's sorted order begins, `take_files`, `replay`, `replayed`); refused at
another world size, a run that began at a change and a shuffled source; the run's mixer then
counts from the resume, its `since`, so that its states are not replayed over files its first
batches did not read; a source added (read from its start) or left out (its place kept
in the states that follow, for a resume that brings it back) and other weights are said once
(`Mixer.resume`'s words). The run then starts every source at its document and the mixer from
its state (packing/mixmode.py).
"""
from __future__ import annotations

import dataclasses
import json
import zlib

from . import mixchecks, mixkeys, state as statemod
from .data import mixelastic, mixrules
from .data.catalogue import described_files
from .data.mixture import Mixer
from .data.order import start_position
from .ipc.protocol import MixArgs
from .ipc.runstart import CountTo, MixStart, RunStart
from .errors import warn
from .packing import MIX_MODES
from .packing.mix import MixPoint
from .packing.mixbestfit import BUFFER_RUN, buffer_entries, buffer_runs
from .packing.mixtext import json_text, kept
from .packing.runs import BufferText, decode, encode_runs
from .position import Position
from .state import POSITION_FIELDS

KIND = "mixture"


def refuse(config):
    """What a mixture does not do yet, as a ValueError naming it."""
    if config.packing not in MIX_MODES:
        raise ValueError(f"a Mixture reads with packing {sorted(MIX_MODES)} only for now (not built yet: "
                         f"{config.packing!r} over a mixture); got packing={config.packing!r}")


def run_args(catalogue, at: statemod.AtMix) -> tuple:
    """`(MixArgs, MixStart)`: what a run of a mixture's loader (`catalogue`, its `Sources`) starting
    at `at` (its point, plans and rules) is given: its sources and rules, and its kind's start
    (`RunArgs.start.at`)."""
    rules = at.rules if at.rules is not None else mixrules.fresh(catalogue.mixture)
    return (MixArgs(catalogue.mixture, tuple(catalogue.ranges.values()), rules),
            MixStart(at.point, at.plans, laters=catalogue.laters or None))


def point_text(point: dict | None) -> BufferText | None:
    """A `MixPoint`'s JSON as the text and crc32 the coordinator writes with each batch."""
    if point is None:
        return None
    text = json_text(point)
    return BufferText(text, zlib.crc32(text.encode()))


def slot_point(ring, slot: int):
    """The point (and best fit's buffer) in a batch's `slot`, copied out: a concat mixture's
    packed point (`Packed`, its text made when a state asks), else its text."""
    return kept(*ring.buffer_raw(slot))


class Mixed:
    """A mixture's part of a state (`state.Part`), of its loader's `sources` (data/sources.py)."""
    reads = (5, 6, statemod.VERSION)  # 6 -> 7: best fit's chunks and a one-source mixture's seed (data/mixrules.py)

    def __init__(self, sources):
        self._sources = sources
        self._described = (None, None)
        self._replayed_files = None  # `{source: its files the state lists}` while another rank's state is replayed

    def constant(self, identity: statemod.Loader, resume: statemod.Resume) -> dict:
        at = resume.at
        plans = ({"plans": {name: statemod.plan_state(plan) for name, plan in sorted(at.plans.items())}}
                 if at.plans else {})
        rules = mixrules.fields(at.rules if at.rules is not None else mixrules.fresh(self._sources.mixture))
        return {"files": [], "val": None, "elastic": None, "mixture": {**plans, **rules}}  # each source's plan: `plans`

    def fill(self, state: dict, mark):
        point = mark.buffer
        if point is not None and self._sources.laters:  # a source reordered at the resume (data/sources.py)
            point = numbered(point, self._sources)
        position = self._sources.local(mark.position) if point is not None else mark.position
        state["position"] = list(position)
        state["epoch"], state["pq_idx"], state["rg_idx"] = mixkeys.of_mark(self._sources, mark, position)
        state["mixture"] = {"point": point.text if point is not None else None, "sources": self._files(point),
                            **state["mixture"]}
        state["digest"] = digest(state, point.crc if point is not None else 0, state["check"])

    def keys(self, mark) -> dict:
        """nanochat's keys at `mark` (mixkeys.py)."""
        epoch, pq, rg = mixkeys.of_mark(self._sources, mark, self._sources.local(mark.position)
                                        if mark.buffer is not None else mark.position)
        return {"pq_idx": pq, "rg_idx": rg, "epoch": epoch}

    def _files(self, point) -> dict:
        """Every source's files, footers up to its position (kept while the point's places do not
        move to another file)."""
        places = _places(point.text) if point is not None else {}
        key = (tuple(sorted(places.items())), id(self._sources.files))
        if self._described[0] != key:
            out = {}
            for name in self._sources.names:
                epoch, file = places.get(name, (1, -1))
                out[name] = {"files": described_files(self._sources.files_at(name, epoch), epoch, file),
                             "val": self._sources.val[name], **self._sources.source_fingerprint(name)}
            self._described = (key, out)
        return self._described[1]

    def unversioned(self, state: dict, identity: statemod.Loader):
        """A state of nanochat's keys alone: a mixture of one source resumes it as one source does
        (mixkeys.py); a mixture's own states always have a version, so one without is another
        kind's, or edited."""
        if len(self._sources.names) == 1 and "mixture" not in state:
            return mixkeys.nanochat_state(self._sources, state, identity)
        self.own(state)
        raise ValueError(f"resume state has no 'version': a mixture's state has one ({' or '.join(map(str, self.reads))})"
                         f", so this one was edited or is not a loader's state")

    def own(self, state: dict):
        mixed = state.get("mixture")
        if mixed is None:
            raise ValueError("resume state is of one source (data= a directory or files) and this loader reads a "
                             "Mixture: resuming a single source's run as a mixture is not built yet")
        if not isinstance(mixed, dict):
            raise ValueError(f"resume state field 'mixture' must be a dict, got {type(mixed).__name__}")

    def version_hint(self) -> str:
        return " (a mixture's state)"

    def fields(self, state: dict, identity: statemod.Loader):
        """The point's JSON text."""
        statemod.int_field(state, "world_size")
        text = state["mixture"].get("point")
        if text is not None and not isinstance(text, str):
            raise ValueError(f"resume state field 'mixture.point' must be text, got {type(text).__name__}")
        return text

    def digest(self, state: dict) -> str:
        text = state["mixture"].get("point")
        return digest(state, zlib.crc32(text.encode()) if text is not None else 0, state.get("check"))

    def resume(self, state: dict, identity: statemod.Loader, envelope: statemod.Envelope, text) -> statemod.Resume:
        """Where every source stands and the mixer's counts (see the module docstring)."""
        sources, mixed, batch = self._sources, state["mixture"], envelope.batch
        shapes, reshaped = envelope.shapes, envelope.reshaped
        point = MixPoint.from_json(json.loads(text)) if text is not None else None
        rules = mixrules.of_state(state)
        listed = mixchecks.check_sources(mixed.get("sources"), sources)
        origin = mixkeys.origin(sources, state)
        if (envelope.rank, envelope.world) != (identity.rank, identity.world) and identity.other_rank == "nanochat" \
                and mixkeys.of_one_source(sources, state):  # approximately, as one source resumes any of its states
            return mixkeys.approximately(sources, state, identity, envelope)
        plans = mixed.get("plans")
        if plans is not None and not isinstance(plans, dict):
            raise ValueError(f"resume state field 'mixture.plans' must be a dict, got {type(plans).__name__}")
        plans = ({name: statemod.plan_of_state(d, f"mixture.plans.{name}") for name, d in plans.items()}
                 if plans else None)
        mixchecks.take_added(listed.added, envelope, identity, plans)
        other = start_position(identity.rank)
        if identity.buffered:  # best fit's buffer: its documents' sources are read now
            buffer_runs(json.loads(text) if text is not None else None, {name: 0 for name in sources.names})
        if (envelope.rank, envelope.world) != (identity.rank, identity.world):
            mixchecks.replayable(point, sources.mixture, envelope.rank)
        # checked: every source takes its order of the state's epoch before anything is numbered as the run's
        self._replayed_files = None
        if (envelope.rank != identity.rank and envelope.world == identity.world and listed.added
                and point is not None):
            # another rank's, files added: the replay (over the state's files) finds the epochs, `replayed`;
            # a state before the first batch (no point) read no file: every source sorted, as its own rank's
            sources.reorder({name: listed.orders[name] for name in listed.added}, None)
            self._replayed_files = {name: len(listed.orders[name]) - len(files) for name, files in listed.added.items()}
        else:
            epochs = {name: p.epoch for name, p in point.sources.items()} if point is not None else {}
            sources.reorder({name: order for name, order in listed.orders.items() if name in epochs}, epochs)
        if envelope.world != identity.world:  # the old ranks' places replayed, each source's plan made (resume.py)
            change = statemod.Change(envelope.world, envelope.rank, other, [], None)
            return statemod.Resume(other, statemod.AtMix(json.loads(text) if text is not None else None, rules=rules),
                                   change, batch=batch, shapes=reshaped, n_files=len(identity.files), origin=origin)
        if envelope.rank != identity.rank:  # another rank's: this rank's place is found by a replay (resume.py)
            return statemod.Resume(other, statemod.AtMix(rules=rules), statemod.Locate() if point is not None
                                   else statemod.EXACT, batch=batch, shapes=reshaped, n_files=len(identity.files),
                                   origin=origin)
        notes = Mixer.resume(sources.mixture, point.mixer, batch).notes if point is not None else ()
        for note in notes:
            warn(f"shmloader: {note}")
        here = point.sources.get(point.source) if point is not None else None
        position = (Position(*here[:4], point.skip) if here is not None and point.source in sources.ranges
                    else start_position(identity.rank))
        if point is not None and point.source in sources.ranges:
            position = sources.to_run(point.source, position)
        # the batch it resumes at is the saved run's only with the same shape, the same mix and files
        added = listed.added
        checked = statemod.check_field(state) if reshaped == shapes and not notes and not added else None
        mix = json.loads(text) if text is not None else None
        if added and mix is not None:  # the run's streams are not replayable from batch 0 any more
            mix["mixer"]["since"] = batch
        return statemod.Resume(position, statemod.AtMix(mix, plans, rules), batch=batch, shapes=reshaped, check=checked,
                               n_files=len(identity.files), origin=origin, read=mixkeys.read_of(sources, state))

    # resume.py's steps (`resume.Part`), over the loader's sources

    def take_files(self, state: dict, resume: statemod.Resume):
        """The footers the state knows of every source's files (their order of its epoch in
        progress, the state's then files new to it, was taken once the state was checked, in
        `resume`: data/sources.py `reorder`); a state of nanochat's keys, its row group checked
        against its file."""
        if "version" not in state:
            mixkeys.check_row_group(self._sources, resume.origin)
            return
        self._sources.with_footers(state["mixture"]["sources"])

    def replay(self, resume: statemod.Resume, args, config):
        """The rank's mixed stream from the run's start (every source's, the mixer's first
        stage: `mixchecks.replayable` let only such runs through; a run that began from
        nanochat's keys, from the rank's place there), a batch shape at a time: the first
        count to the next shape's first batch (or `resume.batch`), each next one from the point
        the last found (`statemod.Locate.replayed`, its point), as the run resumed there with
        its new B or T (packing/mixcount.py)."""
        counted, (shape, end) = resume.step.replayed, _segment(resume)  # the batches replayed so far
        if counted:
            start, point = resume.position, resume.at.point
        else:
            start, point = start_position(args.rank), None
            if resume.origin is not None:
                origin = mixkeys.origin_point(self._sources, resume.origin, args.rank, args.world)
                start, point = self._sources.to_run(origin.source, origin.sources[origin.source]), origin.to_json()
        mix, begins = run_args(self._sources, statemod.AtMix(point, rules=resume.at.rules))
        if self._replayed_files:  # over the state's files of a source that gained some (`resume`), as one source
            mix = mix._replace(ranges=tuple(r._replace(hi=r.lo + self._replayed_files.get(r.name, r.hi - r.lo))
                                            for r in mix.ranges))
            begins = dataclasses.replace(begins, laters=None)
        return dataclasses.replace(args, files=self._sources.paths, mixture=mix,
                                   start=RunStart(start, begins, counted, CountTo([shape], end)))

    def replayed(self, resume: statemod.Resume, found) -> statemod.Resume:
        """At the replayed point (`found.runs`: its JSON) and the position it names; replayed on
        from there while a batch shape is left before `resume.batch` (`replay`)."""
        end = _segment(resume)[1]
        more, mix = end < resume.batch, json.loads(found.runs)
        if self._replayed_files and not more:  # found: the sources that gained files read them after the state's
            self._sources.begun({name: mix["sources"][name][0] if name in mix["sources"] else 1
                                 for name in self._replayed_files})
            mix["mixer"]["since"] = resume.batch  # as this rank's own state's resume: not replayable from batch 0
            self._replayed_files = None
        return dataclasses.replace(resume, position=Position(*found.position),
                                   at=dataclasses.replace(resume.at, point=mix),
                                   step=statemod.Locate(end) if more else statemod.EXACT)

    def old_rank(self, resume: statemod.Resume, rank: int, config) -> statemod.Resume:
        """The state's rank's point; another's mixed stream from the run's start."""
        if rank == resume.step.rank:
            return dataclasses.replace(resume, step=statemod.EXACT)
        return dataclasses.replace(resume, step=statemod.Locate())

    def shared(self, resume: statemod.Resume, places: list, config, args) -> tuple:
        """Each source's own `elastic.Plan` from the old ranks' places in it (data/mixelastic.py;
        shuffled, in each source's own order), this rank starting every source at its first unit
        (a cut document's tokens before its place dropped, `"skips"`) with a mixer whose counting
        stage begins at the change, its totals the old ranks' together; best fit, with its share
        of the old ranks' buffers as its point's `"buffer"`."""
        sources, buffered = self._sources, config.spec.buffered
        start = mixelastic.plan([p.at.point for p in places], sources.mixture, resume.batch, args.rank, args.world,
                                lambda name: lambda f: sources.catalogues[name].row_counts(f, config.on_bad_row_group),
                                lambda name: len(sources.catalogues[name].paths), self._shuffles(config, args, resume),
                                [buffer_entries(p.at.point) for p in places] if buffered else ())
        point = dict(start.point, buffer=_buffer(start.buffer, sources.names)) if buffered else start.point
        first = point["source"]
        position = Position(*point["sources"][first], point["skips"].get(first, 0))
        shared = "every source's rest of its epoch in progress" + (" and the old ranks' buffers" if buffered else "")
        at = dataclasses.replace(resume.at, point=point, plans=start.plans)
        return dataclasses.replace(resume, position=sources.to_run(first, position), at=at, step=statemod.EXACT,
                                   check=None), shared

    def _shuffles(self, config, args, resume: statemod.Resume) -> dict | None:
        """`{name: Shuffle}`: each source's shuffled order as its run reads it (`mixrules.order`,
        with the rules of `resume`'s state), or None (the files' order)."""
        mix, _ = run_args(self._sources, statemod.AtMix(rules=resume.at.rules))
        order = mixrules.order(config, dataclasses.replace(args, mixture=mix))
        return None if order is None else dict(zip(order.names, order.orders))


def numbered(point, sources):
    """A point (its text: the coordinator numbers each source's files in the run's order, within
    it) as a state numbers them: in the order of each source's epoch at the point, its place and
    its runs in best fit's buffer (`Sources.renumbering`; as sourcestate.py renumbers one
    source's, an array's column at once). The point itself where nothing is renumbered. Every
    state of a run past a reordered epoch pays it (design.md "Mixtures": ~10 us a concat point,
    the buffer's text decoded and encoded again for best fit)."""
    value = json.loads(point.text)
    renumber = {name: at for name, (epoch, *_) in value["sources"].items()
                if name in sources.catalogues and (at := sources.renumbering(name, epoch)) is not None}
    if not renumber:
        return point
    for name, at in renumber.items():
        epoch, file, rg, row = value["sources"][name]  # a point's place: `MixPoint.to_json`'s four values
        value["sources"][name] = [epoch, int(at[file]), rg, row]
    buffer = value.get("buffer")
    if buffer is not None:
        runs = decode(buffer["runs"], per_run=len(BUFFER_RUN), field="mixture.point.buffer")[2]
        source, file = runs[:, BUFFER_RUN.index("source")], runs[:, BUFFER_RUN.index("file")]
        for i, name in enumerate(buffer["sources"]):
            if name in renumber:
                mine = source == i
                file[mine] = renumber[name][file[mine]]
        buffer["runs"] = encode_runs(runs)
    text = json_text(value)
    return BufferText(text, zlib.crc32(text.encode()))


def _buffer(entries: list, names) -> dict:
    """Best fit's runs `[source, epoch, file, rg, row, count]` as a point's `"buffer"`
    (packing/mixbestfit.py `buffer_entries` reads it back), their sources indexing `names`."""
    index = {name: i for i, name in enumerate(names)}
    return {"sources": list(names), "runs": encode_runs([[index[r[0]], *r[1:]] for r in entries])}


def _segment(resume: statemod.Resume) -> tuple:
    """`([first, B, T], end)`: the batch shape a replay at `statemod.Locate.replayed`
    (`resume.step`) counts with, and the batch its count ends at (the next shape's first batch,
    or `resume.batch`)."""
    shapes = [s for s in resume.shapes if s[0] < resume.batch] or resume.shapes[:1]
    i = max(j for j, s in enumerate(shapes) if s[0] <= resume.step.replayed)
    return shapes[i], shapes[i + 1][0] if i + 1 < len(shapes) else resume.batch


def _places(text: str) -> dict:
    """`{source: (epoch, file)}` of a point's JSON text."""
    return {name: (p[0], p[1]) for name, p in json.loads(text)["sources"].items()}


def digest(state: dict, point_crc: int, checked) -> str:
    """crc32 of the rank, the world size, the batch, the shapes, the check, the position, the
    rules and the plans' crcs, from the point's crc32."""
    position = state.get("position") if state.get("version") != 5 else [state.get(k) for k in POSITION_FIELDS]
    key = (f"{state['rank']}:{state['world_size']}:{state['batch']}:{state['shapes']}:{checked}:"
           + ":".join(map(str, position if isinstance(position, list) else [position])))
    for field in ("rules", "plain"):  # the rules its run keeps (data/mixrules.py), where the state says
        if field in state["mixture"]:
            key += f":{field}={state['mixture'][field]!r}"
    if state.get("origin") is not None:  # a run of one source that began from nanochat's keys
        key += f":origin={json.dumps(state['origin'], sort_keys=True)}"
    plans = state["mixture"].get("plans")
    if isinstance(plans, dict) and plans:  # a run that began at a change of world size: its plans' crcs
        key += ":" + ",".join(f"{name}={d.get('crc') if isinstance(d, dict) else d!r}" for name, d in sorted(plans.items()))
    return f"{zlib.crc32(key.encode(), point_crc):08x}"


def source_stats(mark, previous: dict | None) -> dict:
    """`stats()["sources"]`: per source, the tokens and documents the mix took up to the batch
    last returned (the documents before the one its next token is in), their share of tokens
    so far and since `previous` (the last call's figures; None while no document began since:
    one long document), and its epoch."""
    if mark.buffer is None:
        return {}
    totals = json.loads(mark.buffer.text)["mixer"]["totals"]
    all_tokens = sum(t[0] for t in totals.values()) or 1
    recent = {name: t[0] - (previous or {}).get(name, {}).get("tokens", 0) for name, t in totals.items()}
    recent_all = sum(recent.values())
    return {name: {"tokens": t[0], "documents": t[1], "epoch": t[2], "share": t[0] / all_tokens,
                   "share_recent": recent[name] / recent_all if recent_all else None}
            for name, t in sorted(totals.items())}
