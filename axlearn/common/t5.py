"""T5 (https://arxiv.org/abs/1910.10683) encoder-decoder models, T5 1.1 style by default.

T5 differs from a BERT/GPT encoder-decoder in:
- no absolute positions: each attention adds a learned bias per (head, relative position bucket)
  (`t5_relative_position_bucket`, `T5RelativePositionalEmbedding`), computed once per stack;
- RMSNorm (eps 1e-6) in pre-norm layers and after each stack; no biases in linear layers;
- GeGLU feed-forward layers (T5 1.1; "t5-v1" uses ReLU, "t5-ul2" SwiGLU);
- one token embedding shared by the encoder and the decoder, and an untied LM head.

Queries are scaled by 1/sqrt(per_head_dim) as in our other attention layers; T5 checkpoints
(T5X, Hugging Face) fold that scale into the query weights instead, so their query projections
are multiplied by sqrt(per_head_dim) when converted.

    cfg = t5_encoder_decoder_config(vocab_size=32128, dim=768, num_encoder_layers=12,
                                    num_decoder_layers=12, num_attention_heads=12,
                                    dropout_rate=0.1)
"""

import math
from typing import Optional, Union

from jax import numpy as jnp

from axlearn.common.attention import (
    BaseStackedTransformerLayer,
    CausalAttentionLogitBiasLayer,
    StackedTransformerLayer,
    TransformerAttentionLayer,
    apply_attention_logit_biases,
    scaled_hidden_dim,
)
from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import REQUIRED, FunctionConfigBase, Required, config_class
from axlearn.common.decoder import Decoder, LmHead
from axlearn.common.encoder import Encoder
from axlearn.common.encoder_decoder import EncoderDecoderModel
from axlearn.common.layers import (
    Dropout,
    Embedding,
    RedirectToSharedModule,
    RMSNorm,
    set_bias_recursively,
    set_norm_recursively,
)
from axlearn.common.module import Module
from axlearn.common.param_init import PARAM_REGEXP_WEIGHT, DefaultInitializer, WeightInitializer
from axlearn.common.utils import Tensor

__all__ = [
    "EncoderOutputLayer",
    "T5Decoder",
    "T5Encoder",
    "T5EncoderDecoderModel",
    "T5RelativePositionalEmbedding",
    "t5_decoder_config",
    "t5_encoder_config",
    "t5_encoder_decoder_config",
    "t5_relative_position_bucket",
    "t5_transformer_stack_config",
]

# The feed-forward layer of each T5 variant: (activation, hidden_dim as a multiple of dim).
_T5_FEED_FORWARD = {
    # T5 1.1: GeGLU; 8/3 * dim keeps the weight count of a 4 * dim non-gated layer.
    "t5-v1-1": (("nn.gelu", "linear"), 8.0 / 3),
    # The original T5: ReLU, 4 * dim.
    "t5-v1": ("nn.relu", 4.0),
    # UL2: SwiGLU with T5 1.1's width.
    "t5-ul2": (("nn.silu", "linear"), 8.0 / 3),
}


def t5_relative_position_bucket(
    relative_position: Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """Maps relative positions (key position - query position) to T5's buckets.

    With `bidirectional`, half of the buckets are for keys after the query (offset by
    num_buckets // 2) and half for the others; without it, keys after the query share bucket 0.
    Within each half of n buckets, distances below n // 2 get one bucket each and larger ones
    logarithmically wider buckets, up to `max_distance`; farther distances share the last bucket.

    Args:
        relative_position: Int tensor of any shape.
        bidirectional: Whether keys after the query get buckets of their own (encoders).
        num_buckets: Number of buckets.
        max_distance: Distance from which all positions share a bucket.

    Returns:
        Int32 tensor of the same shape with values in [0, num_buckets).
    """
    relative_position = jnp.asarray(relative_position).astype(jnp.int32)
    buckets = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).astype(jnp.int32) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        distance = jnp.maximum(-relative_position, 0)
    num_exact = num_buckets // 2
    # log(distance / num_exact) / log(max_distance / num_exact) in [0, 1) spans the other buckets
    # (distance 0 gives -inf here but is an exact bucket).
    log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / num_exact) / math.log(
        max_distance / num_exact
    )
    log_bucket = num_exact + (log_ratio * (num_buckets - num_exact)).astype(jnp.int32)
    log_bucket = jnp.minimum(log_bucket, num_buckets - 1)
    return buckets + jnp.where(distance < num_exact, distance, log_bucket)


