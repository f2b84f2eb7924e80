"""ConfigBase, @config_class, value validation and the dump (debug_string)."""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import re
import types
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Optional, TypeVar

import attr
import numpy as np

from axlearn.common.config import typecheck
from axlearn.common.config.errors import (
    REQUIRED,
    InvalidConfigClassError,
    InvalidConfigNameError,
    InvalidConfigValueError,
    MissingConfigClassDecoratorError,
    NonConfigFieldError,
    RequiredFieldValue,
    UnknownFieldError,
)

T = TypeVar("T")

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


def _function_name_of_policy(value: Any) -> Optional[str]:
    """The function name a JAX remat policy object had before it became one, or None.

    Newer JAX makes `checkpoint_policies.dots_saveable` (and the no-batch-dims variant) instances
    of a dataclass `DotsSaveable`; older JAX (and AXLearn's golden dumps) have functions. Dumps
    name them as the functions, so a config's dump does not depend on the JAX version.
    """
    cls = type(value)
    if cls.__name__ != "DotsSaveable" or cls.__module__ != "jax._src.ad_checkpoint":
        return None
    if getattr(value, "only_if_no_batch_dims", False):
        return "jax._src.ad_checkpoint.dot_with_no_batch_dims_saveable"
    return "jax._src.ad_checkpoint.dots_saveable"


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
    """Registers a config value validator (AXLearn: `register_validator(match_fn=, validate_fn=)`).

    On every `set` (and again on `instantiate`), each registered validator whose `match_fn`
    accepts the value runs, in registration order. A value matched by some validator is a valid
    config value even if it is of a kind the config system does not know (e.g. a custom class);
    values of known kinds are still checked as usual.

    Args:
        match_fn: Returns True for values that `validate_fn` handles.
        validate_fn: Raises (e.g. `InvalidConfigValueError`) if the value is invalid.
    """
    _validators.append((match_fn, validate_fn))


def _type_is(value: Any, module_prefix: str, names: tuple[str, ...]) -> bool:
    """Whether `type(value)` (or a base) is named one of `names` in a module under the prefix.

    Lets the config system recognize JAX types without importing JAX.
    """
    for klass in type(value).__mro__:
        if klass.__name__ in names and klass.__module__.split(".")[0] == module_prefix:
            return True
    return False


def is_partition_spec(value: Any) -> bool:
    """Whether `value` is a `jax.sharding.PartitionSpec` (checked without importing JAX)."""
    return _type_is(value, "jax", ("PartitionSpec", "P"))


def _is_array(value: Any) -> bool:
    """Whether `value` is a NumPy or JAX array (a tensor-valued config field)."""
    return isinstance(value, np.ndarray) or (
        _type_is(value, "jax", ("Array", "ArrayImpl")) or _type_is(value, "jaxlib", ("ArrayImpl",))
    )


def _is_hf_like(value: Any) -> bool:
    """Whether `value` is an instance of a Hugging Face-style class (has `from_pretrained`).

    Such an object is a valid config value when its `to_dict()` is (as in AXLearn).
    """
    return not isinstance(value, type) and hasattr(value, "from_pretrained")


def validate_config_field_value(value: Any) -> None:
    """Raises `InvalidConfigValueError` if `value` is not a valid config value.

    Valid values: None, REQUIRED, numbers, strings, bytes, enums, dtypes, classes, functions and
    other callables, configs, `jax.sharding.PartitionSpec`s, NumPy/JAX arrays,
    lists/tuples/dicts/dataclasses/attrs instances/named tuples of valid values, and objects with
    a `from_pretrained` attribute (Hugging Face configs) whose `to_dict()` is valid. Every validator
    registered with `register_validator` whose match_fn accepts the value also runs; other kinds
    are admitted by registering one.

    Args:
        value: The value to check.

    Raises:
        InvalidConfigValueError: If the value (or one nested in it) is of an unsupported kind.
    """
    matched = False
    for match_fn, validate_fn in list(_validators):
        if match_fn(value):
            matched = True
            validate_fn(value)
    if value is None or isinstance(value, (ConfigBase,) + _LEAF_KINDS):
        return
    if is_partition_spec(value):
        for item in value:
            validate_config_field_value(item)
        return
    if _is_array(value):
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
    elif _is_hf_like(value):
        validate_config_field_value(value.to_dict())
    elif callable(value) or matched:
        return
    else:
        raise InvalidConfigValueError(
            f'Invalid config value type {type(value)} for value "{value}". '
            f"Consider registering a custom validator with `{register_validator.__name__}`."
        )


