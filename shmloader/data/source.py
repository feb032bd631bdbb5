"""Finding the data files and reading their documents; used by the coordinator and workers.

A file's format is its name's (`formats/`: `.parquet`, `.jsonl`/`.json` plain, `.gz` or
`.zst`, `.arrow`/`.feather`); `Reader` reads any of them through the one `formats.Format`
interface, and nothing here asks which format a file is. A directory keeps every file whose
name a format claims (mixed formats too: each file is read as its name says), but a Hugging
Face `datasets` directory its data files alone (`hfdir`: never its `.json` metadata). Files are sorted
by their full paths; `train` is all but the last file, `val` the last (nanochat's
convention); a state knows each by its name (`file_names`: its basename, or its path below the
data's root where two files share one). `data` may be local (a directory, a glob: a path by
which nothing exists, `**` every depth, a list, `file://` URIs; a list names each file once:
`once`) or on any `pyarrow.fs` filesystem (`s3://bucket/prefix/`, `gs://`, `hdfs://`;
credentials and endpoints from the usual environment or the URI's query, e.g.
`?endpoint_override=host:port&scheme=http`, or an explicit `filesystem=`). Every failure is a
`DataError` naming the file, the row group and what to do; `read_or_skip` applies the
`on_bad_row_group` policy to one.
"""
import glob
import os
import pickle
import sys
import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import DataError, warn
from . import formats, hfdir
from .formats import TEXT, TOKENS, Ids, footer_digest  # noqa: F401 (the source's API)
from .formats.column import UNKNOWN

KINDS = ("a directory of data files (*.parquet, *.jsonl, *.jsonl.zst, *.arrow, ...)")


@dataclass(frozen=True)
class Source:
    """A data source with the column its documents are in: `data` as `ShmLoader` takes it (a
    directory, a glob, a list of files, a URI) and `column` (None: the loader's `column=`,
    "text" unless it says otherwise). It stands as `data=` or as a `Mixture`'s source, so that
    each source of a mixture reads its own column. A column of strings is text to tokenize; a
    column of lists of integers is each document's token ids (used as they are after the BOS,
    which ids already beginning with it are not given again).
    `shuffle` (None: the loader's `shuffle=`) says whether this source is read shuffled
    (data/shuffle.py; a mixture's source with the loader's `seed=` and `shuffle_window=`, its seed
    drawn from them and its name): a corpus shuffled offline beside a date-sorted one."""
    data: object
    column: str | None = None
    shuffle: bool | None = None

    def __post_init__(self):
        if isinstance(self.data, Source):
            raise ValueError(f"Source: data is itself a Source ({self.data!r}); give the directory, glob or files")
        if self.column is not None:
            check_column(self.column)
        if self.shuffle is not None and not isinstance(self.shuffle, bool):
            raise ValueError(f"Source: shuffle must be True, False or None (the loader's shuffle=), "
                             f"got {self.shuffle!r}")


def check_column(column) -> str:
    """`column` if it names a column (a non-empty string), else a ValueError."""
    if not isinstance(column, str) or not column:
        raise ValueError(f"column must name the column that holds the documents (a non-empty string such as "
                         f"'text' or 'content'), got {column!r}")
    return column


def nanochat_base_dir() -> str:
    """nanochat's base directory: `$NANOCHAT_BASE_DIR`, else `~/.cache/nanochat` (its data and
    tokenizer defaults live there)."""
    return os.environ.get("NANOCHAT_BASE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nanochat")


CLIMBMIX_DIR = "base_data_climbmix"  # nanochat's data since its switch to ClimbMix-400B
LEGACY_DIR = "base_data"             # FinewebEdu-100B, before it


