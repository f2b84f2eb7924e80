"""Checks config field values against their annotations when they are set.

Every annotated field of a `@config_class` is checked at assignment (`set()`, attribute
assignment, construction), including `Union`, `Optional`, `Required`, `Literal`, `Sequence`,
`tuple`, `list`, `dict`, `Callable`, enum and class annotations. The check is deliberately
permissive where a value can legitimately stand for the annotated type:

- `None` and `REQUIRED` are accepted everywhere (fields default to them).
- A config (`ConfigBase`) is accepted wherever a non-scalar object is expected: configs build
  the object (`ConfigOr[T]`).
- `int` (and NumPy integers) are accepted for `float`; `bool` is never an `int` or `float`.
- NumPy scalars, 0-d NumPy/JAX arrays of the right kind are accepted for `int`/`float`.
- An enum member's value (e.g. its string) is accepted for the enum.
- Tuples and lists are interchangeable for sequence annotations; a `str` is never a sequence
  unless `str` is itself allowed. Other indexable sized iterables
  (e.g. `PartitionSpec`) are sequences.
- Annotations that cannot be resolved, type variables, `Any`, protocols that are not runtime
  checkable, and typing constructs not listed above accept every value.
"""

from __future__ import annotations

import collections.abc
import enum
import functools
import sys
import types
import typing
from typing import Any, Literal, Optional, Union

import attr
import numpy as np

from axlearn.common.config.errors import RequiredFieldValue

_NO_HINT = object()

_SEQUENCE_ORIGINS = (
    list,
    tuple,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
)
_COLLECTION_ORIGINS = (
    set,
    frozenset,
    collections.abc.Set,
    collections.abc.MutableSet,
    collections.abc.Collection,
    collections.abc.Iterable,
)
_MAPPING_ORIGINS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_SCALARS = (int, float, str, bool, bytes, complex)
_UNION_ORIGINS = (Union, types.UnionType)


def _resolve_one(annotation: Any, module_name: str) -> Any:
    """Evaluates one (possibly string) annotation in its module; `_NO_HINT` on failure."""
    if not isinstance(annotation, str):
        return annotation
    module = sys.modules.get(module_name)
    namespace = dict(vars(typing))
    namespace.update(vars(collections.abc))
    if module is not None:
        namespace.update(vars(module))
    try:
        return eval(annotation, namespace)  # pylint: disable=eval-used
    except Exception:  # pylint: disable=broad-except
        return _NO_HINT


@functools.cache
def field_hints(config_cls: type) -> dict[str, Any]:
    """Returns {field name: resolved annotation} for the attrs fields of `config_cls`.

    Fields whose annotation cannot be resolved are left out (they are not checked).

    Args:
        config_cls: A `@config_class` class.

    Returns:
        The resolved annotations.
    """
    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:  # pylint: disable=broad-except
        # Resolve field by field, so that one unresolvable annotation does not disable the rest.
        hints = {}
        for klass in reversed(config_cls.__mro__):
            for name, annotation in klass.__dict__.get("__annotations__", {}).items():
                resolved = _resolve_one(annotation, klass.__module__)
                if resolved is _NO_HINT:
                    hints.pop(name, None)
                else:
                    hints[name] = resolved
    if not attr.has(config_cls):
        return {}
    return {f.name: hints[f.name] for f in attr.fields(config_cls) if f.name in hints}


class ConfigMarker:
    """The base of `axlearn.common.config.ConfigBase`, declared here so this module can tell a
    config from other values without importing `base` (which imports this module)."""

    __slots__ = ()


def _is_config(value: Any) -> bool:
    return isinstance(value, ConfigMarker)


def _array_kind(value: Any) -> Optional[str]:
    """The dtype kind of a 0-d NumPy/JAX array or NumPy scalar, else None."""
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is None or shape != ():
        return None
    try:
        return np.dtype(dtype).kind
    except TypeError:
        return None


def _matches_scalar(value: Any, hint: type) -> bool:
    if hint is bool:
        return isinstance(value, (bool, np.bool_)) or _array_kind(value) == "b"
    if isinstance(value, (bool, np.bool_)):
        return False
    if hint is int:
        return isinstance(value, (int, np.integer)) or _array_kind(value) in ("i", "u")
    if hint is float:
        return isinstance(value, (int, float, np.integer, np.floating)) or _array_kind(value) in (
            "i",
            "u",
            "f",
        )
    if hint is complex:
        return isinstance(value, (int, float, complex, np.number))
    return isinstance(value, hint)


def _strip_required(args: tuple) -> Optional[tuple]:
    """Union args without the `Required[...]` markers; None when the union accepts anything."""
    if Any in args:
        if RequiredFieldValue not in args:
            return None
        args = tuple(a for a in args if a is not Any)
    return tuple(a for a in args if a not in (RequiredFieldValue, type(None)))


