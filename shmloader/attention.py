"""Attention within documents, from a batch's positions (`positions=True`, docs/contract.md §6).

`cu_seqlens(positions)` gives flash-attn's varlen kernels (`flash_attn_varlen_func`) and
torch's `varlen_attn` their sequences over the flattened (B*T) batch: a sequence starts at
every document start (position 0) and at every row start (a concat row may begin inside a
document, and attention never crosses rows), so the sequences tile the batch and their
lengths sum to B*T. `cu_seqlens` is int32 on the positions' device, `max_seqlen` a Python
int (what those kernels take); on CUDA that costs two waits for the device (`nonzero`'s size,
then `max_seqlen`); on the CPU numpy computes it.

A FlexAttention document mask needs no sequence list: two tokens of a row are in the same
document when the key is at most the query's position before it, so

    def document_causal(b, h, q, kv):
        return (kv <= q) & (q - kv <= positions[b, q])

with `create_block_mask(document_causal, B, None, T, T, device=positions.device)` (README).
Runs in the training process only, on tensors it already holds: no scan of tokens.
"""
from typing import NamedTuple

import numpy as np
import torch


class SeqLens(NamedTuple):
    """The varlen kernels' view of a batch: sequence boundaries and the longest sequence."""
    cu_seqlens: torch.Tensor   # int32 (n + 1,): 0, the end of each sequence, ..., B*T
    max_seqlen: int


def cu_seqlens(positions: torch.Tensor) -> SeqLens:
    """`(cu_seqlens, max_seqlen)` of a (B, T) positions batch (see the module docstring): on the
    CPU through numpy (about 5x faster than torch's kernels there), elsewhere on the device."""
    if positions.dim() != 2:
        raise ValueError(f"positions must be a (B, T) batch as the loader yields it, got shape "
                         f"{tuple(positions.shape)}: pass the batch's positions, not a row or a flattened one")
    return (_on_cpu if positions.device.type == "cpu" else _on_device)(positions)


def _on_cpu(positions: torch.Tensor) -> SeqLens:
    starts = positions.numpy() == 0
    starts[:, 0] = True  # every row starts a sequence
    at = np.flatnonzero(starts)
    cu = np.empty(len(at) + 1, dtype=np.int32)
    cu[:-1], cu[-1] = at, starts.size
    return SeqLens(torch.from_numpy(cu), int(np.diff(cu).max()) if starts.size else 0)


def _on_device(positions: torch.Tensor) -> SeqLens:
    B, T = positions.shape
    starts = positions == 0
    starts[:, 0] = True
    at = starts.reshape(-1).nonzero().reshape(-1)
    end = torch.full((1,), B * T, dtype=at.dtype, device=at.device)
    cu = torch.cat((at, end)).to(torch.int32)
    return SeqLens(cu, int((cu[1:] - cu[:-1]).max()) if B * T else 0)
