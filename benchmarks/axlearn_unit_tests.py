"""Measures how many of AXLearn's own unit tests pass against this package.

AXLearn's test files (``axlearn/common/<module>_test.py``) are read from a folder given on the
command line; nothing of them is copied into this repository. Each file is copied into a scratch
folder outside the repository, as ``<scratch>/<name>/axlearn/common/<name>_test.py``: a shadow
``axlearn/common/`` package whose folder the scratch ``conftest.py`` appends to our installed
``axlearn.common.__path__``, so that pytest's ``--import-mode=importlib`` names the test module
``axlearn.common.<name>_test`` (the name AXLearn's expected strings use). The reference folder's
``conftest.py`` (absl flag parsing) runs after our prelude (CPU platform, device count).

Two modes:
- ``strict``: the file as it is; a name our package lacks fails the whole file at import.
- ``lenient``: the copy's ``from axlearn... import`` statements (and ``import axlearn...``) are
  rewritten so that a name our package lacks becomes a placeholder whose use raises
  ``NameError('missing: module.name')``, and module objects become proxies that give such a
  placeholder for a missing attribute: one missing name fails only the tests that use it.

Test-only packages the files import (chex, scikit-learn, Hugging Face evaluate and those of
their dependencies missing here) are installed with ``pip install --no-deps --target
<scratch>/site`` (once per list) and put on PYTHONPATH.

Usage (from the repository root; one file at a time while iterating):
    python benchmarks/axlearn_unit_tests.py --files convolution,layers --modes strict,lenient
    python benchmarks/axlearn_unit_tests.py            # all files found, both modes

Prints one JSON object: per file and mode, whether it imports, passed/failed/skipped/errors,
and the most frequent failure causes (``missing: name`` or the exception's first line).
"""

import argparse
import ast
import collections
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# scikit-learn at AXLearn's pin (its tests import private helpers, e.g. `_binary_clf_curve`, that
# later releases removed).
_TEST_ONLY_PACKAGES = (
    "chex",
    "scikit-learn==1.6.1",
    "joblib",
    "threadpoolctl",
    "narwhals",
    "toolz",
    # Hugging Face `evaluate` (imported at the top of metrics_correlation_test) and what it
    # imports that the package's own environment lacks.
    "evaluate",
    "datasets",
    "pandas",
    "dill",
    "multiprocess",
)

# Runs before the reference conftest: the CPU platform and the shadow package path.
_CONFTEST_PRELUDE = """\
# Written by axlearn's benchmarks/axlearn_unit_tests.py (harness prelude).
import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count={devices}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import importlib  # noqa: E402
import importlib.abc  # noqa: E402
import importlib.util  # noqa: E402

_ROOT = os.path.dirname(os.path.abspath(__file__))


# Finds `axlearn.<...>_test` modules in the shadow tree (the reference's test files).
class _ShadowTests(importlib.abc.MetaPathFinder):

    def find_spec(self, fullname, path=None, target=None):
        parts = fullname.split(".")
        if parts[0] != "axlearn" or not parts[-1].endswith("_test"):
            return None
        candidate = os.path.join(_ROOT, *parts) + ".py"
        if not os.path.isfile(candidate):
            return None
        return importlib.util.spec_from_file_location(fullname, candidate)


sys.meta_path.insert(0, _ShadowTests())
# The tested file's package also gets the shadow folder on its path (pytest's importlib mode).
_PACKAGE = importlib.import_module({package!r})
_SHADOW = os.path.join(_ROOT, *{package!r}.split("."))
if _SHADOW not in _PACKAGE.__path__:
    _PACKAGE.__path__.append(_SHADOW)

# Test data staged from the snapshot (see `_stage_data`): golden `.npz` files and vocabularies
# that AXLearn's tests read through `axlearn.common.golden` and `input_test_utils`.
_STAGED_TESTDATA = os.path.join(_ROOT, "axlearn", "experiments", "testdata")
_STAGED_TOKENIZERS = os.path.join(_ROOT, "axlearn", "data", "tokenizers")
if os.path.isdir(_STAGED_TESTDATA):
    import axlearn.common.golden as _golden  # noqa: E402

    _golden._DEFAULT_TESTDATA_DIR = _STAGED_TESTDATA
if os.path.isdir(_STAGED_TOKENIZERS):
    import axlearn.common.input_test_utils as _itu  # noqa: E402

    _OLD_TOKENIZERS = os.path.normpath(_itu.tokenizers_dir)
    for _attr, _value in list(vars(_itu).items()):
        if isinstance(_value, str) and os.path.normpath(_value).startswith(_OLD_TOKENIZERS):
            _rest = os.path.normpath(_value)[len(_OLD_TOKENIZERS) :]
            setattr(_itu, _attr, _STAGED_TOKENIZERS + _rest)

# ---- reference conftest.py follows ----
"""

