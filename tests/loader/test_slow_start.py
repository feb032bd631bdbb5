"""A worker slow to start (NOTE [ring protocol] 2, `Ready`): the first batch does not wait for it.

Workers are given pieces only once they say `Ready` (tokenizer built, source open). Here one of
two workers takes `LATE_S` longer to unpickle its tokenizer (`helpers.LateTokenizer`, as a
worker starved of the cores while another loader's workers run, or unpickling a 200k-token
vocabulary, is); the first batch spans many row groups of 3 documents, so a piece handed to
the late worker at once would hold it back for `LATE_S`. The batches are the oracle's,
whichever worker wrote them.
"""
import itertools
import time

import numpy as np
import pytest

import shmloader
from shmloader.demo import corpus
from tests import helpers, oracle

LATE_S = 20.0  # long, so that a loaded machine's slow first batch (load 20) is not taken for waiting: the tokens say it
B, T = 2, 96
N = 6


@pytest.mark.deadline(90)
@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_the_first_batch_does_not_wait_for_a_worker_slow_to_start(tmp_path, packing):
    lengths = [5 + (i * 7) % 11 for i in range(300)]
    paths = [str(p) for p in corpus.write_shards(helpers.position_documents(lengths), tmp_path / "data",
                                                num_files=2, row_group_size=3)]
    tok = helpers.LateTokenizer(str(tmp_path / "first-unpickled"), LATE_S)
    fit = dict(buffer_size=8, tokenizer_batch_size=4) if packing == "bos_bestfit" else {}
    if packing == "bos_bestfit":
        expected = list(itertools.islice(oracle.bestfit_rows(paths[:-1], tok.encode, 0, B, T, buffer_size=8,
                                                              chunk_docs=4), N))
        expected = [rows[:, :-1] for rows, _ in expected]
    else:
        expected = [w[:-1].reshape(B, T) for w, _ in itertools.islice(oracle.concat_windows(paths[:-1], tok.encode,
                                                                                             0, B, T), N)]
    began = time.monotonic()
    with shmloader.ShmLoader(str(tmp_path / "data"), tok, B, T, packing=packing, num_workers=2, device="cpu",
                             timeout=60, max_piece_docs=3, **fit) as loader:
        x, _ = next(loader)
        first_s = time.monotonic() - began
        tokens = [w["tokens"] for w in loader.stats()["workers"]]
        got = [x.numpy().copy()] + [x.numpy().copy() for x, _ in itertools.islice(loader, N - 1)]
    assert min(tokens) == 0 < max(tokens), f"one worker read everything the first batch needed: {tokens}"
    assert first_s < LATE_S - 2, f"the first batch waited for the late worker ({first_s:.1f} s)"
    assert all(np.array_equal(g, e) for g, e in zip(got, expected)) and len(got) == N
