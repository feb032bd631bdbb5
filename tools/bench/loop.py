"""The training-step loop in a child process: the step_loop topic's rows.

`step_row(cfg)`: in this fresh process (torch imported first, as in a training script: its
objects are the trainer's heap, a full collection of it ~0.1 s), a loop whose step is `units`
of `measure.gil_work` (pure Python holding the GIL: a fixed amount of work, so that whatever
takes the core or the GIL from the trainer makes the step longer) then
`x, y, state = next(loader)`, nanochat's best-fit batch with its state, from a loader of `kind`:
- "shmloader": shmloader's drop-in `tokenizing_distributed_data_loader_with_state_bos_bestfit`
  (`workers` processes, the tokenizer passed as an object, as nanochat passes it);
- "nanochat": nanochat's own best-fit loader in the training process (the in-repo baseline,
  `tools/bench/baseline.py`), each batch with a state dict of nanochat's three keys;
- "thread": the same loader moved to a background thread with a queue of `depth` batches
  (`baseline.prefetched`, the approach of nanochat PR #832).

Against it, in the same process, the ideal: the same loop over `IDEAL_BATCHES` batches already
in memory (a generator over a list, each batch with a state dict). The two alternate in blocks
of `block` steps, `pairs` pairs of blocks in the order ideal, loader, loader, ideal, ideal, ...
(so that a drift hits both alike), each block after `PAUSE_S` of sleep (the loader's processes
or thread finish what the last block asked of them; the first step of each block is as cold
for both): a shared machine's load lands on both sides of a pair. A row's ratio is the median
over pairs of the loader block's time / the ideal block's.

`warmup` steps of the loader first (its buffers and read-ahead fill) and a few of the ideal;
then with `gc` "frozen" the collector is collected, frozen and disabled, as nanochat's
base_train does after its first step, or left on with "on". Per side: the step time (its
blocks' wall time / steps; median, 99th percentile, longest step), the share of its core the
step's work kept (thread CPU / wall), `next()`'s wall and thread CPU time, the collections that
ran (by generation, with their time), how often the training thread was preempted (its
involuntary context switches per step: whoever took its core), the CPU the loader's processes
used and the cores the rest of the machine used (`measure.machine_busy_s` less this
process's and the loader's).
"""
from __future__ import annotations

import gc
import statistics
import time

from tools.bench import baseline, corpora, measure

IDEAL_BATCHES = 64
KINDS = ("shmloader", "nanochat", "thread")
PAUSE_S = 0.1


def step_row(cfg: dict) -> dict:
    import torch  # noqa: F401  (imported before any timing, as in a training script)

    it, ideal = make(cfg), _in_memory(cfg["B"], cfg["T"])
    try:
        return dict(paired(it, ideal, cfg), kind=cfg["kind"], gc=cfg["gc"], workers=cfg.get("workers"))
    finally:
        it.close()
        gc.enable()
        gc.unfreeze()


def make(cfg: dict):
    """The row's loader: an iterator of `(x, y, state)` with a `close()`."""
    B, T = cfg["B"], cfg["T"]
    enc = baseline.load_tiktoken(cfg["tokenizer"])
    if cfg["kind"] == "shmloader":
        from shmloader import nanochat

        return nanochat.tokenizing_distributed_data_loader_with_state_bos_bestfit(
            enc, B, T, "train", device="cpu", data=cfg["data"], num_workers=cfg["workers"])
    own = _with_state(baseline.loader(corpora.split_files(cfg["data"], "train"), enc, B, T, "bos_bestfit"))
    return own if cfg["kind"] == "nanochat" else baseline.prefetched(own, cfg["depth"])


def _in_memory(B: int, T: int):
    import torch

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 4096, (B, T + 1), generator=g) for _ in range(IDEAL_BATCHES)]
    while True:
        for i, r in enumerate(rows):
            yield r[:, :-1], r[:, 1:], {"pq_idx": 0, "rg_idx": i, "epoch": 1}


def _with_state(batches):
    """nanochat's `(inputs, targets, state)`: its state is three numbers (here a new dict each batch)."""
    for i, (x, y) in enumerate(batches):
        yield x, y, {"pq_idx": 0, "rg_idx": i, "epoch": 1}


