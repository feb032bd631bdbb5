"""Messages to one peer, sent without ever blocking the sender's loop.

The coordinator's loop must never block in a send: a worker blocked sending a long piece's
lengths reads nothing, and if the loop then blocked sending it a large write order both
would wait forever; a trainer away from `next()` stops reading announcements, and the loop
would stop serving the workers. So an `Outbox` first tries the send at once, without
waiting (`MSG_DONTWAIT` on the pipe's socket): the usual case, a pipe with room, costs one
system call. What does not fit (the pipe is full, or earlier messages still wait) goes to a
thread of its own, which sends it, blocking, in order. Handing every message to that thread
instead cost a thread wake-up and a hand-over of the GIL per message: best fit's two write
orders per batch (docs/benchmarks.md, "Three corpora, and the ceiling that counts reading").

A message is framed as `multiprocessing.connection.Connection.send` frames it (a 4-byte
big-endian length, or -1 and an 8-byte length above 2**31 - 1, then the pickle), so the peer
reads it with `Connection.recv`. A pipe that is not a socket (a one-way `os.pipe`) has every
message sent by the thread. A peer that is gone (a failed send) ends the sending: what is
queued and what comes after is dropped (its death is reported by the trainer, or is the
trainer's own).
"""
import os
import pickle
import socket
import stat
import struct
import threading
from collections import deque

_SHORT = 0x7FFFFFFF  # the longest payload with a 4-byte header
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)  # a peer gone is an error, never a SIGPIPE


def frame(msg) -> bytes:
    """`msg` as `Connection.send` puts it on the wire. Pickled by `pickle.dumps`, not
    `ForkingPickler` (which `Connection.send` uses): the coordinator's messages hold no object
    that needs multiprocessing's reducers (a worker's new pipe end travels by `send_handle`),
    and ForkingPickler's dispatch table, a ChainMap looked up in Python for every object not of
    a built-in type, cost 2-3 us a message (a best-fit write order: ~4.5 -> ~2 us)."""
    buf = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
    n = len(buf)
    head = struct.pack("!i", n) if n <= _SHORT else struct.pack("!i", -1) + struct.pack("!Q", n)
    return head + buf


class Outbox:
    """Messages to the peer at the other end of `conn` (a `multiprocessing` Connection), in
    order; `send` never blocks."""

    def __init__(self, conn):
        self.conn = conn
        self._sock = _socket_of(conn.fileno())  # its own descriptor of the pipe: `close` closes it
        self._lock = threading.Condition()
        self._queue = deque()  # frames not yet sent whole; the thread sends the first one
        self._gone = False
        self.direct = self.queued = 0  # messages sent at once, and handed to the thread
        self._thread = threading.Thread(target=self._run, name="shmloader-outbox", daemon=True)
        self._thread.start()

    def send(self, msg):
        data = frame(msg)
        with self._lock:
            if self._gone:
                return
            if not self._queue and self._sock is not None:
                try:
                    sent = self._sock.send(data, socket.MSG_DONTWAIT | _NOSIGNAL)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    self._gone = True
                    return
                if sent == len(data):
                    self.direct += 1
                    return
                data = data[sent:]
            self.queued += 1
            self._queue.append(data)
            self._lock.notify()

    def flush(self, timeout: float):
        """Send what is queued (at most `timeout` seconds), then stop the thread."""
        with self._lock:
            self._queue.append(None)
            self._lock.notify()
        self._thread.join(timeout)

    def close(self):
        """Close this outbox's own descriptor of the pipe (the Connection's stays open); a send
        the thread is in then fails, and the thread ends."""
        with self._lock:
            self._gone = True
            self._queue.clear()
            self._queue.append(None)
            self._lock.notify()
        if self._sock is not None:
            self._sock.close()

    def _run(self):
        while True:
            with self._lock:
                while not self._queue:  # idle until a frame, `flush` or `close`: a daemon thread,
                    self._lock.wait()   # nobody waits on it (flush joins it with a timeout)
                data = self._queue[0]  # stays first while it is sent: `send` then queues behind it
            if data is None:
                return
            try:
                if self._sock is not None:
                    self._sock.sendall(data, _NOSIGNAL)
                else:
                    _write_all(self.conn.fileno(), data)
            except OSError:
                with self._lock:
                    self._gone = True
                    self._queue.clear()
                return
            with self._lock:
                if self._queue and self._queue[0] is data:  # not if `close` emptied the queue meanwhile
                    self._queue.popleft()


def _write_all(fd: int, data: bytes):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _socket_of(fd: int):
    """A socket object on a duplicate of `fd` (blocking; `MSG_DONTWAIT` per call), or None when
    `fd` is not a socket."""
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        return None
    return socket.socket(fileno=os.dup(fd))
