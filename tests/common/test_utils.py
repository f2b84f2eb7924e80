"""Tests of axlearn.common.utils: trees, paths, regex rules, sharding helpers, remat policy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common.utils import (
    VDict,
    cast_floats,
    count_model_params,
    current_mesh,
    flatten_items,
    get_recursively,
    match_regex_rules,
    maybe_shard,
    partition_spec_to_named_sharding,
    prune_empty,
    prune_tree,
    save_and_offload_only_these_names_regex,
    set_recursively,
    shapes,
    tree_paths,
    with_sharding_constraint,
)

TREE = {"b": [jnp.ones(2), {"c": jnp.zeros((3, 4))}], "a": jnp.ones((5,))}


def test_tree_paths_and_flatten_items():
    assert tree_paths({"a": 1, "b": [2, {"c": 3}]}) == {"a": "a", "b": ["b/0", {"c": "b/1/c"}]}
    assert tree_paths({"a": {"b": 1}}, separator=".") == {"a": {"b": "a.b"}}
    assert tree_paths({"a": None}) == {"a": None}
    items = flatten_items(TREE)
    assert [p for p, _ in items] == ["a", "b/0", "b/1/c"]
    assert [p for p, _ in flatten_items(TREE, separator=".")] == ["a", "b.0", "b.1.c"]


def test_shapes_and_count():
    assert shapes(TREE) == {"b": [(2,), {"c": (3, 4)}], "a": (5,)}
    assert count_model_params(TREE) == 2 + 12 + 5
    assert count_model_params(jax.eval_shape(lambda: TREE)) == 19


def test_get_set_recursively():
    tree = {"a": {"b": {"c": 1}}}
    assert get_recursively(tree, "a/b/c") == 1
    assert get_recursively(tree, ["a", "b"]) == {"c": 1}
    assert get_recursively(tree, "") is tree
    with pytest.raises(KeyError, match="'a/x'"):
        get_recursively(tree, "a/x/y")
    set_recursively(tree, value=2, path="a/d/e")
    assert tree == {"a": {"b": {"c": 1}, "d": {"e": 2}}}
    set_recursively(tree, value=3, path="a.b.c", separator=".")
    assert tree["a"]["b"]["c"] == 3
    with pytest.raises(ValueError):
        set_recursively(tree, value=1, path="")


def test_match_regex_rules():
    rules = [(".*/bias", "no_decay"), (".*weight", "decay"), (".*", "other")]
    assert match_regex_rules("decoder/linear/bias", rules=rules) == "no_decay"
    assert match_regex_rules("decoder/linear/weight", rules=rules) == "decay"
    assert match_regex_rules("x", rules=rules[:2], default_value="d") == "d"
    # Full match: "weight_x" does not match ".*weight".
    assert match_regex_rules("a/weight_x", rules=rules[1:2]) is None


def test_prune_tree():
    tree = {"a": {"b": 1, "c": {}}, "d": 2}
    assert prune_tree(tree, lambda path, v: path == "a/b") == {"a": {"c": {}}, "d": 2}
    assert prune_empty({"a": {"c": {}}, "d": 2}) == {"d": 2}


def test_vdict():
    tree = VDict(w=jnp.ones((3, 2)), b=jnp.zeros((3,)))
    mapped = jax.tree.map(lambda x: x + 1, tree)
    # Flattened as JAX flattens a dict: keys sorted, paths named by the keys (AXLearn's VDict).
    assert isinstance(mapped, VDict) and list(mapped) == ["b", "w"]
    assert [path for path, _ in flatten_items(tree)] == ["b", "w"]
    assert jax.tree.structure(tree) == jax.tree.structure(VDict(b=0, w=0))
    assert jax.tree.leaves(VDict(a=None)) == [] and jax.tree.map(lambda x: x, VDict()) == VDict()
    assert repr(VDict(a=1)) == "VDict({'a': 1})"


def test_cast_floats():
    tree = {"f": jnp.ones(2, jnp.float32), "i": jnp.ones(2, jnp.int32)}
    out = cast_floats(tree, jnp.bfloat16)
    assert out["f"].dtype == jnp.bfloat16 and out["i"].dtype == jnp.int32
    assert cast_floats(tree, None)["f"].dtype == jnp.float32


def _mesh():
    return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


@pytest.mark.filterwarnings("ignore:.*with mesh.*:DeprecationWarning")
def test_sharding_helpers():
    mesh = _mesh()
    assert current_mesh() is None
    x = jnp.arange(16.0).reshape(8, 2)
    # No mesh: no-op.
    assert with_sharding_constraint(x, PartitionSpec("data")) is x
    fn = jax.jit(lambda x: with_sharding_constraint(x * 2, PartitionSpec("data", "model")))
    with jax.set_mesh(mesh):
        assert current_mesh() is not None
        out = fn(x)
    assert out.sharding == NamedSharding(mesh, PartitionSpec("data", "model"))
    with mesh:  # The legacy context works too.
        assert current_mesh() is mesh
    with pytest.raises(ValueError, match="2 entries"):
        maybe_shard(jnp.ones(3), ("data", None))
    assert maybe_shard(x, None) is x
    shardings = partition_spec_to_named_sharding(
        mesh, {"w": PartitionSpec(("data", "model"), None), "b": None}
    )
    assert shardings["w"] == NamedSharding(mesh, PartitionSpec(("data", "model"), None))
    assert shardings["b"] == NamedSharding(mesh, PartitionSpec())
    with pytest.raises(ValueError, match="'layer/w'.*'fsdp'"):
        partition_spec_to_named_sharding(mesh, {"layer": {"w": PartitionSpec("fsdp", None)}})


@pytest.mark.parametrize(
    "saved, offloaded, expected",
    [
        (None, None, []),
        (".*q_proj", None, ["Layer.q_proj"]),
        (".*([qkvo]_proj|context)", None, ["Layer.q_proj", "Layer.context"]),
        (".*", None, ["Layer.q_proj", "Layer.context", "Layer.other"]),
    ],
)
def test_save_and_offload_regex_policy(saved, offloaded, expected):
    def f(x):
        a = checkpoint_name(jnp.sin(x), "Layer.q_proj")
        b = checkpoint_name(jnp.sin(a), "Layer.context")
        c = checkpoint_name(jnp.sin(b), "Layer.other")
        return jnp.sum(jnp.sin(c))

    policy = save_and_offload_only_these_names_regex(
        names_which_can_be_saved=saved,
        names_which_can_be_offloaded=offloaded,
        offload_src="device",
        offload_dst="pinned_host",
    )
    residuals = [desc for _, desc in saved_residuals(jax.checkpoint(f, policy=policy), jnp.ones(3))]
    named = [d.split("'")[1] for d in residuals if d.startswith("named")]
    assert named == expected


def test_vectorized_tree_map_maps_per_layer():
    from axlearn.common.utils import VDict, vectorized_tree_map

    tree = dict(a=jnp.ones((2, 3)), stacked=VDict(x=jnp.arange(24.0).reshape(4, 2, 3)))
    seen = []

    def fn(x):
        seen.append(x.shape)
        return x.sum(axis=0)

    out = vectorized_tree_map(fn, tree)
    assert isinstance(out["stacked"], VDict)
    assert out["a"].shape == (3,)
    # Under the VDict, fn sees one layer [2, 3] and the result is stacked back: [4, 3].
    assert (2, 3) in seen and (4, 2, 3) not in seen
    np.testing.assert_array_equal(out["stacked"]["x"], np.arange(24.0).reshape(4, 2, 3).sum(1))


def test_validate_contains_paths():
    from axlearn.common.utils import validate_contains_paths

    validate_contains_paths(dict(a=1, b=dict(c=2)), paths=["a", "b/c"])
    with pytest.raises(KeyError, match=r"\['b/d'\].*\['a', 'b'\]"):
        validate_contains_paths(dict(a=1, b=dict(c=2)), paths=["a", "b/d"])


def _decisions(policy, fn, *args):
    """{primitive name: [decision, ...]} of `policy` on the equations of fn's jaxpr."""
    out = {}
    for eqn in jax.make_jaxpr(fn)(*args).jaxpr.eqns:
        out.setdefault(eqn.primitive.name, []).append(policy(eqn.primitive, **eqn.params))
    return out


