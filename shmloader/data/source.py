"""Finding the shards and reading their `text` column; used by the coordinator and workers.

Files are sorted by name; `train` is all but the last file, `val` the last (nanochat's
convention). `data` may be local (a directory, a glob: a path by which nothing exists, a list,
`file://` URIs) or on any `pyarrow.fs` filesystem (`s3://bucket/prefix/`, `gs://`, `hdfs://`;
credentials and endpoints from the usual environment or the URI's query, e.g.
`?endpoint_override=host:port&scheme=http`, or an explicit `filesystem=`). Every failure is a
`DataError` naming the file, the row group and what to do; `read_or_skip` applies the
`on_bad_row_group` policy to one.
"""
import glob
import hashlib
import os
import pickle
import sys
import threading

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import DataError, warn


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
    """All parquet files of `data`: a directory, a glob, or a list of paths; sorted by name.
    `None` is nanochat's directory (`default_data_dir`). In a directory only names ending in
    `.parquet` count, so partial downloads (`*.parquet.tmp`) are skipped, as nanochat does.
    A path that exists is that file or directory, whatever `*?[` its name holds (`set[1]/` is
    not `set1/`); a glob is a path that does not exist, its existing leading part literal. A
    list's entries and a remote path are never globs."""
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
            files = _shards([os.path.join(data, f) for f in os.listdir(data) if f.endswith(".parquet")], data)
        elif os.path.isfile(data):
            files = [data]
        elif _is_glob(data) and not os.path.lexists(data):  # nothing by that name: a glob
            files = _shards(glob.glob(_literal_head(data)), data)
            if not files:
                raise DataError(f"no *.parquet files match {data} (read as a glob: no file or directory "
                                f"has that name): check the path, or write shards there")
        else:
            raise DataError(f"data directory {data} does not exist: pass data= (a directory of "
                            f"*.parquet shards, a glob or a list of files) or set NANOCHAT_BASE_DIR")
        if not files:
            raise DataError(f"no *.parquet files in {data}: download or write shards there "
                            f"(tools/make_shards.py writes some)")
    else:
        files = [os.fspath(f).removeprefix("file://") for f in data]
        if not files:
            raise DataError("data is an empty list of files")
        not_files = [f for f in files if not os.path.isfile(f)]
        if not_files:
            raise DataError(f"data lists {len(not_files)} path(s) that are not files: {not_files[:3]}; "
                            f"list the parquet shards themselves")
    return sorted(files)


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def _literal_head(pattern: str) -> str:
    """`pattern` with its longest leading part that exists by its name escaped: an existing
    `set[1]/` in `set[1]/*.parquet` is that directory, not a pattern that matches `set1/`."""
    head = pattern
    while head and not os.path.lexists(head):
        head = os.path.dirname(head.rstrip(os.sep))
    return glob.escape(head) + pattern[len(head):]


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
             f"{', ...' if len(kinds) > 5 else ''} (only regular *.parquet files not starting with a dot are read)")
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
        return sorted(files)
    path = _fs_path(data).rstrip("/")
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [path]
        if info.type == pafs.FileType.NotFound:
            raise DataError(f"{data}: not found on {fs.type_name}: check the bucket and prefix")
        found = fs.get_file_info(pafs.FileSelector(path, recursive=False))
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{data}: cannot list it on {fs.type_name} ({exc}); check the endpoint, "
                        f"the credentials and the bucket") from exc
    files = sorted(f.path for f in found if f.type == pafs.FileType.File and f.path.endswith(".parquet")
                   and not f.base_name.startswith("."))
    if not files:
        raise DataError(f"no *.parquet files in {data}")
    return files


def file_sizes(files: list[str], filesystem=None) -> list[int]:
    """Sizes in bytes, for the data fingerprint."""
    try:
        if filesystem is None:
            return [os.path.getsize(f) for f in files]
        return [info.size for info in filesystem.get_file_info(files)]
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot read the sizes of the data files ({exc})") from exc


