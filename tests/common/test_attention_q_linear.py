"""Tests of axlearn.common.attention.q_linear: QLinear against NumPy."""

import jax
import numpy as np
import pytest

from axlearn.common.attention import KVState, QLinear
from axlearn.common.module import functional


def _layer():
    cfg = QLinear.default_config().set(
        name="q", query_dim=6, key_dim=6, value_dim=6, num_heads=3, per_head_dim=4
    )
    layer = cfg.instantiate(parent=None)
    return layer, layer.initialize_parameters_recursively(jax.random.PRNGKey(0))


def test_q_linear_projects_query_and_passes_kv_state():
    layer, params = _layer()
    assert set(params) == {"q_proj"}
    assert params["q_proj"]["weight"].shape == (6, 3, 4)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 6))
    k = jax.random.normal(jax.random.PRNGKey(2), (2, 7, 1, 4))
    v = jax.random.normal(jax.random.PRNGKey(3), (2, 7, 1, 4))
    out, _ = functional(
        layer, None, params, dict(query=x, kv_state=KVState(k, v)), is_training=False
    )
    w, b = np.asarray(params["q_proj"]["weight"]), np.asarray(params["q_proj"]["bias"])
    expected = np.einsum("btd,dnh->btnh", np.asarray(x, np.float64), w) + b
    np.testing.assert_allclose(out.query, expected, atol=1e-5)
    assert out.key is k and out.value is v


def test_q_linear_errors():
    layer, params = _layer()
    x = np.zeros((1, 2, 6), np.float32)
    with pytest.raises(ValueError, match="requires kv_state"):
        functional(layer, None, params, dict(query=x), is_training=False)
    kv = KVState(np.zeros((1, 2, 1, 4)), np.zeros((1, 2, 1, 4)))
    with pytest.raises(ValueError, match="only from kv_state"):
        functional(layer, None, params, dict(query=x, key=x, kv_state=kv), is_training=False)
    with pytest.raises(NotImplementedError, match="kv_state"):
        _ = layer.num_kv_heads
