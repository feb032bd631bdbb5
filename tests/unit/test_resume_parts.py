"""The steps of a resume that differ between one source and a mixture, each its part's
(`resume.Part`: sourcestate.Files, mixstate.Mixed), without processes: a count-only replay's
`RunArgs` (from where, over which files, counting from which batch), an old rank's place at a
change of world size, the elastic plan made from the old ranks' places, and the plans a run's
order reads (its start's `order_plans`, as each kind sets them)."""
import dataclasses
import json
from types import SimpleNamespace

import pytest

from shmloader import kinds, mixstate, sourcestate
from shmloader import state as statemod
from shmloader.data import elastic, shuffle
from shmloader.data.catalogue import Catalogue
from shmloader.data.mixture import Mixture
from shmloader.data.order import start_position
from shmloader.data.sources import Sources
from shmloader.demo import corpus
from shmloader.ipc.protocol import RunArgs
from shmloader.ipc.runstart import ONE_SOURCE, CountTo, MixStart, RunStart, SourceStart
from shmloader.position import Position

CONFIG = SimpleNamespace(on_bad_row_group="raise", order=None, spec=SimpleNamespace(buffered=False))
SHAPES = [[0, 4, 16]]


@pytest.fixture
def shards(tmp_path):
    """Four train files (and a val file) of 3 row groups of 2 rows each, per source."""
    for name in ("web", "code"):
        corpus.write_shards([f"{name} {i}" for i in range(30)], tmp_path / name, num_files=5, row_group_size=2)
    return tmp_path


def args_of(paths, rank=1, world=2) -> RunArgs:
    return RunArgs(files=list(paths), rank=rank, world=world, layout=None, order_of=shuffle.one_source)


def test_a_run_made_without_its_kinds_order_fails_where_it_is_made():
    """`RunArgs.order_of` is required: a run without it is refused when built, not when its
    processes first ask for its order (`shuffle.of_run`)."""
    with pytest.raises(TypeError, match="order_of"):
        RunArgs(files=[], rank=0, world=1, layout=None)


def test_one_sources_replay_runs_from_its_position_over_the_files_the_state_was_saved_with(shards):
    cat = Catalogue(str(shards / "web"), "train")
    resume = statemod.Resume(Position(1, 0, 1, 0, 0), statemod.AtSource(), statemod.Locate(), batch=40, shapes=SHAPES,
                             n_files=3)
    count = sourcestate.Files(cat).replay(resume, args_of(cat.paths), CONFIG)
    assert len(cat.paths) == 4 and count.files == cat.paths[:3]  # a file added since the save is not replayed
    assert count.start == RunStart(Position(1, 0, 1, 0, 0), SourceStart((), None, None), 0, CountTo(SHAPES, 40))
    assert count.start.at.order_plans is None


def test_one_sources_replay_of_a_run_that_began_elastic_runs_from_the_ranks_start_in_its_plan(shards):
    """Whatever the resume's position, a stream of a run that began at a change of world size
    begins at the rank's first unit of the plan, and its replay counts from the plan's batch."""
    cat = Catalogue(str(shards / "web"), "train")
    plan = elastic.Plan.of(2, 10, [(1, 0, 1, 1, 0), (1, 1, 1, 0, 0)])
    resume = statemod.Resume(Position(1, 0, 1, 0, 0), statemod.AtSource(plan=plan), statemod.Locate(), batch=40,
                             shapes=SHAPES, n_files=4)
    count = sourcestate.Files(cat).replay(resume, args_of(cat.paths, rank=1, world=3), CONFIG)
    row_counts = lambda f: cat.row_counts(f)  # noqa: E731
    assert count.start.position == elastic.start(plan, 1, 3, row_counts, 4) != resume.position
    assert count.start.batch == 10 and count.start.locate == CountTo(SHAPES, 40)
    assert count.start.at.plan is plan and count.start.at.order_plans == {ONE_SOURCE: plan}


