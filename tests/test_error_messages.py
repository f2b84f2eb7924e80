"""ValueErrors raised inside configurable classes name their config path.

An ast walk over `axlearn/`: a class is configurable when its bases lead (by name, through the
classes defined in the package) to `Configurable` or `Module`. Every `raise ValueError(msg)` in
a `Module` must build `msg` from the config path: `self.path()`, or a variable whose name says it
holds a path (`path`, `config_path`, `self._path`). A configurable that is not a module has no
path of its own (its owner's config names it): its messages name the path or the field, as
`ClassName.field` (or `type(self).__name__`) or a dotted `owner.field=` literal. Static and
class methods have no instance and are left out. The errors that do not yet name the path are
listed in KNOWN_WITHOUT_PATH (class and message start, so that edits elsewhere in a file do not
move them): the list may only shrink, and a new error without the path fails the test.
"""

from __future__ import annotations

import ast
import os
import re

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT_CLASSES = {"Configurable", "Module"}
# A dotted field in a message's text, e.g. "checkpointer.storage.snapshot=" or "Policy.mode".
_FIELD_RE = re.compile(r"\b[A-Za-z_]\w*\.[a-z_]\w+(?=[=:\s]|$)")

# (file, class, the first 40 characters of the message's source) of the errors that do not
# name the config path yet. Remove an entry when its error is fixed; never add one.
KNOWN_WITHOUT_PATH: set[tuple[str, str, str]] = set()


def _classes(sources: dict[str, str]) -> dict[str, list[tuple[list[str], str, ast.ClassDef]]]:
    out: dict[str, list] = {}
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                out.setdefault(node.name, []).append((bases, path, node))
    return out


def _names_path(message: ast.AST) -> bool:
    for node in ast.walk(message):
        if isinstance(node, ast.Attribute) and node.attr in ("path", "_path", "config_path"):
            return True
        if isinstance(node, ast.Name) and "path" in node.id.lower():
            return True
    return False


def _names_field(message: ast.AST, class_name: str) -> bool:
    if "type(self).__name__" in ast.unparse(message):
        return True  # The configurable's class, then (in the text) its field.
    text = " ".join(
        n.value
        for n in ast.walk(message)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )
    return class_name in text or bool(_FIELD_RE.search(text))


def _raises_in_methods(cls: ast.ClassDef):
    """(method, raise statement) of `cls`'s instance methods (static and class methods have no
    instance, hence no path: they are left out)."""
    for item in cls.body:
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        decorators = {ast.unparse(d) for d in item.decorator_list}
        if decorators & {"staticmethod", "classmethod"}:
            continue
        yield from ((item, n) for n in ast.walk(item) if isinstance(n, ast.Raise))


def _is_value_error(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "ValueError"


def _raised_value_error(method: ast.AST, raise_node: ast.Raise):
    """The ValueError(...) call a raise raises, and the notes added to it (`error.add_note(...)`).

    `raise ValueError(...)` directly, or `error = ValueError(...)`, `error.add_note(...)`, `raise
    error` in the same method (an error whose text must stay literal, e.g. AXLearn's, with the
    path in a note). Returns (None, []) for anything else.
    """
    if _is_value_error(raise_node.exc):
        return raise_node.exc, []
    if not isinstance(raise_node.exc, ast.Name):
        return None, []
    name = raise_node.exc.id
    call, notes = None, []
    for node in ast.walk(method):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and _is_value_error(node.value)
        ):
            call = node.value
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_note"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == name
            and node.args
        ):
            notes.append(node.args[0])
    return call, notes


def value_errors_without_path(sources: dict[str, str]) -> tuple[int, set[tuple[str, str, str]]]:
    """Counts the ValueErrors raised in configurable classes and those not naming the path.

    Args:
        sources: {file path: source}.

    Returns:
        (the number of such raises, {(file, class, message start)} of those without the path).
    """
    classes = _classes(sources)
    memo: dict[tuple[str, str], bool] = {}

    def derives(name: str, root: str, seen: tuple = ()) -> bool:
        if name == root:
            return True
        if (name, root) in memo:
            return memo[(name, root)]
        if name in seen or name not in classes:
            return False
        memo[(name, root)] = any(
            derives(base, root, seen + (name,)) for bases, _, _ in classes[name] for base in bases
        )
        return memo[(name, root)]

    def configurable(name: str) -> bool:
        return any(derives(name, root) for root in ROOT_CLASSES)

    total, missing = 0, set()
    for name, entries in classes.items():
        for _, path, node in entries:
            if not configurable(name):
                continue
            for method, raise_node in _raises_in_methods(node):
                call, notes = _raised_value_error(method, raise_node)
                if call is None:
                    continue
                total += 1
                args = call.args
                if args and _names_path(args[0]) or any(_names_path(n) for n in notes):
                    continue
                if args and not derives(name, "Module") and _names_field(args[0], name):
                    continue
                start = ast.unparse(args[0])[:40] if args else ""
                missing.add((path, name, start))
    return total, missing


def _package_sources() -> dict[str, str]:
    sources = {}
    for dirpath, dirnames, filenames in os.walk(os.path.join(REPO_ROOT, "axlearn")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for filename in filenames:
            if filename.endswith(".py"):
                full = os.path.join(dirpath, filename)
                with open(full, encoding="utf-8") as f:
                    sources[os.path.relpath(full, REPO_ROOT)] = f.read()
    return sources


def test_value_errors_of_configurable_classes_name_the_config_path():
    total, missing = value_errors_without_path(_package_sources())
    assert total > 100, "the walk found too few errors"
    new = sorted(missing - KNOWN_WITHOUT_PATH)
    assert new == [], "ValueErrors without the config path (use self.path()):\n" + "\n".join(
        map(str, new)
    )
    fixed = sorted(KNOWN_WITHOUT_PATH - missing)
    assert fixed == [], "fixed: remove from KNOWN_WITHOUT_PATH:\n" + "\n".join(map(str, fixed))


def test_checker_finds_an_error_without_the_path():
    source = """
class Module:
    pass

class Layer(Module):
    def check(self, n):
        if n < 0:
            raise ValueError(f"{self.path()}.n={n} must be >= 0; set it to 0 or more.")
        if n > 9:
            raise ValueError(f"n={n} must be <= 9")

class Plain:
    def check(self):
        raise ValueError("not configurable: not counted")
"""
    total, missing = value_errors_without_path({"x.py": source})
    assert total == 2
    assert missing == {("x.py", "Layer", "f'n={n} must be <= 9'")}


def test_checker_accepts_the_path_in_a_note_only_on_the_raised_error():
    source = """
class Module:
    pass

class Layer(Module):
    def check(self, n):
        if n < 0:
            error = ValueError(f"Target length {n} must be >= 0.")
            error.add_note(f"at {self.path()}")
            raise error
        if n > 9:
            other = ValueError(f"n={n} must be <= 9")
            unrelated = ValueError("x")
            unrelated.add_note(f"at {self.path()}")
            raise other
"""
    total, missing = value_errors_without_path({"x.py": source})
    assert total == 2
    assert missing == {("x.py", "Layer", "f'n={n} must be <= 9'")}
