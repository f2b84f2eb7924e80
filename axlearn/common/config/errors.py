"""Config error classes and the REQUIRED sentinel."""

from __future__ import annotations

from typing import Any, TypeVar, Union

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
