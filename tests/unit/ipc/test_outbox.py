"""ipc/outbox.py: a send never blocks, messages arrive whole and in order whether sent at once or
by the thread, and a peer that is gone ends the sending quietly."""
import multiprocessing as mp
import os
import time

import numpy as np

from shmloader.ipc.outbox import Outbox, frame


def test_a_pipe_with_room_takes_each_message_at_once(pipe):
    mine, theirs = pipe
    box = Outbox(mine)
    for i in range(50):
        box.send(("order", i))
    assert (box.direct, box.queued) == (50, 0), "no thread hand-over while the pipe has room"
    assert [theirs.recv() for _ in range(50)] == [("order", i) for i in range(50)]
    box.close()


def test_a_full_pipe_never_blocks_the_sender_and_every_message_arrives_in_order(pipe):
    mine, theirs = pipe
    box = Outbox(mine)
    big = np.arange(40_000, dtype=np.int64)  # 320 KB: several pipes' worth
    sent = [("big", i, big + i) if i % 3 == 2 else ("small", i) for i in range(30)]
    began = time.monotonic()
    for msg in sent:
        box.send(msg)  # nobody reads yet: the pipe fills
    assert time.monotonic() - began < 2.0, "send blocked on a full pipe"
    assert box.queued > 0 and box.direct > 0, (box.direct, box.queued)
    for want in sent:
        got = theirs.recv()
        assert got[:2] == want[:2]
        if want[0] == "big":
            assert np.array_equal(got[2], want[2])
    box.flush(timeout=5)
    assert not theirs.poll(0.05), "nothing sent twice"


def test_flush_sends_what_is_queued_and_stops_the_thread(pipe):
    mine, theirs = pipe
    box = Outbox(mine)
    payload = b"x" * 300_000
    for i in range(4):
        box.send((i, payload))
    got = []
    import threading
    reader = threading.Thread(target=lambda: got.extend(theirs.recv() for _ in range(4)))
    reader.start()
    box.flush(timeout=10)
    reader.join(10)
    assert [g[0] for g in got] == [0, 1, 2, 3] and all(g[1] == payload for g in got)
    assert not box._thread.is_alive()


def test_a_peer_that_is_gone_ends_the_sending_without_an_error(pipe):
    mine, theirs = pipe
    box = Outbox(mine)
    theirs.close()
    began = time.monotonic()
    for i in range(20):
        box.send((i, b"y" * 100_000))  # no exception, no wait
    box.flush(timeout=5)
    assert time.monotonic() - began < 5.0
    assert not box._thread.is_alive()


def test_close_leaves_the_connection_open_and_its_own_descriptor_closed(pipe):
    mine, theirs = pipe
    before = set(os.listdir("/proc/self/fd"))
    box = Outbox(mine)
    box.send("hello")
    assert theirs.recv() == "hello"
    box.close()
    box._thread.join(5)
    assert not box._thread.is_alive()
    assert set(os.listdir("/proc/self/fd")) == before, "the outbox's duplicate descriptor is closed"
    theirs.send("back")
    assert mine.recv() == "back", "the Connection's own descriptor still works"
    mine.send("still")
    assert theirs.recv() == "still"


def test_a_pipe_that_is_not_a_socket_is_served_by_the_thread():
    r, w = mp.Pipe(duplex=False)  # an os.pipe: no per-call flags
    try:
        box = Outbox(w)
        for i in range(5):
            box.send(i)
        assert [r.recv() for _ in range(5)] == list(range(5))
        assert box.direct == 0 and box.queued == 5
        box.flush(timeout=5)
    finally:
        r.close()
        w.close()


def test_the_frame_is_what_connection_send_writes(pipe):
    mine, theirs = pipe
    msg = {"a": np.arange(5), "b": "text"}
    os.write(mine.fileno(), frame(msg))
    got = theirs.recv()
    assert got["b"] == "text" and np.array_equal(got["a"], np.arange(5))


def test_a_peer_gone_is_no_sigpipe_even_where_sigpipe_kills():
    """A process with SIGPIPE at its default (Python ignores it; an embedding may not) is not
    killed by sending to a peer that is gone."""
    import subprocess
    import sys

    code = ("import signal, multiprocessing as mp\n"
            "from shmloader.ipc.outbox import Outbox\n"
            "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
            "a, b = mp.Pipe(); box = Outbox(a); b.close()\n"
            "for i in range(10): box.send(b'z' * 100000)\n"
            "box.flush(5); print('alive')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "alive", (done.returncode, done.stderr[-500:])


def test_a_send_never_overtakes_what_the_thread_still_holds(pipe):
    """While a reader drains the pipe, room comes and goes: a message sent at once must still
    wait behind the frames (or the rest of a frame) the thread has not sent yet."""
    import threading

    mine, theirs = pipe
    box = Outbox(mine)
    big = np.arange(30_000, dtype=np.int64)
    sent = [("big", i, big) if i % 4 == 3 else ("small", i) for i in range(400)]
    got = []

    def read():
        for _ in sent:
            got.append(theirs.recv())
            if len(got) % 7 == 0:
                time.sleep(0.001)  # slower than the sender now and then: the pipe fills and drains

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for i, msg in enumerate(sent):
        box.send(msg)
        if i % 16 == 15:
            time.sleep(0.002)  # now and then the thread catches up: later messages go at once again
    box.flush(timeout=30)
    reader.join(30)
    assert not reader.is_alive(), f"the reader got {len(got)} of {len(sent)} messages"
    assert [m[1] for m in got] == list(range(len(sent)))
    assert box.direct > 0 and box.queued > 0, (box.direct, box.queued)
