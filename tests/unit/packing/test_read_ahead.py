"""Best fit's read-ahead cap (packing/bestfit.py `read_ahead_cap`): the buffer and two pieces,
also with a token cache, whose pieces are whole row groups (`max_piece_docs` uncapped)."""
from types import SimpleNamespace

from shmloader.config import LoaderConfig
from shmloader.data.order import Piece
from shmloader.packing.base import UNCAPPED
from shmloader.packing.bestfit import read_ahead_cap
from shmloader.packing.mixbestfit import SourceBestFitMode
from shmloader.ipc.runstart import RunStart, SourceStart
from shmloader.position import Position

ROW_GROUP = 3000  # documents in each whole row group


def test_capped_pieces_count_as_max_piece_docs():
    assert read_ahead_cap(1000, 1024) == 1000 + 2 * 1024
    assert read_ahead_cap(1000, 256, piece_docs=5000, cap=9999) == 1000 + 2 * 256


def test_whole_row_groups_count_as_the_largest_piece_given():
    cap = read_ahead_cap(1000, UNCAPPED)
    assert cap == 1000 + 2 * 1024
    cap = read_ahead_cap(1000, UNCAPPED, 128, cap)  # a ramp's small piece: no lower
    assert cap == 1000 + 2 * 1024
    cap = read_ahead_cap(1000, UNCAPPED, 3000, cap)
    assert cap == 1000 + 2 * 3000
    assert read_ahead_cap(1000, UNCAPPED, 2000, cap) == cap  # never lower again


def whole_row_groups(ramp, cap, first):
    i = first
    for rg in range(10**6):
        yield Piece(i, 1, 0, rg, 0, ROW_GROUP)
        i += 1


def test_a_token_cache_reads_a_bounded_way_ahead():
    """With a token cache the workers may take pieces only while fewer documents than the buffer
    and two row groups wait to enter it: before, the cap was 2**41 documents, and two workers
    counted the corpus far ahead of the planner."""
    cfg = LoaderConfig(2, 24, packing="bos_bestfit", n_slots=4, num_workers=2, buffer_size=16,
                       tokenizer_batch_size=8, cache_dir="/nonexistent-cache")
    assert cfg.max_piece_docs == UNCAPPED
    run = SimpleNamespace(layout=SimpleNamespace(n_slots=4), start=RunStart(Position(1, 0, 0), SourceStart()))
    mode = SourceBestFitMode(cfg, run, 2, whole_row_groups)
    given, ahead = 0, None
    for _ in range(100):  # nothing is ever counted: only the cap stops the handing out
        w, ahead = mode.hand_out(range(2), ahead)
        if w is None:
            break
        given, ahead = given + 1, None
    assert mode.cap == 16 + 2 * ROW_GROUP
    assert 1 <= given <= 3, given
