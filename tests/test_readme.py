"""README.md promises exactly two set-up commands; the test command is the one CI runs."""

import os
import re

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(path: str) -> str:
    with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
        return f.read()


def _sh_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)]


def test_readme_has_exactly_two_setup_commands():
    blocks = _sh_blocks(_read("README.md"))
    assert len(blocks) == 2, blocks
    for block in blocks:
        assert len(block.splitlines()) == 1, f"each set-up command is one line: {block!r}"
        assert block.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install -e ")


def test_readme_test_command_is_what_ci_runs():
    test_command = _sh_blocks(_read("README.md"))[1]
    assert test_command.endswith("pip install -e '.[dev]' && pytest -n 2")
    ci = _read(".ci/run")
    assert "pip install --progress-bar off -e '.[dev]'" in ci
    assert re.search(r"^\s*pytest -n 2 \"\$@\"", ci, flags=re.M), (
        "CI runs the README's pytest command"
    )
    phases = re.findall(r"^run_phase (\w+)(.*)$", ci, flags=re.M)
    assert phases == [("quick", ""), ("slow", " -m slow")], (
        "CI runs the quick suite, then the slow one"
    )
    assert "ruff check ." in ci


def test_default_run_leaves_out_slow_tests():
    # The README's `pytest -n 2` is the quick loop: slow-marked tests only run with `-m slow`.
    pyproject = _read("pyproject.toml")
    assert re.search(r"""^addopts = ".*-m 'not slow'.*"$""", pyproject, flags=re.M), pyproject
