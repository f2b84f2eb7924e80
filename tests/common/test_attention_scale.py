"""Tests of axlearn.common.attention.scale: PerDimScale and ScaleQuery.per_dim_scale (NumPy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.attention import PerDimScale, ScaleQuery
from axlearn.common.module import functional


def _softplus(x):
    return np.log1p(np.exp(x))


def test_per_dim_scale_identity_at_init_and_numpy():
    layer = PerDimScale.default_config().set(name="s", dim=4).instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(params["param"], np.zeros(4))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 5, 4))
    out, _ = functional(layer, None, params, dict(x=x), is_training=False)
    np.testing.assert_allclose(out, x, rtol=1e-6)
    p = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    out, _ = functional(layer, None, dict(param=jnp.asarray(p)), dict(x=x), is_training=False)
    np.testing.assert_allclose(out, np.asarray(x) * _softplus(p) / _softplus(0.0), rtol=1e-5)
    with pytest.raises(ValueError, match="dim 4"):
        functional(layer, None, params, dict(x=x[..., :3]), is_training=False)


def test_scale_query_per_dim_scale():
    cfg = ScaleQuery.default_config().set(
        name="q", per_head_dim=8, per_dim_scale=PerDimScale.default_config()
    )
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert set(params) == {"per_dim_scale"} and params["per_dim_scale"]["param"].shape == (8,)
    p = np.linspace(-1, 1, 8).astype(np.float32)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 4, 8))
    out, _ = functional(
        layer, None, dict(per_dim_scale=dict(param=jnp.asarray(p))), dict(proj=x), is_training=False
    )
    expected = np.asarray(x) * _softplus(p) / _softplus(0.0) * 8**-0.5
    np.testing.assert_allclose(out, expected, rtol=1e-5)
