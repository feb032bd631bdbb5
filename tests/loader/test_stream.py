"""The stream (docs/contract.md §1-§2): batches equal the single-process oracle `oracle.concat_windows`,
windows and resume positions, for any number of workers, rank, (B, T) and option; with
token == position data every token of an epoch is checked by arithmetic.
"""
import contextlib
import itertools
import json
import os
import time

import numpy as np
import pytest
import torch

import shmloader
from tests.helpers import ALIGN_W, loader_children, position_of, window_of

pytestmark = pytest.mark.usefixtures("watchdog")


def take(loader, n):
    """n batches from a ShmLoader: (windows, positions, states)."""
    windows, positions, states = [], [], []
    for inputs, targets in itertools.islice(loader, n):
        assert inputs.dtype == torch.int64 and targets.dtype == torch.int64
        assert inputs.shape == (loader.B, loader.T) and targets.shape == (loader.B, loader.T)
        windows.append(window_of(inputs, targets))
        state = loader.state_dict()
        states.append(state)
        positions.append(position_of(state))
    assert len(windows) == n
    return windows, positions, states


def batches_until(oracle, reached, extra):
    """Number of oracle batches until `reached(position)` holds, plus `extra`."""
    for k, (_, pos) in enumerate(oracle):
        if reached(pos):
            return k + 1 + extra
        assert k < 20000, "the boundary is never reached; the test data is too big"


def assert_same(got_windows, got_positions, want_windows, want_positions):
    assert len(got_windows) == len(want_windows) > 0
    for k, (g, w) in enumerate(zip(got_windows, want_windows)):
        assert len(g) == len(w) and np.array_equal(g, w), f"batch {k} differs from the oracle"
        assert got_positions[k] == want_positions[k], f"state of batch {k}: position differs"


def epoch2(pos):
    return pos[0] >= 2


def file2(pos):
    return pos[1] >= 2


PARITY = [  # split, B, T, num_workers, rank, world, until, options
    ("val", 1, 7, 1, 0, 1, epoch2, {}),
    ("val", 2, 32, 2, 0, 1, epoch2, {}),
    ("val", 4, 128, 3, 0, 1, epoch2, {}),
    ("val", 2, 32, 4, 1, 2, epoch2, {}),
    ("val", 1, 7, 2, 1, 2, epoch2, {}),
    ("val", 2, 32, 2, 0, 1, epoch2, {"n_slots": 2, "max_piece_docs": 1, "tokenizer_batch_size": 3}),
    ("train", 1, 7, 2, 1, 2, file2, {}),
    ("train", 2, 32, 3, 0, 2, file2, {}),
    ("train", 4, 128, 4, 0, 1, epoch2, {}),
    ("train", 2, 32, 1, 0, 1, file2, {"n_slots": 3}),
    ("train", 1, 1, 2, 0, 1, file2, {"max_piece_docs": 5}),
]


@pytest.mark.parametrize("split,B,T,num_workers,rank,world,until,options", PARITY,
                         ids=[f"{p[0]}-B{p[1]}T{p[2]}-w{p[3]}-r{p[4]}of{p[5]}-{p[6].__name__}"
                              + ("-opts" if p[7] else "") for p in PARITY])
def test_parity_with_oracle(synth, split, B, T, num_workers, rank, world, until, options):
    n = batches_until(synth.oracle(B, T, split, rank=rank, world=world), until, extra=10)
    want_w, want_p = synth.expected(n, B, T, split, rank=rank, world=world)
    assert until(want_p[-1]) and not until(want_p[0]), "the run does not cross the boundary"
    with synth.loader(B, T, split, num_workers=num_workers, rank=rank, world_size=world, **options) as loader:
        got_w, got_p, _ = take(loader, n)
    assert_same(got_w, got_p, want_w, want_p)


def test_special_token_text_is_ordinary_and_bos_at_document_starts(synth):
    """One val epoch by arithmetic: BOS exactly at each non-null document's start, and the
    tokens between are `encode_ordinary(text)` (so "<|bos|>" inside a text is not a BOS)."""
    docs = [d for d in synth.docs[600:] if d is not None]
    assert any("<|bos|>" in d for d in docs) and "" in docs
    expected = np.concatenate([[synth.bos] + list(synth.encode(d)) for d in docs]).astype(np.int64)
    B, T = 2, 32
    n = len(expected) // (B * T + 1) + 1
    with synth.loader(B, T, "val", num_workers=2) as loader:
        stream = np.concatenate(take(loader, n)[0])
    assert np.array_equal(stream[:len(expected)], expected)
    assert np.count_nonzero(stream[:len(expected)] == synth.bos) == len(docs)
    # the next epoch starts again at the first document
    assert np.array_equal(stream[len(expected):], expected[:len(stream) - len(expected)])


