"""Layers producing attention-logit biases from segment ids and positions (used by Decoder).

Public names are re-exported by `axlearn.common.attention`.
"""

import enum
import math

import jax.numpy as jnp

from axlearn.common.attention_bias import NEG_INF, make_segment_mask
from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.utils import Tensor


class ForwardMode(enum.Enum):
    """Which computation an attention layer runs (AXLearn's `attention.ForwardMode`).

    - FORWARD: the full sequence at once (training, scoring).
    - INIT_STATES: initialize decoding caches (from a prefix).
    - EXTEND_STEP: extend the caches by one decoding step.
    """

    FORWARD = 0
    INIT_STATES = 1
    EXTEND_STEP = 2


def alibi_get_slopes(num_heads: int) -> list[float]:
    """The per-head ALiBi slopes (https://arxiv.org/abs/2108.12409).

    For a power of two n, head h (0-based) gets (2 ** (-8 / n)) ** (h + 1): 1/2, 1/4, ... 1/256
    for 8 heads. Otherwise the slopes of the largest power of two p < n, followed by every other
    slope of 2p heads, n - p of them.

    Args:
        num_heads: The number of heads (positive).

    Returns:
        num_heads slopes.

    Raises:
        ValueError: If num_heads is not positive.
    """
    if num_heads <= 0:
        raise ValueError(f"alibi_get_slopes: num_heads must be positive, got {num_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_get_slopes(2 * closest)[0::2][: num_heads - closest]


class AttentionLogitBiasLayer(BaseLayer):
    """Produces attention-logit biases [batch, 1, seq_len, seq_len] for self-attention."""

    def forward(self, *, segment_ids: Tensor, positions: Tensor) -> Tensor:
        """Returns the biases.

        Args:
            segment_ids: [batch, seq_len] int; tokens attend within their segment.
            positions: [batch or 1, seq_len] int positions.

        Returns:
            Float biases [batch, 1, seq_len, seq_len]; NEG_INF disconnects a pair.
        """
        raise NotImplementedError(type(self))


class CausalAttentionLogitBiasLayer(AttentionLogitBiasLayer):
    """Causal (by position) and segment masking."""

    def forward(self, *, segment_ids: Tensor, positions: Tensor) -> Tensor:
        causal = (positions[:, None, :, None] < positions[:, None, None, :]) * NEG_INF
        return causal + make_segment_mask(source_segments=segment_ids, target_segments=segment_ids)


class FullAttentionLogitBiasLayer(AttentionLogitBiasLayer):
    """Segment masking only (bidirectional attention)."""

    def forward(self, *, segment_ids: Tensor, positions: Tensor) -> Tensor:
        del positions
        return make_segment_mask(source_segments=segment_ids, target_segments=segment_ids)


class ALiBiAttentionLogitBiasLayer(CausalAttentionLogitBiasLayer):
    """Causal and segment masking plus ALiBi's linear position biases, per head.

    The bias of query i and key j in head h is slope[h] * (positions[j] - positions[i]) (<= 0
    for the causal pairs), added to the causal/segment mask; see `alibi_get_slopes`.
    """

    @config_class
    class Config(CausalAttentionLogitBiasLayer.Config):
        """Configures ALiBiAttentionLogitBiasLayer."""

        # The number of attention heads (one slope per head).
        num_heads: Required[int] = REQUIRED

    def forward(self, *, segment_ids: Tensor, positions: Tensor) -> Tensor:
        """Returns float biases [batch, num_heads, seq_len, seq_len]."""
        slopes = jnp.asarray(alibi_get_slopes(self.config.num_heads), jnp.float32)
        distance = (positions[:, None, :] - positions[:, :, None]).astype(jnp.float32)
        alibi = distance[:, None, :, :] * slopes[None, :, None, None]
        return super().forward(segment_ids=segment_ids, positions=positions) + alibi
