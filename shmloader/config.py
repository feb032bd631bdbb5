"""The loader's settings: one frozen object, checked and resolved when it is made.

Every argument error is a ValueError naming the argument, what it was and what is allowed.
Options whose default depends on others are resolved here, in place, under their own names:
`num_workers` (this rank's share of the cores, at most 4: cores.py `default_workers`),
`max_piece_docs` (1024; uncapped with `cache_dir`), `max_piece_bytes` (8 MiB for concat,
2 MiB for best fit; none with `cache_dir`), `idle_release_s` (30 s for the val split, 0:
never, for train), `stall_s` (60 s; 0, off, with `max_restarts=0`). An option that cannot act
with the others given is refused, naming why (`stall_s` with `max_restarts=0`, a piece cap
with `cache_dir`).
`fingerprint` is the part of the config that a resume state must match (docs/contract.md §3):
what changes the stream. `spec` is the packing's spec (packing/base.py: `Packing`), which sizes
the ring's slots (and `positions_words`, the positions after each slot's window). `positions` is
not in the fingerprint: it adds to each batch and changes nothing of the stream; nor is
`head_start`, which changes only who makes a run's first batches. `shuffle` (with its `seed` and
`shuffle_window`) is in it as `"shuffle": "seed S window K"` when on (`"seed S"` for a window of
one unit, as states saved before the window say it), absent when off (so older states match);
`order` is its `data.shuffle.Shuffle`, or None. Pure: no
torch, no files, no processes (the default `num_workers` reads this process's affinity and
the ranks on its machine: cores.py `local_ranks`).
"""
import numbers
import os
from dataclasses import dataclass, field, fields
from typing import NamedTuple

from . import cores
from .data.source import Source
from .data.shuffle import WINDOW, Shuffle
from .packing import PACKINGS
from .packing.base import UNCAPPED
START_METHODS = ("forkserver", "spawn")
BAD_ROW_GROUP = ("raise", "skip")
OTHER_RANK = ("exact", "nanochat")  # another rank's state: find this rank's place, or nanochat's
ENGINES = ("auto", "tiktoken", "fastokens", "gigatoken")
SPLITS = ("train", "val", "all")  # data/source.py `split_files`: the files of each  # data/engine.py: who tokenizes; the stream is the same

IDLE_RELEASE_VAL_S = 30.0  # idle_release_s's default for the val split
PIECE_DOCS = 1024             # max_piece_docs's default
PIECE_BYTES = 8 << 20         # max_piece_bytes's default for concat
PIECE_BYTES_BUFFERED = 2 << 20  # and for best fit (docs/design.md "Canonical order and pieces")
STALL_S = 60.0                # stall_s's default
INTEGERS = ("B", "T", "num_workers", "n_slots", "tokenizer_batch_size", "buffer_size", "max_piece_docs",
            "max_piece_bytes", "log_every", "max_restarts", "seed", "shuffle_window")  # counts (`_as_python`)
SECONDS = ("timeout", "idle_release_s", "stall_s")


