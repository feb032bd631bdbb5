"""Check shmloader's CUDA path on a machine with a GPU, in one command, without pytest.

    python tools/gpu_check.py                     # ~1 min on a big GPU box, well under 5
    python tools/gpu_check.py --device cpu        # the same harness without a GPU (CUDA checks skipped)

Builds its own data offline (the stdlib demo corpus of `python -m shmloader.demo`, into
`--out-dir` or a temporary directory), takes the CPU loader's stream as the reference (its first
batches checked against `oracle.concat_windows`), then checks, as tests/loader/test_cuda.py does:

1. pinned: the ring's slot tensors report `is_pinned()` (cudaHostRegister worked);
2. devices: `"cuda"`, `"cuda:0"` and `torch.device("cuda")` give GPU batches byte-equal to the
   CPU stream, with equal state dicts, for `--batches` batches;
3. event-gated slot reuse: 2 slots and a ~0.05 s GPU kernel (`torch.cuda._sleep`) queued before
   each `next()`; every batch, cloned on the stream right after its copy, must equal the CPU
   stream. A control run then frees each slot *without* waiting for its event and counts the
   corrupted batches, showing that the check can see the race (informational);
4. best fit: `packing="bos_bestfit"` batches (a 2*B*T window) on the device equal the CPU ones;
5. side stream: batches taken under `torch.cuda.stream(s)` equal the CPU stream;
6. close: the loader's /dev/shm segment is gone and no segment of this process remains;
7. positions: with `positions=True`, both packings, inputs, targets and positions on the device
   equal the CPU loader's, and `shmloader.cu_seqlens` of the device's positions (int32 there)
   equals the CPU one's;
8. mixture: a `shmloader.Mixture` of the demo corpus and a synthetic one, on a schedule of two
   stages, gives device batches and states equal to the CPU loader's;
9. staged: with cudaHostRegister refused for real (the ring registered once already, so the
   loader's own call fails with cudaErrorHostMemoryAlreadyRegistered), the loader warns once,
   stages its batches through pinned buffers, and every batch equals the CPU stream with 2
   slots and the long kernel before each `next()`; CUDA work after the refusal still runs (the
   runtime's last error was cleared);

and measures, at B=16, T=2048 with `--workers` workers: tokens/s into the device (tokens read,
B*T+1 per batch, consuming as fast as possible for `--seconds`, synchronised at the end), the
trainer's CPU time per batch (getrusage RUSAGE_SELF), the first-batch latency, and the trainer
cost with batches always ready (CPU time of `next()` alone, consumer sleeping 20 ms between
calls; target < 100 us). Exit code 0 when every check passes, 1 otherwise.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

SLEEP_CYCLES = int(1e8)   # ~0.05 s of GPU time at ~2 GHz
SLEEP_STEPS = 32
TARGET_TRAINER_US = 100.0
TIMEOUT_S = 120.0


@dataclass
class Ctx:
    data: str
    tokenizer: str
    device: str
    B: int
    T: int
    workers: int
    reference: list = field(default_factory=list)  # (inputs, targets, state) of the CPU loader


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _loader(ctx: Ctx, device, B=None, T=None, **kw):
    from shmloader import ShmLoader

    kw.setdefault("num_workers", ctx.workers)
    return ShmLoader(kw.pop("data", ctx.data), ctx.tokenizer, B or ctx.B, T or ctx.T, "train", device=device,
                     timeout=TIMEOUT_S, **kw)


def _sync(device):
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _equal(ctx: Ctx, k: int, x, y) -> bool:
    import torch

    ref_x, ref_y, _ = ctx.reference[k]
    return torch.equal(x.cpu(), ref_x) and torch.equal(y.cpu(), ref_y)


def build_reference(ctx: Ctx, n: int, n_oracle: int = 4) -> str:
    import numpy as np

    from shmloader.data import source
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    from tests import oracle
    from shmloader.demo import load_encoding

    with _loader(ctx, "cpu") as loader:
        for _ in range(n):
            x, y = next(loader)
            ctx.reference.append((x, y, loader.state_dict()))
    enc = load_encoding(ctx.tokenizer)
    files = source.split_files(source.list_files(ctx.data), "train")
    expected = oracle.concat_windows(files, enc.encode_ordinary, enc.encode_single_token("<|bos|>"), ctx.B, ctx.T)
    for k in range(min(n_oracle, n)):
        window, _ = next(expected)
        x, y, _ = ctx.reference[k]
        flat_x, flat_y = x.reshape(-1).numpy(), y.reshape(-1).numpy()
        if not (np.array_equal(flat_x, window[:-1]) and np.array_equal(flat_y, window[1:])):
            raise SystemExit(f"gpu_check: the CPU stream differs from oracle.concat_windows at batch {k}; "
                             f"fix that first (pytest tests/)")
    return f"CPU stream of {n} batches (B={ctx.B}, T={ctx.T}), first {min(n_oracle, n)} equal the oracle's"


# ---------------------------------------------------------------- checks: (ok, detail); ok None = skipped

def check_pinned(ctx: Ctx):
    if not ctx.device.startswith("cuda"):
        return None, "needs CUDA"
    with _loader(ctx, ctx.device) as loader:
        x, _ = next(loader)
        slots = loader.debug().delivery.slot_tensors
        pinned = [bool(slots[i].is_pinned()) for i in range(loader.n_slots)]
        ok = x.is_cuda and loader.debug().delivery.pinned and slots.is_pinned() and all(pinned)
        return ok, f"{sum(pinned)}/{len(pinned)} slots of {slots.shape[1]} tokens report is_pinned()"


def check_device(ctx: Ctx, device):
    import torch

    want = torch.device(device)
    if want.type == "cuda":
        want = torch.device("cuda", torch.cuda.current_device() if want.index is None else want.index)
    bad = []
    with _loader(ctx, device) as loader:
        for k in range(len(ctx.reference)):
            x, y = next(loader)
            if x.device != want or y.device != want or x.dtype != torch.int64 or x.shape != (ctx.B, ctx.T):
                return False, f"batch {k} is {x.dtype} {tuple(x.shape)} on {x.device}, expected int64 on {want}"
            if not _equal(ctx, k, x, y) or loader.state_dict() != ctx.reference[k][2]:
                bad.append(k)
    n = len(ctx.reference)
    detail = f"{n - len(bad)}/{n} batches and states equal the CPU stream"
    return not bad, detail + (f"; differ: {bad[:10]}" if bad else "")


def check_bestfit(ctx: Ctx, n: int, buffer_size: int):
    import torch

    with _loader(ctx, "cpu", packing="bos_bestfit", buffer_size=buffer_size) as loader:
        ref = [next(loader) for _ in range(n)]
    bad = []
    with _loader(ctx, ctx.device, packing="bos_bestfit", buffer_size=buffer_size) as loader:
        for k, (ref_x, ref_y) in enumerate(ref):
            x, y = next(loader)
            if x.device.type != torch.device(ctx.device).type or not (
                    torch.equal(x.cpu(), ref_x) and torch.equal(y.cpu(), ref_y)):
                bad.append(k)
    return not bad, f"{n - len(bad)}/{n} batches (buffer {buffer_size} documents) equal the CPU loader's"


def check_positions(ctx: Ctx, n: int, buffer_size: int):
    import torch

    import shmloader

    bad, starts = [], 0
    for packing in ("concat", "bos_bestfit"):
        kw = {"packing": packing, "positions": True, "buffer_size": buffer_size}
        with _loader(ctx, "cpu", **kw) as loader:
            ref = [tuple(t.clone() for t in next(loader)) for _ in range(n)]
        with _loader(ctx, ctx.device, **kw) as loader:
            for k, want in enumerate(ref):
                got = next(loader)
                cu, longest = shmloader.cu_seqlens(got[2])
                cu_want, longest_want = shmloader.cu_seqlens(want[2])
                starts += int((want[2] == 0).sum())
                if (any(t.device.type != torch.device(ctx.device).type for t in got)
                        or not all(torch.equal(a.cpu(), b) for a, b in zip(got, want))
                        or cu.dtype != torch.int32 or cu.device != got[2].device
                        or not torch.equal(cu.cpu(), cu_want) or longest != longest_want):
                    bad.append((packing, k))
    ok = not bad and starts > 2 * n  # documents start inside the batches: not only at the first token
    return ok, (f"{2 * n - len(bad)}/{2 * n} batches with positions (concat, best fit) and their cu_seqlens "
                f"equal the CPU loader's ({starts} document starts)" + (f"; differ: {bad[:10]}" if bad else ""))


def _sleep_run(ctx: Ctx, free_early: bool, expect=None):
    """Batches taken with a long kernel queued before each next(); returns (differing, pending)."""
    import torch

    from shmloader import delivery

    saved, pending = [], 0
    with _loader(ctx, ctx.device, n_slots=2) as loader:
        try:
            for _ in range(_sleep_steps(ctx)):
                torch.cuda._sleep(SLEEP_CYCLES)
                x, y = next(loader)
                got = loader.debug().delivery
                if type(got) is not (expect or delivery.PinnedCopy):
                    raise AssertionError(f"the loader delivers with {type(got).__name__}")
                if expect is not None:  # staged: no slot waits for a copy
                    saved.append((x.clone(), y.clone()))
                    continue
                inflight = got.inflight
                pending += bool(inflight) and not inflight[-1][-1].query()
                if free_early and inflight:  # the bug this check exists for: free before the copy ran
                    inflight[-1] = (*inflight[-1][:-1], _DoneEvent())
                saved.append((x.clone(), y.clone()))
        finally:
            torch.cuda.synchronize()  # no copy may be pending when close() unregisters the ring
    return [k for k, (x, y) in enumerate(saved) if not _equal(ctx, k, x, y)], pending


def _sleep_steps(ctx: Ctx) -> int:
    return min(SLEEP_STEPS, len(ctx.reference))


class _DoneEvent:
    """Stands in for a CUDA event that claims its copy has completed."""

    def query(self):
        return True

    def synchronize(self):
        pass


def check_event_gating(ctx: Ctx):
    if not ctx.device.startswith("cuda"):
        return None, "needs CUDA"
    bad, pending = _sleep_run(ctx, free_early=False)
    n = _sleep_steps(ctx)
    detail = (f"{n - len(bad)}/{n} batches equal with 2 slots and a {SLEEP_CYCLES:.0e}-cycle "
              f"kernel before each next(); {pending} copies were still pending when next() returned")
    if pending <= n // 2:
        return False, detail + " (too few pending: the check would be vacuous; raise SLEEP_CYCLES)"
    try:
        control, _ = _sleep_run(ctx, free_early=True)
        detail += (f"\n        control: freeing slots without waiting for the event corrupted "
                   f"{len(control)}/{n} batches" + (" (the check sees the race)" if control else
                                                            " (the race did not show here)"))
    except Exception as exc:  # internals changed: the control is informational only
        detail += f"\n        control not run: {type(exc).__name__}: {exc}"
    return not bad, detail


def check_side_stream(ctx: Ctx):
    import torch

    if not ctx.device.startswith("cuda"):
        return None, "needs CUDA"
    stream, n, bad = torch.cuda.Stream(), min(64, len(ctx.reference)), []
    with _loader(ctx, ctx.device) as loader, torch.cuda.stream(stream):
        for k in range(n):
            x, y = next(loader)
            stream.synchronize()
            if not _equal(ctx, k, x, y):
                bad.append(k)
    return not bad, f"{n - len(bad)}/{n} batches equal under torch.cuda.stream(s)"


def check_profiler(ctx: Ctx):
    """A torch.profiler trace holds each next()'s shmloader.next and shmloader.copy ranges
    (and, on CUDA, the host-to-device memcpy the copy issues)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = ctx.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with _loader(ctx, ctx.device) as loader:
        next(loader)
        with profile(activities=activities) as prof:
            for _ in range(3):
                next(loader)
            _sync(ctx.device)
    from torch.autograd import DeviceType

    names = [e.name for e in prof.events()]
    host = [e.name for e in prof.events() if e.device_type == DeviceType.CPU]  # not the GPU timeline's mirror
    counts = {n: host.count(n) for n in ("shmloader.next", "shmloader.copy")}
    memcpy = sum("memcpy" in n.lower() for n in names)
    ok = counts["shmloader.next"] == 3 and (not cuda or (counts["shmloader.copy"] == 3 and memcpy > 0))
    mirrored = names.count("shmloader.copy") - counts["shmloader.copy"]
    return ok, (f"host ranges in the trace of 3 next(): {counts} ({mirrored} copy ranges mirrored on the GPU's "
                f"timeline), memcpy events: {memcpy}" + ("" if cuda else " (CPU: no copy)"))


