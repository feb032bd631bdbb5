"""What a loader says of itself: `stats()` and the log's lines (README "Seeing the pipeline").

`Report` keeps what `next()` delivered (batches, the seconds it blocked, its last wait) and two
intervals (observe.py): the caller's, read by each `stats()`, and the log's, read by its lines.
`stats(mark)` joins them with the run's counters in the ring's header (procs/run.py `Run.stats`)
and what the kind adds (kinds.py: a mixture's `sources`); no system call. With `log_every=N`
the first batch is said once, apart ("shmloader start-up", so that a slow start hides in no
interval), then one line every N batches over the batches since the last ("shmloader
interval"); both end with the loader they are of ("; loader <pid>-<n> (<split>[, rank r of
w])"), so that a training and a validation loader logging to one logger are told apart.
"""
import logging
import os
import time

from . import observe

log = logging.getLogger("shmloader")


class Report:
    def __init__(self, config, runs, kind):
        """`runs`: the loader's `procs.run.Runs`; `kind`: what it reads (kinds.py)."""
        self.config, self._runs, self._kind = config, runs, kind
        self.batches, self.wait_s, self.last_wait = 0, 0.0, 0.0
        self.name = "-"  # who the lines are of: `named` once the loader is registered
        start = observe.Reading(time.monotonic(), 0.0, 0)
        self._seen, self._logged, self._made = observe.Interval(start), observe.Interval(start), start.at
        self._sources_seen = None  # a mixture's sources at the caller's last stats() ("share_recent")

    def delivered(self, waited: float, mark):
        """`next()` returned a batch after blocking `waited` s; `mark`: the progress after it."""
        self.batches += 1
        self.wait_s += waited
        self.last_wait = waited
        every = self.config.log_every
        if every and self.batches == 1:
            self._log_start(mark)
        elif every and self.batches % every == 0:
            self._log(mark)

    def named(self, number: int, split: str, rank: int, world: int):
        """Who the log lines are of: the process and the loader's `number` in it, its split and rank
        (a training and a validation loader may log to one logger)."""
        ranks = f", rank {rank} of {world}" if world > 1 else ""
        self.name = f"{os.getpid()}-{number} ({split}{ranks})"

    def stats(self, mark) -> dict:
        """`stats()`: over the interval since the caller's previous call."""
        out = self._stats(mark, self._seen, self._sources_seen)
        self._sources_seen = out.get("sources")
        return out

    def _stats(self, mark, interval: observe.Interval, sources_seen) -> dict:
        c, runs = self.config, self._runs
        out = {"batches": self.batches, "wait_s": self.wait_s, "num_workers": c.num_workers,
               "epoch": mark.position.epoch, "tokens_delivered": self.batches * c.B * c.T,
               "docs_delivered": mark.docs, "idle_releases": runs.idle_releases, "heals": runs.heals,
               "head_batches": runs.head_batches, "poison_rows_skipped": runs.poison.rows_skipped,
               "ring_ready": 0, "ring_slots": c.n_slots, "workers": []}
        if runs.run is not None:
            read = runs.run.stats(c)
            out.update(read, epoch=max(out["epoch"], read["epoch"]))
        out.update(self._kind.stats(mark, sources_seen, out["epoch"]))
        workers = out["workers"]
        lately = interval.step(observe.Reading(time.monotonic(), self.wait_s, out["tokens_delivered"],
                                               tuple(w["pid"] for w in workers), tuple(w["busy_s"] for w in workers)))
        for w, share in zip(workers, lately.worker_busy):
            w["busy_share"] = share
        out.update(interval_s=lately.interval_s, wait_share=lately.wait_share, last_wait_s=self.last_wait,
                   delivered_tokens_per_s=lately.tokens_per_s, ready=out["ring_ready"])
        return out

    def _log_start(self, mark):
        """The start-up, once and apart (grep "shmloader start-up"): the log's intervals begin here."""
        s = self._stats(mark, self._logged, self._sources_seen)
        log.info("batch 1: shmloader start-up: the first batch came %.2f s after the loader was made (%.2f s of "
                 "it waited in next()), %d worker%s; the interval lines count from here; loader %s",
                 time.monotonic() - self._made, s["wait_s"], s["num_workers"], "s" if s["num_workers"] != 1 else "",
                 self.name)

    def _log(self, mark):
        """One line per `log_every` batches, over the batches since the last line (its own interval,
        not the caller's `stats()`'s; a mixture's share_recent stays the caller's): grep
        "shmloader interval"."""
        s = self._stats(mark, self._logged, self._sources_seen)
        busiest, idlest = observe.busiest_idlest(tuple(w["busy_share"] for w in s["workers"]))
        workers = (f", busiest worker {busiest[0]} {busiest[1]:.0%} busy, idlest worker {idlest[0]} "
                   f"{idlest[1]:.0%}" if busiest is not None else "")
        extra = f", cropped {s['cropped_fraction']:.1%}" if "cropped_fraction" in s else ""
        if s["workers"]:  # each worker's engine now, e.g. "engines fastokens | tokenizers, fast engine building"
            extra += f", engines {' | '.join(w.get('engine') or '-' for w in s['workers'])}"
        log.info("batch %d: shmloader interval %.1f s: %.0f tokens/s delivered, wait share %.1f%% "
                 "(last wait %.3f s), ring %d/%d ready%s; epoch %d, %.1f s waited in all%s; loader %s",
                 s["batches"], s["interval_s"], s["delivered_tokens_per_s"], 100 * s["wait_share"],
                 s["last_wait_s"], s["ready"], s["ring_slots"], workers, s["epoch"], s["wait_s"], extra, self.name)
