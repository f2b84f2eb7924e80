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

# The implementation is split over this package's modules; every public name is re-exported here
# and reports `axlearn.common.config` as its module, so dumps and tracebacks show the public path.

from axlearn.common.config import base as _base
from axlearn.common.config.base import (
    ConfigBase,
    _validators,  # noqa: F401  (registered validators; tests restore it)
    config_class,
    is_attrs,
    is_named_tuple,
    register_validator,
    similar_names,
    validate_config_field_name,
    validate_config_field_value,
)
from axlearn.common.config.errors import (
    REQUIRED,
    InvalidConfigClassError,
    InvalidConfigNameError,
    InvalidConfigValueError,
    MissingConfigClassDecoratorError,
    NonConfigFieldError,
    Required,
    RequiredFieldMissingError,
    RequiredFieldValue,
    UnknownFieldError,
)
from axlearn.common.config.instantiable import (
    C,
    ClassConfigBase,
    ConfigOr,
    Configurable,
    FunctionConfigBase,
    InstantiableConfig,
    T,
    TrainerConfigFn,
    config_for_class,
    config_for_function,
    get_recursively,
    instantiation_scope,
    maybe_instantiate,
    maybe_set_config,
    set_recursively,
)
from axlearn.common.config.modifier import ConfigModifier

__all__ = [
    "C",
    "ClassConfigBase",
    "ConfigBase",
    "ConfigModifier",
    "ConfigOr",
    "Configurable",
    "FunctionConfigBase",
    "InstantiableConfig",
    "InvalidConfigClassError",
    "InvalidConfigNameError",
    "InvalidConfigValueError",
    "MissingConfigClassDecoratorError",
    "NonConfigFieldError",
    "REQUIRED",
    "Required",
    "RequiredFieldMissingError",
    "RequiredFieldValue",
    "T",
    "TrainerConfigFn",
    "UnknownFieldError",
    "config_class",
    "config_for_class",
    "config_for_function",
    "get_recursively",
    "instantiation_scope",
    "is_attrs",
    "is_named_tuple",
    "maybe_instantiate",
    "maybe_set_config",
    "register_validator",
    "set_recursively",
    "similar_names",
    "validate_config_field_name",
    "validate_config_field_value",
]

for _name, _value in list(globals().items()):
    if not _name.startswith("_") and getattr(_value, "__module__", "").startswith(
        "axlearn.common.config."
    ):
        try:
            _value.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _value, _base
