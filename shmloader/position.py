"""A place in a rank's canonical stream: one record, used by every layer.

`Position(epoch, file, rg, doc, skip)` is the `skip`-th token of the document sequence that
starts at document (row) `doc` of row group `rg` of file `file`, in `epoch` (files numbered as
the run numbers them: data/catalogue.py). It is canonical: the same whatever the number of
workers, the pieces or the timing, because it names a document and an offset. A run starts at
one (`RunArgs.start`), a batch's announcement carries the one after it, a state stores one
(`epoch`, `pq_idx`, `rg_idx`, `doc_idx`, `skip`: state.py), and an elastic plan keeps every
old rank's. A buffered packing (best fit) keeps `skip` at 0: its position is the end of the
last chunk that entered its buffer. Pure: no imports.
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
