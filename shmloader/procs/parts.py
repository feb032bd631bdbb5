"""Where the coordinator's CPU goes, by part: a bench's instrument, off unless asked for.

With `SHMLOADER_COORDINATOR_PARTS=<path>` in its environment the coordinator (procs/coordinator.py
`coordinator_main`) wraps the methods named in `PARTS` with `time.thread_time_ns` before it starts,
and at every 100th batch announced writes `<path>.<its pid>.json`: the batches announced, and
each part's CPU nanoseconds and calls so far (`tools/bench/coordinator_parts.py` reads two
of them, a window's ends). A part's time includes the parts it calls (`dispatch` holds
`planner`, `buffer runs`, `write orders` and some `outbox.send`s); each wrapper costs ~0.3 us a
call. Without the variable nothing here is imported.
"""
import functools
import json
import os
import time

ENV = "SHMLOADER_COORDINATOR_PARTS"
EVERY = 100  # batches between two writes of the file


def _parts():
    """`(class, method, part name)` of every part timed."""
    from ..ipc import handover, inbox, outbox, protocol, ring
    from ..packing import base, bestfit, mixbestfit, planner
    from . import coordinator as co
    c = co._Coordinator
    return [(c, "_dispatch", "dispatch"), (c, "_announce", "announce"), (c, "_assign", "assign"),
            (c, "_receive", "receive"), (c, "_check_idle", "idle rule"), (c, "_counted", "counted"),
            (handover.CoordinatorEnd, "freed", "free log"), (handover.CoordinatorEnd, "announce", "announcement"),
            (protocol.Listener, "wait", "poll"), (planner.BestFitPlanner, "plan_batch", "planner"),
            (planner.BestFitPlanner, "snapshot", "snapshot"), (bestfit.BestFitSequencer, "_complete", "buffer runs"),
            (bestfit.BestFitSequencer, "_orders", "write orders"), (outbox.Outbox, "send", "outbox.send"),
            (inbox.Inbox, "read", "inbox.read"), (base.Mode, "buffer_of", "buffer text"),
            (mixbestfit.MixBestFitMode, "hand_out", "hand_out"), (ring.Ring, "write_buffer", "buffer into slot")]


def install(path: str):
    """Wrap the parts; the coordinator's announcements write the file (see the module)."""
    from ..ipc import ring
    from . import coordinator as co
    spent, calls, clock = {}, {}, time.thread_time_ns

    def timed(f, name):
        @functools.wraps(f)
        def call(*a, **k):
            t0 = clock()
            try:
                return f(*a, **k)
            finally:
                spent[name] = spent.get(name, 0) + clock() - t0
                calls[name] = calls.get(name, 0) + 1
        return call

    for cls, attr, name in _parts():
        setattr(cls, attr, timed(getattr(cls, attr), name))
    co.ringmod.batch_check = timed(ring.batch_check, "batch check")
    announce, last = co._Coordinator._announce, [-1]

    def announce_and_write(self):
        announce(self)
        n = int(self.ring.counters[ring.Counter.ANNOUNCED])
        if n // EVERY != last[0]:
            last[0] = n // EVERY
            out = f"{path}.{os.getpid()}.json"
            with open(out + ".tmp", "w") as f:
                json.dump({"batches": n, "thread_ns": time.thread_time_ns(), "spent": spent, "calls": calls}, f)
            os.replace(out + ".tmp", out)
    co._Coordinator._announce = announce_and_write
