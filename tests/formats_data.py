"""The same documents written in every format the loader reads (tests/loader/test_formats.py,
tests/unit/data/formats/test_formats_*.py): parquet (`text`, `content`, token ids), JSON Lines plain, .gz
and .zst, Arrow IPC file and stream; units of 1024 rows in each, so that every format has the
same units as parquet's 1024-row row groups."""
import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

UNIT = 1024


def write(path, docs: list, fmt: str, column: str = "text", ids=None):
    """`docs` (str or None) as one file of `fmt` at `path`, in `column` (plus an `id` column);
    `fmt="tokens"`: parquet with `column` holding `ids` (a list of int lists, None for a null)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if fmt in ("parquet", "tokens"):
        values = pa.array(ids, pa.list_(pa.int32())) if fmt == "tokens" else pa.array(docs, pa.string())
        table = pa.table({"id": pa.array(range(len(docs)), pa.int64()), column: values})
        pq.write_table(table, path, row_group_size=UNIT)
    elif fmt.startswith("jsonl"):
        lines = "".join(json.dumps({"id": i, column: d}) + "\n" for i, d in enumerate(docs)).encode()
        if fmt.endswith(".gz"):
            with gzip.open(path, "wb") as f:
                f.write(lines)
        elif fmt.endswith(".zst"):
            with pa.CompressedOutputStream(path, "zstd") as f:
                f.write(lines)
        else:
            with open(path, "wb") as f:
                f.write(lines)
    elif fmt in ("arrow", "arrow-stream"):
        table = pa.table({"id": pa.array(range(len(docs)), pa.int64()), column: pa.array(docs, pa.string())})
        opener = pa.ipc.new_file if fmt == "arrow" else pa.ipc.new_stream
        with opener(path, table.schema) as w:
            for batch in table.to_batches(max_chunksize=UNIT):
                w.write_batch(batch)
    else:
        raise ValueError(fmt)
    return str(path)


SUFFIX = {"parquet": ".parquet", "tokens": ".parquet", "jsonl": ".jsonl", "jsonl.gz": ".jsonl.gz",
          "jsonl.zst": ".jsonl.zst", "arrow": ".arrow", "arrow-stream": ".arrow"}


def write_set(root, files: list, fmt: str, column: str = "text", encode=None) -> list:
    """Each list of documents of `files` as `shard_NNNNN<suffix>` under `root`; their paths."""
    out = []
    for i, docs in enumerate(files):
        ids = [None if d is None else encode(d) for d in docs] if fmt == "tokens" else None
        out.append(write(os.path.join(root, f"shard_{i:05d}{SUFFIX[fmt]}"), docs, fmt, column, ids))
    return out


def write_hf_saved(root, files: list, column: str = "text") -> list:
    """`files` as Hugging Face `Dataset.save_to_disk(root, num_shards=len(files))` writes them
    (datasets 5.2.0's layout): `data-0000N-of-0000M.arrow` (stream format), `state.json` listing
    them and `dataset_info.json`, metadata as pretty-printed JSON (not JSON Lines). Their paths."""
    n = len(files)
    names = [f"data-{i:05d}-of-{n:05d}.arrow" for i in range(n)]
    paths = [write(os.path.join(root, name), docs, "arrow-stream", column) for name, docs in zip(names, files)]
    info = {"citation": "", "description": "", "features": {column: {"dtype": "string", "_type": "Value"}},
            "homepage": "", "license": ""}
    state = {"_data_files": [{"filename": name} for name in names], "_fingerprint": "94ca02b017b87c41",
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
             "_output_all_columns": False, "_split": None}
    for name, obj in (("dataset_info.json", info), ("state.json", state)):
        with open(os.path.join(root, name), "w") as f:
            json.dump(obj, f, indent=2)
    return paths
