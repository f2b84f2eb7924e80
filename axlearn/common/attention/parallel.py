"""ParallelTransformerLayer: attention and feed-forward side by side (GPT-J / PaLM style).

Public names are re-exported by `axlearn.common.attention`.
"""

from typing import Optional

from axlearn.common.attention.multihead import MultiheadAttention
from axlearn.common.attention.transformer import BaseTransformerLayer, TransformerFeedForwardLayer
from axlearn.common.config import InstantiableConfig, config_class
from axlearn.common.layers import LayerNorm
from axlearn.common.module import Module
from axlearn.common.utils import Tensor


class ParallelTransformerLayer(BaseTransformerLayer):
    """y = x + self_attention(norm(x)) + feed_forward(norm(x)), one shared input norm.

    Children: `norm`, `self_attention` (a MultiheadAttention over the normalized input, no
    residual of its own) and `feed_forward` (a TransformerFeedForwardLayer with
    structure="nonorm", i.e. no norm and no residual of its own).
    """

    @config_class
    class Config(BaseTransformerLayer.Config):
        """Configures ParallelTransformerLayer."""

        # The input normalization shared by both branches.
        norm: InstantiableConfig = LayerNorm.default_config()
        # The self-attention (its query/key/value/output dims are set to input_dim).
        self_attention: InstantiableConfig = MultiheadAttention.default_config()
        # The feed-forward branch (input_dim is set; keep structure="nonorm").
        feed_forward: InstantiableConfig = TransformerFeedForwardLayer.default_config().set(
            structure="nonorm"
        )

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("norm", cfg.norm.clone(input_dim=cfg.input_dim))
        self._add_child(
            "self_attention",
            cfg.self_attention.clone(
                query_dim=cfg.input_dim,
                key_dim=cfg.input_dim,
                value_dim=cfg.input_dim,
                output_dim=cfg.input_dim,
            ),
        )
        self._add_child("feed_forward", cfg.feed_forward.clone(input_dim=cfg.input_dim))

    def forward(
        self,
        data: Tensor,
        *,
        self_attention_logit_biases: Optional[Tensor] = None,
        target_segment_ids: Optional[Tensor] = None,
        target_positions: Optional[Tensor] = None,
        return_aux: Optional[set[str]] = None,
    ) -> BaseTransformerLayer.Output:
        """Computes the layer output.

        Args:
            data: [batch, target_length, input_dim].
            self_attention_logit_biases: Optional self-attention biases.
            target_segment_ids: Optional [batch, target_length] segment ids.
            target_positions: Optional [batch, target_length] positions (e.g. for RoPE).
            return_aux: Optional set; "self_attention_probs" requests the attention probs.

        Returns:
            An Output with data [batch, target_length, input_dim].
        """
        normed = self.norm(data)
        want_probs = bool(return_aux) and "self_attention_probs" in return_aux
        attn = self.self_attention(
            normed,
            attention_logit_biases=self_attention_logit_biases,
            segment_ids=target_segment_ids,
            query_positions=target_positions,
            return_aux={"probs"} if want_probs else None,
        )
        outputs = data + attn.data + self.feed_forward(normed)
        return self.Output(data=outputs, self_attention_probs=attn.probs if want_probs else None)
