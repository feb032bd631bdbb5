"""Imported last among the forkserver's preloads (procs/start.py's PRELOAD): the server has
booted, and from now on starts a child at once. It says so by creating the file that the
training process named in `BOOTED_ENV` when it launched the server (`start.booting`). Does
nothing anywhere else (a child forked from the server has the module already)."""
import os

BOOTED_ENV = "SHMLOADER_FORKSERVER_BOOTED"

_path = os.environ.get(BOOTED_ENV)
if _path:
    try:
        os.close(os.open(_path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
    except OSError:
        pass  # the trainer then takes the server for still booting, which costs it only a head start's length
