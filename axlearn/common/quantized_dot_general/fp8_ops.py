"""FP8 dot products with delayed scaling (the math behind `QuantizedDotGeneral`'s FP_8 type).

A tensor x is stored in fp8 as q = clip(x / scale, -fmax, fmax) rounded to the fp8 format, and
read back as q * scale. The forward pass quantizes both operands to `float8_e4m3fn` (fmax 448,
3 mantissa bits); the backward pass quantizes the output gradient to `float8_e5m2` (fmax 57344,
2 mantissa bits, more range for gradients) and computes both operand gradients from the fp8
values.

Delayed scaling: each quantized tensor has an amax history (the max |x| of its last L steps,
newest first) and a scale. A step uses

    scale = max(history) / fmax          (or the previous scale when max(history) is 0/inf/nan)

and then records max|x| of this step at the front of the history (dropping the oldest entry).
So the scale of step t comes from steps t-L..t-1 only: no reduction over the tensor is needed
before the matmul. Without a history (`amax_history=None`) the scale comes from the current
tensor (in-batch scaling).

The new scales and histories leave `fp8_dot_general` as the cotangents of its scale/history
arguments: a learner that replaces those parameters by their "gradients" (see
`update_transformation.OverrideInplaceUpdateTransformation`, installed by
`trainer_config_modifier.FP8ConfigModifier`) carries them from step to step in the training
state. A layer called several times in one forward pass gets the sum of its calls' cotangents,
which is not a valid history: call each fp8 layer once per step (as the Fuji layers do), and do
not combine with gradient accumulation (minibatch histories would be averaged).

The fp8 rounding is exact on every backend (XLA's fp8 conversions); the products of the rounded
values are accumulated in `preferred_element_type` (default: the operands' dtype). On GPUs XLA
rewrites the dequantize-then-dot pattern into an fp8 GEMM; elsewhere it is emulated.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Optional

import jax
from jax import numpy as jnp

from axlearn.common.utils import Tensor

# The forward (operands) and backward (output gradient) formats.
FWD_DTYPE = jnp.float8_e4m3fn
BWD_DTYPE = jnp.float8_e5m2


def fp8_max(dtype: Any) -> float:
    """Returns the largest finite value of the fp8 `dtype` (448 for e4m3fn, 57344 for e5m2)."""
    return float(jnp.finfo(dtype).max)


def update_amax_history(x: Tensor, amax_history: Tensor) -> Tensor:
    """Returns the history with max|x| inserted at the front and the oldest entry dropped.

    Args:
        x: The tensor of this step.
        amax_history: Float32 vector [L], newest first.

    Returns:
        [max|x|, amax_history[0], ..., amax_history[L-2]].
    """
    amax = jnp.max(jnp.abs(x)).astype(amax_history.dtype)
    return jnp.concatenate([amax[None], amax_history[:-1]])


def compute_scale(amax: Tensor, prev_scale: Tensor, dtype: Any) -> Tensor:
    """Returns amax / fmax(dtype), or `prev_scale` where amax is 0 or not finite.

    Args:
        amax: Scalar, the largest magnitude to represent.
        prev_scale: Scalar, the scale to keep when `amax` gives none.
        dtype: The fp8 format.

    Returns:
        The scale (same dtype as `prev_scale`).
    """
    amax = amax.astype(jnp.float32)
    scale = amax / fp8_max(dtype)
    ok = jnp.logical_and(amax > 0, jnp.isfinite(amax))
    return jnp.where(ok, scale, prev_scale.astype(jnp.float32)).astype(prev_scale.dtype)


def quantize(x: Tensor, scale: Tensor, dtype: Any) -> Tensor:
    """Returns x / scale clipped to the finite range of `dtype` and rounded to `dtype`."""
    limit = fp8_max(dtype)
    scaled = x.astype(jnp.float32) / scale.astype(jnp.float32)
    return jnp.clip(scaled, -limit, limit).astype(dtype)


def dequantize(q: Tensor, scale: Tensor, dtype: Any) -> Tensor:
    """Returns q * scale in `dtype`."""
    return (q.astype(jnp.float32) * scale.astype(jnp.float32)).astype(dtype)


def _next_scale(
    x: Tensor, scale: Tensor, amax_history: Optional[Tensor], dtype: Any
) -> tuple[Tensor, Optional[Tensor]]:
    """Returns (the scale to use for x this step, the updated history or None)."""
    if amax_history is None:
        return compute_scale(jnp.max(jnp.abs(x)), scale, dtype), None
    new_scale = compute_scale(jnp.max(amax_history), scale, dtype)
    return new_scale, update_amax_history(x, amax_history)


def _forward(lhs, rhs, scales, histories, dimension_numbers, precision, preferred_element_type):
    lhs_scale, rhs_scale, _ = scales
    lhs_history, rhs_history, _ = histories
    new_lhs_scale, new_lhs_history = _next_scale(lhs, lhs_scale, lhs_history, FWD_DTYPE)
    new_rhs_scale, new_rhs_history = _next_scale(rhs, rhs_scale, rhs_history, FWD_DTYPE)
    q_lhs = quantize(lhs, new_lhs_scale, FWD_DTYPE)
    q_rhs = quantize(rhs, new_rhs_scale, FWD_DTYPE)
    out_dtype = preferred_element_type or jnp.result_type(lhs, rhs)
    out = jax.lax.dot_general(
        dequantize(q_lhs, new_lhs_scale, out_dtype),
        dequantize(q_rhs, new_rhs_scale, out_dtype),
        dimension_numbers,
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
    res = (
        q_lhs,
        q_rhs,
        new_lhs_scale,
        new_rhs_scale,
        new_lhs_history,
        new_rhs_history,
        # Empty arrays carrying the operands' dtypes (residuals must be arrays).
        jnp.zeros((0,), lhs.dtype),
        jnp.zeros((0,), rhs.dtype),
    )
    return out, res


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def fp8_dot_general(
    lhs: Tensor,
    rhs: Tensor,
    scales: tuple[Tensor, Tensor, Tensor],
    amax_histories: tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]],
    dimension_numbers: jax.lax.DotDimensionNumbers,
    precision: jax.lax.PrecisionLike = None,
    preferred_element_type: Optional[Any] = None,
) -> Tensor:
    """`jax.lax.dot_general(lhs, rhs)` computed from fp8 operands (e4m3), fp8 gradients (e5m2).

    Args:
        lhs: Left operand.
        rhs: Right operand.
        scales: (lhs, rhs, output gradient) scales of the previous step, float32 scalars.
        amax_histories: (lhs, rhs, output gradient) amax histories, float32 [L] each, or all
            None for in-batch scaling.
        dimension_numbers: As `jax.lax.dot_general`.
        precision: As `jax.lax.dot_general`.
        preferred_element_type: Accumulation/output dtype; None: the operands' dtype.

    Returns:
        The product. Under differentiation, the cotangents of `scales` and `amax_histories` are
        this step's new scales and histories (see the module docstring).
    """
    out, _ = _forward(
        lhs, rhs, scales, amax_histories, dimension_numbers, precision, preferred_element_type
    )
    return out


def _fp8_fwd(lhs, rhs, scales, amax_histories, dimension_numbers, precision, pet):
    out, res = _forward(lhs, rhs, scales, amax_histories, dimension_numbers, precision, pet)
    return out, (res, scales[2], amax_histories[2])


def _fp8_bwd(dimension_numbers, precision, preferred_element_type, residuals, g):
    res, g_scale, g_history = residuals
    q_lhs, q_rhs, lhs_scale, rhs_scale, lhs_history, rhs_history, lhs_like, rhs_like = res
    new_g_scale, new_g_history = _next_scale(g, g_scale, g_history, BWD_DTYPE)
    compute_dtype = g.dtype
    g_dq = dequantize(quantize(g, new_g_scale, BWD_DTYPE), new_g_scale, compute_dtype)
    _, vjp = jax.vjp(
        lambda a, b: jax.lax.dot_general(
            a,
            b,
            dimension_numbers,
            precision=precision,
            preferred_element_type=preferred_element_type,
        ),
        dequantize(q_lhs, lhs_scale, compute_dtype),
        dequantize(q_rhs, rhs_scale, compute_dtype),
    )
    grad_lhs, grad_rhs = vjp(g_dq)
    return (
        grad_lhs.astype(lhs_like.dtype),
        grad_rhs.astype(rhs_like.dtype),
        (lhs_scale, rhs_scale, new_g_scale),
        (lhs_history, rhs_history, new_g_history),
    )


fp8_dot_general.defvjp(_fp8_fwd, _fp8_bwd)
