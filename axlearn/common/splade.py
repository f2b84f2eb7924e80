"""SPLADE pooling (AXLearn's `axlearn.common.splade`; SPLADE v2: https://arxiv.org/abs/2109.10086).

`SpladePooling` maps each token's hidden state to vocabulary logits with an MLM head
(`vocab_mapping`, by default a `bert.BertLMHead` whose output layer is the shared token
embedding's `attend`) and pools the log-saturated activations over the sequence into one sparse
vector per sequence:
- "max": w_j = max_i log(1 + act(logit_ij)) over the live tokens i (SPLADE v2's max pooling;
  the max is taken before the log1p, which is monotonic, to save memory);
- "sum": w_j = sum_i log(1 + act(logit_ij)) over the live tokens (SPLADE v1).
`act` is `splade_activation_fn` (ReLU by default), so the weights are >= 0.
"""

from typing import Optional

import jax.numpy as jnp

from axlearn.common.attention_bias import NEG_INF
from axlearn.common.bert import BertLMHead
from axlearn.common.config import config_class
from axlearn.common.layers import (
    BaseClassificationHead,
    RedirectToSharedModule,
    get_activation_fn,
)
from axlearn.common.module import Module
from axlearn.common.poolings import BasePoolingLayer
from axlearn.common.utils import Tensor
from axlearn.common.utils_masks import safe_not

_MODES = ("max", "sum")


class SpladePooling(BasePoolingLayer):
    """SPLADE pooling: [batch, seq_len, input_dim] -> [batch, 1, output_dim (vocab size)]."""

    # The name under which an ancestor shares the token embedding that `vocab_mapping` attends.
    SHARED_EMB_NAME = "shared_token_emb"

    @config_class
    class Config(BasePoolingLayer.Config):
        """Configures SpladePooling."""

        # The activation applied to the vocabulary logits before log1p (ReLU by default).
        splade_activation_fn: str = "nn.relu"
        # How token activations are pooled: "max" or "sum".
        splade_mode: str = "max"
        # Maps hidden states to vocabulary logits (input_dim and num_classes are set from ours).
        vocab_mapping: BaseClassificationHead.Config = BertLMHead.default_config()

    @classmethod
    def default_config(cls) -> Config:
        cfg: SpladePooling.Config = super().default_config()
        # The MLM head's output layer is the (tied) token embedding shared by an ancestor.
        cfg.vocab_mapping = BertLMHead.default_config().set(
            inner_head=RedirectToSharedModule.default_config().set(
                shared_module=cls.SHARED_EMB_NAME, method_map=dict(forward="attend")
            )
        )
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.splade_mode not in _MODES:
            raise ValueError(
                f"{self.path()}.splade_mode={cfg.splade_mode!r} is not supported in Splade "
                f"pooling: set it to one of {_MODES}."
            )
        if cfg.num_outputs != 1:
            raise NotImplementedError(
                f"{self.path()}.num_outputs={cfg.num_outputs}: SPLADE pooling gives one output "
                "per sequence; set num_outputs=1."
            )
        self._add_child(
            "vocab_mapping",
            cfg.vocab_mapping.set(input_dim=cfg.input_dim, num_classes=cfg.output_dim),
        )

    def forward(  # pylint: disable=arguments-renamed
        self, tokens: Tensor, paddings: Optional[Tensor] = None
    ) -> Tensor:
        """Computes the SPLADE vectors of the sequences.

        Args:
            tokens: [batch_size, seq_len, input_dim] hidden states.
            paddings: Optional [batch_size, seq_len], 1 (True) at padded tokens; None: no padding.

        Returns:
            [batch_size, 1, output_dim] non-negative SPLADE weights.
        """
        cfg = self.config
        if paddings is None:
            paddings = jnp.zeros(tokens.shape[:2], dtype=tokens.dtype)
        # [batch_size, seq_len, 1].
        paddings = paddings[..., None]
        activation = get_activation_fn(cfg.splade_activation_fn)
        # [batch_size, seq_len, vocab_size].
        logits = self.vocab_mapping({"hidden_states": tokens})
        if cfg.splade_mode == "max":
            # max before log1p(act(.)) (both monotonic non-decreasing): one [batch, 1, vocab]
            # tensor goes through them instead of the whole sequence's.
            logits = logits + paddings * NEG_INF
            pooled = jnp.max(logits, axis=1, keepdims=True)
            return jnp.log1p(activation(pooled))
        weights = jnp.log1p(activation(logits)) * safe_not(paddings)
        return jnp.sum(weights, axis=1, keepdims=True)
