"""The runtime package stands alone: `shmloader` and every module in it import without
`shmloader_dev` (the corpus, the oracle, the test helpers and the demo's implementation),
each checked in a fresh interpreter so that nothing imported by another test counts."""
from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import shmloader

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNTIME_MODULES = sorted(f"shmloader.{m.name}" for m in pkgutil.iter_modules(shmloader.__path__))

CHECK = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
import shmloader
for name in shmloader.__all__:
    getattr(shmloader, name)
dev = sorted(m for m in sys.modules if m == "shmloader_dev" or m.startswith("shmloader_dev."))
print(" ".join(dev) or "none")
"""


def _dev_modules_after_import(*modules: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", CHECK, *modules], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_runtime_modules_are_found():
    for name in ("loader", "coordinator", "worker", "ring", "state", "demo"):
        assert f"shmloader.{name}" in RUNTIME_MODULES
    for name in ("corpus", "reference", "testing"):
        assert f"shmloader.{name}" not in RUNTIME_MODULES


def test_importing_shmloader_does_not_import_the_dev_package():
    assert _dev_modules_after_import("shmloader") == "none"


def test_importing_every_runtime_module_does_not_import_the_dev_package():
    assert _dev_modules_after_import(*RUNTIME_MODULES) == "none"


def test_dev_package_comes_from_this_checkout():
    import shmloader_dev

    assert Path(shmloader_dev.__file__).resolve().parent == REPO_ROOT / "shmloader_dev"
    assert Path(shmloader.__file__).resolve().parent == REPO_ROOT / "shmloader"
