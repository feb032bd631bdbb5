"""A place in a rank's canonical stream: one record, used by every layer.

`Position(epoch, file, rg, doc, skip)` is the `skip`-th token of the document sequence that
starts at document (row) `doc` of row group `rg` of file `file`, in `epoch` (files numbered as
the run numbers them: data/catalogue.py). It is canonical: the same whatever the number of
workers, the pieces or the timing, because it names a document and an offset. A run starts at
one (`RunArgs.start`), a batch's announcement carries the one after it, a state stores one
(its `position`: state.py), and an elastic plan keeps every old rank's. A buffered packing
(best fit) keeps `skip` at 0: its position is the end of the last chunk that entered its buffer.

`RowGroup(epoch, file, rg)` is the row group a batch's reading ended in: the one holding the
batch's last token (concat), or the last chunk that entered the buffer to make it (best fit).
A batch's announcement carries it, and a state's nanochat keys (`pq_idx`, `rg_idx`, `epoch`)
are the one of the last batch before its position, as nanochat's own loaders say them.

`Step(epoch, file, rg, doc, skip, rows, members)` is one step of an order (data/order.py
`row_steps`, data/shuffle.py, data/elastic.py): the `rows` documents of row group `rg` of `file`
in `epoch`, from document `doc` on (`skip` tokens into it), which data/order.py `cut_pieces`
cuts into pieces; a shuffled order's window names its units in `members` (data/shuffle.py
`Member`s, the head `(file, rg)` first; () in the files' order). Pure: no imports.
"""
from typing import NamedTuple


class Position(NamedTuple):
    epoch: int
    file: int
    rg: int
    doc: int = 0
    skip: int = 0

    def __str__(self) -> str:
        return (f"epoch {self.epoch}, file {self.file}, row group {self.rg}, document {self.doc}"
                + (f", token {self.skip}" if self.skip else ""))


class RowGroup(NamedTuple):
    """A row group of an epoch (files numbered as the run numbers them)."""
    epoch: int
    file: int
    rg: int


class Step(NamedTuple):
    epoch: int
    file: int
    rg: int
    doc: int
    skip: int
    rows: int
    members: tuple = ()
