"""One source's count-only replay in-process (the checkout's count mode: `SourceCountMode`, an
older checkout's `CountMode`): pieces of 256 documents of lognormal lengths, counted in order by
2 workers, until the place at batch N is Located. Prints µs of CPU a batch replayed, the place
and its buffer's length. Run it from each checkout in turn to compare them (this file works
with a checkout from before a run's start was one record, ipc/runstart.py: its run is built
with the old fields then):

    cd CHECKOUT && PYTHONPATH=. python THIS_CHECKOUT/tools/bench/count_replay.py PACKING BATCHES
"""
import sys, time
sys.path.insert(0, ".")
import numpy as np
from types import SimpleNamespace
from shmloader.config import LoaderConfig
from shmloader.data.order import Piece
from shmloader.ipc.protocol import Counted, Located
from shmloader.position import Position
try:
    from shmloader.packing.mixcount import SourceCountMode as Count
except ImportError:
    from shmloader.packing.count import CountMode as Count
packing, n = sys.argv[1], int(sys.argv[2])
B, T = 16, 2048
cfg = LoaderConfig(B, T, packing=packing)
try:  # a run's start as one record (ipc/runstart.py)
    from shmloader.ipc.runstart import CountTo, RunStart, SourceStart
    run = SimpleNamespace(start=RunStart(Position(1, 0, 0, 0), SourceStart(), 0, CountTo([[0, B, T]], n)), layout=None,
                          rank=0, world=1)
except ImportError:  # before it (main before branch `start`): the run's own fields
    run = SimpleNamespace(locate=([[0, B, T]], n, 0), start=Position(1, 0, 0, 0), layout=None, buffer_runs=(),
                          rank=0, world=1, plan=None)
def pieces(ramp, cap, first, **kw):
    return (Piece(first + i, 1, 0, i, 0, 256, 1000) for i in range(10**7))
rng = np.random.default_rng(0)
lengths = [rng.lognormal(6, 1, 256).astype(np.int64) + 1 for _ in range(4096)]
mode = Count(cfg, run, 2, pieces)
t = time.process_time()
found = None
while found is None:
    given = []
    for w in (0, 1):
        while mode.can_take(w):
            piece = next(mode.pieces); mode.take(w, piece); given.append(piece)
    for piece in given:
        mode.counted(Counted(piece.index, lengths[piece.index % 4096], None))
    found = next((m for m in mode.messages() if isinstance(m, Located)), None)
took = time.process_time() - t
print(f"{took / n * 1e6:.2f} {tuple(found.position)} {len(str(found.runs))}")