# The lenient mode's runtime support, importable as `_axl_lenient` from the scratch root.
_LENIENT_SUPPORT = '''\
"""Placeholders for names the package under test lacks (harness support, lenient mode)."""

import functools
import importlib
import inspect
import sys
import types


def _fail(name):
    raise NameError(f"missing: {name}")


def _at_definition_time() -> bool:
    """Whether the placeholder's caller is module or class-body code (not a function body)."""
    frame = sys._getframe(2)
    return not frame.f_code.co_flags & inspect.CO_OPTIMIZED


def _failing_function(fn, name):
    @functools.wraps(fn)
    def failing(*args, **kwargs):
        _fail(name)

    return failing


class Placeholder:
    """Stands for a missing name: any use (call, iteration, arithmetic, ...) raises NameError."""

    def __init__(self, name):
        object.__setattr__(self, "_axl_name", name)

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        # Keeps the root name, so that failures are counted by the name that is missing.
        return Placeholder(object.__getattribute__(self, "_axl_name"))

    def __setattr__(self, attr, value):
        _fail(self._axl_name)

    def __call__(self, *args, **kwargs):
        """Raises, except at definition time (decorators, parameter lists) where it defers."""
        name = object.__getattribute__(self, "_axl_name")
        if not _at_definition_time():
            _fail(name)
        if len(args) == 1 and not kwargs and inspect.isfunction(args[0]):
            # A missing decorator: the decorated test fails when it runs.
            return _failing_function(args[0], name)
        return Placeholder(name)

    def __bool__(self):
        """False at definition time (a missing feature flag, `if _FLAG:`); raises otherwise."""
        name = object.__getattribute__(self, "_axl_name")
        if not _at_definition_time():
            _fail(name)
        return False

    def __getitem__(self, item):
        """Raises, except at definition time (annotations like `Missing[int]`)."""
        name = object.__getattribute__(self, "_axl_name")
        if not _at_definition_time():
            _fail(name)
        return Placeholder(name)

    def __repr__(self):
        return f"<missing: {self._axl_name}>"

    __str__ = __repr__

    def __hash__(self):
        return hash(self._axl_name)

    def __eq__(self, other):
        return isinstance(other, Placeholder) and other._axl_name == self._axl_name

    def __mro_entries__(self, bases):
        name = self._axl_name

        def _init(self, *args, **kwargs):
            _fail(name)

        def _cls_fail(cls, *args, **kwargs):
            _fail(name)

        return (
            type(
                "Missing",
                (),
                {"__init__": _init, "default_config": classmethod(_cls_fail), "_axl_name": name},
            ),
        )


# No __iter__: a placeholder must not look Iterable (absl's parameterized would iterate a
# placeholder passed as one parameter); iterating one still fails (through __getitem__).
def _make_failing(method):
    def fn(self, *args, **kwargs):
        _fail(object.__getattribute__(self, "_axl_name"))

    fn.__name__ = method
    return fn


for _method in (
    "__len__", "__setitem__", "__contains__",
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__neg__", "__int__", "__float__", "__index__", "__enter__", "__exit__",
    "__lt__", "__le__", "__gt__", "__ge__", "__instancecheck__", "__subclasscheck__",
    "__array__",
):
    setattr(Placeholder, _method, _make_failing(_method))


class LenientModule(types.ModuleType):
    """A proxy of a real module: a missing attribute is a submodule or a Placeholder."""

    def __init__(self, module):
        super().__init__(module.__name__)
        object.__setattr__(self, "_axl_module", module)

    def __getattribute__(self, attr):
        module = object.__getattribute__(self, "_axl_module")
        if attr == "_axl_module":
            return module
        if attr in ("__class__",):
            return object.__getattribute__(self, attr)
        try:
            value = getattr(module, attr)
        except AttributeError:
            if attr.startswith("__") and attr.endswith("__"):
                raise
            return _lookup_missing(module.__name__, attr)
        return _wrap(value)

    def __setattr__(self, attr, value):
        setattr(object.__getattribute__(self, "_axl_module"), attr, value)

    def __delattr__(self, attr):
        delattr(object.__getattribute__(self, "_axl_module"), attr)

    def __dir__(self):
        return dir(object.__getattribute__(self, "_axl_module"))


def _wrap(value):
    if isinstance(value, types.ModuleType) and value.__name__.startswith("axlearn"):
        return LenientModule(value)
    return value


def _lookup_missing(module_name, attr):
    try:
        return _wrap(importlib.import_module(f"{module_name}.{attr}"))
    except ImportError:
        return Placeholder(f"{module_name}.{attr}")


def import_module(module_name):
    """`import a.b.c as x` / `from a.b import c` where c is a module."""
    try:
        return _wrap(importlib.import_module(module_name))
    except ImportError:
        return Placeholder(module_name)


def from_import(module_name, attr):
    """`from module_name import attr`."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return Placeholder(f"{module_name}.{attr}")
    if hasattr(module, attr):
        return _wrap(getattr(module, attr))
    return _lookup_missing(module_name, attr)
'''


