"""Tests of axlearn/common/quantized_dot_general/fp8_ops.py against a NumPy/ml_dtypes reference."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common.quantized_dot_general import fp8_ops

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
DN = (((1,), (0,)), ((), ()))  # [b, d] x [d, h] -> [b, h]


def np_qdq(x: np.ndarray, scale: float, dtype, fmax: float) -> np.ndarray:
    """Reference quantize-dequantize: clip(x / scale) rounded to the fp8 format, times scale."""
    q = np.clip(x.astype(np.float32) / np.float32(scale), -fmax, fmax).astype(dtype)
    return q.astype(np.float32) * np.float32(scale)


def _operands(seed=0, b=8, d=32, h=16, x_scale=3.0, w_scale=0.1):
    rng = np.random.RandomState(seed)
    x = (rng.standard_normal((b, d)) * x_scale).astype(np.float32)
    w = (rng.standard_normal((d, h)) * w_scale).astype(np.float32)
    g = (rng.standard_normal((b, h)) * 1e-3).astype(np.float32)
    return x, w, g


def test_fp8_max_values():
    assert fp8_ops.fp8_max(fp8_ops.FWD_DTYPE) == E4M3_MAX
    assert fp8_ops.fp8_max(fp8_ops.BWD_DTYPE) == E5M2_MAX


def test_update_amax_history_and_scale():
    history = jnp.array([5.0, 2.0, 7.0], jnp.float32)
    new = fp8_ops.update_amax_history(jnp.array([[-9.5, 1.0]]), history)
    np.testing.assert_array_equal(np.asarray(new), [9.5, 5.0, 2.0])
    scale = fp8_ops.compute_scale(jnp.max(history), jnp.float32(1.0), fp8_ops.FWD_DTYPE)
    assert float(scale) == np.float32(7.0) / np.float32(448.0)
    # Zero / non-finite amax keeps the previous scale.
    for bad in (0.0, np.inf, np.nan):
        kept = fp8_ops.compute_scale(jnp.float32(bad), jnp.float32(0.25), fp8_ops.FWD_DTYPE)
        assert float(kept) == 0.25


def test_in_batch_forward_matches_numpy():
    x, w, _ = _operands()
    ones = jnp.float32(1.0)
    out = fp8_ops.fp8_dot_general(
        jnp.asarray(x), jnp.asarray(w), (ones, ones, ones), (None, None, None), DN
    )
    sx = np.abs(x).max() / E4M3_MAX
    sw = np.abs(w).max() / E4M3_MAX
    ref = np_qdq(x, sx, ml_dtypes.float8_e4m3fn, E4M3_MAX) @ np_qdq(
        w, sw, ml_dtypes.float8_e4m3fn, E4M3_MAX
    )
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)
    # Within fp8 rounding of the exact product (e4m3: 3 mantissa bits, relative step 2^-3),
    # and not equal to it (the rounding happened).
    exact = x @ w
    err = np.abs(np.asarray(out) - exact)
    bound = 2.0**-3 * (np.abs(x) @ np.abs(w))
    assert np.all(err <= bound)
    assert err.max() > 1e-4


def _step(x, w, g, scales, histories):
    """One forward/backward: returns (out, grads of x and w, new scales, new histories)."""

    def f(x, w, scales, histories):
        out = fp8_ops.fp8_dot_general(x, w, scales, histories, DN)
        return jnp.sum(out * g), out

    (_, out), grads = jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True)(
        x, w, scales, histories
    )
    return out, grads[0], grads[1], grads[2], grads[3]


def test_delayed_scaling_follows_history_exactly():
    length = 3
    scales = tuple(jnp.float32(1.0) for _ in range(3))
    histories = tuple(jnp.zeros((length,), jnp.float32) for _ in range(3))
    ref_hist = {k: np.zeros((length,), np.float32) for k in ("x", "w", "g")}
    ref_scale = {k: np.float32(1.0) for k in ("x", "w", "g")}
    fmax = {"x": E4M3_MAX, "w": E4M3_MAX, "g": E5M2_MAX}
    for step in range(5):
        x, w, g = _operands(seed=step, x_scale=1.0 + step)
        out, gx, gw, scales, histories = _step(
            jnp.asarray(x), jnp.asarray(w), jnp.asarray(g), scales, histories
        )
        # Reference: the scale of this step comes from the history before it.
        for key, value in (("x", x), ("w", w), ("g", g)):
            amax = ref_hist[key].max()
            if amax > 0:
                ref_scale[key] = np.float32(amax) / np.float32(fmax[key])
            ref_hist[key] = np.concatenate([[np.abs(value).max()], ref_hist[key][:-1]])
        for i, key in enumerate(("x", "w", "g")):
            assert float(scales[i]) == ref_scale[key], (step, key)
            np.testing.assert_array_equal(np.asarray(histories[i]), ref_hist[key])
        # Output and gradients against the reference with the same scales.
        xq = np_qdq(x, ref_scale["x"], ml_dtypes.float8_e4m3fn, E4M3_MAX)
        wq = np_qdq(w, ref_scale["w"], ml_dtypes.float8_e4m3fn, E4M3_MAX)
        gq = np_qdq(g, ref_scale["g"], ml_dtypes.float8_e5m2, E5M2_MAX)
        np.testing.assert_allclose(np.asarray(out), xq @ wq, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(gx), gq @ wq.T, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(np.asarray(gw), xq.T @ gq, rtol=1e-5, atol=1e-9)
    # After the first step the scales fit the data: the gradients are within e5m2 rounding
    # (2 mantissa bits) of the exact ones.
    exact_gx = g @ w.T
    assert np.max(np.abs(np.asarray(gx) - exact_gx)) <= 0.3 * np.max(np.abs(exact_gx))


def test_first_step_without_history_clips():
    """With an empty history the scale stays 1: values beyond 448 saturate (delayed scaling)."""
    x = np.full((2, 4), 1000.0, np.float32)
    w = np.eye(4, dtype=np.float32)
    scales = tuple(jnp.float32(1.0) for _ in range(3))
    histories = tuple(jnp.zeros((2,), jnp.float32) for _ in range(3))
    out = fp8_ops.fp8_dot_general(jnp.asarray(x), jnp.asarray(w), scales, histories, DN)
    np.testing.assert_array_equal(np.asarray(out), np.full((2, 4), 448.0))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_dtypes_preserved(dtype):
    x, w, _ = _operands()
    ones = jnp.float32(1.0)

    def f(x, w):
        return jnp.sum(fp8_ops.fp8_dot_general(x, w, (ones, ones, ones), (None, None, None), DN))

    gx, gw = jax.grad(f, argnums=(0, 1))(jnp.asarray(x, dtype), jnp.asarray(w, dtype))
    assert gx.dtype == dtype and gw.dtype == dtype
