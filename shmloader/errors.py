"""Exceptions raised by shmloader in the training process.

Every exception raised from a worker or the coordinator is re-raised in the training process
as one of these, with the process, its pid, the file and the row group in the message.
`warn` is how every warning reaches the caller: it points at the caller's own line.
"""
import sys
import warnings


def warn(text: str, category=UserWarning):
    """`warnings.warn(text, category)` from the first frame outside shmloader (the caller's
    line, however deep in the loader or its drop-in generators the warning arose)."""
    frame, level = sys._getframe(1), 2  # level 2: warn()'s caller
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "shmloader":
        frame, level = frame.f_back, level + 1
    warnings.warn(text, category, stacklevel=level)


class ShmLoaderError(RuntimeError):
    """Base class for failures of the loader's processes."""


class DataError(ValueError):
    """The data cannot be read as docs/contract.md §4 says: missing files, bad columns, corrupt parquet."""


class WorkerError(ShmLoaderError):
    """A worker or the coordinator raised or died; the message names it, its pid and its piece."""


class LoaderTimeout(ShmLoaderError, TimeoutError):
    """No batch arrived within the timeout although every process was alive."""


class LoaderClosed(ShmLoaderError):
    """The loader was used after close()."""


class DeviceError(ShmLoaderError, ValueError):
    """The device asked for is not there (e.g. device="cuda" with a torch that has no CUDA)."""
