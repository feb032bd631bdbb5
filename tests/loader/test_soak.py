"""Soak (docs/contract.md §4): one loader, one process, batches for SHMLOADER_SOAK_S seconds (default 600).

Slow, excluded by default: `SHMLOADER_SOAK_S=600 python -m pytest -m slow tests/loader/test_soak.py`.
Data: conftest's `posdata` (IntTokenizer, every non-BOS token equals its position in the
epoch), so every batch of the run is checked by arithmetic, across thousands of epochs.
Every CHECK_S seconds: the trainer's RSS (VmRSS) stays within RSS_SLACK_MB of its value at
the end of the warm-up, its open file descriptors and threads do not grow, this process has
exactly the loader's one shared-memory segment, and the coordinator and every worker are
alive. The figures (duration, batches, epochs, RSS drift, children's RSS) are printed at the
end so that they can be quoted.
"""
import os
import time

import numpy as np
import pytest

from tests.helpers import loader_children, shm_segments

pytestmark = pytest.mark.slow
B, T, WORKERS = 4, 64, 2
W = B * T + 1
CHECK_S = 5.0
RSS_SLACK_MB = 10.0


def rss_mb(pid="self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def counts() -> tuple[int, int]:
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def test_soak(posdata, capsys):
    duration = float(os.environ.get("SHMLOADER_SOAK_S", "600"))
    warmup = max(5.0, min(60.0, 0.1 * duration))
    train = [r for r in posdata.layout if r[0] < len(posdata.paths) - 1]
    P = train[-1][3] + train[-1][4] + 1  # tokens in one train epoch
    is_bos = np.zeros(P, dtype=bool)
    is_bos[[r[3] for r in train]] = True
    offsets = np.arange(W)

    samples = []  # (t, rss) after the warm-up
    base = None
    batches, started = 0, time.monotonic()
    next_check = started + CHECK_S
    with posdata.loader(B, T, "train", num_workers=WORKERS, timeout=30) as loader:
        while True:
            x, y = next(loader)
            loader.state_dict()
            window = np.concatenate([x.reshape(-1)[:1].numpy(), y.reshape(-1).numpy()])
            expect = (batches * W + offsets) % P
            tokens = window != 0
            if not (np.array_equal(window[tokens], expect[tokens]) and is_bos[expect[~tokens]].all()):
                pytest.fail(f"batch {batches} is not the stream: {window[:12]} ... expected {expect[:12]} ...")
            batches += 1
            now = time.monotonic()
            if now < next_check:
                continue
            next_check = now + CHECK_S
            procs = loader.debug()
            kids = [procs.coordinator, *procs.workers]
            dead = [p.name for p in kids if not p.is_alive()]
            assert not dead, f"loader processes died during the soak: {dead}"
            assert sorted(loader_children()) == sorted(p.pid for p in kids), "unexpected child processes"
            assert shm_segments() == [procs.segment], f"segments of this process: {shm_segments()}"
            if base is None:
                if now - started >= warmup:
                    base = {"rss": rss_mb(), "counts": counts(), "t": now - started,
                            "kids": {p.pid: rss_mb(p.pid) for p in kids}}
                continue
            rss = rss_mb()
            samples.append((now - started, rss))
            assert abs(rss - base["rss"]) <= RSS_SLACK_MB, \
                f"trainer RSS {rss:.1f} MB drifted from {base['rss']:.1f} MB after {now - started:.0f} s"
            assert counts() == base["counts"], f"fds/threads {counts()} != {base['counts']}"
            if now - started >= duration:
                break
        kids_end = {p.pid: rss_mb(p.pid) for p in kids}
        stats = loader.stats()
    took = time.monotonic() - started
    assert base is not None and len(samples) >= 2, "the soak was too short to measure"
    rs = [r for _, r in samples]
    kid_drift = ", ".join(f"{kids_end[p] - base['kids'][p]:+.1f}" for p in base["kids"])
    report = (f"soak: {took:.0f} s, {batches} batches ({batches / took:.0f}/s), epoch {stats['epoch']}, "
              f"{stats['tokens_read'] / 1e6:.1f}M tokens read; trainer RSS {base['rss']:.1f} MB at "
              f"{base['t']:.0f} s (end of warm-up) -> {rs[-1]:.1f} MB at {took:.0f} s: drift "
              f"{rs[-1] - base['rss']:+.2f} MB, range {min(rs):.1f}-{max(rs):.1f} MB over {len(rs)} samples; "
              f"fds/threads {base['counts']}; children RSS drift (MB, coordinator then workers): {kid_drift}")
    with capsys.disabled():
        print("\n" + report)
