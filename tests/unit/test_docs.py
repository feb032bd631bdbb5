"""The docs follow the code: every protocol message is named in NOTE [ring protocol] and in
docs/design.md; the state's version is written in one place (`state.VERSION`); no docstring,
comment or page names a module, file or name of shmloader that does not exist
(`shmloader.x.y`, `procs/x.py`, `tests/.../x.py`, a backticked `module.Name`, `Class.name`, or
`snake_name`). And what they say the code does, it does: how a lent slot comes back, what a
state check refuses, every value a choice option accepts, every engine a worker names, and a
count in words ("four ways") is the length of the list after it. Read from the sources, in this
process. (The state's keys and digest against a real loader's: tests/loader/test_state_format.py.)
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import io
import re
import textwrap
import tokenize
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

import shmloader
from shmloader import config, packing, profiling, sourcestate, state
from shmloader.ipc import protocol
from shmloader.sourcestate import Files
from tests.helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "shmloader"
PAGES = sorted((REPO_ROOT / "docs").glob("*.md")) + [REPO_ROOT / "README.md"]
SOURCES = sorted(PACKAGE.rglob("*.py"))
TOP = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir() and
                                                 (p / "__init__.py").exists()}
TOP.discard("__init__")
TOP.discard("__main__")


def _messages() -> set[str]:
    """The records that travel between the processes: protocol.py's NamedTuples and each
    packing's write order."""
    names = {name for name, obj in vars(protocol).items()
             if isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")
             and obj.__module__ == protocol.__name__}
    return names | {spec.order.__name__ for spec in packing.PACKINGS.values()}


def test_every_message_is_named_in_the_note_and_the_design_page():
    messages = _messages()
    assert {"Task", "Counted", "Written", "Released", "Place", "Rows"} <= messages
    note, design = protocol.__doc__, (REPO_ROOT / "docs" / "design.md").read_text()
    assert [m for m in sorted(messages) if not re.search(rf"`{m}\b", note)] == [], "not in NOTE [ring protocol]"
    assert [m for m in sorted(messages) if not re.search(rf"`{m}\b", design)] == [], "not in docs/design.md"


def test_the_state_version_is_written_in_one_place():
    """Pages and docstrings say `state.VERSION`, never its number (older versions are named)."""
    current = re.compile(rf'(\bversion\s+{state.VERSION}\b|"version":\s*{state.VERSION}\b)', re.I)
    said = [f"{path.relative_to(REPO_ROOT)}: {m.group(0)}" for path in PAGES + SOURCES
            for m in current.finditer(path.read_text())]
    assert said == []


def _exists(dotted: str) -> bool:
    """Whether `shmloader.a.b.Name` (or `a.b.Name`, relative to the package) names a module or
    an attribute of one (the first attribute past the module is checked)."""
    parts = dotted.split(".")
    if parts[0] == "shmloader":
        parts = parts[1:]
    if not parts:
        return True
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module("shmloader." + ".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        return not rest or hasattr(module, rest[0]) or rest[0] in getattr(module, "__annotations__", {})
    return hasattr(shmloader, parts[0])


PATH = re.compile(r"(?<![\w/.])((?:shmloader/)?(?:ipc|data|packing|procs|demo)/\w+\.py"
                  r"|(?:tools|tests|docs)/[\w/]+\.(?:py|md|json|png))")
DOTTED = re.compile(r"(?<![\w.])(shmloader(?:\.\w+)+)")
TICKED = re.compile(r"`((?:" + "|".join(sorted(TOP)) + r")(?:\.\w+)+)(?:\(|`)")
INSTANCES = {"loader", "config", "resume", "state", "run", "catalogue"}  # also the names of instances
RANGES = {profiling.NEXT, profiling.WAIT, profiling.COPY}  # torch profiler ranges' names, not modules


def _checked(dotted: str) -> bool:
    """Backticked `module.name` is checked unless it may be an instance's attribute: a
    lowercase name after a module whose name is also an instance's (`loader.debug()`)."""
    parts = dotted.split(".")
    return parts[-1] != "py" and (len(parts) > 2 or parts[1][0].isupper() or parts[0] not in INSTANCES)


def _references(text: str):
    for m in PATH.finditer(text):
        path = m.group(1)
        yield path, (REPO_ROOT / path).exists() or (PACKAGE / path).exists()
    for m in DOTTED.finditer(text):
        if m.group(1).rstrip(".") not in RANGES:
            yield m.group(1), _exists(m.group(1).rstrip("."))
    for m in TICKED.finditer(text):
        if _checked(m.group(1)):
            yield m.group(1), _exists(m.group(1))


def test_no_page_or_docstring_names_what_does_not_exist():
    missing = [f"{path.relative_to(REPO_ROOT)}: {name}" for path in PAGES + SOURCES
               for name, ok in _references(path.read_text()) if not ok]
    assert missing == []


@pytest.mark.parametrize("text,ok", [
    ("see procs/worker.py", True), ("see procs/nothing.py", False), ("`state.Writer`", True),
    ("`state.Nothing`", False), ("shmloader.procs.run.Mark", True), ("shmloader.engine", False),
    ("tests/unit/test_docs.py", True), ("tools/no_such_tool.py", False),
])
def test_the_reference_check_can_fail(text, ok):
    assert all(found for _, found in _references(text)) is ok and list(_references(text))


def test_every_option_of_the_loader_is_in_help_with_its_default():
    """`help(shmloader.ShmLoader)` shows every option: an explicit parameter with its default,
    named in the constructor's docstring."""
    import dataclasses
    import inspect

    from shmloader.config import LoaderConfig

    params = inspect.signature(shmloader.ShmLoader.__init__).parameters
    doc = shmloader.ShmLoader.__init__.__doc__
    for field in dataclasses.fields(LoaderConfig):
        if not field.init:  # not an option: what the config reads where it is made (cores_share)
            continue
        assert field.name in params, f"{field.name} is not a parameter of ShmLoader"
        assert re.search(rf"\b{field.name}\b", doc), f"{field.name} is not in ShmLoader's docstring"
        if field.default is not dataclasses.MISSING:
            assert params[field.name].default == field.default, field.name
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), "no option may hide in **kwargs"
    assert typing.get_type_hints(shmloader.ShmLoader.__init__)  # typed


