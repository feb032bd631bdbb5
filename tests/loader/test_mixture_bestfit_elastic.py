"""A best-fit mixture's state resumes at another world size (docs/contract.md §3), as one
source's does (tests/loader/test_elastic.py) and a concat mixture's (test_mixture_elastic.py):
three sources of token = position documents (each its own range of token values, every document
at least one token, so a row's segment after a BOS names its document by its first token), each
read for its `max_epochs`. Old ranks run to a batch count; every new rank is given old rank 0's
state (nanochat's way) or another old rank's, replays the other old ranks' mixes, makes each
source's elastic plan, takes its share of the old ranks' best-fit buffers and reads on until
the mixture ends.

Checked, 2 -> 3 and 3 -> 2, 2 workers (and 2 -> 3 shuffled, each source in its own order):
- the plans every new rank made are the same and hold every old rank's own place in each
  source (its state's point); the old ranks' buffers are dealt out, each run in one new rank's
  first buffer (its state before its first batch);
- each new rank's rows are the oracle's (tests/oracle.py) over its first buffer, its units of
  every source's plan, then plain epochs, byte for byte (unshuffled);
- over the old ranks' rows and the new ranks' (each to the mixture's end), every document of
  every source is placed exactly its `max_epochs` times, none more, but those left in a new
  rank's last buffer, after the mix ended: each named (shuffled: counted, a run's rows are its
  window's), or placed as a row's last segment, cropped to its BOS alone (counted: it cannot be
  named), and no more of those than the documents unnamed;
- a state of the new run resumes exactly on its own rank (another worker count); another
  rank's state of it, and another change of world size, are refused in words;
- a new rank's run with a worker and its coordinator killed gives the same rows (healed).
"""
import itertools
import json
import os
import random
import signal
import time
import warnings
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest

import shmloader
from shmloader.data import elastic
from shmloader.data.mixture import Mixer
from shmloader.demo import corpus
from shmloader.packing.mixbestfit import buffer_entries
from shmloader.demo.baseline import documents
from shmloader.procs.children import LIVENESS_CHECK_S
from tests import helpers, oracle
from tests.loader.test_bestfit_stream import rows_of

pytestmark = pytest.mark.usefixtures("watchdog")
B, T = 2, 16
BUFFER, CHUNK = 12, 4
# name -> (first token value, documents, row group size, max_epochs)
SOURCES = {"web": (1, 300, 7, 2), "code": (100_000, 120, 5, 3), "math": (200_000, 60, 3, 4)}
WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}


@pytest.fixture(scope="module")
def fitmix(tmp_path_factory):
    """Every source's train split (all its files but the last): `{name: {(file, rg, row): first
    token}}` of its documents (each at least one token after its BOS), and `{name: its files}`."""
    root = tmp_path_factory.mktemp("fitmix")
    docs, files = {}, {}
    for i, (name, (first, n, rg, _)) in enumerate(SOURCES.items()):
        rng = random.Random(60 + i)
        lengths = [None if rng.random() < 0.06 else rng.randint(1, 40) for _ in range(n)]
        paths = corpus.write_shards(helpers.position_documents(lengths, start=first), root / name, num_files=3,
                                    row_group_size=rg)
        docs[name], files[name] = {}, sorted(str(p) for p in paths)[:-1]
        for f, path in enumerate(files[name]):
            meta = pq.ParquetFile(path)
            for g in range(meta.num_row_groups):
                for row, text in enumerate(meta.read_row_group(g).column("text").to_pylist()):
                    if text is not None:
                        docs[name][f, g, row] = int(text.split()[0])
    return root, docs, files


def mixture(root):
    return shmloader.Mixture({name: str(root / name) for name in SOURCES}, WEIGHTS,
                             max_epochs={name: s[3] for name, s in SOURCES.items()})


def loader(root, rank, world, **kw):
    kw.setdefault("num_workers", 2)
    return shmloader.ShmLoader(mixture(root), helpers.IntTokenizer(), B, T, device="cpu", rank=rank, world_size=world,
                               timeout=60, packing="bos_bestfit", buffer_size=BUFFER, tokenizer_batch_size=CHUNK, **kw)


