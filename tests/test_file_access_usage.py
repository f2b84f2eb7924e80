"""The modules that read and write run directories open files only through the file layer.

`axlearn.common.file_access` opens every file below a run directory's descriptor with no link
followed at any component, regular files only, reads bounded. A plain `open()`, `os.open()` or a
`realpath` check in these modules would bypass it (a link followed, a FIFO that blocks, a
check-then-open window), so this test parses them and refuses any such call.
"""

import ast
import glob
import os

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The modules that touch run directories (trainer dir, checkpoint dir, events, compilation
# cache, run records, Hugging Face dirs, inference outputs, the launcher's files).
GUARDED = (
    "axlearn/common/checkpointer/*.py",
    "axlearn/common/goodput*.py",
    "axlearn/common/measurement*.py",
    "axlearn/common/compilation_cache*.py",
    "axlearn/common/run_record*.py",
    "axlearn/common/run_lock.py",
    "axlearn/common/hf_checkpoint*.py",
    "axlearn/common/inference*.py",
    "axlearn/cloud/common/local_launch.py",
)

# Calls still allowed, per module: {path: number of calls}. These modules are being moved onto
# the file layer in other changes of issue 48 (goodput/launcher/run records: the goodput and
# launcher work; Hugging Face import/export: the input-state work). WHEN YOU CONVERT A MODULE,
# SHRINK ITS COUNT HERE (remove the entry at 0): the test fails on a stale count as well as on a
# new call, so the list only ever shrinks.
ALLOWED = {
}

# Files that are not run files (kernel interfaces) may be opened by their literal path.
_SYSTEM_PREFIXES = ("/proc/", "/sys/")


def _call_name(node: ast.Call) -> str:
    """'open', 'os.open', 'io.open' or 'realpath' for a call this test refuses, else ''."""
    fn = node.func
    if isinstance(fn, ast.Name) and fn.id == "open":
        return "open"
    if isinstance(fn, ast.Attribute):
        if fn.attr == "realpath":
            return "realpath"
        if fn.attr == "open" and isinstance(fn.value, ast.Name) and fn.value.id in ("os", "io"):
            return f"{fn.value.id}.open"
    return ""


def _is_system_file(node: ast.Call) -> bool:
    if not node.args or not isinstance(node.args[0], ast.Constant):
        return False
    value = node.args[0].value
    return isinstance(value, str) and value.startswith(_SYSTEM_PREFIXES)


def find_plain_opens(path: str) -> list[str]:
    """`path:line: call` of every plain open/os.open/io.open/realpath call in a module.

    Args:
        path: The module, relative to the repository root.

    Returns:
        One entry per call (calls opening a literal /proc or /sys path excluded).
    """
    with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name and not _is_system_file(node):
                found.append(f"{path}:{node.lineno}: {name}()")
    return sorted(found)


def _guarded_modules() -> list[str]:
    paths = set()
    for pattern in GUARDED:
        for path in glob.glob(os.path.join(_ROOT, pattern)):
            paths.add(os.path.relpath(path, _ROOT).replace(os.sep, "/"))
    return sorted(paths)


def test_guarded_modules_exist():
    modules = _guarded_modules()
    assert "axlearn/common/checkpointer/layout.py" in modules
    assert "axlearn/common/run_lock.py" in modules
    assert "axlearn/cloud/common/local_launch.py" in modules
    for path in ALLOWED:
        assert path in modules, f"{path} in ALLOWED is not a guarded module"


def test_run_files_are_opened_only_through_the_file_layer():
    problems = []
    for path in _guarded_modules():
        calls = find_plain_opens(path)
        allowed = ALLOWED.get(path, 0)
        if len(calls) > allowed:
            problems.append(
                f"{path}: {len(calls)} plain open/realpath calls, {allowed} allowed; open run "
                "files through axlearn.common.file_access instead:\n    " + "\n    ".join(calls)
            )
        elif len(calls) < allowed:
            problems.append(
                f"{path}: {len(calls)} plain open/realpath calls left, ALLOWED says {allowed}: "
                "shrink its entry in tests/test_file_access_usage.py"
            )
    assert not problems, "\n".join(problems)


def test_the_checker_finds_each_kind_of_call(tmp_path, monkeypatch):
    """The checker itself: each refused call is found; a /proc read and os.fdopen are not."""
    source = (
        "import io, os\n"
        "open('run.json')\n"
        "os.open('x', os.O_RDONLY)\n"
        "io.open('y')\n"
        "os.path.realpath('z')\n"
        "open('/proc/meminfo')\n"
        "os.fdopen(3)\n"
    )
    (tmp_path / "mod.py").write_text(source)
    monkeypatch.setattr(os.path, "join", lambda *parts: str(tmp_path / "mod.py"))
    found = find_plain_opens("mod.py")
    assert [f.split(": ")[1] for f in found] == ["open()", "os.open()", "io.open()", "realpath()"]
