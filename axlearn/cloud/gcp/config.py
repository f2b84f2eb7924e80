"""GCP settings from AXLearn-style TOML config files (`axlearn gcp config list|activate|cleanup`).

Files, read in this order and merged (a later file's keys win):

1. `.axlearn/axlearn.default.config` in the current directory (checked into a project),
2. `~/.axlearn.config` (the user's own),
3. `.axlearn/.axlearn.config` in the current directory (the user's, for this project).

Each file holds sections `[gcp."PROJECT:ZONE"]`, e.g.

    [gcp."my-project:us-east5-a"]
    project = "my-project"
    zone = "us-east5-a"
    network = "projects/my-project/global/networks/default"
    subnetwork = "projects/my-project/regions/us-east5/subnetworks/default"
    service_account_email = "ml-training@my-project.iam.gserviceaccount.com"
    permanent_bucket = "my-permanent"
    private_bucket = "my-private"
    ttl_bucket = "my-ttl-30d"
    labels = "v5p"
    docker_repo = "us-docker.pkg.dev/my-project/axlearn"
    default_dockerfile = "Dockerfile"

`axlearn gcp config activate [--label=L]` records the chosen section as `_active` under `[gcp]`
in the user file (the project's `.axlearn/.axlearn.config` when `.axlearn/` exists here, else
`~/.axlearn.config`). Reading uses the standard library (`tomllib`); writing needs `toml` from
the [gcp] extra.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from typing import Any, Optional

ACTIVE_KEY = "_active"
# Keys every launch needs; `require` names the missing one and the files it looked in.
REQUIRED_KEYS = ("project", "zone")


class ConfigError(ValueError):
    """A missing, malformed or incomplete config file; the message names the file and key."""


def default_config_path(cwd: Optional[str] = None) -> str:
    """Returns the project's checked-in default config path."""
    return os.path.join(cwd or os.getcwd(), ".axlearn", "axlearn.default.config")


def project_user_config_path(cwd: Optional[str] = None) -> str:
    """Returns the project-local user config path."""
    return os.path.join(cwd or os.getcwd(), ".axlearn", ".axlearn.config")


def home_config_path() -> str:
    """Returns the user's home config path (`~/.axlearn.config`)."""
    return os.path.join(os.path.expanduser("~"), ".axlearn.config")


def config_paths(cwd: Optional[str] = None) -> list[str]:
    """Returns the config file paths in read order (later wins)."""
    return [default_config_path(cwd), home_config_path(), project_user_config_path(cwd)]


def user_config_path(cwd: Optional[str] = None) -> str:
    """Returns the file `activate` writes: the project's when `.axlearn/` exists, else home."""
    if os.path.isdir(os.path.join(cwd or os.getcwd(), ".axlearn")):
        return project_user_config_path(cwd)
    return home_config_path()