def test_one_sources_old_ranks_are_the_states_own_place_or_a_stream_to_replay(shards):
    cat = Catalogue(str(shards / "web"), "train")
    parent = elastic.Plan.of(1, 5, [(1, 0, 0, 1, 0)])
    change = statemod.Change(2, 1, Position(1, 1, 1, 1, 3), [], parent)
    resume = statemod.Resume(Position(1, 0, 0, 0, 0), statemod.AtSource(), change, batch=40, shapes=SHAPES, n_files=4)
    files = sourcestate.Files(cat)
    own = files.old_rank(resume, 1, CONFIG)
    assert own.position == change.position and own.step == statemod.EXACT
    other = files.old_rank(resume, 0, CONFIG)
    assert other.step == statemod.Locate() and other.position == start_position(0) and other.at.plan is parent


def test_one_sources_plan_shares_out_the_old_ranks_places(shards):
    cat = Catalogue(str(shards / "web"), "train")
    change = statemod.Change(2, 0, Position(1, 2, 0, 1, 0), [], None)
    resume = statemod.Resume(Position(1, 0, 0, 0, 0), statemod.AtSource(), change, batch=40, shapes=SHAPES, n_files=4)
    places = [dataclasses.replace(resume, position=p, step=statemod.EXACT) for p in (Position(1, 2, 0, 1, 0),
                                                                                    Position(2, 1, 1, 0, 0))]
    started, words = sourcestate.Files(cat).shared(resume, places, CONFIG, args_of(cat.paths, rank=2, world=3))
    plan = elastic.Plan.of(2, 40, [tuple(p.position) for p in places])
    assert started.at.plan == plan and started.position == elastic.start(plan, 2, 3, cat.row_counts, 4)
    assert started.step == statemod.EXACT and started.at.runs == []
    assert words == "the rest of epochs up to 2"


def mixture_part(shards):
    mix = Mixture({n: str(shards / n) for n in ("web", "code")}, {"web": 1, "code": 1})
    sources = Sources(mix, "train")
    return sources, mixstate.Mixed(sources)


def test_a_mixtures_replay_runs_its_stream_from_the_runs_start_in_one_shape(shards):
    sources, part = mixture_part(shards)
    resume = statemod.Resume(Position(1, 3, 0, 1, 0), statemod.AtMix(), statemod.Locate(), batch=40,
                             shapes=SHAPES + [[40, 2, 16]], n_files=8)
    count = part.replay(resume, args_of(sources.paths, rank=1, world=2), CONFIG)
    assert count.files == sources.paths and count.start.position == start_position(1)
    assert count.start.at == MixStart() and count.start.at.order_plans is None
    assert count.start.batch == 0
    assert count.start.locate == CountTo(SHAPES, 40)  # the new shape from the state's batch on is not replayed


def test_a_mixtures_old_ranks_are_the_states_own_point_or_a_stream_to_replay(shards):
    sources, part = mixture_part(shards)
    change = statemod.Change(2, 0, start_position(1), [], None)
    resume = statemod.Resume(start_position(1), statemod.AtMix({"source": "web"}), change, batch=40, shapes=SHAPES)
    own = part.old_rank(resume, 0, CONFIG)
    assert own.step == statemod.EXACT and own.at is resume.at and own.position == resume.position
    other = part.old_rank(resume, 1, CONFIG)
    assert other.step == statemod.Locate() and other.at is resume.at


def test_the_plans_a_runs_order_reads_are_the_kinds(shards):
    """The coordinator's shuffled windows read the run's start's `order_plans`, `{source: Plan}`
    of either kind: one source's plan under `ONE_SOURCE`, or a mixture's each source's plans, as
    the kind sets them; a run's start is one field."""
    plan = elastic.Plan.of(1, 5, [(1, 0, 0, 1, 0)])
    one = kinds.OneSource(str(shards / "web"), "train", None, "text")
    fields = one.run_args(statemod.Resume(start_position(0), statemod.AtSource(plan=plan), batch=7))
    assert fields == {"start": RunStart(start_position(0), SourceStart((), plan, None), 7)}
    assert fields["start"].at.order_plans == {ONE_SOURCE: plan}
    mixed = kinds.Mixed(Mixture({n: str(shards / n) for n in ("web", "code")}, {"web": 1}), "train", None, "text")
    fields = mixed.run_args(statemod.Resume(start_position(0), statemod.AtMix(plans={"web": plan}), batch=7))
    assert set(fields) == {"start", "mixture"} and fields["start"].batch == 7
    assert fields["start"].at.order_plans == fields["start"].at.plans == {"web": plan}
    assert mixed.run_args(statemod.Resume(start_position(0), statemod.AtMix()))["start"].at.order_plans is None


