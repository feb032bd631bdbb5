"""Mixtures: several sources read by token weight, on a schedule; the mixing rule, pure.

A `Mixture` names its sources (each anything `data=` takes: a directory, a glob, a list of
files) and their weights: one `{name: weight}` for the whole run, or a schedule
`[(first_batch, {name: weight}), ...]` whose stages start at batch indices of the run, the
first at 0. Weights need not sum to one; a weight of 0 pauses a source, and so does leaving
it out of a stage (a warning where the stage before weighed it: a stage carries nothing over).
`max_epochs={name: n}` ends a source after its n-th epoch (its weight is then shared by the
rest); a source without it starts its next epoch alone when it runs out.

**The rule** (`Mixer`). Documents are taken one at a time. Within a *counting stage* (a
schedule's stage; or, after a resume with other weights, the part of a stage from the resume
on), let N be the tokens taken so far, t_s those taken from source s and L_s the length of
source s's next document. The next document comes from the source that would stand furthest
below its share after taking it: the largest `w_s * (N + L_s) - (t_s + L_s)`, over the sources
with a weight that have not ended, their weights normalised to sum to one; ties go to the
first name in sorted order, so the order the user wrote the sources in changes nothing. A
document counts all its tokens, its BOS included. Looking at L_s holds a long document back
until its source is that far behind: on documents of up to 8K tokens, 120 batches of B=8,
T=256 end 1.5x nearer their weights than with the deficit alone (`w_s * N - t_s`, Megatron's
rule for samples). A document is not split, so a share can stray by about one long document
over N: each source stays within k * L_max tokens of `w_s * N` after every document (k
sources); tests/unit/data/test_mixture.py checks both on three shapes of document lengths.

The rule sees token counts only, so the mixed stream depends on (sources, weights, rank,
world size) and on nothing else: not on the number of workers, not on timing. A packing
then packs the mixed stream as it packs one source's.

**Best fit counts what it delivers.** Best fit crops what does not fit a row and holds long
documents back in its buffer, and a source of long documents loses far more than one of short
ones (three sources of 67, 132 and 276 tokens a document on average, 120 batches at T=256:
shares 0.21, 0.53, 0.26 delivered for weights 0.3, 0.5, 0.2 when the mix counts what it takes).
So over best fit a document counts its length up to a row (T+1) when it is taken, and after
each batch the planner plans (`settle`) every source's count becomes the tokens of it placed in
rows in the counting stage so far: the documents taken next make up for what was cropped or is
still buffered (the same run: 0.30, 0.50, 0.20). It stays a function of the documents' lengths.

**State** (`Mixer.state`, plain JSON): the counting stage (the schedule's stage index and the
batch it began at: a stage's own first batch, or the resume that began it), the tokens counted
per source in it, every source's totals (tokens taken, or delivered over best fit; documents;
epoch) by name, the sources that ended, the digest of the mixture it ran under and the batch
since which it has (`since`: a resume with another mixture, or a change of world size, sets it).
`Mixer.resume` with the same mixture continues exactly; a mixer that was `over` (every source
with a weight in its stage ended) is over again: it refuses nothing, the stream that asks ends
there. With another (new weights or
schedule, sources added or removed), a new counting stage starts at the resume's batch
under the new mixture's weights there, every source keeps its totals, a removed source's
totals stay in the state (a later resume that brings it back continues them), and each
change is said once in words (`Resumed.notes`).

This module is the policy only (docs/design.md "Mixtures" says how a run is to use it).
"""
from __future__ import annotations

import json
import math
import numbers
import zlib
from typing import Callable, Mapping, NamedTuple, Sequence

from ..errors import warn


class Stage(NamedTuple):
    """A stage of the schedule: from batch `first_batch` on, `weights` by source name."""
    first_batch: int
    weights: Mapping[str, float]


class Totals(NamedTuple):
    """What a run took from one source: tokens (BOS included), documents, the epoch it is in."""
    tokens: int
    documents: int
    epoch: int


class Choice(NamedTuple):
    """The source of the next document; `started`, the schedule's stage that begins with it
    (None inside a stage), for a log line."""
    source: str
    started: Stage | None


class Resumed(NamedTuple):
    """A mixer made from a state, with what changed since that state, in words."""
    mixer: "Mixer"
    notes: tuple


