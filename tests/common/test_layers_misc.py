"""Tests of the layers in axlearn.common.layers_misc against NumPy."""

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common.layers import (
    DropToken,
    Embedding,
    MaxPool2D,
    MovingAverage,
    MultiLinear,
    SeparableSpaceTimePositionalEmbedding,
    UnitNormLinear,
    VariationalNoise,
)
from axlearn.common.module import functional
from axlearn.common.param_init import FanAxes
from axlearn.common.test_utils import assert_not_allclose


def _run(cfg, inputs, *, params=None, is_training=False):
    layer = cfg.set(name="layer").instantiate(parent=None)
    if params is None:
        params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    out, col = functional(layer, jax.random.PRNGKey(1), params, inputs, is_training=is_training)
    return out, col, params


def test_unit_norm_and_multi_linear():
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    out, _, params = _run(UnitNormLinear.default_config().set(input_dim=3, output_dim=2), [x])
    w = np.asarray(params["weight"])
    np.testing.assert_allclose(out, x @ (w / np.linalg.norm(w, axis=0)), rtol=1e-5)
    cfg = MultiLinear.default_config().set(input_dim=3, num_outputs=4, output_dim=5)
    out, _, params = _run(cfg, [x])
    ref = np.einsum("bd,dnh->bnh", x, np.asarray(params["weight"])) + np.asarray(params["bias"])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    layer = cfg.instantiate(parent=None)
    spec = layer._create_layer_parameter_specs()["weight"]  # pylint: disable=protected-access
    assert layer._compute_fan_axes("weight", spec) == FanAxes(in_axis=0, out_axis=(1, 2))  # pylint: disable=protected-access


def test_max_pool_2d():
    x = np.random.default_rng(1).standard_normal((2, 5, 6, 3)).astype(np.float32)
    cfg = MaxPool2D.default_config().set(window=(2, 3), strides=(2, 1))
    out, _, _ = _run(cfg, [x])
    ref = np.stack(
        [
            np.stack([x[:, i : i + 2, j : j + 3].max(axis=(1, 2)) for j in range(4)], axis=1)
            for i in range(0, 4, 2)
        ],
        axis=1,
    )
    np.testing.assert_allclose(out, ref)
    assert list(out.shape) == cfg.instantiate(parent=None).output_shape(input_shape=x.shape)


def test_drop_token():
    x = jnp.arange(2 * 10 * 1, dtype=jnp.float32).reshape(2, 10, 1)
    cfg = DropToken.default_config().set(rate=0.5, num_cls_tokens=2)
    out, _, _ = _run(cfg, [x], is_training=True)
    assert out.shape == (2, 2 + 4, 1)
    np.testing.assert_array_equal(out[:, :2], x[:, :2])
    for b in range(2):
        kept = np.asarray(out[b, 2:, 0])
        assert np.all(np.diff(kept) > 0) and set(kept) <= set(np.asarray(x[b, 2:, 0]))
    same, _, _ = _run(cfg, [x], is_training=False)
    np.testing.assert_array_equal(same, x)


def test_moving_average():
    cfg = MovingAverage.default_config().set(min_weight=0.25)
    layer = cfg.set(name="avg").instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    values = [1.0, 3.0, 2.0, 6.0, 10.0, 0.0]
    ref = 0.0
    for i, v in enumerate(values, start=1):
        out, col = functional(layer, None, params, dict(x=jnp.float32(v)), is_training=True)
        ref += max(1 / i, 0.25) * (v - ref)
        np.testing.assert_allclose(out, ref, rtol=1e-6)
        params = col.state_updates
    assert int(params["count"]) == len(values)


def test_variational_noise():
    params = dict(a=jnp.zeros((200,)), b=dict(c=jnp.zeros((200,))))
    noise = VariationalNoise.default_config().set(vn_std=2.0).instantiate()
    noisy = noise.apply(jax.random.PRNGKey(0), params)
    a, c = np.asarray(noisy["a"]), np.asarray(noisy["b"]["c"])
    assert abs(a.std() - 2.0) < 0.3 and abs(np.corrcoef(a, c)[0, 1]) < 0.2
    assert_not_allclose(a, c)
    off = VariationalNoise.default_config().set(vn_std=0.0).instantiate()
    assert off.apply(jax.random.PRNGKey(0), params) is params
    with pytest.raises(AssertionError, match="Arrays are close"):
        assert_not_allclose(a, a)


def test_separable_space_time_positional_embedding():
    cfg = SeparableSpaceTimePositionalEmbedding.default_config().set(
        dim=4,
        spatial_embeddings=Embedding.default_config().set(num_embeddings=6),
        temporal_embeddings=Embedding.default_config().set(num_embeddings=3),
    )
    positions = np.array([[0, 4], [17, 8]])
    out, _, params = _run(cfg, [positions])
    spatial = np.asarray(params["spatial"]["weight"])
    temporal = np.asarray(params["temporal"]["weight"])
    ref = spatial[positions // 3] + temporal[positions % 3]
    np.testing.assert_allclose(out, ref, rtol=1e-6)