def _is_scalar_only(hint: Any) -> bool:
    """Whether `hint` only admits scalars (configs are then not acceptable)."""
    if hint in _SCALARS:
        return True
    if typing.get_origin(hint) is Literal:
        return True
    if typing.get_origin(hint) in _UNION_ORIGINS:
        args = _strip_required(typing.get_args(hint))
        return args is not None and bool(args) and all(_is_scalar_only(a) for a in args)
    return False


def _is_sequence_like(value: Any) -> bool:
    """Lists, tuples, ranges and other indexable sized iterables (e.g. `PartitionSpec`)."""
    if isinstance(value, (str, bytes, collections.abc.Mapping)):
        return False
    if isinstance(value, (list, tuple, range, collections.abc.Sequence)):
        return True
    return all(hasattr(value, a) for a in ("__len__", "__getitem__", "__iter__"))


def _matches_items(value: Any, hint: Any, origin: Any) -> bool:
    args = typing.get_args(hint)
    if not args:
        return True
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches(v, args[0]) for v in value)
        if args == ((),):  # tuple[()]
            return len(value) == 0
        return len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args))
    return all(matches(v, args[0]) for v in value)


def matches(value: Any, hint: Any) -> bool:
    """Returns whether `value` is acceptable for a field annotated `hint` (see module doc).

    Args:
        value: The value being set.
        hint: The resolved annotation.

    Returns:
        False only when the value is definitely of the wrong type.
    """
    # pylint: disable=too-many-return-statements,too-many-branches
    if value is None or isinstance(value, RequiredFieldValue):
        return True
    if hint is Any or hint is object or isinstance(hint, (typing.TypeVar, str, typing.ForwardRef)):
        return True
    if _is_config(value) and not _is_scalar_only(hint):
        return True
    origin = typing.get_origin(hint)
    if origin in _UNION_ORIGINS:
        args = _strip_required(typing.get_args(hint))
        if args is None or not args:
            return True
        return any(matches(value, a) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in typing.get_args(hint))
    if origin is typing.Annotated:
        return matches(value, typing.get_args(hint)[0])
    if origin is type or hint is type:
        return isinstance(value, type)
    if hint is collections.abc.Callable or origin is collections.abc.Callable:
        return callable(value)
    if hint in _SCALARS:
        return _matches_scalar(value, hint)
    if origin in _SEQUENCE_ORIGINS or hint in _SEQUENCE_ORIGINS:
        if isinstance(value, np.ndarray) and value.ndim == 1:
            return True
        if not _is_sequence_like(value):
            return False
        return _matches_items(value, hint, origin or hint)
    if origin in _COLLECTION_ORIGINS or hint in _COLLECTION_ORIGINS:
        if isinstance(value, (str, bytes)) or not isinstance(value, collections.abc.Iterable):
            return False
        if isinstance(value, collections.abc.Mapping):
            return True
        args = typing.get_args(hint)
        return not args or all(matches(v, args[0]) for v in value)
    if origin in _MAPPING_ORIGINS or hint in _MAPPING_ORIGINS:
        if not isinstance(value, collections.abc.Mapping):
            return False
        args = typing.get_args(hint)
        if len(args) != 2:
            return True
        return all(matches(k, args[0]) and matches(v, args[1]) for k, v in value.items())
    if hint is np.dtype:
        try:
            np.dtype(value)
        except TypeError:
            return False
        return True
    if origin is not None:
        # A generic alias we do not model (e.g. a user generic): check the class only.
        hint = origin
    if not isinstance(hint, type):
        return True
    if isinstance(value, hint):
        return True
    if issubclass(hint, enum.Enum):
        # A member's value stands for the member (e.g. "all_updates" for UpdateType).
        return any(value == m.value and type(value) is type(m.value) for m in hint)
    if getattr(hint, "_is_protocol", False):
        try:
            return isinstance(value, hint)
        except TypeError:  # Not runtime checkable.
            return callable(value)
    # Third-party value types (e.g. array-likes) that register as the class's virtual
    # subclasses pass `isinstance` above; anything else is the wrong type.
    return False


def describe(hint: Any) -> str:
    """Returns a short readable form of an annotation, without `Required` markers.

    Args:
        hint: The annotation.

    Returns:
        E.g. 'Sequence[int] | HybridMeshShape'.
    """
    origin = typing.get_origin(hint)
    if origin in _UNION_ORIGINS:
        args = _strip_required(typing.get_args(hint)) or ()
        # None is accepted for every field, so it is not listed.
        return " | ".join(describe(a) for a in args)
    if origin is Literal:
        return f"Literal{list(typing.get_args(hint))}"
    if origin is not None:
        args = typing.get_args(hint)
        name = getattr(origin, "__name__", str(origin))
        if not args:
            return name
        inner = ", ".join("..." if a is Ellipsis else describe(a) for a in args)
        return f"{name}[{inner}]"
    if hint is type(None):
        return "None"
    if isinstance(hint, type):
        name = hint.__qualname__
        if name.startswith("config_class("):
            name = name[len("config_class(") : -1].rsplit(".", 2)[-2:]
            name = ".".join(name)
        return name
    return str(hint)
