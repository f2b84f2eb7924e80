"""Frozen dataclasses that are JAX pytrees (AXLearn's `flax_struct`, without Flax).

    class Point(flax_struct.PyTreeNode):
        x: Tensor
        y: Tensor
        name: str = flax_struct.field(pytree_node=False, default="p")

Subclasses of `PyTreeNode` become frozen dataclasses registered with JAX: fields are children
(visited by `jax.tree.map`, with `GetAttrKey` path entries) unless declared with
`field(pytree_node=False)`, which makes them static metadata. `replace(**changes)` returns a
copy with fields changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import jax

T = TypeVar("T")


def field(pytree_node: bool = True, **kwargs) -> Any:
    """A dataclass field; `pytree_node=False` makes it static (not a pytree child).

    Args:
        pytree_node: Whether the field is a child of the pytree.
        **kwargs: Passed to `dataclasses.field` (default, default_factory, ...).

    Returns:
        The dataclass field.
    """
    metadata = dict(kwargs.pop("metadata", None) or {}, pytree_node=pytree_node)
    return dataclasses.field(metadata=metadata, **kwargs)


def dataclass(cls: type[T], **kwargs) -> type[T]:
    """Makes `cls` a frozen dataclass registered as a JAX pytree (see the module docstring).

    Args:
        cls: The class.
        **kwargs: Extra `dataclasses.dataclass` options (`frozen` is always True).

    Returns:
        The class.
    """
    if "_axlearn_struct" in cls.__dict__:
        return cls
    kwargs["frozen"] = True
    data_cls = dataclasses.dataclass(cls, **kwargs)
    fields = dataclasses.fields(data_cls)
    data_fields = [f.name for f in fields if f.metadata.get("pytree_node", True)]
    meta_fields = [f.name for f in fields if not f.metadata.get("pytree_node", True)]
    jax.tree_util.register_dataclass(data_cls, data_fields=data_fields, meta_fields=meta_fields)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    data_cls.replace = replace
    data_cls._axlearn_struct = True  # pylint: disable=protected-access
    return data_cls


class PyTreeNode:
    """Base class whose subclasses are frozen pytree dataclasses (see the module docstring)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__()
        dataclass(cls, **kwargs)

    def replace(self: T, **changes) -> T:
        """Returns a copy with `changes` applied (replaced per subclass)."""
        return dataclasses.replace(self, **changes)
