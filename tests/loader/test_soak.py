"""Soak (docs/contract.md §4): one loader, one process, batches for SHMLOADER_SOAK_S seconds (default 600).

Slow, excluded by default: `SHMLOADER_SOAK_S=600 python -m pytest -m slow tests/loader/test_soak.py`.
Data: conftest's `posdata` (IntTokenizer, every non-BOS token equals its position in the
epoch), so every batch of the run is checked by arithmetic, across thousands of epochs.
Every CHECK_S seconds: the trainer's RSS (VmRSS) stays within RSS_SLACK_MB of its value at
the end of the warm-up, its open file descriptors and threads do not grow (`Holding`), this process has
exactly the loader's one shared-memory segment, and the coordinator and every worker are
alive. The figures (duration, batches, epochs, RSS drift, children's RSS) are printed at the
end so that they can be quoted.
"""
import gc
import os
import time
from dataclasses import dataclass

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


@dataclass
class Holding:
    """This process's open file descriptors (number -> what /proc says it is) and threads, taken
    after a garbage collection. The suite runs other files in this process first, and their
    objects left in reference cycles let go of their files only when collected, at a moment that
    depends on load: a raised error whose traceback holds its loader's ring (its mapping and
    descriptor go with the last reference), a compressed JSON Lines file's reader.
    CI once saw 31 descriptors after the first heal and 30 after the 99th. A leak grows; so each
    check compares with the fewest seen, and names what is new."""
    fds: dict
    threads: int

    @classmethod
    def now(cls) -> "Holding":
        gc.collect()
        fds = {}
        for n in os.listdir("/proc/self/fd"):
            try:
                fds[int(n)] = os.readlink(f"/proc/self/fd/{n}")
            except OSError:  # the listing's own descriptor, closed by now
                pass
        return cls(fds, len(os.listdir("/proc/self/task")))

    def grown(self, least: "Holding") -> str:
        """What this holds beyond `least` (the fewest seen), in words, or "" if it holds no more."""
        if len(self.fds) <= len(least.fds) and self.threads <= least.threads:
            return ""
        new = {n: what for n, what in self.fds.items() if least.fds.get(n) != what}
        return (f"{len(self.fds)} descriptors and {self.threads} threads, the fewest seen {len(least.fds)} and "
                f"{least.threads}; descriptors not held then: {new}")

    def fewer(self, other: "Holding") -> "Holding":
        """The fewest of each, descriptors and threads, of this and `other` (each count on its own:
        fewer descriptors with more threads must not raise the threads' bound)."""
        fds = self.fds if len(self.fds) <= len(other.fds) else other.fds
        return Holding(fds, min(self.threads, other.threads))


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
                    base = {"rss": rss_mb(), "held": Holding.now(), "t": now - started,
                            "kids": {p.pid: rss_mb(p.pid) for p in kids}}
                    least = base["held"]
                continue
            rss = rss_mb()
            samples.append((now - started, rss))
            assert abs(rss - base["rss"]) <= RSS_SLACK_MB, \
                f"trainer RSS {rss:.1f} MB drifted from {base['rss']:.1f} MB after {now - started:.0f} s"
            held = Holding.now()
            assert not held.grown(least), f"after {now - started:.0f} s: {held.grown(least)}"
            least = held.fewer(least)
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
              f"fds/threads {len(base['held'].fds)}/{base['held'].threads} -> {len(least.fds)}/{least.threads} "
              f"(the fewest seen); children RSS drift (MB, coordinator then workers): {kid_drift}")
    with capsys.disabled():
        print("\n" + report)


