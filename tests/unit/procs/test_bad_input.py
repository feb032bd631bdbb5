"""Bad input found by the coordinator's logic, in this process: pieces of empty row groups
counted out of order must not make it declare an epoch empty, and a whole epoch without a
document is a DataError. (Bad input through `ShmLoader` and its processes:
tests/loader/test_bad_input.py.)
"""
import pytest

import shmloader


def test_empty_epoch_check_follows_stream_order_not_arrival_order():
    """Pieces counted out of order: an empty piece of epoch 3 arriving before epoch 1's only
    document must not make the coordinator declare a whole epoch empty."""
    from types import SimpleNamespace

    from shmloader.procs.coordinator import _Coordinator
    from shmloader.data.order import Piece
    from shmloader.position import Position
    from shmloader.ipc.runstart import RunStart, SourceStart
    from shmloader.packing.base import InOrder

    start = RunStart(Position(1, 0, 0), SourceStart())
    fake = SimpleNamespace(docs_seen=0, _unchecked=InOrder(), order=None,
                           args=SimpleNamespace(start=start, rank=0, files=["a", "b"]))
    check = lambda index, epoch, live: _Coordinator._check_not_empty(  # noqa: E731
        fake, Piece(index, epoch, 0, 0, 0, 1), live)
    check(5, 3, 0)  # epoch 3, empty, counted first
    check(1, 1, 0)
    check(2, 2, 0)
    check(0, 1, 1)  # epoch 1's one document: nothing is empty
    check(3, 2, 0)
    check(4, 3, 0)
    assert fake.docs_seen == 1 and fake._unchecked.next == 6
    fake2 = SimpleNamespace(docs_seen=0, _unchecked=InOrder(), order=None,
                            args=SimpleNamespace(start=start, rank=0, files=["a"]))
    for index, epoch in enumerate([1, 1, 2, 2]):
        _Coordinator._check_not_empty(fake2, Piece(index, epoch, 0, 0, 0, 1), 0)
    with pytest.raises(shmloader.DataError, match="whole epoch"):
        _Coordinator._check_not_empty(fake2, Piece(4, 3, 0, 0, 0, 1), 0)
    # shuffled: empty epochs go on until every unit of the split (3 here) was read without a document
    from shmloader.data.shuffle import Member
    fake3 = SimpleNamespace(docs_seen=0, _unchecked=InOrder(), order=object(), _barren=set(),
                            _units=lambda: 3, args=SimpleNamespace(start=start, rank=0, files=["a", "b"]))
    for index, (epoch, unit) in enumerate([(1, (0, 0)), (2, (0, 0)), (3, (1, 0)), (4, (0, 0))]):
        _Coordinator._check_not_empty(fake3, Piece(index, epoch, *unit, 0, 1, members=(Member(*unit, 1),)), 0)
    with pytest.raises(shmloader.DataError, match="every row group of the 2 files, read shuffled over 5 epochs"):
        _Coordinator._check_not_empty(fake3, Piece(4, 5, 0, 1, 0, 1, members=(Member(0, 1, 1),)), 0)