@dataclass(frozen=True)
class LoaderConfig:
    B: int
    T: int
    split: str = "train"
    packing: str = "concat"
    num_workers: int | None = None    # None: this rank's share of the cores, at most 4 (cores.default_workers)
    n_slots: int = 8
    tokenizer_batch_size: int = 128
    buffer_size: int = 1000
    max_piece_docs: int | None = None   # None: PIECE_DOCS, or UNCAPPED with cache_dir
    max_piece_bytes: int | None = None  # None: 8 MiB for concat, 2 MiB for best fit; stays None with cache_dir
    start_method: str = "forkserver"
    timeout: float = 300.0
    on_bad_row_group: str = "raise"
    cache_dir: str | None = None
    log_every: int = 0
    other_rank: str = "exact"
    engine: str = "auto"
    idle_release_s: float | None = None  # None: 30 s for split 'val', 0 (never) for 'train' and 'all'
    max_restarts: int = 3
    stall_s: float | None = None         # None: STALL_S, or 0 (off) with max_restarts=0
    positions: bool = False              # each batch with its tokens' positions in their documents
    head_start: bool = True              # concat: a run's first batches made by the trainer while its children start
    shuffle: bool = False                # every epoch in an order drawn from (seed, epoch): data/shuffle.py
    seed: int = 0                        # the shuffle's seed
    shuffle_window: int | None = None    # documents a shuffled window holds at least (None: shuffle.WINDOW)
    # not an option: this rank's share of the cores (cores.share), read where the config is made (the
    # trainer, where torch.distributed's group is), so that its children bound their workers by it too
    cores_share: int = field(init=False, default=0, repr=False, compare=False)

    @classmethod
    def of_call(cls, given: dict) -> "LoaderConfig":
        """The config of a `ShmLoader(...)` call (`given`: its arguments by name, the constructor's
        `locals()`): one source's own order (`Source(shuffle=)`) over the loader's `shuffle=`,
        `cache_dir` as a path's text."""
        given = dict(given)
        if isinstance(given.get("data"), Source) and given["data"].shuffle is not None:
            given["shuffle"] = given["data"].shuffle
        if given.get("cache_dir") is not None:
            given["cache_dir"] = os.fspath(given["cache_dir"])
        return cls(**{f.name: given[f.name] for f in fields(cls) if f.init})

    def __post_init__(self):
        self._as_python()
        self._check()
        self._resolve()

    def _as_python(self):
        """Numbers of other integer and float types (numpy's) as Python's, as a state holds them:
        a count is any `numbers.Integral` but a bool, seconds any `numbers.Real` but a bool."""
        for name in INTEGERS + SECONDS:
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, name, int(value) if name in INTEGERS else float(value))
            elif name in SECONDS and isinstance(value, numbers.Real) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))

    def _check(self):
        for name in ("B", "T", "num_workers", "n_slots", "tokenizer_batch_size", "buffer_size",
                     "max_piece_docs", "max_piece_bytes"):
            value = getattr(self, name)
            if value is None and name in ("num_workers", "max_piece_docs", "max_piece_bytes"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_slots < 2:
            raise ValueError(f"n_slots must be at least 2, got {self.n_slots}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {tuple(SPLITS)}: 'train' (every file but the last), 'val' "
                             f"(the last file) or 'all' (every file: a directory that is one split), "
                             f"got {self.split!r}")
        _choice("packing", self.packing, tuple(PACKINGS))
        _choice("on_bad_row_group", self.on_bad_row_group, BAD_ROW_GROUP)
        _choice("other_rank", self.other_rank, OTHER_RANK)
        _choice("engine", self.engine, ENGINES)
        if self.start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS} (a forked child would "
                             f"hold the trainer's pipes open), got {self.start_method!r}")
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise ValueError(f"timeout must be positive seconds, got {self.timeout!r}")
        if self.idle_release_s is not None and not (isinstance(self.idle_release_s, (int, float))
                                                    and not isinstance(self.idle_release_s, bool)
                                                    and self.idle_release_s >= 0):
            raise ValueError(f"idle_release_s must be seconds >= 0 (0: never) or None (30 s for val, never for "
                             f"train), got {self.idle_release_s!r}")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be a count >= 0 (0: the first death is an error), "
                             f"got {self.max_restarts!r}")
        if self.stall_s is not None and not (isinstance(self.stall_s, (int, float)) and not isinstance(self.stall_s, bool)
                                             and self.stall_s >= 0):
            raise ValueError(f"stall_s must be seconds >= 0 (0: a stall waits for timeout) or None (60 s), "
                             f"got {self.stall_s!r}")
        if not isinstance(self.positions, bool):
            raise ValueError(f"positions must be True (batches come with each token's position in its "
                             f"document) or False, got {self.positions!r}")
        if not isinstance(self.head_start, bool):
            raise ValueError(f"head_start must be True (a concat run's first batches are made in the training "
                             f"process while its workers start) or False, got {self.head_start!r}")
        if not isinstance(self.shuffle, bool):
            raise ValueError(f"shuffle must be True (every epoch's units and documents in an order drawn from seed= "
                             f"and the epoch) or False (the files' order), got {self.shuffle!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 63:
            raise ValueError(f"seed must be an integer in [0, 2**63) (the shuffle's seed), got {self.seed!r}")
        if self.shuffle_window is not None and (isinstance(self.shuffle_window, bool) or not isinstance(
                self.shuffle_window, int) or self.shuffle_window < 1):
            raise ValueError(f"shuffle_window must be a count of documents >= 1 (consecutive row groups that hold "
                             f"that many are shuffled together; 1: each row group on its own), or None "
                             f"({WINDOW}), got {self.shuffle_window!r}")
        if isinstance(self.log_every, bool) or not isinstance(self.log_every, int) or self.log_every < 0:
            raise ValueError(f"log_every must be a batch count >= 0, got {self.log_every!r}")

        if self.stall_s and self.max_restarts == 0:
            raise ValueError(f"stall_s={self.stall_s:g} acts only with max_restarts > 0 (a stalled process is "
                             f"killed and healed); with max_restarts=0 a stall is a LoaderTimeout after timeout= "
                             f"(now {self.timeout:g} s): set timeout instead")
        for name in ("max_piece_docs", "max_piece_bytes"):
            if self.cache_dir is not None and getattr(self, name) is not None:
                raise ValueError(f"{name}={getattr(self, name)} acts only without cache_dir: with a token cache "
                                 f"pieces are whole row groups, so that each row group is cached whole")

    def _resolve(self):
        """Each option's default, where it depends on the others (see the module docstring):
        idle_release_s is 30 s for the val split (an evaluation's loader, idle between
        evaluations) and never for train (read all the time, and needed again right after a
        pause: a release would cost a first batch, for best fit a buffer re-read). Pieces:
        docs/design.md, "Canonical order and pieces"."""
        cached = self.cache_dir is not None
        resolved = {
            "max_piece_docs": UNCAPPED if cached else PIECE_DOCS,
            "max_piece_bytes": None if cached else PIECE_BYTES_BUFFERED if self.spec.buffered else PIECE_BYTES,
            "idle_release_s": IDLE_RELEASE_VAL_S if self.split == "val" else 0.0,
            "stall_s": STALL_S if self.max_restarts else 0.0,
            "num_workers": cores.default_workers(),
        }
        object.__setattr__(self, "cores_share", cores.share())
        for name, default in resolved.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        object.__setattr__(self, "idle_release_s", float(self.idle_release_s))
        object.__setattr__(self, "stall_s", float(self.stall_s))

    @property
    def spec(self):
        """The packing's spec (`packing.base.Packing`)."""
        return PACKINGS[self.packing]

    @property
    def order(self):
        """The shuffled order (`data.shuffle.Shuffle`) with `shuffle=True`, else None (the files' order)."""
        return Shuffle(self.seed, self.shuffle_window or WINDOW) if self.shuffle else None

    @property
    def window(self) -> int:
        """Tokens per ring slot (concat B*T+1; best fit inputs then targets, 2*B*T)."""
        return self.spec.window(self.B, self.T)

    @property
    def positions_words(self) -> int:
        """int64 positions per ring slot, after its window: B*T with positions, else 0."""
        return self.B * self.T if self.positions else 0

    @property
    def max_runs(self) -> int:
        """The most runs a state's buffer can need (one per buffered document; 0: no buffer)."""
        return self.spec.buffer_docs(self) if self.spec.buffered else 0

    @property
    def lend_cap(self) -> int:
        """CPU batches lent out of the ring at once; past it, batches are copied, so that a
        caller keeping batches never takes every slot from the workers."""
        return max(1, self.n_slots // 2)

    @property
    def workers_at_once(self) -> int | None:
        """The most workers with pieces to tokenize at once (`cores.at_once`), or None: of this
        rank's share of the cores as the trainer read it (`cores_share`: a coordinator, a child,
        has no torch.distributed group to read its ranks from)."""
        return cores.at_once(self.num_workers, self.cores_share)

    @property
    def piece_unit(self) -> int:
        """Pieces hold whole units of documents: best fit's chunks, so that none is split."""
        return self.tokenizer_batch_size if self.spec.buffered else 1

    def fingerprint(self, tokenizer: str, shuffled: bool | None = None) -> dict:
        """What a resume state must match (B, T and the files are checked on their own: a new
        shape or appended files continue the run; `engine` is not in it: every engine makes
        the same stream). `shuffled`: whether any data is read shuffled (None: `shuffle`; a
        mixture's source may say it on its own), then with the seed and window in it."""
        out = {"split": self.split, "packing": self.packing, "tokenizer": tokenizer}
        out.update({name: getattr(self, name) for name in self.spec.settings})
        if self.on_bad_row_group == "skip":
            out["on_bad_row_group"] = "skip"  # skipping changes the stream
        if self.shuffle if shuffled is None else shuffled:
            window = self.shuffle_window or WINDOW  # a state without it is unshuffled (state.py ORDER_DEFAULTS)
            out["shuffle"] = f"seed {self.seed}" + (f" window {window}" if window > 1 else "")
        return out


class Place(NamedTuple):
    """A rank of a world size (`place`'s), or a process group's."""
    rank: int
    world_size: int


def place(rank: int | None, world_size: int | None) -> Place:
    """This loader's rank of its world size: those given, else those of one place: torchrun's
    `RANK` and `WORLD_SIZE`, else an initialized `torch.distributed` default group (launchers
    that set no `RANK`: `torch.multiprocessing.spawn`, SLURM or MPI scripts passing `rank=` to
    `init_process_group`, whose ranks all read rank 0's data otherwise), else 0 of 1. With a
    group initialized, a `RANK` or `WORLD_SIZE` set to other than the group's is a ValueError
    naming both (a stale variable, or one set for a single rank, would read another rank's
    share): pass `rank=` and `world_size=`, the data-parallel group's under tensor parallelism.
    Without a group, `WORLD_SIZE` above 1 with no `RANK` (and no `rank=`) is a ValueError: every
    process started so would be rank 0, reading one share over and over and never the others."""
    found = _found_place() if rank is None or world_size is None else None
    said = {"rank": "given", "world_size": "given"}
    if rank is None:
        rank, said["rank"] = found.rank, found.said["rank"]
    else:
        rank = _integer("rank", rank)
    if world_size is None:
        world_size, said["world_size"] = found.world_size, found.said["world_size"]
    else:
        world_size = _integer("world_size", world_size)
    if world_size > 1 and said["rank"] == "the default" and said["world_size"] == "$WORLD_SIZE":
        # ranks started by hand with WORLD_SIZE set and RANK forgotten: each such process would
        # read rank 0's share (the others' never read), silently
        raise ValueError(f"process {os.getpid()}'s environment says WORLD_SIZE={world_size} and no RANK (nor is a "
                         f"torch.distributed group initialized): which of the {world_size} ranks' shares it reads "
                         f"is unknown, and every process started so would read rank 0's; set RANK (0 to "
                         f"{world_size - 1}) in each process, or pass rank= and world_size="
                         + (" (a launcher that sets LOCAL_RANK or NODE_RANK and not RANK, such as Lightning's: "
                            "make the loader after its process group starts, e.g. in train_dataloader() or "
                            "setup(), or pass rank=trainer.global_rank)"
                            if "LOCAL_RANK" in os.environ or "NODE_RANK" in os.environ else ""))
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank {rank} ({said['rank']}) of {world_size} "
                         f"({said['world_size']}); pass both rank= and world_size=, or set both RANK and WORLD_SIZE")
    return Place(rank, world_size)


class _Found(NamedTuple):
    """A rank and world size not given, and where each came from (for an error)."""
    rank: int
    world_size: int
    said: dict


def _found_place() -> _Found:
    """The rank and world size of one place (`place`): `RANK`/`WORLD_SIZE` where either is set
    (each unset one: 0, 1), else the default group's, else 0 of 1; a variable set to other than
    an initialized group's is a ValueError."""
    group = _process_group()
    env = {name: _env_int(name, None) for name in ("RANK", "WORLD_SIZE")}
    if group is not None:
        says = {"RANK": group.rank, "WORLD_SIZE": group.world_size}
        if any(env[name] is not None and env[name] != says[name] for name in env):
            said = ", ".join(f"{name}={env[name]}" for name in env if env[name] is not None)
            raise ValueError(f"process {os.getpid()}'s environment says {said} but torch.distributed's default "
                             f"group says rank {group.rank} of {group.world_size} (dist.get_rank(), "
                             f"dist.get_world_size()): a stale or copied variable would read another rank's share; pass rank= and "
                             f"world_size= (the data-parallel group's, e.g. dist.get_rank(dp_group) and "
                             f"dist.get_world_size(dp_group) under tensor parallelism), or set RANK and "
                             f"WORLD_SIZE to the group's, or unset them")
        return _Found(group.rank, group.world_size, {"rank": _GROUP, "world_size": _GROUP})
    if any(value is not None for value in env.values()):
        said = {key: f"${name}" if env[name] is not None else "the default"
                for key, name in (("rank", "RANK"), ("world_size", "WORLD_SIZE"))}
        return _Found(0 if env["RANK"] is None else env["RANK"],
                      1 if env["WORLD_SIZE"] is None else env["WORLD_SIZE"], said)
    return _Found(0, 1, {"rank": "the default", "world_size": "the default"})


_GROUP = "torch.distributed's default group"


def _process_group() -> Place | None:
    """The rank and world size of torch.distributed's default group when this process initialized
    one (`cores.initialized_dist`), else None."""
    if (dist := cores.initialized_dist()) is None:
        return None
    return Place(dist.get_rank(), dist.get_world_size())


def _integer(name: str, value) -> int:
    """`value` as a Python int (numpy's integers too), else a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer (torchrun sets "
                         f"RANK and WORLD_SIZE; or pass rank= and world_size=)") from None


def _choice(name: str, value, allowed: tuple):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
