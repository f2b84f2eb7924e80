"""Command-line overrides of config fields: `PATH=VALUE` strings applied to a config tree.

    apply_overrides(trainer_cfg, ["max_step=20", "model.decoder.transformer.num_layers=4"])

`PATH` is a dotted path through config fields, dict keys and list indices (`evalers.validation.
eval_policy.n`, `mesh_rules.0`); `VALUE` is a Python literal (`20`, `1e-3`, `'adam'`, `(2, 4)`,
`None`, `True`); text that is not a literal is taken as a string (`name=my_run`). Each override is
applied with `setattr`, i.e. the same validation and type checks as `ConfigBase.set()`, plus a
check of fields annotated with a union of scalar types (e.g. `Union[int, float]`). Errors name the
override, and an unknown path names the nearest valid one.
"""

from __future__ import annotations

import ast
import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any, Union

import attr

from axlearn.common.config import typecheck
from axlearn.common.config.base import ConfigBase
from axlearn.common.config.errors import InvalidConfigValueError, RequiredFieldValue
from axlearn.common.config.paths import lookup_child


class ConfigOverrideError(ValueError):
    """An override names no field of the config, or its value has the wrong type."""


def parse_override(text: str) -> tuple[str, Any]:
    """Splits `PATH=VALUE` and parses `VALUE` as a Python literal (a string if it is not one).

    Args:
        text: The override.

    Returns:
        (path, value).

    Raises:
        ConfigOverrideError: If `text` has no '=' or an empty path.
    """
    if len(text) > MAX_OVERRIDE_CHARS:
        raise ConfigOverrideError(
            f"Config override {text[:_SHOWN_CHARS]!r}... is {len(text)} characters, more than the "
            f"{MAX_OVERRIDE_CHARS} an override may have; set large values in the experiment's "
            "code (a config function or modifier) instead."
        )
    path, sep, raw = text.partition("=")
    path = path.strip()
    if not sep or not path:
        raise ConfigOverrideError(f"Config override {_shown(text)} must have the form PATH=VALUE.")
    raw = raw.strip()
    if raw.lower() in _FLOAT_WORDS:
        # Not Python literals, but what a user means by them: floats (then range-checked).
        return path, float(raw)
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = raw
    return path, value


# The longest override accepted (a long list of regexes fits; a pasted file does not).
MAX_OVERRIDE_CHARS = 65536
# The most characters of a value shown in an error.
_SHOWN_CHARS = 200


def _shown(value: Any) -> str:
    """`repr(value)`, cut to `_SHOWN_CHARS` characters (with the full length) for messages."""
    if isinstance(value, str) and len(value) > _SHOWN_CHARS:
        return f"{value[:_SHOWN_CHARS]!r}... ({len(value)} characters)"
    return _cut(repr(value))


def _cut(text: str) -> str:
    """`text` cut to `_SHOWN_CHARS` characters (with its full length)."""
    return (
        text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}... ({len(text)} characters)"
    )


# Values that `float()` reads and a user writes for a float: nan, inf, -inf, +inf, infinity.
_FLOAT_WORDS = ("nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity")


def _children(node: Any) -> list[tuple[str, Any]]:
    if isinstance(node, ConfigBase):
        return [(k, getattr(node, k)) for k in node.keys()]
    if isinstance(node, dict):
        return [(str(k), v) for k, v in node.items()]
    if isinstance(node, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(node)]
    return []


def all_paths(cfg: ConfigBase) -> list[str]:
    """Every dotted path of the tree under `cfg` (fields, dict keys, list indices), sorted.

    Args:
        cfg: The root config.

    Returns:
        The paths.
    """
    result = []

    def walk(prefix: str, node: Any):
        for key, child in _children(node):
            path = f"{prefix}.{key}" if prefix else key
            result.append(path)
            walk(path, child)

    walk("", cfg)
    return sorted(result)


def nearest_path(path: str, candidates: Sequence[str]) -> str | None:
    """The candidate most similar to `path`; candidates with the same last name come first.

    Args:
        path: The unknown dotted path.
        candidates: The valid paths.

    Returns:
        The nearest path, or None if there are no candidates.
    """
    if not candidates:
        return None
    last = path.rsplit(".", 1)[-1]
    same_last = [c for c in candidates if c.rsplit(".", 1)[-1] == last]
    pool = same_last or list(candidates)

    def score(candidate: str) -> float:
        return difflib.SequenceMatcher(None, path, candidate).ratio()

    return max(sorted(pool), key=score)