def take(ld, n=None) -> tuple[list, list]:
    """Up to n batches' rows (to the mixture's end), and the state after each."""
    rows, states = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sources that end (test_mixture.py checks the words)
        try:
            for x, y in itertools.islice(ld, n):
                rows.append(rows_of(x, y, B, T))
                states.append(ld.state_dict())
        except shmloader.DataError as e:
            assert "nothing is left to read" in str(e), e
    return rows, states


def unit_docs(files, plan, rank, world, epochs):
    """`((epoch, file, rg, row), text)` of new rank `rank`'s stream of one source: its units of
    `plan` (data/elastic.py), then plain epochs up to `epochs`."""
    counts = [[pq.ParquetFile(f).metadata.row_group(g).num_rows for g in range(pq.ParquetFile(f).num_row_groups)]
              for f in files]
    for u in elastic.rank_units(plan, rank, world, counts.__getitem__, len(files)):
        texts = pq.ParquetFile(files[u.file]).read_row_group(u.rg).column("text").to_pylist()
        for row in range(u.doc, u.rows):
            yield (u.epoch, u.file, u.rg, row), texts[row]
    yield from documents(files, rank, world, plan.epoch + 1, 0, rank, 0, epochs=epochs)


def expected(files, root, plans, point, rank, world, n) -> list:
    """The oracle's first `n` batches of new rank `rank`: from its start `point` (its mixer, its
    first buffer), every source's units of its plan, then plain epochs."""
    streams = {name: unit_docs(files[name], plans[name], rank, world, SOURCES[name][3]) for name in SOURCES}
    rows = oracle.mixed_bestfit_rows(files, helpers.IntTokenizer().encode, 0, mixture(root), B, T, BUFFER, CHUNK,
                                     point=point, batch=30, streams=streams)
    return [r for r, _ in itertools.islice(rows, n)]


def point_of(state) -> dict:
    return json.loads(state["mixture"]["point"])


def placed(batches) -> tuple[Counter, int]:
    """`(documents, cropped)`: the documents the batches' rows place, each named by its first
    token, and the segments of a BOS alone (a document cropped to its BOS at a row's end)."""
    named, cropped = Counter(), 0
    for row in itertools.chain.from_iterable(batches):
        bos = np.flatnonzero(row == 0).tolist()
        assert bos and bos[0] == 0, "a row that does not start with BOS"
        for lo, hi in zip(bos, bos[1:] + [len(row)]):
            if hi - lo == 1:
                assert hi == len(row), "a document of BOS alone inside a row: the data has none"
                cropped += 1
            else:
                named[int(row[lo + 1])] += 1
    return named, cropped


@pytest.mark.parametrize("W,W2,shuffled", [pytest.param(2, 3, False, marks=pytest.mark.slow), (3, 2, False),
                                            (2, 3, True)])  # 2 -> 3 in files' order with -m slow
