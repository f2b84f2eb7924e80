"""The trainer's structure (issue 40): `SpmdTrainer` owns its parts instead of mixing them in.

An ast check over the part files (trainer.py and the files of the parts it owns) finds:
- 0 reads, in one part, of an attribute that only another part defines (through `self`, as a
  mixin would, or of another part's private `_name` through the object that holds it);
- 0 `getattr(self, "_...", None)` guards;
- `trainer.py`'s loop functions under 60 lines each;
- no part importing `axlearn.common.trainer` and `SpmdTrainer` deriving from `Module` alone.
Each check is also run on planted sources that break it, so a test here can fail.
"""

from __future__ import annotations

import ast
import os

import axlearn.common

COMMON = os.path.dirname(axlearn.common.__file__)
# The trainer and the parts it owns.
PART_FILES = (
    "trainer.py",
    "trainer_checkpointing.py",
    "trainer_metrics.py",
    "trainer_watchdog.py",
    "trainer_profiler.py",
    "trainer_events.py",
    "trainer_batches.py",
)
# trainer.py's loop: run -> _train_loop -> dispatch -> drain, and the steps around them.
LOOP_FUNCTIONS = (
    "run",
    "_train_loop",
    "_dispatch_train_step",
    "_after_step_dispatch",
    "_drain",
    "_finish_step",
    "_stop_for_preemption",
)
MAX_LOOP_FUNCTION_LINES = 60


def _defined_names(tree: ast.AST) -> set[str]:
    """Attributes a file defines: `self.x = ...` targets and methods of its classes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return names


def _reads(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, attribute, through `self`) of every attribute read."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            out.append((node.lineno, node.attr, on_self))
    return out


def cross_part_reads(sources: dict[str, str]) -> list[str]:
    """Reads in one part of attributes defined only in another part.

    Args:
        sources: {file name: source} of the parts.

    Returns:
        "file:line: name (defined in other)" for each read through `self` of a name that only
        another part defines, and each read of another part's private `_name` (any object).
    """
    trees = {name: ast.parse(src) for name, src in sources.items()}
    defined = {name: _defined_names(tree) for name, tree in trees.items()}
    found = []
    for name, tree in trees.items():
        others: dict[str, str] = {}
        for other, names in defined.items():
            if other != name:
                for attr in names - defined[name]:
                    others.setdefault(attr, other)
        for line, attr, on_self in _reads(tree):
            if attr in others and (on_self or attr.startswith("_")):
                found.append(f"{name}:{line}: {attr} (defined in {others[attr]})")
    return found


def private_getattr_guards(source: str) -> list[int]:
    """Lines of `getattr(self, "_...", ...)` calls in `source`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "self"
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
        ):
            lines.append(node.lineno)
    return lines


def function_lengths(source: str, names: tuple[str, ...]) -> dict[str, int]:
    """{name: lines (decorators to last line)} of the named functions in `source`."""
    lengths = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lengths[node.name] = node.end_lineno - first + 1
    return lengths


def _sources() -> dict[str, str]:
    out = {}
    for name in PART_FILES:
        with open(os.path.join(COMMON, name), encoding="utf-8") as f:
            out[name] = f.read()
    return out


def test_no_part_reads_another_parts_attributes():
    assert cross_part_reads(_sources()) == []


def test_no_private_getattr_guards():
    found = {name: private_getattr_guards(src) for name, src in _sources().items()}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_loop_functions_fit_on_a_screen():
    lengths = function_lengths(_sources()["trainer.py"], LOOP_FUNCTIONS)
    assert sorted(lengths) == sorted(LOOP_FUNCTIONS)
    too_long = {name: n for name, n in lengths.items() if n >= MAX_LOOP_FUNCTION_LINES}
    assert too_long == {}, too_long


def test_parts_are_owned_not_mixed_in():
    tree = ast.parse(_sources()["trainer.py"])
    (trainer,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpmdTrainer"]
    assert [ast.unparse(b) for b in trainer.bases] == ["Module"]
    for name, src in _sources().items():
        if name == "trainer.py":
            continue
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "axlearn.common.trainer", name
                assert not (
                    node.module == "axlearn.common" and "trainer" in [a.name for a in node.names]
                ), name


# The checks on planted sources: each must find what it is for.

_MIXIN = """
class Loop:
    def __init__(self):
        self._step = 0
    def run(self):
        return self._save(self._step)
"""
_PART = """
class Saver:
    def __init__(self):
        self._last = None
        self.choice = None
    def _save(self, step):
        self._last = step
"""
_OWNER = """
class Loop:
    def __init__(self, saver):
        self._saver = saver
    def run(self):
        return self._saver.choice, self._saver._last
"""


def test_checker_finds_a_mixin_read_and_a_private_read_of_a_part():
    assert cross_part_reads({"loop.py": _MIXIN, "saver.py": _PART}) == [
        "loop.py:6: _save (defined in saver.py)"
    ]
    # Through the owned object: the public `choice` is its interface; `_last` is not.
    assert cross_part_reads({"loop.py": _OWNER, "saver.py": _PART}) == [
        "loop.py:6: _last (defined in saver.py)"
    ]


def test_checker_finds_getattr_guards_and_long_functions():
    source = "def f(self):\n    return getattr(self, '_x', None), getattr(self, 'y', None)\n"
    assert private_getattr_guards(source) == [2]
    long = "def run():\n" + "    x = 1\n" * 70
    assert function_lengths(long, ("run",)) == {"run": 71}
