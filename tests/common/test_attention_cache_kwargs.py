"""Tests of axlearn.common.attention.cache_kwargs: `init_states(batch_size=, max_len=, dtype=)`
on the attention/transformer stack returns the empty state of the `time_step=None, data=spec`
form (the state only)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.attention import (
    MultiheadAttention,
    RepeatedTransformerLayer,
    StackedTransformerLayer,
    TransformerLayer,
)
from axlearn.common.module import functional

D = 8


def _layer_cfg():
    cfg = TransformerLayer.default_config().set(input_dim=D)
    cfg.self_attention.attention.set(num_heads=2, causal=True)
    cfg.feed_forward.set(hidden_dim=16)
    return cfg


def _stacks():
    return [
        _layer_cfg().set(name="layer"),
        StackedTransformerLayer.default_config().set(
            name="stack", input_dim=D, num_layers=2, layer=_layer_cfg()
        ),
        RepeatedTransformerLayer.default_config().set(
            name="repeat", input_dim=D, num_layers=2, layer=_layer_cfg()
        ),
    ]


def _init_states(layer, **kwargs):
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    out, _ = functional(layer, None, params, kwargs, method="init_states", is_training=False)
    return out


def _assert_tree_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_sizes_form_equals_spec_form(index):
    layer = _stacks()[index].instantiate(parent=None)
    spec = jax.ShapeDtypeStruct((3, 5, D), jnp.float32)
    expected, out = _init_states(layer, time_step=None, data=spec)
    assert out is None
    actual = _init_states(layer, batch_size=3, max_len=5)
    _assert_tree_equal(actual, expected)
    cast = _init_states(layer, batch_size=3, max_len=5, dtype=jnp.bfloat16)
    for got, want in zip(jax.tree.leaves(cast), jax.tree.leaves(expected)):
        want_dtype = jnp.bfloat16 if jnp.issubdtype(want.dtype, jnp.floating) else want.dtype
        assert got.dtype == want_dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert {x.dtype for x in jax.tree.leaves(cast)} == {
        jnp.dtype(jnp.bfloat16),
        jnp.dtype(jnp.int32),
    }


def test_multihead_attention_sizes_form():
    cfg = MultiheadAttention.default_config().set(
        name="attn", query_dim=D, key_dim=D, value_dim=D, num_heads=2, causal=True
    )
    layer = cfg.instantiate(parent=None)
    expected, _ = _init_states(
        layer, time_step=None, query=jax.ShapeDtypeStruct((2, 4, D), jnp.float32)
    )
    actual = _init_states(layer, batch_size=2, max_len=4)
    _assert_tree_equal(actual, expected)
    assert list(actual) == ["time_step", "kv_cache"]
    # KVCache buffers are [batch, num_kv_heads, per_head_dim, max_len].
    assert actual["kv_cache"]["key"].shape == (2, 2, D // 2, 4)


def test_errors():
    layer = _stacks()[1].instantiate(parent=None)
    with pytest.raises(ValueError, match="batch_size and max_len go together"):
        _init_states(layer, batch_size=2)
    with pytest.raises(ValueError, match="do not also pass time_step or data"):
        _init_states(layer, batch_size=2, max_len=3, data=jnp.zeros((2, 3, D)))


@pytest.mark.parametrize("cache_dtype", [None, jnp.bfloat16])
def test_kv_cache_field_sets_cache_dtype_and_decodes_like_forward(cache_dtype):
    """attention.kv_cache = KVCache(cache_dtype=...): the cache (of a nested RoPE + grouped
    projection) stores in that dtype; step-by-step decoding equals the full causal forward pass."""
    from axlearn.common.attention import (
        FusedGroupedQKVLinear,
        GroupedQueryAttention,
        KVCache,
        RoFormerQKVLinear,
    )

    qkv = RoFormerQKVLinear.default_config().set(
        input_linear=FusedGroupedQKVLinear.default_config().set(num_kv_heads=1), rotary_value=False
    )
    cfg = GroupedQueryAttention.default_config().set(
        name="attn",
        query_dim=D,
        key_dim=D,
        value_dim=D,
        num_heads=2,
        causal=True,
        input_linear=qkv,
    )
    if cache_dtype is not None:
        cfg.kv_cache = KVCache.default_config().set(cache_dtype=cache_dtype)
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    query = jax.random.normal(jax.random.PRNGKey(1), (2, 5, D))
    full, _ = functional(layer, None, params, dict(query=query), is_training=False)
    cache, _ = functional(
        layer, None, params, dict(batch_size=2, max_len=5), method="init_states", is_training=False
    )
    assert cache["kv_cache"]["key"].dtype == (cache_dtype or jnp.float32)
    steps = []
    for t in range(5):
        (cache, out), _ = functional(
            layer,
            None,
            params,
            dict(cached_states=cache, query=query[:, t : t + 1]),
            method="extend_step",
            is_training=False,
        )
        steps.append(out.data)
    tol = 2e-2 if cache_dtype is not None else 1e-5
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full.data, atol=tol, rtol=tol)
