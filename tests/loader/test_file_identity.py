"""Data files identified by more than name and size (docs/contract.md §3): a shard rewritten
with the same name and size is caught at resume by its parquet footer; a file rewritten while
a run goes on is read as it is now and the states after say so, so the run resumes from its
own checkpoint; a file rewritten under the reader is reported as changed, not as corrupt.
Token = position data throughout."""
import json
import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shmloader
import shmloader.sourcestate
from shmloader.data import formats
from shmloader.demo import corpus
from tests import helpers
from tests.helpers import window_of

B, T = 2, 16


def shards(root, lengths, num_files=3, rg=8) -> list[str]:
    return helpers.position_shards(root, lengths, num_files, rg)


def loader(data, **kw):
    kw.setdefault("num_workers", 2)
    return shmloader.ShmLoader(str(data), helpers.IntTokenizer(), B, T, device="cpu", timeout=30, **kw)


def rewrite_same_size(path: str, docs: list):
    """Rewrite `path` with other documents and exactly its old size: the new file, written
    smaller, gets unreferenced bytes between its last page and its footer (a valid file)."""
    size = os.path.getsize(path)
    rows = pq.ParquetFile(path).metadata.num_rows
    tmp = path + ".new"
    pq.write_table(pa.table({"text": docs[:rows]}), tmp, row_group_size=8, compression="zstd")
    raw = open(tmp, "rb").read()
    os.unlink(tmp)
    footer_len = int.from_bytes(raw[-8:-4], "little") + 8
    pad = size - len(raw)
    assert pad >= 0, "the rewritten file is larger: give it shorter documents"
    body, footer = raw[:-footer_len], raw[-footer_len:]
    with open(path, "r+b") as f:  # in place, as an editor or a re-download would
        f.truncate(0)
        f.write(body + b"\0" * pad + footer)
    assert os.path.getsize(path) == size


def test_a_shard_rewritten_with_the_same_size_is_refused_at_resume(tmp_path):
    paths = shards(tmp_path, [9] * 120)
    with loader(tmp_path) as ld:
        for _ in range(15):  # into file 1 (each file holds 400 tokens, a batch 33)
            next(ld)
        state = ld.state_dict()
    assert (state["epoch"], state["pq_idx"]) == (1, 1) and all(f[2] for f in state["files"][:2]), state
    rewrite_same_size(paths[0], ["1 1"] * 120)  # other text, which compresses smaller
    assert pq.ParquetFile(paths[0]).metadata.num_rows == 40  # a valid file, of other text
    with pytest.raises(ValueError, match=r"file 0: shard_00000.parquet was rewritten with the same name and size"):
        loader(tmp_path, resume_state=state)


def test_a_file_rewritten_during_the_run_is_described_as_it_is_read(tmp_path):
    """File 2 (of the train split's 3) is rewritten, larger, before the run reaches it: the run
    reads the new file, warns, and a state taken after it resumes exactly (it used to name the
    old size and be refused)."""
    paths = shards(tmp_path, [9] * 160, num_files=4)
    with loader(tmp_path, num_workers=1, n_slots=2) as ld:
        next(ld)
        corpus.write_shards(helpers.position_documents([11] * 40, start=50_000), tmp_path / "new", num_files=1,
                            row_group_size=8)
        os.replace(tmp_path / "new" / "shard_00000.parquet", paths[2])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(48):  # through files 0-2
                next(ld)
        state = ld.state_dict()
        follow = [window_of(*next(ld)) for _ in range(5)]
    assert any("shard_00002.parquet changed since this loader first knew it" in str(w.message) for w in caught)
    assert state["files"][2][1] == os.path.getsize(paths[2]), "the state does not describe file 2 as it was read"
    with loader(tmp_path, resume_state=state) as again:
        assert all(np.array_equal(window_of(*next(again)), w) for w in follow)


