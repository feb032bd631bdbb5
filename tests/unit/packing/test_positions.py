"""Document positions' pure parts (packing/positions.py, attention.py), against counts by hand:

- `fill_segment` over random pieces (nulls, empty documents, a first document begun `first`
  tokens before the piece) and every way of cutting them into segments equals a per-token
  count; `fill_prefix` is 0, 1, ...;
- the packings' `write` with the ring's positions: concat's `Place`/`Copies` segments (the
  window's last token, a target only, gets none) and best fit's `Rows` placements;
- `cu_seqlens` equals a row-by-row count, as int32; a batch that is not (B, T) is refused in words;
- the README's FlexAttention rule, `(kv <= q) & (q - kv <= positions[b, q])`, is the same
  mask as "same document, causal" built from document ids, and `flex_attention` with it equals
  attention computed sequence by sequence from `cu_seqlens` (CPU, unfused: about 2 s).
"""
import itertools
import random

import numpy as np
import pytest
import torch

from shmloader import attention, cu_seqlens
from shmloader.packing import bestfit, concat
from shmloader.packing.positions import fill_prefix, fill_segment
from tests.helpers import sequence_lengths


def by_token(lengths: list, first: int) -> list:
    """Each token's index in its document, one token at a time."""
    out = []
    for row, n in enumerate(lengths):
        out.extend(range(first, first + n) if row == 0 else range(n))
    return out


def random_piece(rng: random.Random) -> tuple:
    lengths = [rng.choice([0, 0, 1, 2, 3, rng.randint(4, 40)]) for _ in range(rng.randint(1, 12))]
    first = rng.choice([0, 0, rng.randint(1, 50)]) if lengths[0] else 0
    return lengths, first


@pytest.mark.parametrize("seed", range(40))
def test_fill_segment_counts_each_token_whatever_the_cuts(seed):
    rng = random.Random(seed)
    lengths, first = random_piece(rng)
    want = by_token(lengths, first)
    ends = np.cumsum(np.array(lengths, dtype=np.int64))
    total = len(want)
    cuts = sorted(rng.sample(range(1, total), min(rng.randint(0, 5), max(total - 1, 0)))) if total > 1 else []
    got = np.full(total, -7, dtype=np.int64)
    for lo, hi in zip([0] + cuts, cuts + [total]):
        fill_segment(got[lo:hi], ends, first, lo)
    assert got.tolist() == want
    every = np.full(total, -7, dtype=np.int64)
    for i in range(total):  # one token at a time, too
        fill_segment(every[i:i + 1], ends, first, i)
    assert every.tolist() == want


def test_fill_segment_of_nothing_writes_nothing():
    out = np.full(3, -1, dtype=np.int64)
    fill_segment(out[:0], np.array([2, 5]), 0, 5)
    assert out.tolist() == [-1, -1, -1]


def test_fill_prefix():
    out = np.full(6, -1, dtype=np.int64)
    fill_prefix(out[1:5])
    assert out.tolist() == [-1, 0, 1, 2, 3, -1]


def test_concat_write_puts_the_inputs_positions_beside_the_tokens():
    B, T = 2, 4
    W = B * T + 1
    slots = np.zeros((2, W), dtype=np.int64)
    positions = np.full((2, B * T), -1, dtype=np.int64)
    lengths = np.array([3, 0, 5, 2, 6])            # piece 0: its first row begun 4 tokens before it
    tokens = np.arange(100, 100 + lengths.sum())
    held = {0: concat.PACKING.keep(tokens, lengths, 4), 1: concat.PACKING.keep(np.arange(50, 53), np.array([3]))}
    want = by_token(lengths.tolist(), 4)            # 16 tokens: batch 0 takes 9, batch 1 the next 7
    order = concat.Copies(np.array([(0, 0, 1, 0, 0, W), (0, 1, 0, 0, W, 7), (1, 1, 0, 7, 0, 2)]), (0,))
    counts = concat.PACKING.write(slots, held, order, B, T, positions)
    assert counts == [(0, W), (1, 9)]
    assert slots[1].tolist() == tokens[:W].tolist() and slots[0, :7].tolist() == tokens[W:].tolist()
    assert positions[1].tolist() == want[:B * T]    # the window's last token is a target only
    assert positions[0].tolist() == want[W:] + [0]  # piece 1 begins at its BOS; its 2nd token is a target
    assert 0 not in held and 1 in held


