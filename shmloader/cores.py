"""The cores a loader's workers share, and what is said when there are fewer than workers.

A worker is a process that tokenizes flat out on one core: `num_workers` above the cores this
process may run on (`usable()`, `os.sched_getaffinity(0)`) reads no more than as many
workers as cores, and each worker more is a process to start, its memory, and its first piece
tokenized with the tokenizer's definition before its fast engine pays (procs/worker.py
`_rent`), all on cores the others share. `oversubscribed(num_workers, cores)` is the warning
for that, or None; the loader says it once per place it is built from (`errors.warn`: the
default warnings filter shows a line's warning once), at construction, before anything
starts. The nanochat drop-ins cap their workers at `usable()` themselves (nanochat.py).
Figures: docs/benchmarks.md, "More workers than cores".
"""
import os


class CoresWarning(UserWarning):
    """More workers than the cores this process may run on."""


def usable() -> int:
    """The cores this process may run on (its affinity; elsewhere the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def oversubscribed(num_workers: int, cores: int) -> str | None:
    """The warning for `num_workers` workers on `cores` cores, or None when they fit."""
    if num_workers <= cores:
        return None
    return (f"shmloader: num_workers={num_workers}, but this process may run on {cores} core"
            f"{'s' if cores != 1 else ''} (os.sched_getaffinity): workers beyond the cores read no "
            f"more tokens and take the cores in turns; each one more is a process to start, "
            f"~130 MiB and a first piece tokenized at tiktoken's speed (a loader's first seconds: "
            f"docs/benchmarks.md, 'More workers than cores'); num_workers={cores} reads as much")
