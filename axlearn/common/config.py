"""The config tree: typed, validated, printable configs for every configurable component.

Every component in axlearn is a `Configurable` class with a nested `Config` class. An experiment
is one tree of configs; instantiating the root builds the whole component tree.

Example:

    class Scaler(Configurable):
        @config_class
        class Config(Configurable.Config):
            scale: float = 1.0  # Multiplier applied to inputs.

        def __call__(self, x):
            return x * self.config.scale

    cfg = Scaler.default_config().set(scale=2.0)
    assert cfg.instantiate()(3) == 6.0

Functions and third-party classes get configs too:

    cfg = config_for_function(pow).set(base=2, exp=10)
    assert cfg.instantiate() == 1024

Semantics:
- Assignment is by value: values (including defaults) are deep-copied on assignment, so mutable
  defaults are never shared. Classes, functions and other callables are never copied.
- Values are validated by kind (numbers, strings, configs, containers of those, dataclasses,
  callables, dtypes, ...) and, for fields annotated with a plain scalar type, by type. Values are
  never coerced: an int set on a float field stays an int.
- `debug_string()` prints one `path: repr(value)` line per leaf, sorted by config key.

This module must stay light: it imports neither jax, TensorFlow nor seqio.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import inspect
import re
import threading
import types
import typing
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from typing import Any, Generic, TypeVar, Union

import attr
import numpy as np

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# Errors. All public; their messages are part of the API.
# --------------------------------------------------------------------------------------------


class MissingConfigClassDecoratorError(TypeError):
    """A `ConfigBase` subclass was used without the `@config_class` decorator."""


class InvalidConfigClassError(TypeError):
    """`@config_class` was applied to a class that does not derive from `ConfigBase`."""


class InvalidConfigNameError(ValueError):
    """A config field name is not lower_snake_case."""


class InvalidConfigValueError(TypeError):
    """A value of an unsupported kind, or of the wrong type for its field."""


class NonConfigFieldError(ValueError):
    """A config class defines an attribute that is not an annotated field."""


class UnknownFieldError(AttributeError):
    """A field that the config class does not declare was read or written."""


class RequiredFieldMissingError(ValueError):
    """A config was instantiated while one of its REQUIRED fields was unset."""


# --------------------------------------------------------------------------------------------
# REQUIRED.
# --------------------------------------------------------------------------------------------


class RequiredFieldValue:
    """The type of `REQUIRED`: a falsy sentinel marking a field that must be set."""

    def __deepcopy__(self, memo):
        return self

    def __copy__(self):
        return self

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = RequiredFieldValue()
# Annotation for a field whose default is REQUIRED: `dim: Required[int] = REQUIRED`.
Required = Union[T, RequiredFieldValue, Any]


# --------------------------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------------------------


def is_named_tuple(x: Any) -> bool:
    """Returns whether `x` is an instance of a `collections.namedtuple` / `typing.NamedTuple`."""
    return isinstance(x, tuple) and hasattr(x, "_fields") and hasattr(x, "_asdict")


def is_attrs(x: Any) -> bool:
    """Returns whether `x` is an instance (not a class) of an attrs class."""
    return hasattr(x, "__attrs_attrs__") and not isinstance(x, type)


def similar_names(name: str, candidates: Iterable[str]) -> list[str]:
    """Returns the candidates similar to `name`, most similar first.

    Similarity is the fraction of `name`'s 3-character substrings found in the candidate; only
    candidates above one half are returned, ties broken alphabetically.

    Args:
        name: The (misspelled) name.
        candidates: Valid names.

    Returns:
        The similar candidates, best first.
    """
    grams = [name[i : i + 3] for i in range(len(name) - 2)]
    scored = []
    for key in candidates:
        score = sum(g in key for g in grams) / max(len(grams), 1)
        if score > 0.5:
            scored.append((-score, key))
    return [key for _, key in sorted(scored)]


def _qualified_name(value: Any) -> str:
    """Returns 'module.name' for a class, function or dtype class."""
    return f"{value.__module__}.{value.__name__}"


def _is_named_object(value: Any) -> bool:
    """Whether `value` prints as its qualified name in dumps (classes and functions)."""
    return isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType))


def _dataclass_items(value: Any) -> list[tuple[str, Any]]:
    """Returns the (name, value) pairs of a dataclass instance, in declaration order.

    Fields whose metadata sets `skip_serialization` (or a `repr=False` field) are skipped.
    """
    return [
        (f.name, getattr(value, f.name))
        for f in dataclasses.fields(value)
        if f.repr and not f.metadata.get("skip_serialization", False)
    ]


def _attrs_items(value: Any) -> list[tuple[str, Any]]:
    """Returns the (name, value) pairs of an attrs instance, in declaration order."""
    return [(a.name, getattr(value, a.name)) for a in attr.fields(type(value))]


# --------------------------------------------------------------------------------------------
# Validation.
# --------------------------------------------------------------------------------------------

_FIELD_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")

# (match_fn, validate_fn) pairs registered by `register_validator`.
_validators: list[tuple[Callable[[Any], bool], Callable[[Any], None]]] = []

_LEAF_KINDS = (
    RequiredFieldValue,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.BuiltinMethodType,
    functools.partial,
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    enum.Enum,
    np.dtype,
    np.generic,
    re.Pattern,
)


def validate_config_field_name(name: str) -> None:
    """Raises `InvalidConfigNameError` unless `name` is lower_snake_case.

    Args:
        name: The field name.

    Raises:
        InvalidConfigNameError: If the name is invalid.
    """
    if not _FIELD_NAME_RE.fullmatch(name):
        raise InvalidConfigNameError(f'Invalid config field name "{name}"')


def register_validator(match_fn: Callable[[Any], bool], validate_fn: Callable[[Any], None]):
    """Registers a validator for config values of a kind the config system does not know.

    Args:
        match_fn: Returns True for values that `validate_fn` handles.
        validate_fn: Raises (e.g. `InvalidConfigValueError`) if the value is invalid; a value it
            accepts is a valid config value.
    """
    _validators.append((match_fn, validate_fn))


def validate_config_field_value(value: Any) -> None:
    """Raises `InvalidConfigValueError` if `value` is not a valid config value.

    Valid values: None, REQUIRED, numbers, strings, bytes, enums, dtypes, classes, functions and
    other callables, configs, and lists/tuples/dicts/dataclasses/attrs instances/named tuples of
    valid values. Other kinds can be admitted with `register_validator`.

    Args:
        value: The value to check.

    Raises:
        InvalidConfigValueError: If the value (or one nested in it) is of an unsupported kind.
    """
    for match_fn, validate_fn in _validators:
        if match_fn(value):
            validate_fn(value)
            return
    if value is None or isinstance(value, (ConfigBase,) + _LEAF_KINDS):
        return
    if isinstance(value, (list, tuple, set, frozenset, range)):
        for item in value:
            validate_config_field_value(item)
    elif isinstance(value, dict):
        for item in value.values():
            validate_config_field_value(item)
    elif dataclasses.is_dataclass(value):
        for _, item in _dataclass_items(value):
            validate_config_field_value(item)
    elif is_attrs(value):
        for _, item in _attrs_items(value):
            validate_config_field_value(item)
    elif callable(value):
        return
    else:
        raise InvalidConfigValueError(
            f'Invalid config value type {type(value)} for value "{value}"'
        )


# Scalar annotations we check values against. int values are accepted for float fields.
_SCALAR_CHECKS: dict[Any, tuple[type, ...]] = {
    int: (int, np.integer),
    float: (int, float, np.integer, np.floating),
    str: (str,),
    bool: (bool, np.bool_),
}


@functools.cache
def _field_scalar_types(config_cls: type) -> dict[str, tuple[Any, tuple[type, ...]]]:
    """Maps field name -> (annotation, accepted types) for fields annotated with a plain scalar.

    A field annotated `int`, `float`, `str`, `bool`, or `Optional[...]`/`Required[...]` of one of
    them is checked; any other annotation (or one that cannot be resolved) is not.
    """
    try:
        hints = typing.get_type_hints(config_cls)
    except Exception:  # pylint: disable=broad-except
        return {}
    result = {}
    for field in attr.fields(config_cls):
        hint = hints.get(field.name)
        is_union = typing.get_origin(hint) in (Union, types.UnionType)
        args = typing.get_args(hint) if is_union else (hint,)
        if Any in args:  # Required[T] without a scalar T, or deliberately loose.
            args = tuple(a for a in args if a is not Any)
            if len(args) != 2 or RequiredFieldValue not in args:
                continue
        scalars = [a for a in args if a not in (type(None), RequiredFieldValue)]
        if len(scalars) == 1 and scalars[0] in _SCALAR_CHECKS:
            result[field.name] = (scalars[0], _SCALAR_CHECKS[scalars[0]])
    return result


def _check_field_type(instance: ConfigBase, name: str, value: Any) -> None:
    if value is None or isinstance(value, RequiredFieldValue):
        return
    checked = _field_scalar_types(type(instance)).get(name)
    if checked is None:
        return
    annotation, accepted = checked
    bad = not isinstance(value, accepted)
    if annotation in (int, float) and isinstance(value, (bool, np.bool_)):
        bad = True
    if bad:
        raise InvalidConfigValueError(
            f"{type(instance).__name__}.{name} expects {annotation.__name__}, "
            f"got {type(value).__name__}: {value!r}"
        )


def _validate_and_transform_field(instance: ConfigBase, attribute: attr.Attribute, value: Any):
    """attrs on_setattr hook: validates a field value and returns the copy to store."""
    validate_config_field_name(attribute.name)
    validate_config_field_value(value)
    _check_field_type(instance, attribute.name, value)
    return _copy_value(value)


def _copy_value(value: Any) -> Any:
    """Deep-copies `value`, except classes, functions and other callables (kept by reference)."""
    if value is None or isinstance(value, (str, int, float, bool, RequiredFieldValue)):
        return value
    if isinstance(value, ConfigBase):
        return copy.deepcopy(value)
    if isinstance(value, list):
        return [_copy_value(v) for v in value]
    if is_named_tuple(value):
        return type(value)(*[_copy_value(v) for v in value])
    if isinstance(value, tuple):
        return tuple(_copy_value(v) for v in value)
    if type(value) is dict:  # pylint: disable=unidiomatic-typecheck
        return {k: _copy_value(v) for k, v in value.items()}
    if _is_named_object(value) or (callable(value) and not dataclasses.is_dataclass(value)):
        return value
    return copy.deepcopy(value)


# --------------------------------------------------------------------------------------------
# Instantiation path, for error messages that name the full path of a missing field.
# --------------------------------------------------------------------------------------------

_scope = threading.local()


@contextlib.contextmanager
def instantiation_scope(name: str):
    """Context in which configs are instantiated as the child `name` of the current scope.

    `Module._add_child` and other tree builders wrap child instantiation in this so that a
    missing REQUIRED field is reported with its full dotted path (e.g. `model.decoder.dim`).

    Args:
        name: The child's name.

    Yields:
        None.
    """
    stack = _scope.__dict__.setdefault("stack", [])
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def _current_scope() -> list[str]:
    return list(_scope.__dict__.get("stack", []))


def _missing_required_fields(cfg: ConfigBase) -> list[str]:
    return [k for k, v in cfg.items() if isinstance(v, RequiredFieldValue)]


def _validate_required_fields(cfg: ConfigBase) -> None:
    """Raises `RequiredFieldMissingError` naming every REQUIRED field of `cfg` still unset."""
    missing = _missing_required_fields(cfg)
    if not missing:
        return
    prefix = ".".join(_current_scope())
    paths = [f"{prefix}.{k}" if prefix else k for k in missing]
    target = getattr(cfg, "klass", None) or getattr(cfg, "fn", None)
    what = _qualified_name(target) if _is_named_object(target) else type(cfg).__name__
    raise RequiredFieldMissingError(
        f"Missing value for required field(s) when instantiating {what}: {', '.join(paths)}"
    )


# --------------------------------------------------------------------------------------------
# ConfigBase.
# --------------------------------------------------------------------------------------------


class ConfigBase:
    """The base class of config classes. Subclasses must be decorated with `@config_class`."""

    def __init__(self, *args, **kwargs):
        self.__attrs_init__(*args, **kwargs)

    def __attrs_init__(self, *args, **kwargs):
        raise MissingConfigClassDecoratorError(f"{type(self)} was not decorated with @config_class")

    def __attrs_post_init__(self):
        # Run every field (including defaults) through validation and copying.
        for field in attr.fields(type(self)):
            setattr(self, field.name, getattr(self, field.name))

    def __contains__(self, name: str) -> bool:
        return name in attr.fields_dict(type(self))

    def __len__(self) -> int:
        return len(attr.fields(type(self)))

    def keys(self) -> list[str]:
        """Returns the field names, sorted."""
        return sorted(attr.fields_dict(type(self)))

    def items(self) -> list[tuple[str, Any]]:
        """Returns (name, value) pairs sorted by name."""
        return [(k, getattr(self, k)) for k in self.keys()]

    def set(self, **kwargs):
        """Sets fields from keyword arguments and returns self, for chaining.

        Args:
            **kwargs: Field values.

        Returns:
            self.

        Raises:
            UnknownFieldError: If a keyword is not a field.
        """
        for k, v in kwargs.items():
            setattr(self, k, v)
        return self

    def clone(self, **kwargs):
        """Returns a copy of this config with the given fields overridden (self is unchanged).

        Args:
            **kwargs: Field values for the copy.

        Returns:
            The new config.
        """
        return copy.deepcopy(self).set(**kwargs)

    def __deepcopy__(self, memo):
        new = object.__new__(type(self))
        for field in attr.fields(type(self)):
            object.__setattr__(new, field.name, _copy_value(getattr(self, field.name)))
        return new

    def __copy__(self):
        return self.__deepcopy__({})

    def __eq__(self, other: Any) -> bool:
        if type(self) is not type(other):  # pylint: disable=unidiomatic-typecheck
            return False
        return all(getattr(self, k) == getattr(other, k) for k in self.keys())

    def __ne__(self, other: Any) -> bool:
        return not self == other

    __hash__ = None  # Configs are mutable.

    def _key_error_string(self, name: str) -> str:
        similar = similar_names(name, self.keys())
        if similar:
            return f"{name} (did you mean: [{', '.join(similar)}])"
        return f"{name} (keys are {self.keys()})"

    def visit(
        self,
        visit_fn: Callable[[str, Any], None],
        enter_fn: Callable[[str, Any, list | None], list | None] | None = None,
        exit_fn: Callable[[str, Any], None] | None = None,
    ) -> None:
        """Walks the config tree depth-first.

        Configs, lists, tuples, ranges, dicts, dataclasses, attrs instances and named tuples are
        entered; everything else is a leaf passed to `visit_fn`. Child keys are `key.field` for
        configs, `key[i]` for sequences and `key[repr(k)]` for dicts and record-like values.

        Args:
            visit_fn: Called with (path, value) for every leaf.
            enter_fn: Optional; called with (path, value, default_children) for every value and
                returns the (subpath, subvalue) list to descend into, or None to treat the value
                as a leaf. Defaults to the default children.
            exit_fn: Optional; called with (path, value) after an entered value's children.
        """
        enter_fn = enter_fn or (lambda key, val, children: children)

        def walk(key: str, val: Any):
            children = enter_fn(key, val, _default_children(key, val))
            if children is None:
                visit_fn(key, val)
                return
            for sub_key, sub_val in children:
                walk(sub_key, sub_val)
            if exit_fn is not None:
                exit_fn(key, val)

        walk("", self)

    def to_flat_dict(self, *, omit_default_values: Collection[Any] = (None, REQUIRED)) -> dict:
        """Returns {path: leaf value} for every leaf of the tree, config keys sorted.

        Args:
            omit_default_values: A field is omitted when its value is its default and that
                default is one of these (by default: None and REQUIRED). An explicit value that
                differs from a non-omitted default is always kept.

        Returns:
            The flat dict, in dump order.
        """
        result: dict[str, Any] = {}
        self._flatten_into("", result, omit_default_values)
        return result

    def _flatten_into(self, prefix: str, result: dict, omit: Collection[Any]) -> None:
        for field in sorted(attr.fields(type(self)), key=lambda f: f.name):
            val = getattr(self, field.name)
            default = field.default
            if val is default or (default is None and val is None):
                if any(default is o for o in omit):
                    continue
            key = f"{prefix}.{field.name}" if prefix else field.name
            _flatten_value(key, val, result, omit)

    def to_dict(self) -> dict[str, Any]:
        """Returns the tree as nested dicts/lists; classes and functions become 'module.name'."""
        return {k: _to_plain(v) for k, v in self.items()}

    def debug_string(
        self,
        *,
        kv_separator: str = ": ",
        field_separator: str = "\n",
        omit_default_values: Collection[Any] = (None, REQUIRED),
    ) -> str:
        """Returns the dump: one `path: repr(value)` line per leaf, config keys sorted.

        Classes and functions print as the quoted string 'module.name'.

        Args:
            kv_separator: Between path and value.
            field_separator: Between entries.
            omit_default_values: See `to_flat_dict`.

        Returns:
            The dump text (no trailing newline).
        """
        flat = self.to_flat_dict(omit_default_values=omit_default_values)
        return field_separator.join(f"{k}{kv_separator}{_leaf_repr(v)}" for k, v in flat.items())

    def __str__(self) -> str:
        return self.debug_string()

    def __repr__(self) -> str:
        return self.debug_string(kv_separator=":", field_separator="; ")


def _default_children(key: str, val: Any) -> list | None:
    """The (subkey, subvalue) pairs `visit` descends into by default, or None for a leaf."""
    if isinstance(val, ConfigBase):
        return [(f"{key}.{k}" if key else k, v) for k, v in val.items()]
    if isinstance(val, dict):
        return [(f"{key}[{k!r}]", v) for k, v in val.items()]
    if dataclasses.is_dataclass(val) and not isinstance(val, type):
        return [(f"{key}[{k!r}]", v) for k, v in _dataclass_items(val)]
    if is_attrs(val):
        return [(f"{key}[{k!r}]", v) for k, v in _attrs_items(val)]
    if is_named_tuple(val):
        return [(f"{key}[{k!r}]", v) for k, v in val._asdict().items()]
    if isinstance(val, (list, tuple, range)):
        return [(f"{key}[{i}]", v) for i, v in enumerate(val)]
    return None


def _flatten_value(key: str, val: Any, result: dict, omit: Collection[Any]) -> None:
    """Adds the leaves under `val` at `key` to `result` (iterative over containers)."""
    if isinstance(val, ConfigBase):
        val._flatten_into(key, result, omit)  # pylint: disable=protected-access
        return
    children = _default_children(key, val)
    if children is None:
        result[key] = val
        return
    for sub_key, sub_val in children:
        _flatten_value(sub_key, sub_val, result, omit)


def _leaf_repr(val: Any) -> str:
    if _is_named_object(val):
        return repr(_qualified_name(val))
    return repr(val)


def _to_plain(val: Any) -> Any:
    if isinstance(val, ConfigBase):
        return val.to_dict()
    if isinstance(val, defaultdict):
        return {k: _to_plain(v) for k, v in val.items()}
    if isinstance(val, dict):
        return type(val)({k: _to_plain(v) for k, v in val.items()})
    if dataclasses.is_dataclass(val) and not isinstance(val, type):
        return {k: _to_plain(v) for k, v in _dataclass_items(val)}
    if is_attrs(val):
        return {k: _to_plain(v) for k, v in _attrs_items(val)}
    if is_named_tuple(val):
        return {k: _to_plain(v) for k, v in val._asdict().items()}
    if isinstance(val, (list, tuple)):
        return type(val)(_to_plain(v) for v in val)
    if isinstance(val, range):
        return [_to_plain(v) for v in val]
    if _is_named_object(val):
        return _qualified_name(val)
    return val


# --------------------------------------------------------------------------------------------
# @config_class.
# --------------------------------------------------------------------------------------------


def _attrs_kwargs() -> dict:
    return dict(
        init=False, kw_only=True, slots=True, repr=False, on_setattr=_validate_and_transform_field
    )


def _install_accessors(attr_cls: type, *, name: str | None = None) -> type:
    """Makes unknown field access raise `UnknownFieldError` with suggestions; names the class."""
    fields = attr.fields_dict(attr_cls)
    base_setattr = attr_cls.__setattr__

    def __setattr__(self, key: str, value: Any):
        if key not in fields:
            raise UnknownFieldError(f"{type(self).__name__}: {self._key_error_string(key)}")
        base_setattr(self, key, value)

    def __getattr__(self, key: str) -> Any:
        # Only called when normal lookup fails: the key is not a field or method.
        if key.startswith("__"):
            raise AttributeError(key)
        raise UnknownFieldError(f"{type(self).__name__}: {self._key_error_string(key)}")

    attr_cls.__setattr__ = __setattr__
    attr_cls.__getattr__ = __getattr__
    name = name or f"config_class({attr_cls.__module__}.{attr_cls.__qualname__})"
    attr_cls.__name__ = name
    attr_cls.__qualname__ = name
    return attr_cls


def _check_no_plain_attributes(cls: type) -> None:
    """Raises `NonConfigFieldError` for a class attribute that is neither a field nor a method."""
    annotations = cls.__dict__.get("__annotations__", {})
    for key, value in cls.__dict__.items():
        if key.startswith("__") or key in annotations:
            continue
        if isinstance(value, (types.FunctionType, classmethod, staticmethod, property)):
            continue
        raise NonConfigFieldError(
            f"Non-config attribute is not supported: {cls.__module__}.{cls.__qualname__}.{key} "
            f"(annotate it to make it a config field)"
        )


def config_class(cls: type[T], **kwargs) -> type[T]:
    """Class decorator that turns a `ConfigBase` subclass into a config class (via attrs).

    Every field must be annotated; unannotated class attributes other than methods are errors.

    Args:
        cls: The class, a subclass of `ConfigBase`.
        **kwargs: Extra keyword arguments for `attr.define`.

    Returns:
        The config class.

    Raises:
        InvalidConfigClassError: If `cls` does not derive from `ConfigBase`.
        NonConfigFieldError: If `cls` defines a non-field, non-method attribute.
        InvalidConfigNameError: If a field name is not lower_snake_case.
    """
    if not (isinstance(cls, type) and issubclass(cls, ConfigBase)):
        raise InvalidConfigClassError(f"A config class must be a subclass of ConfigBase: {cls}")
    _check_no_plain_attributes(cls)
    for name in cls.__dict__.get("__annotations__", {}):
        validate_config_field_name(name)
    attr_cls = attr.define(maybe_cls=cls, **_attrs_kwargs(), **kwargs)
    return _install_accessors(attr_cls)


# --------------------------------------------------------------------------------------------
# Instantiable configs.
# --------------------------------------------------------------------------------------------


class InstantiableConfig(Generic[T], ConfigBase):
    """A config that builds an object with `instantiate()`."""

    def instantiate(self, **kwargs) -> T:
        """Builds the configured object.

        Args:
            **kwargs: Extra arguments for the constructor or function.

        Returns:
            The object.
        """
        raise NotImplementedError(type(self))


ConfigOr = Union[T, InstantiableConfig]


def maybe_instantiate(x: ConfigOr[T]) -> T:
    """Instantiates `x` if it is an `InstantiableConfig`, else returns it unchanged.

    Args:
        x: A config or a plain value.

    Returns:
        The instantiated object, or `x`.
    """
    if isinstance(x, InstantiableConfig):
        return x.instantiate()
    return x


C = TypeVar("C", bound="Configurable")


class Configurable:
    """Base class of objects built from a config: `cls.default_config().set(...).instantiate()`.

    Subclasses declare their settings as fields of a nested `@config_class class Config` that
    derives from the parent's `Config`. Shared non-config objects (a lock, a parent module) are
    passed as keyword arguments to `instantiate()`.
    """

    @config_class
    class Config(InstantiableConfig[C]):
        """Base config of a `Configurable`."""

        # The class to build; set by `default_config()`.
        klass: type

        def instantiate(self, **kwargs) -> C:
            """Builds `self.klass(self, **kwargs)` after checking REQUIRED fields.

            Args:
                **kwargs: Extra constructor arguments.

            Returns:
                The built object.

            Raises:
                RequiredFieldMissingError: Naming the full path of each unset REQUIRED field.
            """
            _validate_required_fields(self)
            return self.klass(self, **kwargs)

    @classmethod
    def default_config(cls: type[C]) -> Config:
        """Returns the default config of this class, with `klass` set to it.

        Returns:
            The config.
        """
        return cls.Config(klass=cls)

    def __init__(self, cfg: Configurable.Config):
        # Keep a private copy so later changes to `cfg` do not affect this object.
        self._config = copy.deepcopy(cfg)

    @property
    def config(self) -> Configurable.Config:
        """A copy of this object's config."""
        return copy.deepcopy(self._config)

    def __repr__(self) -> str:
        return repr(self._config)


