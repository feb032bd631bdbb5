"""The resume state: small, versioned, JSON-serialisable, checked against the config.

A state names the first token *after* the batch it was yielded with:
`{"version": 1, "epoch", "pq_idx" (file), "rg_idx" (row group), "doc_idx" (row in the row
group), "skip" (tokens of that document already delivered), "rank", "world_size",
"config": {...}}`. Its position is canonical (the same whatever the number of workers), so
a loader given the state of batch k yields batch k+1 onward exactly. nanochat's keys
(`pq_idx`, `rg_idx`, `epoch`) are kept with their meaning, so a state holding only those
(an existing nanochat checkpoint) resumes as nanochat does. `check` names every field that
differs from the loader's config.
"""
import hashlib
import warnings
import zlib

import numpy as np

from .plan import Cursor, nanochat_cursor

VERSION = 1
POSITION_FIELDS = ("epoch", "pq_idx", "rg_idx", "doc_idx", "skip")


def data_fingerprint(files: list[str], sizes: list[int] | None = None) -> str:
    """Names (not directories: a moved dataset still resumes) and sizes in bytes (regenerated
    shards with the same names do not) of the split's files."""
    names = [f.replace("\\", "/").rsplit("/", 1)[-1] for f in files]
    if sizes is not None:
        names = [f"{n}:{s}" for n, s in zip(names, sizes)]
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def make_state(base: dict, epoch: int, file: int, rg: int, doc: int, skip: int,
               buffer: list | None = None, buffer_bytes: bytes | None = None) -> dict:
    """A state; best fit adds its `buffer` runs (`buffer_bytes`: their int64 bytes, if at hand)."""
    state = dict(base)
    state.update(epoch=epoch, pq_idx=file, rg_idx=rg, doc_idx=doc, skip=skip)
    if buffer is not None:
        state["buffer"] = buffer
        if buffer_bytes is None:
            buffer_bytes = _runs_bytes(buffer)
    state["digest"] = digest(state, buffer_bytes or b"")
    return state


def digest(state: dict, buffer_bytes: bytes = b"") -> str:
    """crc32 of the rank, the world size, the position and the buffer. DCP keeps one value per
    key across ranks, so a state saved under one key by every rank comes back with fields of
    different ranks; the digest turns that (and hand edits) into an error, not a wrong resume."""
    key = ":".join(str(state.get(k)) for k in ("rank", "world_size", *POSITION_FIELDS))
    return f"{zlib.crc32(buffer_bytes, zlib.crc32(key.encode())):08x}"


def _runs_bytes(runs) -> bytes:
    return np.asarray(runs, dtype=np.int64).reshape(-1, 5).tobytes()


def base_state(config: dict, rank: int, world: int) -> dict:
    return {"version": VERSION, "rank": rank, "world_size": world, "config": dict(config)}


def _int_field(state: dict, name: str, lo: int = 0) -> int:
    value = state.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"resume state field {name!r} must be an integer >= {lo}, got {value!r}")
    return value


def check(state, config: dict, rank: int, world: int, n_files: int) -> tuple[Cursor, int]:
    """Validate `state` for this loader and return (cursor, skip) to start from."""
    if not isinstance(state, dict):
        raise ValueError(f"resume state must be a dict, got {type(state).__name__}")
    if "version" not in state:
        return _nanochat(state, rank, world, n_files), 0
    if type(state["version"]) is not int or state["version"] != VERSION:
        raise ValueError(f"resume state field 'version' is {state['version']!r}; this shmloader "
                         f"reads version {VERSION}")
    _check_config(state, config, world)
    pos = {name: _int_field(state, name, 1 if name == "epoch" else 0) for name in POSITION_FIELDS}
    if pos["pq_idx"] >= n_files:
        raise ValueError(f"resume state field 'pq_idx' is {pos['pq_idx']} but the split has "
                         f"{n_files} files")
    _int_field(state, "rank")
    _check_digest(state)
    if state["rank"] != rank:
        warnings.warn(f"resume state was saved by rank {state['rank']}, this is rank {rank}: "
                      f"resuming as nanochat does (rank {state['rank']}'s file and row group, "
                      f"next stride for this rank), not exactly; save one state per rank for "
                      f"exact resume", stacklevel=4)
        return nanochat_cursor(pos["pq_idx"], pos["rg_idx"], pos["epoch"], rank, world), 0
    if pos["rg_idx"] % world != rank:
        raise ValueError(f"resume state field 'rg_idx' is {pos['rg_idx']}, not a row group of "
                         f"rank {rank} of {world}")
    return Cursor(pos["epoch"], pos["pq_idx"], pos["rg_idx"], pos["doc_idx"]), pos["skip"]


def _check_digest(state: dict):
    runs = state.get("buffer")
    try:
        expected = digest(state, _runs_bytes(runs) if runs is not None else b"")
    except (TypeError, ValueError):
        raise ValueError("resume state field 'buffer' is not a list of 5-integer runs") from None
    if state.get("digest") != expected:
        raise ValueError(f"resume state field 'digest' is {state.get('digest')!r}, but its fields give "
                         f"{expected!r}: the state was edited, or mixes the states of several ranks "
                         f"(torch.distributed.checkpoint keeps one value per key: save each rank's "
                         f"loader under a key of its own, e.g. f'loader_rank{{rank}}')")


def buffer_runs(state, n_files: int) -> list[list[int]]:
    """The best-fit buffer of an exact state (one `check` accepted for this rank): runs
    [epoch, file, rg, row, count] in arrival order."""
    runs = state.get("buffer")
    if not isinstance(runs, list):
        raise ValueError(f"resume state field 'buffer' must be a list of [epoch, file, rg, row, "
                         f"count] runs, got {type(runs).__name__}")
    for run in runs:
        if (not isinstance(run, list) or len(run) != 5
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in run)
                or run[0] < 1 or run[4] < 1 or run[1] >= n_files):
            raise ValueError(f"resume state field 'buffer' has a bad run {run!r}: expected "
                             f"[epoch >= 1, file < {n_files}, rg, row, count >= 1]")
    return runs


def _check_config(state: dict, config: dict, world: int):
    saved = state.get("config")
    if not isinstance(saved, dict):
        raise ValueError(f"resume state field 'config' must be a dict, got {saved!r}")
    diffs = [f"{key}: state has {saved.get(key)!r}, loader has {value!r}"
             for key, value in config.items() if saved.get(key) != value]
    diffs += [f"{key}: state has {saved[key]!r}, loader has none" for key in saved if key not in config]
    if state.get("world_size") != world:
        diffs.append(f"world_size: state has {state.get('world_size')!r}, loader has {world}")
    if diffs:
        raise ValueError("resume state does not match this loader: " + "; ".join(diffs))


def _nanochat(state: dict, rank: int, world: int, n_files: int) -> Cursor:
    for key in state:
        if key not in ("pq_idx", "rg_idx", "epoch"):
            raise ValueError(f"resume state has no 'version' (a nanochat state) but has field "
                             f"{key!r}; nanochat states hold only pq_idx, rg_idx and epoch")
    pq_idx, rg_idx = _int_field(state, "pq_idx"), _int_field(state, "rg_idx")
    epoch = _int_field(state, "epoch", 1) if "epoch" in state else 1
    if pq_idx >= n_files:
        raise ValueError(f"resume state field 'pq_idx' is {pq_idx} but the split has {n_files} files")
    return nanochat_cursor(pq_idx, rg_idx, epoch, rank, world)
