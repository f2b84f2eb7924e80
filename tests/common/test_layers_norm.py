"""Tests of axlearn/common/layers_norm.py (GroupNorm, BatchNorm, L2Norm) against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.layers import (
    BatchNorm,
    GroupNorm,
    L2Norm,
    NormType,
    RMSNorm,
    _compute_moments_with_segment_ids,
    compute_mean_square_with_segment_ids,
)
from axlearn.common.module import functional as F


def _run(layer, params, x, *, is_training=False, paddings=None):
    inputs = dict(x=x) if paddings is None else dict(x=x, paddings=paddings)
    return F(
        layer,
        prng_key=jax.random.PRNGKey(0),
        state=params,
        inputs=inputs,
        is_training=is_training,
    )


def test_l2_norm():
    layer = L2Norm.default_config().set(name="n", input_dim=3).instantiate(parent=None)
    x = jnp.asarray([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0]])
    out, _ = _run(layer, {}, x)
    np.testing.assert_allclose(out, [[0.6, 0.8, 0.0], [0.0, 0.0, 0.0]], atol=1e-6)
    assert str(L2Norm.default_config().klass) == "<class 'axlearn.common.layers.L2Norm'>"


def test_group_norm_with_paddings_matches_numpy():
    cfg = GroupNorm.default_config().set(name="gn", input_dim=4, num_groups=2, eps=1e-6)
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    params = {"scale": jnp.asarray([1.0, 2.0, 0.5, 1.0]), "bias": jnp.asarray([0, 1.0, 0, -1])}
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 5, 4))
    paddings = jnp.asarray([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]])
    out, _ = _run(layer, params, x, paddings=paddings)
    xn = np.asarray(x, np.float64)
    want = np.zeros_like(xn)
    for b in range(2):
        live = np.asarray(paddings[b]) == 0
        for g in range(2):
            block = xn[b][:, 2 * g : 2 * g + 2]
            mean, var = block[live].mean(), block[live].var()
            want[b][:, 2 * g : 2 * g + 2] = (block - mean) / np.sqrt(var + 1e-6)
    want = want * np.asarray(params["scale"]) + np.asarray(params["bias"])
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    assert "klass: 'axlearn.common.layers.GroupNorm'" in str(cfg)
    with pytest.raises(ValueError, match=r"num_groups \(3\) must be positive and divide"):
        cfg.clone(num_groups=3).instantiate(parent=None)


def test_group_norm_rmsnorm_type_and_norm_axes_match_numpy():
    """NormType.RMSNORM: x / rms over (time, group channels) with paddings; scale only."""
    cfg = GroupNorm.default_config().set(
        name="gn", input_dim=4, num_groups=2, eps=1e-6, norm_type=NormType.RMSNORM
    )
    assert cfg.norm_type is NormType.RMSNORM and "norm_type: <NormType.RMSNORM" in str(cfg)
    assert GroupNorm.default_config().norm_type is NormType.LAYERNORM
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    assert sorted(params) == ["scale"]  # No bias for RMS normalization.
    params = {"scale": jnp.asarray([1.0, 2.0, 0.5, 1.0])}
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 5, 4))
    paddings = jnp.asarray([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]])
    out, _ = _run(layer, params, x, paddings=paddings)
    xn = np.asarray(x, np.float64)
    want = np.zeros_like(xn)
    for b in range(2):
        live = np.asarray(paddings[b]) == 0
        for g in range(2):
            block = xn[b][:, 2 * g : 2 * g + 2]
            want[b][:, 2 * g : 2 * g + 2] = block / np.sqrt(np.mean(block[live] ** 2) + 1e-6)
    np.testing.assert_allclose(out, want * np.asarray(params["scale"]), rtol=1e-4, atol=1e-5)

    # norm_axes=-1: each time step's group alone (the group channels only).
    layer = cfg.clone(norm_axes=-1).instantiate(parent=None)
    out, _ = _run(layer, params, x)
    grouped = xn.reshape(2, 5, 2, 2)
    want = grouped / np.sqrt(np.mean(grouped**2, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(
        out, want.reshape(2, 5, 4) * np.asarray(params["scale"]), rtol=1e-4, atol=1e-5
    )
    for bad in (0, 2, (1, -2)):
        layer = cfg.clone(norm_axes=bad).instantiate(parent=None)
        with pytest.raises(ValueError, match=r"gn.norm_axes=.*should not normalize along"):
            _run(layer, params, x)


def test_batch_norm_training_updates_moving_stats_and_eval_uses_them():
    cfg = BatchNorm.default_config().set(name="bn", input_dim=2, decay=0.9, eps=1e-5)
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(params["moving_mean"], [0, 0])
    np.testing.assert_array_equal(params["moving_variance"], [1, 1])
    x = jnp.asarray([[[1.0, 10.0], [3.0, 14.0]], [[5.0, 12.0], [100.0, -50.0]]])
    paddings = jnp.asarray([[0, 0], [0, 1]])  # The last position is padding.
    out, collection = _run(layer, params, x, is_training=True, paddings=paddings)
    live = np.asarray([[1.0, 10.0], [3.0, 14.0], [5.0, 12.0]])
    mean, var = live.mean(0), live.var(0)
    np.testing.assert_allclose(out[0, 0], (live[0] - mean) / np.sqrt(var + 1e-5), rtol=1e-5)
    updates = collection.state_updates
    np.testing.assert_allclose(updates["moving_mean"], 0.1 * mean, rtol=1e-5)
    np.testing.assert_allclose(updates["moving_variance"], 0.9 + 0.1 * var, rtol=1e-5)
    params = dict(params, **updates)
    out, _ = _run(layer, params, x)
    want = (np.asarray(x) - 0.1 * mean) / np.sqrt(0.9 + 0.1 * var + 1e-5)
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_segment_ids_leave_out_positions_like_paddings():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 6)).astype(np.float32) * 3 + 1
    segment_ids = np.array([[1, 1, 0, 0], [2, 2, 2, 1], [0, 0, 0, 0]])
    # NumPy moments over the time and feature axes of the valid positions of each example.
    mean, var = _compute_moments_with_segment_ids(
        x=jnp.asarray(x), segment_ids=jnp.asarray(segment_ids), reduction_axis=[1, -1]
    )
    msq = compute_mean_square_with_segment_ids(
        x=jnp.asarray(x), segment_ids=jnp.asarray(segment_ids), reduction_axis=[1, -1]
    )
    for b in range(3):
        valid = x[b][segment_ids[b] != 0]
        ref_mean = valid.mean() if valid.size else 0.0
        ref_var = valid.var() if valid.size else 0.0
        ref_msq = (valid**2).mean() if valid.size else 0.0
        np.testing.assert_allclose(mean[b, 0, 0], ref_mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(var[b, 0, 0], ref_var, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(msq[b, 0, 0], ref_msq, rtol=1e-5, atol=1e-6)
    layer = GroupNorm.default_config().set(name="gn", input_dim=6, num_groups=2)
    layer = layer.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    with_ids, _ = F(
        layer, None, params, dict(x=jnp.asarray(x), segment_ids=segment_ids), is_training=False
    )
    with_paddings, _ = F(
        layer, None, params, dict(x=jnp.asarray(x), paddings=segment_ids == 0), is_training=False
    )
    np.testing.assert_allclose(with_ids, with_paddings, atol=1e-6)


def test_rms_norm_zero_centered_and_l2_norm_without_input_dim():
    x = np.random.default_rng(3).standard_normal((2, 6)).astype(np.float32) + 5.0
    layer = RMSNorm.default_config().set(name="n", input_dim=6, zero_centered=True)
    layer = layer.instantiate(parent=None)
    params = dict(scale=jnp.linspace(0.5, 1.5, 6))
    out, _ = F(layer, None, params, [jnp.asarray(x)], is_training=False)
    eps = layer.config.eps
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt((x**2).mean(-1, keepdims=True) + eps)
    np.testing.assert_allclose(out, ref * np.asarray(params["scale"]), rtol=1e-5, atol=1e-6)
    l2 = L2Norm.default_config().set(name="l2").instantiate(parent=None)
    out, _ = F(l2, None, {}, [jnp.asarray(x)], is_training=False)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), 1.0, rtol=1e-5)
