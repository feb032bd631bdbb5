"""The training process's temporary directory (procs/start.py): shmloader's own name, a lock
its owner holds for life, and a sweep that removes only directories of exactly that name whose
lock nobody holds (their owner is gone), never anything else in the temporary directory."""
import fcntl
import os
import time

from shmloader.procs import start


def _ours(root, name: str, locked: bool):
    path = root / name
    path.mkdir()
    fd = os.open(path / start.TEMP_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    if locked:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return path, fd
    os.close(fd)
    return path, None


def test_the_sweep_removes_only_unlocked_directories_of_its_own_name(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dead, _ = _ours(tmp_path, "shml_tmp_12345_abcdefgh", locked=False)
    live, fd = _ours(tmp_path, "shml_tmp_12346_abcdefgh", locked=True)
    others = [tmp_path / n for n in ("shmloader-bench-abc", "shml_tmp_x_abcdefgh", "pymp-abcdefgh",
                                     "shml_tmp_12_abcdefgh_extra")]
    for p in others:
        p.mkdir()
        os.utime(p, (time.time() - 3600, time.time() - 3600))  # old: an unborn rule would take them
    try:
        start._sweep_tempdirs()
        assert not dead.exists() and live.exists()
        assert all(p.exists() for p in others)
    finally:
        os.close(fd)
    start._sweep_tempdirs()
    assert not live.exists()  # its owner let go


def test_one_without_its_lock_file_is_taken_for_one_being_made_until_it_is_old(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    young, old = tmp_path / "shml_tmp_1_aaaaaaaa", tmp_path / "shml_tmp_2_bbbbbbbb"
    young.mkdir()
    old.mkdir()
    os.utime(old, (time.time() - start.UNBORN_S - 5,) * 2)
    start._sweep_tempdirs()
    assert young.exists() and not old.exists()
