"""The forkserver's word that it has booted: the last of its preloads (procs/start.py, `PRELOAD`).

A process's first loader starts multiprocessing's forkserver, which imports numpy, pyarrow,
tiktoken and the loader's modules before it answers a request (~0.35 s on 2 cores). The
training process does not wait for it: while the server boots, the head start makes the
batches (procs/headstart.py) and a thread starts the run's children once the server has
booted (`start.booting`). The server imports this module once every other preload is in: it
leaves a file, `forkserver-<server pid>.ready`, in the training process's temporary directory
(`shml_tmp_<pid>_*`, start.py `_tempdir`), found through the lock file the trainer keeps open
(its `/proc/<pid>/fd`), wherever the trainer's `tempfile` settings put it; failing that, in
this process's temporary directory. Nothing else imports this module (start.py does not): a
process that did would leave a marker for its parent, which only a booting server of that
parent's is ever looked for by.

It also has the server sweep stale segments when it exits (`_sweep_at_exit`, at the
interpreter's exit: the server exits once its parent and every child it started are gone). A
trainer killed while its first run's children were still unstarted leaves its ring with
nobody to unlink it (a run's coordinator does that when the trainer dies); the server, its
child, outlives it by its boot at most, and `segment.sweep_stale` unlinks only segments whose
creator is gone (ipc/segment.py).
"""
import atexit
import glob
import os
import tempfile

from .start import READY, TEMP_LOCK, TEMP_PREFIX


def _trainer_dirs(parent: int) -> set:
    prefix, found = f"{TEMP_PREFIX}{parent}_", set()
    try:
        fds = os.listdir(f"/proc/{parent}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{parent}/fd/{fd}")
        except OSError:
            continue
        if os.path.basename(target) == TEMP_LOCK and os.path.basename(os.path.dirname(target)).startswith(prefix):
            found.add(os.path.dirname(target))
    return found or set(glob.glob(os.path.join(tempfile.gettempdir(), prefix + "*")))


def _mark():
    for path in _trainer_dirs(os.getppid()):
        try:
            with open(os.path.join(path, READY.format(pid=os.getpid())), "x"):
                pass
        except OSError:  # not a directory of ours after all, or marked already
            pass


def _sweep_at_exit():
    from ..ipc import segment
    try:
        segment.sweep_stale()
    except Exception:  # noqa: BLE001 (a sweep is a courtesy: the next loader's start sweeps too)
        pass


_mark()
atexit.register(_sweep_at_exit)  # the server's own exit; a child it forks ends in os._exit
