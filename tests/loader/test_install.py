"""A newcomer's install: a wheel of the project in a fresh virtual environment, without the
dev extra, runs the tools (the checkout's tools/ and the installed console scripts and
`python -m shmloader.tools.<name>`); the demo says in one line to install the demo extra (rustbpe), and
runs with it. Marked slow: it installs torch and the runtime dependencies from the package
index into a new environment (38 s here with pip's cache warm, minutes with it cold):
`python -m pytest -m slow tests/loader/test_install.py`."""
import os
import subprocess
import sys
import venv

import pytest

from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow


def _run(cmd, cwd, timeout=900, env=None):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_a_wheel_without_the_dev_extra_runs_the_tools_and_with_the_demo_extra_the_demo(tmp_path):
    # without the suite's PYTHONPATH (the checkout): pip would take the checkout's editable
    # install's metadata for an installed shmloader and not install the wheel
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", tmp_path / "dist", REPO_ROOT], cwd=tmp_path,
         env=env)
    (wheel,) = (tmp_path / "dist").glob("shmloader-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", f"torch=={_torch_version()}"], cwd=tmp_path, env=env)
    _run([py, "-m", "pip", "install", "-q", wheel], cwd=tmp_path, env=env)
    listed = _run([py, "-m", "pip", "list", "--format=freeze"], cwd=tmp_path, env=env).lower()
    assert "shmloader==" in listed, listed
    for extra_only in ("pytest", "hypothesis", "moto", "matplotlib", "rustbpe"):
        assert f"{extra_only}==" not in listed, f"{extra_only} came with a plain install"
    demo = subprocess.run([str(py), "-m", "shmloader.demo", "--out-dir", str(tmp_path / "demo")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert demo.returncode == 2 and demo.stderr.splitlines() == [
        "demo: training a BPE tokenizer needs rustbpe, which is not installed: pip install shmloader[demo]"], demo
    _run([py, "-m", "pip", "install", "-q", f"{wheel}[demo]"], cwd=tmp_path, env=env)
    out = _run([py, "-m", "shmloader.demo", "--out-dir", tmp_path / "demo", "--batches", 20, "--batch-size", 2,
                "--seq-len", 256, "--vocab-size", 512], cwd=tmp_path, env=env)
    assert "stream verified" in out and "resume verified" in out, out
    for tool in ("pretokenize.py", "bench/throughput.py", "make_shards.py", "inspect_batch.py", "bench/elastic.py"):
        assert "usage:" in _run([py, REPO_ROOT / "tools" / tool, "--help"], cwd=tmp_path, env=env)
    for name in ("pretokenize", "inspect_batch", "plot_pipeline"):  # the tools installed with the package
        assert "usage:" in _run([env_dir / "bin" / f"shmloader-{name.replace('_', '-')}", "--help"], cwd=tmp_path, env=env)
        assert "usage:" in _run([py, "-m", f"shmloader.tools.{name}", "--help"], cwd=tmp_path, env=env)


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]
