"""What a state costs past a reordered epoch (mixstate.numbered: the point renumbered as the
source's epoch orders its files), on a mixture of one source.

    python tools/bench/numbered.py                       # concat, then best fit (buffer 1000)
    python tools/bench/numbered.py --compare ../other-checkout   # before and after, in turn

Four shards of 3000 documents (row groups of 100) are read as `Mixture({x: d}, {x: 1})`, 20
batches of 8 x 64 saved, a fifth shard written among them, and the run resumed (the epoch in
progress reordered) and read into epoch 2; then `numbered(point, sources)` of the last batch's
point is timed (`timeit`, the best of 5 repeats of 2000 calls), for concat and best fit. With
`--compare DIR`, each is timed with DIR's shmloader too, in a fresh process, the two in turn.
"""
from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import timeit
import warnings

NAMES = [f"shard_{i:05d}.parquet" for i in range(5)]


def measure(buffer_size: int):
    import shmloader
    from shmloader import mixstate
    from tests import helpers
    from tests.loader.test_growing_data import write_file

    for kw in ({}, dict(packing="bos_bestfit", buffer_size=buffer_size)):
        with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in (0, 1, 3, 4):
                write_file(f"{d}/{NAMES[i]}", i, n_docs=3000, rg=100)
            one = shmloader.Mixture({"x": d}, {"x": 1})

            def loader(**more):
                return shmloader.ShmLoader(one, helpers.IntTokenizer(), 8, 64, device="cpu", num_workers=1,
                                           timeout=60, **more, **kw)
            with loader() as ld:
                state = [ld.state_dict() for _ in itertools.islice(ld, 20)][-1]
            write_file(f"{d}/{NAMES[2]}", 2, n_docs=3000, rg=100)
            with loader(resume_state=state) as ld:
                for _ in ld:
                    if ld.state_dict()["epoch"] >= 2:
                        break
                point, sources = ld._mark.buffer, ld._catalogue
                assert mixstate.numbered(point, sources) is not point  # not vacuous: renumbered
                took = min(timeit.repeat(lambda: mixstate.numbered(point, sources), number=2000, repeat=5)) / 2000
            print(f"{shmloader.__file__.rsplit('/shmloader/', 1)[0]}: {kw.get('packing', 'bos_concat')}: point "
                  f"{len(point.text)} chars, numbered {took * 1e6:.1f} us a state", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--buffer-size", type=int, default=1000, help="best fit's buffer, in documents")
    ap.add_argument("--compare", help="another checkout's root: its shmloader timed too, in turn")
    ap.add_argument("--repeat", type=int, default=2, help="rounds (with --compare: each checkout a round)")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return measure(args.buffer_size)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for _ in range(args.repeat):
        for root in [here] + ([os.path.abspath(args.compare)] if args.compare else []):
            env = dict(os.environ, PYTHONPATH=f"{root}:{here}")
            subprocess.run([sys.executable, __file__, "--inner", "--buffer-size", str(args.buffer_size)],
                           env=env, check=True, timeout=600)


if __name__ == "__main__":
    main()
