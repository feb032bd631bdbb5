"""A mixture's files: every source's split, numbered in one list, as a loader knows them.

Each source is listed and split as `data=` alone would be (`Catalogue`: its files sorted by
name, `train` all but the last, `val` the last), and the sources' files are numbered one after
another in the mixture's sorted order of names: source s holds files `[lo, hi)` of `paths`
(`ranges`). A run reads every file by that number (the workers, the footers it learns);
each source's order is its own range, from its own position. A state numbers a source's
files within the source (`local`, `to_run`).

A source resumed from a state that does not list every file of it now (shards that arrived
since the save, wherever they sort) reads its files as one source does (`Catalogue.reorder`):
the state's first, the new ones after them, in the source's epoch in progress at the resume,
and every file in its sorted place from its next epoch on (`reorder`; its `Later`, `laters`,
goes to the coordinator in the run's start, `MixStart.laters`), every source's order set anew at each resume
(a source the state does not place, sorted). The run numbers a source's files in the
order of that epoch; a state numbers them in the order of the source's own epoch, as one
source's state does (`local`, `to_run`, `files_at`; mixstate.py renumbers a point's files).

The rest of a loader reads it as it reads a `Catalogue`: `paths`, `files` (identities),
`filesystem`, `learn`, `begin`, `later` (None: each source's is its own, `laters`).
"""
from __future__ import annotations

from typing import NamedTuple

from ..errors import DataError
from ..position import Position
from . import shuffle, source
from .catalogue import Catalogue, learned, with_known_footers
from .mixture import Mixture


def keep_open(n_sources: int) -> int:
    """The files a process of a mixture's run keeps open (`source.Reader`): it reads its
    `n_sources` sources in turn, each in its own file and soon its next, so 2 a source (with 3
    sources of 2 train files each, 4 open files closed and reopened a footer at nearly every
    piece); at least `source.KEEP_OPEN`, one source's."""
    return max(source.KEEP_OPEN, 2 * n_sources)


class Range(NamedTuple):
    """Source `name`'s files are `paths[lo:hi]`."""
    name: str
    lo: int
    hi: int