# ---------------------------------------------------------------- what the pages say the code does

DESIGN = (REPO_ROOT / "docs" / "design.md").read_text()
CONTRACT = (REPO_ROOT / "docs" / "contract.md").read_text()
README = (REPO_ROOT / "README.md").read_text()


def _squash(text: str) -> str:
    return " ".join(text.split())


def test_every_place_says_how_a_lent_slot_comes_back():
    """A lent CPU batch's slot comes back as `delivery.Lending` frees it: by the reference counts of
    its views, read at the next `next()`, not by a weak-reference callback. NOTE [ring protocol]'s
    item 1, delivery.py's `Lending` and design.md's trainer say so."""
    from shmloader import delivery

    lending = inspect.getsource(delivery.Lending)
    assert "getrefcount" in lending and "weakref" not in lending, "Lending changed: say how in these places"
    places = {
        "NOTE [ring protocol] item 1": re.search(r"^1\. (.*?)^2\. ", protocol.__doc__, re.S | re.M).group(1),
        "delivery.py's Lending": re.search(r"^- `Lending`(.*?)^- ", delivery.__doc__, re.S | re.M).group(1),
        "design.md's Trainer": re.search(r"^- \*\*Trainer\*\*(.*?)^- \*\*", DESIGN, re.S | re.M).group(1),
    }
    for where, text in places.items():
        assert "reference count" in _squash(text) and "weak" not in text, where


def _refused(saved_world: int, **fingerprint) -> bool:
    """Whether `state.check` refuses a state saved at `saved_world` with `fingerprint`'s changes,
    given to rank 0 of 1 with the fingerprint below."""
    from shmloader.position import Position

    files = [["shard_00000.parquet", 1000, None], ["shard_00001.parquet", 2000, None]]
    mine = {"split": "train", "packing": "concat", "tokenizer": "0123456789abcdef"}
    old = state.Loader(dict(mine, **fingerprint), files, 0, saved_world, 4, 16)
    mark = SimpleNamespace(position=Position(1, 0, 0, 3, 0), buffer=None, batch=7, read=None)
    saved = state.Writer(old, state.start(old, state.AtSource()), Files()).state(mark)
    try:
        state.check(saved, state.Loader(mine, files, 0, 1, 4, 16), Files())
    except ValueError:
        return True
    return False


def test_what_the_pages_say_a_state_check_refuses_is_what_it_refuses():
    """The contract's first check and sourcestate.py's docstring list what makes a state refused; each
    difference listed is refused by `state.check`, each other one is not (another world size
    resumes elastically)."""
    refused = {"split": _refused(1, split="val"), "packing": _refused(1, packing="bos_bestfit"),
               "tokenizer": _refused(1, tokenizer="fedcba9876543210"), "world size": _refused(2)}
    assert refused == {"split": True, "packing": True, "tokenizer": True, "world size": False}
    contract = _squash(re.search(r"\*\*Checks\.\*\*.*?\n- Another (.*?) is\s+refused", CONTRACT, re.S).group(1))
    docstring = _squash(re.search(r"any other\s+difference \((.*?)\)\s+is", sourcestate.__doc__, re.S).group(1))
    for where, text in (("docs/contract.md §3 Checks", contract), ("sourcestate.py's docstring", docstring)):
        assert {what: what in text for what in refused} == refused, where