def _field_for_parameter(param: inspect.Parameter):
    default = REQUIRED if param.default is inspect.Parameter.empty else param.default
    return attr.field(default=default)


def _call_args(kwargs: dict, *, sig: inspect.Signature, cfg: ConfigBase) -> list:
    """Moves the config's values into `kwargs` (and returns *args) according to `sig`."""
    args: list = []

    def put(name, value):
        if name in kwargs:
            raise ValueError(f"{name} is already specified: {value} vs. {kwargs[name]}")
        kwargs[name] = value

    params = [(n, p) for n, p in sig.parameters.items() if n != "self"]
    has_var_positional = any(p.kind == inspect.Parameter.VAR_POSITIONAL for _, p in params)
    for name, param in params:
        value = getattr(cfg, name)
        if has_var_positional and param.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            # Parameters before *args must be passed positionally.
            args.append(value)
        elif param.kind == inspect.Parameter.VAR_POSITIONAL:
            args.extend(value)
        elif param.kind == inspect.Parameter.VAR_KEYWORD:
            for k, v in value.items():
                put(k, v)
        elif param.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        ):
            put(name, value)
        else:
            raise NotImplementedError(f"Unsupported parameter kind {param.kind}: {name}")
    return args


@config_class
class FunctionConfigBase(InstantiableConfig[T]):
    """Base of configs made by `config_for_function`; `instantiate()` calls `fn`."""

    # The function to call.
    fn: Callable

    def instantiate(self, **kwargs) -> T:
        """Calls `fn` with the config's fields (plus `kwargs`) as arguments.

        Args:
            **kwargs: Extra arguments for `fn`.

        Returns:
            `fn`'s return value.
        """
        _validate_required_fields(self)
        args = _call_args(kwargs, sig=inspect.signature(self.fn), cfg=self)
        return self.fn(*args, **kwargs)