# ---------------------------------------------------------------- token == position

def test_token_equals_position_one_epoch(posdata):
    B, T = 2, 16
    layout = [r for r in posdata.layout if r[0] < 3]  # train: files 0..2
    P = layout[-1][3] + layout[-1][4] + 1  # tokens in one train epoch
    assert P % ALIGN_W == 0
    n = P // ALIGN_W + 5
    with posdata.loader(B, T, "train", num_workers=3) as loader:
        windows, positions, _ = take(loader, n)
    stream = np.concatenate(windows)
    epoch1 = stream[:P]
    bos = np.flatnonzero(epoch1 == posdata.bos)
    assert bos.tolist() == [r[3] for r in layout], "BOS not exactly at the document starts"
    tokens = epoch1[epoch1 != posdata.bos]
    assert len(tokens) == sum(r[4] for r in layout) > 1000
    assert np.all(np.diff(tokens) > 0), "tokens out of order or repeated"
    assert np.array_equal(tokens, np.flatnonzero(epoch1 != posdata.bos)), "a token is not its position"
    assert np.array_equal(stream[P:], stream[:len(stream) - P]), "epoch 2 does not repeat epoch 1"
    k_end = P // ALIGN_W - 1  # the batch that ends exactly at the end of the epoch
    assert positions[k_end - 1][0] == 1 and positions[k_end] == (2, 0, 0, 0, 0)


def test_token_equals_position_two_ranks(posdata):
    B, T, W = 2, 16, 33
    owner = {}
    for f, g, _, bos_pos, n in posdata.layout:
        if f < 3:
            for p in range(bos_pos + 1, bos_pos + 1 + n):
                owner[p] = (f, g)
    seen, bos_count = {}, 0
    for rank in (0, 1):
        rows = [r for r in posdata.layout if r[0] < 3 and r[1] % 2 == rank]
        expected = np.concatenate([[0] + list(range(r[3] + 1, r[3] + 1 + r[4])) for r in rows])
        n = len(expected) // W + 3
        want_w, want_p = posdata.expected(n, B, T, "train", rank=rank, world=2)
        with posdata.loader(B, T, "train", num_workers=2, rank=rank, world_size=2) as loader:
            got_w, got_p, _ = take(loader, n)
        assert_same(got_w, got_p, want_w, want_p)
        epoch1 = np.concatenate(got_w)[:len(expected)]
        assert np.array_equal(epoch1, expected)
        tokens = epoch1[epoch1 != posdata.bos]
        assert len(tokens) > 300 and np.all(np.diff(tokens) > 0)
        bos_count += np.count_nonzero(epoch1 == posdata.bos)
        seen[rank] = {owner[int(t)] for t in tokens}
        assert all(g % 2 == rank for _, g in seen[rank]), f"rank {rank} read another rank's row group"
    assert not seen[0] & seen[1], "a row group was read by both ranks"
    assert seen[0] | seen[1] == set(owner.values()), "a row group was read by neither rank"
    assert bos_count == sum(1 for r in posdata.layout if r[0] < 3)


# ---------------------------------------------------------------- API surface

@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")], ids=["str", "torch.device"])
def test_device_forms(synth, device):
    want_w, want_p = synth.expected(8, 2, 32, "val")
    with synth.loader(2, 32, "val", device=device) as loader:
        inputs, targets = next(loader)
        assert inputs.device.type == "cpu" and targets.device.type == "cpu"
        first = (window_of(inputs, targets), position_of(loader.state_dict()))
        got_w, got_p, _ = take(loader, 7)
    assert_same([first[0]] + got_w, [first[1]] + got_p, want_w, want_p)


def test_cpu_batches_stay_valid(synth):
    B, T = 2, 32
    want_w, _ = synth.expected(50, B, T, "train")
    kept = []
    with synth.loader(B, T, "train", n_slots=2, num_workers=2) as loader:
        for inputs, targets in itertools.islice(loader, 50):
            if len(kept) < 20:
                kept.append((inputs, targets))
    assert len(kept) == 20
    for k, (inputs, targets) in enumerate(kept):
        assert np.array_equal(window_of(inputs, targets), want_w[k]), f"kept batch {k} was overwritten"


