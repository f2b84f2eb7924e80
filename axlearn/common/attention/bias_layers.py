"""Layers producing attention-logit biases from segment ids and positions (used by Decoder).

Public names are re-exported by `axlearn.common.attention`.
"""

from axlearn.common.attention_bias import NEG_INF, make_segment_mask
from axlearn.common.base_layer import BaseLayer
from axlearn.common.utils import Tensor


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
