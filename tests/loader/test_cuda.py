"""CUDA path of the loader (skipped without a GPU; `pytest -m cuda` runs only these).

What the trainer promises on CUDA (loader.py, NOTE [ring protocol] in docs/design.md): the ring
is pinned once with cudaHostRegister; each batch is one non-blocking copy on the current stream
into one of two device buffers; a slot is freed only after a CUDA event recorded after its copy
has completed. Checked here:

- the ring's slot tensors report `is_pinned()`;
- `device="cuda"`, `"cuda:0"` and `torch.device("cuda")` (what nanochat passes) give batches on
  the GPU that are byte-equal, with equal state dicts, to the CPU stream for 240 batches (more
  than two epochs of the small dataset, so the wrap-around is crossed on the GPU too);
- event-gated slot reuse: with 2 slots and a ~0.05 s GPU kernel queued before every `next()`,
  copies are still pending when `next()` returns (asserted, so the test cannot pass vacuously),
  and every batch, cloned on the stream right after its copy, still equals the CPU stream: a
  slot freed before its copy ran would have been overwritten by a later batch first;
- best-fit batches (a 2*B*T window: inputs, then targets) on the GPU equal the CPU ones;
- with `positions=True`, both packings: inputs, targets and positions on the GPU equal the CPU
  stream's, through the one copy of the slot's pinned row (window, then positions), and
  `cu_seqlens` of the GPU positions is int32 on the GPU and equals the CPU one's;
- batches taken under a side stream (`torch.cuda.stream(s)`) equal the CPU stream;
- a `torch.profiler` trace with CUDA activities holds each `next()`'s `shmloader.copy` range
  and the host-to-device memcpy it issues;
- after close no /dev/shm segment of the loader remains;
- a `Mixture` of two sources on a schedule gives GPU batches and states equal to the CPU ones;
- cudaHostRegister refused for real (the ring registered once already, so the loader's own call
  fails): one warning, batches staged through pinned buffers equal the CPU stream with 2 slots
  and the long kernel before each `next()`, and CUDA work after the refusal runs.

Data: 800 synthetic documents (every 31st null; ~123 batches per train epoch) in 4 files, a
512-token BPE; built in < 1 s.
"""
from __future__ import annotations

import os

import pytest
import torch

from shmloader import ShmLoader, tokenizing_distributed_data_loader
from shmloader.demo import corpus

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

B, T = 4, 256
N_BATCHES = 240
SLEEP_CYCLES = int(1e8)  # ~0.05 s of GPU time at ~2 GHz
SLEEP_STEPS = 24
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cuda_data")
    docs = corpus.synthetic_texts(800, seed=11, mean_words=50)
    docs = [None if i % 31 == 7 else d for i, d in enumerate(docs)]
    corpus.write_shards(docs, root / "shards", num_files=4, row_group_size=[100, 37])
    tok = corpus.save_tokenizer(corpus.train_tokenizer([d for d in docs[:600] if d], 512), root / "tok")
    return str(root / "shards"), str(tok)


def make(data, device, **kw):
    kw.setdefault("num_workers", 2)
    return ShmLoader(data[0], data[1], B, T, "train", device=device, timeout=TIMEOUT_S, **kw)


@pytest.fixture(scope="module")
def cpu_stream(data):
    """The first N_BATCHES batches and states of the CPU loader (CPU batches stay valid)."""
    out = []
    with make(data, "cpu") as loader:
        for _ in range(N_BATCHES):
            x, y = next(loader)
            out.append((x, y, loader.state_dict()))
    assert len(out) == N_BATCHES and out[-1][2]["epoch"] >= 2  # the GPU runs cross an epoch
    return out


def test_ring_slots_are_pinned(data):
    with make(data, "cuda") as loader:
        x, _ = next(loader)
        assert x.is_cuda
        delivery = loader.debug().delivery
        assert delivery.pinned
        assert delivery.slot_tensors.is_pinned()
        assert all(delivery.slot_tensors[i].is_pinned() for i in range(loader.n_slots))


