"""The packings, by `packing=` name: each is one module whose `PACKING` spec the rest of the
loader reads (base.Packing). A new packing is a module and a line here. `MODES`: the
coordinator's mode of a packing over one source and over a mixture (several sources by
weight), where one is built (kinds.py picks by the kind read); `MIX_MODES`: the latter."""
from typing import NamedTuple

from . import bestfit, concat, mixbestfit, mixmode


class Modes(NamedTuple):
    """A packing's coordinator modes: `mode(cfg, run, n_workers, pieces)`; and what a mixture's
    count-only run (packing/mixcount.py) finds its place with: `count_place(count, used)`."""
    source: type               # over one source's run
    mixture: type              # over a mixture's (`RunArgs.mixture`)
    count_place: type          # a mixture's count-only place-finder (`mixcount.Count`)


PACKINGS = {p.name: p for p in (concat.PACKING, bestfit.PACKING)}
MODES = {concat.PACKING.name: Modes(mixmode.SourceConcatMode, mixmode.MixConcatMode, mixmode.ConcatPlace),
         bestfit.PACKING.name: Modes(mixbestfit.SourceBestFitMode, mixbestfit.MixBestFitMode,
                                       mixbestfit.BestFitPlace)}
MIX_MODES = {name: modes.mixture for name, modes in MODES.items()}
