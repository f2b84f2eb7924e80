"""Summaries: typed values a module adds with `add_summary` (AXLearn's `axlearn.common.summary`).

A `Summary` is a pytree whose fields are its class annotations (in MRO order), so summaries can
be returned from jitted functions. Subclasses define `value()` (what a summary writer records),
`validate()` (called by `add_summary`) and, where summaries combine across batches,
`accumulate(other)`.

    ImageSummary(images)     # [batch, height, width, channels] or [height, width, channels]
    ImageSummary(images).value().shape

Metric summaries (`WeightedSummary`, `WeightedScalar`, `MinSummary`, ...) are in metrics.py.
"""

from __future__ import annotations

import typing
from typing import Any

import jax
import numpy as np


def _field_names(cls: type) -> tuple[str, ...]:
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        for name, annotation in klass.__dict__.get("__annotations__", {}).items():
            if "ClassVar" in str(annotation) or name in names:
                continue
            names.append(name)
    return tuple(names)


def _field_defaults(cls: type) -> dict[str, Any]:
    """Field defaults: class attributes assigned where a field is annotated (`rate: int = 1`)."""
    defaults: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for name in klass.__dict__.get("__annotations__", {}):
            if name in klass.__dict__:
                defaults[name] = klass.__dict__[name]
    return defaults


class Summary:
    """Base class of summaries: a pytree of its annotated fields.

    Subclasses are registered as pytree nodes automatically. The constructor takes the fields
    positionally or by name; `Module.add_summary` calls `validate()`.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_with_keys(
            cls, cls._tree_flatten_with_keys, cls._tree_unflatten, cls._tree_flatten
        )

    def __init__(self, *args: Any, **kwargs: Any):
        names = _field_names(type(self))
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} fields, got {len(args)}")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names or key in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated field {key!r}")
            values[key] = value
        defaults = _field_defaults(type(self))
        missing = [n for n in names if n not in values and n not in defaults]
        if missing:
            raise TypeError(f"{type(self).__name__} is missing fields {missing}")
        for name in names:
            object.__setattr__(self, name, values[name] if name in values else defaults[name])

    def _tree_flatten(self):
        names = _field_names(type(self))
        return tuple(getattr(self, n) for n in names), None

    def _tree_flatten_with_keys(self):
        # Children are keyed by field name (paths read "loss/mean", "image/_value"), or by
        # index when a subclass flattens other than one child per field.
        children, aux_data = self._tree_flatten()
        names = getattr(type(self), "_child_fields", None) or _field_names(type(self))
        if len(children) == len(names):
            keys = [jax.tree_util.GetAttrKey(n) for n in names]
        else:
            keys = [jax.tree_util.FlattenedIndexKey(i) for i in range(len(children))]
        return list(zip(keys, children)), aux_data

    @classmethod
    def _tree_unflatten(cls, aux_data, children):
        del aux_data
        obj = object.__new__(cls)
        for name, value in zip(_field_names(cls), children):
            object.__setattr__(obj, name, value)
        return obj

    def value(self) -> Any:
        """The value a summary writer records (None: nothing to record)."""
        return None

    def validate(self) -> None:
        """Raises ValueError if the fields are invalid (called by `add_summary`)."""

    def accumulate(self, other: Summary) -> Summary:
        """Combines with the same summary from another batch.

        Raises:
            NotImplementedError: Unless a subclass defines how to combine.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support accumulation.")

    def __eq__(self, other: Any) -> bool:
        """Equal when of the same type with equal fields (arrays compared element-wise)."""
        if type(self) is not type(other):
            return NotImplemented
        mine, aux = self._tree_flatten()
        theirs, other_aux = other._tree_flatten()
        if aux != other_aux:
            return False
        for a, b in zip(mine, theirs):
            if a is b:
                continue
            if hasattr(a, "shape") or hasattr(b, "shape"):
                # `==` of the arrays themselves: a Python number compares at the array's dtype.
                if np.shape(a) != np.shape(b) or not np.all(np.asarray(a == b)):
                    return False
            elif a != b:
                return False
        return True

    # Summaries stay hashable by identity (equality is by value, for tests and comparisons).
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in _field_names(type(self)))
        return f"{type(self).__name__}({fields})"


