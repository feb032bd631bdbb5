"""The version-6 mixture states of tests/fixtures/mixture_v6_states.json, and the data they read.

`write_data(root)` writes two sources of position documents (tests/helpers.py) under `root`,
"a" and "b", with nulls and row groups of 3 to 41 documents, b's tokens from 100,000. Run with a loader of state version
6 (the code of main before issue 50's step 1) as

    PYTHONPATH=<that checkout> python tests/scripts/mixture_v6_states.py tests/fixtures/mixture_v6_states.json

it writes, for each case of `CASES`, the state after batch `AT` and the sha256 of the batches
that follow it, from batch AT+1 to `N`, as that loader gives them: a resumed run of a later
version must give the same (tests/loader/test_one_source_mixture.py).
"""
import hashlib
import itertools
import json
import random
import sys
import tempfile
from pathlib import Path

B, T = 4, 64
AT, N = 9, 40
CASES = {  # name -> (sources, loader keywords)
    "two_bestfit": (("a", "b"), dict(packing="bos_bestfit", buffer_size=48, tokenizer_batch_size=16)),
    "one_bestfit": (("a",), dict(packing="bos_bestfit", buffer_size=48, tokenizer_batch_size=16)),
    "one_bestfit_shuffled": (("a",), dict(packing="bos_bestfit", buffer_size=48, tokenizer_batch_size=16,
                                          shuffle=True, seed=5, shuffle_window=20)),
    "one_concat_shuffled": (("a",), dict(packing="concat", shuffle=True, seed=5, shuffle_window=20)),
}
# docs, row groups, longest, seed, first position (b's tokens from 100,000: a batch's tokens say their source)
SHAPES = {"a": (300, [25, 7, 41, 3], 40, 11, 1), "b": (160, [12, 30], 90, 12, 100_000)}


def write_data(root) -> dict:
    """`{name: directory}` of the two sources (their last file is the val file)."""
    from shmloader.demo import corpus
    from tests.helpers import position_documents
    out = {}
    for name, (n, groups, longest, seed, first) in SHAPES.items():
        rng = random.Random(seed)
        lengths = [None if i % 23 == 4 else rng.randint(0, longest) for i in range(n)]
        corpus.write_shards(position_documents(lengths, first), Path(root) / name, num_files=3, row_group_size=groups)
        out[name] = str(Path(root) / name)
    return out


def loader_of(dirs: dict, sources, workers: int = 2, **kw):
    import shmloader
    from tests.helpers import IntTokenizer
    mix = shmloader.Mixture({s: dirs[s] for s in sources}, {s: 1 + i for i, s in enumerate(sources)})
    return shmloader.ShmLoader(mix, IntTokenizer(), B, T, num_workers=workers, device="cpu", **kw)


def digest(batches) -> str:
    """sha256 of the batches' (inputs, targets) bytes (tensors or arrays)."""
    import numpy as np
    h = hashlib.sha256()
    for x, y in batches:
        h.update(np.asarray(x).tobytes())
        h.update(np.asarray(y).tobytes())
    return h.hexdigest()


def main(out: str):
    cases = {}
    with tempfile.TemporaryDirectory() as root:
        dirs = write_data(root)
        for name, (sources, kw) in CASES.items():
            with loader_of(dirs, sources, **kw) as loader:
                it = iter(loader)
                for _ in range(AT):
                    next(it)
                state = loader.state_dict()
                after = digest(itertools.islice(it, N - AT))
            cases[name] = {"state": state, "after": after}
    Path(out).write_text(json.dumps({"B": B, "T": T, "at": AT, "n": N, "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    from shmloader import state
    assert state.VERSION == 6, f"run with the loader of state version 6 on PYTHONPATH (this one writes {state.VERSION})"
    main(sys.argv[1])