def default_data_dir(notice: bool = False) -> str:
    """nanochat's data directory: `$NANOCHAT_BASE_DIR/base_data_climbmix`, or the older
    `base_data` only when the climbmix directory does not exist (nanochat's fallback). With
    `notice` (nanochat: rank 0 of the train split) the fallback prints a short upgrade notice
    to stderr. Neither directory: a `DataError` naming both."""
    base = nanochat_base_dir()
    climbmix, legacy = os.path.join(base, CLIMBMIX_DIR), os.path.join(base, LEGACY_DIR)
    if os.path.exists(climbmix):
        return climbmix
    if not os.path.exists(legacy):
        raise DataError(f"data directory {climbmix} does not exist (nor the older {legacy}, used "
                        f"when it is missing): download shards with `python -m nanochat.dataset`, "
                        f"pass data= (a directory of *.parquet shards, a glob or a list of files) "
                        f"or set NANOCHAT_BASE_DIR")
    if notice:
        print(f"shmloader: {climbmix} not found; falling back to the older FinewebEdu-100B shards "
              f"in {legacy}. nanochat now trains on ClimbMix-400B: to upgrade, run "
              f"`python -m nanochat.dataset -n 170` and retrain the tokenizer with "
              f"`python -m scripts.tok_train`.", file=sys.stderr, flush=True)
    return legacy


def filesystem_for(data, filesystem=None):
    """The pyarrow filesystem `data` lives on, or None for local paths."""
    if filesystem is not None:
        return filesystem
    first = data if isinstance(data, str) else (next(iter(data), "") if isinstance(data, (list, tuple)) else "")
    if isinstance(first, str) and "://" in first and not first.startswith("file://"):
        try:
            return pafs.FileSystem.from_uri(first)[0]
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise DataError(f"{first}: cannot open its filesystem ({exc}); check the URI, the "
                            f"credentials and the endpoint") from exc
    return None


ENV_PREFIXES = ("AWS_", "GOOGLE_", "GCS_", "AZURE_", "HADOOP_", "ARROW_", "LIBHDFS", "JAVA_HOME", "CLASSPATH")


class FilesystemRef:
    """A filesystem to rebuild in a child process, with the trainer's credential variables.

    Children are forked from a server started with the trainer's first loader, so their
    environment may predate variables the trainer set later; and a filesystem made from a URI
    reads its credentials from the environment when used. The child applies the trainer's
    variables, then unpickles the filesystem."""

    def __init__(self, filesystem):
        self.payload = pickle.dumps(filesystem) if filesystem is not None else None
        self.env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}

    def open(self):
        if self.payload is None:
            return None
        os.environ.update(self.env)
        return pickle.loads(self.payload)


def _fs_path(uri: str) -> str:
    """The path inside its filesystem: 's3://bucket/key?x=y' -> 'bucket/key'."""
    if "://" not in uri:
        return uri
    return uri.split("://", 1)[1].split("?", 1)[0]


def list_files(data, filesystem=None) -> list[str]:
    """All data files of `data`: a directory, a glob, or a list of paths; sorted by full path.
    `None` is nanochat's directory (`default_data_dir`). In a directory only names a format
    claims count (`formats.SUFFIXES`), so partial downloads (`*.parquet.tmp`) are skipped, as
    nanochat does; in a Hugging Face `datasets` directory only its data files (`hfdir`).
    A path that exists is that file or directory, whatever `*?[` its name holds (`set[1]/` is
    not `set1/`); a glob is a path that does not exist, its existing leading part literal, `**`
    every depth (Python's recursive glob). A list's entries and a remote path are never globs. A
    directory whose data files are all in its subdirectories is a `DataError` that suggests a
    glob."""
    if data is None:
        data = default_data_dir()
    fs = filesystem_for(data, filesystem)
    if fs is not None:
        return _list_remote(data, fs)
    if isinstance(data, str) and data.startswith("file://"):
        data = data[len("file://"):]
    if isinstance(data, (str, os.PathLike)):
        data = os.fspath(data)
        if os.path.isdir(data):
            names = _directory(data, os.listdir(data), lambda name: _read_local(os.path.join(data, name)),
                               remote=False)
            files = _shards([os.path.join(data, f) for f in names], data)
        elif os.path.isfile(data):
            files = [data]
        elif _is_glob(data) and not os.path.lexists(data):  # nothing by that name: a glob
            files = _shards(sorted(set(glob.glob(_literal_head(data), recursive=True))), data)
            if not files:
                raise DataError(f"no data files match {data} (read as a glob: no file or directory "
                                f"has that name){tilde(data)}: check the path, or write shards there")
        else:
            raise DataError(f"data directory {data} does not exist{tilde(data)}: pass data= ({KINDS}, a glob "
                            f"or a list of files) or set NANOCHAT_BASE_DIR")
        if not files:
            raise DataError(f"no data files in {data} (read by name: {', '.join(formats.SUFFIXES)}): "
                            + (_nested_hint(data) or "download or write shards there (tools/make_shards.py "
                                                     "writes some)"))
    else:
        files = [os.fspath(f).removeprefix("file://") for f in data]
        if not files:
            raise DataError("data is an empty list of files")
        not_files = [f for f in files if not os.path.isfile(f)]
        if not_files:
            raise DataError(_not_files(not_files))
        once(files, os.path.realpath)  # `a.parquet`, `./a.parquet` and a link to it are one file
    return sorted(files)


