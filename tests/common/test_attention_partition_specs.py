"""Tests MultiheadAttention's q/k/v/o_partition_spec (sharding constraints on its tensors)."""

from unittest import mock

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from axlearn.common.attention import GroupedQKVLinear, GroupedQueryAttention, MultiheadAttention
from axlearn.common.module import functional

DIM, HEADS, BATCH, LEN = 16, 4, 2, 6


def _mesh(shape, axes) -> Mesh:
    return Mesh(np.array(jax.devices()[: np.prod(shape)]).reshape(shape), axes)


def _layer(**kwargs):
    cfg = MultiheadAttention.default_config().set(
        name="attn", query_dim=DIM, key_dim=DIM, value_dim=DIM, num_heads=HEADS, **kwargs
    )
    return cfg.instantiate(parent=None)


def _observed_shardings(layer, params, x, mesh):
    """{remat name: (sharding, ndim)} of q/k/v/o_proj as the compiled program shards them."""
    seen = {}

    def remat_name(_, tensor, name):
        def record(sharding):
            seen[name] = (sharding, tensor.ndim)

        jax.debug.inspect_array_sharding(tensor, callback=record)
        return tensor

    with jax.set_mesh(mesh), mock.patch.object(MultiheadAttention, "_remat_name", remat_name):
        out = jax.jit(
            lambda p: functional(layer, None, p, dict(query=x), is_training=False)[0].data
        )(params)
    return seen, out


def _is(observed, mesh, spec) -> bool:
    sharding, ndim = observed
    return sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec(*spec)), ndim)


@pytest.mark.parametrize("kv_spec", [None, ("fsdp", None, "model", None)])
def test_qkvo_partition_specs_shard_the_tensors(kv_spec):
    mesh = _mesh((2, 2, 2), ("fsdp", "seq", "model"))
    q_spec, o_spec = ("fsdp", "seq", "model", None), ("fsdp", "seq", None)
    layer = _layer(
        q_partition_spec=q_spec,
        k_partition_spec=kv_spec,
        v_partition_spec=kv_spec,
        o_partition_spec=o_spec,
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, LEN, DIM))
    seen, out = _observed_shardings(layer, params, x, mesh)
    assert _is(seen["q_proj"], mesh, q_spec)
    assert not _is(seen["q_proj"], mesh, (None,) * 4)  # The check can fail.
    # k/v default to q_partition_spec.
    assert _is(seen["k_proj"], mesh, kv_spec or q_spec)
    assert _is(seen["v_proj"], mesh, kv_spec or q_spec)
    assert _is(seen["o_proj"], mesh, o_spec)
    # Constraints do not change values: equal to the unconstrained layer on one device.
    plain = _layer()
    expected, _ = functional(plain, None, params, dict(query=x), is_training=False)
    np.testing.assert_allclose(out, expected.data, atol=1e-5, rtol=1e-5)


def test_unset_specs_leave_sharding_to_the_compiler():
    mesh = _mesh((2, 2, 2), ("fsdp", "seq", "model"))
    layer = _layer()
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, LEN, DIM))
    with jax.set_mesh(mesh):
        text = (
            jax.jit(lambda p: functional(layer, None, p, dict(query=x), is_training=False)[0].data)
            .lower(params)
            .as_text()
        )
    assert "Sharding" not in text and "sharding_constraint" not in text


def test_grouped_kv_spec_and_rank_error():
    mesh = _mesh((2, 4), ("data", "model"))
    cfg = GroupedQueryAttention.default_config().set(
        name="gqa",
        query_dim=DIM,
        key_dim=DIM,
        value_dim=DIM,
        num_heads=HEADS,
        input_linear=GroupedQKVLinear.default_config().set(num_kv_heads=2),
        q_partition_spec=("data", None, "model", None),
        k_partition_spec=("data", None, None, None),
        v_partition_spec=("data", None, None, None),
    )
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, LEN, DIM))
    seen, _ = _observed_shardings(layer, params, x, mesh)
    assert _is(seen["k_proj"], mesh, ("data", None, None, None))
    assert _is(seen["q_proj"], mesh, ("data", None, "model", None))

    bad = _layer(o_partition_spec=("data", None, None, None))
    with pytest.raises(ValueError, match=r"attn\.o_partition_spec=.*4 entries.*\(2, 6, 16\)"):
        functional(bad, None, params, dict(query=x), is_training=False)
