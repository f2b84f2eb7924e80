"""Instantiable configs: Configurable, config_for_function/class, and tree helpers."""

import contextlib
import copy
import functools
import inspect
import threading
from collections.abc import Callable, Collection
from typing import Any, Generic, Protocol, TypeVar, Union

import attr

from axlearn.common.config.base import (
    ConfigBase,
    _attrs_kwargs,
    _install_accessors,
    _is_named_object,
    _qualified_name,
    config_class,
    validate_config_field_name,
    validate_config_field_value,
)
from axlearn.common.config.errors import (
    REQUIRED,
    RequiredFieldMissingError,
    RequiredFieldValue,
)

T = TypeVar("T")

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


def _missing_required_fields(cfg: ConfigBase, provided: Collection[str] = ()) -> list[str]:
    # attr.fields, not cfg.items(): a field may be named `items`.
    names = sorted(f.name for f in attr.fields(type(cfg)))
    return [
        k for k in names if isinstance(getattr(cfg, k), RequiredFieldValue) and k not in provided
    ]


def _validate_required_fields(cfg: ConfigBase, provided: Collection[str] = ()) -> None:
    """Re-validates `cfg`'s field values and checks that no REQUIRED field is unset.

    Values are validated again (registered validators included) because a value can be mutated
    in place after `set` (e.g. a list appended to).

    Args:
        cfg: The config.
        provided: Names of fields supplied as `instantiate(**kwargs)` instead.

    Raises:
        RequiredFieldMissingError: Naming every REQUIRED field of `cfg` still unset.
        InvalidConfigValueError: If a value no longer validates.
    """
    for field in attr.fields(type(cfg)):
        validate_config_field_value(getattr(cfg, field.name))
    missing = _missing_required_fields(cfg, provided)
    if not missing:
        return
    prefix = ".".join(_current_scope())
    paths = [f"{prefix}.{k}" if prefix else k for k in missing]
    target = getattr(cfg, "klass", None) or getattr(cfg, "fn", None)
    what = _qualified_name(target) if _is_named_object(target) else type(cfg).__name__
    raise RequiredFieldMissingError(
        f"Missing value for required field when instantiating {what}: {', '.join(paths)} "
        "(set it on the config or pass it to instantiate())"
    )


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


class TrainerConfigFn(Protocol):
    """A function that returns the config of a trainer (e.g. `SpmdTrainer.Config`).

    Experiment modules map config names to these (`named_trainer_configs()`); callers invoke them
    with no arguments. Typed as `InstantiableConfig` so that this module needs no trainer import
    and custom trainers fit the same protocol (as in AXLearn).
    """

    def __call__(self) -> InstantiableConfig: ...


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

    def __init__(self, cfg: "Configurable.Config"):
        # Keep a private copy so later changes to `cfg` do not affect this object.
        self._config = copy.deepcopy(cfg)

    @property
    def config(self) -> "Configurable.Config":
        """A copy of this object's config."""
        return copy.deepcopy(self._config)

    def __repr__(self) -> str:
        return repr(self._config)


def _field_for_parameter(param: inspect.Parameter):
    """An attrs field for a signature parameter: its default (or REQUIRED) and its annotation."""
    default = REQUIRED if param.default is inspect.Parameter.empty else param.default
    if param.annotation is inspect.Parameter.empty:
        return attr.field(default=default)
    return attr.field(default=default, type=param.annotation)


def _call_args(kwargs: dict, *, sig: inspect.Signature, cfg: ConfigBase) -> list:
    """Moves the config's values into `kwargs` (and returns *args) according to `sig`.

    A value given in `kwargs` takes precedence over the config's value of the same name (as in
    AXLearn: `cfg.instantiate(x=...)` overrides `cfg.x` for this call only).
    """
    args: list = []
    params = [(n, p) for n, p in sig.parameters.items() if n != "self"]
    has_var_positional = any(p.kind == inspect.Parameter.VAR_POSITIONAL for _, p in params)
    for name, param in params:
        value = getattr(cfg, name)
        if has_var_positional and param.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            # Parameters before *args must be passed positionally.
            args.append(kwargs.pop(name, value))
        elif param.kind == inspect.Parameter.VAR_POSITIONAL:
            args.extend(value)
        elif param.kind == inspect.Parameter.VAR_KEYWORD:
            for k, v in value.items():
                kwargs.setdefault(k, v)
        elif param.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        ):
            kwargs.setdefault(name, value)
        else:
            raise NotImplementedError(f"Unsupported param kind {param.kind}: {name}")
    return args