@config_class
class ClassConfigBase(InstantiableConfig[T]):
    """Base of configs made by `config_for_class`; `instantiate()` constructs `klass`."""

    # The class to construct.
    klass: type

    def instantiate(self, **kwargs) -> T:
        """Constructs `klass` with the config's fields (plus `kwargs`) as arguments.

        Args:
            **kwargs: Extra constructor arguments.

        Returns:
            The constructed object.
        """
        _validate_required_fields(self)
        args = _call_args(kwargs, sig=inspect.signature(self.klass.__init__), cfg=self)
        return self.klass(*args, **kwargs)


def _signature_fields(sig: inspect.Signature) -> dict:
    fields = {}
    for name, param in sig.parameters.items():
        if name == "self":
            continue
        validate_config_field_name(name)
        fields[name] = _field_for_parameter(param)
    return fields


@functools.cache
def _function_config_class(fn: Callable) -> type:
    attrs_cls = attr.make_class(
        "FunctionConfig",
        _signature_fields(inspect.signature(fn)),
        bases=(FunctionConfigBase,),
        **_attrs_kwargs(),
    )
    return _install_accessors(
        attrs_cls, name=f"config_for_function({fn.__module__}.{fn.__qualname__})"
    )


@functools.cache
def _class_config_class(cls: type) -> type:
    attrs_cls = attr.make_class(
        "ClassConfig",
        _signature_fields(inspect.signature(cls.__init__)),
        bases=(ClassConfigBase,),
        **_attrs_kwargs(),
    )
    return _install_accessors(
        attrs_cls, name=f"config_for_class({cls.__module__}.{cls.__qualname__})"
    )


