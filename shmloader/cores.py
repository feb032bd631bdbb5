"""The cores a loader's workers share, its default `num_workers`, and what is said when there are
fewer cores than workers.

A worker is a process that tokenizes flat out on one core: `num_workers` above the cores this
process may run on (`usable()`, `os.sched_getaffinity(0)`) reads no more than as many
workers as cores, and each worker more is a process to start, its memory, and its first piece
tokenized with the tokenizer's definition before its fast engine pays (procs/worker.py
`_rent`), all on cores the others share. A rank's share (`share()`) is those cores, or, when
torchrun starts several ranks on the machine (`LOCAL_WORLD_SIZE`) and this process may run
on every core, its part of them. `default_workers()`, the loader's `num_workers` when none is
given, is that share, at most `MOST_DEFAULT` (so a 2-core machine starts 2 workers, one GPU of a
16-core node with 8 ranks 2). `oversubscribed(num_workers, cores)` is the warning for more
workers than the share, or None; the loader says it once per place it is built from
(`crowded`, `errors.warn`: the default warnings filter shows a line's warning once), at
construction, before anything starts. The nanochat drop-ins cap their workers at `usable()`
themselves (nanochat.py). With more workers than the share, at most as many workers as the
share have pieces to tokenize at once (`at_once`; packing/base.py `Mode.can_take`), each
within its own bounds, and the workers beyond stand by. Figures: docs/benchmarks.md, "More workers than cores".
"""
import os

from .errors import warn

MOST_DEFAULT = 4  # the default num_workers on a machine of many cores


class CoresWarning(UserWarning):
    """More workers than the cores this process may run on."""


def usable() -> int:
    """The cores this process may run on (its affinity; elsewhere the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def share(env=os.environ) -> int:
    """The cores this rank's workers may use: `usable()`, split among `LOCAL_WORLD_SIZE` ranks
    when this process may run on every core of the machine (ranks pinned to their own cores
    see their share as their affinity already)."""
    cores = usable()
    ranks = env.get("LOCAL_WORLD_SIZE", "")
    if ranks.isdigit() and int(ranks) > 1 and cores >= (os.cpu_count() or cores):
        return max(1, cores // int(ranks))
    return cores


def default_workers() -> int:
    """`num_workers` when none is given: this rank's `share()` of the cores, at most `MOST_DEFAULT`."""
    return min(share(), MOST_DEFAULT)


def at_once(num_workers: int, cores: int) -> int | None:
    """The most of `num_workers` workers on `cores` cores that have pieces to tokenize at once:
    the cores, when the workers are more (so that the piece the stream needs next has a core's
    share of the time, not a worker's share: the stream takes pieces in order; and a worker
    that read a row group keeps its next slices, each of its pieces within its own bounds),
    else None (each worker's own bounds alone, packing/base.py)."""
    return cores if num_workers > cores else None


def crowded(num_workers: int):
    """Say once (a `CoresWarning`) that `num_workers` is more than this rank's share of the cores."""
    if (text := oversubscribed(num_workers, share())) is not None:
        warn(text, CoresWarning)


def oversubscribed(num_workers: int, cores: int) -> str | None:
    """The warning for `num_workers` workers on `cores` cores, or None when they fit."""
    if num_workers <= cores:
        return None
    return (f"shmloader: num_workers={num_workers}, but this process may run on {cores} core"
            f"{'s' if cores != 1 else ''} (os.sched_getaffinity, its share among LOCAL_WORLD_SIZE ranks): "
            f"workers beyond the cores read no "
            f"more tokens: as many as the cores tokenize at once, and the rest stand "
            f"by, each a process to start and ~130 MiB (docs/benchmarks.md, 'More workers than "
            f"cores'); num_workers={cores} reads as much")