def _is_concrete_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


class ImageSummary(Summary):
    """Images: [batch, height, width, channels] or [height, width, channels], channels 1/3/4.

    Values are floats in [0, 1] or uint8.
    """

    _value: typing.Any

    def value(self) -> Any:
        """The images, with a batch axis ([batch, height, width, channels])."""
        v = self._value
        return v[None] if v.ndim == 3 else v

    def accumulate(self, other: Summary) -> Summary:
        """Images are not combined across batches: keeps this (the first) one."""
        del other
        return self

    def validate(self) -> None:
        """Checks rank and channels.

        Raises:
            ValueError: If the value is not an array of rank 3/4 with 1, 3 or 4 channels.
        """
        v = self._value
        if not _is_concrete_array(v):
            raise ValueError(f"ImageSummary value must be an array, got {type(v)}.")
        if v.ndim not in (3, 4) or v.shape[-1] not in (1, 3, 4):
            raise ValueError(
                "ImageSummary value must have shape [batch, height, width, channels] or "
                f"[height, width, channels] with 1, 3 or 4 channels, got {v.shape}."
            )


class CallbackSummary(Summary):
    """A summary computed on the host by calling `fn(*args, **kwargs)` when it is written."""

    fn: typing.Any
    args: typing.Any
    kwargs: typing.Any

    def __init__(self, fn: Any, *args: Any, **kwargs: Any):
        super().__init__(fn, args, kwargs)

    def _tree_flatten(self):
        # The callable is static; args/kwargs are the traced children.
        return (self.args, self.kwargs), self.fn

    @classmethod
    def _tree_unflatten(cls, aux_data, children):
        obj = object.__new__(cls)
        object.__setattr__(obj, "fn", aux_data)
        object.__setattr__(obj, "args", children[0])
        object.__setattr__(obj, "kwargs", children[1])
        return obj

    def value(self) -> Any:
        """The result of `fn(*args, **kwargs)`."""
        return self.fn(*self.args, **self.kwargs)

    def accumulate(self, other: Summary) -> Summary:
        """Callbacks are not combined across batches: keeps this (the first) one."""
        del other
        return self

    def validate(self) -> None:
        """Raises ValueError unless `fn` is callable."""
        if not callable(self.fn):
            raise ValueError(f"CallbackSummary.fn must be callable, got {self.fn!r}.")


class AudioSummary(Summary):
    """Audio: [num_samples] or [num_samples, channels] floats in [-1, 1], at `sample_rate` Hz.

    `sample_rate` (default 16000) is static (not traced under jit).
    """

    _value: typing.Any
    sample_rate: typing.Any = 16000
    # The pytree children (keys of `_tree_flatten_with_keys`): the rate is static.
    _child_fields: typing.ClassVar[tuple[str, ...]] = ("_value",)

    def _tree_flatten(self):
        return (self._value,), self.sample_rate

    @classmethod
    def _tree_unflatten(cls, aux_data, children):
        obj = object.__new__(cls)
        object.__setattr__(obj, "_value", children[0])
        object.__setattr__(obj, "sample_rate", aux_data)
        return obj

    def value(self) -> Any:
        """The audio with a channel axis ([num_samples, channels])."""
        v = self._value
        return v[:, None] if v.ndim == 1 else v

    def accumulate(self, other: Summary) -> Summary:
        """Audio is not combined across batches: keeps this (the first) one."""
        del other
        return self

    def validate(self) -> None:
        """Checks rank and sample rate.

        Raises:
            ValueError: If the value is not an array of rank 1/2, or sample_rate is not > 0.
        """
        v = self._value
        if not _is_concrete_array(v) or v.ndim not in (1, 2):
            raise ValueError(
                "AudioSummary value must be an array of shape [num_samples] or "
                f"[num_samples, channels], got {getattr(v, 'shape', type(v))}."
            )
        if not isinstance(self.sample_rate, int) or self.sample_rate <= 0:
            raise ValueError(
                f"AudioSummary.sample_rate must be a positive int, got {self.sample_rate!r}."
            )
