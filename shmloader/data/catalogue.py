"""The split's files as a loader knows them: paths, identities, and the order of each epoch.

A `Catalogue` is made once per loader from `data` (a directory, a glob, a list, a URI) and the
split: the files sorted by full path (`train`: all but the last, `val`: the last, `all`: all),
each with its *identity* `[name, bytes, footer]` (the name: `source.file_names` over the whole
listing, val file too; the footer digest, `source.footer_digest`, is learnt when a run first
reads the file: `learn`). The run numbers the files by their place in `paths`.

The order of an epoch is `paths` in order, except after a resume from a state that does not
list every file now there (shards that arrived since the save, wherever they sort): `reorder`
puts the state's files first and the new ones after them, for the epoch in progress, and from
the epoch after it every file is read in its sorted place again (`later`, a `data.order.Later`:
indices into `paths`, from the epoch after the one the run resumed in, `begin`). A state always numbers the files in
the order of its own epoch (`described`: `pq_idx`, the files as that state lists them, and the
renumbering of the run's file indices into that order).

A state lists the footers of its files up to its position only: those were read before that
batch in every run, while what lies after it depends on how far the coordinator has read
ahead (`described_files`). So states do not depend on timing.
"""
from typing import NamedTuple

import numpy as np

from ..errors import DataError
from . import formats, source
from .formats.column import TOKENS
from .order import Later


def file_list(paths: list, sizes: list, names: list | None = None) -> list[list]:
    """`[[name, bytes, None], ...]`: names (`names`, else each path's basename), not whole paths
    (a moved data set still resumes: `source.file_names`); -1 for a size the filesystem does not
    know (a missing object, reported when it is read); the footer digest is learnt when the run
    opens the file."""
    names = names if names is not None else source.file_names(paths)
    return [[name, -1 if s is None else int(s), None] for name, s in zip(names, sizes)]


def described_files(files: list, epoch: int, file: int) -> list:
    """`files` (identities) as a state at (epoch, file) describes them: with their footers up to
    its position (every file past epoch 1), without them after it."""
    if epoch > 1 or all(f[2] is None for f in files[file + 1:]):
        return files
    return files[:file + 1] + [[name, size, None] for name, size, _ in files[file + 1:]]


def learned(files: list, paths: list, opened: list, warn) -> list:
    """`files` (identities) with what `opened` (`Opened` messages) says of them, a new list;
    a file whose size or footer changed since it was known is warned of."""
    files = list(files)
    for msg in opened:
        name, size, footer = files[msg.file]
        if size != msg.size or footer not in (None, msg.footer):
            warn(f"shmloader: {paths[msg.file]} changed since this loader first knew it "
                 f"({size} bytes, footer {footer}; now {msg.size} bytes, footer {msg.footer}): "
                 f"batches from here on read it as it is now, and states say so")
        files[msg.file] = [name, msg.size, msg.footer]
    return files


class Listing(NamedTuple):
    """A state's files against a loader's now, by name (`listing`): `order`, the loader's files
    (indices) in the order of the epoch in progress, the state's files still there in the state's
    order, then the files new to it in the loader's; `added`, those new ones (indices into the
    loader's); `gone`, the state's files (indices into the state's) the loader has not."""
    order: list
    added: list
    gone: list


def listing(saved: list, now: list) -> Listing:
    """The one rule of a resume's order, one source's (sourcestate.py) and a mixture's source's
    (mixchecks.py): the state's files, then the new ones (`saved`, `now`: identities). A state's
    file that is not there by its name while files whose path ends with it are (`renamed`) is a
    ValueError: the state cannot say which of them it read."""
    index = {f[0]: i for i, f in enumerate(now)}
    renamed([f[0] for f in saved], index)
    names = {f[0] for f in saved}
    added = [i for i, f in enumerate(now) if f[0] not in names]
    return Listing([index[f[0]] for f in saved if f[0] in index] + added, added,
                   [i for i, f in enumerate(saved) if f[0] not in index])


