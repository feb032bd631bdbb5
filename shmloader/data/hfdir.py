"""Hugging Face `datasets` directories given as `data=`: which of their files are data.

`datasets` (2.x to 5.x) writes three kinds of directory, each with JSON metadata beside its
Arrow files (stream format), which must never be read as JSON Lines data:

- `Dataset.save_to_disk(dir)`: `data-0000N-of-0000M.arrow`, `state.json` (its `_data_files`
  lists those files) and `dataset_info.json`. Read: exactly the files `state.json` lists (each
  must be there, else a `DataError`), in name order like every directory, which for these
  names (numbered from 0, zero-padded) is `state.json`'s order; never the metadata.
- `DatasetDict.save_to_disk(dir)`: `dataset_dict.json` and one such directory per split: a
  `DataError` that says to give one split's directory (`dir/train`).
- a `datasets` cache directory (`load_dataset(..., cache_dir=)`): `<builder>-<split>.arrow` or
  `<builder>-<split>-0000N-of-0000M.arrow`, `dataset_info.json`, and `cache-<hash>.arrow`
  tables written by `.map()` / `.filter()` (derived tables, not the data set: read with it,
  every document would come twice or other columns): its `.arrow` files but `cache-*.arrow`,
  with a notice naming what was left out. When its files are of more than one split (by
  `dataset_info.json`'s `splits` and the files' names), a `DataError` that says to pick one by
  a glob (`dir/*-train*.arrow`).

A directory is one of these when it holds `dataset_dict.json`, `dataset_info.json`, or a
`state.json` with `_data_files`; any other directory is read as every file a format claims
(`formats.is_data_file`), unless those are the files of a train split beside a held-out one by
their names: a Hugging Face Hub repository's shards (`datasets`' uploads,
`<split>-0000N-of-0000M[-<hash>].<ext>`, e.g. `data/train-00000-of-00002.parquet` beside
`data/test-00000-of-00001.parquet`; `train_sft-*` beside `test_sft-*`), or files named by a split
alone (`train.parquet` beside `test.parquet`, as `Dataset.to_parquet` is often called): read as
one directory, `split="train"` would train on the test split (it sorts first), so
`one_hub_split` makes them a `DataError` that says to pick one by a glob of its Hub shards, or by
the list of its files (a remote directory's always: never a glob). Pure over a directory's names and a function that
reads one of its files, so a local and a remote listing decide alike.
"""
import json
import os
import re
from typing import NamedTuple

from ..errors import DataError

DICT, INFO, STATE = "dataset_dict.json", "dataset_info.json", "state.json"
METADATA = (DICT, INFO, STATE)
CACHE = re.compile(r"cache-[0-9a-f]+(_\d+_of_\d+)?\.arrow$")  # `.map()`'s outputs
# a Hub upload's shards, [<config>-]<split>-0000N-of-0000M[-<hash>].<ext>: group 1 the split
HUB = re.compile(r"(?:.*-)?([A-Za-z_]+)-\d{5}-of-\d{5}(-[0-9a-f]+)?\.")
HELD_OUT = frozenset({"test", "validation", "valid", "val", "dev", "eval", "evaluation"})  # splits not to train on
TRAIN_NAMES = frozenset({"train", "training"})  # a train split's names (`split_kind`)
# a file named by a split alone, numbered or not (not a Hub shard): `val-00000.parquet`,
# `validation_1.jsonl.zst`, `test.arrow`, `train_sft-3.parquet`: group 1 the split, if `split_kind` knows it
NAMED = re.compile(r"([A-Za-z]+(?:_[A-Za-z]+)*)(?:[-_]\d+)*\.")
# files that are a known corpus's held-out part by their name alone: nanochat's val shard of
# FineWeb-Edu-100B (its MAX_SHARD, 1822: nanochat's loader reads the last file as val)
HELD_FILES = {"shard_01822.parquet": "nanochat's val shard of FineWeb-Edu-100B (its last, shard_01822.parquet)"}


def data_files(where: str, names: list, read, remote: bool = False) -> tuple | None:
    """`(kept, left)`: the names of the data files of the `datasets` directory `where` holding
    `names`, and the data-like names left out (not metadata); None when it is no such directory.
    `read(name)` gives a file's bytes; `remote`: `where` is a URI (a refusal then says a list of
    files, never a glob)."""
    if DICT in names:
        raise DataError(f"{where}: a Hugging Face DatasetDict saved by save_to_disk ({DICT}, splits "
                        f"{_splits_of_dict(read)}): it is one directory per split; give one split's "
                        f"directory, e.g. data='{where.rstrip('/')}/train'")
    state = _json(read, STATE) if STATE in names else None
    listed = state.get("_data_files") if isinstance(state, dict) else None
    if isinstance(listed, list):
        return _saved(where, names, listed)
    if INFO not in names:
        return None
    arrows = [n for n in names if n.endswith(".arrow")]
    kept = sorted(n for n in arrows if not CACHE.match(n))
    _one_split(where, kept, _json(read, INFO), remote)
    return kept, sorted(n for n in arrows if CACHE.match(n))


