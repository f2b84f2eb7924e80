"""Mask functions (`MaskFn`) for attention: causal, windowed, truncated, and their unions.

Part of `axlearn.common.attention_bias`, which re-exports every name here (import them from
there); a `MaskFn` maps broadcastable integer query/key position tensors to a boolean tensor that
is True where the query may attend to the key.
"""

from typing import Protocol, runtime_checkable

import jax.numpy as jnp

from axlearn.common.config import ConfigOr, maybe_instantiate

Tensor = jnp.ndarray


# runtime_checkable: config fields typed `ConfigOr[MaskFn]` accept a plain function (e.g.
# `mask=causal_mask`); the config type check calls isinstance on the protocol.
@runtime_checkable
class MaskFn(Protocol):
    """A function returning True where `query_position` may attend to `key_position`."""

    def __call__(self, query_position: Tensor, key_position: Tensor) -> Tensor:
        """Returns a boolean tensor, the broadcast of the two position tensors."""


def causal_mask(query_position: Tensor, key_position: Tensor) -> Tensor:
    """The causal mask: a query attends to keys at its own or earlier positions.

    Args:
        query_position: Integer tensor of query positions (broadcastable with `key_position`).
        key_position: Integer tensor of key positions.

    Returns:
        Boolean tensor, True where `key_position <= query_position`.
    """
    return query_position >= key_position


def sliding_window_causal_mask(sliding_window_size: int) -> MaskFn:
    """Returns a causal mask limited to the `sliding_window_size` most recent earlier keys.

    A query at position q attends to keys at positions k with `q - sliding_window_size <= k <= q`,
    i.e. to itself and to `sliding_window_size` previous tokens.

    Args:
        sliding_window_size: Number of previous tokens each query may see (>= 0).

    Returns:
        A `MaskFn`.

    Raises:
        ValueError: If `sliding_window_size` is negative.
    """
    if sliding_window_size < 0:
        raise ValueError(f"sliding_window_size must be >= 0, got {sliding_window_size}")

    def mask(query_position: Tensor, key_position: Tensor) -> Tensor:
        delta = query_position - key_position
        return (delta >= 0) & (delta <= sliding_window_size)

    # Lets fused attention kernels recognize the window.
    mask.sliding_window_size = sliding_window_size
    return mask


def causal_mask_fn() -> MaskFn:
    """Returns `causal_mask` (the function `CausalAttentionBias.default_config()` configures)."""
    return causal_mask


def left_right_window_mask(left_context: int, right_context: int) -> MaskFn:
    """Returns a MaskFn attending to `left_context` keys before and `right_context` after.

    A query at position q attends to keys k with `q - left_context <= k <= q + right_context`.

    Args:
        left_context: Keys to the left (non-negative).
        right_context: Keys to the right (non-negative).

    Returns:
        The mask function.

    Raises:
        ValueError: If either context is negative.
    """
    if left_context < 0 or right_context < 0:
        raise ValueError(
            f"left_right_window_mask: left_context={left_context} and "
            f"right_context={right_context} must both be >= 0."
        )

    def mask(query_position: Tensor, key_position: Tensor) -> Tensor:
        offset = key_position - query_position
        return (offset >= -left_context) & (offset <= right_context)

    return mask


def truncated_key_mask(valid_k_len: int) -> MaskFn:
    """Returns a MaskFn that is True only for keys at positions below `valid_k_len`.

    Args:
        valid_k_len: The number of valid keys.

    Returns:
        The mask function.
    """

    def mask(query_position: Tensor, key_position: Tensor) -> Tensor:
        del query_position
        return key_position < valid_k_len

    return mask


def or_masks(*mask_fns: ConfigOr[MaskFn]) -> MaskFn:
    """Returns a MaskFn that is the union of `mask_fns` (functions or their configs).

    Args:
        *mask_fns: One or more mask functions or configs of them.

    Returns:
        The mask function.
    """

    def mask(query_position: Tensor, key_position: Tensor) -> Tensor:
        fns = [maybe_instantiate(fn) for fn in mask_fns]
        result = fns[0](query_position, key_position)
        for fn in fns[1:]:
            result = result | fn(query_position, key_position)
        return result

    return mask


def and_masks(*mask_fns: ConfigOr[MaskFn]) -> MaskFn:
    """Returns a MaskFn that is the intersection of `mask_fns` (functions or their configs).

    Args:
        *mask_fns: One or more mask functions or configs of them.

    Returns:
        The mask function.
    """

    def mask(query_position: Tensor, key_position: Tensor) -> Tensor:
        fns = [maybe_instantiate(fn) for fn in mask_fns]
        result = fns[0](query_position, key_position)
        for fn in fns[1:]:
            result = result & fn(query_position, key_position)
        return result

    return mask
