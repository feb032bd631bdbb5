"""A `MixPoint` as a state holds it: its JSON text, and the packed form a concat batch's slot
carries until a state asks for the text; pure.

The state's `mixture.point` is `point_text`: `point_json` as compact JSON, keys sorted (its
crc32 in the state's digest). A mixture's concat coordinator makes where the mix stands after
every batch, and the trainer needs that point's text only when a state is taken (or a heal, an
idle release, `stats()`): making the text and its crc took the coordinator some 10 µs a batch,
more than the rest of announcing it. So the slot carries the point `packed` instead (`marshal`
of its plain values, files already numbered within their sources: a quarter of that), its crc
field `PACKED`; the trainer copies the bytes out with the batch and keeps them as a `Packed`,
whose `text` and `crc` are json's of the same values, made when first asked. The text is the one
`point_text` makes from the point, character for character (tests/unit/packing/test_mixtext.py). A
point `marshal` cannot write (never, with the plain values a mixer keeps) goes as its text.

A mixture of one passing its pieces whole (packing/mixone.py) packs less: what its points share
(the source's name, the mixer's state at the run's start, the places of the sources it leaves
out) marshalled once (`passing_base`), and a batch's place and counts beside it
(`packed_passing`); `Packed.text` adds the counts to the state's as the mixer would have.

Best fit's slot carries its point with the buffer (`packed_with_buffer`): the same values, the
sources' names and the buffer's runs as `runs.narrow` makes them (their width and raw bytes), and
`Packed.text` is then `with_buffer_text`'s, the point's keys and `"buffer"`. Making that text (its
JSON, the runs' hex, ~12 KB with a 1,000-document buffer, and its crc) took the coordinator
~20 µs a batch; packing it ~3 µs. The trainer makes it when a state asks.
"""
from __future__ import annotations

import json
import marshal
import zlib

from .runs import BufferText

PACKED = -1  # a slot's crc field: its bytes are a packed point (a crc32 is never negative)


def point_json(point, lo: dict) -> dict:
    """A `MixPoint` (in the run's numbering of the files) as the state's JSON (`MixPoint.to_json`),
    files numbered within each source (`lo`: each source's first file in the run's numbering; a
    source left out keeps its own)."""
    return _json(point.source, point.skip, point.mixer, _places(point, lo))


def _places(point, lo: dict) -> list:
    """Each source's place `(name, epoch, file within it, rg, doc, skip)`, as `packed` holds them."""
    return [(n, p[0], p[1] - lo.get(n, 0), p[2], p[3], p[4]) for n, p in point.sources.items()]


def _json(source, skip, mixer, places) -> dict:
    """The state's JSON of a point's values (`_places`' places, in any order)."""
    places = sorted(places)
    out = {"source": source, "skip": skip, "mixer": mixer, "sources": {p[0]: list(p[1:5]) for p in places}}
    skips = {p[0]: p[5] for p in places if p[5]}
    if skips:
        out["skips"] = skips
    return out


def json_text(value) -> str:
    """The state's JSON text of `value`: compact, keys sorted."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def point_text(point, lo: dict, **more) -> str:
    """`point_json(point, lo)` and the keys `more`, as the state's text."""
    return json_text({**point_json(point, lo), **more})


def with_buffer_text(source, skip, mixer, places, names: list, width: str, raw: bytes) -> str:
    """The state's text of a best-fit point's values (`_places`' places) and its buffer: its runs
    `raw`, little-endian unsigned integers `width` bytes wide (`runs.narrow`), six values a run,
    as best fit's buffer text (`"u1:0a0b..."`, "" for none), and `names`, the sources its runs'
    first value indexes."""
    head = json_text({**_json(source, skip, mixer, places), "buffer": {"sources": names, "runs": ""}})
    # the runs' text (hex after a width) holds nothing JSON escapes: put in after, not scanned by json
    empty = '{"buffer":{"runs":""'  # the first key, sorted
    assert head.startswith(empty), head[:40]
    runs = f"{width}:{raw.hex()}" if raw else ""
    return f'{{"buffer":{{"runs":"{runs}"{head[len(empty):]}'


