"""The packings, by `packing=` name: each is one module whose `PACKING` spec the rest of the
loader reads (base.Packing). A new packing is a module and a line here. `MIX_MODES`: the
coordinator's mode of a packing over a mixture (several sources by weight), where one is built."""
from . import bestfit, concat, mixbestfit, mixmode

PACKINGS = {p.name: p for p in (concat.PACKING, bestfit.PACKING)}
MIX_MODES = {concat.PACKING.name: mixmode.MixConcatMode, bestfit.PACKING.name: mixbestfit.MixBestFitMode}
