"""The words of a poison verdict say what the worker was doing at both losses (procs/run.py
`Runs.allow`): a piece lost twice while it was being *read* (no document in the engine yet:
`Held.reading`) is not said to be tokenized. Found on a node's shape (16 workers, a shuffled
window read again by the replacement): two SIGKILLs of the worker reading one window, as an OOM
killer gives the process holding the largest row group, ended the run with "was being tokenized
... (it kills or hangs the worker or its tokenizer)", while no document of it had reached the
tokenizer. No processes are started: `Runs` is given a config and a kind of its own."""
import types

import pytest

from shmloader.errors import WorkerError
from shmloader.position import Position
from shmloader.procs.children import ChildLost
from shmloader.procs.heal import Held
from shmloader.procs.run import Runs

CONFIG = types.SimpleNamespace(max_restarts=3, on_bad_row_group="raise", stall_s=60.0)
KIND = types.SimpleNamespace(shuffled=lambda config: False, slot_buffer=lambda config: None)
AT = Position(1, 0, 0, 0)  # the stream stands before the piece: it is not passed


def lose_twice(held: Held, config=CONFIG) -> str:
    """The message of the second loss of a worker holding `held` (the first is healed)."""
    runs = Runs(config, None, None, 0, KIND)
    lost = lambda pid: ChildLost(f"worker 2 (pid {pid}) died: killed by signal SIGKILL", pid, held, worker=2)
    assert runs.allow(lost(101), AT) == 1  # healed: the piece becomes a suspect
    with pytest.raises(WorkerError) as info:
        runs.allow(lost(102), AT)
    return str(info.value)


def test_a_piece_lost_twice_while_read_is_said_to_be_read():
    text = lose_twice(Held("shard_04.parquet", 6, 0, 293, 1, 4, -1, -1))  # run -1: being read
    assert "was being read at two deaths" in text, text
    assert "tokenized" not in text and "its tokenizer" not in text, text
    assert "memory" in text, text  # the OOM killer's case is named


def test_a_document_lost_twice_in_the_engine_is_said_to_be_tokenized():
    text = lose_twice(Held("shard_04.parquet", 6, 0, 293, 1, 4, 40, 41))  # document 40 in the engine
    assert "was being tokenized at two deaths" in text and "its tokenizer" in text, text


def test_skipped_read_poison_is_warned_of_in_the_same_words():
    config = types.SimpleNamespace(max_restarts=3, on_bad_row_group="skip", stall_s=60.0)
    runs = Runs(config, None, None, 0, KIND)
    held = Held("shard_04.parquet", 6, 0, 293, 1, 4, -1, -1)
    lost = lambda pid: ChildLost(f"worker 2 (pid {pid}) died", pid, held, worker=2)
    runs.allow(lost(101), AT)
    with pytest.warns(UserWarning, match="was being read at two deaths"):
        runs.allow(lost(102), AT)
