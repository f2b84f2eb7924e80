"""Attention masks and additive attention-logit biases.

Conventions (shared by every attention layer in `axlearn.common.attention`):

* An attention-logit bias is a float tensor added to the attention logits before the softmax.
  It has shape [target_length, source_length], [batch, target_length, source_length] or
  [batch, num_heads, target_length, source_length]; `NEG_INF` disconnects a position pair.
  `None` means "all zeros" (every pair is connected).
* A mask function (`MaskFn`) maps broadcastable integer tensors `query_position` and
  `key_position` to a boolean tensor that is True where the query may attend to the key.
* Segment ids are int tensors [batch, length]; tokens attend only within their own segment.
  Segment id 0 conventionally marks padding.

`NEG_INF` is a large finite negative number rather than -inf, so a row whose every entry is
masked produces a uniform softmax instead of NaNs.

Attention-bias objects (AXLearn's classes) describe a bias lazily; `value()` materializes it as
[batch, num_heads, target_length, source_length] (or None for no bias):

- `ZeroAttentionBias()`: no bias.
- `TensorAttentionBias(value)`: an explicit 2-, 3- or 4-D bias.
- `SegmentIdAttentionBias(segment_ids)`: tokens attend only within their segment.
- `MaskFnAttentionBias(mask=, target_positions=, source_positions=)`: a `MaskFn` on positions;
  `CausalAttentionBias` (causal_mask) and `SlidingWindowAttentionBias(sliding_window_size=...)`
  are its common cases.
- `CompositeAttentionBias(biases)`: the sum; `a + b` builds one.

All are pytrees (tensors are leaves; mask functions and window sizes are static), so they can
cross `jax.jit` boundaries.
"""

import dataclasses
from collections.abc import Sequence
from typing import Callable, Optional, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from axlearn.common.config import FunctionConfigBase, config_for_function

Tensor = jnp.ndarray

# The bias that disconnects a (query, key) pair.
NEG_INF = -1e15


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


def bool_to_bias(mask: Tensor, dtype=jnp.float32) -> Tensor:
    """Converts a boolean mask (True = attend) to an additive bias (0 or NEG_INF).

    Args:
        mask: Boolean tensor.
        dtype: Float dtype of the result.

    Returns:
        A tensor of the same shape: 0 where `mask` is True, `NEG_INF` elsewhere.
    """
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
        source_segments: Int tensor [batch, source_length].
        target_segments: Int tensor [batch, target_length].

    Returns:
        Float tensor [batch, 1, target_length, source_length]: 0 where the target and source
        tokens share a segment id, `NEG_INF` elsewhere.
    """
    same = target_segments[:, None, :, None] == source_segments[:, None, None, :]
    return bool_to_bias(same)


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


class BaseAttentionBias:
    """A lazily described attention-logit bias."""

    def value(self) -> Optional[Tensor]:
        """The bias [batch, num_heads, target, source] (broadcastable), or None for zeros."""
        raise NotImplementedError(type(self))

    def __add__(self, other: "BaseAttentionBias") -> "CompositeAttentionBias":
        return CompositeAttentionBias([self, other])


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class ZeroAttentionBias(BaseAttentionBias):
    """No bias."""

    def value(self) -> Optional[Tensor]:
        return None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TensorAttentionBias(BaseAttentionBias):
    """An explicit bias tensor (2-, 3- or 4-D, see `attention_bias`)."""

    bias: Tensor

    def value(self) -> Optional[Tensor]:
        return as_4d_bias(self.bias)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SegmentIdAttentionBias(BaseAttentionBias):
    """Disconnects tokens of different segments (segment_ids [batch, length])."""

    segment_ids: Tensor

    def value(self) -> Optional[Tensor]:
        return make_segment_mask(source_segments=self.segment_ids, target_segments=self.segment_ids)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class MaskFnAttentionBias(BaseAttentionBias):
    """A mask function evaluated on target/source positions ([batch or 1, length])."""

    target_positions: Tensor
    source_positions: Tensor
    mask: Callable = dataclasses.field(default=causal_mask, metadata=dict(static=True))

    def value(self) -> Optional[Tensor]:
        return mask_fn_bias(
            self.mask,
            target_positions=self.target_positions,
            source_positions=self.source_positions,
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CausalAttentionBias(MaskFnAttentionBias):
    """Causal attention over positions.

    `CausalAttentionBias.default_config()` is the config of its mask function, for an attention
    layer's `mask` field (`MultiheadAttention.default_config().set(mask=...)`).
    """

    mask: Callable = dataclasses.field(default=causal_mask, metadata=dict(static=True))

    @classmethod
    def default_config(cls, **kwargs) -> FunctionConfigBase:
        """Returns a config that instantiates to `causal_mask` (kwargs: none accepted)."""
        return config_for_function(causal_mask_fn).set(**kwargs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class SlidingWindowAttentionBias(MaskFnAttentionBias):
    """Causal attention to the `sliding_window_size` previous positions and itself."""

    sliding_window_size: int = dataclasses.field(default=0, metadata=dict(static=True))

    @classmethod
    def default_config(cls, **kwargs) -> FunctionConfigBase:
        """Returns a config of `sliding_window_causal_mask`; kwargs: `sliding_window_size`."""
        return config_for_function(sliding_window_causal_mask).set(**kwargs)

    def value(self) -> Optional[Tensor]:
        return mask_fn_bias(
            sliding_window_causal_mask(self.sliding_window_size),
            target_positions=self.target_positions,
            source_positions=self.source_positions,
        )


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CompositeAttentionBias(BaseAttentionBias):
    """The sum of several biases (None values are skipped)."""

    biases: Sequence[BaseAttentionBias]

    def value(self) -> Optional[Tensor]:
        return add_biases(*(b.value() for b in self.biases))

    def __add__(self, other: BaseAttentionBias) -> "CompositeAttentionBias":
        return CompositeAttentionBias([*self.biases, other])


__all__ = [
    "NEG_INF",
    "BaseAttentionBias",
    "CausalAttentionBias",
    "CompositeAttentionBias",
    "MaskFn",
    "MaskFnAttentionBias",
    "SegmentIdAttentionBias",
    "SlidingWindowAttentionBias",
    "TensorAttentionBias",
    "ZeroAttentionBias",
    "add_biases",
    "apply_attention_logit_biases",
    "as_4d_bias",
    "bool_to_bias",
    "causal_mask",
    "causal_mask_fn",
    "compute_padding_biases",
    "make_causal_biases",
    "make_segment_mask",
    "make_sliding_window_causal_biases",
    "mask_fn_bias",
    "sliding_window_causal_mask",
]
