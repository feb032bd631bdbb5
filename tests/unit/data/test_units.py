"""data/units.py: `check` refuses exactly the ranks that the orders find without a unit (the
files' order's `row_steps`, the shuffled order's share), in their words, reading footers only
until it knows; a footer it cannot read leaves the answer to the coordinator."""
import itertools

import numpy as np
import pytest

from shmloader.data import order, shuffle, units
from shmloader.errors import DataError
from shmloader.position import Position


def refused(check) -> str | None:
    try:
        check()
    except DataError as e:
        return str(e)
    return None


def files_order_says(counts, rank, world) -> str | None:
    rows = [[3] * n for n in counts]
    steps = order.row_steps(lambda f: rows[f], len(rows), rank, world, Position(1, 0, rank, 0))
    return refused(lambda: next(steps))


def shuffled_says(counts, rank, world) -> str | None:
    rows = [[3] * n for n in counts]
    return refused(lambda: shuffle.first_position(shuffle.Shuffle(7, 2), lambda f: rows[f], len(rows), rank, world))


@pytest.mark.parametrize("shuffled", [False, True], ids=["files-order", "shuffled"])
def test_it_refuses_the_ranks_the_order_finds_without_a_unit_in_its_words(shuffled):
    rng = np.random.default_rng(5)
    says = shuffled_says if shuffled else files_order_says
    seen = set()
    for _ in range(60):
        counts = rng.integers(0, 4, size=rng.integers(1, 4)).tolist()
        world = int(rng.integers(1, 9))
        for rank in range(world):
            got = refused(lambda: units.check(lambda f, enough: min(enough, counts[f]), len(counts), rank, world,
                                              shuffled))
            assert got == says(counts, rank, world), (counts, rank, world)
            seen.add(got is None)
    assert seen == {True, False}  # both answers met


def test_it_reads_footers_only_until_it_knows():
    read = []

    def counts(f, enough):
        read.append((f, enough))
        return min(enough, [1, 3, 5, 5][f])

    units.check(counts, 4, 2, 8, shuffled=False)  # file 1 holds unit 2
    assert read == [(0, 3), (1, 3)]
    read.clear()
    units.check(counts, 4, 3, 8, shuffled=True)  # 1 + 3 units outnumber rank 3
    assert read == [(0, 4), (1, 3)]
    read.clear()
    with pytest.raises(DataError, match=r"^rank 5 of 8 has no row group in any of the 4 files .*1024 lines of JSON Lines"):
        units.check(counts, 4, 5, 8, shuffled=False)
    assert read == [(f, 6) for f in range(4)]


def test_an_unreadable_footer_leaves_it_to_the_coordinator():
    assert refused(lambda: units.check(lambda f, enough: [None, 1][f], 2, 1, 2, False)) is None
    assert refused(lambda: units.check(lambda f, enough: [1, 1][f], 2, 1, 2, False)) is not None
    assert all(refused(lambda: units.check(lambda f, enough: min(k, enough), n, 0, 1, s)) is None
               for k, n, s in itertools.product([1, 2], [1, 3], [False, True]))


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.zst"])
@pytest.mark.parametrize("lines,newline", [(0, True), (1, False), (1024, True), (1025, False), (2500, True)])
def test_a_json_lines_file_counts_its_units_only_as_far_as_asked(tmp_path, fmt, lines, newline):
    """`units(enough)` is `min(enough, units)` as `rows()` counts them (a last line without its
    newline counts); a file read only for one unit reads one chunk of it."""
    import pyarrow as pa

    from shmloader.data import formats
    from shmloader.data.formats import jsonl

    text = "".join(f'{{"text": "{i}"}}\n' for i in range(lines))
    path = str(tmp_path / f"f.{fmt}")
    data = (text if newline or not text else text[:-1]).encode()
    with pa.output_stream(path, compression="zstd" if fmt.endswith("zst") else None) as out:
        out.write(data)
    whole = len(formats.open_file(path).rows())
    assert whole == -(-lines // 1024)
    for enough in range(5):
        assert formats.open_file(path).units(enough) == min(enough, whole), enough
    big = tmp_path / "big.jsonl"
    big.write_bytes(b'{"text": "x"}\n' * (3 * jsonl.CHUNK // 14))
    chunks = []
    f = formats.open_file(str(big))
    f._chunks = lambda stream, size=jsonl.CHUNK, read=f._chunks: (chunks.append(c) or c for c in read(stream, size))
    assert f.units(1) == 1 and len(chunks) == 1


def test_the_advice_names_every_formats_unit():
    """MORE_UNITS is built from the registry: a new format's unit is said without editing it."""
    from shmloader.data.formats import FORMATS
    from shmloader.data.units import MORE_UNITS

    for fmt in FORMATS:
        assert fmt.unit_is and fmt.unit_is in MORE_UNITS, fmt.__name__


def test_check_documents_refuses_only_what_every_footer_says_is_barren():
    """Files' order: rank r's units r, r + W, ... of each file; shuffled: every unit of the
    split. One unit that may hold a document, or one file that cannot say (None), lets it read;
    it stops asking there."""
    asked = []

    def holds(files):
        def may_hold(f):
            asked.append(f)
            return files[f]
        return may_hold
    split = [[True, False, True, False], [True, False]]
    assert refused(lambda: units.check_documents(holds(split), 2, 0, 2, False)) is None and asked == [0]
    says = refused(lambda: units.check_documents(holds(split), 2, 1, 2, False))
    assert says == "rank 1: a whole epoch over 2 files held no document with text (all null or no rows)"
    assert refused(lambda: units.check_documents(holds(split), 2, 1, 2, True)) is None
    asked.clear()
    assert refused(lambda: units.check_documents(holds([[False], None, [False]]), 3, 0, 1, False)) is None
    assert asked == [0, 1]
    says = refused(lambda: units.check_documents(holds([[False, False], []]), 2, 0, 3, True))
    assert says == ("rank 0: every row group of the 2 files, read shuffled, held no document with text "
                    "(all null or no rows)")
    assert refused(lambda: units.check_documents(holds([]), 0, 0, 1, False)) is None  # said where files are listed
