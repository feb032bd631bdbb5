"""Messages from one peer, every one its pipe holds taken with one read.

`Connection.recv` reads a message in two system calls (its 4-byte length, then its pickle),
one message a call: best fit's coordinator read ~5 times a batch that way, a worker's
`Written` and now and then a `Counted` (docs/benchmarks.md, "Best fit's coordinator per
batch"). An `Inbox` reads what the pipe holds, up to what the message begun needs or 64 KiB,
in one `read` once a poll says the pipe is readable (so it never blocks), and returns every
whole message in it; a message cut short stays buffered until the next read, which the poll
reports as before.

Frames are `Connection.send`'s (ipc/outbox.py `frame`): a 4-byte big-endian length, or -1
and an 8-byte length, then the pickle. The peer gone is `EOFError` (or the
`ConnectionResetError` of a peer that exited with messages unread), as from `recv`, once
every whole message before it was returned.
"""
import os
import pickle
import struct

READ_BYTES = 1 << 16
_LONG = struct.Struct("!Q")


class Inbox:
    """Messages from the peer at the other end of `conn` (a `multiprocessing` Connection)."""

    def __init__(self, conn):
        self.conn = conn
        self._fd = conn.fileno()
        self._buf = bytearray()
        self._need = 4  # bytes the next whole message needs at least (its length first)

    def read(self) -> list:
        """The whole messages after one read of the pipe (call it once the pipe is readable)."""
        data = os.read(self._fd, max(READ_BYTES, self._need - len(self._buf)))
        if not data:
            raise EOFError
        buf = self._buf
        buf += data
        out, at, end = [], 0, len(buf)
        with memoryview(buf) as view:
            while end - at >= 4:
                n = int.from_bytes(view[at:at + 4], "big", signed=True)
                head = 4
                if n == -1:
                    if end - at < 12:
                        self._need = 12
                        break
                    n, head = _LONG.unpack_from(view, at + 4)[0], 12
                if end - at < head + n:
                    self._need = head + n
                    break
                out.append(pickle.loads(view[at + head:at + head + n]))
                at += head + n
            else:
                self._need = 4
        del buf[:at]
        return out
