"""The forkserver's word that it has booted: the last of its preloads (procs/start.py, `PRELOAD`).

A process's first loader starts multiprocessing's forkserver, which imports numpy, pyarrow,
tiktoken and the loader's modules before it answers a request (~0.35 s on 2 cores). The
training process does not wait for it: while the server boots, the head start makes the
batches (procs/headstart.py) and the run's children stay unstarted (`start.booting`). This
module is imported by the server once every other preload is in, and only there (nothing
else imports it): it leaves a file, `forkserver-<server pid>.ready`, in the training
process's temporary directory (`shml_tmp_<pid>_*`, start.py `_tempdir`), which the trainer
looks for with one `stat` per `next()` until it is there.
"""
import glob
import os
import tempfile

READY = "forkserver-{pid}.ready"


def _mark():
    parent = os.getppid()
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"shml_tmp_{parent}_*")):
        try:
            with open(os.path.join(path, READY.format(pid=os.getpid())), "x"):
                pass
        except OSError:  # not a directory of ours after all, or marked already
            pass


_mark()
