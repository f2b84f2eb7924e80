"""Normalization helpers on plain tensors (AXLearn's `axlearn.common.normalize`)."""

import jax

from axlearn.common.utils import Tensor


def l2_normalize(x: Tensor, eps: float = 1e-8, axis: int = -1) -> Tensor:
    """Scales `x` to unit L2 norm along `axis`: `x / sqrt(sum(x**2, axis) + eps)`.

    `eps` sits inside the square root, so an all-zero slice stays zero (no NaN) and tiny slices
    are not blown up; with a small `eps` this matches `tf.math.l2_normalize` (which takes the
    max of the squared norm and `eps` instead of adding it).

    Args:
        x: The input tensor.
        eps: Added to the squared norm before the reciprocal square root (>= 0).
        axis: The axis to normalize along (negative counts from the end).

    Returns:
        A tensor of the same shape and dtype as `x`.
    """
    squared_norm = jax.numpy.sum(jax.numpy.square(x), axis=axis, keepdims=True)
    return x * jax.lax.rsqrt(squared_norm + eps)