def _cached_or_new(factory, target):
    try:
        return factory(target)
    except TypeError:  # Unhashable target.
        return factory.__wrapped__(target)


def config_for_function(fn: Callable[..., T]) -> Any:
    """Returns a config with one field per parameter of `fn`, plus `fn`.

    Parameters without defaults are REQUIRED. `instantiate()` calls `fn(**fields)`.

    Args:
        fn: The function.

    Returns:
        A `FunctionConfigBase` instance.
    """
    return _cached_or_new(_function_config_class, fn)(fn=fn)


def config_for_class(cls: type[T]) -> Any:
    """Returns a config with one field per `__init__` parameter of `cls`, plus `klass`.

    Parameters without defaults are REQUIRED. `instantiate()` constructs `cls(**fields)`.

    Args:
        cls: The class.

    Returns:
        A `ClassConfigBase` instance.
    """
    return _cached_or_new(_class_config_class, cls)(klass=cls)


def maybe_set_config(cfg: ConfigBase, key: str = None, value: Any = None, **kwargs) -> ConfigBase:
    """Sets fields of `cfg` that exist, ignoring those it lacks.

    Call as `maybe_set_config(cfg, "key", value)` or `maybe_set_config(cfg, key=value, ...)`.

    Args:
        cfg: The config.
        key: A field name (optional).
        value: Its value.
        **kwargs: More field values.

    Returns:
        `cfg`.
    """
    if key is not None:
        kwargs = {key: value, **kwargs}
    for k, v in kwargs.items():
        if k in cfg:
            setattr(cfg, k, v)
    return cfg


