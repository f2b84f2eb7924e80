"""Helpers of the quantized dot products (AXLearn's `quantized_dot_general.utils` names)."""

from __future__ import annotations

import jax
from jax import numpy as jnp

from axlearn.common.utils import Tensor


def is_einsum_swapped_operands(subscripts: str, activation: Tensor, kernel: Tensor) -> bool:
    """Whether `jnp.einsum(subscripts, activation, kernel)` calls dot_general as (kernel, act).

    `jnp.einsum` may pass its two operands to dot_general in the reverse order when that spares
    a transpose of the result; a quantized dot product must know which side is the activation.
    This traces the einsum abstractly (shapes only) and looks at the operands' shapes.

    Args:
        subscripts: The einsum subscripts of two operands.
        activation: The activation operand (first in `subscripts`).
        kernel: The kernel operand (second in `subscripts`).

    Returns:
        True when dot_general receives the kernel first. False also when both operands have the
        same shape (the order cannot be told apart by shapes).
    """
    calls = []

    def probe(lhs, rhs, *args, **kwargs):
        calls.append((tuple(lhs.shape), tuple(rhs.shape)))
        return jax.lax.dot_general(lhs, rhs, *args, **kwargs)

    jax.eval_shape(
        lambda a, k: jnp.einsum(subscripts, a, k, _dot_general=probe),
        jax.ShapeDtypeStruct(activation.shape, activation.dtype),
        jax.ShapeDtypeStruct(kernel.shape, kernel.dtype),
    )
    if len(calls) != 1 or tuple(activation.shape) == tuple(kernel.shape):
        return False
    lhs_shape, rhs_shape = calls[0]
    return lhs_shape == tuple(kernel.shape) and rhs_shape == tuple(activation.shape)