def _saved(where: str, names: list, listed: list) -> tuple:
    """A `save_to_disk` directory: the files `state.json` lists, all of them."""
    wanted = [d.get("filename") if isinstance(d, dict) else None for d in listed]
    if not wanted or not all(isinstance(n, str) and n for n in wanted):
        raise DataError(f"{where}/{STATE}: '_data_files' is {listed!r}, expected a list of "
                        f"{{'filename': ...}} (a Hugging Face save_to_disk directory); save the data set again")
    missing = [n for n in wanted if n not in names]
    if missing:
        raise DataError(f"{where}: {STATE} lists {len(wanted)} data file(s), {len(missing)} not in the "
                        f"directory ({missing[:3]}): the save is incomplete; save the data set again")
    left = sorted(n for n in names if n not in wanted and n not in METADATA and n.endswith(".arrow"))
    return sorted(wanted), left


def _one_split(where: str, files: list, info, remote: bool) -> None:
    """A cache directory's files are of one split, else a `DataError` saying how to pick one: a
    glob of its files, or for a `remote` directory the list of them (`_remote_list`)."""
    splits = list(info.get("splits") or {}) if isinstance(info, dict) else []
    if len(splits) < 2:
        return
    of = {s: [n for n in files if re.search(rf"-{re.escape(s)}(-\d+-of-\d+)?\.arrow$", n)] for s in splits}
    found = sorted(s for s in splits if of[s])
    if len(found) > 1:
        picked = _pick(found)
        data = _remote_list(where, of[picked]) if remote else repr(f"{where.rstrip('/')}/*-{picked}*.arrow")
        raise DataError(f"{where}: a Hugging Face datasets cache directory with files of {len(found)} splits "
                        f"({', '.join(found)}); read one split by {'the list' if remote else 'a glob'} of its "
                        f"files, e.g. data={data}")


def split_kind(split: str) -> str:
    """What a split is, by its name: in lower case, up to its first `_` (`train_sft`, `TRAIN`,
    `training`: train, `TRAIN_NAMES`; `validation_matched`: validation; `test_sft`: test); held
    out where in `HELD_OUT`."""
    kind = split.lower().split("_")[0]
    return "train" if kind in TRAIN_NAMES else kind


def _pick(splits: list) -> str:
    """The split a refusal suggests reading: the first train split, else the first."""
    return next((s for s in splits if split_kind(s) == "train"), splits[0])


class SplitsRefused(DataError):
    """Data files of several splits, refused (`one_hub_split`); `in_mixture`: the refusal as said
    of a `Mixture`'s source, where `split=` applies to every source."""

    def __init__(self, text: str, in_mixture: str | None = None):
        super().__init__(text)
        self.in_mixture = in_mixture


def one_hub_split(where: str, files: list, remote: bool) -> None:
    """A directory's data files `files` (names) are not the files of a train split beside a
    held-out one by their names (`_split_of`: Hugging Face Hub shards, `test-*` or
    `validation_matched-*` beside `train-*`; or files named by a split alone, `test.parquet` beside
    `train.parquet`, `val_0.jsonl` beside `train_0.jsonl`; `split_kind` says which), else a
    `SplitsRefused` saying how to read one split: a glob of its Hub shards, or the list of its files
    (a `remote` directory's, never a glob, each with `where`'s query, `?...`). Files of other
    names (`en-*` beside `de-*`, `docs-*` beside `eval-*`) are one corpus: read as one directory,
    split='train' would read the others' files, and the held-out ones sort first ("test" < "train")."""
    by_split, hub = {}, True
    for name in sorted(files):
        if (split := _split_of(name)) is not None:
            by_split.setdefault(split, []).append(name)
            hub = hub and HUB.match(name) is not None
    kinds = {split_kind(s) for s in by_split}
    if "train" not in kinds or not HELD_OUT.intersection(kinds):
        return
    found = sorted(by_split)
    picked = (by_split[_pick(found)] if hub else  # a glob of one split's shards; else the list of every train one's
              sorted(name for s in found if split_kind(s) == "train" for name in by_split[s]))
    what = "Hugging Face Hub shards of {} splits" if hub else "files of {} splits, as their names say,"
    said = (f"{where}: {what.format(len(found))} ({', '.join(found)}); read as one directory "
            f"they would be one corpus (split='train': every file but the last, the other splits' too); read one "
            f"split by {'a glob' if hub and not remote else 'the list'} of its files, e.g. "
            f"data={_one_split_data(where, picked, remote) if hub else _list(where, picked, remote)}")
    raise SplitsRefused(f"{said} with split='all' (and another loader over the validation split's files)",
                        f"{said} (in a Mixture, split= applies to every source: split='all' would read the other "
                        f"sources' val files too; with split='train' the last of these files is this source's val "
                        f"file)")


