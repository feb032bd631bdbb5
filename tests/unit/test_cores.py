"""cores.py: more workers than usable cores is a warning naming both counts and what it costs;
as many or fewer is nothing; a rank's share of the cores and the default `num_workers`."""
import os
import subprocess
import sys
import warnings

import pytest

from shmloader import cores


def test_workers_that_fit_say_nothing():
    assert cores.oversubscribed(1, 1) is None
    assert cores.oversubscribed(8, 16) is None
    assert cores.oversubscribed(16, 16) is None


def test_more_workers_than_cores_names_both_and_the_fitting_count():
    text = cores.oversubscribed(8, 2)
    assert "num_workers=8" in text and "2 cores" in text and "num_workers=2 reads as much" in text
    assert "More workers than cores" in text  # where its figures are
    assert "1 core " in cores.oversubscribed(3, 1)


def test_usable_is_this_process_affinity():
    assert cores.usable() == len(os.sched_getaffinity(0)) >= 1


def test_a_ranks_share_splits_an_unpinned_machine_among_its_local_ranks(monkeypatch):
    """torchrun's LOCAL_WORLD_SIZE ranks on a machine whose every core each may run on share
    them; a rank pinned to fewer cores than the machine has sees its share as its affinity."""
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(cores, "usable", lambda: 16)
    assert cores.share({}) == 16 and cores.share({"LOCAL_WORLD_SIZE": "1"}) == 16
    assert cores.share({"LOCAL_WORLD_SIZE": "8"}) == 2 and cores.share({"LOCAL_WORLD_SIZE": "32"}) == 1
    for junk in ("", "0", "x", "-2"):
        assert cores.share({"LOCAL_WORLD_SIZE": junk}) == 16
    monkeypatch.setattr(cores, "usable", lambda: 2)  # pinned: 2 of the 16
    assert cores.share({"LOCAL_WORLD_SIZE": "8"}) == 2


def test_the_default_workers_are_the_share_at_most_four(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    for usable, ranks, expected in ((1, "1", 1), (2, "1", 2), (3, "1", 3), (16, "1", 4), (16, "8", 2), (16, "2", 4)):
        monkeypatch.setattr(cores, "usable", lambda usable=usable: usable)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
        assert cores.default_workers() == expected, (usable, ranks)


def test_more_workers_than_cores_as_many_as_the_cores_tokenize_at_once():
    assert cores.at_once(8, 2) == 2 and cores.at_once(3, 2) == 2 and cores.at_once(17, 16) == 16
    assert cores.at_once(2, 2) is None and cores.at_once(1, 4) is None


def test_the_ranks_on_this_machine_are_what_a_launcher_says(monkeypatch):
    """torchrun's, Open MPI's, MPICH's, MVAPICH2's count, then SLURM's tasks on this node
    ("4(x2),3": node 2 has 3); junk says nothing."""
    monkeypatch.setattr(cores, "_group", lambda: None)
    assert cores.local_ranks({}) == cores.Ranks(1, None)
    for name in cores.LOCAL_ENV:
        assert cores.local_ranks({name: "8"}) == cores.Ranks(8, name)
    slurm = {"SLURM_STEP_TASKS_PER_NODE": "4(x2),3"}
    assert [cores.local_ranks({**slurm, "SLURM_NODEID": n}).count for n in ("0", "1", "2", "3")] == [4, 4, 3, 1]
    for junk in ("", "x", "4(x", "0"):
        assert cores.local_ranks({"SLURM_STEP_TASKS_PER_NODE": junk, "SLURM_NODEID": "0",
                                  "LOCAL_WORLD_SIZE": "x"}).count == 1


def test_a_group_met_at_a_loopback_address_is_all_on_this_machine(monkeypatch):
    """Ranks started by hand: a torch.distributed group whose store is at 127.0.0.1 or localhost
    (no other machine reaches it) has every rank here; one at another address says nothing, and
    `crowded` says once that its ranks may share the cores."""
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(cores, "usable", lambda: 16)
    for host in ("127.0.0.1", "localhost", "::1"):
        monkeypatch.setattr(cores, "_group", lambda host=host: cores._Group(8, host))
        assert cores.local_ranks({}).count == 8 and cores.share({}) == 2 and cores.unknown_ranks({}) is None
    monkeypatch.setattr(cores, "_group", lambda: cores._Group(8, "10.0.0.7"))
    assert cores.local_ranks({}) == cores.Ranks(1, None) and cores.share({}) == 16
    assert cores.unknown_ranks({}) == 8 and cores.unknown_ranks({"LOCAL_WORLD_SIZE": "8"}) is None
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.warns(cores.CoresWarning, match="group of 8 ranks, and nothing says how many of them run on this "
                                                "machine.*set LOCAL_WORLD_SIZE"):
        cores.crowded(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cores.crowded(1)  # one worker: nothing to share
        monkeypatch.setattr(cores, "_group", lambda: cores._Group(1, "10.0.0.7"))
        cores.crowded(4)  # a group of one
    monkeypatch.setattr(cores, "_group", lambda: cores._Group(8, "10.0.0.7"))
    monkeypatch.setattr(cores, "usable", lambda: 2)  # pinned: its own cores
    assert cores.unknown_ranks({}) is None


_SPAWNED = """
import sys
import torch.distributed as dist
import torch.multiprocessing as mp

def rank(r, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=2)
    from shmloader import cores
    print(r, cores.share(), cores.usable(), file=open(f"{out}.{r}", "w"))
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank, args=(int(sys.argv[1]), sys.argv[2]), nprocs=2)
"""


@pytest.mark.skipif(cores.usable() < 2, reason="a share of one core is the affinity's")
def test_ranks_spawned_by_hand_share_the_cores(tmp_path):
    """Two ranks of torch.multiprocessing.spawn in a gloo group at 127.0.0.1, no torchrun and no
    LOCAL_WORLD_SIZE: each rank's share is half the cores (it was all of them: each rank's
    default num_workers took every core)."""
    pytest.importorskip("torch.distributed")
    from tests.helpers import REPO_ROOT, free_port

    env = {k: v for k, v in os.environ.items() if k not in cores.LOCAL_ENV and not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    script = tmp_path / "spawned.py"
    script.write_text(_SPAWNED)
    out = subprocess.run([sys.executable, str(script), str(free_port()), str(tmp_path / "rank")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for r in (0, 1):
        _, share, usable = (tmp_path / f"rank.{r}").read_text().split()
        assert int(share) == int(usable) // 2, (r, share, usable)


def test_a_loopback_group_larger_than_a_launchers_count_is_the_count(monkeypatch):
    """8 ranks spawned at 127.0.0.1 inside one task of `srun --pty bash` (SLURM says 1 task on this
    node) or under a stale LOCAL_WORLD_SIZE=1: the group's 8 ranks share the cores; a launcher that
    says more than a loopback group (its ranks in several groups) is taken."""
    monkeypatch.setattr(cores, "_group", lambda: cores._Group(8, "127.0.0.1"))
    assert cores.local_ranks({"SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_NODEID": "0"}).count == 8
    assert cores.local_ranks({"LOCAL_WORLD_SIZE": "1"}).count == 8
    assert cores.local_ranks({"LOCAL_WORLD_SIZE": "16"}) == cores.Ranks(16, "LOCAL_WORLD_SIZE")
    monkeypatch.setattr(cores, "_group", lambda: cores._Group(8, "10.0.0.7"))
    assert cores.local_ranks({"LOCAL_WORLD_SIZE": "1"}) == cores.Ranks(1, "LOCAL_WORLD_SIZE")
