"""Bundlers: turn the local source tree into a container image a job runs.

A bundler reads `--bundler_spec=KEY=VALUE` flags (see `SPEC_KEYS`), checks the git tree, and
returns a `BuildPlan`: the image it will produce and the commands (or Cloud Build request) that
produce it. `--dry_run` prints the plan; a launch runs it before submitting the job.

The cloud-specific bundlers (`docker`, `artifactregistry`, `cloudbuild`) live in
`axlearn.cloud.gcp.bundler`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any, Optional

# The keys `--bundler_spec` accepts, with their meaning. `build_arg.NAME=VALUE` adds a Docker
# build argument NAME.
SPEC_KEYS = {
    "dockerfile": "The Dockerfile, relative to the build context (default: the config's "
    "default_dockerfile, else Dockerfile).",
    "image": "The image name inside the repository (default: axlearn).",
    "target": "The Dockerfile stage to build: tpu, gpu or cpu (default: the instance's platform).",
    "platform": "The image platform (default: linux/amd64).",
    "repo": "The docker repository to push to (default: the config's docker_repo).",
    "context": "The build context directory (default: the current directory).",
    "allow_dirty": "true to build from a git tree with uncommitted changes.",
}
BUILD_ARG_PREFIX = "build_arg."
# The file name a command uses for the Cloud Build request; `BuildPlan.run` writes it.
REQUEST_FILE = "cloudbuild.json"


class BundlerError(ValueError):
    """A bundler spec or source tree the bundler refuses; the message names the problem."""


@dataclasses.dataclass
class BundlerSpec:
    """A parsed `--bundler_spec`.

    Attributes:
        dockerfile: Dockerfile path within the context.
        image: Image name within the repository.
        target: Dockerfile build stage.
        platform: Image platform.
        repo: Docker repository (None: from the config).
        context: Build context directory.
        allow_dirty: Whether a dirty git tree may be built.
        build_args: Extra Docker build arguments.
    """

    dockerfile: str = "Dockerfile"
    image: str = "axlearn"
    target: Optional[str] = None
    platform: str = "linux/amd64"
    repo: Optional[str] = None
    context: str = "."
    allow_dirty: bool = False
    build_args: dict[str, str] = dataclasses.field(default_factory=dict)


def parse_bundler_spec(items: Sequence[str], **defaults: Any) -> BundlerSpec:
    """Parses `--bundler_spec` values into a `BundlerSpec`.

    Args:
        items: "KEY=VALUE" strings.
        **defaults: Field defaults that the items override (e.g. dockerfile from the config).

    Returns:
        The spec.

    Raises:
        BundlerError: An item without "=", an unknown key (the message lists the known ones),
            or an allow_dirty that is not a boolean.
    """
    spec = BundlerSpec(**{k: v for k, v in defaults.items() if v is not None})
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise BundlerError(f"--bundler_spec={item!r} must be KEY=VALUE.")
        if key.startswith(BUILD_ARG_PREFIX) and len(key) > len(BUILD_ARG_PREFIX):
            spec.build_args[key[len(BUILD_ARG_PREFIX) :]] = value
        elif key == "allow_dirty":
            if value.lower() not in ("true", "false", "1", "0"):
                raise BundlerError(f"--bundler_spec=allow_dirty={value!r} must be true or false.")
            spec.allow_dirty = value.lower() in ("true", "1")
        elif key in SPEC_KEYS:
            setattr(spec, key, value)
        else:
            known = ", ".join(sorted(SPEC_KEYS) + [BUILD_ARG_PREFIX + "NAME"])
            raise BundlerError(f"--bundler_spec key {key!r} does not exist; known keys: {known}.")
    return spec


@dataclasses.dataclass
class GitState:
    """The source tree's git state.

    Attributes:
        commit: HEAD's commit hash, or "unknown" outside a git repository.
        dirty_files: Paths with uncommitted changes (`git status --porcelain`).
    """

    commit: str
    dirty_files: list[str]


def git_state(context: str = ".") -> GitState:
    """Returns the git commit and uncommitted files of `context`.

    Args:
        context: A directory inside the repository.

    Returns:
        The `GitState` (commit "unknown" and no dirty files outside a git repository).
    """

    def git(*args: str) -> Optional[str]:
        try:
            return subprocess.run(
                ["git", "-C", context, *args], capture_output=True, text=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            return None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return GitState(commit="unknown", dirty_files=[])
    status = git("status", "--porcelain") or ""
    return GitState(
        commit=commit.strip(), dirty_files=[line[3:] for line in status.splitlines() if line]
    )


def check_clean(state: GitState, spec: BundlerSpec) -> None:
    """Refuses a dirty tree unless the spec allows it.

    Args:
        state: The git state.
        spec: The bundler spec.

    Raises:
        BundlerError: If the tree has uncommitted changes and `allow_dirty` is false.
    """
    if state.dirty_files and not spec.allow_dirty:
        shown = ", ".join(state.dirty_files[:5]) + (" ..." if len(state.dirty_files) > 5 else "")
        raise BundlerError(
            f"The git tree has {len(state.dirty_files)} uncommitted change(s) ({shown}); commit "
            "them, or pass --bundler_spec=allow_dirty=true to build them into the image."
        )


@dataclasses.dataclass
class BuildPlan:
    """What a bundler will do.

    Attributes:
        bundler: The bundler type.
        image: The full image reference the job runs.
        commands: Commands to run, in order (argv lists).
        request: The Cloud Build request (cloudbuild only), as a dict.
        git_commit: The commit built into the image (build arg GIT_COMMIT).
    """

    bundler: str
    image: str
    commands: list[list[str]]
    request: Optional[dict] = None
    git_commit: str = "unknown"

    def describe(self) -> str:
        """Returns the plan as text for `--dry_run`."""
        lines = [
            f"Bundler: {self.bundler}",
            f"Image: {self.image}",
            f"Git commit: {self.git_commit}",
        ]
        lines += ["Commands:"] + [f"  {shlex.join(c)}" for c in self.commands]
        if self.request is not None:
            lines.append(f"Cloud Build request ({REQUEST_FILE}):")
            lines += ["  " + line for line in json.dumps(self.request, indent=2).splitlines()]
        return "\n".join(lines)

    def run(self) -> None:
        """Runs the commands, stopping at the first failure.

        Raises:
            BundlerError: A command failed or its program is missing.
        """
        with tempfile.TemporaryDirectory() as tmp:
            for command in self.commands:
                self._run_one([self._with_request(arg, tmp) for arg in command])

    def _with_request(self, arg: str, tmp: str) -> str:
        """Writes the Cloud Build request where a command names REQUEST_FILE."""
        if self.request is None or not arg.endswith(REQUEST_FILE):
            return arg
        path = os.path.join(tmp, REQUEST_FILE)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.request, f, indent=2)
        return arg[: -len(REQUEST_FILE)] + path

    @staticmethod
    def _run_one(command: list[str]) -> None:
        try:
            subprocess.run(command, check=True)
        except FileNotFoundError as e:
            raise BundlerError(f"Bundling needs {command[0]!r}, not found on PATH.") from e
        except subprocess.CalledProcessError as e:
            raise BundlerError(
                f"Bundling failed: `{shlex.join(command)}` exited with {e.returncode}."
            ) from e