def test_offload_dots_saveable_offloads_only_unbatched_dots():
    from jax._src.interpreters import partial_eval as pe

    from axlearn.common.utils import offload_dots_saveable

    policy = offload_dots_saveable("device", "pinned_host")
    x = jnp.ones((2, 3, 4))
    w = jnp.ones((4, 5))

    def f(x, w):
        y = jnp.einsum("bti,io->bto", x, w)  # No batch dims: offloaded.
        z = jnp.einsum("bti,btj->bij", x, x)  # Batch dim b: recomputed.
        return jnp.sin(y).sum() + z.sum()

    got = _decisions(policy, f, x, w)
    assert got["dot_general"] == [pe.Offloadable(src="device", dst="pinned_host"), pe.Recompute]
    assert set(got["sin"]) == {pe.Recompute}


def test_combine_remat_policies_table():
    from jax._src.interpreters import partial_eval as pe

    from axlearn.common.utils import combine_remat_policies, default_remat_combine_fn

    save, recompute = pe.Saveable, pe.Recompute
    offload = pe.Offloadable(src="device", dst="pinned_host")

    def const(decision):
        return lambda prim, *args, **kwargs: decision

    # (policy 1, policy 2) -> combined, by hand: a non-recompute decision wins.
    table = [
        (recompute, recompute, recompute),
        (save, recompute, save),
        (recompute, offload, offload),
        (save, save, save),
    ]
    for d1, d2, expected in table:
        assert combine_remat_policies(const(d1), const(d2))("prim") == expected
    with pytest.raises(RuntimeError, match="Conflicting remat decisions"):
        combine_remat_policies(const(save), const(offload))("prim")
    preferred = default_remat_combine_fn(preferred_remat_type=offload)
    assert combine_remat_policies(const(save), const(offload), combine_fn=preferred)("p") == offload


