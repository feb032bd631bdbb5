"""The mixing rule (shmloader/data/mixture.py), pure: shares by token weight on documents of
several shapes, schedules, sources that end, the state and a resume with other weights, and
the errors for bad input."""
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader.data.mixture import Choice, Mixer, Mixture, Totals

B, T = 8, 256
SOURCES = {"web": "/data/web", "code": "/data/code", "math": "/data/math"}


def lengths(shape: str, seed: int):
    """An endless stream of document lengths in tokens (BOS included), of one shape."""
    rng = random.Random(seed)
    while True:
        if shape == "uniform":          # the demo corpus: short documents of similar size
            yield rng.randint(20, 400)
        elif shape == "heavy":          # web text: lognormal, a few long documents
            yield 1 + min(int(rng.lognormvariate(5.5, 1.2)), 8000)
        elif shape == "skewed":         # empty documents (BOS alone) beside long ones
            yield 1 if rng.random() < 0.3 else rng.choice([rng.randint(2, 50), rng.randint(1000, 4000)])


def run(mixer: Mixer, streams: dict, tokens: int, batch0: int = 0, n0: int = 0, log=None):
    """Take documents until `tokens` more tokens are taken (the stream's batch is the token
    count // (B*T), from `n0`): the tokens per source, and the (n, source, length) of each."""
    took = dict.fromkeys(streams, 0)
    n = n0
    while n - n0 < tokens:
        choice = mixer.choose(batch0 + n // (B * T), lambda name: streams[name].peek())
        length = streams[choice.source].pop()
        mixer.took(choice.source, length)
        took[choice.source] += length
        n += length
        if log is not None:
            log.append((n, choice, length))
    return took, n


class Ahead:
    """A stream of lengths with its next one seen before it is taken."""

    def __init__(self, it):
        self.it, self.next = it, None

    def pop(self) -> int:
        value = self.peek()
        self.next = None
        return value

    def peek(self) -> int:
        if self.next is None:
            self.next = next(self.it)
        return self.next


def shapes(seed=0):
    return {"web": Ahead(lengths("heavy", seed)), "code": Ahead(lengths("skewed", seed + 1)),
            "math": Ahead(lengths("uniform", seed + 2))}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shares_follow_the_weights_at_every_point(seed):
    """120 batches of B=8, T=256: every share within 0.02 of its weight at the end, and after
    every document each source within k longest documents of its share."""
    weights = {"web": 0.6, "code": 0.3, "math": 0.1}
    mixer = Mixer(Mixture(SOURCES, weights))
    log = []
    took, n = run(mixer, shapes(seed), 120 * B * T, log=log)
    assert n >= 120 * B * T and len(log) > 300
    for name, w in weights.items():
        assert abs(took[name] / n - w) < 0.02, (name, took[name] / n, w)
    longest = max(length for _, _, length in log)
    counted = dict.fromkeys(weights, 0)
    for n_after, choice, length in log:
        counted[choice.source] += length
        for name, w in weights.items():
            assert abs(counted[name] - w * n_after) <= 3 * longest, (name, n_after)


def test_a_hand_worked_mix():
    """a and b weigh the same, a's documents are 10 tokens and b's 5. Before the first, a would
    be 5 over its share after its document and b 2.5: b. Then a 2.5 over, b 5: a. Then a
    7.5, b 0: b; ... so b, a, b, b, a, b, b, a, b."""
    mixer = Mixer(Mixture({"b": 0, "a": 0}, {"a": 1, "b": 1}))
    got = []
    for _ in range(9):
        source = mixer.choose(0, {"a": 10, "b": 5}.get).source
        mixer.took(source, {"a": 10, "b": 5}[source])
        got.append(source)
    assert got == list("babbabbab")
    assert mixer.totals == {"a": Totals(30, 3, 1), "b": Totals(30, 6, 1)}


def test_the_order_sources_are_written_in_changes_nothing():
    one = Mixture({"web": 1, "code": 2, "math": 3}, {"web": 1, "code": 2, "math": 3})
    two = Mixture({"math": 3, "code": 2, "web": 1}, {"math": 3, "web": 1, "code": 2})
    assert one.digest == two.digest
    logs = []
    for mixture in (one, two):
        logs.append([])
        run(Mixer(mixture), shapes(5), 50_000, log=logs[-1])
    assert logs[0] == logs[1]


def test_weights_need_not_sum_to_one_and_zero_pauses():
    mixer = Mixer(Mixture(SOURCES, {"web": 3, "code": 1, "math": 0}))
    took, n = run(mixer, shapes(3), 100_000)
    assert took["math"] == 0
    assert abs(took["web"] / n - 0.75) < 0.02 and abs(took["code"] / n - 0.25) < 0.02


def test_a_schedule_follows_each_stage_and_says_when_one_starts():
    schedule = [(0, {"web": 0.8, "code": 0.2}), (40, {"web": 0.2, "math": 0.8}), (80, {"web": 0.5, "code": 0.25,
                                                                                      "math": 0.25})]
    mixture = Mixture(SOURCES, schedule)
    mixer = Mixer(mixture)
    log = []
    run(mixer, shapes(7), 120 * B * T, log=log)
    started = [(n, c.started) for n, c, _ in log if c.started is not None]
    assert [s.first_batch for _, s in started] == [40, 80]
    for first, weights in schedule:
        last = next((s.first_batch for s in mixture.stages if s.first_batch > first), 10**9)
        inside = [(c.source, length) for n, c, length in log if first <= (n - length) // (B * T) < last]
        total = sum(length for _, length in inside)
        assert total > 30 * B * T
        for name in SOURCES:
            share = sum(length for s, length in inside if s == name) / total
            assert abs(share - weights.get(name, 0)) < 0.03, (first, name, share)


def test_a_source_that_ends_gives_its_share_to_the_rest_once():
    mixer = Mixer(Mixture(SOURCES, {"web": 0.5, "code": 0.25, "math": 0.25}, max_epochs={"math": 2}))
    run(mixer, shapes(1), 20_000)
    note = mixer.end("math")
    assert "'math'" in note and "2 epoch" in note and "web 0.667" in note and "code 0.333" in note
    assert mixer.end("math") is None
    took, n = run(mixer, shapes(2), 60_000)
    assert took["math"] == 0 and abs(took["web"] / n - 2 / 3) < 0.02
    assert mixer.over() is None
    mixer.end("code")
    assert mixer.end("web") is None and mixer.shares() == {}  # no rest to give it to: the mixer is over
    assert "stage 0 (from batch 0) has ended (code, math, web: max_epochs); nothing is left" in mixer.over()


def test_the_state_of_a_mixer_that_is_over_resumes_over():
    """Nothing is refused at a resume after the end (best fit still places its buffer then):
    the mixer is over again, with the same words, and goes on where it was with other weights."""
    mixture = Mixture(SOURCES, {"web": 0.5, "math": 0.5}, max_epochs={"web": 1, "math": 1})
    mixer = Mixer(mixture)
    run(mixer, shapes(1), 5_000)
    mixer.end("web")
    mixer.end("math")
    state = json.loads(json.dumps(mixer.state()))
    again = Mixer.resume(mixture, state, 40)
    assert again.notes == () and again.mixer.over() == mixer.over() is not None
    assert again.mixer.state() == mixer.state()
    longer = Mixture(SOURCES, {"web": 0.5, "math": 0.5}, max_epochs={"web": 1, "math": 2})
    goes_on = Mixer.resume(longer, state, 40)
    assert goes_on.mixer.over() is None and goes_on.mixer.shares() == {"math": 1.0}
    assert any("'math' had ended" in n for n in goes_on.notes)


def test_a_state_resumes_exactly():
    mixture = Mixture(SOURCES, [(0, {"web": 0.5, "code": 0.5}), (30, {"web": 0.1, "code": 0.3, "math": 0.6})])
    for stop in (5_000, 30 * B * T - 1, 30 * B * T, 61_003):
        whole, part = Mixer(mixture), Mixer(mixture)
        streams_whole, streams_part = shapes(11), shapes(11)
        whole_log, part_log = [], []
        _, n = run(whole, streams_whole, stop, log=whole_log)
        run(whole, streams_whole, 50_000, n0=n, log=whole_log)
        _, n = run(part, streams_part, stop, log=part_log)
        state = json.loads(json.dumps(part.state()))
        resumed = Mixer.resume(mixture, state, n // (B * T))
        assert resumed.notes == ()
        run(resumed.mixer, streams_part, 50_000, n0=n, log=part_log)
        assert [(n, c.source, length) for n, c, length in part_log] == \
               [(n, c.source, length) for n, c, length in whole_log]
        assert resumed.mixer.totals == whole.totals


def test_new_weights_at_a_resume_apply_from_there_and_every_source_goes_on():
    before = Mixture(SOURCES, {"web": 0.7, "code": 0.2, "math": 0.1})
    after = Mixture(SOURCES, {"web": 0.2, "code": 0.2, "math": 0.6})
    mixer = Mixer(before)
    streams = shapes(4)
    _, n = run(mixer, streams, 60 * B * T)
    totals = dict(mixer.totals)
    resumed = Mixer.resume(after, mixer.state(), n // (B * T))
    assert any("weights differ" in note for note in resumed.notes)
    assert resumed.mixer.totals == totals
    took, m = run(resumed.mixer, streams, 60 * B * T, n0=n)
    for name, w in after.stages[0].weights.items():
        assert abs(took[name] / (m - n) - w) < 0.03, (name, took[name] / (m - n))
    docs = lambda totals: sum(Totals(*t).documents for t in totals.values())  # noqa: E731
    assert docs(resumed.mixer.totals) > docs(totals)


def test_a_removed_source_is_kept_and_continues_when_it_comes_back():
    three = Mixture(SOURCES, {"web": 1, "code": 1, "math": 1})
    two = Mixture({"web": 1, "code": 1}, {"web": 1, "code": 1})
    mixer = Mixer(three)
    _, n = run(mixer, shapes(8), 30_000)
    math_then = mixer.totals["math"]
    dropped = Mixer.resume(two, mixer.state(), n // (B * T))
    assert any("'math' of the state is not in this mixture" in note for note in dropped.notes)
    _, n = run(dropped.mixer, {"web": Ahead(lengths("heavy", 1)), "code": Ahead(lengths("uniform", 2))}, 30_000, n0=n)
    back = Mixer.resume(three, json.loads(json.dumps(dropped.mixer.state())), n // (B * T))
    assert back.mixer.totals["math"] == math_then
    added = Mixer.resume(three, Mixer(two).state(), 0)
    assert any("'math' is new to the state" in note for note in added.notes)


def test_a_malformed_state_is_refused():
    mixture = Mixture(SOURCES, {"web": 1})
    with pytest.raises(ValueError, match="mixture state is malformed"):
        Mixer.resume(mixture, {"mixture": mixture.digest}, 0)


@pytest.mark.parametrize("sources, weights, max_epochs, message", [
    ({}, {"a": 1}, None, "non-empty mapping"),
    ({"": 1}, {"": 1}, None, "non-empty string"),
    (SOURCES, {"web": 1, "books": 1}, None, "stage 0 weighs 'books', not among the sources"),
    (SOURCES, {"web": -1}, None, "source 'web' has weight -1 in stage 0"),
    (SOURCES, {"web": float("nan")}, None, "source 'web' has weight nan"),
    (SOURCES, {"web": True}, None, "source 'web' has weight True"),
    (SOURCES, {"web": 0, "code": 0}, None, "every weight of stage 0 .* is 0"),
    (SOURCES, [(5, {"web": 1})], None, "first stage starts at batch 5; it must start at 0"),
    (SOURCES, [(0, {"web": 1}), (10, {"code": 1}), (10, {"math": 1})], None, "stage 2 starts at batch 10, not after"),
    (SOURCES, [(0, {"web": 1}), (-3, {"code": 1})], None, "stage 1 starts at batch -3"),
    (SOURCES, [(0, {"web": 1}), (9, {"cod": 1})], None, "stage 1 weighs 'cod'"),
    (SOURCES, [], None, "weights must be"),
    (SOURCES, [(0, {"web": 1}), (9, "code")], None, r"stage 1 of the schedule must be \(first_batch"),
    (SOURCES, {"web": 1}, {"books": 2}, "max_epochs names 'books'"),
    (SOURCES, {"web": 1}, {"web": 0}, "max_epochs of source 'web' is 0"),
])
def test_bad_input_names_the_source_or_stage(sources, weights, max_epochs, message):
    with pytest.raises(ValueError, match=message):
        Mixture(sources, weights, max_epochs=max_epochs)


@settings(max_examples=300, deadline=None)
@given(weights=st.one_of(st.sampled_from([3, 5, 2, 4]).map(lambda k: [1] * k),
                         st.lists(st.sampled_from([0, 1, 1, 2, 3, 0.5, 1 / 3, 7.25]), min_size=1, max_size=5)),
       seed=st.integers(0, 2**32), sizes=st.lists(st.integers(1, 300), min_size=5, max_size=5),
       pool=st.sampled_from([[1, 2, 3], [1, 1, 2, 5, 64, 400, 401, 2049], list(range(1, 3000))]),
       big=st.sampled_from([3 * 10**15, 0, 10**12]), counted=st.lists(st.integers(0, 40), min_size=5, max_size=5),
       ended=st.integers(0, 4), limit=st.one_of(st.integers(1, 400), st.just(10**9)))
def test_picks_are_the_rule_a_document_at_a_time(weights, seed, sizes, pool, big, counted, ended, limit):
    """`Mixer.picks` (a block of documents in one call: one loop, three sources unrolled) picks
    what `pick` and `took` pick a document at a time, ties and all: equal weights and lengths,
    counts so large that floats round near ties either way, a paused source's and an ended
    one's counts in the stage's total, a block cut by its limit or by a source's last document."""
    rng = random.Random(seed)
    docs = [[rng.choice(pool) for _ in range(size)] for size in sizes]
    names = [f"s{i}" for i in range(len(weights))]
    if not any(weights):
        weights = [1] + weights[1:]
    mixer = Mixer(Mixture({n: n for n in names}, dict(zip(names, weights))))
    mixer.counted = {n: big + c for n, c in zip(names, counted)}
    if ended < len(names) - 1 and weights[ended] and sum(1 for w in weights if w) > 1:
        mixer.end(names[ended])
    order = list(mixer.shares())
    lengths = [docs[names.index(n)] for n in order]
    before = (dict(mixer.counted), dict(mixer.totals))
    fast = mixer.picks(lengths, limit)
    assert (mixer.counted, mixer.totals) == before  # the mixer is left as it was
    slow, at = [], dict.fromkeys(order, 0)
    while len(slow) < limit and all(at[n] < len(lengths[i]) for i, n in enumerate(order)):
        name = mixer.pick(sum(mixer.counted.values()), lambda n: lengths[order.index(n)][at[n]])
        mixer.took(name, lengths[order.index(name)][at[name]])
        at[name] += 1
        slow.append(order.index(name))
    assert fast == slow and fast
    assert mixer.picks([x if i else [] for i, x in enumerate(lengths)], limit) == []  # a source's next unknown


def test_a_choice_is_one_record():
    choice = Mixer(Mixture(SOURCES, {"code": 1})).choose(0, {"code": 7}.get)
    assert choice == Choice("code", None) and choice.source == "code"


def test_ties_go_to_the_first_name():
    mixer = Mixer(Mixture({"zeta": "/z", "alpha": "/a"}, {"zeta": 1, "alpha": 1}))
    got = []
    for _ in range(4):
        got.append(mixer.choose(0, lambda name: 10).source)
        mixer.took(got[-1], 10)
    assert got == ["alpha", "zeta", "alpha", "zeta"]


def test_numpy_numbers_are_numbers_and_weights_too_big_to_sum_are_refused():
    import numpy as np

    mixture = Mixture(SOURCES, [(np.int64(0), {"web": np.float32(0.5), "code": np.int64(2)})],
                      max_epochs={"math": np.int64(2)})
    assert mixture.stages[0].weights == {"code": 2.0, "math": 0.0, "web": 0.5} and mixture.max_epochs == {"math": 2}
    with pytest.raises(ValueError, match="sum to more than a float holds"):
        Mixture(SOURCES, {"web": 1e308, "code": 1e308})
