"""Golden config dumps: every named experiment config vs experiments/testdata/<module>/<name>.txt.

Besides the config dump (`<name>.txt`), each config has AXLearn's parameter-init dump
(`<name>_init.txt`) and per-parameter weight-decay dump (`<name>_regularizer.txt`), as
`axlearn config dump --init/--regularizer` prints them (see `axlearn.common.golden_config`).

A change that moves any line fails here with a unified diff. If the change is intended,
regenerate the goldens and review the diff in version control:

    AXLEARN_UPDATE_GOLDENS=1 .venv/bin/pytest experiments/test_golden_configs.py

A golden file whose config no longer exists also fails (delete it, or regenerate).
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil

import pytest

import axlearn.experiments
from axlearn.common import golden_config

TESTDATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")
UPDATE_ENV = "AXLEARN_UPDATE_GOLDENS"


def experiment_modules() -> list[str]:
    """The modules under `axlearn.experiments` that define named_trainer_configs()."""
    names = []
    package = axlearn.experiments
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        leaf = info.name.rsplit(".", 1)[-1]
        if leaf.startswith("test") or info.ispkg:
            continue
        module = importlib.import_module(info.name)
        if callable(getattr(module, "named_trainer_configs", None)):
            names.append(info.name)
    return sorted(names)


def _cases() -> list[tuple[str, str]]:
    cases = []
    for module in experiment_modules():
        configs = importlib.import_module(module).named_trainer_configs()
        cases.extend((module, name) for name in sorted(configs))
    return cases


# The dumps of each config: file suffix -> text function (of a built trainer config).
KINDS = {
    ".txt": lambda cfg: cfg.debug_string() + "\n",
    "_init.txt": golden_config.init_text,
    "_regularizer.txt": golden_config.regularizer_text,
}


def golden_path(module: str, name: str, suffix: str = ".txt") -> str:
    """The golden dump file of config `name` of `module` (`suffix`: one of KINDS)."""
    return os.path.join(TESTDATA_DIR, module, f"{name}{suffix}")


def dump(module: str, name: str, suffix: str = ".txt") -> str:
    """The dump text of a named config, as `axlearn config dump [--init/--regularizer]` prints."""
    cfg = importlib.import_module(module).named_trainer_configs()[name]()
    return KINDS[suffix](cfg)


@pytest.mark.parametrize("suffix", sorted(KINDS))
@pytest.mark.parametrize("module,name", _cases())
def test_golden_config(module: str, name: str, suffix: str):
    path = golden_path(module, name, suffix)
    text = dump(module, name, suffix)
    if os.environ.get(UPDATE_ENV):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    if not os.path.exists(path):
        pytest.fail(f"No golden dump {path} for {module}:{name}; run with {UPDATE_ENV}=1.")
    with open(path, encoding="utf-8") as f:
        expected = f.read()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"golden {path}",
                tofile=f"current {module}:{name}",
            )
        )
        pytest.fail(
            f"Config {module}:{name} moved from its golden dump. If intended, rerun with "
            f"{UPDATE_ENV}=1 and review the diff.\n{diff}"
        )


def test_no_stale_goldens():
    expected = {golden_path(m, n, suffix) for m, n in _cases() for suffix in KINDS}
    found = set()
    if os.path.isdir(TESTDATA_DIR):
        for module_dir in os.listdir(TESTDATA_DIR):
            full = os.path.join(TESTDATA_DIR, module_dir)
            if os.path.isdir(full) and module_dir.startswith("axlearn.experiments."):
                found |= {os.path.join(full, f) for f in os.listdir(full) if f.endswith(".txt")}
    stale = sorted(found - expected)
    if stale and os.environ.get(UPDATE_ENV):
        for path in stale:
            os.remove(path)
        return
    assert not stale, f"Golden dumps without a named config (delete or regenerate): {stale}"
