"""Mask helpers re-exported by `axlearn.common.utils`: `safe_not`, `sequence_mask`."""

import jax
from jax import numpy as jnp


def safe_not(mask: jax.Array) -> jax.Array:
    """Logical not of a mask of any dtype: True where `mask` is zero (or False).

    Unlike `~mask` (bitwise on integers) or `1 - mask`, it gives a bool result for bool, integer
    and float masks alike.

    Args:
        mask: A tensor; non-zero entries count as True.

    Returns:
        A bool tensor of the same shape.
    """
    return jnp.logical_not(jnp.asarray(mask).astype(jnp.bool_))


def sequence_mask(*, lengths: jax.Array, max_len: int, dtype=None) -> jax.Array:
    """Returns `mask[..., t] = t < lengths[...]` for t in [0, max_len).

    Args:
        lengths: Integer lengths of any shape [...].
        max_len: The size of the new last axis.
        dtype: The mask dtype (None: bool).

    Returns:
        A [..., max_len] mask, 1 (True) at valid positions.
    """
    mask = jnp.arange(max_len) < jnp.asarray(lengths)[..., None]
    return mask if dtype is None else mask.astype(dtype)
