"""Text embedding encoders: one (or a few) embedding vectors per input token sequence.

`TextEmbeddingEncoder` runs an `encoder.Encoder` (token embeddings and a transformer stack) over
the input ids and pools its hidden states with a `poolings.BasePoolingLayer` (by default the first
token, BERT's [CLS]). Tokens equal to `pad_token_id` are padding: the encoder masks them and the
pooler ignores them.

Outputs (a dict):
- `ENCODED_HIDDEN_STATES`: the encoder's hidden states, [batch, seq_len, hidden_dim].
- `TEXT_EMBEDDINGS`: the pooled embeddings, [batch, num_outputs, output_dim].

`text_dual_encoder.TextEmbeddingStreamEncoder` wraps it for dual-encoder models; `distilbert`
configures it as DistilBERT.
"""

from typing import Optional

from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.encoder import Encoder
from axlearn.common.module import Module
from axlearn.common.poolings import BasePoolingLayer, FirstNTokenPooling
from axlearn.common.utils import NestedTensor, Tensor

__all__ = ["ENCODED_HIDDEN_STATES", "TEXT_EMBEDDINGS", "TextEmbeddingEncoder"]

# Output key of the encoder's hidden states, [batch, seq_len, hidden_dim].
ENCODED_HIDDEN_STATES = "encoded_hidden_states"
# Output key of the pooled text embeddings, [batch, num_outputs, output_dim].
TEXT_EMBEDDINGS = "text_embeddings"


class TextEmbeddingEncoder(BaseLayer):
    """Encodes token ids with an `Encoder`, then pools the hidden states into embeddings.

    The encoder's `dim` is `hidden_dim` (or `output_dim` when unset) and its `pad_token_id` is
    this config's; the pooler maps `hidden_dim` to `output_dim`.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures TextEmbeddingEncoder."""

        # The dim of each pooled embedding (the pooler's output_dim).
        output_dim: Required[int] = REQUIRED
        # The encoder's hidden dim (None: output_dim).
        hidden_dim: Optional[int] = None
        # The input id of padding tokens (set on the encoder; the pooler skips them).
        pad_token_id: Required[int] = REQUIRED
        # The token encoder (its dim and pad_token_id are set from this config).
        encoder: Encoder.Config = Encoder.default_config()
        # Pools [batch, seq_len, hidden_dim] into [batch, num_outputs, output_dim].
        pooler: BasePoolingLayer.Config = FirstNTokenPooling.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        hidden_dim = cfg.hidden_dim or cfg.output_dim
        self._add_child("encoder", cfg.encoder.set(dim=hidden_dim, pad_token_id=cfg.pad_token_id))
        self._add_child("pooler", cfg.pooler.set(input_dim=hidden_dim, output_dim=cfg.output_dim))

    def forward(self, input_ids: Tensor) -> NestedTensor:
        """Encodes and pools the input ids.

        Args:
            input_ids: [batch, seq_len] int token ids; `cfg.pad_token_id` marks padding.

        Returns:
            {ENCODED_HIDDEN_STATES: [batch, seq_len, hidden_dim],
             TEXT_EMBEDDINGS: [batch, num_outputs, output_dim]}.
        """
        cfg = self.config
        hidden_states = self.encoder(input_ids)
        paddings = input_ids == cfg.pad_token_id
        embeddings = self.pooler(hidden_states, paddings=paddings)
        return {ENCODED_HIDDEN_STATES: hidden_states, TEXT_EMBEDDINGS: embeddings}