class Mixture:
    """Sources by name, weighed by tokens, on a schedule (the module docstring says the rule).

    `sources`: `{name: data}`, `data` as `ShmLoader` takes it. `weights`: `{name: weight}`,
    or `[(first_batch, {name: weight}), ...]` with the first stage at batch 0 and stages in
    increasing order. `max_epochs`: `{name: epochs}` for the sources that end."""

    def __init__(self, sources: Mapping[str, object], weights, max_epochs: Mapping[str, int] | None = None):
        if not isinstance(sources, Mapping) or not sources:
            raise ValueError(f"Mixture: sources must be a non-empty mapping of name -> data, got {sources!r}")
        for name in sources:
            if not isinstance(name, str) or not name:
                raise ValueError(f"Mixture: a source's name must be a non-empty string, got {name!r}")
        self.sources = dict(sources)
        self.names = tuple(sorted(self.sources))
        self.stages = _stages(weights, self.names)
        self.max_epochs = _max_epochs(max_epochs or {}, self.names)
        self.digest = _digest(self.names, self.stages, self.max_epochs)

    def stage_at(self, batch: int) -> int:
        """The index of the stage that batch `batch` is in."""
        i = 0
        while i + 1 < len(self.stages) and self.stages[i + 1].first_batch <= batch:
            i += 1
        return i

    def __repr__(self) -> str:
        stages = [(s.first_batch, dict(s.weights)) for s in self.stages]
        return f"Mixture({list(self.names)}, stages={stages}, max_epochs={self.max_epochs})"


def _weight(source: str, stage: int, w) -> float:
    if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w < 0:
        raise ValueError(f"Mixture: source {source!r} has weight {w!r} in stage {stage}; a weight is a finite "
                         "number >= 0 (0 pauses the source)")
    return float(w)


def _stages(weights, names: tuple) -> tuple:
    if isinstance(weights, Mapping):
        weights = [(0, weights)]
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence) or not weights:
        raise ValueError("Mixture: weights must be {name: weight} or a schedule [(first_batch, {name: weight}), ...], "
                         f"got {weights!r}")
    stages = []
    for i, stage in enumerate(weights):
        if not (isinstance(stage, Sequence) and len(stage) == 2 and isinstance(stage[1], Mapping)):
            raise ValueError(f"Mixture: stage {i} of the schedule must be (first_batch, {{name: weight}}), got {stage!r}")
        first, given = stage
        if isinstance(first, bool) or not isinstance(first, numbers.Integral) or first < 0:
            raise ValueError(f"Mixture: stage {i} starts at batch {first!r}; a stage starts at a batch index (an int >= 0)")
        if i == 0 and first != 0:
            raise ValueError(f"Mixture: the schedule's first stage starts at batch {first}; it must start at 0")
        if stages and first <= stages[-1].first_batch:
            raise ValueError(f"Mixture: stage {i} starts at batch {first}, not after stage {i - 1} "
                             f"(batch {stages[-1].first_batch}); stages go in increasing order")
        unknown = sorted(map(str, set(given) - set(names)))
        if unknown:
            raise ValueError(f"Mixture: stage {i} weighs {', '.join(map(repr, unknown))}, not among the sources "
                             f"({', '.join(map(repr, names))})")
        w = {name: _weight(name, i, given.get(name, 0)) for name in names}
        if stages:
            _warn_unnamed(i, first, [name for name in names if name not in given and stages[-1].weights[name]])
        if not any(w.values()):
            raise ValueError(f"Mixture: every weight of stage {i} (from batch {first}) is 0; at least one source "
                             "needs a weight > 0")
        if not math.isfinite(sum(w.values())):
            raise ValueError(f"Mixture: the weights of stage {i} sum to more than a float holds; only their ratios "
                             "matter: give smaller ones")
        stages.append(Stage(int(first), w))
    return tuple(stages)


def _warn_unnamed(stage: int, first: int, unnamed: list) -> None:
    """A stage that leaves out sources the stage before it weighed weighs them 0, which a warning
    says: a stage does not carry the one before it (`(90_000, {"math": 0.4})` after
    `(0, {"web": 0.7, "math": 0.3})` pauses web from batch 90,000)."""
    if unnamed:
        warn(f"Mixture: stage {stage} (from batch {first}) names no weight for {', '.join(map(repr, unnamed))}, "
             f"weighed in stage {stage - 1}: weight 0, not read from batch {first} (a stage does not carry the "
             f"previous stage's weights); name them in stage {stage}, 0 to pause one")


def _max_epochs(given: Mapping, names: tuple) -> dict:
    unknown = sorted(map(str, set(given) - set(names)))
    if unknown:
        raise ValueError(f"Mixture: max_epochs names {', '.join(map(repr, unknown))}, not among the sources "
                         f"({', '.join(map(repr, names))})")
    for name, n in given.items():
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"Mixture: max_epochs of source {name!r} is {n!r}; it must be an int >= 1")
    return {name: int(given[name]) for name in names if name in given}