def _one_split_data(where: str, picked: list, remote: bool) -> str:
    """`data=` for the Hub shards `picked` (names) of directory `where`: a local glob of them, or
    the list of a remote directory's (`where` a URI: each with its query, as the loader takes a list)."""
    if not remote:
        example = HUB.match(picked[0])
        return repr(f"{where.rstrip('/')}/{example.string[:example.end(1)]}-*{example.string[example.end() - 1:]}")
    return _remote_list(where, picked)


def _list(where: str, names: list, remote: bool) -> str:
    """`data=` for the files `names` of directory `where` as a list: a remote one's (`_remote_list`),
    or a local one's paths."""
    if remote:
        return _remote_list(where, names)
    return repr([os.path.join(where, name) for name in names])


def _remote_list(where: str, names: list) -> str:
    """`data=` for the files `names` of the remote directory `where` (a URI, never a glob): the
    list of them, each with `where`'s query, as the loader takes a list."""
    base, sep, query = where.partition("?")
    return repr([f"{base.rstrip('/')}/{name}{sep}{query}" for name in names])


HELD_OUT_DIRS = frozenset({"validation", "valid", "val"})  # directory names that say a held-out set


class Named(NamedTuple):
    """One split's files, as their names say (`named_split`): `where` names them (their
    directory, or "the 'train' split" of Hub shards), `held` whether a held-out set's."""
    where: str
    held: bool


def named_split(paths: list) -> Named | None:
    """What names `paths` (one directory's files, or one split's Hub shards) the files of one
    split, or None: their directory is `train/`, or `validation/`, `valid/` or `val/` (held out,
    `HELD_OUT_DIRS`; not `test/`, `dev/`, `eval/`, which name other things too), or their names
    are all of one split that `split_kind` knows: train, or held out (`HELD_OUT`), as Hub shards
    (`validation-0000N-of-0000M.parquet`, `test_sft-*`) or named by the split alone (`NAMED`:
    `val-00000.parquet`, `validation_1.jsonl`, `test.arrow`), or they are one file a known corpus
    holds out (`HELD_FILES`: nanochat's val shard). Other names name no split
    (`Dataset.save_to_disk`'s `data-0000N-of-0000M.arrow`, a subset's `en-*`). Held out first
    where both say (split='train' leaving out the last file as nanochat's val file is worth a
    word either way: data/source.py `split_files`)."""
    dirs = {os.path.dirname(p) for p in paths}
    folder = next(iter(dirs)) if len(dirs) == 1 else None
    kind = os.path.basename(folder).lower() if folder is not None else None
    by_dir = (Named(folder, kind in HELD_OUT_DIRS) if kind in HELD_OUT_DIRS or kind == "train" else None)
    names = {os.path.basename(p) for p in paths}
    splits = {_split_of(name) for name in names}
    split = next(iter(splits)) if len(splits) == 1 else None
    known = split_kind(split) if split is not None else None
    by_name = (Named(f"the {split!r} split", known in HELD_OUT)
               if known == "train" or known in HELD_OUT else None)
    by_file = Named(HELD_FILES[next(iter(names))], True) if len(names) == 1 and names <= HELD_FILES.keys() else None
    named = [n for n in (by_dir, by_name, by_file) if n is not None]
    return next((n for n in named if n.held), named[0] if named else None)


def _split_of(name: str) -> str | None:
    """The split a file's name says: a Hub shard's (`HUB`), else a name that is a split's alone
    (`NAMED`: `val-00000.parquet`) where `split_kind` knows it (train or `HELD_OUT`); else None."""
    if (hub := HUB.match(name)) is not None:
        return hub.group(1)
    named = NAMED.match(name)
    if named is None:
        return None
    kind = split_kind(named.group(1))
    return named.group(1) if kind == "train" or kind in HELD_OUT else None


def held_out(paths: list) -> str | None:
    """What names `paths` a held-out set (`named_split`'s, where held out), or None."""
    named = named_split(paths)
    return named.where if named is not None and named.held else None


def _json(read, name: str):
    """A metadata file's JSON, or None when it cannot be read or parsed."""
    try:
        return json.loads(read(name))
    except (OSError, ValueError, DataError):
        return None


def _splits_of_dict(read) -> str:
    info = _json(read, DICT)
    splits = info.get("splits") if isinstance(info, dict) else None
    return ", ".join(map(str, splits)) if isinstance(splits, list) and splits else "unknown"