def once(files: list[str], same=lambda f: f):
    """A list of files names each file once: a state knows a file by its name (`file_names`), and
    a mixture's resume (mixchecks.py `check_sources`) and a change of world size need each name
    once, so a file listed twice is a ValueError naming it, not a file read twice an epoch; a
    source is read more often by its weight in a `Mixture`. `same(f)`: what two spellings of one
    file share. Two files of one name in several directories are two files (`file_names` tells
    them apart)."""
    seen = set()
    for f in files:
        if same(f) in seen:
            raise ValueError(f"data lists {f} twice: a file is read once an epoch (a state knows it by its "
                             "name); to read a source more often, give it a larger weight in a shmloader.Mixture "
                             "(Mixture({'a': files_a, 'b': files_b}, {'a': 2, 'b': 1}))")
        seen.add(same(f))


def file_names(files: list[str], data=None) -> list[str]:
    """The names a state knows `files` by (one listing of `data`: `list_files`'), the one rule of
    them: each file's basename where no two of `files` share one (a directory, and every state
    written before this rule); else every file's path relative to the listing's root, with "/"
    (`x/000_00000.parquet`, `y/000_00000.parquet`: FineWeb's dumps, DCLM's local shards). The
    root is a glob's leading part that exists (`root` of `root/*/*.parquet`), else the common
    directory of the files (a list; a remote list alike). So a shard that arrives in a new
    directory with a name already there renames every file of a listing named by basenames
    until then: a state saved before names none of them now, and its resume is refused saying
    so (data/catalogue.py `listing`), never read as other files."""
    base = [_basename(f) for f in files]
    if len(set(base)) == len(base):
        return base
    slashed = [os.fspath(f).replace("\\", "/") for f in files]
    root = _root(data, slashed)
    return [f[len(root):].lstrip("/") if root else f for f in slashed]


def _basename(path) -> str:
    return os.fspath(path).replace("\\", "/").rsplit("/", 1)[-1]


def _root(data, files: list[str]) -> str:
    """The directory `file_names` names nested files below (every one of `files` starts with it
    and a "/" after it; "" for none): a local glob's existing leading part, else the files'
    common directory."""
    if isinstance(data, (str, os.PathLike)):
        pattern = os.fspath(data).removeprefix("file://").replace("\\", "/")
        if _is_glob(pattern) and "://" not in pattern:
            head = _existing_head(pattern).rstrip("/")
            if head and all(f.startswith(head + "/") for f in files):
                return head
    common = files[0].rsplit("/", 1)[0] if "/" in files[0] else ""
    while common and not all(f.startswith(common + "/") for f in files):
        common = common.rsplit("/", 1)[0] if "/" in common else ""
    return common


def tilde(path: str) -> str:
    """A note for a path that begins with `~` (not expanded here, as in the shell), else ""."""
    if not path.startswith("~"):
        return ""
    return f" ({path} begins with ~, which is not expanded here: pass os.path.expanduser({path!r}))"