def renamed(saved: list, now) -> None:
    """A ValueError where a name of `saved` (a state's files) is not among `now` (the loader's
    names) but names ending with "/" and it are: a shard arrived in a new directory with the name
    of a file already there (`x/a.parquet` beside `a.parquet`'s directory), so the loader names
    every file by its path below the data's root (`source.file_names`), or a list's files moved
    below another common directory; the state, saved before, cannot say which file it read, and
    none is guessed."""
    for name in saved:
        if name in now:
            continue
        alike = sorted(other for other in now if other.endswith("/" + name))
        if alike:
            raise ValueError(
                f"resume state names file {name}, and this loader has no file of that name but "
                f"{len(alike)} whose path ends with it ({', '.join(alike[:3])}{', ...' if len(alike) > 3 else ''}): "
                "files of one name lie in several of the data's directories now, so the loader names each by its "
                "path below the data's root, and a state saved before (when its name was one file's) cannot say "
                "which of them it read. Resume with the files the state was saved with (move the newer directory "
                "aside), or start a new run over all of them")


def with_known_footers(files: list, known: list) -> list:
    """`files` (identities), a new list, with the footers `known` (a checked state's files)
    gives for files of the same name and size that have none yet."""
    by_name = {f[0]: f for f in known if isinstance(f, list) and len(f) == 3}
    files = [list(f) for f in files]
    for now in files:
        old = by_name.get(now[0])
        if now[2] is None and old is not None and old[2] is not None and now[1] == old[1]:
            now[2] = old[2]
    return files


