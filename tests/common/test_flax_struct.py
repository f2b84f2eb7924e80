"""Tests of axlearn.common.flax_struct and axlearn.common.serialization."""

import dataclasses

import jax
import numpy as np
import pytest

from axlearn.common import flax_struct, serialization
from axlearn.common.utils import VDict, tree_paths


class _Point(flax_struct.PyTreeNode):
    x: float
    y: float
    name: str = flax_struct.field(pytree_node=False, default="p")


def test_pytree_node():
    p = _Point(1.0, 2.0)
    assert jax.tree.leaves(p) == [1.0, 2.0]
    doubled = jax.tree.map(lambda v: v * 2, p)
    assert doubled == _Point(2.0, 4.0, "p")
    assert tree_paths(p) == _Point("x", "y", "p")
    assert p.replace(y=5.0) == _Point(1.0, 5.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3.0


def test_state_dict_round_trip():
    a, b = np.arange(3), np.arange(2)
    tree = {"v": VDict(a=a), "l": [b, {"c": 1}]}
    state = serialization.to_state_dict(tree)
    assert state == {"v": {"a": a}, "l": {"0": b, "1": {"c": 1}}}
    assert type(state["v"]) is dict
    restored = serialization.from_state_dict(tree, state)
    assert isinstance(restored["v"], VDict) and restored["v"]["a"] is a
    assert isinstance(restored["l"], list) and restored["l"][1] == {"c": 1}
    with pytest.raises(ValueError, match="lacks the key"):
        serialization.from_state_dict({"x": 1}, {})


def test_register_serialization_state():
    class Box(dict):
        pass

    serialization.register_serialization_state(
        Box,
        ty_to_state_dict=serialization._dict_state_dict,
        ty_from_state_dict=lambda xs, s: Box(serialization._restore_dict(xs, s)),
    )
    assert serialization.to_state_dict(Box(k=2)) == {"k": 2}
    assert isinstance(serialization.from_state_dict(Box(k=0), {"k": 3}), Box)
    with pytest.raises(ValueError, match="registered already"):
        serialization.register_serialization_state(Box, lambda x: x, lambda x, s: s)
