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


# Each module's layer: a module may import its own layer or lower ones, never a higher one.
# 0: shared definitions; 1: pure logic (no processes); 2: one child process's loop and its
# I/O; 3: the training process; 4: the drop-in functions and entry points.
LAYERS = {
    "errors": 0, "config": 0, "ring": 0, "handover": 0, "protocol": 0, "tokenizer": 0, "engine": 0,
    "outbuf": 0,
    "plan": 1, "bestfit": 1, "sequencing": 1, "packing": 1, "bestfit_seq": 1, "locate": 1,
    "state": 1, "source": 1, "cache": 1,
    "coordinator": 2, "worker": 2,
    "delivery": 3, "loader_procs": 3, "loader": 3,
    "nanochat": 4, "demo": 4, "__init__": 4,
}
CHILD_MODULES = ("coordinator", "worker")


def _imports(name: str) -> set[str]:
    import ast

    tree = ast.parse((REPO_ROOT / "shmloader" / f"{name}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {node.module} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shmloader."):
            out.add(node.module.split(".")[1])
    return out


def test_no_module_imports_upward():
    assert set(LAYERS) == {m.rsplit(".", 1)[1] for m in RUNTIME_MODULES} | {"__init__"}, \
        "a module is missing from LAYERS: give it a layer"
    upward = [(m, dep) for m in LAYERS for dep in _imports(m) if dep in LAYERS and LAYERS[dep] > LAYERS[m]]
    assert upward == [], f"modules importing a higher layer: {upward}"


def test_child_processes_never_import_torch():
    code = ("import sys; import shmloader.coordinator, shmloader.worker; "
            "print('torch' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "the coordinator or a worker imports torch"