def split_files(files: list[str], split: str) -> list[str]:
    if split == "train":
        if len(files) < 2:
            raise DataError(f"split 'train' needs at least 2 files (the last one is the val split) "
                            f"but found {len(files)}: {files}")
        return files[:-1]
    if split == "val":
        return files[-1:]
    raise ValueError(f"split must be 'train' or 'val', got {split!r}")


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


def footer_digest(metadata) -> str:
    """A file's identity beyond its name and size: a hash of its parquet footer (the schema,
    every row group's rows, column chunks' offsets and compressed sizes), which a rewrite with
    other text changes unless every page compresses to the same size. Re-serialised from the
    metadata already read (no second read); about 0.5 ms for a 50-row-group shard."""
    sink = pa.BufferOutputStream()
    metadata.write_metadata_file(sink)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]


def footer_digests(paths: list[str], filesystem=None, threads: int = 16) -> list[str | None]:
    """`footer_digest` of each file (None for one that cannot be read); a remote filesystem's
    reads go `threads` at a time."""
    def one(path):
        try:
            return footer_digest(pq.ParquetFile(path, filesystem=filesystem).metadata)
        except (pa.ArrowException, OSError):
            return None
    if filesystem is None or len(paths) < 2:
        return [one(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(paths))) as pool:
        return list(pool.map(one, paths))


KEEP_OPEN = 4  # files a `ParquetSource` keeps open: one source reads one file at a time


class ParquetSource:
    """Lazily opened parquet files; caches the footers and the last row group read.

    `identity(f)` is `(size, footer digest)` of file f as opened. `expect(f, digest)`: the
    file must have that footer when this process opens it (a worker is told the one its
    coordinator planned with), else it changed in between: a `DataError` saying so. A row group
    that cannot be read of a file whose size changed since it was opened is reported as a file
    changed under the reader, not as a corrupt one."""

    def __init__(self, files: list[str], filesystem=None, keep_open: int = KEEP_OPEN):
        """`keep_open`: the files kept open (their footers with them); the one opened longest
        ago is closed past it (a mixture reads several sources' files in turn: `sources.keep_open`)."""
        self.files = files
        self.filesystem = filesystem
        self.keep_open = keep_open
        self._open = {}
        self._ids = {}      # f -> (size, footer digest) when opened
        self._expected = {}  # f -> the footer digest it must have
        self._last = None   # (file, rg, text column)
        self._sizes = {}    # f -> (row counts, text bytes) of its row groups, while it is open

    def expect(self, f: int, digest: str | None):
        if digest is not None:
            self._expected[f] = digest

    def identity(self, f: int) -> tuple:
        self._file(f)
        return self._ids[f]

    def _file(self, f: int) -> pq.ParquetFile:
        pf = self._open.get(f)
        if pf is None:
            path = self.files[f]
            try:
                # pre-buffering coalesces a remote file's reads; a local one reads 7% faster without
                pf = pq.ParquetFile(path, filesystem=self.filesystem, pre_buffer=self.filesystem is not None)
            except FileNotFoundError as exc:
                raise DataError(f"{path}: file not found ({exc})") from exc
            except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
                raise DataError(f"{path}: not a readable parquet file ({exc}); re-download or "
                                f"rewrite it") from exc
            ident = (file_size(path, self.filesystem), footer_digest(pf.metadata))
            want = self._expected.get(f)
            if want is not None and ident[1] != want:
                raise DataError(f"{path} changed while the run read it: its parquet footer is not the one "
                                f"the run planned with (a data file must not be rewritten under a running "
                                f"loader; resume from a saved state once it is written)")
            if len(self._open) >= self.keep_open:
                gone = next(iter(self._open))
                del self._open[gone]
                self._sizes.pop(gone, None)
            self._open[f], self._ids[f] = pf, ident
        return pf

    def row_counts(self, f: int) -> list[int]:
        return self._row_sizes(f)[0]

    def text_bytes(self, f: int) -> list[int]:
        """Each row group's `text` column chunk size, uncompressed, from the footer: about its
        text's size (plus 4 bytes a row; a dictionary-encoded column counts each distinct
        text once). 0 for every row group when there is no `text` column (the worker that
        reads it reports that)."""
        return self._row_sizes(f)[1]

    def _row_sizes(self, f: int) -> tuple:
        """`(row counts, text bytes)` of file f's row groups, read from its footer once while
        it stays open (the order asks for them at every row group)."""
        md = self._file(f).metadata
        sizes = self._sizes.get(f)
        if sizes is None:
            groups = [md.row_group(i) for i in range(md.num_row_groups)]
            at = next((j for j in range(groups[0].num_columns) if groups[0].column(j).path_in_schema == "text"),
                      None) if groups else None
            sizes = self._sizes[f] = ([g.num_rows for g in groups],
                                      [0 if at is None else g.column(at).total_uncompressed_size for g in groups])
        return sizes

    def read_texts(self, f: int, rg: int, start: int, end: int) -> list:
        """Rows `[start, end)` of the `text` column of row group `rg` of file `f` (None = null)."""
        if self._last is None or self._last[:2] != (f, rg):
            self._last = None
            self._last = (f, rg, self._read_column(f, rg))
        try:
            return self._last[2].slice(start, end - start).to_pylist()
        except (UnicodeDecodeError, pa.ArrowException) as exc:
            raise DataError(f"{self.files[f]}: row group {rg}, rows {start}-{end}: the text is not "
                            f"valid UTF-8 ({exc}); fix the file or pass on_bad_row_group='skip'") from exc

    def _read_column(self, f: int, rg: int):
        path = self.files[f]
        pf = self._file(f)
        kind = text_column_problem(path, pf.schema_arrow, f"row group {rg}: ")
        try:
            # one thread: a worker is one process per core already; pyarrow's pool would
            # only contend with the other workers for the same cores
            column = pf.read_row_group(rg, columns=["text"], use_threads=False).column("text")
        except (pa.ArrowException, OSError) as exc:
            before, now = self._ids[f][0], file_size(path, self.filesystem)
            if now != before:
                raise DataError(f"{path}: row group {rg} cannot be read: the file changed while it was "
                                f"being read ({before} bytes when opened, {now} now); a data file must not "
                                f"be rewritten under a running loader") from exc
            raise DataError(f"{path}: row group {rg} cannot be read ({exc}); the file is "
                            f"corrupt or truncated: re-download or rewrite it") from exc
        return column if kind in (pa.string(), pa.large_string()) else column.cast(pa.large_string())