def check_mixture(ctx: Ctx, n: int, out_dir: str):
    import torch

    import shmloader
    from shmloader.demo import corpus

    synth = os.path.join(out_dir, "synth_source")
    if not os.path.isdir(synth):
        docs = corpus.synthetic_texts(1200, seed=5, mean_words=80)
        corpus.write_shards(docs, synth, num_files=3, row_group_size=[64, 23])
    mix = lambda: shmloader.Mixture({"demo": ctx.data, "synth": synth},  # noqa: E731
                                    [(0, {"demo": 0.7, "synth": 0.3}), (n // 2, {"demo": 0.2, "synth": 0.8})])
    with _loader(ctx, "cpu", data=mix()) as loader:
        ref = [(*next(loader), loader.state_dict()) for _ in range(n)]
    bad = []
    with _loader(ctx, ctx.device, data=mix()) as loader:
        for k, (ref_x, ref_y, ref_state) in enumerate(ref):
            x, y = next(loader)
            if x.device.type != torch.device(ctx.device).type or not (
                    torch.equal(x.cpu(), ref_x) and torch.equal(y.cpu(), ref_y)) or loader.state_dict() != ref_state:
                bad.append(k)
        shares = loader.stats()["sources"]
    return not bad, (f"{n - len(bad)}/{n} batches and states of a 2-source mixture (a stage change at batch "
                     f"{n // 2}) equal the CPU loader's; sources: "
                     + ", ".join(f"{name} {v.get('share_recent', v.get('share', 0)):.2f}" for name, v in shares.items()))


def check_staged(ctx: Ctx):
    """The loader with cudaHostRegister refused for real: see the module docstring (9)."""
    import warnings

    import torch

    from shmloader import delivery

    if not ctx.device.startswith("cuda"):
        return None, "needs CUDA"
    real_pin, cudart = delivery.pin, torch.cuda.cudart()

    def registered_twice(slots, device):
        ptr = slots.ctypes.data
        rc = cudart.cudaHostRegister(ptr, slots.nbytes, delivery.CUDA_HOST_REGISTER_PORTABLE)
        try:
            real_pin(slots, device)  # the loader's own call, refused: already registered
        finally:
            if int(rc) == 0:
                cudart.cudaHostUnregister(ptr)

    delivery.pin = registered_twice
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            bad, pending = _sleep_run(ctx, free_early=False, expect=delivery.StagedCopy)
            after = torch.ones(1024, device=ctx.device).cumsum(0)[-1].item()  # kernels run after the refusal
    finally:
        delivery.pin = real_pin
    said = [str(w.message) for w in caught if "cudaHostRegister" in str(w.message)]
    n = _sleep_steps(ctx)
    ok = not bad and len(said) == 1 and after == 1024
    return ok, (f"{n - len(bad)}/{n} batches equal through pinned staging with 2 slots and the long kernel; "
                f"{len(said)} warning(s): {said[0] if said else '-'}; a kernel after the refusal gave {after:g}")


def check_close(ctx: Ctx):
    loader = _loader(ctx, ctx.device)
    next(loader)
    name = loader.debug().segment
    existed = os.path.exists(os.path.join("/dev/shm", name))
    loader.close()
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"shml_{os.getpid()}_")]
    ok = existed and not os.path.exists(os.path.join("/dev/shm", name)) and not left
    return ok, f"segment {name} unlinked by close(); segments of this process left: {left or 'none'}"


# ---------------------------------------------------------------- measurements

def measure(ctx: Ctx, seconds: float, cost_batches: int, B: int = 16, T: int = 2048) -> dict:
    from tqdm import tqdm

    window = B * T + 1
    started = time.perf_counter()
    loader = _loader(ctx, ctx.device, B, T)
    try:
        next(loader)
        _sync(ctx.device)
        first = time.perf_counter() - started
        n, c0, t0 = 0, _cpu(), time.perf_counter()
        with tqdm(desc="throughput", unit="batch", leave=False, disable=None, mininterval=0.5) as bar:
            while time.perf_counter() - t0 < seconds:
                next(loader)
                n += 1
                bar.update()
            _sync(ctx.device)
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        costs = []
        for _ in tqdm(range(cost_batches), desc="trainer cost", leave=False, disable=None, mininterval=0.5):
            time.sleep(0.02)
            c1 = _cpu()
            next(loader)
            costs.append(_cpu() - c1)
        _sync(ctx.device)
    finally:
        loader.close()
    return {"B": B, "T": T, "first_batch_ms": first * 1e3, "batches": n, "tokens_per_s": n * window / wall,
            "trainer_cpu_us_per_batch": cpu / n * 1e6, "cost_us_per_next": statistics.fmean(costs) * 1e6,
            "cost_us_median": statistics.median(costs) * 1e6, "cost_batches": cost_batches}


# ---------------------------------------------------------------- main

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python tools/gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="device to check (default cuda; 'cpu' runs the harness only)")
    p.add_argument("--out-dir", default=None,
                   help="where the demo corpus is built and cached (directory; default a temporary one)")
    p.add_argument("--vocab-size", type=int, default=4096, help="demo tokenizer size (tokens; default 4096)")
    p.add_argument("--workers", type=int, default=4, help="loader worker processes (processes; default 4)")
    p.add_argument("--batches", type=int, default=256,
                   help="batches compared per device check (batches; default 256)")
    p.add_argument("--batch-size", type=int, default=4, help="B of the equality checks (rows; default 4)")
    p.add_argument("--seq-len", type=int, default=512, help="T of the equality checks (tokens; default 512)")
    p.add_argument("--buffer-size", type=int, default=1000,
                   help="buffer of the best-fit check (documents; default 1000, nanochat's)")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="wall time of the throughput measurement at B=16, T=2048 (seconds; default 10)")
    p.add_argument("--cost-batches", type=int, default=100,
                   help="batches in the trainer-cost measurement (batches; default 100)")
    args = p.parse_args(argv)
    if min(args.workers, args.batches, args.batch_size, args.seq_len, args.cost_batches, args.buffer_size) < 1 \
            or args.seconds <= 0:
        p.error("--workers, --batches, --batch-size, --seq-len, --cost-batches, --buffer-size must be >= 1 "
                "and --seconds > 0")
    return args


