"""What `next()` costs the training process, in a child process: the trainer topic's rows.

`trainer_child`: in one fresh process, `cost` then `dropin` (each its own loader, one after
the other).

`cost`: a `ShmLoader` whose ring holds `batches` + 1 slots, every slot ready before the
clock starts, so that what is timed is `next()` itself (the CPU time of the training process,
getrusage deltas around each call):
- back to back, `batches` calls;
- after `sleep_ms` sleeps, next to the floor: a bare `torch.from_numpy(window[:-1]).view(B, T)`
  after the same sleep (on a virtual machine the first work after a sleep pays for refilled
  caches and TLBs, which the floor shows and which is not the loader's);
- after `busy_ms` of busy work (`measure.busy_work`, a training step's compute), next to the
  same floor after the same busy work; medians. Calls that found no batch ready are counted.

`dropin`: nanochat's loop through a drop-in with its state
(`tokenizing_distributed_data_loader_with_state` or `..._with_state_bos_bestfit`, the
tokenizer passed as an object), `x, y, state = next(loader)`: the training process's CPU per
batch as fast as it goes for `seconds` (after a quarter of that for the read-ahead and best
fit's buffer); `next()` after `busy_ms` of busy work; at a trainer's pace, `next()` after
`step_ms` of busy work, longer than the loader takes per batch so that the batch and its state
are ready (the calls that still waited are counted, through the loader the drop-in generator
holds: its frame's local `loader`, not a public attribute); the last state as JSON.
"""
from __future__ import annotations

import json
import statistics
import time

from tools.bench import baseline, measure


def _us(xs) -> dict:
    return {"median": statistics.median(xs) * 1e6, "mean": statistics.fmean(xs) * 1e6}


def trainer_child(cfg: dict) -> dict:
    import torch  # noqa: F401  (imported before any timing, as in a training script)

    return {"cost": cost(cfg), "dropin": dropin(cfg), "packing": cfg["packing"]}


def cost(cfg: dict) -> dict:
    import numpy as np

    from shmloader import ShmLoader

    B, T, n = cfg["B"], cfg["T"], cfg["batches"]
    it = ShmLoader(cfg["data"], cfg["tokenizer"], B, T, "train", num_workers=cfg["workers"], device="cpu",
                   packing=cfg["packing"], n_slots=n + 1)
    try:
        next(it)
        deadline = time.monotonic() + 60  # every slot ready
        while it.stats().get("ring_ready", 0) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        back_to_back = []
        for _ in range(n):
            c0 = measure.cpu_s()
            next(it)
            back_to_back.append(measure.cpu_s() - c0)
        probe, buf = np.zeros(B * T + 1, dtype=np.int64), np.zeros(1 << 17)
        slept = after_pauses(it, lambda: time.sleep(cfg["sleep_ms"] / 1e3), probe, B, T, n, "after sleeps")
        busy = after_pauses(it, lambda: measure.busy_work(cfg["busy_ms"] / 1e3, buf), probe, B, T, n, "after busy work")
    finally:
        it.close()
    return {"kind": "cost", "workers": cfg["workers"], "packing": cfg["packing"], "batches": n,
            "sleep_ms": cfg["sleep_ms"], "busy_ms": cfg["busy_ms"], "back_to_back_us": _us(back_to_back),
            "after_sleep_us": _us(slept[0]), "after_sleep_floor_us": _us(slept[1]), "after_sleep_not_ready": slept[2],
            "after_busy_us": _us(busy[0]), "after_busy_floor_us": _us(busy[1]), "after_busy_not_ready": busy[2]}


def after_pauses(it, pause, probe, B: int, T: int, n: int, desc: str) -> tuple:
    """`(next() CPU times, bare-view CPU times, calls that found no batch ready)`: each step
    pauses, times a bare `torch.from_numpy(probe[:-1]).view(B, T)`, pauses again and times `next(it)`."""
    import torch

    cost, floor, not_ready = [], [], 0
    for _ in measure.bar(desc, range(n)):
        pause()
        c0 = measure.cpu_s()
        torch.from_numpy(probe[:-1]).view(B, T)
        floor.append(measure.cpu_s() - c0)
        pause()
        waited = it.stats()["wait_s"]
        c0 = measure.cpu_s()
        next(it)
        cost.append(measure.cpu_s() - c0)
        not_ready += it.stats()["wait_s"] > waited
    return cost, floor, not_ready


def dropin(cfg: dict) -> dict:
    import numpy as np

    from shmloader import nanochat

    B, T = cfg["B"], cfg["T"]
    enc = baseline.load_tiktoken(cfg["tokenizer"])
    opts = dict(device="cpu", data=cfg["data"], num_workers=cfg["workers"])
    if cfg["packing"] == "bos_bestfit":
        name = "tokenizing_distributed_data_loader_with_state_bos_bestfit"
        loader = nanochat.tokenizing_distributed_data_loader_with_state_bos_bestfit(enc, B, T, "train", **opts)
    else:
        name = "tokenizing_distributed_data_loader_with_state"
        loader = nanochat.tokenizing_distributed_data_loader_with_state(B, T, "train", tokenizer=enc, **opts)
    try:
        x, y, state = next(loader)
        end = time.perf_counter() + cfg["seconds"] / 4
        while time.perf_counter() < end:
            x, y, state = next(loader)
        n, c0, t0 = 0, measure.cpu_s(), time.perf_counter()
        while time.perf_counter() - t0 < cfg["seconds"]:
            x, y, state = next(loader)
            n += 1
        wall, cpu = time.perf_counter() - t0, measure.cpu_s() - c0
        buf = np.zeros(1 << 17)
        after_busy, _ = _after_steps(loader, cfg["busy_ms"], buf, cfg["batches"])
        paced, not_ready = _after_steps(loader, cfg["step_ms"], buf, cfg["batches"])
        c0 = time.perf_counter()
        saved = json.dumps(state)
        json_s = time.perf_counter() - c0
    finally:
        loader.close()
    return {"kind": "dropin", "function": name, "packing": cfg["packing"], "workers": cfg["workers"],
            "batches": cfg["batches"], "busy_ms": cfg["busy_ms"], "step_ms": cfg["step_ms"],
            "fast_batches": n, "fast_wall_s": wall, "delivered_tokens_per_s": n * B * T / wall,
            "trainer_cpu_us_per_batch": cpu / max(n, 1) * 1e6, "after_busy_us": _us(after_busy),
            "paced_us": _us(paced), "paced_not_ready": not_ready,
            "state_json_us": json_s * 1e6, "state_json_bytes": len(saved)}


def _after_steps(loader, step_ms: float, buf, n: int) -> tuple[list, int | None]:
    """CPU of `n` calls `x, y, state = next(loader)`, each after `step_ms` of busy work, and how
    many of them waited for a batch (None if the drop-in's inner loader cannot be seen)."""
    inner = getattr(loader, "loader", None)  # the drop-in's generator holds its loader
    times, not_ready = [], 0
    for _ in range(n):
        measure.busy_work(step_ms / 1e3, buf)
        waited = inner.stats()["wait_s"] if inner is not None else 0.0
        c0 = measure.cpu_s()
        next(loader)
        times.append(measure.cpu_s() - c0)
        not_ready += inner is not None and inner.stats()["wait_s"] > waited
    return times, not_ready if inner is not None else None