OPTION_VALUES = {  # what LoaderConfig accepts (config.py `_check`)
    "split": config.SPLITS,
    "packing": tuple(packing.PACKINGS),
    "on_bad_row_group": config.BAD_ROW_GROUP,
    "other_rank": config.OTHER_RANK,
    "engine": config.ENGINES,
    "start_method": config.START_METHODS,
}


def _docstring_entry(doc: str, name: str) -> str:
    """ShmLoader's docstring's entry for option `name` (`name: ...` up to the next entry)."""
    m = re.search(rf"^(\s+)(?:\w+, )*{name}(?:, \w+)*: (.*?)(?=^\1\w+(?:, \w+)*: |\Z)", doc, re.S | re.M)
    assert m, f"{name} has no entry in ShmLoader's docstring"
    return m.group(2)


def _readme_row(name: str) -> str:
    m = re.search(rf"^\| `{name}` \|.*$", README, re.M)
    assert m, f"{name} has no row in the README's options"
    return m.group(0)


def test_every_value_an_option_accepts_is_named_where_the_option_is_explained():
    """ShmLoader's docstring and the README's option row name every value of a choice that
    LoaderConfig accepts; engine=, also data/engine.py and docs/engines.md's table."""
    from shmloader.config import LoaderConfig
    from shmloader.data import engine

    source = inspect.getsource(LoaderConfig._check)
    for name, values in OPTION_VALUES.items():
        assert re.search(rf'"{name}"|{name} must', source), f"{name}: not a choice LoaderConfig checks"
        places = {"ShmLoader's docstring": _docstring_entry(shmloader.ShmLoader.__init__.__doc__, name),
                  "README": _readme_row(name)}
        if name == "engine":
            places["data/engine.py"] = re.search(r"`LoaderConfig.engine` is (.*?)\.\s", engine.__doc__, re.S).group(1)
            table = (REPO_ROOT / "docs" / "engines.md").read_text().split("## `engine=`")[1]
            places["docs/engines.md"] = "\n".join(line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `"))
        for where, text in places.items():
            assert [v for v in values if f'"{v}"' not in text] == [], f"{name}= in {where}"


def test_every_engine_a_worker_names_is_in_the_pages():
    """`stats()`'s engine of a worker is one of `engine.NAMES` (the test hook's aside): docs/engines.md
    names each, the README each fast engine."""
    from shmloader.data import engine

    names = [n for n in engine.NAMES if n and n != "hook"]
    said = (REPO_ROOT / "docs" / "engines.md").read_text().split("## Which engine is working")[1].split("##")[0]
    assert [n for n in names if f'"{n}"' not in said] == [], "docs/engines.md, Which engine is working"
    readme = README[README.index("and `engine`, the tokenizer engine it uses now"):][:300]
    assert [n for n in ("fastokens", "gigatoken") if f'"{n}"' not in readme] == [], "README's stats()"
    assert set(config.ENGINES) - {"auto"} <= set(engine.NAMES)


COUNTS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
COUNTED = re.compile(r"\b(" + "|".join(COUNTS) + r") (ways|steps|kinds|rules|cases)\b")
ITEM = re.compile(r"^(\s*)(- |\d+\. )")


def _list_after(text: str, at: int) -> list[str]:
    """The items of the first list after `at`: lines that begin one, at its first item's indent
    (other lines, more indented, continue an item; a blank line or a line less indented ends it)."""
    lines = text[at:].splitlines()[1:]
    first = next(i for i, line in enumerate(lines) if ITEM.match(line))
    indent = len(ITEM.match(lines[first]).group(1))
    items = []
    for line in lines[first:]:
        m = ITEM.match(line)
        if m and len(m.group(1)) == indent:
            items.append(line.strip())
        elif not line.strip() or len(line) - len(line.lstrip()) <= indent:
            break
    return items


def test_a_count_in_words_counts_the_list_after_it():
    """"One interface, four ways", "in five steps": the list that follows has that many items."""
    wrong, seen = [], 0
    for path in PAGES + SOURCES:
        text = path.read_text()
        for m in COUNTED.finditer(text):
            seen += 1
            items = _list_after(text, m.start())
            if len(items) != COUNTS[m.group(1)]:
                wrong.append(f"{path.relative_to(REPO_ROOT)}: {m.group(0)!r}, {len(items)} listed")
    assert seen >= 2 and wrong == []


def test_delivery_names_every_way_a_slot_becomes_a_batch():
    """delivery.py's docstring lists each delivery (a class with `batch`, `reclaim` and `close`) once."""
    from shmloader import delivery

    ways = {name for name, obj in vars(delivery).items() if isinstance(obj, type)
            and all(hasattr(obj, m) for m in ("batch", "reclaim", "close"))}
    listed = re.findall(r"^- `(\w+)`", delivery.__doc__, re.M)
    assert ways >= {"Lending", "PinnedCopy"} and sorted(listed) == sorted(ways)


@functools.cache
def _classes() -> dict[str, list[type]]:
    """Every class of shmloader, by name (a name may be several modules')."""
    import pkgutil

    out = {}
    for info in pkgutil.walk_packages(shmloader.__path__, "shmloader."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if isinstance(obj, type) and obj.__module__ == module.__name__:
                out.setdefault(name, []).append(obj)
    return out


def _has(cls: type, attr: str) -> bool:
    """A class attribute, a field, or an attribute its methods set on `self`."""
    if hasattr(cls, attr) or any(attr in vars(c).get("__annotations__", {}) for c in cls.__mro__):
        return True
    for c in cls.__mro__:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(c)))
        except (OSError, TypeError):
            continue
        if any(isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.value, ast.Name)
               and n.value.id in ("self", "cls") for n in ast.walk(tree)):
            return True
    return False


CLASS_ATTR = re.compile(r"`(?:[\w.]*\.)?([A-Z]\w*)\.([A-Za-z_]\w*)")


def test_every_backticked_class_attribute_exists():
    """`Class.name` in a page, docstring or comment names an attribute, field or method of a
    shmloader class of that name."""
    classes = _classes()
    missing = [f"{path.relative_to(REPO_ROOT)}: {m.group(0)[1:]}" for path in PAGES + SOURCES
               for m in CLASS_ATTR.finditer(path.read_text())
               if m.group(1) in classes and not any(_has(c, m.group(2)) for c in classes[m.group(1)])]
    assert missing == []


# names of other libraries, and a formula's, that pages and docstrings name in backticks
OUTSIDE = {"create_block_mask", "flash_attn_varlen_func", "varlen_attn", "flex_attention", "collate_fn", "w_s"}
SNAKE = re.compile(r"(?<![\w.])`([a-z]\w*_\w*)(?:\(\w*\)?)?`")


@functools.cache
def _identifiers() -> frozenset[str]:
    """Every name the code of shmloader, tools/ and tests/ (but this file) uses, every word of
    its short string literals (keys, messages; not docstrings), and the keys of the results
    files (docs/bench/)."""
    names = set()
    paths = list(PACKAGE.rglob("*.py")) + list((REPO_ROOT / "tools").rglob("*.py")) + [
        p for p in (REPO_ROOT / "tests").rglob("*.py") if p.resolve() != Path(__file__).resolve()]
    for path in paths:
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type == tokenize.NAME:
                names.add(tok.string)
            elif tok.type == tokenize.STRING and not tok.string.lstrip("rbfu").startswith(('"""', "'''")):
                names.update(re.findall(r"\w+", tok.string))
    for path in (REPO_ROOT / "docs" / "bench").glob("*.json"):  # the results files' keys
        names.update(re.findall(r'"(\w+)":', path.read_text()))
    return frozenset(names)


def test_every_backticked_function_or_name_exists():
    """A backticked snake_case name in a page, docstring or comment (`name`, `name()`) is a name
    the code uses (a function, method, variable, parameter, key), or another library's."""
    names = _identifiers() | OUTSIDE
    missing = [f"{path.relative_to(REPO_ROOT)}: {m.group(1)}" for path in PAGES + SOURCES
               for m in SNAKE.finditer(path.read_text()) if m.group(1) not in names]
    assert missing == []


@pytest.mark.parametrize("text,ok", [
    ("`Lending.reclaim`", True), ("`Lending.refcount_callback`", False), ("`Run.at`", True), ("`Run.point`", False),
    ("`state_of_snapshot`", True), ("`state_of()`", False), ("`Start.later`", True), ("`Start.when_booted`", False),
])
def test_the_name_checks_can_fail(text, ok):
    classes, names = _classes(), _identifiers() | OUTSIDE
    found = [any(_has(c, m.group(2)) for c in classes[m.group(1)]) for m in CLASS_ATTR.finditer(text)]
    found += [m.group(1) in names for m in SNAKE.finditer(text)]
    assert found and all(found) is ok