@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")], ids=str)
def test_cuda_batches_equal_cpu_stream(data, cpu_stream, device):
    expected_device = torch.device("cuda", torch.cuda.current_device())
    n = 0
    with make(data, device) as loader:
        for k, (ref_x, ref_y, ref_state) in enumerate(cpu_stream):
            x, y = next(loader)
            assert x.device == expected_device and y.device == expected_device
            assert x.dtype == torch.int64 and x.shape == (B, T) and y.shape == (B, T)
            assert torch.equal(x.cpu(), ref_x), f"inputs of batch {k} differ from the CPU stream"
            assert torch.equal(y.cpu(), ref_y), f"targets of batch {k} differ from the CPU stream"
            assert loader.state_dict() == ref_state, f"state after batch {k} differs"
            n += 1
    assert n == N_BATCHES


def test_bestfit_batches_equal_cpu_stream(data):
    with make(data, "cpu", packing="bos_bestfit") as loader:
        ref = [next(loader) for _ in range(48)]
    with make(data, "cuda", packing="bos_bestfit") as loader:
        for k, (ref_x, ref_y) in enumerate(ref):
            x, y = next(loader)
            assert x.is_cuda and x.shape == (B, T), f"batch {k} is {tuple(x.shape)} on {x.device}"
            assert torch.equal(x.cpu(), ref_x) and torch.equal(y.cpu(), ref_y), f"batch {k} differs"


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_positions_on_the_gpu_equal_the_cpu_stream(data, packing):
    import shmloader

    with make(data, "cpu", packing=packing, positions=True) as loader:
        ref = [tuple(t.clone() for t in next(loader)) for _ in range(48)]
    assert sum(int((p == 0).sum()) for _, _, p in ref) > 48  # documents start inside the batches
    expected_device = torch.device("cuda", torch.cuda.current_device())
    with make(data, "cuda", packing=packing, positions=True) as loader:
        for k, (ref_x, ref_y, ref_p) in enumerate(ref):
            x, y, p = next(loader)
            assert p.device == expected_device and p.dtype == torch.int64 and p.shape == (B, T)
            assert torch.equal(x.cpu(), ref_x) and torch.equal(y.cpu(), ref_y), f"batch {k}'s tokens differ"
            assert torch.equal(p.cpu(), ref_p), f"batch {k}'s positions differ from the CPU stream"
            cu, longest = shmloader.cu_seqlens(p)
            want, most = shmloader.cu_seqlens(ref_p)
            assert cu.is_cuda and cu.dtype == torch.int32 and torch.equal(cu.cpu(), want) and longest == most
        ring = loader.debug().ring
        assert loader.debug().delivery.slot_tensors.shape[1] == ring.layout.window + B * T  # one pinned row


def _pending(loader) -> bool:
    """Whether the copy of the batch just returned has not run yet."""
    inflight = loader.debug().delivery.inflight
    return bool(inflight) and not inflight[-1][-1].query()


def test_event_gated_slot_reuse(data, cpu_stream):
    saved, pending = [], 0
    with make(data, "cuda", n_slots=2) as loader:
        for _ in range(SLEEP_STEPS):
            torch.cuda._sleep(SLEEP_CYCLES)  # the GPU is busy: the copy queues behind it
            x, y = next(loader)
            pending += _pending(loader)
            saved.append((x.clone(), y.clone()))  # queued on the stream right after the copy
        torch.cuda.synchronize()
    assert pending > SLEEP_STEPS // 2, f"only {pending} copies were pending: the test would be vacuous"
    for k, ((x, y), (ref_x, ref_y, _)) in enumerate(zip(saved, cpu_stream)):
        assert torch.equal(x.cpu(), ref_x) and torch.equal(y.cpu(), ref_y), \
            f"batch {k} was overwritten before its copy ran (slot freed too early)"


def test_a_mixture_on_the_gpu_equals_the_cpu_stream(data, tmp_path):
    import shmloader

    other = tmp_path / "other"
    corpus.write_shards(corpus.synthetic_texts(500, seed=12, mean_words=60), other, num_files=3, row_group_size=[40, 9])
    mix = lambda: shmloader.Mixture({"a": data[0], "b": str(other)},  # noqa: E731
                                    [(0, {"a": 0.6, "b": 0.4}), (20, {"a": 0.1, "b": 0.9})])
    with make((mix(), data[1]), "cpu") as loader:
        ref = [(*next(loader), loader.state_dict()) for _ in range(40)]
    with make((mix(), data[1]), "cuda") as loader:
        for k, (ref_x, ref_y, ref_state) in enumerate(ref):
            x, y = next(loader)
            assert x.is_cuda and torch.equal(x.cpu(), ref_x) and torch.equal(y.cpu(), ref_y), f"batch {k} differs"
            assert loader.state_dict() == ref_state, f"state after batch {k} differs"