class _LenientRewriter(ast.NodeTransformer):
    """Rewrites `from axlearn... import` and `import axlearn... as` into lenient lookups."""

    def visit_ImportFrom(self, node):
        if node.level or not (node.module or "").startswith("axlearn"):
            return node
        out = []
        for alias in node.names:
            call = ast.parse(
                f"_axl_lenient.from_import({node.module!r}, {alias.name!r})", mode="eval"
            ).body
            out.append(
                ast.Assign(
                    targets=[ast.Name(id=alias.asname or alias.name, ctx=ast.Store())], value=call
                )
            )
        return [ast.copy_location(n, node) for n in out]

    def visit_Import(self, node):
        out, kept = [], []
        for alias in node.names:
            if alias.name.startswith("axlearn") and alias.asname:
                call = ast.parse(f"_axl_lenient.import_module({alias.name!r})", mode="eval").body
                out.append(
                    ast.Assign(targets=[ast.Name(id=alias.asname, ctx=ast.Store())], value=call)
                )
            else:
                kept.append(alias)
        if kept:
            out.insert(0, ast.Import(names=kept))
        return [ast.copy_location(n, node) for n in out]


def lenient_source(source: str) -> str:
    """Returns `source` with its axlearn imports made lenient (see module docstring).

    Args:
        source: A test file's text.

    Returns:
        The rewritten text, importing `_axl_lenient` first.
    """
    tree = _LenientRewriter().visit(ast.parse(source))
    ast.fix_missing_locations(tree)
    # After a module docstring and `from __future__` imports, if any.
    body = tree.body
    index = 0
    while index < len(body) and (
        (isinstance(body[index], ast.Expr) and isinstance(body[index].value, ast.Constant))
        or (isinstance(body[index], ast.ImportFrom) and body[index].module == "__future__")
    ):
        index += 1
    body.insert(index, ast.parse("import _axl_lenient").body[0])
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


def _ensure_site(site_dir: str):
    """Installs the test-only packages into `site_dir` (once)."""
    marker = os.path.join(site_dir, ".installed")
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            if f.read() == " ".join(_TEST_ONLY_PACKAGES):
                return
        shutil.rmtree(site_dir)  # Installed for another package list.
    os.makedirs(site_dir, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            site_dir,
            *_TEST_ONLY_PACKAGES,
        ],
        check=True,
    )
    with open(marker, "w", encoding="utf-8") as f:
        f.write(" ".join(_TEST_ONLY_PACKAGES))