def _not_files(paths: list[str]) -> str:
    """What is wrong with a list's entries that are not files, each named for what it is
    (a directory, a glob, missing), and what to pass instead."""
    def what(path):
        if os.path.isdir(path):
            return "a directory"
        if glob.has_magic(path):
            return "a glob, which a list does not expand: pass it alone as data=, or glob.glob() it"
        return "no such file" + tilde(path)
    said = ", ".join(f"{p} ({what(p)})" for p in paths[:3])
    text = f"data lists {len(paths)} path(s) that are not files: {said}; list the data files themselves"
    dirs = [p.rstrip("/") for p in paths if os.path.isdir(p)]
    if dirs:
        parent = os.path.dirname(dirs[0]) if len({os.path.dirname(d) for d in dirs}) == 1 else None
        try:
            files = sorted(n for n in os.listdir(dirs[0]) if formats.is_data_file(n) and not n.startswith("."))
        except OSError:  # a directory it may not list: the hint names parquet's suffix
            files = []
        suffix = next((s for s in sorted(formats.SUFFIXES, key=len, reverse=True) if files and files[0].endswith(s)),
                      ".parquet")
        over = f"a glob over the directories, data='{os.path.join(parent, '*', '*' + suffix)}', " if parent else ""
        text += f", or for whole directories {over}or a shmloader.Mixture of them (a source each)"
    return text


def _nested_hint(directory: str) -> str | None:
    """What to pass for a directory whose data files are all in its subdirectories (FineWeb's
    `data/CC-MAIN-*/`, DCLM's shards): a glob, or None when it holds none."""
    for where, dirs, names in os.walk(directory):
        dirs.sort()
        found = sorted(n for n in names if formats.is_data_file(n) and not n.startswith("."))
        if found and where != directory:
            suffix = next((s for s in sorted(formats.SUFFIXES, key=len, reverse=True) if found[0].endswith(s)), "")
            depth = os.path.relpath(where, directory).count(os.sep) + 1
            one = os.path.join(directory, *["*"] * depth, "*" + suffix)
            return (f"its data files are in its subdirectories (e.g. {os.path.join(where, found[0])}): pass a glob, "
                    f"data={one!r} (that depth) or {os.path.join(directory, '**', '*' + suffix)!r} (every depth)")
    return None


def _directory(where: str, names: list, read, remote: bool) -> list:
    """The names of the data files among a directory's `names` (`read(name)`: a file's bytes): a
    Hugging Face `datasets` directory's own (`hfdir.data_files`; a notice names what it left
    out), else every name a format claims (not a Hub repository's shards of several splits:
    `hfdir.one_hub_split`); `remote`: `where` is a URI, whose refusals say a list, never a glob."""
    picked = hfdir.data_files(where, names, read, remote)
    if picked is None:
        files = [f for f in names if formats.is_data_file(f)]
        hfdir.one_hub_split(where, files, remote)
        return files
    kept, left = picked
    if left:
        warn(f"shmloader: {where}: a Hugging Face datasets directory: read its {len(kept)} data file(s), left "
             f"out {', '.join(left[:5])}{', ...' if len(left) > 5 else ''} (not its data: `cache-*.arrow` "
             f"are .map()'s outputs; give a glob or a list of files to read them)")
    return kept


def _read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def _literal_head(pattern: str) -> str:
    """`pattern` with its longest leading part that exists by its name escaped: an existing
    `set[1]/` in `set[1]/*.parquet` is that directory, not a pattern that matches `set1/`."""
    head = _existing_head(pattern)
    return glob.escape(head) + pattern[len(head):]


def _existing_head(pattern: str) -> str:
    """The longest leading part of `pattern` that exists by its name ("" for none)."""
    head = pattern
    while head and not os.path.lexists(head):
        head = os.path.dirname(head.rstrip(os.sep))
    return head


def _shards(found: list[str], where: str) -> list[str]:
    """The regular files among `found` whose names do not start with a dot; one notice names
    what was left out (a Spark-style `x.parquet/` directory, a `.x.parquet` dot-file)."""
    keep, left = [], []
    for path in found:
        name = os.path.basename(path)
        (left if name.startswith(".") or not os.path.isfile(path) else keep).append(path)
    if left:
        kinds = [_what(p) for p in sorted(left)]
        warn(f"shmloader: {where}: left out {len(left)} entr{'y' if len(left) == 1 else 'ies'} that "
             f"{'is not a shard' if len(left) == 1 else 'are not shards'}: {', '.join(kinds[:5])}"
             f"{', ...' if len(kinds) > 5 else ''} (only regular data files not starting with a dot are read)")
    return keep