class Sources:
    def __init__(self, mixture: Mixture, split: str, filesystem=None, column: str = "text"):
        """Lists and splits every source of `mixture` (`DataError` naming an empty one); a
        source that is a `source.Source` is read in its column, the others in `column`."""
        self.mixture = mixture
        self.catalogues, self.ranges, self.paths, self.files = {}, {}, [], []
        for name in mixture.names:
            try:
                cat = Catalogue(mixture.sources[name], split, filesystem, column)
            except (DataError, ValueError, FileNotFoundError) as e:  # its own error, said of its source
                raise type(e)(f"mixture source {name!r}: {getattr(e, 'in_mixture', None) or e}") from None
            if self.catalogues and type(cat.filesystem) is not type(self.filesystem):
                raise ValueError(f"mixture source {name!r} is on {type(cat.filesystem).__name__}, another "
                                 f"filesystem than {self.names[0]!r} ({type(self.filesystem).__name__}): a "
                                 "mixture over several filesystems is not built yet")
            self.catalogues[name] = cat
            self.ranges[name] = Range(name, len(self.paths), len(self.paths) + len(cat.paths))
            self.paths += cat.paths
            self.files += cat.files
        self.val = {name: cat.val for name, cat in self.catalogues.items()}
        self.later = None
        self.laters = {}  # `{name: Later}` of the sources read in another order after their resumed epoch (`reorder`)

    names = property(lambda self: list(self.catalogues))
    filesystem = property(lambda self: next(iter(self.catalogues.values())).filesystem)

    @property
    def columns(self) -> list:
        """The column read of each file, in the run's numbering."""
        return [c for cat in self.catalogues.values() for c in cat.columns]

    def fingerprint(self) -> dict:
        """Nothing beyond the config's: each source's column, formats and token ids' marker are
        in its own part of a mixture's state (`source_fingerprint`), compared only for the
        sources in both the state and the loader."""
        return {}

    def source_fingerprint(self, name: str) -> dict:
        """Source `name`'s column, formats and token ids' marker, as `Catalogue.fingerprint`, and its own shuffle
        setting when it says one (`"shuffle": "on"` or `"off"`; without it, the loader's)."""
        own = shuffle.own_setting(self.mixture, name)
        return {**self.catalogues[name].fingerprint(), **({} if own is None else {"shuffle": "on" if own else "off"})}

    def source_of(self, file: int) -> Range:
        """The source that file `file` (the run's numbering) is of."""
        for r in self.ranges.values():
            if r.lo <= file < r.hi:
                return r
        raise IndexError(f"file {file} is in no source ({list(self.ranges.values())})")

    def local(self, position: Position) -> Position:
        """`position` (the run's numbering) with its file numbered within its source, as a state
        of its epoch numbers it (`Catalogue.numbered`: a reordered source's sorted place in the
        epochs after the one it resumed in)."""
        r = self.source_of(position.file)
        return position._replace(file=self.catalogues[r.name].numbered(position.epoch, position.file - r.lo))

    def to_run(self, name: str, position: Position) -> Position:
        """Source `name`'s `position` (numbered within it, as a state of its epoch numbers it)
        in the run's numbering (`local`'s inverse)."""
        cat = self.catalogues[name]
        file = cat.later.order[position.file] if cat.reordered_at(position.epoch) else position.file
        return position._replace(file=file + self.ranges[name].lo)

    def source_files(self, name: str) -> list:
        """Source `name`'s identities `[name, bytes, footer]`, as known now, in the run's order."""
        r = self.ranges[name]
        return self.files[r.lo:r.hi]

    def files_at(self, name: str, epoch: int) -> list:
        """Source `name`'s identities in the order of its `epoch` (as a state of it lists them)."""
        files, cat = self.source_files(name), self.catalogues[name]
        return [files[t] for t in cat.later.order] if cat.reordered_at(epoch) else files

    def renumbering(self, name: str, epoch: int):
        """The array that renumbers source `name`'s files (the run's order, within it) as a state
        of its `epoch` numbers them, or None where that is the same."""
        return self.catalogues[name].renumbering(epoch)

    def reorder(self, orders: dict, epochs: dict | None):
        """At a resume, every source reads its files as one source does at each of its resumes
        (`Catalogue.reorder`, then `begin`): source `name` of `orders` in `orders[name]` (indices
        into its files as they are now: the state's, then files new to it) in its epoch
        `epochs[name]`, the one it resumes in, and in their sorted place from its next epoch on;
        every other source in its sorted order. So a loader resumed again reads as a fresh one
        given that state, whatever order an earlier resume left it in; `laters` is made anew.
        `epochs` None: not known yet (another rank's state: its replay finds them, `begun` says
        them); until then the sources of `orders` read them in every epoch."""
        files = []
        for name, cat in self.catalogues.items():
            r = self.ranges[name]
            order = orders[name] if name in orders else cat.sorted_order()
            cat.reorder(order)
            cat.begin(epochs.get(name, 1) if epochs is not None else None)
            files += [self.files[r.lo + i] for i in order]
        self.paths = [p for cat in self.catalogues.values() for p in cat.paths]
        self.files = files
        self.laters = {name: cat.later for name, cat in self.catalogues.items() if cat.later is not None}

    def begun(self, epochs: dict):
        """Source `name` of `epochs`, reordered (`reorder`), resumes in its epoch `epochs[name]`:
        it reads its files in their sorted place from the next one on."""
        for name, epoch in epochs.items():
            cat = self.catalogues[name]
            cat.begin(epoch)
            self.laters = {**self.laters, name: cat.later} if cat.later is not None else self.laters

    def footers(self, indices: list) -> list:
        """The footer digests files `indices` have now (None: unreadable)."""
        return source.footer_digests([self.paths[i] for i in indices], self.filesystem)

    def begin(self, epoch: int):
        pass

    def with_footers(self, saved: dict):
        """Take the footers a checked state's `mixture.sources` gives for files of the same name
        and size (as `Catalogue.with_footers`: a resumed run's states go on describing them)."""
        files = []
        for name, r in self.ranges.items():
            files += with_known_footers(self.files[r.lo:r.hi], (saved.get(name) or {}).get("files", []))
        self.files = files

    def learn(self, opened: list, warn):
        """The identities the coordinator read, as `Catalogue.learn` (the run's numbering)."""
        self.files = learned(self.files, self.paths, opened, warn)
