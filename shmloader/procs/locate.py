"""A count-only run to its answer: `locate_position` starts a coordinator and workers that count
(`RunArgs.start`'s `CountTo`: packing/mixcount.py) and waits for the position they find
(`Located`), watched as a loader's run is (children.py), a lost child healed within the
loader's budget."""
import time
from dataclasses import replace
from multiprocessing.connection import wait

from .. import errors
from ..ipc import ring as ringmod
from ..ipc.protocol import Located, Progress
from .children import ChildLost, Children, start_children
from .stall import Watch


def locate_position(config, layout: ringmod.RingLayout, cargs, heal=None, progress=None) -> Located:
    """Run a count-only coordinator and workers until the coordinator reports (`Located`) the
    position at `cargs.start.locate` and, best fit, the buffer there, with the pieces tokenized and
    read from the token cache to count them. Its progress (the coordinator's `Progress`, once a
    second) goes to `progress(now, done, total, extra)` (progress.py `Report.update`). It is watched as a loader's run
    is: a child that dies, or stalls for `stall_s`, is a `ChildLost` given to `heal(lost)`
    (procs/run.py: it raises when the budget or the poison rule says no, else a worker is
    replaced and the count goes on where it stood; a lost coordinator counts again from the
    start); with no `heal`, or no word of progress (documents counted) for `config.timeout`
    s, it raises as `next()` does."""
    kids = start_children(config, layout, cargs)
    try:
        while True:
            try:
                return _count(kids, config, progress)
            except ChildLost as lost:
                if heal is None:
                    raise errors.WorkerError(str(lost)) from None
                lost = kids.blame(lost)
                spans = heal(lost, kids.files)
                if lost.worker is not None and kids.replace_worker(lost.worker, *spans):
                    continue
                cargs = replace(cargs, poisoned=spans[0], suspects=spans[1])
            kids.shutdown()
            kids = start_children(config, layout, cargs)
    finally:
        kids.shutdown()


def _count(kids: Children, config, progress) -> Located:
    """Wait for a count-only run's answer; raise `ChildLost` for a death or a stall."""
    deadline, replayed = time.monotonic() + config.timeout, -1
    look_s = min(1.0, kids.stall_s or 1.0)
    watch = Watch(kids.ring, time.monotonic(), look_s)
    while True:
        ready = wait([kids.conn, *kids.sentinels], timeout=min(look_s, max(deadline - time.monotonic(), 0)))
        if kids.conn in ready:
            msg = kids.read((Located, Progress))
            if isinstance(msg, Located):
                return msg
            if msg is None:  # a message, not progress
                continue
            if msg.done > replayed:
                replayed, deadline = msg.done, time.monotonic() + config.timeout
            if progress is not None:
                progress(time.monotonic(), msg.done, msg.total, f"{msg.docs:,} documents counted")
            continue
        if ready:
            kids.check_alive()
        if kids.stall_s and (stall := watch.stalled(time.monotonic(), kids.stall_s)) is not None:
            kids.kill_stalled(stall)
        if time.monotonic() >= deadline:
            raise errors.LoaderTimeout(f"finding this rank's position: no batch replayed for {config.timeout:.0f} "
                                       f"s; {kids.describe_all()}")
