"""Document positions: the index of each input token within its document, written beside the tokens.

With `positions=True`, `positions[b, t]` is the index of `inputs[b, t]` in its document: 0 at
its BOS, then 1, 2, ... (docs/contract.md §6). The worker that copies a run of tokens into a
ring slot writes their positions into the slot's positions area (B*T int64 after the window,
ipc/ring.py) with the same order, so the trainer scans nothing and copies nothing more.

- **concat**: the stream is one, so are its positions: a document cut by a row's or a batch's
  end goes on counting in the next row or batch (a window's last token is only a target, and
  is counted too). A worker holds a piece's tokens end to end with its documents' ends
  (`ends`, cumulative, 0-length nulls repeating an end); token `i` of the piece is at
  `i - start(its document)`, and the piece's first document starts `first` tokens in when a
  rank before it read those (an elastic resume's piece: the worker dropped them). A resumed
  run's first piece holds its document whole and is placed from `skip` on, so its positions
  count from `skip`: a resumed batch's positions are the uninterrupted run's.
  `fill_segment` fills one segment in O(its tokens) with one cumulative sum in place (no
  array of the segment's size is made): ones, the first token's position, and at each
  document start inside it minus the position before it.
- **best fit**: every placement is a document's first `n` tokens at column `off` of a row
  (cropped documents lose their end), so its inputs' columns `[off, min(off + n, T))` hold
  0, 1, ...: `fill_prefix`. Targets need no positions (a target is the next input's token).

Cost, in the worker that writes the tokens (a probe on the 2-vCPU machine of
docs/benchmarks.md, B=16, T=2048): `fill_segment` about 33 µs for a whole window of 32K
tokens holding 53 documents (copying its tokens: 6 µs), `fill_prefix` about 1.4 µs a
placement. The training process does none of it.

Pure numpy over a worker's arrays: no processes, no shared memory, no torch.
"""
import numpy as np


def fill_segment(out: np.ndarray, ends: np.ndarray, first: int, src: int):
    """Write into `out` the positions of tokens `[src, src + len(out))` of a piece whose
    documents end at `ends` (cumulative token counts, one a row) and whose first row starts
    `first` tokens into its document."""
    m = len(out)
    if not m:
        return
    lo = int(np.searchsorted(ends, src, side="right"))          # the row holding token src
    start = int(ends[lo - 1]) if lo else -first                  # where its document starts
    inside = ends[lo:np.searchsorted(ends, src + m, side="left")]  # documents starting in the segment
    if len(inside) > 1:
        inside = inside[np.diff(inside, prepend=-1) > 0]           # nulls repeat an end
    out.fill(1)
    out[0] = src - start
    if len(inside):
        before = np.empty(len(inside), dtype=np.int64)             # each one's previous document start
        before[0] = start
        before[1:] = inside[:-1]
        out[inside - src] = before - inside + 1                    # minus the position before it
    np.cumsum(out, out=out)


def fill_prefix(out: np.ndarray):
    """Write 0, 1, ... into `out`: a best-fit placement's inputs, a document's first tokens."""
    out[:] = np.arange(len(out))
