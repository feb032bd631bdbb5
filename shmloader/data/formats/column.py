"""A data file's column as documents: text (strings) or token ids (lists of integers).

`kind_of` reads a column's type: a string column (string, large_string, string_view, or a
dictionary of one of them) is *text*, tokenized by the worker; a list of integers (list,
large_list, fixed_size_list of any int) is *token ids*, a document's tokens used as they are
after the BOS. Anything else, or no such column, is a `DataError` naming the file and saying
what to write. `docs_of` turns rows of a column into what a worker takes: a list of str (None
for a null) or `Ids`, a list of int64 arrays (None for a null), checked against the
vocabulary. Pure over pyarrow arrays; every format (this package) uses it.
"""
import numpy as np
import pyarrow as pa

from ...errors import DataError

TEXT, TOKENS = "text", "tokens"


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
    values = kind.value_type if pa.types.is_dictionary(kind) else kind
    if pa.types.is_string(values) or pa.types.is_large_string(values) or pa.types.is_string_view(values):
        return TEXT
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)) \
            and pa.types.is_integer(kind.value_type):
        return TOKENS
    raise DataError(f"{path}: {where}column {column!r} is {kind}, expected text (a string column: string, "
                    f"large_string, string_view, or a dictionary of strings) or token ids (a list of integers)")


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
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    valid = np.ones(len(array), dtype=bool) if array.null_count == 0 else ~array.is_null().to_numpy(zero_copy_only=False)
    check_ids(values[offsets[0]:offsets[-1]], offsets - offsets[0], n_vocab, where)
    return Ids(values[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(array)))


def check_ids(flat: np.ndarray, offsets: np.ndarray, n_vocab: int | None, where):
    """Every id of `flat` (rows cut at `offsets`) in `[0, n_vocab)`, else a `DataError` naming the
    first row with one that is not."""
    if flat.size == 0:
        return
    bad = (flat < 0) if n_vocab is None else ((flat < 0) | (flat >= n_vocab))
    if bad.any():
        at = int(np.argmax(bad))
        row = int(np.searchsorted(offsets, at, side="right")) - 1
        raise DataError(f"{where(row)}: token id {int(flat[at])} is outside the tokenizer's vocabulary "
                        f"[0, {n_vocab}); token ids must be the tokenizer's own (or pass the tokenizer "
                        f"they were made with)")