def _what(path: str) -> str:
    name = os.path.basename(path)
    if os.path.isdir(path):
        return f"{name}/ (a directory)"
    return f"{name} ({'a dot-file' if name.startswith('.') else 'not a regular file'})"


def _list_remote(data, fs) -> list[str]:
    if not isinstance(data, str):
        files = [_fs_path(os.fspath(f)) for f in data]
        if not files:
            raise DataError("data is an empty list of files")
        once(files)
        return sorted(files)
    path = _fs_path(data).rstrip("/")
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [path]
        if info.type == pafs.FileType.NotFound:
            raise DataError(f"{data}: not found on {fs.type_name}: check the bucket and prefix"
                            + (" (a remote path is never a glob: give the directory, or a list of its files)"
                               if _is_glob(path) else ""))
        found = fs.get_file_info(pafs.FileSelector(path, recursive=False))
    except DataError:
        raise
    except Exception as exc:  # pyarrow's, OSError, or a filesystem's own transport error (hf://: httpx's)
        raise DataError(f"{data}: cannot list it on {fs.type_name} ({type(exc).__name__}: {exc}); check the "
                        f"endpoint, the network, the credentials and the bucket") from exc
    names = [f.base_name for f in found if f.type == pafs.FileType.File and not f.base_name.startswith(".")]
    join = (lambda name: f"{path}/{name}") if path else (lambda name: name)
    files = sorted(join(name) for name in _directory(data, names, lambda name: _read_remote(fs, join(name)),
                                                     remote=True))
    if not files:
        raise DataError(f"no data files in {data} (read by name: {', '.join(formats.SUFFIXES)})")
    return files


def _read_remote(fs, path: str) -> bytes:
    try:
        with fs.open_input_stream(path) as f:
            return f.read()
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: cannot read it ({exc})") from exc


def file_sizes(files: list[str], filesystem=None) -> list[int]:
    """Sizes in bytes, for the data fingerprint."""
    try:
        if filesystem is None:
            return [os.path.getsize(f) for f in files]
        return [info.size for info in filesystem.get_file_info(files)]
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot read the sizes of the data files ({exc})") from exc


SPLITS = {"train": "every file but the last", "val": "the last file", "all": "every file"}


def split_files(files: list[str], split: str) -> list[str]:
    """`split`'s files of `files` (sorted by name): `SPLITS` says which."""
    if split == "train":
        named = hfdir.named_split(files)
        if len(files) < 2:
            if named is not None and named.held:
                raise DataError(f"split 'train' needs at least 2 files (the last one is the val split) but found "
                                f"{len(files)}: {files}, and these are {named.where}, a held-out set's, not a "
                                f"training set's: give the training files as data= (split='all' reads these "
                                f"alone, e.g. for an evaluation)")
            raise DataError(f"split 'train' needs at least 2 files (the last one is the val split) "
                            f"but found {len(files)}: {files}; for a directory that is one split, "
                            f"pass split='all' (every file)")
        if named is not None:
            held = ("these are a held-out set's files, not a training set's (to train, give a training set's "
                    "files as data=); " if named.held else "")
            warn(f"shmloader: split='train' reads every file but the last of the {len(files)} files of "
                 f"{named.where}: {held}{os.path.basename(files[-1])} is left out as nanochat's val file of a "
                 f"directory (split='val' reads it); to {'read' if named.held else 'train on'} every file of "
                 f"one split, pass split='all'")
        return files[:-1]
    if split == "val":
        held = hfdir.held_out(files) if len(files) > 1 else None
        if held:
            warn(f"shmloader: split='val' reads the last of the {len(files)} files of {held} "
                 f"({os.path.basename(files[-1])}), nanochat's val split of a directory; to read all of a "
                 f"held-out set's files, pass split='all'")
        return files[-1:]
    if split == "all":
        return list(files)
    raise ValueError(f"split must be one of {split_names()}, got {split!r}")


def split_names() -> str:
    """The splits and their files, for an error: "'train' (every file but the last), ..."."""
    return ", ".join(f"{name!r} ({files})" for name, files in SPLITS.items())