def test_combined_policy_keeps_gradients():
    from jax.ad_checkpoint import checkpoint_policies

    from axlearn.common.flash_attention.remat import save_or_offload_flash_attention_policy
    from axlearn.common.utils import combine_remat_policies

    def f(w, x):
        h = checkpoint_name(jnp.tanh(x @ w), "layer.context")
        return jnp.sum(jnp.sin(h @ w.T))

    w = jnp.arange(12.0).reshape(3, 4) / 10
    x = jnp.arange(6.0).reshape(2, 3) / 7
    policy = combine_remat_policies(
        save_or_offload_flash_attention_policy(), checkpoint_policies.dots_saveable
    )
    expected = jax.grad(f)(w, x)  # The reference: no rematerialization.
    got = jax.grad(jax.checkpoint(f, policy=policy))(w, x)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    residuals = [d for _, d in saved_residuals(jax.checkpoint(f, policy=policy), w, x)]
    assert any("layer.context" in d for d in residuals)


@pytest.mark.parametrize("jit", [False, True])
def test_all_finite_matches_numpy(jit):
    from axlearn.common.utils import all_finite  # pylint: disable=import-outside-toplevel

    fn = jax.jit(all_finite) if jit else all_finite
    rng = np.random.default_rng(0)
    finite = {"w": rng.normal(size=(3, 4)).astype(np.float32), "step": np.int32(7)}
    cases = [
        finite,
        dict(finite, b=np.array([1.0, np.nan], np.float32)),
        dict(finite, b=np.array([-np.inf], jnp.bfloat16)),
        {"count": np.int32(3), "flag": np.array([True])},  # No float leaves.
        {},
    ]
    for tree in cases:
        # Integer and boolean leaves are finite as float64 too.
        expected = all(np.isfinite(np.asarray(x, np.float64)).all() for x in jax.tree.leaves(tree))
        got = fn(tree)
        assert got.shape == () and got.dtype == jnp.bool_
        assert bool(got) == expected, tree
