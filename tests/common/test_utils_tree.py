"""Tests of the tree helpers in axlearn.common.utils_tree (re-exported by utils)."""

import jax
import numpy as np
import pytest
import tensorflow as tf
from jax import numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.config import REQUIRED, ConfigBase, Required, config_class
from axlearn.common.layers import Linear
from axlearn.common.module import Module
from axlearn.common.utils import (
    VDict,
    as_numpy_array,
    check_param_shape_alignment,
    complete_partition_spec_tree,
    copy_recursively,
    expand_vdicts,
    find_cycles,
    non_empty_leaf_merge_fn,
    own_fields,
    pytree_children,
    replace_layer_config_recursively,
    tree_merge,
)


def test_pytree_children_keys():
    tree = {"a": 1, "b": [2, 3]}
    assert pytree_children(tree) == [
        (jax.tree_util.DictKey("a"), 1),
        (jax.tree_util.DictKey("b"), [2, 3]),
    ]
    assert pytree_children((4, 5)) == [
        (jax.tree_util.SequenceKey(0), 4),
        (jax.tree_util.SequenceKey(1), 5),
    ]
    assert pytree_children(7) == []
    assert pytree_children({}) == []


def test_find_cycles():
    shared = {}
    assert find_cycles({"a": shared, "b": shared}) == {}
    tree = {"x": {"y": {}}}
    tree["x"]["y"]["z"] = tree["x"]
    d = jax.tree_util.DictKey
    assert find_cycles(tree) == dict(ancestor=[d("x")], descendant=[d("x"), d("y"), d("z")])


def test_expand_vdicts():
    tree = VDict(a=np.array([1, 2]), b=VDict(c=np.array([[3, 4], [5, 6]])))
    out = expand_vdicts(tree)
    assert len(out) == 2
    assert out[1]["a"] == 2
    assert [x["c"] for x in out[1]["b"]] == [5, 6]
    assert expand_vdicts(VDict()) == VDict()
    with pytest.raises(ValueError, match="got scalar"):
        expand_vdicts(VDict(a=np.array(1)))
    with pytest.raises(ValueError, match="same dim 0"):
        expand_vdicts(VDict(a=np.zeros([2]), b=np.zeros([3])))


def test_copy_recursively():
    source = {"a": {"b": [1, 2], "c": 3}}
    target = {"a": 0, "d": 4}
    out = copy_recursively(source=source, target=target, path="a/b")
    assert out is target and out == {"a": {"b": [1, 2]}, "d": 4}
    out["a"]["b"].append(9)
    assert source["a"]["b"] == [1, 2]
    assert copy_recursively(source=source, target=None, path=("a", "c")) == {"a": {"c": 3}}
    with pytest.raises(KeyError, match="a/x"):
        copy_recursively(source=source, target=None, path="a/x")


def test_tree_merge():
    primary = {"a": VDict(x=1), "b": None, "c": {}}
    out = tree_merge(
        primary,
        secondary={"a": {"y": 2}, "b": 3, "c": {"z": 4}},
        leaf_merge_fn=non_empty_leaf_merge_fn,
    )
    assert out == {"a": {"x": 1, "y": 2}, "b": 3, "c": {"z": 4}}
    assert isinstance(out["a"], VDict)
    with pytest.raises(ValueError, match="non-empty"):
        tree_merge({"a": 1}, secondary={"a": 2}, leaf_merge_fn=non_empty_leaf_merge_fn)
    with pytest.raises(ValueError, match="dict and the other a leaf"):
        tree_merge({"a": {}}, secondary={"a": 2}, leaf_merge_fn=non_empty_leaf_merge_fn)
    assert tree_merge({"a": 1}, secondary={"a": 2}, leaf_merge_fn=lambda p, s: p + s) == {"a": 3}


def test_complete_partition_spec_tree():
    data = {"r": {"a": 1, "b": 2}, "s": VDict(c=3)}
    spec = PartitionSpec("x")
    out = complete_partition_spec_tree(jax.tree_util.tree_structure(data), {"r": None, "s": spec})
    assert out == {"r": {"a": None, "b": None}, "s": VDict(c=spec)}
    assert isinstance(out["s"], VDict)


def test_check_param_shape_alignment():
    a = {"w": np.zeros([2, 3]), "b": np.zeros([3])}
    assert check_param_shape_alignment(a, a) is None
    b = {"w": np.zeros([2, 4]), "b": np.zeros([5])}
    assert check_param_shape_alignment(a, b) == (
        "(b/0) shape is different: source: (3), target: (5).\n"
        "(w/1) shape is different: source: (3), target: (4)."
    )


def test_as_numpy_array():
    out = as_numpy_array({"a": 1, "b": jnp.ones([2]), "c": tf.constant([3], dtype=tf.int32)})
    assert out["a"].dtype == np.int64 and out["a"].shape == ()
    assert isinstance(out["b"], np.ndarray) and out["b"].tolist() == [1.0, 1.0]
    assert out["c"].dtype == np.int32 and out["c"].tolist() == [3]
    with pytest.raises(NotImplementedError):
        as_numpy_array("text")


def test_own_fields():
    @config_class
    class Parent(ConfigBase):
        p: Required[int] = REQUIRED

    @config_class
    class Child(Parent):
        c1: int = 1
        c2: int = 2

    assert sorted(own_fields(Child())) == ["c1", "c2"]
    assert own_fields(Parent()) == ["p"]


class _OtherLinear(Linear):
    pass


class _Holder(Module):
    @config_class
    class Config(Module.Config):
        # Layer configs.
        layers: list = []
        # One layer config.
        single: object = None


def test_replace_layer_config_recursively():
    cfg = Linear.default_config().set(input_dim=2, output_dim=3)
    holder = _Holder.default_config().set(layers=[cfg, cfg.clone(input_dim=5)], single=cfg)
    replaced = replace_layer_config_recursively(
        holder,
        target_cls=Linear,
        source_config=_OtherLinear.default_config().set(output_dim=9),
        exclude_keys=("output_dim",),
    )
    assert replaced == ["layers[0]", "layers[1]", "single"]
    assert holder.single.klass is _OtherLinear
    assert [c.input_dim for c in holder.layers] == [2, 5]
    assert [c.output_dim for c in holder.layers] == [9, 9]
    assert holder.layers[0] is not holder.layers[1]