def _in_ring(loader, tensor) -> bool:
    slots = loader.debug().ring.slots
    base = slots.ctypes.data
    return base <= tensor.data_ptr() < base + slots.nbytes


def test_cpu_batches_are_lent_from_the_ring_and_kept_ones_survive_close(synth):
    """CPU batches are views of their ring slot (no copy) until the caller drops them; past
    n_slots // 2 kept batches, further ones are copies; a batch kept past close() still
    holds its tokens, and close() leaves no segment behind."""
    B, T = 2, 32
    want_w, _ = synth.expected(60, B, T, "train")
    kept, lent = {}, []
    with synth.loader(B, T, "train", n_slots=6, num_workers=2, head_start=False) as loader:
        for k, (inputs, targets) in enumerate(itertools.islice(loader, 60)):
            assert np.array_equal(window_of(inputs, targets), want_w[k])
            lent.append(_in_ring(loader, inputs))
            if k % 7 == 3:  # kept out of order: later batches are dropped before these
                kept[k] = (inputs, targets)
            if k == 30:     # let go of some kept ones: their slots return to the workers
                for j in [j for j in kept if j < 20]:
                    del kept[j]
        assert len(loader.debug().delivery.lent) <= 3
    assert lent[:3] == [True, True, True]
    assert not all(lent), "kept batches never made the loader copy"
    assert lent[24] is False and lent[31] is True, "slots let go of at batch 30 were not lent again"
    for k, (inputs, targets) in kept.items():
        assert np.array_equal(window_of(inputs, targets), want_w[k]), f"kept batch {k} changed"


def test_batches_dropped_in_another_thread_come_back(synth):
    """A slot let go of outside the loader's thread is freed at the next next(). The loop waits
    (10 s at most) for the consumer to drop each batch before it asks for the next: with one
    batch lent at a time (n_slots=2), a batch still held then is a copy, and a loaded machine
    may run the consumer late (1 of 40 was lent in a suite at load 11)."""
    import queue
    import threading

    B, T = 2, 32
    want_w, _ = synth.expected(40, B, T, "train")
    handoff, dropped, got, lent = queue.Queue(), queue.Queue(), [], []

    def consume():
        while (item := handoff.get()) is not None:
            got.append(window_of(*item))
            del item
            dropped.put(True)

    thread = threading.Thread(target=consume)
    thread.start()
    try:
        with synth.loader(B, T, "train", n_slots=2, num_workers=1, timeout=10) as loader:
            for inputs, targets in itertools.islice(loader, 40):
                lent.append(_in_ring(loader, inputs))
                handoff.put((inputs, targets))
                del inputs, targets
                dropped.get(timeout=10)
    finally:
        handoff.put(None)
        thread.join(10)
    assert len(got) == 40 and all(np.array_equal(g, w) for g, w in zip(got, want_w))
    # the head start's first batches are rows of its own, not the ring's; from the ring's first, each
    assert True in lent and all(lent[lent.index(True):]), f"a slot let go of in another thread did not come back: {lent}"


def test_a_dropped_batch_is_refilled_from_the_next_call_on(synth):
    """A lent batch the caller drops keeps its slot until the next next(), which frees it.
    After `for` three times and `del`, batches 1 and 2 are dropped but not yet freed (batch 0
    was freed by the third call): the trainer away, the ring fills the other 2 of 4 slots and
    stops. One more next() (whose batch the caller keeps) frees both, and the ring fills 3."""
    with synth.loader(2, 32, "train", n_slots=4, num_workers=2, head_start=False) as loader:

        def settle(want):
            deadline = time.monotonic() + 20
            while loader.stats()["ring_ready"] < want and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)
            return loader.stats()["ring_ready"]

        for _ in range(3):
            inputs, targets = next(loader)
        del inputs, targets
        assert settle(2) == 2, "a dropped batch's slot was refilled before any next() freed it"
        kept = next(loader)
        assert settle(3) == 3, "the slots of the batches dropped before this next() were not refilled"
        assert len(loader.debug().delivery.lent) == 1 and kept[0].shape == (2, 32)