def point_with_buffer_text(point, lo: dict, names: list, width: str, raw: bytes) -> str:
    """`with_buffer_text` of a `MixPoint` (files in the run's numbering, `lo` as `point_json`'s)."""
    return with_buffer_text(point.source, point.skip, point.mixer, _places(point, lo), names, width, raw)


def packed_with_buffer(point, lo: dict, names: list, width: str, raw: bytes) -> tuple:
    """`(data, PACKED)`: a best-fit point and its buffer as a slot carries them (`Packed` reads
    them: `with_buffer_text`'s arguments), or `(text, crc)` where `marshal` cannot write them."""
    values = (point.source, point.skip, point.mixer, _places(point, lo), names, width, raw)
    try:
        return marshal.dumps(values), PACKED
    except ValueError:
        text = with_buffer_text(*values)
        return text, zlib.crc32(text.encode())


def packed(point, lo: dict) -> tuple:
    """`(data, PACKED)`: the point as a slot carries it (`Packed` reads it), or `(text, crc)`
    where `marshal` cannot write its values."""
    try:
        return marshal.dumps((point.source, point.skip, point.mixer, _places(point, lo))), PACKED
    except ValueError:
        text = point_text(point, lo)
        return text, zlib.crc32(text.encode())


def passing_base(name: str, state: dict, others: list, lo: int) -> bytes:
    """What every packed point of a pass-through (packing/mixone.py) shares, marshalled once: its
    source's name, the mixer's state at the run's start, the places of the sources it leaves out
    (`_places`' places) and its first file in the run's numbering."""
    return marshal.dumps((name, state, others, lo))


def packed_passing(base: bytes, skip: int, epoch: int, file: int, rg: int, doc: int, tokens: int,
                   documents: int) -> tuple:
    """`(data, PACKED)`: a pass-through's point as a slot carries it: its source reads row `doc` of
    row group `rg` of `file` (the run's numbering) of epoch `epoch` next, `skip` tokens into it,
    after `tokens` tokens of `documents` documents taken since the state `base` holds."""
    return marshal.dumps((base, skip, epoch, file, rg, doc, tokens, documents)), PACKED


def passing_mixer(state: dict, name: str, tokens: int, documents: int, epoch: int) -> dict:
    """The mixer's state (`Mixer.state`'s) of a pass-through of source `name` that started at
    `state`, after `tokens` tokens of `documents` documents, its source in epoch `epoch`: what
    the stream's mixer would hold there (the one rule: `OneStream`'s end point and `Packed.text`)."""
    t, d, _ = state["totals"][name]
    return {**state, "counted": {name: state["counted"][name] + tokens},
            "totals": {**state["totals"], name: [t + tokens, d + documents, epoch]}}


def _passing_values(base, skip, epoch, file, rg, doc, tokens, documents) -> tuple:
    """`_json`'s values of a `packed_passing` point."""
    name, state, others, lo = marshal.loads(base)
    return (name, skip, passing_mixer(state, name, tokens, documents, epoch),
            others + [(name, epoch, file - lo, rg, doc, 0)])


def kept(data: bytes, crc: int):
    """What the trainer keeps of a slot's point `data` with its crc field `crc` (`packed`'s,
    `packed_passing`'s or `packed_with_buffer`'s): a `Packed` (`PACKED`), else its text."""
    return Packed(data) if crc == PACKED else BufferText(data.decode("ascii"), crc)


class Packed:
    """A packed point (`packed`, `packed_passing` or `packed_with_buffer`) as the trainer keeps it: `text` and
    `crc`, those of `point_text` (of `with_buffer_text`), made when first asked."""

    __slots__ = ("data", "_text")

    def __init__(self, data: bytes):
        self.data, self._text = data, None

    @property
    def text(self) -> str:
        if self._text is None:
            values = marshal.loads(self.data)
            if len(values) == 8:  # a pass-through's (`packed_passing`)
                values = _passing_values(*values)
            self._text = json_text(_json(*values)) if len(values) == 4 else with_buffer_text(*values)
        return self._text

    @property
    def crc(self) -> int:
        return zlib.crc32(self.text.encode())

    def __repr__(self) -> str:
        return f"Packed({self.text!r})"