def test_a_best_fit_mixture_resumes_at_another_world_size_each_document_placed_its_epochs(fitmix, W, W2, shuffled):
    root, docs, files = fitmix
    kw = dict(shuffle=True, seed=7, shuffle_window=4) if shuffled else {}
    rows, old = [], []
    for rank in range(W):
        with loader(root, rank, W, **kw) as ld:
            got, states = take(ld, 30)
        assert len(got) == 30
        rows += got
        old.append(states[-1])
    new, starts, ends = [], [], []
    for j in range(W2):
        given = old[0] if j % 2 == 0 else old[j % W]  # rank 0's state (nanochat's way), or another's
        with loader(root, j, W2, resume_state=json.loads(json.dumps(given)), **kw) as ld:
            starts.append(ld.state_dict())
            got, states = take(ld)
        assert len(got) > 20
        new.append(got)
        ends.append(states[-1])
        mixer = Mixer.resume(mixture(root), point_of(states[-1])["mixer"], states[-1]["batch"]).mixer
        assert mixer.over(), "the mix had not ended at the last batch: its buffer is not all that is left"
    plans = {json.dumps(s["mixture"]["plans"], sort_keys=True) for s in starts}
    assert len(plans) == 1, "the new ranks made different plans"
    plans = {name: elastic.Plan.from_state(d) for name, d in starts[0]["mixture"]["plans"].items()}
    for r, state in enumerate(old):  # every old rank's own place in each source, its state's
        for name, place in point_of(state)["sources"].items():
            assert plans[name].positions[r] == (*place, 0), (name, r)
    dealt = [tuple(run) for s in starts for run in buffer_entries(point_of(s))]
    every = [tuple(run) for s in old for run in buffer_entries(point_of(s))]
    assert every, "no buffer to deal out: the check means nothing"
    assert sorted(dealt) == sorted(every)  # each old run in one new rank's first buffer
    for j, s in enumerate(starts):
        assert s["world_size"] == W2 and s["rank"] == j and s["batch"] == 30
        if not shuffled:  # each new rank's rows are the oracle's over its units of every source and its buffer
            want = expected(files, root, plans, point_of(s), j, W2, len(new[j]))
            bad = [k for k, (a, b) in enumerate(zip(new[j], want)) if not np.array_equal(a, b)]
            assert not bad and len(want) == len(new[j]), f"new rank {j}: not the oracle's from batch {bad[:1]}"

    named, cropped = placed(rows + [r for got in new for r in got])
    left, unnamed = Counter(), 0  # each new rank's last buffer, after the mix ended: what it could not place
    for name, epoch, f, g, row, count in (run for s in ends for run in buffer_entries(point_of(s))):
        if shuffled:  # a run's rows are its window's, in the window's order: counted, not named
            unnamed += count
        else:
            left.update(docs[name][f, g, r] for r in range(row, row + count))
    epochs = {first: SOURCES[name][3] for name, of in docs.items() for first in of.values()}
    assert set(named) | set(left) <= set(epochs)
    for first, n in epochs.items():  # none placed (or left) more than its epochs
        assert named[first] + left[first] <= n, (first, named[first], left[first])
    # and none lost: those not named are the rows' documents cropped to their BOS (and shuffled, those left)
    assert sum(n - named[first] - left[first] for first, n in epochs.items()) == cropped + unnamed
    assert cropped < sum(named.values()) / 10


def test_a_state_of_the_new_run_resumes_exactly_on_its_own_rank(fitmix):
    root, *_ = fitmix
    with loader(root, 0, 2) as ld:
        _, states = take(ld, 25)
    with loader(root, 1, 3, resume_state=states[-1]) as ld:
        first, _ = take(ld, 6)
        inside = ld.state_dict()
        want, _ = take(ld, 25)
    assert inside["mixture"]["plans"] and inside["world_size"] == 3 and buffer_entries(point_of(inside))
    with loader(root, 1, 3, num_workers=1, resume_state=inside) as ld:
        got, _ = take(ld, 25)
    assert len(got) == 25 and all(np.array_equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match="another world size"):
        loader(root, 0, 2, resume_state=inside)
    with pytest.raises(ValueError, match="mixture changed at batch 25"):
        loader(root, 0, 3, resume_state=inside)


def test_a_new_ranks_run_killed_from_its_first_buffer_on_heals_to_the_same_rows(fitmix):
    """3 -> 2, new rank 0 (its first buffer over buffer_size: batches planned from it alone): a
    worker SIGKILLed after its first batch, while the old ranks' documents fill its buffer, and
    its coordinator after 10 (each healed from where the run stood), the same rows as a run left
    alone."""
    root, *_ = fitmix
    old = []
    for rank in range(3):
        with loader(root, rank, 3) as ld:
            old.append(take(ld, 30)[1][-1])
    with loader(root, 0, 2, resume_state=old[0]) as ld:
        want, _ = take(ld, 30)
    with loader(root, 0, 2, resume_state=old[0]) as ld:
        got, _ = take(ld, 1)
        for kill, upto in ((lambda d: d.workers[0], 10), (lambda d: d.coordinator, 30)):
            os.kill(kill(ld.debug()).pid, signal.SIGKILL)
            got += take(ld, upto - len(got) - 3)[0]
            time.sleep(LIVENESS_CHECK_S + 0.2)  # the batches may all be ready before the trainer looks
            got += take(ld, 3)[0]
        assert ld.stats()["heals"] == 2
    assert len(got) == len(want) == 30 and all(np.array_equal(a, b) for a, b in zip(got, want))
