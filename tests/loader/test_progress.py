"""Progress of the replays a resume runs before its first batch (shmloader/progress.py), as a
user sees it: Python's default logging (WARNING), the loader given another world size's or
another rank's state. The tokenizer takes 40 ms a document, so each replay runs for seconds,
as a large run's does for minutes.

- At a change of world size, the new world's rank 0 says, at the default level, whose stream
  it replays, how far it is, the rate and the time left, then that it is done and where the
  old rank stood; other ranks keep those lines at INFO.
- Another rank's state (same world size): the rank says it is finding its own place; given
  rank 0's state (nanochat's way), rank 1 is the one that shows it at the default level.
"""
import itertools
import json
import logging
import re

import pytest

import shmloader
from tests import helpers

pytestmark = pytest.mark.usefixtures("watchdog")
B, T, BATCHES = 2, 16, 40
SECONDS_PER_DOC = 0.04
# every form `progress.duration` writes ('0.4 s', '45 s', '1 min 04 s', '2 h 05 min'): on a loaded
# machine a replay's time left runs past a minute
DURATION = r"(?:[\d.]+ s|\d+ min \d\d s|\d+ h \d\d min)"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("progress")
    helpers.position_shards(root, helpers.position_lengths(seed=11, n=400, files=4), num_files=4, rg=6)
    return root


def loader(root, packing, rank, world, **kw):
    return shmloader.ShmLoader(str(root), helpers.SlowTokenizer(SECONDS_PER_DOC), B, T, packing=packing,
                               device="cpu", rank=rank, world_size=world, num_workers=2, timeout=60,
                               buffer_size=12, tokenizer_batch_size=4, **kw)


@pytest.fixture(scope="module")
def saved(data):
    """Rank 0 of 2's state after 40 batches, per packing."""
    out = {}
    for packing in ("concat", "bos_bestfit"):
        with loader(data, packing, 0, 2) as ld:
            for _ in itertools.islice(ld, BATCHES):
                pass
            out[packing] = json.loads(json.dumps(ld.state_dict()))
    return out


def lines(caplog, level) -> list:
    return [r.getMessage() for r in caplog.records if r.name == "shmloader" and r.levelno == level]


@pytest.mark.parametrize("packing", ["concat", "bos_bestfit"])
def test_an_elastic_replay_shows_its_progress_and_time_left_at_the_default_level(data, saved, packing, caplog):
    caplog.set_level(logging.WARNING, logger="shmloader")  # Python's default level
    with loader(data, packing, 0, 3, resume_state=saved[packing]) as ld:
        next(iter(ld))
    said = lines(caplog, logging.WARNING)
    label = "rank 0 of 3 (new): replaying old rank 1 of 2's stream to batch 40"
    going = [s for s in said if s.startswith(label + ": ") and " left" in s]
    timed = []  # the lines that say the rate and the time left (one that could not yet, on a
    #             loaded machine where nothing was done in the first second, is followed by one)
    for s in going:
        m = re.fullmatch(re.escape(label) + r": (\d+) of 40 batches \((\d+)%\), ([\d.]+) batches/s, about "
                         + DURATION + r" left; ([\d,]+) documents counted", s)
        if m is None:
            assert re.fullmatch(re.escape(label) + r": 0 of 40 batches \(0%\), " + DURATION + " so far, the time left "
                                r"not known yet; [\d,]+ documents counted", s), s
            continue
        timed.append(s)
        done = int(m[1])
        assert 0 < done <= 40 and int(m[2]) == round(100 * done / 40) and float(m[3]) > 0
    assert timed, f"no progress line with the time left at WARNING: {said}"
    done = [s for s in said if s.startswith(label + ": done, 40 batches in ")]
    assert len(done) == 1 and ", row group " in done[0] and "counted: " in done[0]
    assert said.index(done[0]) > said.index(timed[-1])
    assert not any("1 new ranks" in s or "1 old ranks" in s for s in said)


def test_the_duration_pattern_matches_every_form_of_a_duration():
    """The pattern above accepts what `progress.duration` writes at every scale (it took only
    seconds, and a replay slowed by a loaded machine said 'about 1 min 04 s left')."""
    from shmloader.progress import duration
    for seconds in (0.4, 9.96, 45, 64, 3599, 7300):
        assert re.fullmatch(DURATION, duration(seconds)), duration(seconds)


def test_other_ranks_keep_their_progress_at_info(data, saved, caplog):
    caplog.set_level(logging.WARNING, logger="shmloader")
    with loader(data, "concat", 1, 3, resume_state=saved["concat"]) as ld:
        next(iter(ld))
    assert not any("replaying old rank" in s for s in lines(caplog, logging.WARNING))
    caplog.clear()
    caplog.set_level(logging.INFO, logger="shmloader")
    with loader(data, "concat", 2, 3, resume_state=saved["concat"]) as ld:
        next(iter(ld))
    info = [s for s in lines(caplog, logging.INFO) if s.startswith("rank 2 of 3 (new): replaying old rank 1 of 2's")]
    assert any(" left" in s for s in info) and any(": done, 40 batches in " in s for s in info), info


# INFO in the slow suite: the level rule is progress.log_emitter's (tests/unit/test_progress.py, every
# case), and test_other_ranks_keep_their_progress_at_info sees a replay's lines at INFO by default.
@pytest.mark.parametrize("shown", [logging.WARNING, pytest.param(logging.INFO, marks=pytest.mark.slow)])
def test_rank_1_given_rank_0s_state_shows_it_finds_its_place(data, saved, shown, caplog):
    caplog.set_level(shown, logger="shmloader")  # where INFO shows, the lines are at INFO
    with loader(data, "bos_bestfit", 1, 2, resume_state=saved["bos_bestfit"]) as ld:
        next(iter(ld))
    label = "rank 1 of 2: finding its place at batch 40 of another rank's state"
    said = [s for s in lines(caplog, shown) if s.startswith(label)]
    assert any(re.search(r": \d+ of 40 batches \(\d+%\), [\d.]+ batches/s, about [\d.]+ s left", s) for s in said), said
    assert any(s.startswith(label + ": done, 40 batches in ") for s in said)