def test_a_refused_cudahostregister_stages_the_same_batches(data, cpu_stream, monkeypatch):
    from shmloader import delivery

    real_pin, cudart = delivery.pin, torch.cuda.cudart()

    def registered_twice(slots, device):  # the loader's own cudaHostRegister then fails for real
        rc = cudart.cudaHostRegister(slots.ctypes.data, slots.nbytes, delivery.CUDA_HOST_REGISTER_PORTABLE)
        assert int(rc) == 0
        try:
            real_pin(slots, device)
        finally:
            cudart.cudaHostUnregister(slots.ctypes.data)

    monkeypatch.setattr(delivery, "pin", registered_twice)
    saved = []
    with pytest.warns(UserWarning, match="cudaHostRegister") as caught:
        with make(data, "cuda", n_slots=2) as loader:
            for _ in range(SLEEP_STEPS):
                torch.cuda._sleep(SLEEP_CYCLES)
                x, y = next(loader)
                assert type(loader.debug().delivery) is delivery.StagedCopy
                saved.append((x.clone(), y.clone()))
            torch.cuda.synchronize()
    assert sum("cudaHostRegister" in str(w.message) for w in caught) == 1
    assert torch.ones(1024, device="cuda").cumsum(0)[-1].item() == 1024  # CUDA work runs after the refusal
    for k, ((x, y), (ref_x, ref_y, _)) in enumerate(zip(saved, cpu_stream)):
        assert torch.equal(x.cpu(), ref_x) and torch.equal(y.cpu(), ref_y), f"staged batch {k} differs"


def test_side_stream(data, cpu_stream):
    stream = torch.cuda.Stream()
    with make(data, "cuda") as loader, torch.cuda.stream(stream):
        for k, (ref_x, ref_y, _) in enumerate(cpu_stream[:64]):
            x, y = next(loader)
            stream.synchronize()
            assert torch.equal(x.cpu(), ref_x) and torch.equal(y.cpu(), ref_y), f"batch {k} differs"


def test_nanochat_style_device_object(data, cpu_stream):
    gen = tokenizing_distributed_data_loader(B, T, "train", device=torch.device("cuda"), data=data[0],
                                             tokenizer=data[1], num_workers=2, timeout=TIMEOUT_S)
    try:
        for k, (ref_x, ref_y, _) in enumerate(cpu_stream[:16]):
            x, y = next(gen)
            assert x.is_cuda and torch.equal(x.cpu(), ref_x) and torch.equal(y.cpu(), ref_y), f"batch {k}"
    finally:
        gen.close()


def test_the_copy_is_on_a_profiler_trace_inside_next(data):
    """With CUDA activities recorded, each `next()` holds a `shmloader.copy` range that issues a
    host-to-device memcpy of the slot's row."""
    from torch.profiler import ProfilerActivity, profile
    with make(data, "cuda") as loader:
        next(loader)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                next(loader)
            torch.cuda.synchronize()
    from torch.autograd import DeviceType

    # the host's ranges: with CUDA activities torch also mirrors a range that issued GPU work onto
    # the GPU's timeline (on an H200, torch 2.11: a second shmloader.copy, on DeviceType.CUDA)
    host = [e.name for e in prof.events() if e.device_type == DeviceType.CPU]
    names = [e.name for e in prof.events()]
    assert host.count("shmloader.next") == 3 and host.count("shmloader.copy") == 3, sorted(set(host))
    assert any("Memcpy HtoD" in n or "memcpy" in n.lower() for n in names), sorted(set(names))


def test_close_leaves_no_segment(data):
    loader = make(data, "cuda")
    next(loader)
    name = loader.debug().segment
    assert os.path.exists(os.path.join("/dev/shm", name))
    loader.close()
    assert not os.path.exists(os.path.join("/dev/shm", name))
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shml_{os.getpid()}_")]
