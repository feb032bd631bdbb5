"""The loaders of the training process: closed when dropped and at its exit, let go of in a
forked child, and served to one thread at a time.

- **Drop.** A loader dropped without `close()` (its last reference gone, or collected in a
  reference cycle) stops its runs without waiting for their processes (`Runs.close(wait=False)`),
  from a `weakref.finalize` made with the loader (`close_when_dropped`), not from a `__del__`.
  The finalizer holds the loader's `Runs` (which never refers back to the loader), so the runs'
  pipes stay reachable however the loader is dropped: the collector never finalizes one of them
  itself. It must not: `multiprocessing.connection.Connection.__del__` closes its descriptor
  without clearing its handle, so a collection that freed a loader's cycle closed each pipe
  there, and its `close()` in the reaper closed the number again up to 2 s later, by then the
  caller's next file (issue 49; docs/design.md "Timeouts and shutdown"). Every pipe is closed
  by an explicit `close()`, once (children.py `Children.shutdown`, reaper.py `close_each`).
- **Exit.** Every loader is registered (`register`, a weak set): at interpreter exit each one
  still open is closed, so its children exit and its segment is unlinked. `register` numbers
  the process's loaders 1, 2, ... in the order they are made (their log lines name them).
- **Fork.** In a child made by `os.fork()` from a process that holds loaders, none of them is
  used: each one forgets its processes and ring without touching them (`loader._forked()`:
  they are the parent's) and refuses to be used (`LoaderClosed`); the forkserver and the
  precedence registry are the parent's too (start.py, precedence.py).
- **Threads.** `Within` takes a loader's lock for one call (`wait_for` when another thread
  holds it), waiting at most `timeout` seconds, then raises `LoaderTimeout` naming the call.
- **Closed.** What a closed loader, or one of the parent in a forked child, says (`closed_text`).
- **As a Python object** (`Managed`, the loader's base): a context manager that closes it, never
  pickled (`NOT_PICKLED`), without a len() (`NO_LEN`: an endless stream), and always true.
"""
import atexit
import itertools
import os
import weakref

from ..errors import LoaderTimeout
from . import precedence
from .start import forget_forkserver

_live = weakref.WeakSet()
_registered = False
_numbers = itertools.count(1)


def register(loader) -> int:
    """Close `loader` at exit (if still open) and let go of it in a forked child; its number
    among the loaders made in this process."""
    global _registered
    _live.add(loader)
    if not _registered:
        atexit.register(_close_all)
        os.register_at_fork(after_in_child=_forget_all)
        _registered = True
    return next(_numbers)


def close_when_dropped(loader, runs):
    """Stop `runs` (the loader's; nothing in it refers back to `loader`) once `loader` is dropped,
    without waiting for the processes (the reaper joins them). Not at exit: `_close_all` closes
    every live loader then, waiting."""
    drop = weakref.finalize(loader, runs.close, DROPPED, False)
    drop.atexit = False


DROPPED = "this ShmLoader was dropped"
NOT_PICKLED = ("a ShmLoader cannot be pickled: its processes and shared-memory ring belong to the process that "
               "made it. Make the loader in the process that reads it (give another process its arguments, or "
               "its state_dict() to resume from), and use it in place of a torch DataLoader, not as a "
               "DataLoader's dataset")
NO_LEN = ("a ShmLoader has no len(): it is an endless stream, each epoch followed by the next (as nanochat's "
          "loader); count training steps yourself (a token budget is steps = tokens // (B * T * world_size)) "
          "and see stats()['epoch'] for the epoch in progress. It replaces a torch DataLoader: iterate it "
          "directly, not as a DataLoader's dataset")


class Managed:
    """What a loader (with a `close()`) is as a Python object beyond its iteration: `with` closes
    it; pickling it (another process: a `DataLoader`'s workers, a spawn) and `len()` (a
    scheduler's, a progress bar's) raise a `TypeError` saying why and what to do instead; and
    `if loader:` is true (without `__bool__`, Python would ask `__len__`)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        raise TypeError(NOT_PICKLED)

    def __len__(self):
        raise TypeError(NO_LEN)

    def __bool__(self):
        return True


def _close_all():
    for loader in list(_live):
        loader.close()


def _forget_all():
    for loader in list(_live):
        loader._forked()
    forget_forkserver()
    precedence.forget()


def wait_for(lock, timeout: float, what: str):
    """Another thread holds a loader's `lock`: wait for it at most `timeout` s (then
    `LoaderTimeout` naming the call, `what`)."""
    if not lock.acquire(timeout=timeout):
        raise LoaderTimeout(f"{what} waited {timeout:.0f} s for another thread's next() on this loader to return")


def closed_text(forked_from: int | None) -> str:
    """What a closed loader says when used (`forked_from`: the pid of the process it belongs to,
    when this one was forked from it)."""
    if forked_from is not None:
        return (f"this ShmLoader belongs to process {forked_from}, and this process was forked "
                f"from it: a forked child never uses its parent's loader (its processes and ring "
                f"are the parent's); make a new loader in the child, after the fork")
    return "this ShmLoader was closed; make a new one"


class Within:
    """A lock taken for one call, waited for at most `timeout` s (then `LoaderTimeout` naming it)."""

    def __init__(self, lock, timeout: float, what: str):
        self.lock, self.timeout, self.what = lock, timeout, what

    def __enter__(self):
        if not self.lock.acquire(False):
            wait_for(self.lock, self.timeout, self.what)

    def __exit__(self, *exc):
        self.lock.release()
