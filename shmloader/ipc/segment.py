"""The ring's shared memory: one `multiprocessing.shared_memory.SharedMemory` per run.

The creator owns it: only the training process creates and unlinks a segment (`create`,
`Segment.unlink`); the coordinator and the workers attach by name and close (`Attached`),
and the coordinator unlinks it only when the trainer died (`unlink_orphan`).

- **Out of Python's resource tracker.** The tracker would print "leaked shared_memory
  objects" whenever the trainer is killed (SIGTERM, SIGKILL), and would unlink a segment when
  one attaching process exits, though no segment leaks: the trainer unlinks it on close, the
  coordinator when the trainer dies, and the next loader's start sweeps what a run killed
  whole left (`sweep_stale`), as does the forkserver when it exits after the trainer
  (procs/forkready.py: a trainer killed before its children started). Python >= 3.13 opens it with `track=False`; on 3.10-3.12 the
  trainer unregisters what it created at once, and children never register what they attach
  (`_untracked`: every process of a loader shares the trainer's tracker, whose registry is a
  set, so a child's register-then-unregister could meet another's and fail there).
- **Reserved up front.** The segment's space is allocated when it is created
  (`posix_fallocate` on its file), so a too-small /dev/shm is an error at start naming the
  MiB needed and free, never a SIGBUS in a worker later. A /dev/shm that refuses the segment
  (full, read-only) is a `ShmLoaderError` naming /dev/shm, the size asked and what to do,
  raised from the `OSError` (`_refused`).
- **Held by its creator.** The trainer holds an exclusive `flock` on the segment's file for
  as long as the segment is its (`Segment.lock_fd`), and writes the ring's header only once
  it holds it; the kernel drops the lock when the trainer dies, whatever killed it.
  `sweep_stale` unlinks a segment only when it can take that lock itself and the header is
  there: its creator is gone. This holds across PID namespaces that share one /dev/shm
  (containers with `--ipc=host`, pods sharing an emptyDir), where a creator's pid means
  nothing. A segment without a header yet is being created (or its creator died in those
  microseconds) and is swept only once it is `UNBORN_S` old; a ring of an older layout, which
  holds no lock, only when its creator pid is dead here. Names are `shml_<pid>_<hex>` (under
  30 characters).
- **The trainer's own mapping.** The trainer maps the segment once more for its views:
  a CPU batch lent to the caller is a view of the ring and may outlive `close()`, which a
  `SharedMemory` refuses to close under live views; an `mmap` is simply unmapped when its last
  view is freed, while the name is unlinked at once.

Linux only (/dev/shm).
"""
import contextlib
import errno
import fcntl
import mmap
import os
import secrets
import sys
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from ..errors import ShmLoaderError
from .ring import LAYOUT_VERSION, MAGIC, Ring, RingLayout
from .signals import pid_alive, sigint_blocked

SHM_DIR = "/dev/shm"
PREFIX = "shml_"
TRACK_FLAG = sys.version_info >= (3, 13)  # SharedMemory(track=False) exists
LOCKED_SINCE = 4   # the layout version from which a creator holds its segment's lock
UNBORN_S = 60.0    # a segment with no header yet is left alone for this long


def new_name() -> str:
    return f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}"


class Segment:
    """A segment the trainer created: its name, the descriptor that holds its lock, and
    `unlink()` (safe to repeat), which also lets the lock go."""

    def __init__(self, name: str, lock_fd: int = -1):
        self.name, self.lock_fd = name, lock_fd

    def unlink(self):
        """Remove the name (by its file: on 3.10-3.12 `SharedMemory.unlink` would also tell the
        resource tracker, which no longer holds it), then drop the lock."""
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass
        self.forget()

    def forget(self):
        """Close the lock's descriptor (a forked child's copy of it: the parent keeps the lock)."""
        fd, self.lock_fd = self.lock_fd, -1  # forgotten first: closed once, even if the close raises
        if fd >= 0:
            os.close(fd)


def open_shared(name: str, create: bool = False, size: int = 0) -> shared_memory.SharedMemory:
    """`SharedMemory(name, create, size)`, held by no resource tracker."""
    if TRACK_FLAG:
        return shared_memory.SharedMemory(name, create=create, size=size, track=False)
    if create:  # this process registers and unregisters it, in that order
        shm = shared_memory.SharedMemory(name, create=True, size=size)
        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 (its name with the "/")
        return shm
    with _untracked():
        return shared_memory.SharedMemory(name)


@contextlib.contextmanager
def _untracked():
    """Python 3.10-3.12: `SharedMemory` registers every segment it opens; skip that (children
    only: they are the loader's own, single-threaded processes when they attach)."""
    register = resource_tracker.register

    def skip_shared_memory(name, rtype):
        if rtype != "shared_memory":
            register(name, rtype)

    resource_tracker.register = skip_shared_memory
    try:
        yield
    finally:
        resource_tracker.register = register