class T5RelativePositionalEmbedding(BaseLayer):
    """Learned attention biases per head and relative position bucket, added to a mask."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures T5RelativePositionalEmbedding."""

        # Number of biases per bucket: the number of attention heads.
        dim: Required[int] = REQUIRED
        num_buckets: int = 32  # Number of relative position buckets.
        max_distance: int = 128  # Distance from which positions share the last bucket.
        # Whether keys after the query get their own buckets (True: encoder, False: decoder).
        bidirectional: Required[bool] = REQUIRED

    @classmethod
    def default_config(cls) -> Config:
        """Glorot-uniform (fan_avg) initialized bias table, as T5X."""
        cfg = super().default_config()
        cfg.param_init = DefaultInitializer.default_config().set(
            init_by_param_name={
                PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                    fan="fan_avg", distribution="uniform", scale=1.0
                )
            }
        )
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "emb", Embedding.default_config().set(num_embeddings=cfg.num_buckets, dim=cfg.dim)
        )

    def forward(self, attention_logit_biases: Tensor) -> Tensor:
        """Adds the relative position biases to `attention_logit_biases`.

        Query i and key j are at positions i and j (0-based) of their sequences.

        Args:
            attention_logit_biases: [batch, 1 or heads, query_len, key_len] (0: may attend,
                a large negative value: masked).

        Returns:
            [batch, dim, query_len, key_len]: the masks plus the positional biases.
        """
        cfg = self.config
        query_len, key_len = attention_logit_biases.shape[-2:]
        relative = jnp.arange(key_len)[None, :] - jnp.arange(query_len)[:, None]
        buckets = t5_relative_position_bucket(
            relative,
            bidirectional=cfg.bidirectional,
            num_buckets=cfg.num_buckets,
            max_distance=cfg.max_distance,
        )
        # [query_len, key_len, dim] -> [1, dim, query_len, key_len].
        bias = jnp.transpose(self.emb(buckets), (2, 0, 1))[None]
        return apply_attention_logit_biases(bias, attention_logit_biases)