class Catalogue:
    def __init__(self, data, split: str, filesystem=None, column: str = "text"):
        """Lists `data` (None: nanochat's directory; a `source.Source`: its data, read in its
        column, else in `column`) and takes `split`'s files; raises `DataError` for no files or a
        train split of one file."""
        if isinstance(data, source.Source):
            data, column = data.data, data.column or column
        self.column = source.check_column(column)
        self.filesystem = source.filesystem_for(data, filesystem)
        listing = source.list_files(data, self.filesystem)
        named = dict(zip(listing, source.file_names(listing, data)))  # the whole listing's names, val's too
        self.paths = source.split_files(listing, split)  # in the run's numbering
        sizes = source.file_sizes(self.paths, self.filesystem)
        self.files = file_list(self.paths, sizes, [named[p] for p in self.paths])  # identities
        # the data set's val file (a state remembers it); none for split "all", which reads it too
        self.val = named[listing[-1]] if split != "all" else None
        self._sorted = list(self.paths)
        self.later = None                       # `Later`: the order of the epochs after the resumed one
        self._later_order = self._later_at = None  # that order when it is not `paths`', and its inverse
        self._described = (None, None)          # (key, files) of the last `described`
        self._token_ids = None                  # `reads_token_ids`, once read

    def footers(self, indices: list) -> list:
        """The footer digests files `indices` have now (None: unreadable)."""
        return source.footer_digests([self.paths[i] for i in indices], self.filesystem)

    @property
    def columns(self) -> list:
        """The column read of each file, in the run's numbering."""
        return [self.column] * len(self.paths)

    def fingerprint(self) -> dict:
        """What a state of this data must match beyond its files: the column (when not "text")
        and the files' formats (when not all parquet); a state without them is of "text" in
        parquet. The column's kind (text or token ids) follows from the files and the column;
        token ids add their BOS rule's marker (`TOKEN_IDS`, where `reads_token_ids`): one
        source's in the state's config, a mixture's source's in its own part."""
        return data_fingerprint(self.column, self.paths) | (dict(TOKEN_IDS) if self.reads_token_ids() else {})

    def reads_token_ids(self) -> bool:
        """Whether the column holds token ids (not text), as the first file of the split (in
        sorted order) that says its kind cheaply says (`Format.kind`: a schema, a JSON Lines
        file's first value); False when none does. Read once, in the training process: a state
        over token ids carries the rule of their BOS (state.py `TOKEN_IDS`)."""
        if self._token_ids is None:
            self._token_ids = False
            for path in self._sorted:
                try:
                    kind = formats.open_file(path, self.filesystem).kind(self.column)
                except (DataError, OSError, ValueError):  # the run names what is wrong with it
                    continue
                if kind is not None:
                    self._token_ids = kind == TOKENS
                    break
        return self._token_ids

    def reorder(self, order: list | None):
        """A resume reads the files of its epoch in `order` (indices into `paths`: the state's
        files, then files new to it), and those of the epochs after it in their sorted place."""
        if order is not None:
            self.paths = [self.paths[i] for i in order]
            self.files = [self.files[i] for i in order]
        later = self.sorted_order()
        self._later_order = None if later == list(range(len(later))) else tuple(later)
        self._later_at = np.argsort(later) if self._later_order is not None else None

    def sorted_order(self) -> list:
        """Indices into `paths` of the files in their sorted order (`reorder` of it: none reordered)."""
        place = {path: i for i, path in enumerate(self.paths)}
        return [place[path] for path in self._sorted]

    def begin(self, epoch: int | None):
        """The loader starts (or resumes) in `epoch`: a reordered epoch is this one only (None:
        its epoch is not known yet, and every epoch reads the files as they are ordered now)."""
        self.later = Later(epoch, self._later_order) if self._later_order is not None and epoch is not None else None
        self._described = (None, None)

    def learn(self, opened: list, warn):
        """The identities the coordinator read (`Opened` messages), for the states from here
        on; a file whose size or footer changed since the loader knew it is warned of. The
        list is replaced, never changed in place: states already handed out keep theirs."""
        self.files = learned(self.files, self.paths, opened, warn)
        self._described = (None, None)

    def with_footers(self, known: list):
        """Take the footers `known` (a checked state's files) gives for files of the same name
        and size: a resumed run's states go on describing files it will not read again before
        its next epoch."""
        self.files = with_known_footers(self.files, known)
        self._described = (None, None)

    def described(self, epoch: int, file: int):
        """`(pq_idx, files, renumber)` a state at (epoch, file: the run's numbering) holds: the
        files in the order of its epoch, `described_files` of them, and the array that renumbers
        the run's file indices into that order (None: the same). Kept while it does not change:
        nanochat's loop asks for a state with every batch, and a split may hold thousands of
        files."""
        later = self.reordered_at(epoch)
        pq = self.numbered(epoch, file)
        key = (later, epoch > 1, pq if epoch == 1 else -1)
        if self._described[0] != key:
            files = [self.files[t] for t in self.later.order] if later else self.files
            self._described = (key, described_files(files, epoch, pq))
        return pq, self._described[1], self._later_at if later else None

    def reordered_at(self, epoch: int) -> bool:
        """Whether `epoch` reads the files in `later`'s order, not the run's (an epoch after the
        one a resume reordered): the one test of it, here and in data/sources.py."""
        return self.later is not None and epoch > self.later.after

    def renumbering(self, epoch: int):
        """The array that renumbers the run's file indices as a state of `epoch` numbers them
        (`described`'s), or None where they are the same."""
        return self._later_at if self.reordered_at(epoch) else None

    def numbered(self, epoch: int, file: int) -> int:
        """File `file` (the run's numbering) as a state of `epoch` numbers it (its `pq_idx`): no
        list is made (a state's nanochat keys ask with every batch, for another file than its
        position's, and `described` keeps one answer)."""
        return int(self._later_at[file]) if self.reordered_at(epoch) else file

    def reader(self) -> source.Reader:
        """A `source.Reader` of the files in the catalogue's column (its files opened once each,
        as it reads them: `units`, `may_hold`)."""
        return source.Reader(self.paths, self.filesystem, columns=self.column)

    def units(self, file: int, enough: int) -> int:
        """`file`'s number of units, or `enough` once it holds that many (a JSON Lines file read
        only so far: data/units.py); an unreadable file is a `DataError`."""
        return self.reader().units(file, enough)

    def row_counts(self, file: int, on_bad: str = "raise") -> list:
        """Rows per row group of `file`, from its footer, as the coordinator reads them (with
        `on_bad="skip"`, an unreadable file has none)."""
        reader = source.Reader(self.paths, self.filesystem)
        counts = source.read_or_skip(lambda: reader.row_counts(file), on_bad, lambda text: None, "file")
        return [] if counts is None else counts


# A source of token ids says in its fingerprint that ids already beginning with BOS were given no
# second (procs/worker.py `ids_with_bos`); a state of them without it was saved before that rule,
# when they read [BOS, BOS, ...]: refused (state.py `token_ids_refused`), never resumed one token
# off. Text never holds it, so a text state is as it was.
TOKEN_IDS = {"token_ids": "own BOS kept"}


def data_fingerprint(column: str, paths: list) -> dict:
    """`{"column": ..., "format": ...}` for a source read in `column` from `paths`, each key only
    when it is not the default ("text"; every file parquet), so older states still match."""
    out = {}
    if column != "text":
        out["column"] = column
    kinds = sorted({formats.format_name(p) for p in paths})
    if kinds != ["parquet"]:
        out["format"] = "+".join(kinds)
    return out