def _union_scalar_types(cfg: ConfigBase, name: str) -> tuple[str, Any] | None:
    """(description, annotation) when field `name` is annotated with a union of scalars."""
    hint = typecheck.field_hints(type(cfg)).get(name)
    if typing.get_origin(hint) not in (Union, types.UnionType):
        return None
    args = [a for a in typing.get_args(hint) if a not in (type(None), RequiredFieldValue)]
    if not args or any(a not in (int, float, str, bool) for a in args):
        return None
    names = " or ".join(a.__name__ for a in args)
    if type(None) in typing.get_args(hint):
        names += " or None"
    return names, hint


def _check_value(parent: ConfigBase, name: str, old: Any, value: Any, path: str) -> None:
    # None removes an optional child (e.g. `...query_scale.norm=None`); set() checks the rest.
    if isinstance(old, ConfigBase) and value is not None and not isinstance(value, ConfigBase):
        raise ConfigOverrideError(
            f"Config override {path}={_shown(value)}: {path} is a config "
            f"({type(old).__qualname__}); override its fields instead, e.g. "
            f"{path}.{old.keys()[0] if old.keys() else 'FIELD'}=..."
        )
    if value is None:
        return
    checked = _union_scalar_types(parent, name)
    if checked is None:
        return
    names, hint = checked
    if not typecheck.matches(value, hint):
        raise ConfigOverrideError(
            f"Config override {path}={_shown(value)}: expects {names}, got {type(value).__name__}"
        )


def apply_override(cfg: ConfigBase, path: str, value: Any) -> None:
    """Sets `value` at dotted `path` of `cfg` with `set()`'s checks.

    Args:
        cfg: The root config (modified in place).
        path: The dotted path; every part must exist.
        value: The new value.

    Raises:
        ConfigOverrideError: If the path does not exist (the message names the nearest valid
            path) or the value has the wrong type (the message names the expected type).
    """
    keys = [k for k in path.split(".") if k]
    node: Any = cfg
    for i, key in enumerate(keys):
        found, child = lookup_child(node, key)
        if not found:
            # A path far longer than any field's has no useful nearest one (and difflib is slow).
            nearest = nearest_path(path, all_paths(cfg)) if len(path) <= 1000 else None
            hint = f"; did you mean {nearest}?" if nearest else ""
            missing = _cut(".".join(keys[: i + 1]))
            raise ConfigOverrideError(
                f"Config override {_cut(path)}={_shown(value)}: {missing} does not exist{hint}"
            )
        if i == len(keys) - 1:
            break
        node = child
    name = keys[-1]
    if isinstance(node, ConfigBase):
        _check_value(node, name, child, value, path)
        try:
            setattr(node, name, value)
        except (InvalidConfigValueError, TypeError, ValueError) as e:
            raise ConfigOverrideError(
                f"Config override {path}={_shown(value)}: {_cut(str(e))}"
            ) from e
        # attrs validators of the class may reject the value only at instantiate; check now.
        if attr.has(type(node)):
            attr.validate(node)
    elif isinstance(node, dict):
        node[name] = value
    elif isinstance(node, list):
        node[int(name)] = value
    elif isinstance(node, tuple):
        whole = list(node)
        whole[int(name)] = value
        parent = ".".join(keys[:-1])
        raise ConfigOverrideError(
            f"Config override {path}={_shown(value)}: {parent} is a tuple, whose items cannot be "
            f"set one by one; set the whole tuple instead: --config_override='{parent}="
            f"{tuple(whole)!r}'"
        )
    else:
        raise ConfigOverrideError(
            f"Config override {path}={_shown(value)}: cannot set an item of a {type(node).__name__}"
        )


def apply_overrides(cfg: ConfigBase, overrides: Sequence[str]) -> ConfigBase:
    """Applies `PATH=VALUE` overrides in order (see the module docstring).

    Args:
        cfg: The root config (modified in place).
        overrides: The override strings.

    Returns:
        `cfg`.

    Raises:
        ConfigOverrideError: On a malformed override, an unknown path or a value of the wrong type.
    """
    for text in overrides:
        path, value = parse_override(text)
        apply_override(cfg, path, value)
    return cfg