def picks(shares: Sequence[float], counted: Sequence[int], n: int, lengths: Sequence[Sequence[int]],
          limit: int) -> list:
    """The rule (`Mixer.pick`, then `Mixer.took`) a document at a time while every source's next
    document is known: the indices of the sources picked in turn. `shares[i]`, `counted[i]`:
    source i's normalised weight and tokens counted in the stage (in the mixer's sorted order:
    ties go to the lower index), `n` the tokens counted in the stage by every source,
    `lengths[i]` the lengths of source i's next documents as the rule counts them. Stops after
    `limit` picks, or after the pick that takes a source's last document in `lengths` (the next
    pick would need the one after it).

    One tight loop over plain lists, the same float arithmetic as `pick` in the same order, so
    the same picks, ties included (a property test checks it: tests/unit/data/test_mixture.py):
    about 0.35 µs a document with three sources on the 2-core machine of docs/benchmarks.md,
    against 5-10 µs for `pick` called a document at a time with the runs made around it. (A
    merge of the sources' own keys, exact for equal shares and checked in float in whole-array
    calls, measured slower below blocks of some 2,000 documents: a block ends at the first
    source's piece used up, a few hundred documents.)"""
    if limit <= 0 or not shares or any(not len(x) for x in lengths):
        return []
    return _one_at_a_time(list(shares), list(counted), n, [x if type(x) is list else list(x) for x in lengths], limit)


def _one_at_a_time(w: list, c: list, n: int, lengths: list, limit: int) -> list:
    """`picks` by the rule's own arithmetic, a document at a time (three sources, the usual
    case, unrolled: about a third less a document)."""
    if len(w) == 3:
        return _three(w, c, n, lengths, limit)
    k, ends = len(w), [len(x) for x in lengths]
    at, nxt = [0] * k, [x[0] for x in lengths]
    out, rest = [], range(1, k)
    append = out.append
    for _ in range(limit):
        best, length = 0, nxt[0]
        behind = w[0] * (n + length) - c[0] - length
        for i in rest:
            li = nxt[i]
            b = w[i] * (n + li) - c[i] - li
            if b > behind:
                best, behind, length = i, b, li
        append(best)
        n += length
        c[best] += length
        j = at[best] + 1
        if j == ends[best]:
            break
        at[best], nxt[best] = j, lengths[best][j]
    return out


def _three(w: list, c: list, n: int, lengths: list, limit: int) -> list:
    """`_one_at_a_time` for three sources: the same comparisons in the same order (the first of
    equal ones wins: `>` against the one before it)."""
    (w0, w1, w2), (c0, c1, c2), (x0, x1, x2) = w, c, lengths
    e0, e1, e2 = len(x0), len(x1), len(x2)
    i0 = i1 = i2 = 0
    l0, l1, l2 = x0[0], x1[0], x2[0]
    out = []
    append = out.append
    for _ in range(limit):
        b0 = w0 * (n + l0) - c0 - l0
        b1 = w1 * (n + l1) - c1 - l1
        b2 = w2 * (n + l2) - c2 - l2
        if b1 > b0:
            if b2 > b1:
                best = 2
            else:
                best = 1
        elif b2 > b0:
            best = 2
        else:
            best = 0
        append(best)
        if best == 0:
            n += l0
            c0 += l0
            i0 += 1
            if i0 == e0:
                break
            l0 = x0[i0]
        elif best == 1:
            n += l1
            c1 += l1
            i1 += 1
            if i1 == e1:
                break
            l1 = x1[i1]
        else:
            n += l2
            c2 += l2
            i2 += 1
            if i2 == e2:
                break
            l2 = x2[i2]
    return out


def _digest(names, stages, max_epochs) -> str:
    text = json.dumps([list(names), [[s.first_batch, [s.weights[n] for n in names]] for s in stages], max_epochs],
                      sort_keys=True)
    return f"{zlib.crc32(text.encode()):08x}"


