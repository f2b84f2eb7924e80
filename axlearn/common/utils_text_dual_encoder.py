"""Config helpers for text dual encoders (`text_dual_encoder`).

- `bert_text_embedding_stream_encoder_config`: a `TextEmbeddingStreamEncoder` of a BERT encoder
  (with token types), pooled (by default) at the first token, linearly projected and
  L2-normalized.
- `init_state_builder_config` / `init_state_builder_siamese_model_config`: the
  `state_builder.Builder` that initializes a dual encoder's state from its encoders' builders
  (e.g. pretrained checkpoints), optionally through a `Converter`.
- `HF_PARAM_INIT`: the initializer of Hugging Face's BERT (weights ~ N(0, 0.02^2)).
"""

from typing import Optional

from axlearn.common.attention import (
    RepeatedTransformerLayer,
    StackedTransformerLayer,
    build_remat_spec,
)
from axlearn.common.base_layer import BaseLayer
from axlearn.common.bert import bert_embedding_config, bert_model_config, bert_transformer_config
from axlearn.common.layers import L2Norm, Linear
from axlearn.common.param_init import PARAM_REGEXP_WEIGHT, DefaultInitializer, WeightInitializer
from axlearn.common.poolings import BasePoolingLayer, FirstNTokenPooling
from axlearn.common.state_builder import Builder, ChainBuilder, Converter, RestoreAndConvertBuilder
from axlearn.common.text_dual_encoder import TextEmbeddingStreamEncoder
from axlearn.common.text_encoder import TextEmbeddingEncoder

__all__ = [
    "HF_PARAM_INIT",
    "bert_text_embedding_stream_encoder_config",
    "init_state_builder_config",
    "init_state_builder_siamese_model_config",
]

# Hugging Face BERT's initialization: every weight ~ N(0, 0.02^2), without fan scaling.
HF_PARAM_INIT = DefaultInitializer.default_config().set(
    init_by_param_name={
        PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
            fan=None, scale=0.02, distribution="normal"
        )
    }
)


def bert_text_embedding_stream_encoder_config(
    *,
    pad_token_id: int,
    vocab_size: int,
    max_seq_len: int,
    num_layers: int,
    num_heads: int,
    hidden_dim: int,
    output_dim: int,
    output_proj: Optional[Linear.Config] = Linear.default_config().set(bias=True),
    output_norm: Optional[BaseLayer.Config] = L2Norm.default_config(),
    pooler: Optional[BasePoolingLayer.Config] = None,
    remat: bool = False,
) -> TextEmbeddingStreamEncoder.Config:
    """A BERT-based `TextEmbeddingStreamEncoder` config (dropout 0.1, LayerNorm eps 1e-12,
    two token types).

    Args:
        pad_token_id: The input id of padding.
        vocab_size: Vocabulary size.
        max_seq_len: Number of learned positions (the longest input).
        num_layers: Number of transformer layers.
        num_heads: Attention heads per layer.
        hidden_dim: The BERT encoder's hidden dim.
        output_dim: The stream encoder's output dim.
        output_proj: Optional projection from hidden_dim to output_dim (None: none; then
            hidden_dim must equal output_dim). The default is cloned.
        output_norm: Optional normalization of the output (None: none). The default is cloned.
        pooler: Pools the hidden states (None: `FirstNTokenPooling`, the [CLS] token).
        remat: Whether to use a `RepeatedTransformerLayer` with `build_remat_spec`'s remat
            (else a `StackedTransformerLayer`).

    Returns:
        The stream encoder config.
    """
    if pooler is None:
        pooler = FirstNTokenPooling.default_config()
    base_stack = (
        RepeatedTransformerLayer.default_config()
        if remat
        else StackedTransformerLayer.default_config()
    )
    encoder_cfg = bert_model_config(
        vocab_size=vocab_size,
        dropout_rate=0.1,
        embedding_cfg=bert_embedding_config(
            max_position_embeddings=max_seq_len, type_vocab_size=2, layer_norm_epsilon=1e-12
        ),
        stack_cfg=bert_transformer_config(
            num_layers=num_layers,
            num_heads=num_heads,
            layer_norm_epsilon=1e-12,
            base_cfg=base_stack,
        ),
    ).encoder
    if remat:
        encoder_cfg.transformer.layer.remat_spec = build_remat_spec(encoder_cfg.transformer)
    return TextEmbeddingStreamEncoder.default_config().set(
        text_encoder=TextEmbeddingEncoder.default_config().set(
            pad_token_id=pad_token_id, encoder=encoder_cfg, pooler=pooler
        ),
        output_dim=output_dim,
        output_proj=output_proj.clone() if output_proj is not None else None,
        output_norm=output_norm.clone() if output_norm is not None else None,
        hidden_dim=hidden_dim,
    )


def init_state_builder_config(
    *,
    left_encoder_init_state_builder: Optional[Builder.Config] = None,
    right_encoder_init_state_builder: Optional[Builder.Config] = None,
    converter: Optional[Converter.Config] = None,
) -> Optional[Builder.Config]:
    """The builder initializing a dual encoder's state from its encoders' builders.

    Args:
        left_encoder_init_state_builder: Optional builder of the left encoder's state.
        right_encoder_init_state_builder: Optional builder of the right encoder's state.
        converter: Optional converter around the chained builders.

    Returns:
        None without either encoder's builder; else a `ChainBuilder` of the given builders (left
        first), inside a `RestoreAndConvertBuilder` with `converter` when one is given.
    """
    builders = [
        b
        for b in (left_encoder_init_state_builder, right_encoder_init_state_builder)
        if b is not None
    ]
    if not builders:
        return None
    chain = ChainBuilder.default_config().set(builders=builders)
    if converter is None:
        return chain
    return RestoreAndConvertBuilder.default_config().set(builder=chain, converter=converter)


def init_state_builder_siamese_model_config(
    *,
    shared_encoder_init_state_builder: Optional[Builder.Config] = None,
    converter: Optional[Converter.Config] = None,
) -> Optional[Builder.Config]:
    """The builder initializing a Siamese dual encoder's state from its shared encoder's.

    Args:
        shared_encoder_init_state_builder: Optional builder of the shared encoder's state.
        converter: Optional converter around it.

    Returns:
        None without a builder; else the builder, inside a `RestoreAndConvertBuilder` with
        `converter` when one is given.
    """
    if shared_encoder_init_state_builder is None:
        return None
    if converter is None:
        return shared_encoder_init_state_builder
    return RestoreAndConvertBuilder.default_config().set(
        builder=shared_encoder_init_state_builder, converter=converter
    )