def text_column_problem(path: str, schema, where: str = ""):
    """The `text` column's type if it can be read as text (string, large_string, string_view,
    or a dictionary of one of them: the last two are cast), else a `DataError` naming the file."""
    if "text" not in schema.names:
        raise DataError(f"{path}: {where}no 'text' column (columns: {schema.names}); write the "
                        f"documents to a string column named 'text'")
    kind = schema.field("text").type
    values = kind.value_type if pa.types.is_dictionary(kind) else kind
    if not (pa.types.is_string(values) or pa.types.is_large_string(values) or pa.types.is_string_view(values)):
        raise DataError(f"{path}: {where}column 'text' is {kind}, expected a string column (string, "
                        f"large_string, string_view, or a dictionary of strings)")
    return kind


class SchemaCheck:
    """Every file's `text` column checked from its footer ahead of the run reaching it, on a
    thread of its own (so the first batch never waits for it), in the order the run reads
    the files from `first`; files where this rank has no row group are not its to read.
    `found()` is the first problem, a `DataError` naming the file and the row group where the
    run would have met it, or None. Used by the coordinator under `on_bad_row_group="raise"`:
    a bad file hours into a run is then warned of seconds into it (and raised when the run
    reaches it, by the worker that reads it)."""

    def __init__(self, files: list[str], filesystem, rank: int, first: int = 0):
        self.files, self.filesystem, self.rank, self.first = files, filesystem, rank, first
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
                pf = pq.ParquetFile(path, filesystem=self.filesystem)
                if pf.metadata.num_row_groups > self.rank:
                    text_column_problem(path, pf.schema_arrow, f"row group {self.rank} (checked ahead): ")
            except DataError as exc:
                self._found = exc
                return
            except Exception:  # noqa: BLE001 - unreadable files are reported when the run reads them
                continue
