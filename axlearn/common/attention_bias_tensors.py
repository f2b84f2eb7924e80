"""Attention-logit biases as plain tensors: masks to biases, causal/segment/padding biases, sums.

`NEG_INF` disconnects a (query, key) pair; a bias has 2 to 4 dimensions ([target, source] up to
[batch, num_heads, target, source]). Public under `axlearn.common.attention_bias` too, where the
lazy bias objects built from these helpers live.
"""

from typing import Optional

import jax.numpy as jnp

from axlearn.common.attention_mask_fns import MaskFn, causal_mask, sliding_window_causal_mask

Tensor = jnp.ndarray

# The bias that disconnects a (query, key) pair.
NEG_INF = -1e15


def bool_to_bias(mask: Optional[Tensor], dtype=jnp.float32) -> Optional[Tensor]:
    """Converts a boolean mask (True = attend) to an additive bias (0 or NEG_INF).

    Args:
        mask: Boolean tensor, or None.
        dtype: Float dtype of the result.

    Returns:
        A tensor of the same shape: 0 where `mask` is True, `NEG_INF` elsewhere (None for None).
    """
    if mask is None:
        return None
    return jnp.where(mask, jnp.zeros((), dtype), jnp.asarray(NEG_INF, dtype))


def make_causal_biases(seq_len: int) -> Tensor:
    """Causal attention-logit biases for a sequence (AXLearn's `make_causal_biases`).

    Args:
        seq_len: The sequence length.

    Returns:
        Float tensor [seq_len, seq_len]: 0 where the key position j <= the query position i,
        `NEG_INF` where j > i.
    """
    positions = jnp.arange(seq_len)
    return bool_to_bias(causal_mask(positions[:, None], positions[None, :]))


def make_sliding_window_causal_biases(seq_len: int, sliding_window_size: int) -> Tensor:
    """Sliding-window causal biases: query i attends to keys i - sliding_window_size ... i.

    Args:
        seq_len: The sequence length.
        sliding_window_size: How many earlier positions each query sees besides itself.

    Returns:
        Float tensor [seq_len, seq_len] of 0 (attend) and `NEG_INF`.
    """
    positions = jnp.arange(seq_len)
    mask = sliding_window_causal_mask(sliding_window_size)(positions[:, None], positions[None, :])
    return bool_to_bias(mask)


def make_segment_mask(*, source_segments: Tensor, target_segments: Tensor) -> Tensor:
    """Bias that disconnects tokens of different segments.

    Args:
        source_segments: Int tensor [batch, ..., source_length].
        target_segments: Int tensor [batch, ..., target_length].

    Returns:
        Float tensor [batch, 1, ..., target_length, source_length]: 0 where the target and
        source tokens share a segment id, `NEG_INF` elsewhere.
    """
    return bool_to_bias(_same_segment(target_segments, source_segments))


def _same_segment(target_segments: Tensor, source_segments: Tensor) -> Tensor:
    """Bool [batch, 1, ..., target, source]: whether the target and source segment ids match."""
    same = jnp.expand_dims(target_segments, -1) == jnp.expand_dims(source_segments, -2)
    return same[:, None]


def mask_fn_bias(
    mask_fn: MaskFn,
    *,
    target_positions: Tensor,
    source_positions: Tensor,
    dtype=jnp.float32,
) -> Tensor:
    """Evaluates `mask_fn` on position grids and returns the matching additive bias.

    Args:
        mask_fn: The mask function.
        target_positions: Int tensor [batch, target_length] (or [1, target_length]).
        source_positions: Int tensor [batch, source_length] (or [1, source_length]).
        dtype: Float dtype of the result.

    Returns:
        Float tensor [batch, 1, target_length, source_length].
    """
    allowed = mask_fn(target_positions[:, None, :, None], source_positions[:, None, None, :])
    return bool_to_bias(allowed, dtype)


def apply_attention_logit_biases(
    logits: Tensor, attention_logit_biases: Optional[Tensor] = None
) -> Tensor:
    """Returns `logits + attention_logit_biases` (biases cast to the logits' dtype), or logits.

    Args:
        logits: Attention logits (or another bias) [..., target_length, source_length].
        attention_logit_biases: Optional bias broadcastable to `logits`.

    Returns:
        The biased logits.
    """
    if attention_logit_biases is None:
        return logits
    return logits + attention_logit_biases.astype(logits.dtype)


def compute_padding_biases(input_ids: Tensor, *, pad_token_id: Optional[int]) -> Tensor:
    """Biases [batch, 1, seq_len, seq_len] that disconnect padding tokens, to and from.

    Entry (b, 0, i, j) is NEG_INF if token i or token j of sequence b is `pad_token_id` (2 *
    NEG_INF if both), else 0; all zeros when `pad_token_id` is None.

    Args:
        input_ids: Int [batch, seq_len].
        pad_token_id: The padding id, or None for no padding.

    Returns:
        The float32 biases.
    """
    batch, seq_len = input_ids.shape
    if pad_token_id is None:
        return jnp.zeros((batch, 1, seq_len, seq_len), jnp.float32)
    padding = (input_ids == pad_token_id).astype(jnp.float32) * NEG_INF
    return padding[:, None, :, None] + padding[:, None, None, :]


def add_biases(*biases: Optional[Tensor]) -> Optional[Tensor]:
    """Sums attention-logit biases, skipping None; returns None if all are None.

    Every bias is broadcast to 4 dimensions ([batch, num_heads, target, source]) first.

    Args:
        *biases: Biases (see the module docstring for accepted shapes) or None.

    Returns:
        The broadcast sum, or None.
    """
    result = None
    for bias in biases:
        if bias is None:
            continue
        bias = as_4d_bias(bias)
        result = bias if result is None else result + bias
    return result


def as_4d_bias(bias: Tensor) -> Tensor:
    """Expands a 2-, 3- or 4-dimensional bias to [batch, num_heads, target, source].

    Args:
        bias: The bias.

    Returns:
        The bias with 4 dimensions.

    Raises:
        ValueError: If `bias` has another rank.
    """
    if bias.ndim == 2:
        return bias[None, None]
    if bias.ndim == 3:
        return bias[:, None]
    if bias.ndim == 4:
        return bias
    raise ValueError(f"Attention logit biases must have 2-4 dims, got shape {bias.shape}")
