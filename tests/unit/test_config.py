"""LoaderConfig: each bad argument is a ValueError naming it; defaults that depend on other
options are resolved under their own names; an option that cannot act with the others is
refused; derived sizes are right."""
import pytest

from shmloader.config import LoaderConfig


@pytest.mark.parametrize("field,value", [
    ("B", 0), ("T", -1), ("B", 2.0), ("T", True), ("num_workers", 0), ("n_slots", 1),
    ("tokenizer_batch_size", 0), ("buffer_size", 0), ("max_piece_docs", 0), ("split", "test"),
    ("packing", "pad"), ("start_method", "fork"), ("timeout", 0), ("on_bad_row_group", "ignore"),
    ("log_every", -1), ("idle_release_s", -1), ("idle_release_s", "30"), ("idle_release_s", True),
    ("max_restarts", -1), ("max_restarts", 1.5), ("max_restarts", True), ("stall_s", -0.5), ("stall_s", "60"),
    ("positions", 1), ("positions", "yes"),
])
def test_bad_argument_is_named(field, value):
    args = dict(B=2, T=8)
    args[field] = value
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        LoaderConfig(**args)


def test_a_loaders_call_is_its_config(tmp_path):
    """`LoaderConfig.of_call`: the constructor's arguments by name (what else it holds is left
    out), one source's own `Source(shuffle=)` over the loader's `shuffle=`, `cache_dir` as text."""
    import dataclasses

    from shmloader.data.source import Source

    defaults = {f.name: f.default for f in dataclasses.fields(LoaderConfig) if f.init and f.default is not dataclasses.MISSING}
    given = dict(defaults, B=2, T=8, shuffle=False, seed=3, cache_dir=tmp_path, self=object(), tokenizer=None)
    config = LoaderConfig.of_call(dict(given, data=Source("d", shuffle=True)))
    assert (config.B, config.T, config.shuffle, config.seed, config.cache_dir) == (2, 8, True, 3, str(tmp_path))
    assert LoaderConfig.of_call(dict(given, data=Source("d"))).shuffle is False  # None: the loader's
    assert LoaderConfig.of_call(dict(given, data="d", shuffle=True, cache_dir=None)).cache_dir is None


def test_derived_sizes():
    concat = LoaderConfig(16, 2048)
    assert (concat.window, concat.max_runs, concat.spec.buffered) == (16 * 2048 + 1, 0, False)
    fit = LoaderConfig(16, 2048, packing="bos_bestfit", buffer_size=1000, tokenizer_batch_size=128)
    assert (fit.window, fit.max_runs, fit.spec.buffered) == (2 * 16 * 2048, 1128, True)
    assert LoaderConfig(2, 8).max_piece_docs == 1024
    assert LoaderConfig(2, 8, cache_dir="/c").max_piece_docs > 10 ** 9
    assert (concat.positions_words, LoaderConfig(16, 2048, positions=True).positions_words) == (0, 16 * 2048)


def test_fingerprint_holds_what_a_resume_may_not_change():
    """B, T and the files are checked on their own (a new shape or appended files continue)."""
    base = LoaderConfig(2, 8).fingerprint("t")
    assert base == {"split": "train", "packing": "concat", "tokenizer": "t"}
    assert LoaderConfig(4, 16, num_workers=3, n_slots=5, timeout=9, other_rank="nanochat",
                        positions=True).fingerprint("t") == base
    fit = LoaderConfig(2, 8, packing="bos_bestfit", buffer_size=7, tokenizer_batch_size=3).fingerprint("t")
    assert (fit["buffer_size"], fit["tokenizer_batch_size"]) == (7, 3)
    assert LoaderConfig(2, 8, on_bad_row_group="skip").fingerprint("t")["on_bad_row_group"] == "skip"
    with pytest.raises(ValueError, match="other_rank"):
        LoaderConfig(2, 8, other_rank="approximate")


def test_frozen():
    cfg = LoaderConfig(2, 8)
    with pytest.raises(Exception):
        cfg.B = 3