def _header(device: str) -> str:
    import torch

    where = "no CUDA"
    if torch.cuda.is_available():
        where = f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return (f"gpu_check: torch {torch.__version__} ({where}), {len(os.sched_getaffinity(0))} cores, "
            f"checking device {device!r}")


def run(args, out_dir: str) -> int:
    import torch

    from shmloader.demo import prepare_data

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available here; run on a GPU machine, or with --device cpu to "
              "exercise the harness only", file=sys.stderr)
        return 2
    print(_header(args.device))
    try:
        demo = prepare_data(out_dir, args.vocab_size)
    except ValueError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    ctx = Ctx(str(demo.data_dir), str(demo.tokenizer_path), args.device, args.batch_size, args.seq_len, args.workers)
    print(f"data: {demo.data_dir} ({demo.n_docs} documents); {build_reference(ctx, args.batches)}")
    devices = ["cuda", "cuda:0", torch.device("cuda")] if args.device.startswith("cuda") else [args.device]
    checks = [("pinned ring", lambda: check_pinned(ctx))]
    checks += [(f"device {d!r}", lambda d=d: check_device(ctx, d)) for d in devices]
    checks += [("bos_bestfit", lambda: check_bestfit(ctx, min(64, args.batches), args.buffer_size)),
               ("event-gated slot reuse", lambda: check_event_gating(ctx)),
               ("side stream", lambda: check_side_stream(ctx)),
               ("positions", lambda: check_positions(ctx, min(32, args.batches), args.buffer_size)),
               ("mixture", lambda: check_mixture(ctx, min(48, args.batches), out_dir)),
               ("staged (cudaHostRegister refused)", lambda: check_staged(ctx)),
               ("profiler", lambda: check_profiler(ctx)),
               ("close", lambda: check_close(ctx))]
    failed = 0
    for name, fn in checks:
        try:
            ok, detail = fn()
        except Exception as exc:
            ok, detail = False, f"raised {type(exc).__name__}: {exc}"
        failed += ok is False
        print(f"  {'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    m = measure(ctx, args.seconds, args.cost_batches)
    print(f"throughput into {args.device} at B={m['B']}, T={m['T']}, {args.workers} workers: "
          f"{m['tokens_per_s'] / 1e6:.2f} M tokens/s, trainer CPU {m['trainer_cpu_us_per_batch']:,.1f} us/batch "
          f"({m['batches']} batches in {args.seconds:g} s), first batch {m['first_batch_ms']:,.0f} ms")
    verdict = "met" if m["cost_us_per_next"] < TARGET_TRAINER_US else "NOT met"
    print(f"trainer cost with batches ready (20 ms consumer sleep, {m['cost_batches']} batches): "
          f"{m['cost_us_per_next']:,.1f} us per next() (median {m['cost_us_median']:,.1f}); "
          f"target < {TARGET_TRAINER_US:.0f} us: {verdict}")
    print("all checks passed" if not failed else f"{failed} check(s) FAILED")
    return 1 if failed else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.out_dir is not None:
        return run(args, args.out_dir)
    with tempfile.TemporaryDirectory(prefix="shmloader_gpu_check_") as tmp:
        return run(args, tmp)


if __name__ == "__main__":
    sys.exit(main())