def create(layout: RingLayout) -> tuple[Segment, Ring]:
    """Create, reserve and initialise a segment, and map it for the trainer. Only the trainer
    calls this."""
    # A Ctrl-C must not land between the segment's creation and `segment` (nobody would
    # unlink it): it is created with SIGINT blocked; one that came meanwhile is raised on
    # leaving the block, and the except below unlinks the segment.
    segment = None
    if not TRACK_FLAG:
        resource_tracker.ensure_running()  # first: starting it unblocks SIGINT
    try:
        with sigint_blocked():
            name = new_name()
            try:
                open_shared(name, create=True, size=layout.nbytes).close()
            except OSError as exc:
                raise _refused(exc, layout.nbytes) from exc
            segment = Segment(name, os.open(os.path.join(SHM_DIR, name), os.O_RDWR))
        fcntl.flock(segment.lock_fd, fcntl.LOCK_EX)  # before the header: see the module docstring
        _reserve(segment.lock_fd, layout.nbytes)
        mapping = mmap.mmap(segment.lock_fd, layout.nbytes)
    except BaseException:
        if segment is not None:
            segment.unlink()
        raise
    ring = Ring(mapping, layout, name)
    ring.initialise()
    return segment, ring


def unlink_orphan(name: str):
    """The coordinator's last step when the trainer is gone: a trainer that closes the loader
    unlinks the segment before it lets the children go (`Children.shutdown`), so a segment
    still there was left by a trainer that died; unlink it."""
    Segment(name).unlink()


def _reserve(fd: int, nbytes: int):
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        raise _refused(exc, nbytes) from exc


def _refused(exc: OSError, nbytes: int) -> ShmLoaderError:
    """The `ShmLoaderError` for /dev/shm refusing a ring of `nbytes` (to be raised from `exc`):
    what it said, the size asked, and what to do about a read-only, unwritable or full /dev/shm."""
    needs = f"shmloader needs {_size(nbytes)} of shared memory in {SHM_DIR} for its ring"
    said = exc.strerror or exc
    if exc.errno == errno.EROFS:
        return ShmLoaderError(f"{needs}, but {SHM_DIR} is read-only ({said}): mount a writable tmpfs there "
                              f"(docker: --tmpfs /dev/shm or --shm-size; Kubernetes: an emptyDir of medium Memory)")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ShmLoaderError(f"{needs}, but this user may not create files there ({said}): make {SHM_DIR} "
                              f"writable to it (a tmpfs of mode 1777, as usual)")
    if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
        return ShmLoaderError(f"{needs} but only {_size(_free())} are free ({said}): enlarge {SHM_DIR} (mount "
                              f"-o remount,size=...; docker: --shm-size; Kubernetes: an emptyDir of medium "
                              f"Memory with a sizeLimit) or lower B, T or n_slots")
    return ShmLoaderError(f"{needs}, but creating it failed ({said}, errno {exc.errno}): check that "
                          f"{SHM_DIR} is a writable tmpfs with room for it")


def _free() -> int:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _size(n: int) -> str:
    """MiB to one decimal, and the bytes too (two sizes that round alike still read apart)."""
    return f"{n / 2**20:.1f} MiB ({n:,} bytes)"


class Attached:
    """The segment as a process that did not create it sees it (coordinator, workers)."""

    def __init__(self, name: str, layout: RingLayout):
        self._shm = open_shared(name)
        self.ring = Ring(self._shm.buf, layout, name)
        if not self.ring.is_valid():
            self.close()
            raise RuntimeError(f"shared memory {name} is not a shmloader ring of layout {LAYOUT_VERSION}")

    def close(self):
        self.ring.release_views()
        self._shm.close()


def attach_unless_gone(name: str, layout: RingLayout, trainer_gone) -> Attached | None:
    """`Attached(name, layout)`, or None when attaching fails and `trainer_gone()` (the alive
    pipe at EOF): the trainer closed the loader or died, and unlinked the segment, before this
    child got to it, so there is nothing to report. A failure while the trainer is alive
    raises as usual."""
    try:
        return Attached(name, layout)
    except Exception:
        if trainer_gone():
            return None
        raise


def creator_pid(name: str) -> int | None:
    if not name.startswith(PREFIX):
        return None
    head = name[len(PREFIX):].split("_", 1)[0]
    return int(head) if head.isdigit() else None


def sweep_stale() -> list[str]:
    """Unlink the segments whose creator is gone (see the module docstring); returns their
    names."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    swept = []
    for name in names:
        pid = creator_pid(name)
        if pid is not None and _orphan(os.path.join(SHM_DIR, name), pid):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                swept.append(name)
            except FileNotFoundError:
                pass
    return swept


def _orphan(path: str, pid: int) -> bool:
    """Whether the segment at `path` (named by creator `pid`) has no creator any more. Its
    lock is taken only to look, and dropped at once."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its creator holds it
        head = np.frombuffer(os.pread(fd, 16, 0).ljust(16, b"\0"), dtype=np.int64)
        if head[0] != MAGIC:
            return time.time() - os.fstat(fd).st_mtime > UNBORN_S
        return head[1] >= LOCKED_SINCE or not pid_alive(pid)
    finally:
        os.close(fd)
