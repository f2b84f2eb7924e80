"""Pooling layers: [batch, seq_len, input_dim] tokens -> [batch, num_outputs, output_dim].

AXLearn's `axlearn.common.poolings`: first-N / last-N token, average and max pooling, attention
pooling with learned queries, and a pooler followed by a projection.

Paddings: every `forward` takes an optional `paddings` tensor [batch, seq_len] where 1 (True)
marks a padded token and 0 (False) a real one (bool, int or float 0/1). None: no padding.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from axlearn.common.attention import (
    TransformerAttentionLayer,
    TransformerFeedForwardLayer,
    scaled_hidden_dim,
)
from axlearn.common.attention_bias import NEG_INF, make_segment_mask
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.layers import Linear
from axlearn.common.module import Module
from axlearn.common.utils import Tensor, safe_not


def _valid_mask(tokens: Tensor, paddings: Optional[Tensor]) -> Tensor:
    """Bool [batch, seq_len]: True for real tokens (all True when `paddings` is None)."""
    if paddings is None:
        return jnp.ones(tokens.shape[:2], dtype=jnp.bool_)
    return safe_not(paddings)


class BasePoolingLayer(BaseLayer):
    """The base class of pooling layers."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BasePoolingLayer."""

        input_dim: Required[int] = REQUIRED  # The feature dim of the input tokens.
        output_dim: Required[int] = REQUIRED  # The feature dim of each pooled output.
        num_outputs: int = 1  # How many pooled vectors each sequence gives.

    def forward(self, tokens: Tensor, paddings: Optional[Tensor] = None) -> Tensor:
        """Pools the tokens.

        Args:
            tokens: [batch, seq_len, input_dim].
            paddings: Optional [batch, seq_len], 1 (True) for padded tokens.

        Returns:
            [batch, num_outputs, output_dim].
        """
        raise NotImplementedError(type(self))

    def _check_single_output_same_dim(self):
        """Raises ValueError unless num_outputs == 1 and input_dim == output_dim."""
        cfg = self.config
        if cfg.num_outputs != 1:
            raise ValueError(
                f"{self.path()}: {type(self).__name__} gives one output, "
                f"but num_outputs={cfg.num_outputs}."
            )
        if cfg.input_dim != cfg.output_dim:
            raise ValueError(
                f"{self.path()}: {type(self).__name__} needs input_dim == output_dim, "
                f"got input_dim={cfg.input_dim}, output_dim={cfg.output_dim}."
            )


class AttentionPooling(BasePoolingLayer):
    """Pools with `num_outputs` learned queries that cross-attend to the tokens.

    Each query (parameter `query_weight` [num_outputs, output_dim]) attends to the real tokens
    through `cross_attention` (target dim output_dim, source dim input_dim), then goes through
    `feed_forward`. See CoCa, https://arxiv.org/abs/2205.01917, section 3.2.
    """

    @config_class
    class Config(BasePoolingLayer.Config):
        """Configures AttentionPooling."""

        # The cross-attention from the queries to the tokens (dims are set by this layer).
        cross_attention: InstantiableConfig = TransformerAttentionLayer.default_config()
        # The feed-forward layer after the attention (input_dim is set to output_dim).
        feed_forward: InstantiableConfig = TransformerFeedForwardLayer.default_config()

    @classmethod
    def default_config(cls) -> Config:
        """One attention head and a feed-forward hidden dim of 4 * output_dim."""
        cfg = super().default_config()
        cfg.cross_attention.attention.num_heads = 1
        cfg.feed_forward.hidden_dim = scaled_hidden_dim(scale=4)
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "cross_attention",
            cfg.cross_attention.clone(source_dim=cfg.input_dim, target_dim=cfg.output_dim),
        )
        self._add_child("feed_forward", cfg.feed_forward.clone(input_dim=cfg.output_dim))

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        # The "_weight" suffix makes the default initializer treat it as a weight.
        return dict(
            query_weight=ParameterSpec(shape=(cfg.num_outputs, cfg.output_dim), mesh_axes=None)
        )

    def forward(self, tokens: Tensor, paddings: Optional[Tensor] = None) -> Tensor:
        """See `BasePoolingLayer.forward`."""
        cfg = self.config
        batch = tokens.shape[0]
        queries = jnp.broadcast_to(
            self.parameters["query_weight"][None], (batch, cfg.num_outputs, cfg.output_dim)
        )
        valid = _valid_mask(tokens, paddings)
        # Queries (segment True) attend only to real tokens (segment True).
        biases = make_segment_mask(
            source_segments=valid,
            target_segments=jnp.ones((batch, cfg.num_outputs), dtype=jnp.bool_),
        )
        pooled = self.cross_attention(
            target=queries, source=tokens, attention_logit_biases=biases
        ).data
        return self.feed_forward(pooled)


