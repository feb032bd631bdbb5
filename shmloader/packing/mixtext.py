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
"""
from __future__ import annotations

import json
import marshal
import zlib

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


def packed(point, lo: dict) -> tuple:
    """`(data, PACKED)`: the point as a slot carries it (`Packed` reads it), or `(text, crc)`
    where `marshal` cannot write its values."""
    try:
        return marshal.dumps((point.source, point.skip, point.mixer, _places(point, lo))), PACKED
    except ValueError:
        text = point_text(point, lo)
        return text, zlib.crc32(text.encode())


class Packed:
    """A packed point (`packed`) as the trainer keeps it: `text` and `crc`, those of
    `point_text`, made when first asked."""

    __slots__ = ("data", "_text")

    def __init__(self, data: bytes):
        self.data, self._text = data, None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = json_text(_json(*marshal.loads(self.data)))
        return self._text

    @property
    def crc(self) -> int:
        return zlib.crc32(self.text.encode())

    def __repr__(self) -> str:
        return f"Packed({self.text!r})"
