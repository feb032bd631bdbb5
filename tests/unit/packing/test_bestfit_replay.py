"""Best fit's one mode keeps every byte of what the two modes did (issue 50): one source's runs
(`SourceBestFitMode`, made of one source's parts) and a mixture's (`MixBestFitMode`, one source
passing through and two sources) replayed over the grid of tests/unit/packing/bestfit_replay.py
(1-3 workers; null rows, one-row and empty row groups, documents longer than a row; fresh, and
resumed inside a buffer, a mixture's too; pieces that cannot be read in the resumed buffer, at
index 1, and further on; three slots and two) give the traces recorded from main's
`bestfit.BestFitMode` and `MixBestFitMode` before they became one (tests/fixtures/
bestfit_traces.json: each run's digest; the 180 runs added since recorded from the same
checkout, main at 62f3280; the 135 runs of geometry 1, its workers bounded by the cores, recorded
again when that bound became as many workers as the cores, not one piece more, after checking that
every batch's record, error and resumed start of each equals main's up to where either stopped):
the pieces handed out and to whom,
every `Rows` order, every batch's position, buffer and slot text, what workers hold, the `Ended`
errors and the stats."""
import json
import pathlib

from tests.unit.packing import bestfit_replay

FIXTURE = pathlib.Path(__file__).parents[2] / "fixtures" / "bestfit_traces.json"


def test_every_run_traces_what_mains_two_modes_did():
    want = json.loads(FIXTURE.read_text())
    got = bestfit_replay.digests()
    assert len(want) == 372 and set(got) == set(want)
    assert sum(n for _, _, n in want.values()) > 5000, "the grid planned almost no batch"
    differ = sorted(name for name in want if got[name] != want[name])
    assert not differ, f"{len(differ)} runs differ from main's, e.g. {differ[:5]}"
