"""Shards unlike the demo corpus, through the whole loader: row groups of 1 to 300 documents,
documents from null and empty to ~20K characters (one-liners, prose, long pages), cut into
pieces by text bytes (`max_piece_bytes`, data/order.py) and held by workers by tokens
(packing/base.py). The stream equals the single-process oracle whatever the number of
workers and the byte cap, for both packings, and a state resumes exactly with another
number of workers and another cap (piece cuts are not part of the stream). How busy the
workers are on such shards is measured by tools/bench/throughput.py (`--corpus skewed`), not here.
"""
import itertools
import json
import random

import numpy as np
import pytest
import torch

from shmloader.demo import corpus
from tests import helpers
from tests.helpers import Dataset, position_of, window_of
from tests.oracle import bestfit_rows

pytestmark = pytest.mark.usefixtures("watchdog")

B, T = 8, 256
SIZES = [1, 40, 2, 1, 300, 3, 1, 1, 77, 9, 150, 1]


def skewed_docs(text: str, n: int, seed: int = 5) -> list:
    rng = random.Random(seed)

    def cut(k):
        at = rng.randrange(0, len(text) - k)
        return text[at:at + k]
    docs = []
    for _ in range(n):
        u = rng.random()
        docs.append(None if u < 0.05 else "" if u < 0.1 else cut(rng.randint(1, 80)) if u < 0.5
                    else cut(rng.randint(200, 1500)) if u < 0.96 else cut(rng.randint(5000, 20000)))
    return docs


@pytest.fixture(scope="module")
def skewed(tmp_path_factory, small_texts, enc):
    root = tmp_path_factory.mktemp("skewed")
    docs = skewed_docs("\n".join(small_texts), 1200)
    paths = corpus.write_shards(docs, root, num_files=3, row_group_size=SIZES)
    assert max(helpers.row_group_sizes(paths[0])) == 300 and min(helpers.row_group_sizes(paths[0])) == 1
    return Dataset(root, paths, enc, enc.encode_ordinary, enc.encode_single_token("<|bos|>"), docs)


def concat_batches(loader, n):
    windows, positions, states = [], [], []
    for x, y in itertools.islice(loader, n):
        windows.append(window_of(x, y))
        states.append(loader.state_dict())
        positions.append(position_of(states[-1]))
    return windows, positions, states


@pytest.mark.parametrize("num_workers,max_piece_bytes", [(1, 1 << 20), (2, 3000), (3, 200)])
def test_concat_stream_is_the_oracle_s(skewed, num_workers, max_piece_bytes):
    n = next(k for k, (_, pos) in enumerate(skewed.oracle(B, T)) if pos[0] == 2) + 10  # into epoch 2
    want_w, want_p = skewed.expected(n, B, T)
    with skewed.loader(B, T, num_workers=num_workers, max_piece_bytes=max_piece_bytes) as loader:
        got_w, got_p, _ = concat_batches(loader, n)
    for k in range(n):
        assert np.array_equal(got_w[k], want_w[k]), f"batch {k} differs from the oracle"
        assert got_p[k] == want_p[k], f"state of batch {k}"


def test_concat_resumes_with_other_workers_and_cuts(skewed):
    want_w, _ = skewed.expected(170, B, T)
    with skewed.loader(B, T, num_workers=2, max_piece_bytes=3000) as loader:
        _, _, states = concat_batches(loader, 140)
    for k in (13, 69, 136):  # the last: in epoch 2
        state = json.loads(json.dumps(states[k]))
        with skewed.loader(B, T, num_workers=3, max_piece_bytes=500, resume_state=state) as loader:
            got_w, _, _ = concat_batches(loader, 30)
        for j, got in enumerate(got_w):
            assert np.array_equal(got, want_w[k + 1 + j]), f"resumed at {k}: batch {k + 1 + j} differs"


def bestfit_take(loader, n):
    rows, states = [], []
    for x, y in itertools.islice(loader, n):
        rows.append(torch.cat([x, y[:, -1:]], 1).numpy())
        states.append(loader.state_dict())
    return rows, states


@pytest.mark.parametrize("num_workers,max_piece_bytes,chunk", [(1, 1 << 20, 128), (2, 3000, 7), (3, 200, 1)])
def test_bestfit_stream_is_the_oracle_s(skewed, num_workers, max_piece_bytes, chunk):
    n = 60
    want = [r for r, _ in itertools.islice(
        bestfit_rows(skewed.files("train"), skewed.encode, skewed.bos, B, T, 40, chunk), n)]
    with skewed.loader(B, T, packing="bos_bestfit", num_workers=num_workers, buffer_size=40,
                       tokenizer_batch_size=chunk, max_piece_bytes=max_piece_bytes) as loader:
        got, _ = bestfit_take(loader, n)
    for k in range(n):
        assert np.array_equal(got[k], want[k]), f"batch {k} differs from the oracle"


def test_bestfit_resumes_with_other_workers_and_cuts(skewed):
    opts = dict(packing="bos_bestfit", buffer_size=40, tokenizer_batch_size=7)
    with skewed.loader(B, T, num_workers=2, max_piece_bytes=3000, **opts) as loader:
        want, states = bestfit_take(loader, 90)
    for k in (9, 47):
        state = json.loads(json.dumps(states[k]))
        with skewed.loader(B, T, num_workers=3, max_piece_bytes=300, resume_state=state, **opts) as loader:
            got, _ = bestfit_take(loader, 40)
        for j, rows in enumerate(got):
            assert np.array_equal(rows, want[k + 1 + j]), f"resumed at {k}: batch {k + 1 + j} differs"