def test_heal_soak(posdata, capsys):
    """Self-healing under fire: for SHMLOADER_HEAL_SOAK_S seconds (default 600) a random child is
    killed every 1-4 s (SIGKILL; one in five is SIGSTOPped instead, a stall the loader kills
    after `stall_s`), while the trainer reads as fast as it can. Every batch is checked by
    arithmetic (no token lost or repeated). After each heal: the trainer's RSS is what it was
    after the first one; its open file descriptors and threads are no more than the fewest seen
    after a heal (`Holding`); /dev/shm and the set of children are the new run's. Prints the
    heals, the longest next() around a heal and the tokens checked.

    `SHMLOADER_HEAL_SOAK_S=600 python -m pytest -m slow tests/loader/test_soak.py -k heal -s`"""
    import random
    import signal

    duration = float(os.environ.get("SHMLOADER_HEAL_SOAK_S", "600"))
    rng = random.Random(21)
    train = [r for r in posdata.layout if r[0] < len(posdata.paths) - 1]
    P = train[-1][3] + train[-1][4] + 1
    is_bos = np.zeros(P, dtype=bool)
    is_bos[[r[3] for r in train]] = True
    offsets = np.arange(W)
    batches, started, faults, stops = 0, time.monotonic(), 0, 0
    next_fault = started + rng.uniform(1, 4)
    heals_seen, base, stalls, longest = 0, None, [], 0.0
    with posdata.loader(B, T, "train", num_workers=WORKERS, timeout=30, max_restarts=1_000_000,
                        stall_s=1.0) as loader:
        while time.monotonic() - started < duration:
            call = time.monotonic()
            x, y = next(loader)
            took = time.monotonic() - call
            window = np.concatenate([x.reshape(-1)[:1].numpy(), y.reshape(-1).numpy()])
            expect = (batches * W + offsets) % P
            tokens = window != 0
            if not (np.array_equal(window[tokens], expect[tokens]) and is_bos[expect[~tokens]].all()):
                pytest.fail(f"batch {batches} is not the stream after {faults} faults: {window[:12]} ... "
                            f"expected {expect[:12]} ...")
            batches += 1
            longest = max(longest, took)
            heals = loader.stats()["heals"]
            if heals > heals_seen:  # a heal happened inside this next()
                heals_seen = heals
                stalls.append(took)
                procs = loader.debug()
                kids = [procs.coordinator, *procs.workers]
                assert sorted(loader_children()) == sorted(p.pid for p in kids), "stray child processes"
                assert shm_segments() == [procs.segment], f"segments of this process: {shm_segments()}"
                del procs, kids  # a Debug keeps its ring (and its fd) alive: after a restart, the old one
                held = Holding.now()
                if base is None:
                    base = {"rss": rss_mb(), "held": held}
                    least = held
                else:
                    assert not held.grown(least), f"after {heals} heals: {held.grown(least)}"
                    least = held.fewer(least)
                    assert abs(rss_mb() - base["rss"]) <= RSS_SLACK_MB, f"RSS {rss_mb():.1f} MB, {base['rss']:.1f} first"
            if time.monotonic() >= next_fault and faults == heals_seen and batches > 50:
                d = loader.debug()
                victim = rng.choice([d.coordinator, *d.workers])
                stop = rng.random() < 0.2
                os.kill(victim.pid, signal.SIGSTOP if stop else signal.SIGKILL)
                del d, victim  # (see above: the ring of a run about to be replaced)
                faults, stops = faults + 1, stops + stop
                next_fault = time.monotonic() + rng.uniform(1, 4)
        stats = loader.stats()
    took = time.monotonic() - started
    assert base is not None and heals_seen >= 2, "the soak was too short to heal twice"
    stalls.sort()
    report = (f"heal soak: {took:.0f} s, {faults} faults ({stops} SIGSTOP, the rest SIGKILL), {stats['heals']} heals; "
              f"{batches} batches checked ({batches * W / 1e6:.1f}M tokens), none lost or repeated; next() around a "
              f"heal: median {stalls[len(stalls) // 2] * 1e3:.0f} ms, longest {stalls[-1] * 1e3:.0f} ms (SIGSTOP: "
              f"after stall_s=1 s); trainer RSS {base['rss']:.1f} -> {rss_mb():.1f} MB; fds/threads "
              f"{len(base['held'].fds)}/{base['held'].threads} -> {len(least.fds)}/{least.threads} (the fewest seen)")
    with capsys.disabled():
        print("\n" + report)
