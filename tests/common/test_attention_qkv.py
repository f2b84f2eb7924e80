"""Tests of axlearn.common.attention.qkv: RoFormerQKVLinear's query_scale, key_scale and
partial_rope_factor against a NumPy reference."""

import jax
import numpy as np
import pytest

from axlearn.common.attention import (
    RoFormerQKVLinear,
    ScaleKey,
    ScaleQuery,
    constant_scale_fn,
)
from axlearn.common.config import config_for_function
from axlearn.common.module import functional

DIM, HEADS, HEAD_DIM, THETA = 8, 2, 8, 10000.0


def _np_rope(x, positions, rotary_dim):
    """Rotates channel pairs (2j, 2j+1), j < rotary_dim/2, by position * theta^(-2j/rotary_dim)."""
    out = np.array(x, np.float64)
    for j in range(rotary_dim // 2):
        angle = positions[:, :, None] * THETA ** (-2.0 * j / rotary_dim)  # [B, T, 1]
        a, b = x[..., 2 * j], x[..., 2 * j + 1]
        out[..., 2 * j] = a * np.cos(angle) - b * np.sin(angle)
        out[..., 2 * j + 1] = b * np.cos(angle) + a * np.sin(angle)
    return out


def _np_proj(params, x):
    return np.einsum("btd,dnh->btnh", x, params["weight"]) + params["bias"]


def _layer(**kw):
    cfg = RoFormerQKVLinear.default_config().set(
        name="rope",
        query_dim=DIM,
        key_dim=DIM,
        value_dim=DIM,
        num_heads=HEADS,
        per_head_dim=HEAD_DIM,
        rotary_value=False,
        **kw,
    )
    layer = cfg.instantiate(parent=None)
    return layer, layer.initialize_parameters_recursively(jax.random.PRNGKey(0))


def _run(layer, params, x, positions=None):
    out, _ = functional(
        layer, None, params, dict(query=x, query_positions=positions), is_training=False
    )
    return out


@pytest.fixture(name="x")
def fixture_x():
    return jax.random.normal(jax.random.PRNGKey(1), (2, 5, DIM))


def test_factor_one_equals_default_path(x):
    layer_none, params = _layer()
    layer_one, params_one = _layer(partial_rope_factor=1.0)
    out_none, out_one = _run(layer_none, params, x), _run(layer_one, params, x)
    assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, params_one)
    for a, b in zip(out_none, out_one):
        np.testing.assert_array_equal(a, b)
    positions = np.tile(np.arange(5), (2, 1)).astype(np.float64)
    p = jax.tree.map(np.asarray, params["i_proj"])
    xn = np.asarray(x, np.float64)
    np.testing.assert_allclose(
        out_none.query, _np_rope(_np_proj(p["q_proj"], xn), positions, HEAD_DIM), atol=1e-5
    )


@pytest.mark.parametrize("factor,rotary_dim", [(0.5, 4), (0.25, 2), (0.75, 6)])
def test_partial_rope_against_numpy(x, factor, rotary_dim):
    layer, params = _layer(partial_rope_factor=factor)
    positions = np.array([[3, 0, 7, 1, 2], [10, 11, 12, 13, 14]])
    out = _run(layer, params, x, positions)
    p = jax.tree.map(np.asarray, params["i_proj"])
    xn = np.asarray(x, np.float64)
    q, k, v = (_np_proj(p[n], xn) for n in ("q_proj", "k_proj", "v_proj"))
    np.testing.assert_allclose(out.query, _np_rope(q, positions, rotary_dim), atol=1e-5)
    np.testing.assert_allclose(out.key, _np_rope(k, positions, rotary_dim), atol=1e-5)
    np.testing.assert_allclose(out.value, v, atol=1e-5)
    # The channels past rotary_dim are the plain projections.
    np.testing.assert_allclose(out.query[..., rotary_dim:], q[..., rotary_dim:], atol=1e-5)


def test_query_and_key_scale_applied(x):
    layer, params = _layer(
        query_scale=ScaleQuery.default_config(),
        key_scale=ScaleKey.default_config().set(
            scale_factor=config_for_function(constant_scale_fn).set(value=3.0)
        ),
        partial_rope_factor=0.5,
    )
    out = _run(layer, params, x)
    positions = np.tile(np.arange(5), (2, 1))
    p = jax.tree.map(np.asarray, params["i_proj"])
    xn = np.asarray(x, np.float64)
    q = _np_proj(p["q_proj"], xn) * HEAD_DIM**-0.5
    k = _np_proj(p["k_proj"], xn) * 3.0
    np.testing.assert_allclose(out.query, _np_rope(q, positions, 4), atol=1e-5)
    np.testing.assert_allclose(out.key, _np_rope(k, positions, 4), atol=1e-5)


def test_new_fields_default_out_of_dump():
    text = RoFormerQKVLinear.default_config().debug_string()
    for field in ("query_scale", "key_scale", "partial_rope_factor"):
        assert field not in text


@pytest.mark.parametrize("factor", [0.0, 1.5, 0.1, 0.375])
def test_bad_partial_rope_factor(factor):
    with pytest.raises(ValueError, match="partial_rope_factor"):
        _layer(partial_rope_factor=factor)
