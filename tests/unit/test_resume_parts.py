"""The steps of a resume that differ between one source and a mixture, each its part's
(`resume.Part`: sourcestate.Files, mixstate.Mixed), without processes: a count-only replay's
`RunArgs` (from where, over which files, counting from which batch), an old rank's place at a
change of world size, the elastic plan made from the old ranks' places, and the plans a run's
order reads (`RunArgs.plans`, as each kind sets them)."""
import dataclasses
from types import SimpleNamespace

import pytest

from shmloader import kinds, mixstate, sourcestate
from shmloader import state as statemod
from shmloader.data import elastic
from shmloader.data.catalogue import Catalogue
from shmloader.data.mixture import Mixture
from shmloader.data.order import start_position
from shmloader.data.sources import Sources
from shmloader.demo import corpus
from shmloader.ipc.protocol import RunArgs
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
    return RunArgs(files=list(paths), rank=rank, world=world, layout=None)


def test_one_sources_replay_runs_from_its_position_over_the_files_the_state_was_saved_with(shards):
    cat = Catalogue(str(shards / "web"), "train")
    resume = statemod.Resume(Position(1, 0, 1, 0, 0), statemod.AtSource(), statemod.Locate(), batch=40, shapes=SHAPES,
                             n_files=3)
    count = sourcestate.Files(cat).replay(resume, args_of(cat.paths), CONFIG)
    assert len(cat.paths) == 4 and count.files == cat.paths[:3]  # a file added since the save is not replayed
    assert count.start == Position(1, 0, 1, 0, 0) and count.buffer_runs == ()
    assert count.locate == (SHAPES, 40, 0) and count.later is None
    assert count.plan is None and count.plans is None


def test_one_sources_replay_of_a_run_that_began_elastic_runs_from_the_ranks_start_in_its_plan(shards):
    """Whatever the resume's position, a stream of a run that began at a change of world size
    begins at the rank's first unit of the plan, and its replay counts from the plan's batch."""
    cat = Catalogue(str(shards / "web"), "train")
    plan = elastic.Plan.of(2, 10, [(1, 0, 1, 1, 0), (1, 1, 1, 0, 0)])
    resume = statemod.Resume(Position(1, 0, 1, 0, 0), statemod.AtSource(plan=plan), statemod.Locate(), batch=40,
                             shapes=SHAPES, n_files=4)
    count = sourcestate.Files(cat).replay(resume, args_of(cat.paths, rank=1, world=3), CONFIG)
    row_counts = lambda f: cat.row_counts(f)  # noqa: E731
    assert count.start == elastic.start(plan, 1, 3, row_counts, 4) != resume.position
    assert count.locate == (SHAPES, 40, 10) and count.plan is plan and count.plans is plan


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
    assert count.files == sources.paths and count.start == start_position(1)
    assert count.mixture.point is None and count.mixture.plans is None and count.plans is None
    assert count.locate == (SHAPES, 40, 0)  # the new shape from the state's batch on is not replayed


def test_a_mixtures_old_ranks_are_the_states_own_point_or_a_stream_to_replay(shards):
    sources, part = mixture_part(shards)
    change = statemod.Change(2, 0, start_position(1), [], None)
    resume = statemod.Resume(start_position(1), statemod.AtMix({"source": "web"}), change, batch=40, shapes=SHAPES)
    own = part.old_rank(resume, 0, CONFIG)
    assert own.step == statemod.EXACT and own.at is resume.at and own.position == resume.position
    other = part.old_rank(resume, 1, CONFIG)
    assert other.step == statemod.Locate() and other.at is resume.at


def test_the_plans_a_runs_order_reads_are_the_kinds(shards):
    """The coordinator's shuffled windows read `RunArgs.plans`: one source's plan, or a mixture's
    each source's plans, as the kind sets them."""
    plan = elastic.Plan.of(1, 5, [(1, 0, 0, 1, 0)])
    one = kinds.OneSource(str(shards / "web"), "train", None, "text")
    assert one.run_args(statemod.Resume(start_position(0), statemod.AtSource(plan=plan))) == {
        "buffer_runs": (), "plan": plan, "plans": plan}
    mixed = kinds.Mixed(Mixture({n: str(shards / n) for n in ("web", "code")}, {"web": 1}), "train", None, "text")
    fields = mixed.run_args(statemod.Resume(start_position(0), statemod.AtMix(plans={"web": plan})))
    assert fields["plans"] == fields["mixture"].plans == {"web": plan} and "plan" not in fields
    assert mixed.run_args(statemod.Resume(start_position(0), statemod.AtMix()))["plans"] is None
