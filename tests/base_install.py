"""A fresh virtual environment holding only what README command 1 installs, built offline.

README command 1 is `pip install -e .`: axlearn and its base dependencies (pyproject's
`[project] dependencies`, followed through their own requirements), without any extra. Tests
cannot download, so `make_base_env` builds that environment from the packages installed in the
test interpreter's environment:

1. the wheel is built from a copy of the repository (`pip wheel --no-deps --no-build-isolation`);
2. `python -m venv --without-pip` creates a fresh venv;
3. its site-packages gets the wheel's files (unpacked, as pip installs a pure-Python wheel) and
   symlinks to the installed files of the base dependencies only. Every package of an extra
   ([dev], [gcp], [tpu], [wandb], [bench]: torch, transformers, wandb, libtpu, kubernetes, ...)
   is left out, so importing it fails exactly as if it were not installed.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from dataclasses import dataclass

from packaging.markers import default_environment
from packaging.requirements import Requirement

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_requirements(pyproject: str) -> list[str]:
    """The `[project] dependencies` of a pyproject.toml.

    Args:
        pyproject: The file.

    Returns:
        Requirement strings.
    """
    with open(pyproject, "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def base_closure(requirements: list[str]) -> set[str]:
    """The installed distributions that `requirements` need, followed through their requirements.

    Args:
        requirements: Requirement strings (with extras, markers).

    Returns:
        Normalized distribution names.

    Raises:
        ValueError: If a needed distribution is not installed here.
    """
    dists = {_normalize(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    extras_of: dict[str, set[str]] = {}
    pending = [Requirement(r) for r in requirements]
    environment = default_environment()
    while pending:
        req = pending.pop()
        name = _normalize(req.name)
        if req.marker is not None and not req.marker.evaluate({**environment, "extra": ""}):
            continue
        if name not in dists:
            raise ValueError(f"{req.name} (a base dependency) is not installed in {sys.prefix}")
        known = extras_of.get(name)
        if known is not None and set(req.extras) <= known:
            continue
        extras = (known or set()) | set(req.extras)
        extras_of[name] = extras
        for text in dists[name].requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(
                sub.marker.evaluate({**environment, "extra": e}) for e in ["", *sorted(extras)]
            ):
                pending.append(Requirement(str(sub).split(";")[0]))
    return set(extras_of)


def _owners_by_path(site: str, skip: str) -> dict[str, set[str]]:
    """{site-relative path of an installed file or of a directory above one: the distributions
    that installed files there}, leaving out distribution `skip`."""
    owners: dict[str, set[str]] = {}
    for dist in importlib.metadata.distributions(path=[site]):
        name = _normalize(dist.metadata["Name"])
        if name == skip:
            continue
        for file in dist.files or []:
            path = os.path.normpath(str(file))
            if path.startswith(".."):
                continue
            parts = path.split(os.sep)
            for i in range(1, len(parts) + 1):
                owners.setdefault(os.sep.join(parts[:i]), set()).add(name)
    return owners


def _link_tree(src: str, dst: str, rel: str, keep: set[str], owners: dict[str, set[str]]):
    """Links the entries of `src/rel` into `dst/rel` whose files belong to `keep` only."""
    prefix = rel + os.sep if rel else ""
    for entry in sorted(os.listdir(os.path.join(src, rel))):
        path = prefix + entry
        if entry == "__pycache__" or entry.startswith("__editable__"):
            continue
        under = owners.get(path, set())
        if not under:
            if entry.endswith(".pth") or entry.endswith(".dist-info"):
                continue  # Unowned: left by an editable install of axlearn.
            under = keep  # Unowned files: kept.
        if under <= keep:
            os.symlink(os.path.join(src, path), os.path.join(dst, path))
        elif under & keep and os.path.isdir(os.path.join(src, path)):
            os.makedirs(os.path.join(dst, path))
            _link_tree(src, dst, path, keep, owners)


def build_wheel(out_dir: str) -> str:
    """Builds axlearn's wheel from a copy of the repository (offline).

    Args:
        out_dir: Where to build (the copy and the wheel go here).

    Returns:
        The wheel's path.
    """
    src = os.path.join(out_dir, "src")
    shutil.copytree(
        REPO_ROOT,
        src,
        ignore=shutil.ignore_patterns(".git", "__pycache__", "build", "*.egg-info", ".venv"),
    )
    wheel_dir = os.path.join(out_dir, "wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-q", "-w", wheel_dir, src],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = [f for f in os.listdir(wheel_dir) if f.endswith(".whl")]
    return os.path.join(wheel_dir, wheel)


@dataclass
class BaseEnv:
    """A venv with axlearn's wheel and its base dependencies only."""

    # The built wheel.
    wheel: str
    # The venv's python.
    python: str
    # The base distributions linked in (normalized names).
    base: set[str]
    # The installed distributions left out (the extras' packages).
    left_out: set[str]

    def run(self, args: list[str], *, cwd: str = "/", timeout: int = 600, env=None):
        """Runs the venv's python with `args` from `cwd` with a clean environment.

        Returns:
            The `subprocess.CompletedProcess` (text output).
        """
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        clean.update(env or {})
        return subprocess.run(
            [self.python, *args],
            cwd=cwd,
            env=clean,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def make_base_env(out_dir: str) -> BaseEnv:
    """Builds the wheel and a fresh venv holding it and the base dependencies only.

    Args:
        out_dir: An empty directory.

    Returns:
        The environment.
    """
    wheel = build_wheel(out_dir)
    venv = os.path.join(out_dir, "venv")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", venv], check=True, capture_output=True
    )
    python = os.path.join(venv, "bin", "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    here = sysconfig.get_paths()["purelib"]
    base = base_closure(base_requirements(os.path.join(REPO_ROOT, "pyproject.toml")))
    base.discard("axlearn")
    owners = _owners_by_path(here, skip="axlearn")
    installed = {d for ds in owners.values() for d in ds}
    _link_tree(here, site, "", base, owners)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return BaseEnv(wheel=wheel, python=python, base=base, left_out=installed - base)