def test_a_restart_starts_at_the_mark_with_the_rest_of_the_runs_start(shards):
    """A heal's or an idle release's run (`kinds.py` `restarted`) starts at the progress mark: its
    position, its batch count and what the kind holds there (best fit's buffer, a mixture's
    point), from the mark's text; the elastic plans and the rest of its start stay the run's."""
    from shmloader.packing.runs import BufferText, encode_buffer
    from shmloader.procs.run import Mark

    plan = elastic.Plan.of(1, 5, [(1, 0, 0, 1, 0)])
    one = kinds.OneSource(str(shards / "web"), "train", None, "text")
    args = dataclasses.replace(args_of(one.catalogue.paths), **one.run_args(
        statemod.Resume(start_position(0), statemod.AtSource([[1, 0, 0, 0, 2]], plan), batch=3)))
    mark = Mark(12, Position(1, 2, 0, 1, 0), encode_buffer([[1, 2, 0, 1, 4]]))
    assert one.restarted(args, mark).start == RunStart(mark.position, SourceStart(((1, 2, 0, 1, 4),), plan), 12)
    mixed = kinds.Mixed(Mixture({n: str(shards / n) for n in ("web", "code")}, {"web": 1}), "train", None, "text")
    args = dataclasses.replace(args_of(mixed.catalogue.paths), **mixed.run_args(
        statemod.Resume(start_position(0), statemod.AtMix(plans={"web": plan}), batch=3)))
    point = {"source": "web", "sources": {"web": [1, 0, 0, 2]}}
    again = mixed.restarted(args, Mark(12, Position(1, 0, 0, 2, 0), BufferText(json.dumps(point), 0)))
    assert again.start == RunStart(Position(1, 0, 0, 2, 0), MixStart(point, {"web": plan}), 12)
    assert again.mixture is args.mixture


def test_a_starts_documents_carried_as_runs_are_its_buffers_counts():
    """The room a run's slots give the resumed buffer (procs/run.py) counts one source's runs'
    documents, `[epoch, file, rg, row, count]` each; a mixture carries none as runs (its point)."""
    assert SourceStart(((1, 0, 2, 5, 3), (1, 1, 0, 0, 4))).docs_as_runs == 7
    assert SourceStart().docs_as_runs == 0 and MixStart({"buffer": []}).docs_as_runs == 0


def test_the_resume_check_names_a_row_in_the_files_order_and_the_order_read_when_shuffled():
    """A mismatch's place: a row of its unit where the run reads the files' order (a JSON Lines
    file's line), the unit and the document's number in the order read where it is shuffled
    (a window's documents are not its first unit's rows: as a line it named a line elsewhere)."""
    from shmloader.position import Position
    from shmloader.resume import Mismatch, check_first

    mark = SimpleNamespace(batch=9, position=Position(1, 0, 2, 5))
    with pytest.raises(Mismatch, match=r"batch 9 \(epoch 1, a\.jsonl, line 2054\)"):
        check_first(1, 2, mark, "a.jsonl", False, shuffled=False)
    with pytest.raises(Mismatch, match=r"batch 9 \(epoch 1, a\.jsonl, lines 2049-3072, document 5 in the order read\)"):
        check_first(1, 2, mark, "a.jsonl", False, shuffled=True)
    check_first(3, 3, mark, "a.jsonl", False, shuffled=True)  # the same check: nothing to say