def _test_files(ref_dir: str) -> dict[str, str]:
    """The reference's test files: {shadow path relative to the scratch root: source path}.

    `ref_dir` is either a snapshot of AXLearn's repository (it holds `axlearn/`), whose
    `axlearn/**/<name>_test.py` keep their paths, or a flat folder of `<name>_test.py` files,
    which stand for `axlearn/common/<name>_test.py`, and whose subfolders' `<name>_test.py` files
    stand for `axlearn/<subfolder>/<name>_test.py` (e.g. `audio/frontend_test.py`).
    """
    files = {}
    package_root = os.path.join(ref_dir, "axlearn")
    if os.path.isdir(package_root):
        for dirpath, dirnames, filenames in os.walk(package_root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
            for filename in sorted(filenames):
                if filename.endswith("_test.py"):
                    full = os.path.join(dirpath, filename)
                    files[os.path.relpath(full, ref_dir)] = full
    else:
        for filename in sorted(os.listdir(ref_dir)):
            full = os.path.join(ref_dir, filename)
            if filename.endswith("_test.py"):
                files[os.path.join("axlearn", "common", filename)] = full
            elif os.path.isdir(full) and not filename.startswith((".", "__")):
                # A subfolder stands for a package beside axlearn/common (audio/ -> axlearn/audio/).
                for sub in sorted(os.listdir(full)):
                    if sub.endswith("_test.py"):
                        files[os.path.join("axlearn", filename, sub)] = os.path.join(full, sub)
    return files


def file_name(shadow_path: str) -> str:
    """A test file's name in the table: its module's path under `axlearn/common/` (`decoding`,
    `flash_attention/layer`) or under `axlearn/` for other packages (`cloud/gcp/job`).

    Args:
        shadow_path: The file's path relative to the snapshot root.

    Returns:
        The name, without `_test.py`.
    """
    rel = shadow_path.replace(os.sep, "/")[: -len("_test.py")]
    rel = rel[len("axlearn/") :]
    return rel[len("common/") :] if rel.startswith("common/") else rel


def module_exists_here(shadow_path: str, package_dir: str = "") -> bool:
    """Whether the module a test file tests exists in this package (`x_test.py` tests `x`).

    Args:
        shadow_path: The test file's path relative to the snapshot root (`axlearn/.../x_test.py`).
        package_dir: The folder holding our `axlearn/` package (default: this repository).

    Returns:
        True when `axlearn/.../x.py` or the package `axlearn/.../x/` exists here.
    """
    base = os.path.join(package_dir or _REPO_ROOT, shadow_path[: -len("_test.py")])
    return os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py"))


def discover(ref_dir: str, package_dir: str = "") -> tuple[dict[str, str], list[str]]:
    """The reference's test files whose module exists here, and the names of the others.

    Args:
        ref_dir: A snapshot of AXLearn's repository, or a flat folder of test files.
        package_dir: The folder holding our `axlearn/` package (default: this repository).

    Returns:
        ({name: shadow path} of the files to run, sorted names of the files left out).
    """
    chosen, left_out = {}, []
    for shadow_path in _test_files(ref_dir):
        name = file_name(shadow_path)
        if module_exists_here(shadow_path, package_dir):
            chosen[name] = shadow_path
        else:
            left_out.append(name)
    return dict(sorted(chosen.items())), sorted(left_out)


# Folders of test data, relative to a snapshot's root and to our repository's root.
_DATA_FOLDERS = (
    os.path.join("axlearn", "experiments", "testdata"),
    os.path.join("axlearn", "data", "tokenizers", "bpe"),
    os.path.join("axlearn", "data", "tokenizers", "sentencepiece"),
)


def _is_test_data(folder: str, entry: str) -> bool:
    """Whether `entry` of a data folder is test data (golden configs are not staged)."""
    if folder.endswith("testdata"):
        return "_test" in entry
    return entry != "BUILD"


def stage_data(*, ref_dir: str, root: str, package_dir: str = "") -> list[str]:
    """Links the test data AXLearn's tests read into `root` (a file's scratch folder).

    For each of `_DATA_FOLDERS`, `root/<folder>/` gets links to our repository's entries and then
    to a snapshot's entries, which replace ours of the same name: a golden file AXLearn ships is
    AXLearn's record, ours fills only what it does not ship. The prelude points
    `axlearn.common.golden`'s default folder and `input_test_utils`'s vocabulary paths there;
    tests that find their data next to their own file (`../experiments/testdata`) see it too.
    Nothing is staged for a flat folder of test files (it holds no data).

    Args:
        ref_dir: A snapshot of AXLearn's repository, or a flat folder of test files.
        root: The scratch folder the test file runs in.
        package_dir: The folder holding our `axlearn/` package (default: this repository).

    Returns:
        The staged paths taken from the snapshot, relative to `root`, sorted.
    """
    if not os.path.isdir(os.path.join(ref_dir, "axlearn")):
        return []
    from_snapshot = []
    for folder in _DATA_FOLDERS:
        target = os.path.join(root, folder)
        for base in (package_dir or _REPO_ROOT, ref_dir):
            source = os.path.join(base, folder)
            if not os.path.isdir(source):
                continue
            for entry in sorted(os.listdir(source)):
                if not _is_test_data(folder, entry):
                    continue
                os.makedirs(target, exist_ok=True)
                link = os.path.join(target, entry)
                if os.path.lexists(link):
                    os.remove(link)
                os.symlink(os.path.abspath(os.path.join(source, entry)), link)
                if base == ref_dir:
                    from_snapshot.append(os.path.join(folder, entry))
    return sorted(from_snapshot)


def _prepare(*, ref_dir: str, scratch: str, name: str, mode: str, devices: int) -> str:
    """Lays out one file's scratch folder; returns the copied test file's path."""
    files = _test_files(ref_dir)
    by_name = {file_name(path): path for path in files}
    if name not in by_name:
        raise SystemExit(f"no test file {name!r} in {ref_dir}")
    shadow_path = by_name[name]
    root = os.path.join(scratch, f"{name.replace('/', '.')}_{mode}")
    shutil.rmtree(root, ignore_errors=True)
    # Every reference test file is importable (e.g. repeat_test imports layers_test), as in
    # AXLearn's repository; only `name` is collected.
    for rel, source_path in files.items():
        with open(source_path, encoding="utf-8") as f:
            source = f.read()
        if mode == "lenient":
            try:
                source = lenient_source(source)
            except SyntaxError:
                if rel != shadow_path:
                    continue
                raise
        target = os.path.join(root, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as f:
            f.write(source)
    stage_data(ref_dir=ref_dir, root=root)
    test_path = os.path.join(root, shadow_path)
    package = ".".join(shadow_path.split(os.sep)[:-1])
    conftest = _CONFTEST_PRELUDE.format(devices=devices, package=package)
    for candidate in (os.path.join(ref_dir, "conftest.py"),):
        if os.path.exists(candidate):
            with open(candidate, encoding="utf-8") as f:
                conftest += f.read()
    with open(os.path.join(root, "conftest.py"), "w", encoding="utf-8") as f:
        f.write(conftest)
    with open(os.path.join(root, "_axl_lenient.py"), "w", encoding="utf-8") as f:
        f.write(_LENIENT_SUPPORT)
    with open(os.path.join(root, "pytest.ini"), "w", encoding="utf-8") as f:
        f.write("[pytest]\n")
    return test_path


def _cause(text: str) -> str:
    """A failure's cause: the missing name, or its exception's last line, shortened."""
    match = re.search(r"NameError: missing: ([\w.]+)", text or "")
    if match:
        return f"missing: {match.group(1)}"
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Failure|error)\b", line) or line.startswith("E "):
            line = re.sub(r"0x[0-9a-f]+", "0x..", line)
            return line[:160]
    return lines[-1][:160] if lines else "unknown"


def _parse_junit(path: str) -> dict:
    """Counts a junit XML file's outcomes and causes."""
    counts = dict(passed=0, failed=0, skipped=0, errors=0)
    causes = collections.Counter()
    if not os.path.exists(path):
        return dict(counts, causes={})
    for case in ET.parse(path).getroot().iter("testcase"):
        failure = case.find("failure")
        error = case.find("error")
        if failure is not None or error is not None:
            elem = failure if failure is not None else error
            counts["failed" if failure is not None else "errors"] += 1
            causes[_cause((elem.get("message") or "") + "\n" + (elem.text or ""))] += 1
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return dict(counts, causes=dict(causes.most_common(15)))


def _collect_only(*, cmd, root, env, timeout) -> dict:
    """Whether the test file imports (pytest --collect-only), and how many tests it holds."""
    cmd = [c for c in cmd if not c.startswith("--junitxml")] + ["--collect-only"]
    if "-n" in cmd:
        i = cmd.index("-n")
        del cmd[i : i + 2]
    start = time.time()
    proc = subprocess.run(
        cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = proc.stdout + proc.stderr
    collected = sum(1 for line in proc.stdout.splitlines() if "::" in line)
    result = dict(imports=proc.returncode == 0, collected=collected, rc=proc.returncode)
    result["seconds"] = round(time.time() - start, 1)
    if not result["imports"]:
        tail = [line for line in output.splitlines() if line.startswith("E  ")]
        result["import_error"] = tail[-1][:300] if tail else output[-300:]
    return result


def _node_ids(*, cmd, root, env, timeout) -> list[str]:
    """The test ids pytest collects for `cmd` (run from `root`)."""
    cmd = [c for c in cmd if not c.startswith("--junitxml")] + ["--collect-only"]
    if "-n" in cmd:
        i = cmd.index("-n")
        del cmd[i : i + 2]
    proc = subprocess.run(
        cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    return [line.strip() for line in proc.stdout.splitlines() if "::" in line]


def run_file(
    *,
    ref_dir,
    scratch,
    site_dir,
    name,
    mode,
    devices,
    workers,
    timeout,
    collect_only=False,
    sample=0,
    seed=0,
) -> dict:
    """Runs one reference test file in one mode; returns its counts (or imports only).

    With `sample=N`, runs N of the file's tests drawn at random (`seed`) and adds
    `sampled_from` (the number collected) to the counts.
    """
    test_path = _prepare(ref_dir=ref_dir, scratch=scratch, name=name, mode=mode, devices=devices)
    root = os.path.join(scratch, f"{name.replace('/', '.')}_{mode}")
    junit = os.path.join(root, "junit.xml")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_REPO_ROOT, site_dir, root])
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        os.path.join(root, "pytest.ini"),
        "--rootdir",
        root,
        "--import-mode=importlib",
        "--tb=native",
        "--timeout=300",
        f"--junitxml={junit}",
        test_path,
    ]
    if workers:
        cmd[3:3] = ["-n", str(workers)]
    if collect_only:
        return _collect_only(cmd=cmd, root=root, env=env, timeout=timeout)
    start = time.time()
    sampled_from = None
    if sample:
        node_ids = _node_ids(cmd=cmd, root=root, env=env, timeout=timeout)
        sampled_from = len(node_ids)
        if sample < len(node_ids):
            chosen = sorted(random.Random(seed).sample(node_ids, sample))
            cmd = [c for c in cmd if c != test_path] + chosen
    try:
        proc = subprocess.run(
            cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        output, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        output, rc = str(e.stdout or "") + str(e.stderr or ""), "timeout"
    result = _parse_junit(junit)
    total = result["passed"] + result["failed"] + result["errors"] + result["skipped"]
    collect_error = rc == 2 or (total <= 1 and result["errors"] and "collect" in output.lower())
    if sampled_from is not None:
        result["sampled_from"] = sampled_from
    result.update(
        imports=bool(total) and not collect_error,
        rc=rc,
        seconds=round(time.time() - start, 1),
    )
    if not result["imports"]:
        tail = [line for line in output.splitlines() if line.startswith("E  ")]
        tail = tail or [line for line in output.splitlines() if "Error" in line]
        result["import_error"] = tail[-1][:300] if tail else output[-300:]
    return result


def _git_head(folder: str) -> str:
    """The short commit of the git checkout holding `folder`, or "" when it is not one."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=folder,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _dirty(folder: str) -> bool:
    """Whether the package's tracked files under `folder/axlearn` differ from the commit."""
    proc = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "axlearn"],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
    return bool(proc.stdout.strip())