def paired(it, ideal, cfg: dict) -> dict:
    units = cfg["units"]
    for src, n in ((it, cfg["warmup"]), (ideal, 5)):
        for _ in range(n):
            measure.gil_work(units)
            next(src)
    if cfg["gc"] == "frozen":  # nanochat's base_train after its first step
        gc.collect()
        gc.freeze()
        gc.disable()
    pids = sum(measure.loader_pids(getattr(it, "loader", None)), [])
    sides = {"ideal": _Side(ideal, []), "loader": _Side(it, pids)}
    ratios = []
    for i in range(cfg["pairs"]):
        order = ("ideal", "loader") if i % 2 == 0 else ("loader", "ideal")
        took = {}
        for name in order:
            time.sleep(PAUSE_S)
            took[name] = sides[name].block(units, cfg["block"])
        ratios.append(took["loader"] / took["ideal"])
    return {"units": units, "block": cfg["block"], "pairs": cfg["pairs"], "warmup": cfg["warmup"],
            "vs_ideal": statistics.median(ratios), "pair_ratios": ratios,
            "ideal": sides["ideal"].figures(), "loader": sides["loader"].figures()}


class _Side:
    """One side of the pairs: its loader, and what its blocks measured."""

    def __init__(self, it, pids: list[int]):
        self.it, self.pids = it, pids
        self.steps, self.work_wall, self.work_cpu, self.next_wall, self.next_cpu = [], [], [], [], []
        self.wall = self.loader_cpu = self.others = 0.0
        self.preempted = 0
        self.collections = _Collections()

    def block(self, units: int, n: int) -> float:
        """`n` steps; their wall time."""
        it = self.it
        gc.callbacks.append(self.collections)
        try:
            v0, k0, m0, s0 = _preempted(), measure.cpu_of(self.pids), measure.machine_busy_s(), measure.cpu_s()
            t0 = time.perf_counter()
            for _ in range(n):
                w0, c0 = time.perf_counter(), time.thread_time()
                measure.gil_work(units)
                w1, c1 = time.perf_counter(), time.thread_time()
                x, y, state = next(it)
                w2, c2 = time.perf_counter(), time.thread_time()
                self.steps.append(w2 - w0)
                self.work_wall.append(w1 - w0)
                self.work_cpu.append(c1 - c0)
                self.next_wall.append(w2 - w1)
                self.next_cpu.append(c2 - c1)
            wall = time.perf_counter() - t0
            self.preempted += _preempted() - v0
            loader_cpu = measure.cpu_of(self.pids) - k0
            self.others += measure.machine_busy_s() - m0 - loader_cpu - (measure.cpu_s() - s0)
        finally:
            gc.callbacks.remove(self.collections)
        self.wall += wall
        self.loader_cpu += loader_cpu
        return wall

    def figures(self) -> dict:
        steps, n = sorted(self.steps), len(self.steps)
        us = lambda xs: {"median": statistics.median(xs) * 1e6, "mean": statistics.fmean(xs) * 1e6}  # noqa: E731
        return {"steps": n, "step_ms": self.wall / n * 1e3, "step_median_ms": statistics.median(steps) * 1e3,
                "step_p99_ms": steps[int(0.99 * (n - 1))] * 1e3, "step_max_ms": steps[-1] * 1e3,
                "work_ms": statistics.fmean(self.work_wall) * 1e3, "core_kept": sum(self.work_cpu) / sum(self.work_wall),
                "next_us": us(self.next_wall), "next_cpu_us": us(self.next_cpu),
                "preempted_per_step": self.preempted / n, "collections": self.collections.counts, "collection_ms": self.collections.seconds * 1e3,
                "loader_cpu_share": self.loader_cpu / self.wall if self.pids else None,
                "others_cores": self.others / self.wall}


def _preempted() -> int:
    """This thread's involuntary context switches so far."""
    import resource

    return resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw


class _Collections:
    """A `gc.callbacks` entry: how many collections of each generation ran, and their time."""

    def __init__(self):
        self.counts, self.seconds, self._started = [0, 0, 0], 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.counts[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._started
