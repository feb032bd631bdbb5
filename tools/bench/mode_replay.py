"""A coordinator mode's replay in-process, this checkout's (tools/profile_mixture.py's `mode_of`
and `drive`): µs of CPU a batch with 2 decimals, and by part. Run it from each checkout in turn
(the order swapped every round) to compare them (docs/benchmarks.md "One source through the
mixture's modes"):

    cd CHECKOUT && PYTHONPATH=. python tools/bench/mode_replay.py PACKING BATCHES [--single | --sources N]
"""
import sys, time
sys.path.insert(0, ".")
import numpy as np
from tools import profile_mixture as pm
from shmloader.packing.base import SlotMap
packing, n, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:] or ["--single"]
args = pm.parse_args(["--packing", packing, "--batches", str(n), *extra])
mode, slots, rng = pm.mode_of(args), SlotMap(8), np.random.default_rng(0)
pm.drive(mode, slots, rng, 20)
t = time.process_time(); pm.drive(mode, slots, rng, n); took = time.process_time() - t
parts = pm._Parts(); pm.drive(mode, slots, rng, n, parts)
print(f"{took / n * 1e6:.2f} | " + " ".join(f"{p.replace(' ', '_')}={v / n * 1e6:.2f}" for p, v in parts.took.items()))