def test_defaults_that_depend_on_other_options_are_resolved_under_their_own_names():
    train, val = LoaderConfig(2, 8), LoaderConfig(2, 8, split="val")
    assert (train.idle_release_s, val.idle_release_s, LoaderConfig(2, 8, split="all").idle_release_s) == (0.0, 30.0, 0.0)
    assert (train.max_piece_docs, train.max_piece_bytes) == (1024, 8 << 20)
    assert LoaderConfig(2, 8, packing="bos_bestfit").max_piece_bytes == 2 << 20
    cached = LoaderConfig(2, 8, cache_dir="/c")
    assert cached.max_piece_bytes is None and cached.max_piece_docs >= 1 << 40  # whole row groups
    assert (train.stall_s, LoaderConfig(2, 8, max_restarts=0).stall_s) == (60.0, 0.0)
    given = LoaderConfig(2, 8, idle_release_s=5, max_piece_docs=7, max_piece_bytes=100, stall_s=3)
    assert (given.idle_release_s, given.max_piece_docs, given.max_piece_bytes, given.stall_s) == (5.0, 7, 100, 3.0)


@pytest.mark.parametrize("options,named", [
    ({"max_restarts": 0, "stall_s": 10}, "stall_s=10 acts only with max_restarts > 0"),
    ({"cache_dir": "/c", "max_piece_docs": 64}, "max_piece_docs=64 acts only without cache_dir"),
    ({"cache_dir": "/c", "max_piece_bytes": 1000}, "max_piece_bytes=1000 acts only without cache_dir"),
])
def test_an_option_that_cannot_act_with_the_others_is_refused(options, named):
    with pytest.raises(ValueError, match=named):
        LoaderConfig(2, 8, **options)
    assert LoaderConfig(2, 8, max_restarts=0, stall_s=0).stall_s == 0.0  # off, as with max_restarts=0


def test_a_bad_split_names_every_split():
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'val', 'all'\).*'all' \(every file"):
        LoaderConfig(2, 8, split="test")


def test_numpy_integers_and_floats_are_taken_as_python_numbers():
    """A count from numpy (`np.int64(16)`, a sweep's `np.arange`) is an integer: it was refused
    as "B must be a positive integer, got np.int64(16)"; and a numpy rank was taken as it was,
    so that `state_dict()` was no longer JSON (json.dumps: "Object of type int64 is not JSON
    serializable"). Each is kept as a Python int (or float), as a state needs them."""
    import json

    import numpy as np

    from shmloader.config import place

    cfg = LoaderConfig(np.int64(16), np.int32(64), num_workers=np.int64(2), n_slots=np.uint8(4), seed=np.int64(3),
                       shuffle=True, shuffle_window=np.int16(8), max_restarts=np.int64(1), log_every=np.int64(0),
                       timeout=np.float32(30), stall_s=np.float32(5), idle_release_s=np.int64(0))
    for name in ("B", "T", "num_workers", "n_slots", "seed", "shuffle_window", "max_restarts", "log_every"):
        assert type(getattr(cfg, name)) is int, name
    for name in ("timeout", "stall_s", "idle_release_s"):
        assert type(getattr(cfg, name)) is float, name
    assert (cfg.B, cfg.T, cfg.timeout) == (16, 64, 30.0)
    json.dumps(cfg.fingerprint("t"))
    got = place(np.int64(1), np.int64(2))
    assert got == (1, 2) and all(type(v) is int for v in got)
    for rank, world in ((0.0, 1), (True, 2), (0, "2")):
        with pytest.raises(ValueError, match=r"rank|world_size"):
            place(rank, world)


def test_rank_comes_from_an_initialized_process_group_where_torchrun_s_variables_are_not_set(monkeypatch):
    """A script started by `torch.multiprocessing.spawn` (or SLURM, MPI) that passes `rank=` to
    `init_process_group` sets no `RANK`: every rank's loader was rank 0 of 1, so all ranks trained
    on the same batches, silently (tests/loader/test_client_trial.py runs it in two real processes).
    torchrun's variables still come first, and the arguments before them."""
    import torch.distributed as dist

    from shmloader.config import place
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert place(None, None) == (0, 1)  # no group: 0 of 1
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    assert place(None, None) == (1, 2)
    assert place(0, 3) == (0, 3)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert place(None, None) == (1, 2)  # torchrun's, the group's too


@pytest.mark.parametrize("env", [{"RANK": "0"}, {"RANK": "0", "WORLD_SIZE": "1"}, {"WORLD_SIZE": "1"},
                                 {"RANK": "1", "WORLD_SIZE": "4"}])
def test_torchrun_s_variables_other_than_an_initialized_group_s_are_refused_naming_both(monkeypatch, env):
    """Rank and world size came each from its own place, the variables first: under
    `torch.multiprocessing.spawn` of 2 ranks, `RANK=0` alone (copied to every rank) made both
    ranks rank 0 of 2 (rank 1's half never read), a stale `RANK=0, WORLD_SIZE=1` both 0 of 1.
    Now they come from one place, and a variable set to other than the group's is refused."""
    import torch.distributed as dist

    from shmloader.config import place
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    said = ", ".join(f"{k}={v}" for k, v in env.items())
    with pytest.raises(ValueError, match=rf"process \d+'s environment says {said} but torch.distributed's default "
                                         rf"group says rank 1 of 2 .*pass rank= and world_size= \(the data-parallel group's"):
        place(None, None)
    assert place(0, 2) == (0, 2)  # given: neither is read
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)  # the rank whose RANK=0 is right
    if env.get("WORLD_SIZE") in (None, "2") and env.get("RANK") in (None, "0"):
        assert place(None, None) == (0, 2)


