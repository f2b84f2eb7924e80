"""Dotted paths into a config tree: the one home of config path lookup.

A path goes through config fields, dict keys and list/tuple indices:
`model.decoder.transformer.layer`, `evalers.validation.eval_policy.n`, `mesh_rules.0`. Config
overrides (`config/override.py`) and config modifiers (`trainer_config_modifier.py`) both look
paths up here.
"""

from __future__ import annotations

from typing import Any

from axlearn.common.config.base import ConfigBase


class ConfigPathError(ValueError):
    """A dotted config path names something that does not exist."""

    def __init__(self, message: str, *, prefix: str):
        super().__init__(message)
        # The path up to and including the first part that does not exist.
        self.prefix = prefix


def split_path(path: str) -> list[str]:
    """The parts of a dotted path.

    Args:
        path: E.g. "model.decoder.transformer".

    Returns:
        The non-empty parts.

    Raises:
        ConfigPathError: If the path has no parts.
    """
    parts = [p for p in path.split(".") if p]
    if not parts:
        raise ConfigPathError(f"Empty config path {path!r}: give a dotted path.", prefix="")
    return parts


def lookup_child(node: Any, key: str) -> tuple[bool, Any]:
    """Looks up one path part in a config, dict, list or tuple.

    Args:
        node: The config tree node.
        key: A field name, a dict key, or a list/tuple index (digits).

    Returns:
        (found, value); value is None when not found.
    """
    if isinstance(node, ConfigBase):
        return (True, getattr(node, key)) if key in node else (False, None)
    if isinstance(node, dict):
        return (True, node[key]) if key in node else (False, None)
    if isinstance(node, (list, tuple)) and key.isdigit() and int(key) < len(node):
        return True, node[int(key)]
    return False, None


def _missing(node: Any, key: str, prefix: str) -> ConfigPathError:
    if isinstance(node, dict):
        message = f"{prefix}: no entry {key!r} (entries: {sorted(node, key=str)})"
    elif isinstance(node, ConfigBase):
        message = f"{prefix}: {type(node).__name__} has no field {key!r}"
    elif isinstance(node, (list, tuple)):
        message = f"{prefix}: no item {key!r} in a {type(node).__name__} of length {len(node)}"
    else:
        message = f"{prefix}: cannot look up {key!r} in a {type(node).__name__}"
    return ConfigPathError(message, prefix=prefix)


def lookup_path(cfg: Any, path: str) -> Any:
    """Returns the value at dotted `path` in a config tree.

    Args:
        cfg: The root config.
        path: E.g. "model.decoder.transformer.layer" or "mesh_rules.0".

    Returns:
        The value.

    Raises:
        ConfigPathError: Naming the first part of the path that does not exist.
    """
    node, seen = cfg, []
    for key in split_path(path):
        seen.append(key)
        found, child = lookup_child(node, key)
        if not found:
            raise _missing(node, key, ".".join(seen))
        node = child
    return node


def replace_path(cfg: Any, path: str, value: Any) -> None:
    """Sets the value at dotted `path` (which must exist) in a config tree.

    Args:
        cfg: The root config (modified in place).
        path: E.g. "model.decoder.transformer.layer".
        value: The new value.

    Raises:
        ConfigPathError: Naming the first part of the path that does not exist, or if the last
            part is an item of a tuple (which cannot be set).
    """
    keys = split_path(path)
    parent = lookup_path(cfg, ".".join(keys[:-1])) if len(keys) > 1 else cfg
    lookup_path(cfg, path)  # Must exist.
    key = keys[-1]
    if isinstance(parent, dict):
        parent[key] = value
    elif isinstance(parent, list):
        parent[int(key)] = value
    elif isinstance(parent, ConfigBase):
        setattr(parent, key, value)
    else:
        raise ConfigPathError(
            f"{path}: cannot set an item of a {type(parent).__name__} (replace the whole "
            f"{'.'.join(keys[:-1])} instead).",
            prefix=path,
        )