def _default_ref_dir() -> str:
    """../shared/reference/axlearn_tests beside the repository (or beside its main worktree)."""
    relative = os.path.join("..", "shared", "reference", "axlearn_tests")
    candidate = os.path.join(_REPO_ROOT, relative)
    if not os.path.isdir(candidate):
        try:
            common = subprocess.run(
                ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
                cwd=_REPO_ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            candidate = os.path.join(os.path.dirname(common), relative)
        except (OSError, subprocess.CalledProcessError):
            pass
    return os.path.normpath(candidate)


def main():
    """Parses flags, runs the files and prints the JSON table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "ref_dir",
        nargs="?",
        default=_default_ref_dir(),
        help="A snapshot of AXLearn's repository (its axlearn/**/<name>_test.py files of "
        "modules that exist here are run) or a flat folder of <name>_test.py files standing for "
        "axlearn/common/, with AXLearn's conftest.py "
        "(default: ../shared/reference/axlearn_tests next to the repository).",
    )
    parser.add_argument("--files", default="", help="Comma-separated names (default: all).")
    parser.add_argument("--modes", default="strict,lenient", help="strict, lenient or both.")
    parser.add_argument(
        "--scratch",
        default=os.path.join(tempfile.gettempdir(), "axlearn_unit_tests"),
        help="Scratch folder outside the repository.",
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=1,
        help="CPU devices per test process (1: JAX's default, as the reference README runs them).",
    )
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (0: none).")
    parser.add_argument("--timeout", type=int, default=3600, help="Seconds per file and mode.")
    parser.add_argument("--output", default="", help="Also write the JSON here.")
    parser.add_argument(
        "--strict_collect_only",
        action="store_true",
        help="Strict mode only checks that each file imports (pytest --collect-only); the "
        "lenient mode gives the counts. Halves the time.",
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=0,
        help="Run only this many of each file's tests, drawn at random (0: all).",
    )
    parser.add_argument("--seed", type=int, default=0, help="The --sample draw's seed.")
    args = parser.parse_args()

    ref_dir = os.path.abspath(args.ref_dir)
    scratch = os.path.abspath(args.scratch)
    if scratch.startswith(_REPO_ROOT + os.sep):
        raise SystemExit(f"--scratch={scratch} is inside the repository; pick a folder outside.")
    found, left_out = discover(ref_dir)
    names = [n for n in args.files.split(",") if n] or list(found)
    unknown = [n for n in names if n not in found]
    if unknown:
        raise SystemExit(
            f"no test file of a module that exists here for {unknown} in {ref_dir} "
            f"(found {len(found)}: {', '.join(list(found)[:8])}, ...)"
        )
    site_dir = os.path.join(scratch, "site")
    _ensure_site(site_dir)
    table = {}
    for name in names:
        table[name] = {}
        for mode in [m for m in args.modes.split(",") if m]:
            table[name][mode] = run_file(
                ref_dir=ref_dir,
                scratch=scratch,
                site_dir=site_dir,
                name=name,
                mode=mode,
                devices=args.devices,
                workers=args.workers,
                timeout=args.timeout,
                collect_only=args.strict_collect_only and mode == "strict",
                sample=args.sample,
                seed=args.seed,
            )
            print(
                f"{name} {mode}: "
                + json.dumps({k: v for k, v in table[name][mode].items() if k != "causes"}),
                file=sys.stderr,
                flush=True,
            )
    totals = {}
    for mode in [m for m in args.modes.split(",") if m]:
        rows = [table[n][mode] for n in names]
        totals[mode] = {
            "imports": sum(r["imports"] for r in rows),
            "files": len(rows),
            **{
                k: sum(r.get(k, 0) for r in rows) for k in ("passed", "failed", "errors", "skipped")
            },
        }
        ran = totals[mode]["passed"] + totals[mode]["failed"] + totals[mode]["errors"]
        totals[mode]["pass_rate"] = round(totals[mode]["passed"] / ran, 3) if ran else None
    meta = dict(
        date=time.strftime("%Y-%m-%d", time.gmtime()),
        commit=_git_head(_REPO_ROOT) + ("-dirty" if _dirty(_REPO_ROOT) else ""),
        reference_commit=_git_head(ref_dir),
        devices=args.devices,
        sample=args.sample,
        seed=args.seed,
        files_found=len(found),
        files_left_out=left_out,
    )
    text = json.dumps({"meta": meta, "files": table, "totals": totals}, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
