"""The package's import graph: no import circles, and imports go downward.

The graph is read from the source with `ast`, not by importing: a module depends on every
module named by an `import` or `from ... import` statement anywhere in its file (at module level,
inside functions, under `if TYPE_CHECKING:`), resolved to the longest module path that exists
(`from axlearn.common import layers` depends on `axlearn.common.layers`; `from pkg import name`
depends on `pkg` itself only when `name` is not a module of its own). Imports between a package
and its own submodules are edges like any other: a package `__init__` that imports a submodule
which imports a name from that `__init__` is a circle.

A circle (two or more modules that reach each other) means neither file can be read or changed
alone and import order decides behaviour: the test names each one. The layer checks follow the
map in docs/index.md: cli -> launch -> trainer -> models -> layers -> module -> config.
"""

import ast
import os
from collections.abc import Iterable

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The packages whose modules are checked (the installed package and the repo's experiments).
PACKAGES = ("axlearn", "experiments")

# Modules at or above the trainer: they may import `axlearn.common.trainer` or
# `axlearn.common.launch_trainer`. Every other module is below the trainer and must not.
AT_OR_ABOVE_TRAINER_PREFIXES = (
    "axlearn.cli",  # The `axlearn` commands.
    "axlearn.cloud",  # Launchers.
    "axlearn.experiments",  # Named experiments build trainer configs.
    "experiments",  # Golden dumps of the named experiments and their tests.
)
AT_OR_ABOVE_TRAINER_MODULES = {
    "axlearn.common.trainer",  # The trainer itself.
    "axlearn.common.launch_trainer",  # Builds and runs a trainer from flags.
    "axlearn.common.launch_trainer_main",  # The launch_trainer entry point.
    "axlearn.common.aot_compilation",  # Compiles a trainer's step ahead of time.
    "axlearn.common.inference",  # Restores a trained run's model from its trainer dir.
    "axlearn.common.grpo",  # GRPO's trainer (its rollouts use inference's sampling settings).
    "axlearn.common.grpo.trainer",
    "axlearn.common.hf_checkpoint",  # Converts a trainer checkpoint to Hugging Face files.
    # Test helpers (`mock_trainer_config` builds a trainer config, as AXLearn's do); nothing in
    # the library imports them.
    "axlearn.common.test_utils",
}
TRAINER_MODULES = ("axlearn.common.trainer", "axlearn.common.launch_trainer")

# Layer rules: modules under the first prefix never import modules under any of the others.
LAYER_RULES = [
    # The config system is the bottom: it imports nothing else of axlearn.
    ("axlearn.common.config", ("axlearn.common.module", "axlearn.common.layers", "axlearn.cli")),
    # The library never imports the commands, the launchers or the named experiments.
    ("axlearn.common", ("axlearn.cli", "axlearn.cloud", "axlearn.experiments", "experiments")),
    ("axlearn.cloud", ("axlearn.cli", "axlearn.experiments", "experiments")),
    # Layers never import the models built from them, nor anything of the trainer.
    (
        "axlearn.common.layers",
        ("axlearn.common.causal_lm", "axlearn.common.decoder", "axlearn.common.learner"),
    ),
    (
        "axlearn.common.attention",
        ("axlearn.common.causal_lm", "axlearn.common.decoder", "axlearn.common.learner"),
    ),
    # Models never import the learner, evaler, checkpointer or summary writer.
    (
        "axlearn.common.causal_lm",
        (
            "axlearn.common.learner",
            "axlearn.common.evaler",
            "axlearn.common.checkpointer",
            "axlearn.common.summary_writer",
        ),
    ),
]


def module_files(root: str, packages: Iterable[str]) -> dict[str, str]:
    """Maps every module of `packages` under `root` to its file.

    Args:
        root: The directory holding the packages.
        packages: Top-level package names.

    Returns:
        {dotted module name: file path}; a package's name maps to its `__init__.py`.
    """
    modules = {}
    for package in packages:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for filename in filenames:
                if not filename.endswith(".py"):
                    continue
                path = os.path.join(dirpath, filename)
                name = os.path.relpath(path, root)[: -len(".py")].replace(os.sep, ".")
                if name.endswith(".__init__"):
                    name = name[: -len(".__init__")]
                modules[name] = path
    return modules


def import_graph(modules: dict[str, str], *, package_edges: bool = True) -> dict[str, set[str]]:
    """Returns {module: the modules of `modules` it imports} (see the module docstring).

    Args:
        modules: From `module_files`.
        package_edges: Whether imports between a package and its own submodules are edges (the
            rule); False is the earlier rule, which dropped them (kept to show what it missed).

    Returns:
        The edges.
    """

    def resolve(name: str):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        is_package = path.endswith("__init__.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # Relative import.
                    parts = module.split(".") if is_package else module.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                # `from base import name`: the module `base.name` if there is one, else `base`.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
                if not package_edges:
                    targets.append(base)
            else:
                continue
            for target in targets:
                dep = resolve(target)
                if dep is None or dep == module:
                    continue
                if not package_edges and (
                    module.startswith(dep + ".") or dep.startswith(module + ".")
                ):
                    continue  # The earlier rule: a package and its own submodule.
                edges[module].add(dep)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative).

    Args:
        edges: From `import_graph`.

    Returns:
        Each circle's modules, sorted; circles sorted.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return import_graph(module_files(REPO_ROOT, PACKAGES))


def test_circle_finder_finds_circles(tmp_path):
    # The finder itself: a <-> b (module level and inside a function) and c -> d -> e -> c are
    # found; f -> a and a package importing its submodule are not circles.
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg import sub\n",
        "a.py": "from pkg import b\n",
        "b.py": "def f():\n    from pkg.a import x\n",
        "c.py": "import pkg.d\n",
        "d.py": "from . import e\n",
        "e.py": "from .c import y\n",
        "f.py": "from pkg.a import z\n",
        "sub/__init__.py": "from pkg.sub.g import w\n",
        "sub/g.py": "from pkg import sub\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(module_files(str(tmp_path), ["pkg"]))
    assert graph["pkg.b"] == {"pkg.a"}
    # `pkg.sub` imports `pkg.sub.g`, which imports the package `pkg.sub` back: a circle through
    # an `__init__`, which the earlier rule (dropping package-submodule edges) did not see.
    assert circles(graph) == [
        ["pkg.a", "pkg.b"],
        ["pkg.c", "pkg.d", "pkg.e"],
        ["pkg.sub", "pkg.sub.g"],
    ]
    old_rule = import_graph(module_files(str(tmp_path), ["pkg"]), package_edges=False)
    assert circles(old_rule) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d", "pkg.e"]]


def test_planted_circle_through_an_init_fails_the_new_rule_not_the_old(tmp_path):
    """A package whose `__init__` imports a submodule that imports a name defined in that
    `__init__`: importing the submodule first fails (the name is not defined yet)."""
    pkg = tmp_path / "pkg"
    (pkg / "tools").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "tools/__init__.py": "from pkg.tools.core import run\nDEFAULT = 1\n",
        "tools/core.py": "from pkg.tools import DEFAULT\n\ndef run():\n    return DEFAULT\n",
        "tools/util.py": "from pkg.tools import core\n",  # A submodule: not a circle.
        "user.py": "from pkg.tools import run, util\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    modules = module_files(str(tmp_path), ["pkg"])
    new = import_graph(modules)
    assert new["pkg.tools.util"] == {"pkg.tools.core"}
    assert new["pkg.user"] == {"pkg.tools", "pkg.tools.util"}
    assert circles(new) == [["pkg.tools", "pkg.tools.core"]]
    assert circles(import_graph(modules, package_edges=False)) == []


def test_no_import_circles(edges):
    assert len(edges) > 100, "the walk found too few modules"
    found = circles(edges)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_nothing_below_the_trainer_imports_it(edges):
    below = [
        m
        for m in edges
        if m not in AT_OR_ABOVE_TRAINER_MODULES
        and not any(_under(m, p) for p in AT_OR_ABOVE_TRAINER_PREFIXES)
    ]
    offenders = sorted(f"{m} imports {d}" for m in below for d in edges[m] if d in TRAINER_MODULES)
    assert len(below) > 80
    assert offenders == [], "modules below the trainer import it:\n" + "\n".join(offenders)


def test_imports_go_downward(edges):
    offenders = []
    for module, deps in edges.items():
        for lower, forbidden in LAYER_RULES:
            if not _under(module, lower):
                continue
            for dep in deps:
                if any(_under(dep, f) and not _under(dep, lower) for f in forbidden):
                    offenders.append(f"{module} imports {dep}")
    assert offenders == [], "upward imports:\n" + "\n".join(sorted(offenders))


def test_common_never_imports_cloud(edges):
    # The accelerator table and the launch environment contract live in axlearn.common
    # (system_characteristics, process_env); axlearn.cloud re-exports them at their old paths.
    common = [m for m in edges if _under(m, "axlearn.common")]
    offenders = sorted(
        f"{m} imports {d}" for m in common for d in edges[m] if _under(d, "axlearn.cloud")
    )
    assert len(common) > 100
    assert offenders == [], "axlearn.common imports axlearn.cloud:\n" + "\n".join(offenders)


def test_config_imports_only_itself(edges):
    # The bottom of the stack: `axlearn.common.config` depends on no other axlearn module.
    outside = sorted(
        f"{m} imports {d}"
        for m in edges
        if _under(m, "axlearn.common.config")
        for d in edges[m]
        if not _under(d, "axlearn.common.config") and d not in ("axlearn", "axlearn.common")
    )
    assert outside == []