def test_bestfit_write_puts_each_placements_prefix_positions():
    B, T = 2, 5
    slots = np.zeros((1, 2 * B * T), dtype=np.int64)
    positions = np.full((1, B * T), -1, dtype=np.int64)
    lengths = np.array([4, 9, 2])
    held = {3: bestfit.PACKING.keep(np.arange(1, 16), lengths)}
    # row 0: document 0 whole (4 of a 6-column row), then 2 of document 2; row 1: 6 of document 1
    order = bestfit.Rows(0, 0, [(3, 0, 0, 0, 4), (3, 2, 0, 4, 2), (3, 1, 1, 0, 6)])
    bestfit.PACKING.write(slots, held, order, B, T, positions)
    assert positions[0].tolist() == [0, 1, 2, 3, 0, 0, 1, 2, 3, 4]


def random_positions(rng: random.Random, B: int, T: int) -> torch.Tensor:
    """Rows of documents end to end, the first begun some tokens before the row (concat)."""
    rows = []
    for _ in range(B):
        row, p = [], rng.choice([0, rng.randint(1, 90)])
        while len(row) < T:
            n = rng.choice([1, 2, rng.randint(3, 2 * T)])
            row.extend(range(p, p + n))
            p = 0
        rows.append(row[:T])
    return torch.tensor(rows, dtype=torch.int64)


@pytest.mark.parametrize("how", [cu_seqlens, attention._on_device], ids=["numpy on the cpu", "torch on a device"])
@pytest.mark.parametrize("seed", range(10))
def test_cu_seqlens_counts_sequences_by_row_and_document(seed, how):
    """Both ways (`cu_seqlens` takes numpy's on the CPU, torch's elsewhere: here on the CPU)."""
    rng = random.Random(seed)
    B, T = rng.randint(1, 5), rng.randint(1, 70)
    p = random_positions(rng, B, T)
    before = p.clone()
    cu, longest = how(p)
    lengths = sequence_lengths(p)
    assert cu.dtype == torch.int32 and cu.device == p.device
    assert cu.tolist() == [0] + list(itertools.accumulate(lengths))
    assert longest == max(lengths) and cu[-1] == B * T and isinstance(longest, int)
    assert torch.equal(p, before)  # the batch is left as it was


def test_cu_seqlens_refuses_a_flattened_batch():
    with pytest.raises(ValueError, match=r"\(B, T\) batch.*got shape \(12,\)"):
        cu_seqlens(torch.zeros(12, dtype=torch.int64))


def document_ids(p: torch.Tensor) -> torch.Tensor:
    """A document id per token: a new one at every row start and every position 0."""
    ids, n = torch.empty_like(p), -1
    for b in range(p.shape[0]):
        for t in range(p.shape[1]):
            n += t == 0 or p[b, t] == 0
            ids[b, t] = n
    return ids


def test_the_flex_attention_rule_is_same_document_and_causal():
    rng = random.Random(5)
    B, T = 3, 48
    p = random_positions(rng, B, T)
    ids = document_ids(p)
    q, kv = torch.arange(T)[:, None], torch.arange(T)[None, :]
    documents = 0  # rows where the mask is more than causal
    for b in range(B):
        rule = (kv <= q) & (q - kv <= p[b][:, None])  # the README's mask_mod, over every (q, kv)
        same = (ids[b][:, None] == ids[b][None, :]) & (kv <= q)
        assert torch.equal(rule, same)
        documents += not torch.equal(rule, kv <= q)
    assert documents >= 2


def test_flex_attention_with_the_rule_is_attention_per_sequence():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    rng = random.Random(9)
    B, T, H, D = 2, 128, 2, 8
    p = random_positions(rng, B, T)

    def document_causal(b, h, q, kv):
        return (kv <= q) & (q - kv <= p[b, q])

    mask = flex.create_block_mask(document_causal, B, None, T, T, device="cpu")
    q, k, v = (torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(i)) for i in range(3))
    with pytest.warns(UserWarning, match="without torch.compile"):
        got = flex.flex_attention(q, k, v, block_mask=mask)
    cu, _ = cu_seqlens(p)
    flat = [t.permute(0, 2, 1, 3).reshape(B * T, H, D) for t in (q, k, v)]  # the varlen kernels' layout
    want = torch.empty(B * T, H, D)
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (t[lo:hi].transpose(0, 1) for t in flat)
        want[lo:hi] = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1)
    assert len(cu) > B + 2
    torch.testing.assert_close(got.permute(0, 2, 1, 3).reshape(B * T, H, D), want, atol=1e-5, rtol=1e-5)
