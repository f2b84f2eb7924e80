"""Int8 dot products: symmetric int8 quantization of both operands, float gradients.

Each operand is quantized per slice along its contracting axes: for every index of the
non-contracting axes, scale = max|x| over the contracting axes / 127 and q = round(x / scale)
in [-127, 127]. The integer products are accumulated exactly (int32 range) and rescaled. The
gradient is the straight-through estimator: the gradient of the float dot product at the
quantized operands (AXLearn's int8 path, through the `aqt` library, additionally rounds the
gradients stochastically; this one keeps them in float).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
from jax import numpy as jnp

from axlearn.common.utils import Tensor

_INT8_MAX = 127.0


def quantize_dequantize_int8(x: Tensor, contracting_axes: tuple[int, ...]) -> Tensor:
    """Returns x rounded to 255 symmetric levels per slice along `contracting_axes`.

    Args:
        x: The operand.
        contracting_axes: The axes reduced by the dot product.

    Returns:
        The dequantized tensor (same shape and dtype as x).
    """
    xf = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(xf), axis=tuple(contracting_axes), keepdims=True)
    scale = jnp.where(amax > 0, amax / _INT8_MAX, 1.0)
    q = jnp.clip(jnp.round(xf / scale), -_INT8_MAX, _INT8_MAX)
    return (q * scale).astype(x.dtype)


def int8_dot_general(
    lhs: Tensor,
    rhs: Tensor,
    dimension_numbers: jax.lax.DotDimensionNumbers,
    precision: jax.lax.PrecisionLike = None,
    preferred_element_type: Optional[Any] = None,
) -> Tensor:
    """`jax.lax.dot_general` of the int8-quantized operands, straight-through gradients.

    Args:
        lhs: Left operand.
        rhs: Right operand.
        dimension_numbers: As `jax.lax.dot_general`.
        precision: As `jax.lax.dot_general`.
        preferred_element_type: As `jax.lax.dot_general`.

    Returns:
        The product.
    """
    (lhs_contract, rhs_contract), _ = dimension_numbers

    def straight_through(x, axes):
        return x + jax.lax.stop_gradient(quantize_dequantize_int8(x, axes) - x)

    return jax.lax.dot_general(
        straight_through(lhs, tuple(lhs_contract)),
        straight_through(rhs, tuple(rhs_contract)),
        dimension_numbers,
        precision=precision,
        preferred_element_type=preferred_element_type,
    )
