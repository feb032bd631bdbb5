"""packing/mixtext.py: a packed point's text and crc are `point_text`'s, character for character,
whatever the point (names that json escapes, skips, a mixer with a `since` of None, ended
sources, left-out sources numbered on their own, counts of a resumed state that are not ints),
and what marshal cannot write goes as the text."""
import json
import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shmloader.ipc import ring as ringmod
from shmloader.mixstate import slot_point
from shmloader.packing.mixruns import MixPoint
from shmloader.packing.mixtext import PACKED, Packed, packed, point_json, point_text
from shmloader.packing.runs import BufferText
from shmloader.position import Position

NAMES = st.sampled_from(["a", "b", "web", "code", "é", 'q"uote', "back\\slash", "tab\t", "\u2028", "日本"])
INTS = st.integers(min_value=0, max_value=2**63)


@st.composite
def points(draw):
    names = sorted(draw(st.sets(NAMES, min_size=1, max_size=4)))
    sources = {n: Position(draw(INTS), draw(INTS) + 7, draw(INTS), draw(INTS),
                           draw(st.one_of(st.just(0), INTS))) for n in draw(st.permutations(names))}
    count = st.one_of(INTS, st.floats(allow_nan=False, allow_infinity=False))  # a resumed state's own values
    mixer = {"mixture": draw(st.sampled_from(["34dff2af", "0000ffff"])), "stage": draw(INTS),
             "stage_batch": draw(INTS), "since": draw(st.one_of(st.none(), INTS)),
             "counted": {n: draw(count) for n in draw(st.permutations(names))},
             "totals": dict(sorted((n, [draw(INTS), draw(INTS), draw(INTS)]) for n in names)),
             "ended": sorted(draw(st.sets(st.sampled_from(names))))}
    return MixPoint(draw(st.sampled_from(names)), draw(INTS), sources, mixer)


@settings(max_examples=300, deadline=None)
@given(points())
def test_a_packed_point_is_its_text(point):
    lo = {n: 7 for n in sorted(point.sources)[::2]}   # some sources numbered from 7, the rest left out
    text = point_text(point, lo)
    assert text == json.dumps(point_json(point, lo), separators=(",", ":"), sort_keys=True)
    data, crc = packed(point, lo)
    assert crc == PACKED
    assert (Packed(data).text, Packed(data).crc) == (text, zlib.crc32(text.encode()))


def test_what_marshal_cannot_write_goes_as_text():
    point = MixPoint("a", 3, {"a": Position(1, 0, 2, 5)},
                     {"mixture": "x", "stage": 0, "stage_batch": 0, "since": 0, "counted": {"a": np.int64(1)},
                      "totals": {"a": [1, 2, 1]}, "ended": []})
    try:
        text = point_text(point, {})
    except TypeError:  # json cannot write it either: the coordinator raises, as before
        return
    assert packed(point, {}) == (text, zlib.crc32(text.encode()))


def test_the_slot_carries_either():
    layout = ringmod.RingLayout(2, 9, 1, max_runs=8)
    ring = ringmod.Ring(bytearray(layout.nbytes), layout, "x")
    point = MixPoint("a", 0, {"a": Position(1, 3, 0, 1)},
                     {"mixture": "x", "stage": 0, "stage_batch": 0, "since": 0, "counted": {"a": 1},
                      "totals": {"a": [1, 1, 1]}, "ended": []})
    ring.write_buffer(0, *packed(point, {"a": 2}))
    ring.write_buffer(1, "{}", 5)
    got = slot_point(ring, 0)
    assert type(got) is Packed and got.text == point_text(point, {"a": 2})
    assert slot_point(ring, 1) == BufferText("{}", 5)


@settings(max_examples=200, deadline=None)
@given(points(), st.lists(st.lists(st.integers(min_value=0, max_value=2**40), min_size=6, max_size=6), max_size=30),
       st.integers(min_value=0, max_value=2))
def test_a_packed_best_fit_point_is_its_text_with_its_buffer(point, runs, wide):
    """Best fit's packed point and buffer: `Packed.text` is `buffer_text`'s, character for
    character, whatever the runs' width (none, u1 ... u8)."""
    from shmloader.packing.mixbestfit import MixBuffer, buffer_text, packed_buffer

    runs = np.array(runs, dtype=np.int64).reshape(-1, 6) >> (np.int64(8) * (2 - wide) * 2)
    lo = {n: 7 for n in sorted(point.sources)[::2]}
    where = MixBuffer(point, runs)
    text = buffer_text(where, lo)
    assert json.loads(text)["buffer"]["runs"].startswith(("u1:", "u2:", "u4:", "u8:") if len(runs) else "")
    data, crc = packed_buffer(where, lo)
    assert crc == PACKED
    assert (Packed(data).text, Packed(data).crc) == (text, zlib.crc32(text.encode()))