class EncoderOutputLayer(BaseLayer):
    """The T5 encoder's final RMSNorm and dropout."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures EncoderOutputLayer."""

        input_dim: Required[int] = REQUIRED  # The encoder's dim.
        norm: BaseLayer.Config = RMSNorm.default_config()  # The final norm.
        dropout: BaseLayer.Config = Dropout.default_config()  # Dropout after the norm.

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("norm", cfg.norm.clone(input_dim=cfg.input_dim))
        self._add_child("dropout", cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Returns dropout(norm(x)) for x [..., input_dim]."""
        return self.dropout(self.norm(x))


def t5_transformer_stack_config(
    arch: str = "t5-v1-1",
    hidden_dim: Optional[Union[int, FunctionConfigBase]] = None,
    base_cfg: Optional[BaseStackedTransformerLayer.Config] = None,
) -> BaseStackedTransformerLayer.Config:
    """A transformer stack config with T5's pre-norm, bias-free layers of `arch`.

    Args:
        arch: "t5-v1-1" (GeGLU), "t5-v1" (ReLU) or "t5-ul2" (SwiGLU).
        hidden_dim: The feed-forward hidden dim (an int or a function of the input dim); None:
            the arch's multiple of the input dim (8/3 for gated layers, 4 for "t5-v1").
        base_cfg: The stack to start from (edited in place); None: a StackedTransformerLayer.

    Returns:
        The stack config (num_layers and num_heads still to be set).

    Raises:
        ValueError: If `arch` is unknown.
    """
    if arch not in _T5_FEED_FORWARD:
        raise ValueError(
            f"t5_transformer_stack_config: unsupported arch {arch!r}; use one of "
            f"{sorted(_T5_FEED_FORWARD)}."
        )
    cfg = base_cfg or StackedTransformerLayer.default_config()
    activation, scale = _T5_FEED_FORWARD[arch]
    cfg.layer.feed_forward.set(
        structure="prenorm",
        activation=activation,
        hidden_dim=scaled_hidden_dim(scale) if hidden_dim is None else hidden_dim,
    )
    set_bias_recursively(cfg, False)
    return cfg


class T5Encoder(Encoder):
    """A T5 encoder: bidirectional relative position biases, a final RMSNorm, pad id 0."""

    @config_class
    class Config(Encoder.Config):
        """Configures T5Encoder."""

        # The relative position biases of the self-attention (dim: the number of heads).
        relative_pos_emb: T5RelativePositionalEmbedding.Config = (
            T5RelativePositionalEmbedding.default_config().set(bidirectional=True)
        )

    @classmethod
    def default_config(cls) -> Config:
        """T5 1.1 layers, RMSNorm everywhere, the EncoderOutputLayer and pad_token_id 0."""
        cfg = super().default_config()
        cfg.transformer = t5_transformer_stack_config()
        cfg.output = EncoderOutputLayer.default_config()
        cfg.pad_token_id = 0
        set_norm_recursively(cfg, RMSNorm.default_config())
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._add_child("relative_pos_emb", self.config.relative_pos_emb)

    def compute_attention_logit_biases(
        self,
        input_ids: Tensor,
        *,
        segment_ids: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
    ) -> Tensor:
        """The padding/segment masks plus the relative position biases [batch, heads, T, T]."""
        biases = super().compute_attention_logit_biases(
            input_ids, segment_ids=segment_ids, positions=positions
        )
        return self.relative_pos_emb(biases)


def t5_encoder_config(
    *,
    vocab_size: int,
    dim: int,
    num_layers: int,
    num_attention_heads: int,
    base_cfg: Optional[T5Encoder.Config] = None,
) -> T5Encoder.Config:
    """A T5 encoder config.

    Args:
        vocab_size: Vocabulary size.
        dim: Model dim.
        num_layers: Number of transformer layers.
        num_attention_heads: Attention heads (also the relative position biases' dim).
        base_cfg: The config to start from (copied); None: `T5Encoder.default_config()`.

    Returns:
        The config, without linear biases and with RMSNorm.
    """
    cfg = base_cfg.clone() if base_cfg is not None else T5Encoder.default_config()
    cfg.set(vocab_size=vocab_size, dim=dim)
    cfg.relative_pos_emb.dim = num_attention_heads
    cfg.transformer.num_layers = num_layers
    cfg.transformer.layer.self_attention.attention.num_heads = num_attention_heads
    set_bias_recursively(cfg, False)
    set_norm_recursively(cfg, RMSNorm.default_config())
    return cfg


class T5Decoder(Decoder):
    """A T5 decoder: causal attention with unidirectional relative position biases."""

    @config_class
    class Config(Decoder.Config):
        """Configures T5Decoder."""

        # The relative position biases of the self-attention (dim: the number of heads).
        relative_pos_emb: T5RelativePositionalEmbedding.Config = (
            T5RelativePositionalEmbedding.default_config().set(bidirectional=False)
        )

    @classmethod
    def default_config(cls) -> Config:
        """Causal masking, T5 1.1 layers and a final RMSNorm."""
        cfg = super().default_config()
        cfg.attention_mask = CausalAttentionLogitBiasLayer.default_config()
        cfg.transformer = t5_transformer_stack_config()
        cfg.output_norm = RMSNorm.default_config()
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._add_child("relative_pos_emb", self.config.relative_pos_emb)

    def compute_attention_logit_biases(
        self,
        input_ids: Tensor,
        *,
        segment_ids: Optional[Tensor] = None,
        positions: Optional[Tensor] = None,
    ) -> Tensor:
        """The causal/segment masks plus the relative position biases [batch, heads, T, T]."""
        biases = super().compute_attention_logit_biases(
            input_ids, segment_ids=segment_ids, positions=positions
        )
        return self.relative_pos_emb(biases)


def t5_decoder_config(
    *,
    vocab_size: int,
    dim: int,
    num_layers: int,
    num_attention_heads: int,
    cross_attention: Optional[TransformerAttentionLayer.Config],
    base_cfg: Optional[T5Decoder.Config] = None,
) -> T5Decoder.Config:
    """A T5 decoder config with an untied LM head.

    Args:
        vocab_size: Vocabulary size.
        dim: Model dim.
        num_layers: Number of transformer layers.
        num_attention_heads: Self-attention heads (also the relative position biases' dim).
        cross_attention: The layers' cross-attention config, or None for none.
        base_cfg: The config to start from (copied); None: `T5Decoder.default_config()`.

    Returns:
        The config, without linear biases and with RMSNorm.
    """
    cfg = base_cfg.clone() if base_cfg is not None else T5Decoder.default_config()
    cfg.set(vocab_size=vocab_size, dim=dim)
    cfg.relative_pos_emb.dim = num_attention_heads
    cfg.transformer.num_layers = num_layers
    cfg.transformer.layer.self_attention.attention.num_heads = num_attention_heads
    if cross_attention is not None:
        cfg.transformer.layer.cross_attention = cross_attention
    # T5 1.1 does not tie the output head to the embedding.
    cfg.lm_head = LmHead.default_config()
    set_bias_recursively(cfg, False)
    set_norm_recursively(cfg, RMSNorm.default_config())
    return cfg


class T5EncoderDecoderModel(EncoderDecoderModel):
    """A T5 encoder-decoder whose encoder and decoder share `shared_token_emb`."""

    @config_class
    class Config(EncoderDecoderModel.Config):
        """Configures T5EncoderDecoderModel."""

        # The token embedding both stacks read (through RedirectToSharedModule).
        shared_token_emb: Embedding.Config = Embedding.default_config()

    @classmethod
    def default_config(cls) -> Config:
        """A T5Encoder and a T5Decoder whose token embeddings redirect to shared_token_emb."""
        cfg = super().default_config()
        cfg.encoder = T5Encoder.default_config()
        cfg.decoder = T5Decoder.default_config()
        redirect = RedirectToSharedModule.default_config().set(shared_module="shared_token_emb")
        cfg.encoder.emb.token_emb = redirect
        cfg.decoder.emb.token_emb = redirect.clone()
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._add_child("shared_token_emb", self.config.shared_token_emb)
        self._share_with_descendants(self.shared_token_emb, shared_module_name="shared_token_emb")


def t5_encoder_decoder_config(
    *,
    vocab_size: int,
    dim: int,
    num_encoder_layers: int,
    num_decoder_layers: int,
    num_attention_heads: int,
    dropout_rate: float,
    z_loss_scale: float = 0,
    label_smoothing: float = 0,
    stack_cfg: Optional[BaseStackedTransformerLayer.Config] = None,
) -> T5EncoderDecoderModel.Config:
    """A T5 encoder-decoder config (RMSNorm eps 1e-6, no linear biases, untied head).

    Args:
        vocab_size: Vocabulary size (shared by source and target).
        dim: Model dim.
        num_encoder_layers: Encoder layers.
        num_decoder_layers: Decoder layers.
        num_attention_heads: Attention heads of every attention layer.
        dropout_rate: Dropout rate of both stacks.
        z_loss_scale: Scale of the z-loss.
        label_smoothing: Label smoothing of the loss.
        stack_cfg: The transformer stack of both (e.g. `t5_transformer_stack_config(arch=...)`);
            None: T5 1.1's.

    Returns:
        The T5EncoderDecoderModel config.
    """
    cfg = T5EncoderDecoderModel.default_config()
    cfg.set(z_loss_scale=z_loss_scale, label_smoothing=label_smoothing)
    cfg.shared_token_emb.set(num_embeddings=vocab_size, dim=dim)
    if stack_cfg is not None:
        cfg.encoder.transformer = stack_cfg.clone()
        cfg.decoder.transformer = stack_cfg.clone()
    cfg.encoder = t5_encoder_config(
        vocab_size=vocab_size,
        dim=dim,
        num_layers=num_encoder_layers,
        num_attention_heads=num_attention_heads,
        base_cfg=cfg.encoder,
    ).set(dropout_rate=dropout_rate)
    cross_attention = TransformerAttentionLayer.default_config()
    cross_attention.attention.num_heads = num_attention_heads
    cfg.decoder = t5_decoder_config(
        vocab_size=vocab_size,
        dim=dim,
        num_layers=num_decoder_layers,
        num_attention_heads=num_attention_heads,
        cross_attention=cross_attention,
        base_cfg=cfg.decoder,
    ).set(dropout_rate=dropout_rate)
    set_bias_recursively(cfg, False)
    set_norm_recursively(cfg, RMSNorm.default_config().set(eps=1e-6))
    return cfg
