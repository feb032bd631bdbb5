"""Which worker gets the next piece: a row group's slices stay with the workers that read it.

Best fit cuts a row group into pieces of at most 2 MiB of text in whole 128-document chunks
(nanochat's 4.8 MB row groups: 3 pieces; 8 at 1 MiB, when this rule was made), and a worker
reads (decompresses and decodes) a piece's whole row group and keeps only the last one it read
(data/formats/parquet.py). Handed to whichever worker is least loaded, consecutive slices went
to both of two workers in turn, and each read every row group: 7.5% of a best-fit worker's
samples, against 2.7% for concat's whole row groups (docs/benchmarks.md "Best fit's workers
per CPU second").

The rule (`pick`), for the next piece, given every worker that may be given one:

1. a worker that may take a piece (`takes`: the mode's `can_take`) and has nothing in flight
   (idle), one that holds the piece's row group first: an idle worker never waits, unless
   the cores are all taken (`cores_busy`: more workers than the cores, and as many workers as
   the cores have pieces in flight), where an idle worker that does not hold the row group
   would not run before a core frees and would read the row group again: then rule 2 first;
2. else a worker that was given a piece of the same row group last (a *holder*) and may take
   it (`takes`), or may take the row group's next slice past the pair of pieces a worker
   otherwise holds (`continues`: the mode's `can_continue`, best fit's read-ahead cap and every
   other bound still kept), the least loaded of them;
3. else the least loaded worker that may take one (the rule before); else none.

So with every worker busy, a worker that starts a row group takes its slices as a unit (the
pieces it has queued hold the rest of its row group, like concat's whole row group), and the
next row group goes to the next worker that runs short. With more workers than the cores
(4 on 2) an idle worker is always there, so rule 1 alone gave each of a nanochat row group's
3 slices to another worker, and each read the row group whole: 105 row-group reads for 35 row
groups' tokens, ~1 a row group with the exception (docs/benchmarks.md "More workers than the
cores: each slice read its row group again"). Since the bound over the workers is of workers, not
pieces (packing/base.py `Mode.can_take`: at most as many workers as the cores have pieces in
flight), an idle worker may not take a piece while the cores are all taken, so the exception acts
only where a mode lets one take a piece past that bound (a mixture's pick that needs a source's
piece now). Which worker tokenizes a piece never changes the stream: the mode places counted
tokens from their lengths alone. Pure: no processes; a mode builds the `Worker` records
(packing/base.py `Mode.candidates`).
"""
from typing import NamedTuple


class Worker(NamedTuple):
    """What the rule knows of one worker that may be given a piece now."""
    index: int
    load: tuple | None   # the mode's `load`: (pieces given and not counted, tokens held), least
    #                      first; None for a worker that may not take a piece (never picked)
    takes: bool          # may take a piece (`Mode.can_take`)
    continues: bool      # may take the next slice of the row group it holds, past the pair rule
    holds: tuple | None  # the row group `(file, rg)` it was given a piece of last, or None


def pick(unit: tuple, workers: list, cores_busy: bool = False) -> int | None:
    """The worker to give the next piece, of row group `unit` `(file, rg)`, or None: no one may
    take it now (the rule in the module's docstring; `cores_busy`: as many workers as the cores
    have pieces in flight, and more workers than the cores)."""
    idle = [w for w in workers if w.takes and not w.load[0]]
    holders = [w for w in workers if w.holds == unit and (w.takes or w.continues)]
    if idle and not (cores_busy and holders and not any(w.holds == unit for w in idle)):
        return min(idle, key=lambda w: (w.holds != unit, *_least_loaded(w))).index
    for group in (holders, [w for w in workers if w.takes]):
        if group:
            return min(group, key=_least_loaded).index
    return None


def _least_loaded(worker: Worker) -> tuple:
    return worker.load, worker.index
