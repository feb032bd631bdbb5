"""A data file's column as documents: text (strings) or token ids (lists of integers).

`kind_of` reads a column's type: a string column (string, large_string, string_view, or a
dictionary of one of them) is *text*, tokenized by the worker; a list of integers (list,
large_list, fixed_size_list, list_view, large_list_view of any int) is *token ids*, a
document's tokens used as they are after the BOS (the worker's `ids_with_bos`: ids already
beginning with BOS get no second). Anything else, or no such column, is a `DataError` naming
the file and saying what to write. `docs_of` turns rows of a column into what a worker takes: a
list of str (None for a null) or `Ids`, a list of int64 arrays (None for a null), checked
against the vocabulary. Pure over pyarrow arrays; every format (this package) uses it.
"""
import numpy as np
import pyarrow as pa

from ...errors import DataError

TEXT, TOKENS = "text", "tokens"
UNKNOWN = "unknown"  # a kind the file cannot say cheaply (the token cache keys it as not text)
_VIEWS = tuple(getattr(pa.types, name) for name in ("is_list_view", "is_large_list_view")  # pyarrow >= 16
               if hasattr(pa.types, name))


class Ids(list):
    """A piece's documents as token ids: an int64 array per row (None for a null row)."""


def kind_of(path: str, schema, column: str, where: str = "") -> str:
    """`TEXT` or `TOKENS` for `column` of `schema`, else a `DataError` naming the file."""
    if column not in schema.names:
        raise DataError(f"{path}: {where}no {column!r} column (columns: {schema.names}); write the "
                        f"documents to a string column named {column!r}, or pass column= naming the "
                        f"column that holds them")
    return kind_of_type(path, schema.field(column).type, column, where)


def kind_of_type(path: str, kind, column: str, where: str = "") -> str:
    if _is_text(kind):
        return TEXT
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
            or _is_view(kind)) and pa.types.is_integer(kind.value_type):
        return TOKENS
    raise DataError(f"{path}: {where}column {column!r} is {kind}, expected text (a string column: string, "
                    f"large_string, string_view, or a dictionary of strings) or token ids (a list of integers)"
                    f"{_nested_hint(kind, column)}")


def _is_text(kind) -> bool:
    """A string type, or a dictionary of strings."""
    values = kind.value_type if pa.types.is_dictionary(kind) else kind
    return pa.types.is_string(values) or pa.types.is_large_string(values) or pa.types.is_string_view(values)


def _nested_hint(kind, column: str) -> str:
    """What to do with a struct or a list of strings, whose documents are one level down."""
    if pa.types.is_struct(kind):
        return (f"; a struct's fields are not read as documents: write the one holding them to a column of its "
                f"own (pyarrow's table.flatten() names it '{column}.<field>', then pass column='{column}.<field>')")
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and _is_text(kind.value_type):
        return ("; a list of strings is not one document: join each row's strings into one string column "
                "(pyarrow.compute.binary_join)")
    return ""


def docs_of(array, kind: str, n_vocab: int | None, where) -> list:
    """Rows of a column (a pyarrow Array or ChunkedArray of `kind`) as a worker takes them:
    a list of str or None (`TEXT`), or `Ids` (`TOKENS`), each id checked to be in
    `[0, n_vocab)` (`where(i)` names row i in a `DataError`). Invalid UTF-8 is a `DataError`."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if kind == TEXT:
        if pa.types.is_dictionary(array.type) or pa.types.is_string_view(array.type):
            array = array.cast(pa.large_string())
        try:
            return array.to_pylist()
        except (UnicodeDecodeError, pa.ArrowException) as exc:
            raise DataError(f"{where(0)}: the text is not valid UTF-8 ({exc}); fix the file or pass "
                            f"on_bad_row_group='skip'") from exc
    if pa.types.is_fixed_size_list(array.type):
        array = array.cast(pa.large_list(array.type.value_type))
    elif _is_view(array.type):
        array = _view_as_list(array)
    offsets = array.offsets.to_numpy()
    offsets = offsets - offsets[0]
    valid = np.ones(len(array), dtype=bool) if array.null_count == 0 else ~array.is_null().to_numpy(zero_copy_only=False)
    flat = array.values.slice(array.offsets[0].as_py(), int(offsets[-1]))
    if flat.null_count:
        _no_null_inside(flat, offsets, valid, where)
        flat = flat.fill_null(0)  # inside null rows only
    values = flat.to_numpy(zero_copy_only=False)
    if values.dtype == np.uint64 and values.size and values.max() > np.iinfo(np.int64).max:
        at = int(np.argmax(values > np.iinfo(np.int64).max))
        raise DataError(f"{where(_row_of(offsets, at))}: {outside(int(values[at]), n_vocab)}")
    values = values.astype(np.int64, copy=False)
    check_ids(values, offsets, n_vocab, where)
    return Ids(values[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(array)))


def _is_view(kind) -> bool:
    """A list_view or large_list_view: each row an (offset, size) into its values, in any order."""
    return any(is_view(kind) for is_view in _VIEWS)


def _view_as_list(array):
    """A list_view array as a large_list of the same rows. Gathered here, not cast: pyarrow 26's
    cast of one read from an Arrow IPC file drops the last row's values."""
    valid = ~array.is_null().to_numpy(zero_copy_only=False)
    starts = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    sizes = np.where(valid, array.sizes.to_numpy(zero_copy_only=False), 0).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    at = np.repeat(starts - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)
    return pa.LargeListArray.from_arrays(pa.array(offsets), array.values.take(pa.array(at)),
                                         mask=pa.array(~valid))


def _no_null_inside(flat, offsets: np.ndarray, valid: np.ndarray, where):
    """A `DataError` naming the first row (not itself null) with a null among its token ids."""
    at = np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))
    rows = np.searchsorted(offsets, at, side="right") - 1
    keep = valid[rows]
    if keep.any():
        k = int(np.argmax(keep))
        row = int(rows[k])
        raise DataError(f"{where(row)}: a null inside its token ids (element {int(at[k] - offsets[row])}); "
                        f"token ids must all be integers: drop or replace the nulls, or make the whole row null")


def _row_of(offsets: np.ndarray, at: int) -> int:
    return int(np.searchsorted(offsets, at, side="right")) - 1


def outside(value: int, n_vocab: int | None) -> str:
    """What is wrong with token id `value` (negative, or at or past `n_vocab`)."""
    if n_vocab is None:
        return (f"token id {value} is {'negative' if value < 0 else 'past any vocabulary (2^63 or more)'}, expected "
                f"ids in [0, the tokenizer's vocabulary size); token ids must be the tokenizer's own")
    return (f"token id {value} is outside the tokenizer's vocabulary [0, {n_vocab}); token ids must be the "
            f"tokenizer's own (or pass the tokenizer they were made with)")


def check_ids(flat: np.ndarray, offsets: np.ndarray, n_vocab: int | None, where):
    """Every id of `flat` (rows cut at `offsets`) in `[0, n_vocab)`, else a `DataError` naming the
    first row with one that is not."""
    if flat.size == 0:
        return
    bad = (flat < 0) if n_vocab is None else ((flat < 0) | (flat >= n_vocab))
    if bad.any():
        at = int(np.argmax(bad))
        raise DataError(f"{where(_row_of(offsets, at))}: {outside(int(flat[at]), n_vocab)}")
