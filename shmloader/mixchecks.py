"""A mixture's resume state checked against its loader's sources (mixstate.py reads the state):
- `replayable`: another rank's state, or one of another world size, is of a run whose places can
  be replayed from batch 0 (packing/mixcount.py, a batch shape at a time): the mixer's `since`
  0 under this mixture;
- `check_sources`: every source the state and the loader share lists the state's files, unchanged
  (name, size, footer where both know it), and may list more, wherever they sort (`Listed`: the
  files added, and each source's order of its epoch in progress: the state's files, then the
  new ones, data/catalogue.py `listing`, one source's rule too). Stricter than one source's
  check (sourcestate.py `_check_files`), which only warns of a file after its position in epoch
  1 that changed or went, and reads the footers of the state's files from the files: here every
  file the state lists must be there unchanged, its footer compared where the loader knows it
  (docs/contract.md §3 says so);
- `take_added`: such files are read after the state's in the source's epoch in progress and in
  their sorted place from its next epoch on (said once, data/sources.py `reorder`; another rank's
  state of the same world size too, its place replayed over the state's files, mixstate.py), and
  refused where the run is planned over the state's files (another world size, a run that began
  at a change) or the source is shuffled.
Each returns or raises; the words say what was found and what to do.
"""
from __future__ import annotations

from typing import NamedTuple

from . import state as statemod
from .data.catalogue import TOKEN_IDS, listing, renamed
from .errors import warn


def replayable(point, mixture, rank: int):
    """Another rank's state: this rank's run can be replayed from its start (packing/mixcount.py,
    a batch shape at a time) only if this mixture applied since batch 0; else a ValueError."""
    if point is None:
        return
    since = point.mixer.get("since")
    if point.mixer.get("mixture") != mixture.digest or since != 0:
        when = f"at batch {since}" if since else "at a resume"
        raise ValueError(f"resume state is rank {rank}'s, of a run whose mixture changed {when} (other weights, "
                         "sources or max_epochs, files added to a source, or another world size), or is not this "
                         "loader's: the other ranks' places cannot be replayed (another rank's or another world "
                         "size's state of a mixture resumes only a run that used this mixture and its files at one "
                         "world size from batch 0); give each rank its own state, or resume with the mixture of "
                         "the state")


class Listed(NamedTuple):
    """What `check_sources` found: `added`, `{source: [names of its files new to the state]}`;
    `orders`, `{source: its files (indices into its files as the loader has them now) in the
    order of its epoch in progress}`: the state's, then those added (sorted), for every source the state lists."""
    added: dict
    orders: dict


def check_sources(saved, sources) -> Listed:
    """Every source the state and the loader share lists the state's files, unchanged, and may
    list more (see `Listed`)."""
    if not isinstance(saved, dict):
        raise ValueError(f"resume state field 'mixture.sources' must be a dict, got {saved!r}")
    added, orders = {}, {}
    for name in sources.names:
        if name not in saved:
            continue
        old = saved[name].get("files") if isinstance(saved[name], dict) else None
        now = sources.source_files(name)
        index = {f[0]: i for i, f in enumerate(now)}
        if isinstance(old, list) and all(isinstance(f, list) and f and isinstance(f[0], str) for f in old):
            try:
                renamed([f[0] for f in old], index)  # a late namesake, in words (data/catalogue.py)
            except ValueError as exc:
                raise ValueError(f"mixture source {name!r}: {exc}") from None
        listed = (listing(old, now) if isinstance(old, list) and old and all(isinstance(f, list) and len(f) == 3
                                                                              for f in old)
                  and len({f[0] for f in old}) == len(old) else None)
        if listed is None or listed.gone:
            raise ValueError(f"mixture source {name!r} lists other files than the state's "
                             f"({[f[0] for f in old] if isinstance(old, list) else old!r}; now {[f[0] for f in now]}): "
                             "files removed from a source of a mixture are not built yet; files added to it are "
                             "read. Resume with the files the state was saved with")
        for key, default in (("column", "text"), ("format", "parquet"), ("shuffle", "the loader's"),
                             *((key, None) for key in TOKEN_IDS)):
            was, now_is = saved[name].get(key, default), sources.source_fingerprint(name).get(key, default)
            if key in TOKEN_IDS and was is None and now_is is not None:
                raise ValueError(f"mixture source {name!r}: {statemod.token_ids_refused()}")
            if was != now_is:
                raise ValueError(f"mixture source {name!r}: resume state has {key} {was!r}, this loader has "
                                 f"{now_is!r}: a source resumes in the {key} it was saved with")
        for fname, size, footer in old:
            _, size_now, footer_now = now[index[fname]]
            if size != size_now or (footer is not None and footer_now is not None and footer != footer_now):
                raise ValueError(f"mixture source {name!r}: file {fname} changed since the state was saved "
                                 f"({size} bytes, footer {footer}; now {size_now} bytes, footer {footer_now})")
        if listed.added:
            added[name] = [now[i][0] for i in listed.added]
        orders[name] = listed.order
    return Listed(added, orders)


def take_added(added: dict, envelope: statemod.Envelope, identity: statemod.Loader, plans):
    """Files added to a source (`added`, `check_sources`): read after the state's in the source's
    epoch in progress and in their sorted place from its next one, said once (from another rank's
    state of the same world size too); refused where the run is planned over the state's files
    (another world size, a run that began at a change) or its order is over every file (a
    shuffled source: `identity.shuffled_sources`, not any source's shuffle taken for every one's)."""
    for name, files in sorted(added.items()):
        shown = ", ".join(files[:5]) + (", ..." if len(files) > 5 else "")
        why = None
        if envelope.world != identity.world or plans:
            why = (f"the state is rank {envelope.rank} of {envelope.world}'s" + (", of a run that began at a change "
                   "of world size" if plans else "") + f", this loader rank {identity.rank} of {identity.world}: "
                   "such a resume plans the ranks' streams over the files the state was saved with; "
                   "resume each rank from its own state, or at the world size of the state, to read them")
        elif name in identity.shuffled_sources:
            why = "the source is shuffled: its order is over every unit of its files"
        if why is not None:
            raise ValueError(f"mixture source {name!r}: {len(files)} file(s) added since the state was saved "
                             f"({shown}): not built yet here ({why}); resume with the files the state was saved with")
        warn(f"shmloader: mixture source {name!r}: {len(files)} file(s) added since the state was saved: {shown}; "
             "they are read after the state's files in the source's epoch in progress, and in their sorted place "
             "from its next epoch on")