class Mixer:
    """The mixing rule over one run's documents: `choose` the next document's source, then
    `took` its tokens (the module docstring says the rule and its bound)."""

    def __init__(self, mixture: Mixture, batch: int = 0):
        self.mixture = mixture
        self.stage = mixture.stage_at(batch)
        self.stage_batch = batch                               # the batch this counting stage began at
        self.since = batch      # the batch from which this mixture has applied (None: a state that did not say)
        self.counted = {name: 0 for name in mixture.names}     # tokens per source in this counting stage
        self.totals = {name: (0, 0, 1) for name in mixture.names}  # Totals, as plain tuples
        self.ended = frozenset()  # replaced, never changed in place (snapshots share it)
        self.kept: dict = {}                                   # totals of sources this mixture leaves out
        self._settled = (dict(self.counted), dict.fromkeys(self.counted, 0))  # best fit: at the last `settle`
        self._shares = self._normalised()

    def _normalised(self) -> dict:
        """The stage's weights over the sources with a weight that have not ended, normalised to
        sum to one; empty once every one has ended (`over` says so)."""
        weights = self.mixture.stages[self.stage].weights
        live = {name: w for name, w in weights.items() if w > 0 and name not in self.ended}
        total = sum(live.values())
        return {name: w / total for name, w in live.items()}

    def over(self) -> str | None:
        """Why the mix can take no document (every source with a weight in the stage in force has
        ended), in words; None while one has not. The mixer refuses nothing: the stream that asks
        ends there (packing/mix.py), after what it holds (best fit's buffer is still placed)."""
        if self._shares:
            return None
        stage = self.mixture.stages[self.stage]
        with_weight = [name for name, w in stage.weights.items() if w > 0]
        return (f"mixture: every source with a weight in stage {self.stage} (from batch {stage.first_batch}) has "
                f"ended ({', '.join(with_weight)}: max_epochs); nothing is left to read")

    def shares(self) -> dict:
        """The weights in force, normalised over the sources that take part now."""
        return dict(self._shares)

    def enter(self, batch: int) -> Stage | None:
        """The next document lands in batch `batch`: the schedule's stage there begins now if
        it has not yet (returned, for a log line; None if it had). A stage whose every source
        with a weight has ended leaves the mixer `over`, and an over mixer enters no stage: the
        mix ended there, so a state saved while best fit places its buffer resumes over too."""
        stage = self.mixture.stage_at(batch)
        if stage == self.stage or not self._shares:
            return None
        # the stage's own first batch, not `batch`: the same whenever the stage is entered (best fit
        # enters it when asked who the mix waits for, at any time before its first pick)
        self.stage, self.stage_batch = stage, self.mixture.stages[stage].first_batch
        self.counted = dict.fromkeys(self.counted, 0)
        self._settled = (dict(self.counted), self._settled[1])
        self._shares = self._normalised()
        return self.mixture.stages[stage]

    def choose(self, batch: int, next_length: Callable[[str], int]) -> Choice:
        """The source of the next document, whose first token lands in batch `batch`;
        `next_length(name)`: the length of that source's next document, asked of the sources
        taking part only."""
        started = self.enter(batch)
        return Choice(self.pick(sum(self.counted.values()), next_length), started)

    def pick(self, n: int, next_length: Callable[[str], int]) -> str | None:
        """The rule in the stage in force, `n` the tokens counted in it (`choose` without the
        stage; the reference of `picks`)."""
        counted, best, behind = self.counted, None, -math.inf
        for name, w in self._shares.items():   # in sorted order: ties go to the first name
            length = next_length(name)
            b = w * (n + length) - counted[name] - length
            if b > behind:
                best, behind = name, b
        return best

    def picks(self, lengths: Sequence[Sequence[int]], limit: int) -> list:
        """The rule's next picks in the stage in force, `pick` and `took` a document at a time
        without calling either (packing/mix.py decides a block of documents at once): indices
        into `shares()`'s sources, `lengths[i]` the lengths of source i's next documents as the
        rule counts them. The mixer is left as it was (the caller says what was `took`)."""
        names = list(self._shares)
        return picks([self._shares[n] for n in names], [self.counted[n] for n in names],
                     sum(self.counted.values()), lengths, limit)

    def took(self, source: str, tokens: int, epoch: int | None = None, documents: int = 1) -> None:
        """A document of `tokens` tokens (BOS included) from `source`, of its epoch `epoch`; or
        `documents` of them, `tokens` in all."""
        self.counted[source] += tokens
        t = self.totals[source]  # (tokens, documents, epoch): a plain tuple, once per document
        self.totals[source] = (t[0] + tokens, t[1] + documents, t[2] if epoch is None else epoch)

    def settle(self, placed: Mapping[str, int]) -> None:
        """Best fit, after each batch it plans: `placed[name]`, the tokens of each source placed in
        the batch's rows. Every source's count in the counting stage becomes the tokens it has
        delivered in it, and its totals' tokens those it has delivered in all: what a document
        counted when it entered the buffer (its length up to a row) is dropped, so that the tokens
        cropped and those still buffered are made up for by the documents that enter next."""
        stage, totals = self._settled
        for name in self.counted:
            stage[name] = self.counted[name] = stage.get(name, 0) + placed.get(name, 0)
            t = self.totals[name]
            totals[name] = totals.get(name, 0) + placed.get(name, 0)
            self.totals[name] = (totals[name], t[1], t[2])

    def snapshot(self) -> tuple:
        """The mixer's counts now, cheaply (a few dict copies; `state_of_snapshot` makes the state)."""
        return self.stage, self.stage_batch, self.counted.copy(), self.totals.copy(), self.ended, self

    def end(self, source: str) -> str | None:
        """`source` has read its `max_epochs`: its weight goes to the rest. The words to say
        once (None if it had ended already, or if no rest is left: `over` says that)."""
        if source in self.ended:
            return None
        before = self._shares.get(source, 0.0)
        self.ended = self.ended | {source}
        self._shares = self._normalised()
        if not self._shares:
            return None
        return (f"mixture: source {source!r} has read its {self.mixture.max_epochs.get(source, '?')} epoch(s) "
                f"(max_epochs); its share of {before:.3g} goes to the others: "
                + ", ".join(f"{n} {w:.3g}" for n, w in self._shares.items()))

    def state(self) -> dict:
        """Plain JSON: the counting stage, its counts, every source's totals, those that ended."""
        return self.state_of_snapshot(self.snapshot())

    @staticmethod
    def state_of_snapshot(snapshot: tuple) -> dict:
        """The state (`state`) of a `snapshot` (of the mixer it names)."""
        stage, stage_batch, counted, totals, ended, self = snapshot
        totals = {name: list(t) for name, t in {**self.kept, **totals}.items()}
        return {"mixture": self.mixture.digest, "stage": stage, "stage_batch": stage_batch, "since": self.since,
                "counted": dict(counted), "totals": dict(sorted(totals.items())), "ended": sorted(ended)}

    @classmethod
    def resume(cls, mixture: Mixture, state: Mapping, batch: int) -> Resumed:
        """The mixer after `state`, at batch `batch`, under `mixture` (the state's or another). A
        state after the mix ended gives a mixer that is `over`: a run from it places what best
        fit's buffer still holds, then ends as the run it was saved from did."""
        try:
            digest, stage, stage_batch = state["mixture"], int(state["stage"]), int(state["stage_batch"])
            counted, saved = dict(state["counted"]), {n: Totals(*map(int, t)) for n, t in state["totals"].items()}
            ended = set(state["ended"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"mixture state is malformed ({type(e).__name__}: {e}): {state!r}") from None
        mixer = cls(mixture, batch)
        notes = []
        mixer.totals.update({n: t for n, t in saved.items() if n in mixer.totals})
        mixer.kept = {n: t for n, t in saved.items() if n not in mixer.totals}
        for name in sorted(ended & set(mixture.names)):
            if saved[name].epoch >= mixture.max_epochs.get(name, math.inf):
                mixer.ended = mixer.ended | {name}
            else:
                notes.append(f"mixture: source {name!r} had ended; this mixture's max_epochs lets it go on "
                             f"(epoch {saved[name].epoch + 1} on)")
        for name in mixer.kept:
            notes.append(f"mixture: source {name!r} of the state is not in this mixture; it is not read, and its "
                         f"place is kept in the state ({mixer.kept[name].tokens} tokens taken) for a resume that "
                         "brings it back")
        for name in mixture.names:
            if name not in saved:
                notes.append(f"mixture: source {name!r} is new to the state; it is read from its start")
        if digest == mixture.digest:
            if stage_batch > batch or set(counted) != set(mixture.names):
                raise ValueError(f"mixture state is inconsistent: its counting stage began at batch {stage_batch}, "
                                 f"after batch {batch}, or counts {sorted(counted)} for sources {list(mixture.names)}")
            mixer.stage, mixer.stage_batch = stage, stage_batch
            mixer.counted = {n: int(counted[n]) for n in mixture.names}
            since = state.get("since")
            mixer.since = int(since) if since is not None else None
        else:
            notes.append(f"mixture: the weights differ from the state's; from batch {batch} the mix follows "
                         f"{ {n: round(w, 4) for n, w in mixture.stages[mixer.stage].weights.items()} } "
                         f"(stage {mixer.stage}), every source going on from where it stood")
        mixer._settled = (dict(mixer.counted), {n: t[0] for n, t in mixer.totals.items()})  # a state is settled
        mixer._shares = mixer._normalised()
        return Resumed(mixer, tuple(notes))