def test_a_file_rewritten_under_the_reader_is_reported_as_changed(tmp_path):
    paths = shards(tmp_path, [9] * 1600, num_files=2, rg=8)  # file 0: 100 row groups of 8
    with loader(tmp_path, num_workers=1, n_slots=2) as ld:
        next(ld)
        with open(paths[0], "r+b") as f:  # rewritten in place, shorter: same inode, new bytes
            f.truncate(os.path.getsize(paths[0]) // 2)
        with pytest.raises(shmloader.DataError) as ei:
            for _ in range(2000):
                next(ld)
    msg = str(ei.value)
    assert paths[0] in msg and "changed while" in msg and "corrupt" not in msg, msg


def test_a_version_2_state_without_footers_still_resumes(tmp_path):
    shards(tmp_path, [9] * 120)
    with loader(tmp_path) as ld:
        for _ in range(15):
            next(ld)
        state = ld.state_dict()
        follow = [window_of(*next(ld)) for _ in range(4)]
    old = dict(state, version=2, files=[f[:2] for f in state["files"]])
    del old["check"], old["elastic"]  # version 5's; a version 2 state's digest is over the fields it had
    old.update(zip(("epoch", "pq_idx", "rg_idx", "doc_idx", "skip"), old.pop("position")))  # version 6's
    old["digest"] = shmloader.sourcestate.digest(old)
    with loader(tmp_path, resume_state=old) as again:
        assert all(np.array_equal(window_of(*next(again)), w) for w in follow)


# ----------------------------------------------------------------
# what a state's file check tells a user about a file that is not parquet. A JSON Lines file
# rewritten in place with its name and size kept is refused at resume, and the words say what was
# compared, the digest of its first and last 64 KiB, not "its parquet footer" (which a JSON Lines
# file does not have).

def code_loader(data, **kw):
    """A code corpus's loader: JSON Lines with a `content` column."""
    return shmloader.ShmLoader(shmloader.Source(str(data), column="content"), helpers.IntTokenizer(), B, T,
                               num_workers=1, device="cpu", timeout=30, **kw)


def test_a_json_lines_file_rewritten_with_its_size_is_named_by_what_its_digest_is_of(tmp_path):
    for name, start in (("a.jsonl", 1), ("b.jsonl", 5000)):  # b: the val file
        lines = [json.dumps({"content": " ".join([str(start + i)] * 5), "id": i}) for i in range(200)]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    with code_loader(tmp_path) as ld:
        for _ in range(5):
            next(ld)
        state = ld.state_dict()
    path = tmp_path / "a.jsonl"
    raw = bytearray(path.read_bytes())
    raw[raw.index(b'"1 1 1 1 1"') + 1] = ord("2")  # the first document, before the position: same size
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"file 0: a\.jsonl was rewritten with the same name and size "
                                         r"\(the digest of its first and last 64 KiB was [0-9a-f]+, it is") as got:
        code_loader(tmp_path, resume_state=state)
    assert "parquet" not in str(got.value), got.value


def test_each_format_says_what_its_identity_digest_is_of():
    assert formats.identity_of("x/shard_00000.parquet") == "its parquet footer"
    for name in ("code.jsonl", "code.jsonl.zst", "dump.json.gz", "data-00000-of-00001.arrow", "t.feather"):
        assert formats.identity_of(name) == "the digest of its first and last 64 KiB", name


def test_a_formats_digest_and_its_words_are_overridden_together(tmp_path):
    """`Format.digest` is the edge digest beside its `identity` words: a format that keeps one
    keeps the other (JSON Lines, Arrow, a new one), parquet overrides both."""
    from shmloader.data.formats.base import Format, edge_digest

    for fmt in formats.FORMATS:
        assert ("digest" in vars(fmt)) == ("identity" in vars(fmt)), fmt.name
    path = tmp_path / "a.new"
    path.write_bytes(bytes(range(256)) * 1024)
    assert Format(str(path)).digest() == edge_digest(str(path)) and Format.identity.startswith("the digest of")
