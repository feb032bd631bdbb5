"""The cores a loader's workers share, its default `num_workers`, and what is said when there are
fewer cores than workers.

A worker is a process that tokenizes flat out on one core: `num_workers` above the cores this
process may run on (`usable()`, `os.sched_getaffinity(0)`) reads no more than as many
workers as cores, and each worker more is a process to start, its memory, and its first piece
tokenized with the tokenizer's definition before its fast engine pays (procs/worker.py
`_rent`), all on cores the others share. A rank's share (`share()`) is those cores, or, when
several ranks run on the machine (`local_ranks()`) and this process may run on every core, its
part of them. The ranks on this machine are what the launcher says (`LOCAL_ENV`: torchrun's
`LOCAL_WORLD_SIZE`, Open MPI's, MPICH's, MVAPICH2's; SLURM's tasks on this node), else, for ranks
started by hand (`torch.multiprocessing.spawn`) whose torch.distributed group meets at a
loopback address (127.0.0.1, localhost: no other machine can reach it), the group's world size;
read from the process, never a collective. Where neither says, a rank of a group of several
takes every core and `crowded` says once that its ranks may share them (`unknown_ranks`).
`default_workers()`, the loader's `num_workers` when none is
given, is that share, at most `MOST_DEFAULT` (so a 2-core machine starts 2 workers, one GPU of a
16-core node with 8 ranks 2). `oversubscribed(num_workers, cores)` is the warning for more
workers than the share, or None; the loader says it once per place it is built from
(`crowded`, `errors.warn`: the default warnings filter shows a line's warning once), at
construction, before anything starts. The nanochat drop-ins cap their workers at `share()`
themselves (nanochat.py). With more workers than the share, at most as many workers as the
share have pieces to tokenize at once (`at_once`; packing/base.py `Mode.can_take`), each
within its own bounds, and the workers beyond stand by. Figures: docs/benchmarks.md, "More workers than cores".
"""
import os
import sys
from typing import NamedTuple

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
    """The cores this rank's workers may use: `usable()`, split among the `local_ranks()` on
    this machine when this process may run on every core of the machine (ranks pinned to their
    own cores see their share as their affinity already)."""
    cores, ranks = usable(), local_ranks(env).count
    if ranks > 1 and cores >= (os.cpu_count() or cores):
        return max(1, cores // ranks)
    return cores


class Ranks(NamedTuple):
    """The ranks on this machine (1 when nothing says), and what said so (None: nothing)."""
    count: int
    said_by: str | None


LOCAL_ENV = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")
LOOPBACK = ("localhost", "127.", "::1", "ip6-localhost")


def local_ranks(env=os.environ) -> Ranks:
    """How many ranks run on this machine: a launcher's variable (`LOCAL_ENV`, then SLURM's
    tasks on this node), or the world size of an initialized torch.distributed group whose
    store is at a loopback address (every rank reached it from this machine) where it is more,
    else 1."""
    said = next((Ranks(int(env[name]), name) for name in LOCAL_ENV
                 if env.get(name, "").isdigit() and int(env[name]) >= 1), None)
    if said is None and (slurm := _slurm_tasks(env)) is not None:
        said = Ranks(slurm, "SLURM_STEP_TASKS_PER_NODE")
    group = _group()
    if group is not None and group.world > 1 and group.host is not None and group.host.startswith(LOOPBACK):
        if said is None or said.count < group.world:  # ranks spawned inside one launched task (srun --pty, a
            #                                          stale LOCAL_WORLD_SIZE=1): the group says more
            return Ranks(group.world, f"torch.distributed's group of {group.world}, whose store is at {group.host}")
    return said if said is not None else Ranks(1, None)


def unknown_ranks(env=os.environ) -> int | None:
    """The world size of an initialized torch.distributed group of several ranks when nothing
    says how many of them run on this machine (`local_ranks`) and this process may run on every
    core; else None."""
    group = _group()
    if group is None or group.world < 2 or local_ranks(env).said_by is not None:
        return None
    return group.world if usable() >= (os.cpu_count() or 1) else None


class _Group(NamedTuple):
    world: int
    host: str | None  # its store's address (a TCP store), else None


def initialized_dist():
    """The `torch.distributed` module when this process initialized its default group, else None
    (not imported: none can be initialized; torch is not imported here)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def _group() -> _Group | None:
    """torch.distributed's default group when this process initialized one (read from the
    process: no message to the other ranks), else None."""
    if (dist := initialized_dist()) is None:
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        while hasattr(store, "underlying_store"):  # a PrefixStore around the TCPStore
            store = store.underlying_store
        host = getattr(store, "host", None)
    except (AttributeError, RuntimeError, ValueError):  # another torch's internals: no address
        host = None
    return _Group(dist.get_world_size(), host if isinstance(host, str) else None)


def _slurm_tasks(env) -> int | None:
    """SLURM's tasks of this step on this node: `SLURM_STEP_TASKS_PER_NODE` ("4(x2),3": 4 on
    each of the first 2 nodes, 3 on the third) at `SLURM_NODEID`; None without them."""
    spec, node = env.get("SLURM_STEP_TASKS_PER_NODE", ""), env.get("SLURM_NODEID", "")
    if not spec or not node.isdigit():
        return None
    counts = []
    for part in spec.split(","):
        tasks, repeated, times = part.partition("(x")
        if not tasks.isdigit() or (repeated and not (times.endswith(")") and times[:-1].isdigit())):
            return None
        counts += [int(tasks)] * (int(times[:-1]) if repeated else 1)
    return counts[int(node)] if int(node) < len(counts) and counts[int(node)] >= 1 else None


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
    """Say once (a `CoresWarning`) that `num_workers` is more than this rank's share of the cores,
    or, of a torch.distributed group whose ranks on this machine nothing says, that they may be."""
    if (text := oversubscribed(num_workers, share())) is not None:
        warn(text, CoresWarning)
    elif num_workers > 1 and (world := unknown_ranks()) is not None:
        warn(f"shmloader: num_workers={num_workers} on a machine of {usable()} cores, in a torch.distributed group "
             f"of {world} ranks, and nothing says how many of them run on this machine (no LOCAL_WORLD_SIZE, "
             f"Open MPI, MPICH or SLURM variable; the group's store is not at a loopback address): each rank's "
             f"default takes every core; if several ranks run here, set LOCAL_WORLD_SIZE to their count in "
             f"each (the default num_workers is then its share) or pass num_workers", CoresWarning)


def oversubscribed(num_workers: int, cores: int) -> str | None:
    """The warning for `num_workers` workers on `cores` cores, or None when they fit."""
    if num_workers <= cores:
        return None
    return (f"shmloader: num_workers={num_workers}, but this process may run on {cores} core"
            f"{'s' if cores != 1 else ''} (os.sched_getaffinity, its share among the ranks on this machine): "
            f"workers beyond the cores read no more tokens: as many as the cores tokenize at once, and the "
            f"rest stand by, each a process to start and its memory (~35 MiB RSS standing by, ~100 MiB "
            f"tokenizing; docs/benchmarks.md, 'More workers than cores'); num_workers={cores} reads as much")