def test_ctrl_c_cannot_land_inside_the_release_of_a_lent_batch(synth):
    """Dropping a lent batch must run no Python code wherever the last reference goes (the
    delivery finds the slot let go by its views' reference counts at the next next()). Were
    Python code run there, a Ctrl-C arriving in it would be printed as "Exception ignored" and
    lost (the training script would run on), and the slot would never come back. Here every
    Python call raises KeyboardInterrupt while the batch is dropped: none may happen, and the
    slot must come back."""
    import sys

    B, T = 2, 32
    want_w, _ = synth.expected(12, B, T, "train")
    got = []

    def ctrl_c(frame, event, arg):
        if event == "call":
            raise KeyboardInterrupt
        return None

    with synth.loader(B, T, "train", n_slots=2, num_workers=1, head_start=False) as loader:
        for _ in range(6):
            inputs, targets = next(loader)
            got.append(window_of(inputs, targets))
            assert _in_ring(loader, inputs)
            sys.settrace(ctrl_c)
            try:
                del inputs, targets
            finally:
                sys.settrace(None)
            # nothing ran: the slot is still lent, and the next next() finds it let go (its
            # batch is lent from the ring again, above: with n_slots=2 a slot that never came
            # back would make every later batch a copy)
            assert len(loader.debug().delivery.lent) == 1
        got += [window_of(*b) for b in itertools.islice(loader, 6)]
    assert all(np.array_equal(g, w) for g, w in zip(got, want_w)) and len(got) == 12


def test_functions_with_and_without_state(synth):
    B, T = 2, 32
    n = batches_until(synth.oracle(B, T, "val"), epoch2, extra=5)
    want_w, want_p = synth.expected(n, B, T, "val")
    gen = shmloader.tokenizing_distributed_data_loader_with_state(
        B, T, "val", 2, 128, "cpu", None, data=str(synth.root), tokenizer=synth.tokenizer)
    got_w, got_p = [], []
    want_p = [(1, 0, 0, 0, 0)] + want_p[:-1]  # the drop-ins yield the state that resumes AT the batch
    with contextlib.closing(gen):
        for inputs, targets, state in itertools.islice(gen, n):
            if not got_w:  # the coordinator and tokenizer_threads workers (at most the cores)
                assert len(loader_children()) == 1 + min(2, len(os.sched_getaffinity(0))), \
                    "num_workers does not default to tokenizer_threads"
            assert inputs.dtype == torch.int64 and inputs.shape == (B, T)
            assert json.loads(json.dumps(state)) == state
            assert {"pq_idx", "rg_idx", "epoch", "version"} <= set(state)
            got_w.append(window_of(inputs, targets))
            got_p.append(position_of(state))
    assert_same(got_w, got_p, want_w, want_p)
    assert [s for s in (state["batch"],)] == [n - 1]

    gen = shmloader.tokenizing_distributed_data_loader(
        B, T, "val", device="cpu", data=str(synth.root), tokenizer=synth.tokenizer, num_workers=3)
    with contextlib.closing(gen):
        got = [window_of(x, y) for x, y in itertools.islice(gen, n)]
    assert len(got) == n and all(np.array_equal(g, w) for g, w in zip(got, want_w))


@pytest.mark.parametrize("form", ["pkl", "dir", "encoding"])
def test_tokenizer_forms(synth, synth_tokenizer_pkl, form):
    tok = {"pkl": str(synth_tokenizer_pkl), "dir": str(synth_tokenizer_pkl.parent),
           "encoding": synth.tokenizer}[form]
    want_w, want_p = synth.expected(12, 2, 32, "val")
    with shmloader.ShmLoader(str(synth.root), tok, 2, 32, "val", num_workers=2, device="cpu") as loader:
        got_w, got_p, _ = take(loader, 12)
    assert_same(got_w, got_p, want_w, want_p)


def test_rank_and_world_from_env(synth, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    want_w, want_p = synth.expected(30, 2, 32, "train", rank=1, world=2)
    with synth.loader(2, 32, "train") as loader:
        got_w, got_p, states = take(loader, 30)
    assert states[-1]["rank"] == 1 and states[-1]["world_size"] == 2
    assert_same(got_w, got_p, want_w, want_p)


def test_state_is_json(synth):
    with synth.loader(1, 7, "val", num_workers=1) as loader:
        first = loader.state_dict()
        _, _, states = take(loader, 40)
    for state in [first] + states:
        assert json.loads(json.dumps(state)) == state
    assert position_of(first) == (1, 0, 0, 0, 0)
