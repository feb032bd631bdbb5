"""packing.bestfit's worker side: what a worker keeps of a counted piece (`_keep`, `_Docs`) until
`write` has placed each document, in any order: the tokens it writes are the document's, and a
document that lingers pins at most as many tokens again of its piece, not the piece."""
import random

import numpy as np
import pytest

from shmloader.packing import bestfit
from shmloader.packing.bestfit import Rows

B, T = 1, 64


def piece(rng, n_docs: int) -> tuple:
    """(tokens, lengths, each document's tokens) of a piece: unique tokens, some nulls."""
    lengths = np.array([0 if rng.random() < 0.2 else rng.randint(1, 40) for _ in range(n_docs)], dtype=np.int64)
    tokens = np.arange(1, int(lengths.sum()) + 1, dtype=np.int64) * 7
    ends = np.cumsum(lengths)
    docs = {i: tokens[ends[i] - lengths[i]:ends[i]].copy() for i in range(n_docs) if lengths[i]}
    return tokens, lengths, docs


@pytest.mark.parametrize("seed", range(20))
def test_each_document_is_written_whole_whatever_the_order_and_kept_memory_stays_bounded(seed):
    rng = random.Random(seed)
    tokens, lengths, docs = piece(rng, rng.randint(1, 30))
    held = {5: bestfit._keep(tokens, lengths)}
    if not docs:
        assert held[5] is None
        return
    slots = np.zeros((1, 2 * B * T), dtype=np.int64)
    order = list(docs)
    rng.shuffle(order)
    for k, row in enumerate(order):
        n = len(docs[row])
        assert 5 in held
        written = bestfit.write(slots, held, Rows(k, 0, np.array([[5, row, 0, 0, n]])), B, T)
        assert written == [(k, n)]
        assert slots[0, :min(n, T)].tolist() == docs[row][:T].tolist()  # inputs: the document from column 0
        assert slots[0, B * T:B * T + n - 1].tolist() == docs[row][1:].tolist()  # targets: one on
        left = sum(len(docs[r]) for r in order[k + 1:])
        if 5 in held:  # what it keeps: at most 4x (COMPACT_AT) the tokens of the documents left
            assert held[5].live_tokens == left and len(held[5].tokens) <= bestfit.COMPACT_AT * left
        else:
            assert left == 0
    assert held == {}


@pytest.mark.parametrize("seed", range(10))
def test_the_copies_of_the_documents_left_copy_under_a_third_of_the_piece(seed):
    """Each copy apart takes under a quarter of what is kept, so all of them under a third of
    the piece's tokens (at a half, as before: up to all of them; placed in order, 64 documents
    of 10 tokens were copied 31 + 15 + 7 + 3 + 1 times, 570 of 640 tokens; at a quarter 180)."""
    rng = random.Random(seed)
    n_docs = 64
    lengths = np.array([10] * n_docs if seed == 0 else [rng.randint(1, 40) for _ in range(n_docs)], dtype=np.int64)
    tokens = np.arange(1, int(lengths.sum()) + 1, dtype=np.int64)
    held = {0: bestfit._keep(tokens, lengths)}
    slots = np.zeros((1, 2 * B * T), dtype=np.int64)
    order = list(range(n_docs)) if seed == 0 else rng.sample(range(n_docs), n_docs)
    kept, copied = held[0].tokens, 0
    for k, row in enumerate(order):
        bestfit.write(slots, held, Rows(k, 0, np.array([[0, row, 0, 0, int(lengths[row])]])), B, T)
        if 0 in held and held[0].tokens is not kept:
            kept = held[0].tokens
            copied += len(kept)
    assert held == {} and copied * 3 < len(tokens)
    assert copied > 0 or seed, "in order, the documents left were never copied apart: the test checks nothing"


def test_a_read_only_piece_is_copied_not_pinned():
    tokens = np.arange(1, 11, dtype=np.int64)
    tokens.flags.writeable = False  # as a token cache's mapping is
    kept = bestfit._keep(tokens, np.array([4, 6]))
    assert kept.tokens.flags.writeable and not np.shares_memory(kept.tokens, tokens)
    assert kept.tokens.tolist() == tokens.tolist()


def test_a_piece_done_again_keeps_only_the_rows_still_needed():
    tokens, lengths = np.arange(1, 10, dtype=np.int64), np.array([3, 0, 2, 4])
    kept = bestfit._keep_rows(bestfit._keep(tokens, lengths), {2})
    assert kept.live == 1 and kept.live_tokens == 2
    slots = np.zeros((1, 2 * B * T), dtype=np.int64)
    held = {0: kept}
    bestfit.write(slots, held, Rows(0, 0, np.array([[0, 2, 0, 0, 2]])), B, T)
    assert slots[0, :2].tolist() == [4, 5] and held == {}
    assert bestfit._keep_rows(bestfit._keep(tokens, lengths), set()) is None
