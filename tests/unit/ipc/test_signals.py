"""ipc/signals.py's `sigint_blocked`, as the trainer meets it: a Ctrl-C goes to the whole
process, and the kernel hands it to a thread that does not block it (torch's and pyarrow's
pools exist before a first loader). It must still not interrupt the body, but come once on
leaving it, to the handler the user had. Each case runs in a fresh interpreter, whose
handlers and threads are its own."""
import signal
import subprocess
import sys
import textwrap

import pytest

from tests import helpers

SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    from shmloader.ipc.signals import sigint_blocked

    handler = sys.argv[1]
    calls = []
    chosen = {"interrupt": signal.default_int_handler, "ignore": signal.SIG_IGN, "default": signal.SIG_DFL,
              "custom": lambda signum, frame: calls.append(list(seen))}[handler]
    signal.signal(signal.SIGINT, chosen)
    ready, stop = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (ready.set(), stop.wait()))  # made before the block:
    other.start()                                                         # SIGINT not blocked in it
    ready.wait()
    seen = []

    def body():
        with sigint_blocked():
            os.kill(os.getpid(), signal.SIGINT)  # to the process: the kernel picks `other`
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline:  # bytecodes, where a KeyboardInterrupt would come
                pass
            seen.append("body done")
            if handler == "default":
                print("body done", flush=True)  # the process dies on leaving the block
        time.sleep(0.05)

    go, finished = threading.Event(), threading.Event()

    def in_thread():
        go.wait()
        try:
            body()
        except KeyboardInterrupt:
            seen.append("KeyboardInterrupt in the thread")
        finished.set()

    if sys.argv[2] == "main":
        try:
            body()
        except KeyboardInterrupt:
            seen.append("KeyboardInterrupt")
    else:
        t = threading.Thread(target=in_thread)
        t.start()
        while not finished.is_set():  # the Ctrl-C may come at any bytecode of this thread,
            try:                       # go.set() included: the loop outlives it
                go.set()
                time.sleep(0.01)
            except KeyboardInterrupt:
                seen.append("KeyboardInterrupt")
        t.join()
    stop.set()
    other.join()
    print(seen, calls, signal.getsignal(signal.SIGINT) is chosen)
""")


def run(handler: str, where: str, returncode: int = 0) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, handler, where], capture_output=True,
                          text=True, timeout=60, cwd=helpers.REPO_ROOT)
    assert done.returncode == returncode, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("handler, expected", [
    ("interrupt", "['body done', 'KeyboardInterrupt'] [] True"),
    ("ignore", "['body done'] [] True"),
    ("custom", "['body done'] [['body done']] True"),
])
def test_a_ctrl_c_to_another_thread_waits_for_the_end_of_the_block(handler, expected):
    assert run(handler, "main") == expected


def test_with_the_default_action_the_process_dies_of_it_after_the_block():
    assert run("default", "main", returncode=-signal.SIGINT) == "body done"


def test_off_the_main_thread_the_handler_is_left_alone():
    """Only the main thread sets or runs handlers: a block in another thread changes none, and
    the Ctrl-C is the main thread's, at once."""
    assert run("interrupt", "thread") == "['KeyboardInterrupt', 'body done'] [] True"