class AveragePooling(BasePoolingLayer):
    """The mean of the real tokens (num_outputs must be 1 and input_dim == output_dim)."""

    @config_class
    class Config(BasePoolingLayer.Config):
        """Configures AveragePooling."""

        eps: float = 1e-8  # Added to the token count, so all-padded sequences give 0.

    def forward(self, tokens: Tensor, paddings: Optional[Tensor] = None) -> Tensor:
        """See `BasePoolingLayer.forward`.

        Raises:
            ValueError: If num_outputs != 1 or input_dim != output_dim.
        """
        self._check_single_output_same_dim()
        mask = _valid_mask(tokens, paddings)[:, :, None]
        # Sums in float32 (bfloat16 sums of long sequences lose digits).
        total = jnp.sum(jnp.where(mask, tokens, 0), axis=1, keepdims=True, dtype=jnp.float32)
        count = jnp.sum(mask, axis=1, keepdims=True, dtype=jnp.float32) + self.config.eps
        return (total / count).astype(tokens.dtype)


class MaxPooling(BasePoolingLayer):
    """The feature-wise max over the real tokens (num_outputs 1, input_dim == output_dim).

    A sequence with no real token gives `NEG_INF` (in the tokens' dtype).
    """

    def forward(self, tokens: Tensor, paddings: Optional[Tensor] = None) -> Tensor:
        """See `BasePoolingLayer.forward`.

        Raises:
            ValueError: If num_outputs != 1 or input_dim != output_dim.
        """
        self._check_single_output_same_dim()
        mask = _valid_mask(tokens, paddings)[:, :, None]
        masked = jnp.where(mask, tokens, jnp.asarray(NEG_INF, dtype=tokens.dtype))
        return jnp.max(masked, axis=1, keepdims=True)


class FirstNTokenPooling(BasePoolingLayer):
    """The first num_outputs tokens; padded ones (and any beyond seq_len) are zeros.

    E.g. tokens [[a, b], [c, d]] with paddings [[0, 1], [0, 0]] and num_outputs 2 give
    [[a, 0], [c, d]]. The feature dim is kept (output_dim is not used).
    """

    def forward(self, tokens: Tensor, paddings: Optional[Tensor] = None) -> Tensor:
        """See `BasePoolingLayer.forward`."""
        n = self.config.num_outputs
        mask = _valid_mask(tokens, paddings)[:, :n, None]
        first = tokens[:, :n, :] * mask.astype(tokens.dtype)
        missing = n - first.shape[1]
        if missing > 0:
            first = jnp.pad(first, ((0, 0), (0, missing), (0, 0)))
        return first


class LastNTokenPooling(BasePoolingLayer):
    """The last num_outputs real tokens, the last one first; missing ones are zeros.

    Output i is the (i + 1)-th real token counted from the end of the sequence. E.g. tokens
    [[a, b], [c, d]] with paddings [[0, 1], [0, 0]] and num_outputs 2 give [[a, 0], [d, c]].
    The feature dim is kept (output_dim is not used).
    """

    def forward(self, tokens: Tensor, paddings: Optional[Tensor] = None) -> Tensor:
        """See `BasePoolingLayer.forward`."""
        n = self.config.num_outputs
        valid = _valid_mask(tokens, paddings)
        # rank[b, s]: how many real tokens lie at positions >= s; 1 for the last real token.
        rank = jnp.cumsum(valid[:, ::-1].astype(jnp.int32), axis=1)[:, ::-1]
        # dispatch[b, s, i] = 1 where token s is real and is the (i + 1)-th from the end.
        dispatch = jax.nn.one_hot(rank - 1, n, dtype=tokens.dtype)
        dispatch = dispatch * valid[:, :, None].astype(tokens.dtype)
        return jnp.einsum("bsd,bsi->bid", tokens, dispatch)


class PoolingWithProjection(BasePoolingLayer):
    """A pooler followed by a projection to output_dim."""

    @config_class
    class Config(BasePoolingLayer.Config):
        """Configures PoolingWithProjection."""

        # The pooler; its input_dim is set to input_dim, and its output_dim to input_dim
        # when not set.
        pooler: Required[InstantiableConfig] = REQUIRED
        # The projection from the pooler's output_dim to output_dim.
        proj: InstantiableConfig = Linear.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        pooler_cfg = cfg.pooler.clone(input_dim=cfg.input_dim)
        if pooler_cfg.output_dim is REQUIRED or pooler_cfg.output_dim is None:
            pooler_cfg.output_dim = cfg.input_dim
        self._add_child("pooler", pooler_cfg)
        self._add_child(
            "proj", cfg.proj.clone(input_dim=pooler_cfg.output_dim, output_dim=cfg.output_dim)
        )

    def forward(self, tokens: Tensor, paddings: Optional[Tensor] = None) -> Tensor:
        """See `BasePoolingLayer.forward`.

        Raises:
            ValueError: If `tokens` is not 3-D.
        """
        if tokens.ndim != 3:
            raise ValueError(
                f"{self.path()}: tokens must be [batch, seq_len, input_dim], "
                f"got shape {tokens.shape}."
            )
        return self.proj(self.pooler(tokens, paddings=paddings))
