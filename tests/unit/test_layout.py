"""The tree shows the architecture: folders by role, imports only downward, the design card's
top level, and a runtime that imports no test or tool code.

Layers (a module may import its own layer or lower ones, never a higher one):
0 `errors`, `position`, `profiling` (torch profiler ranges, for `procs/` and the loader), `progress` (long
work's progress, for `resume` and tools); 1 `ipc/` (the shared memory and the messages); 2 `data/` (files, order,
tokenizers, the token cache); 3 `packing/` (pure sequencing over token counts); 4 `procs/`
(the child processes and their starting); 5 the training process's front (`config`, `state`,
`delivery`, `attention`, `observe`, `loader`); 6 the entry points (`nanochat`, `demo/`, `tools/`, `__init__`). Imports are read
from the source (ast); the import checks run in fresh interpreters so that nothing imported
by another test counts. Those interpreters and `git ls-files` are the only subprocesses of
tests/unit/ (an exception kept here: they import modules or list files, no loader runs).
"""
from __future__ import annotations

import ast
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import shmloader
from tests.helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "shmloader"
RUNTIME_MODULES = sorted(m.name for m in pkgutil.walk_packages(shmloader.__path__, "shmloader."))

LAYERS = {
    "errors": 0, "position": 0, "profiling": 0, "progress": 0, "ipc": 1, "data": 2, "packing": 3, "procs": 4,
    "config": 5, "state": 5, "sourcestate": 5, "mixstate": 5, "mixchecks": 5, "mixkeys": 5, "resume": 5, "kinds": 5, "report": 5, "cores": 5, "delivery": 5, "attention": 5, "observe": 5, "loader": 5,
    "nanochat": 6, "demo": 6, "tools": 6, "__init__": 6,
}
CARD_TOP_LEVEL = {"setup.cfg", "shmloader", "tests", "tools"}
COMPANIONS = {"README.md", "LICENSE", "pyproject.toml", "docs", ".ci", ".gitignore"}


def _unit(module: str) -> str:
    """The layer key of `shmloader.x.y`: its folder `x`, or the top-level module `x`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _source(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    return PACKAGE / rel / "__init__.py" if (PACKAGE / rel).is_dir() else PACKAGE / f"{rel}.py"


def _imports(module: str) -> set[str]:
    """The shmloader modules `module` imports (absolute names), and `tests` / `tools` if it does."""
    path = _source(module)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names] if not node.module else [target]
            out.update(names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {n for n in out if n.split(".")[0] in ("shmloader", "tests", "tools")}


def test_every_runtime_folder_and_module_has_a_layer():
    assert "shmloader.procs.worker" in RUNTIME_MODULES and "shmloader.ipc.ring" in RUNTIME_MODULES
    units = {_unit(m) for m in RUNTIME_MODULES} | {"__init__"}
    assert units == set(LAYERS), f"give each folder or top-level module a layer: {units ^ set(LAYERS)}"


def test_no_module_imports_upward():
    upward = []
    for m in RUNTIME_MODULES:
        for dep in _imports(m):
            if dep.startswith("shmloader.") and LAYERS[_unit(dep)] > LAYERS[_unit(m)]:
                upward.append((m, dep))
    assert upward == [], f"modules importing a higher layer: {upward}"


def test_runtime_imports_no_test_or_tool_code():
    found = [(m, dep) for m in RUNTIME_MODULES for dep in _imports(m) if not dep.startswith("shmloader")]
    assert found == [], f"runtime modules importing tests/ or tools/: {found}"


def test_top_level_is_the_design_cards():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    if tracked.returncode != 0:
        import pytest
        pytest.skip("not a git checkout")
    names = {line.split("/", 1)[0] for line in tracked.stdout.splitlines()}
    assert CARD_TOP_LEVEL <= names, f"missing at the top level: {CARD_TOP_LEVEL - names}"
    assert names <= CARD_TOP_LEVEL | COMPANIONS, f"not on the design card: {names - CARD_TOP_LEVEL - COMPANIONS}"


CHECK = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in ("tests", "tools"))) or "none")
"""