def _check_field_type(instance: ConfigBase, name: str, value: Any) -> None:
    """Raises `InvalidConfigValueError` if `value` does not fit the field's annotation.

    Configs of functions and third-party classes (`config_for_function`/`config_for_class`)
    carry their parameters' annotations as field types but are not checked against them.
    """
    if value is None or isinstance(value, RequiredFieldValue):
        return
    if not getattr(type(instance), "__config_typecheck__", True):
        return
    hint = typecheck.field_hints(type(instance)).get(name)
    if hint is None or typecheck.matches(value, hint):
        return
    raise InvalidConfigValueError(
        f"{type(instance).__name__}.{name} expects {typecheck.describe(hint)}, "
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
# ConfigBase.
# --------------------------------------------------------------------------------------------


class ConfigBase(typecheck.ConfigMarker):
    """The base class of config classes. Subclasses must be decorated with `@config_class`."""

    def __init__(self, *args, **kwargs):
        self.__attrs_init__(*args, **kwargs)
        # Catches plain attributes added to the class after decoration (`Cfg.x = 1`).
        _check_no_plain_attributes(type(self), inherited=True)

    def __attrs_init__(self, *args, **kwargs):
        raise MissingConfigClassDecoratorError(f"{type(self)} was not decorated with @config_class")

    def __getattr__(self, name: str) -> Any:
        # Called only when normal lookup fails. Raises KeyError for a name that is not a field
        # (AXLearn's contract, which a config class overriding `__getattr__` may rely on via
        # `super().__getattr__`); `@config_class` turns that into `UnknownFieldError`.
        if name.startswith("__"):
            raise AttributeError(name)
        fields = attr.fields_dict(type(self)) if attr.has(type(self)) else {}
        if name in fields:
            return fields[name]
        raise KeyError(name)

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

    def get_recursively(self, path: Sequence[str]) -> Any:
        """Returns the value at `path`, a sequence of field names (AXLearn's method form).

        Args:
            path: E.g. ["model", "decoder", "dim"]; empty returns self.

        Returns:
            The value.

        Raises:
            UnknownFieldError: If a name on the path is not a field.
        """
        current = self
        for key in path:
            current = getattr(current, key)
        return current

    def set_recursively(self, path: Sequence[str], *, value: Any) -> None:
        """Sets the field at `path` (a sequence of field names) to `value`.

        Args:
            path: A non-empty sequence of field names.
            value: The new value (validated like `set`).

        Raises:
            ValueError: If `path` is empty.
            UnknownFieldError: If a name on the path is not a field.
        """
        if not path:
            raise ValueError("Path is empty.")
        setattr(self.get_recursively(path[:-1]), path[-1], value)

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
    children = None if _function_name_of_policy(val) else _default_children(key, val)
    if children is None:
        result[key] = val
        return
    if dataclasses.is_dataclass(val) and not isinstance(val, type):
        # As for config fields: a dataclass field still at a default that is one of `omit`
        # (e.g. None) is left out.
        defaults = {f"{key}[{f.name!r}]": f.default for f in dataclasses.fields(val)}
        children = [
            (k, v)
            for k, v in children
            if not (v is defaults[k] and any(defaults[k] is o for o in omit))
        ]
    for sub_key, sub_val in children:
        _flatten_value(sub_key, sub_val, result, omit)


def _leaf_repr(val: Any) -> str:
    if _is_named_object(val):
        return repr(_qualified_name(val))
    if _function_name_of_policy(val):
        return repr(_function_name_of_policy(val))
    if is_partition_spec(val):
        # Stable across JAX versions (newer JAX reprs it as P(...)); AXLearn dumps this form
        # (a tuple's repr: one entry keeps its trailing comma).
        entries = ", ".join(repr(a) for a in val)
        return f"PartitionSpec({entries},)" if len(val) == 1 else f"PartitionSpec({entries})"
    if _is_array(val):
        return " ".join(repr(np.asarray(val)).split())
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
    """Makes unknown field access raise `UnknownFieldError` with suggestions; names the class.

    A `__getattr__` the class defines (or inherits) is kept: it is called first, and only a
    KeyError it raises (the `ConfigBase.__getattr__` contract for unknown names) becomes
    `UnknownFieldError`.
    """
    fields = attr.fields_dict(attr_cls)
    base_setattr = attr_cls.__setattr__
    inner_getattr = attr_cls.__getattr__
    # Do not stack wrappers when a decorated config class is subclassed.
    inner_getattr = getattr(inner_getattr, "__config_inner__", inner_getattr)

    def __setattr__(self, key: str, value: Any):
        if key not in fields:
            raise UnknownFieldError(f"{type(self).__name__}: {self._key_error_string(key)}")
        base_setattr(self, key, value)

    def __getattr__(self, key: str) -> Any:
        # Only called when normal lookup fails: the key is not a field or method.
        if key.startswith("__"):
            raise AttributeError(key)
        try:
            return inner_getattr(self, key)
        except KeyError as e:
            raise UnknownFieldError(f"{type(self).__name__}: {self._key_error_string(key)}") from e

    __getattr__.__config_inner__ = inner_getattr
    attr_cls.__setattr__ = __setattr__
    attr_cls.__getattr__ = __getattr__
    name = name or f"config_class({attr_cls.__module__}.{attr_cls.__qualname__})"
    attr_cls.__name__ = name
    attr_cls.__qualname__ = name
    return attr_cls


def _is_method_of_class_body(value: Any, key: str) -> bool:
    """Whether `value` is a function defined by a class body under the name `key`.

    A function defined elsewhere and assigned to a class attribute (`foo = some_function`,
    `foo = lambda self: ...`) is not: it would silently shadow a config field.
    """
    if isinstance(value, (classmethod, staticmethod)):
        value = value.__func__
    if isinstance(value, property):
        return True
    if not isinstance(value, types.FunctionType):
        return False
    parts = value.__qualname__.split(".")
    return len(parts) >= 2 and parts[-1] == key and parts[-2] != "<locals>"


# Names a config class may carry besides fields and methods (set by attrs, typing or us).
_ALLOWED_CLASS_ATTRIBUTES = frozenset({"_abc_impl", "_is_protocol"})


def _check_no_plain_attributes(cls: type, *, inherited: bool = False) -> None:
    """Raises `NonConfigFieldError` for a class attribute that is neither a field nor a method.

    Args:
        cls: The config class.
        inherited: Also check the classes `cls` derives from (below `ConfigBase`); used on
            instantiation to catch attributes assigned to a class after decoration.

    Raises:
        NonConfigFieldError: Naming the attribute.
    """
    klasses = cls.__mro__ if inherited else (cls,)
    field_names = set(attr.fields_dict(cls)) if attr.has(cls) else set()
    for klass in klasses:
        if klass is ConfigBase or not issubclass(klass, ConfigBase):
            continue
        annotations = klass.__dict__.get("__annotations__", {})
        for key, value in klass.__dict__.items():
            if key.startswith("__") or key in _ALLOWED_CLASS_ATTRIBUTES:
                continue
            if key in annotations or (inherited and key in field_names):
                continue
            if _is_method_of_class_body(value, key):
                continue
            # A decorated class is already named `config_class(module.qualname)`.
            where = klass.__qualname__
            if not where.startswith("config_"):
                where = f"{klass.__module__}.{where}"
            raise NonConfigFieldError(
                f"Non-config attribute is not supported: {where}.{key} "
                f"(annotate it, `{key}: <type> = ...`, to make it a config field)"
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