@config_class
class FunctionConfigBase(InstantiableConfig[T]):
    """Base of configs made by `config_for_function`; `instantiate()` calls `fn`."""

    # The function to call.
    fn: Callable[..., T]

    def instantiate(self, **kwargs) -> T:
        """Calls `fn` with the config's fields (plus `kwargs`) as arguments.

        Args:
            **kwargs: Arguments for `fn`; they take precedence over the config's values.

        Returns:
            `fn`'s return value.
        """
        _validate_required_fields(self, provided=kwargs)
        args = _call_args(kwargs, sig=inspect.signature(self.fn), cfg=self)
        return self.fn(*args, **kwargs)


@config_class
class ClassConfigBase(InstantiableConfig[T]):
    """Base of configs made by `config_for_class`; `instantiate()` constructs `klass`."""

    # The class to construct.
    klass: type[T]

    def instantiate(self, **kwargs) -> T:
        """Constructs `klass` with the config's fields (plus `kwargs`) as arguments.

        Args:
            **kwargs: Constructor arguments; they take precedence over the config's values.

        Returns:
            The constructed object.
        """
        _validate_required_fields(self, provided=kwargs)
        args = _call_args(kwargs, sig=inspect.signature(self.klass.__init__), cfg=self)
        return self.klass(*args, **kwargs)


# Their fields carry the parameters' annotations (as in AXLearn) but values are not checked
# against them: a parameter annotated `float` may legitimately be configured with a schedule config.
FunctionConfigBase.__config_typecheck__ = False
ClassConfigBase.__config_typecheck__ = False


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

    Parameters without defaults are REQUIRED. `instantiate(**kwargs)` calls `fn(**fields)`;
    kwargs fill REQUIRED fields and take precedence over set ones. A `*args` parameter is a field
    holding a sequence, `**kwargs` one holding a dict.

    Args:
        fn: The function.

    Returns:
        A `FunctionConfigBase` instance.

    Raises:
        ValueError: If `fn` has a parameter named `fn` or `_` (as in AXLearn).
    """
    params = inspect.signature(fn).parameters
    for name in ("fn", "_"):
        if name in params:
            raise ValueError(f"Configured function {fn} should not have a '{name}' parameter.")
    return _cached_or_new(_function_config_class, fn)(fn=fn)


def config_for_class(cls: type[T]) -> Any:
    """Returns a config with one field per `__init__` parameter of `cls`, plus `klass`.

    Parameters without defaults are REQUIRED. `instantiate(**kwargs)` constructs
    `cls(**fields)`; kwargs fill REQUIRED fields and take precedence over set ones.

    Args:
        cls: The class.

    Returns:
        A `ClassConfigBase` instance.
    """
    return _cached_or_new(_class_config_class, cls)(klass=cls)


def maybe_set_config(cfg: ConfigBase, *args: Any, **kwargs: Any) -> ConfigBase:
    """Sets fields of `cfg` that exist, ignoring those it lacks.

    Call as `maybe_set_config(cfg, "key", value)` or `maybe_set_config(cfg, key=value, ...)`
    (any field name works as a keyword, `key` and `value` included).

    Args:
        cfg: The config.
        *args: Optionally one (field name, value) pair, positionally.
        **kwargs: Field values.

    Returns:
        `cfg`.

    Raises:
        TypeError: If positional arguments are not exactly a (name, value) pair.
    """
    if args:
        if len(args) != 2:
            raise TypeError(f"maybe_set_config takes (cfg, key, value) or keywords, got {args!r}")
        kwargs = {args[0]: args[1], **kwargs}
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
