"""ipc/inbox.py: one read returns every whole message the pipe holds, in order; a message cut
short (a long one, or its length alone) waits for the reads that bring the rest; the peer gone
is EOFError once every message before it was returned; frames are `Connection.send`'s."""
import multiprocessing as mp
import select

import numpy as np
import pytest

from shmloader.ipc.inbox import READ_BYTES, Inbox
from shmloader.ipc.outbox import frame
from shmloader.ipc.protocol import Written
from shmloader.packing.bestfit import Rows


def readable(conn) -> bool:
    return bool(select.select([conn.fileno()], [], [], 5.0)[0])


def read_all(box, conn, n: int) -> list:
    """Read (as the coordinator does: once the poll says readable) until `n` messages came."""
    out, reads = [], 0
    while len(out) < n:
        assert readable(conn), f"only {len(out)} of {n} messages came"
        out += box.read()
        reads += 1
    return out, reads


def test_one_read_takes_every_message_the_pipe_holds_in_order(pipe):
    mine, theirs = pipe
    sent = [Written([(k, 100 + k)], 1 + k % 3) for k in range(40)]
    for msg in sent:
        theirs.send(msg)  # Connection.send's frames
    box = Inbox(mine)
    assert readable(mine)
    assert box.read() == sent, "40 short messages: all of them in one read"


def test_a_message_cut_short_waits_for_the_rest(pipe):
    mine, theirs = pipe
    box = Inbox(mine)
    data = frame(("order", 7)) + frame(("order", 8))
    cut = 3  # within the first message's length
    theirs._send(data[:cut])
    assert readable(mine) and box.read() == []
    theirs._send(data[cut:-2])
    assert readable(mine) and box.read() == [("order", 7)]
    theirs._send(data[-2:])
    assert readable(mine) and box.read() == [("order", 8)]


def test_a_message_longer_than_a_read_comes_whole(pipe):
    mine, theirs = pipe
    box = Inbox(mine)
    big = np.arange(5 * READ_BYTES, dtype=np.int64)  # 40 reads' worth of bytes, from another process
    sender = mp.get_context("fork").Process(target=_send_all, args=(theirs, [big, "after"]))
    sender.start()
    try:
        got, reads = read_all(box, mine, 2)
    finally:
        sender.join(10)
    assert np.array_equal(got[0], big) and got[1] == "after"
    assert reads <= 1 + len(frame(big)) // READ_BYTES + 2, "a read takes what the message begun needs"


def _send_all(conn, msgs):
    for msg in msgs:
        conn.send(msg)


def test_eof_comes_after_every_message_before_it(pipe):
    mine, theirs = pipe
    box = Inbox(mine)
    theirs.send(Written([(0, 5)]))
    theirs.close()
    assert readable(mine) and box.read() == [Written([(0, 5)], 1)]
    assert readable(mine)
    with pytest.raises(EOFError):
        box.read()


def test_a_write_order_travels_as_its_placements_bytes(pipe):
    """best fit's `Rows` pickles its (n, 5) placements as bytes, and arrives as an array."""
    mine, theirs = pipe
    placements = np.array([[3, 0, 0, 0, 4], [3, 2, 0, 4, 2], [5, 1, 1, 0, 6]], dtype=np.int64)
    theirs._send(frame(Rows(9, 2, placements)))
    got, = Inbox(mine).read()
    assert type(got) is Rows and (got.batch, got.slot) == (9, 2)
    assert got.placements.dtype == np.int64 and got.placements.tolist() == placements.tolist()