def test_a_rank_past_the_world_size_says_where_each_came_from(monkeypatch):
    """`RANK` set without `WORLD_SIZE` (a hand-written launcher): "got rank 3 of 1" named neither."""
    from shmloader.config import place
    monkeypatch.setenv("RANK", "3")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=r"got rank 3 \(\$RANK\) of 1 \(the default\); pass both rank= and "
                                         r"world_size=, or set both RANK and WORLD_SIZE"):
        place(None, None)
    with pytest.raises(ValueError, match=r"got rank 3 \(\$RANK\) of 2 \(given\)"):
        place(None, 2)


def test_world_size_without_rank_in_the_environment_is_refused(monkeypatch):
    """Ranks started by hand (found on a node's shape, /tmp/node): `WORLD_SIZE=2` set in both
    processes and `RANK` forgotten in one made that one rank 0 of 2 silently, so two processes
    read rank 0's share and rank 1's was never read. Now that is a ValueError naming both fixes;
    `rank=` given, `RANK` set or `WORLD_SIZE=1` decide as before (a group: the tests above)."""
    from shmloader.config import place
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"environment says WORLD_SIZE=2 and no RANK .*every process started so "
                                         r"would read rank 0's; set RANK \(0 to 1\) in each process, or pass "
                                         r"rank= and world_size=$"):
        place(None, None)
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's children: WORLD_SIZE, LOCAL_RANK, NODE_RANK, no RANK
    with pytest.raises(ValueError, match=r"such as Lightning's: make the loader after its process group starts"):
        place(None, None)
    monkeypatch.delenv("LOCAL_RANK")
    assert place(1, None) == (1, 2) and place(0, 2) == (0, 2)  # rank= given: as before
    monkeypatch.setenv("RANK", "1")
    assert place(None, None) == (1, 2)  # RANK set: as before
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert place(None, None) == (0, 1)  # one rank: no share to choose


def test_the_workers_bound_is_of_the_share_the_trainer_read(monkeypatch):
    """A coordinator (a child with no torch.distributed group) bounded its workers by the share it
    read itself: ranks found through the trainer's group (cores.local_ranks) got share 1 in the
    trainer and 2 in each coordinator, 2 ranks x 2 workers tokenizing on 2 cores. The config reads
    the share where it is made, and carries it."""
    import pickle

    from shmloader import cores
    monkeypatch.setattr(cores, "share", lambda env=None: 1)
    cfg = LoaderConfig(2, 8, num_workers=3)
    monkeypatch.setattr(cores, "share", lambda env=None: 2)  # the child's own reading
    assert cfg.workers_at_once == 1 and pickle.loads(pickle.dumps(cfg)).workers_at_once == 1
    assert LoaderConfig(2, 8, num_workers=3).workers_at_once == 2
