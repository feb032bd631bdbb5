"""The packings, by `packing=` name: each is one module whose `PACKING` spec the rest of the
loader reads (base.Packing). A new packing is a module and a line here."""
from . import bestfit, concat

PACKINGS = {p.name: p for p in (concat.PACKING, bestfit.PACKING)}
