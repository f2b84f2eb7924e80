"""Tests axlearn/common/invocation_context.py: a context needs only `ContextModule` of its module.

`invocation_context` sits below `module` and imports nothing from it; these tests check that the
protocol it declares is all a context reads (a plain stub object works) and that `Module`
provides it.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Optional

import pytest

from axlearn.common import module as module_lib
from axlearn.common.invocation_context import (
    ContextModule,
    InvocationContext,
    new_output_collection,
)


@dataclasses.dataclass(eq=False)
class _Stub:
    name: str
    parent: Optional[_Stub] = None
    children: dict = dataclasses.field(default_factory=dict)

    def path(self) -> str:
        return self.name if self.parent is None else f"{self.parent.path()}.{self.name}"


def test_context_reads_only_the_protocol():
    root = _Stub("root")
    root.children["a"] = _Stub("a", parent=root)
    ctx = InvocationContext(
        name="root",
        parent=None,
        module=root,
        state={"a": {"w": 1.0}, "b": {"w": 2.0}},
        is_training=True,
        prng_key=None,
        output_collection=new_output_collection(),
    )
    child = ctx.add_child("a")
    assert child.module is root.children["a"]
    assert child.state == {"w": 1.0}
    assert child.path() == "root.a"
    with pytest.raises(ValueError, match=r"'b' is not a child of module root \(children"):
        ctx.add_child("b")


def test_module_provides_the_protocol():
    class Leaf(module_lib.Module):
        """A module without children."""

    class Parent(module_lib.Module):
        """A module with one child."""

        def __init__(self, cfg, *, parent):
            super().__init__(cfg, parent=parent)
            self._add_child("leaf", Leaf.default_config())

    parent = Parent.default_config().set(name="parent").instantiate(parent=None)
    members = set(typing.get_type_hints(ContextModule)) | {"path"}
    assert members == {"name", "parent", "children", "path"}
    leaf = parent.children["leaf"]
    assert (leaf.name, leaf.parent, leaf.path()) == ("leaf", parent, "parent.leaf")
    assert parent.children == {"leaf": leaf} and parent.parent is None
