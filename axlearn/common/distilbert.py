"""DistilBERT as a `text_encoder.TextEmbeddingEncoder` (Sanh et al., https://arxiv.org/abs/1910.01108).

DistilBERT is BERT without token-type embeddings and without the pooler: token plus learned
position embeddings and a LayerNorm, then post-norm transformer layers with a GELU feed-forward.
`set_distilbert_config` builds that encoder from `bert`'s config helpers and pools it (by default
the first token), so that a `TextEmbeddingStreamEncoder` (`text_dual_encoder`) can use it.

Defaults are those of Hugging Face's `DistilBertConfig` (distilbert-base-uncased). HF's
`activation="gelu"` is the exact (erf) GELU, `"exact_gelu"` here; the default `"nn.gelu"` is the
tanh approximation.
"""

from typing import Optional, Union

from axlearn.common.attention import (
    RepeatedTransformerLayer,
    StackedTransformerLayer,
    build_remat_spec,
    scaled_hidden_dim,
)
from axlearn.common.bert import bert_embedding_config, bert_model_config, bert_transformer_config
from axlearn.common.config import FunctionConfigBase
from axlearn.common.layers import set_dropout_rate_recursively, set_layer_norm_eps_recursively
from axlearn.common.poolings import BasePoolingLayer, FirstNTokenPooling
from axlearn.common.text_encoder import TextEmbeddingEncoder

__all__ = ["set_distilbert_config"]


def set_distilbert_config(
    *,
    vocab_size: int = 30522,
    num_layers: int = 6,
    model_dim: int = 768,
    num_heads: int = 12,
    max_seq_len: int = 512,
    dropout_rate: float = 0.1,
    pad_token_id: int = 0,
    pooler_config: Optional[BasePoolingLayer.Config] = None,
    feed_forward_dim: Union[int, FunctionConfigBase, None] = None,
    feed_forward_act: str = "nn.gelu",
    layer_norm_eps: float = 1e-12,
    remat: bool = False,
) -> TextEmbeddingEncoder.Config:
    """A DistilBERT text embedding encoder config.

    Args:
        vocab_size: Vocabulary size of the tokenizer.
        num_layers: Number of transformer layers.
        model_dim: Hidden (and output) dim.
        num_heads: Attention heads per layer.
        max_seq_len: Number of learned positions (the longest input).
        dropout_rate: Rate of every dropout in the encoder.
        pad_token_id: The input id of padding.
        pooler_config: Pools the hidden states (None: `FirstNTokenPooling`, the first token).
        feed_forward_dim: Feed-forward hidden dim, an int or a function config of the input dim
            (None: `scaled_hidden_dim(4)`).
        feed_forward_act: Feed-forward activation ("exact_gelu" is HF's "gelu").
        layer_norm_eps: Epsilon of every LayerNorm.
        remat: Whether to use a `RepeatedTransformerLayer` with `build_remat_spec`'s remat
            (else a `StackedTransformerLayer` without remat).

    Returns:
        The `TextEmbeddingEncoder` config (output_dim `model_dim`).
    """
    if pooler_config is None:
        pooler_config = FirstNTokenPooling.default_config()
    if feed_forward_dim is None:
        feed_forward_dim = scaled_hidden_dim(scale=4)
    base_stack = (
        RepeatedTransformerLayer.default_config()
        if remat
        else StackedTransformerLayer.default_config()
    )
    encoder_cfg = bert_model_config(
        vocab_size=vocab_size,
        hidden_dim=model_dim,
        embedding_cfg=bert_embedding_config(
            max_position_embeddings=max_seq_len, layer_norm_epsilon=layer_norm_eps
        ),
        stack_cfg=bert_transformer_config(
            base_cfg=base_stack,
            num_layers=num_layers,
            num_heads=num_heads,
            layer_norm_epsilon=layer_norm_eps,
        ),
    ).encoder
    layer_cfg = encoder_cfg.transformer.layer
    layer_cfg.feed_forward.activation = feed_forward_act
    layer_cfg.feed_forward.hidden_dim = feed_forward_dim
    if remat:
        layer_cfg.remat_spec = build_remat_spec(encoder_cfg.transformer)

    cfg = TextEmbeddingEncoder.default_config().set(
        output_dim=model_dim,
        pad_token_id=pad_token_id,
        encoder=encoder_cfg,
        pooler=pooler_config,
    )
    # bert_model_config sets BERT's epsilon on every norm; DistilBERT's may differ.
    set_layer_norm_eps_recursively(cfg, layer_norm_eps)
    set_dropout_rate_recursively(cfg, dropout_rate)
    return cfg