def read_or_skip(read, policy: str, report_bad, what: str):
    """`read()`; when it raises a `DataError` and `policy` (`on_bad_row_group`) is "skip",
    `report_bad(text)` and None instead. `what` names what is skipped ("file", "row group")."""
    try:
        return read()
    except DataError as exc:
        if policy != "skip":
            raise
        report_bad(f"skipped a bad {what}: {exc}")
        return None


def file_size(path: str, filesystem=None) -> int | None:
    """A file's size in bytes now, or None when it cannot be read."""
    try:
        return os.path.getsize(path) if filesystem is None else filesystem.get_file_info(path).size
    except (OSError, pa.ArrowException):
        return None


def footer_digests(paths: list[str], filesystem=None, threads: int = 16) -> list[str | None]:
    """Each file's identity digest (`Format.digest`: parquet's footer, else its size and ends;
    None for one that cannot be read); a remote filesystem's reads go `threads` at a time."""
    def one(path):
        try:
            return formats.digest_of(path, filesystem)
        except (DataError, pa.ArrowException, OSError):
            return None
    if filesystem is None or len(paths) < 2:
        return [one(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(paths))) as pool:
        return list(pool.map(one, paths))


def columns_for(files: list, columns) -> list:
    """One column name per file: `columns` is a name (every file) or a list of them (None: "text")."""
    if columns is None or isinstance(columns, str):
        return [columns or "text"] * len(files)
    return list(columns)


KEEP_OPEN = 4  # files a `Reader` keeps open: one source reads one file at a time


class Reader:
    """Lazily opened data files of any format (`formats.open_file`), at most `keep_open` open at once;
    reads each file's column `columns[f]` (text, or token ids checked against `n_vocab`).

    `identity(f)` is `(size, digest)` of file f as opened (`Format.digest`: parquet's footer).
    `expect(f, digest)`: the file must have that digest when this process opens it (a worker is
    told the one its coordinator planned with), else it changed in between: a `DataError`
    saying so. A unit that cannot be read of a file whose size changed since it was opened is
    reported as a file changed under the reader, not as a corrupt one."""

    def __init__(self, files: list[str], filesystem=None, columns=None, n_vocab: int | None = None,
                 keep_open: int = KEEP_OPEN):
        """`keep_open`: the files kept open; the one opened longest ago is closed past it (a mixture
        reads several sources' files in turn: `sources.keep_open`)."""
        self.files = files
        self.filesystem = filesystem
        self.keep_open = keep_open
        self.columns = columns_for(files, columns)
        self.n_vocab = n_vocab
        self._open = {}      # f -> its Format, opened
        self._ids = {}       # f -> (size, digest) when opened
        self._expected = {}  # f -> the digest it must have
        self._sizes = {}     # f -> (row counts, text bytes) of its units, while it is open
        self._kinds = {}     # f -> its column's kind (`kind`), once known

    def expect(self, f: int, digest: str | None):
        if digest is not None:
            self._expected[f] = digest

    def identity(self, f: int) -> tuple:
        self._file(f)
        return self._ids[f]

    def _file(self, f: int) -> formats.Format:
        fmt = self._open.get(f)
        if fmt is None:
            path = self.files[f]
            fmt = formats.open_file(path, self.filesystem)
            ident = (file_size(path, self.filesystem), fmt.digest())
            want = self._expected.get(f)
            if want is not None and ident[1] != want:
                raise DataError(f"{path} changed while the run read it: its identity (digest {ident[1]}) is not "
                                f"the one the run planned with ({want}; a data file must not be rewritten under "
                                f"a running loader; resume from a saved state once it is written)")
            if len(self._open) >= self.keep_open:
                gone = next(iter(self._open))
                del self._open[gone]
                self._sizes.pop(gone, None)
            self._open[f], self._ids[f] = fmt, ident
        return fmt

    def row_counts(self, f: int) -> list[int]:
        """Rows of each unit of file f (a parquet row group, an Arrow batch, 1024 lines)."""
        return self._row_sizes(f)[0]

    def may_hold(self, f: int) -> list | None:
        """File f's units, each False where its metadata says it holds no document (`Format.may_hold`)."""
        return self._file(f).may_hold(self.columns[f])

    def units(self, f: int, enough: int) -> int:
        """File f's number of units, or `enough` once it holds that many (`Format.units`)."""
        sizes = self._sizes.get(f)
        return min(enough, len(sizes[0])) if sizes is not None else self._file(f).units(enough)

    def kind(self, f: int) -> str:
        """File f's column's kind as its format says it cheaply (`Format.kind`), for the token
        cache's key; `UNKNOWN` where it says none (a JSON Lines file whose first lines are
        null) or the file cannot be opened or lacks the column (reading it says what is wrong),
        which the cache keys as not text, so that an entry of token ids made before their BOS
        rule is never served under text's key. Kept per file: a run served by the cache opens
        each file once for it, not again after closing it."""
        kind = self._kinds.get(f)
        if kind is None:
            try:
                kind = self._file(f).kind(self.columns[f]) or UNKNOWN
            except (DataError, OSError, ValueError):
                kind = UNKNOWN
            self._kinds[f] = kind
        return kind

    def text_bytes(self, f: int) -> list[int]:
        """About each unit's text size in bytes (`Format.unit_bytes`; 0: unknown)."""
        return self._row_sizes(f)[1]

    def _row_sizes(self, f: int) -> tuple:
        """`(row counts, text bytes)` of file f's units, read once while it stays open (the
        order asks for them at every unit)."""
        sizes = self._sizes.get(f)
        if sizes is None:
            fmt = self._file(f)
            sizes = self._sizes[f] = (fmt.rows(), fmt.unit_bytes(self.columns[f]))
        return sizes

    def read_texts(self, f: int, rg: int, start: int, end: int) -> list:
        """Rows `[start, end)` of unit `rg` of file `f` as documents: a list of str (None = null),
        or `Ids` for a token-id column."""
        fmt = self._file(f)
        try:
            return fmt.read(rg, start, end, self.columns[f], self.n_vocab)
        except DataError as exc:
            path = self.files[f]
            before, now = self._ids[f][0], file_size(path, self.filesystem)
            if now != before:
                raise DataError(f"{path}: {fmt.place(rg)} cannot be read: the file changed while it was "
                                f"being read ({before} bytes when opened, {now} now); a data file must not "
                                f"be rewritten under a running loader") from exc
            raise