def _split_path(path: Union[str, list[str]]) -> list[str]:
    if isinstance(path, str):
        return [p for p in path.split(".") if p] if path else []
    return list(path)


def get_recursively(value: Any, path: Union[str, list[str]]) -> Any:
    """Returns the value at `path` ('a.b.c' or ['a', 'b', 'c']) in a tree of configs/dicts.

    Args:
        value: The root.
        path: The path; empty returns the root.

    Returns:
        The value at `path`.

    Raises:
        UnknownFieldError or KeyError: If a key on the path does not exist.
    """
    for key in _split_path(path):
        value = value[key] if isinstance(value, dict) else getattr(value, key)
    return value


def set_recursively(value: Any, *, path: Union[str, list[str]], new_value: Any) -> None:
    """Sets the value at `path` in a tree of configs/dicts.

    Args:
        value: The root.
        path: Non-empty path ('a.b.c' or a list of keys).
        new_value: The value to set.

    Raises:
        ValueError: If `path` is empty.
    """
    keys = _split_path(path)
    if not keys:
        raise ValueError("path must not be empty")
    parent = get_recursively(value, keys[:-1])
    if isinstance(parent, dict):
        parent[keys[-1]] = new_value
    else:
        setattr(parent, keys[-1], new_value)


# --------------------------------------------------------------------------------------------
# Config modifiers.
# --------------------------------------------------------------------------------------------


class ConfigModifier(Configurable):
    """A configurable that takes a config and returns a modified one (e.g. for mesh rules)."""

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        """Returns the modified config (may modify `cfg` in place).

        Args:
            cfg: The config to modify.

        Returns:
            The modified config.
        """
        raise NotImplementedError(type(self))


class ChainConfigModifier(ConfigModifier):
    """Applies a sequence of config modifiers in order."""

    @config_class
    class Config(ConfigModifier.Config):
        """Configures ChainConfigModifier."""

        # The modifiers to apply, in order.
        config_modifiers: Required[list[ConfigOr[ConfigModifier]]] = REQUIRED

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self._modifiers = [maybe_instantiate(m) for m in self._config.config_modifiers]

    def __call__(self, cfg: ConfigBase) -> ConfigBase:
        for modifier in self._modifiers:
            cfg = modifier(cfg)
        return cfg
