"""Signals and process liveness, for every process of the loader.

Ctrl-C is the training process's: children are created with SIGINT blocked
(`sigint_blocked`, whose mask survives fork and exec) and ignore it before unblocking it
(`ignore_sigint`), which drops one that is pending. `pid_alive` judges a pid in this PID
namespace.

A mask is a thread's, not a process's: a Ctrl-C goes to the whole process, and the kernel
hands it to any thread that does not block it (the trainer has some before its first loader:
torch's and pyarrow's pools). Python's C handler then runs in that thread and the main thread
raises KeyboardInterrupt at its next bytecode, its own mask notwithstanding. So
`sigint_blocked` also defers the Python handler itself (`_Deferred`), where it can: in the
main thread, the only one that may set handlers and the only one that runs them.
"""
import contextlib
import os
import signal
import threading


def ignore_sigint():
    """A child's first step: Ctrl-C is the trainer's. Children are started with SIGINT blocked
    (procs/start.py, `_start`); ignoring it before unblocking it drops one that is pending."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def sigint_blocked():
    """Run the body with SIGINT blocked in this thread and, in the main thread, its handler
    deferred; a Ctrl-C that came meanwhile, to whichever thread, is delivered on leaving (a
    KeyboardInterrupt then, in the trainer). Processes created in the body inherit the
    blocked mask, through fork and exec."""
    deferred = _Deferred.install()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if deferred is not None:
            deferred.release()


class _Deferred:
    """The main thread's SIGINT handler, replaced by one that only notes a Ctrl-C; `release`
    puts the user's handler back and, if one came, hands it to that handler once
    (default_int_handler: a KeyboardInterrupt; SIG_IGN: nothing; SIG_DFL: death by SIGINT)."""

    def __init__(self, handler):
        self.handler = handler
        self.came = False

    @classmethod
    def install(cls):
        """None where handlers cannot be set (another thread, where none runs either) or were
        not set from Python."""
        if threading.current_thread() is not threading.main_thread():
            return None
        handler = signal.getsignal(signal.SIGINT)
        if handler is None:
            return None
        deferred = cls(handler)
        signal.signal(signal.SIGINT, deferred.note)
        return deferred

    def note(self, signum, frame):
        self.came = True

    def release(self):
        signal.signal(signal.SIGINT, self.handler)
        if not self.came:
            return
        if callable(self.handler):  # called, not raised again: a wakeup fd (asyncio's) heard it once
            self.handler(signal.SIGINT, None)
        else:  # SIG_IGN: nothing; SIG_DFL: the death it would have been
            signal.raise_signal(signal.SIGINT)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