def _run(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_importing_every_runtime_module_imports_no_test_code():
    importable = [m for m in RUNTIME_MODULES if not m.endswith(".__main__")]  # that one runs the demo
    assert _run(CHECK, *importable) == "none"


def test_importing_shmloader_imports_nothing_heavy():
    """`import shmloader` only defines names (torch, pyarrow and the processes' modules come with
    the first loader); every public name then resolves."""
    code = ("import sys, shmloader\n"
            "print(sorted(m for m in ('torch', 'pyarrow', 'shmloader.procs') if m in sys.modules))\n"
            "for name in shmloader.__all__: getattr(shmloader, name)")
    assert _run(code) == "[]"


def test_child_processes_never_import_torch():
    code = "import sys; import shmloader.procs.coordinator, shmloader.procs.worker; print('torch' in sys.modules)"
    assert _run(code) == "False", "the coordinator or a worker imports torch"


def test_the_design_pages_module_map_is_the_tree():
    """docs/design.md's module map names every runtime module (a folder row covers its files;
    empty package `__init__.py` files and `__main__.py` need no row), and nothing that is gone."""
    import re

    text = (REPO_ROOT / "docs" / "design.md").read_text()
    section = text.split("## The tree", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| \d \| `([a-z_/]+(?:\.py|/))`", section, flags=re.M))
    folders = {n for n in named if n.endswith("/")}
    files = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__main__.py" or (path.name == "__init__.py" and not path.read_text().strip()):
            continue
        files.add(next((d for d in folders if rel.startswith(d)), rel))
    assert named == files, f"in the map, not the tree: {named - files}; in the tree, not the map: {files - named}"


# what each third-party module the runtime imports comes from, where its distribution's name differs
DISTRIBUTION = {"awkward": "gigatoken"}  # awkward: a requirement of gigatoken, imported only with it


def _setup_cfg() -> tuple[set[str], dict[str, set[str]]]:
    """setup.cfg's install_requires and extras, as distribution names."""
    import configparser
    import re

    cfg = configparser.ConfigParser()
    cfg.read(REPO_ROOT / "setup.cfg")
    names = lambda text: {re.match(r"[A-Za-z0-9_.-]+", line.strip()).group(0).lower()
                          for line in text.splitlines() if line.strip()}
    return (names(cfg["options"]["install_requires"]),
            {extra: names(text) for extra, text in cfg["options.extras_require"].items()})


def test_the_runtime_imports_only_what_setup_cfg_installs():
    """Every third-party module shmloader imports is a requirement, or in an extra (its import
    then in a function, where it is needed: never at a module's top). rustbpe, which only the
    demo's tokenizer training needs, is the `demo` extra's (and `dev`'s: the tests train)."""
    requires, extras = _setup_cfg()
    optional = set().union(*extras.values())
    stray, eager = [], []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                mods = [node.module]
            else:
                continue
            for mod in {m.split(".")[0] for m in mods} - set(sys.stdlib_module_names) - {"shmloader"}:
                dist = DISTRIBUTION.get(mod, mod).lower()
                if dist not in requires | optional:
                    stray.append(f"{path.relative_to(REPO_ROOT)}: {mod}")
                elif dist not in requires and id(node) in top:
                    eager.append(f"{path.relative_to(REPO_ROOT)}: {mod}")
    assert stray == [] and eager == []
    assert "rustbpe" not in requires and {"rustbpe"} <= extras["demo"] & extras["dev"]


# "is it a mixture?" asked in code: a type test of the kind's records, or of a run's mixture
KIND_TEST = re.compile(r"\b(mix|mixture)\s+is\s+(not\s+)?None|\bif\s+(not\s+)?[\w.]+\.mixture\s*:"
                       r"|isinstance\([^)]*\b(Mixture|Sources|Sourced|MixStart|SourceStart|MixArgs|Shuffle)\b"
                       r"|hasattr\([^)]*mixture|[\"']mixture[\"']\s+(not\s+)?in\b")


def _knows_the_kind(module: str) -> bool:
    """Whether `module` may ask which kind the loader reads: kinds.py (the one place that picks
    it), one source's state (sourcestate.py) and the mixture's own modules (mix*.py anywhere)."""
    name = module.rsplit(".", 1)[-1]
    return name in ("kinds", "sourcestate") or name.startswith("mix")


def test_no_module_outside_the_mixing_stage_asks_whether_it_reads_a_mixture():
    """Issue 50: the processes and the order run what the kind gives them (kinds.py
    `run_fields`: the modes, the shuffled order's `order_of`); none asks which kind it is."""
    found = []
    for m in RUNTIME_MODULES:
        if _knows_the_kind(m):
            continue
        for n, line in enumerate(_source(m).read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if KIND_TEST.search(code):
                found.append(f"{_source(m).relative_to(REPO_ROOT)}:{n}: {line.strip()}")
    assert found == [], "kind tests outside kinds.py and the mixture's modules:\n" + "\n".join(found)
