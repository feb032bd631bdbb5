"""Signals and process liveness, for every process of the loader.

Ctrl-C is the training process's: children are created with SIGINT blocked
(`sigint_blocked`, whose mask survives fork and exec) and ignore it before unblocking it
(`ignore_sigint`), which drops one that is pending. `pid_alive` judges a pid in this PID
namespace.
"""
import contextlib
import os
import signal


def ignore_sigint():
    """A child's first step: Ctrl-C is the trainer's. Children are started with SIGINT blocked
    (procs/children.py, `_start`); ignoring it before unblocking it drops one that is pending."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def sigint_blocked():
    """Run the body with SIGINT blocked in this thread; a Ctrl-C that came meanwhile is
    delivered on leaving (a KeyboardInterrupt then, in the trainer). Processes created in the
    body inherit the blocked mask, through fork and exec."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