def _read(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from e


def _merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for k, v in update.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclasses.dataclass
class GcpConfigs:
    """The merged config files.

    Attributes:
        files: The config files found, in read order.
        sections: "PROJECT:ZONE" -> that section's settings (merged over files).
        sources: "PROJECT:ZONE" -> the files that define it.
        active: The active section's name, or None.
    """

    files: list[str]
    sections: dict[str, dict[str, Any]]
    sources: dict[str, list[str]]
    active: Optional[str]


def load_configs(cwd: Optional[str] = None) -> GcpConfigs:
    """Reads and merges every config file that exists.

    Args:
        cwd: The project directory (default: the current directory).

    Returns:
        The merged `GcpConfigs`.

    Raises:
        ConfigError: A file is not valid TOML, or its `gcp` entries are not tables.
    """
    files, merged, sources = [], {}, {}
    for path in config_paths(cwd):
        if not os.path.isfile(path):
            continue
        files.append(path)
        gcp = _read(path).get("gcp", {})
        if not isinstance(gcp, dict):
            raise ConfigError(f'{path}: `gcp` must be a table of [gcp."PROJECT:ZONE"] sections.')
        for name, section in gcp.items():
            if name == ACTIVE_KEY:
                continue
            if not isinstance(section, dict):
                raise ConfigError(f"{path}: gcp.{name!r} must be a table, got {section!r}.")
            merged[name] = _merge(merged.get(name, {}), section)
            sources.setdefault(name, []).append(path)
    active = None
    for path in files:
        value = _read(path).get("gcp", {}).get(ACTIVE_KEY)
        if value:
            active = value
    return GcpConfigs(files=files, sections=merged, sources=sources, active=active)


def _labels(section: dict) -> list[str]:
    labels = section.get("labels", [])
    if isinstance(labels, str):
        labels = [x.strip() for x in labels.split(",") if x.strip()]
    return list(labels)


def format_list(configs: GcpConfigs) -> str:
    """Returns `axlearn gcp config list`'s output: the files found and each section.

    Args:
        configs: The merged configs.

    Returns:
        Lines of text; the active section is marked `[*]`.
    """
    if not configs.files:
        return "No config file found; looked for:\n" + "\n".join(f"  {p}" for p in config_paths())
    lines = []
    if configs.active is None:
        lines.append("No GCP project has been activated; please run `axlearn gcp config activate`.")
    lines += [f"Found config at {p}" for p in configs.files]
    for name in sorted(configs.sections):
        mark = "*" if name == configs.active else " "
        labels = _labels(configs.sections[name])
        lines.append(f"[{mark}] {name}" + (f" [{', '.join(labels)}]" if labels else ""))
    return "\n".join(lines)


def select(configs: GcpConfigs, label: Optional[str] = None) -> str:
    """Returns the section `activate` picks: the only one, or the only one with `label`.

    Args:
        configs: The merged configs.
        label: A label (or a section name) to select by.

    Returns:
        The section name.

    Raises:
        ConfigError: No config, no match, or more than one match.
    """
    if not configs.sections:
        raise ConfigError(
            'No [gcp."PROJECT:ZONE"] section in any config file; create one of: '
            + ", ".join(config_paths())
        )
    names = sorted(configs.sections)
    if label is not None:
        names = [n for n in names if n == label or label in _labels(configs.sections[n])]
        if not names:
            raise ConfigError(
                f"No config section has --label={label!r}; see `axlearn gcp config list`."
            )
    if len(names) > 1:
        raise ConfigError(
            f"{len(names)} config sections match ({', '.join(names)}); pick one with --label."
        )
    return names[0]


def write_active(name: Optional[str], cwd: Optional[str] = None) -> str:
    """Records (or with None, clears) the active section in the user config file.

    Args:
        name: The section name, or None to clear.
        cwd: The project directory.

    Returns:
        The path written.

    Raises:
        ConfigError: If `toml` (the [gcp] extra) is not installed.
    """
    try:
        import toml  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ConfigError(
            "Writing config files needs the [gcp] extra: pip install 'axlearn[gcp]'"
        ) from e
    path = user_config_path(cwd)
    data = _read(path) if os.path.isfile(path) else {}
    gcp = data.setdefault("gcp", {})
    if name is None:
        gcp.pop(ACTIVE_KEY, None)
    else:
        gcp[ACTIVE_KEY] = name
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        toml.dump(data, f)
    return path


def cleanup(cwd: Optional[str] = None) -> list[str]:
    """Deletes the user config files (never the project's checked-in default).

    Args:
        cwd: The project directory.

    Returns:
        The paths deleted.
    """
    removed = []
    for path in (home_config_path(), project_user_config_path(cwd)):
        if os.path.isfile(path):
            os.remove(path)
            removed.append(path)
    return removed


def active_config(cwd: Optional[str] = None, *, required: tuple = REQUIRED_KEYS) -> dict:
    """Returns the active section's settings, checked for `required` keys.

    Args:
        cwd: The project directory.
        required: Keys that must be set.

    Returns:
        The settings, with `_name` (the section name) added.

    Raises:
        ConfigError: No config file, no active section, or a required key missing (named
            with the files that define the section).
    """
    configs = load_configs(cwd)
    if not configs.files:
        raise ConfigError(
            "No axlearn config file found (looked for "
            + ", ".join(config_paths(cwd))
            + "); see docs/launch.md."
        )
    if configs.active is None:
        raise ConfigError(
            "No active GCP config; run `axlearn gcp config activate [--label=...]` "
            f"(config files: {', '.join(configs.files)})."
        )
    if configs.active not in configs.sections:
        raise ConfigError(
            f"The active config {configs.active!r} is not a section of any config file "
            f"({', '.join(configs.files)}); run `axlearn gcp config activate` again."
        )
    section = dict(configs.sections[configs.active])
    for key in required:
        if not section.get(key):
            raise ConfigError(
                f'Config [gcp."{configs.active}"] has no {key!r} '
                f"(defined in {', '.join(configs.sources[configs.active])})."
            )
    section["_name"] = configs.active
    return section