def text_column_problem(path: str, schema, where: str = "", column: str = "text"):
    """`formats.column.kind_of`: the column's kind (text or token ids), else a `DataError`."""
    from .formats.column import kind_of
    return kind_of(path, schema, column, where)


class SchemaCheck:
    """Every file's column checked from what its format says cheaply (a schema: parquet's footer,
    an Arrow file's; a JSON Lines file is checked line by line when read), ahead of the run
    reaching it, on a thread of its own (so the first batch never waits for it), in the order
    the run reads the files from `first`; files where this rank has no unit are not its to read.
    `found()` is the first problem, a `DataError` naming the file and the unit where the run
    would have met it, or None. Used by the coordinator under `on_bad_row_group="raise"`: a bad
    file hours into a run is then warned of seconds into it (and raised when the run reaches
    it, by the worker that reads it)."""

    def __init__(self, files: list[str], filesystem, rank: int, first: int = 0, columns=None):
        self.files, self.filesystem, self.rank, self.first = files, filesystem, rank, first
        self.columns = columns_for(files, columns)
        self._found = None
        self._thread = threading.Thread(target=self._run, name="shmloader-schema-check", daemon=True)
        self._thread.start()

    def found(self) -> "DataError | None":
        return self._found

    def _run(self):
        order = list(range(self.first, len(self.files))) + list(range(self.first))
        for f in order:  # a daemon thread: it ends with the coordinator
            path = self.files[f]
            try:
                opened = formats.open_file(path, self.filesystem)
                units = opened.n_units()
                if units is None or units > self.rank:
                    opened.kind(self.columns[f], f"{opened.place(self.rank)} (checked ahead): ")
            except DataError as exc:
                if "(checked ahead)" not in str(exc):
                    continue  # unreadable files are reported when the run reads them
                self._found = exc
                return
            except Exception:  # noqa: BLE001 - unreadable files are reported when the run reads them
                continue
