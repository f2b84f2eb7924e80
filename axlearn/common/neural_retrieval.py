"""Dense Passage Retrieval configs (AXLearn's `axlearn.common.neural_retrieval`).

DPR (https://arxiv.org/abs/2004.04906) encodes queries and passages with two BERT encoders and
trains them with an in-batch contrastive loss on the [CLS] embeddings' dot products. The
helpers build those configs from `text_dual_encoder` parts, with Hugging Face's DPR defaults
(exact GELU, N(0, 0.02) weights, no output projection or norm):
- `set_bert_dpr_encoder_config`: one BERT `TextEmbeddingStreamEncoder`;
- `set_dpr_model_config`: a `TextEmbeddingDualEncoder` of a query and a passage encoder;
- `set_siamese_dpr_model_config`: the same with one encoder shared by both streams.
"""

from typing import Optional

from axlearn.common.config import InstantiableConfig
from axlearn.common.layers import RedirectToSharedModule
from axlearn.common.text_dual_encoder import (
    TEXT_DUAL_ENCODER_SHARED_MODULE_NAME,
    TextEmbeddingAsymmetricContrastiveLossLayer,
    TextEmbeddingDualEncoder,
    TextEmbeddingStreamEncoder,
)
from axlearn.common.utils_text_dual_encoder import (
    HF_PARAM_INIT,
    bert_text_embedding_stream_encoder_config,
)

# The stream names of the DPR dual encoder.
QUERY_ENCODER_NAME = "query_encoder"
PASSAGE_ENCODER_NAME = "passage_encoder"


def set_bert_dpr_encoder_config(
    *,
    vocab_size: int,
    num_layers: int,
    model_dim: int,
    num_heads: int,
    max_seq_len: int = 512,
    pad_token_id: int = 0,
    feed_forward_act: str = "exact_gelu",
    output_norm: Optional[InstantiableConfig] = None,
    remat: bool = False,
) -> TextEmbeddingStreamEncoder.Config:
    """A BERT DPR stream encoder: the [CLS] hidden state of a BERT encoder is the embedding.

    Args:
        vocab_size: The vocabulary size.
        num_layers: The number of transformer layers.
        model_dim: The hidden (and embedding) dim.
        num_heads: The number of attention heads.
        max_seq_len: The number of position embeddings.
        pad_token_id: The padding token id.
        feed_forward_act: The feed-forward activation (HF DPR: exact GELU).
        output_norm: An optional norm of the output embedding (None: none, as HF DPR).
        remat: Whether to use a rematerialized repeated transformer (saves memory).

    Returns:
        The stream encoder config.
    """
    cfg = bert_text_embedding_stream_encoder_config(
        pad_token_id=pad_token_id,
        vocab_size=vocab_size,
        max_seq_len=max_seq_len,
        num_layers=num_layers,
        num_heads=num_heads,
        hidden_dim=model_dim,
        output_dim=model_dim,
        output_proj=None,
        output_norm=output_norm,
        remat=remat,
    )
    encoder = cfg.text_encoder.encoder
    encoder.transformer.layer.feed_forward.activation = feed_forward_act
    for emb in (encoder.emb.token_emb, encoder.emb.pos_emb, encoder.emb.type_emb):
        emb.param_init = HF_PARAM_INIT
    return cfg


def _contrastive_fusion(contrastive_loss_scale_factor: float) -> dict:
    return {
        "contrastive_fusion_network": (
            TextEmbeddingAsymmetricContrastiveLossLayer.default_config().set(
                left_encoder_name=QUERY_ENCODER_NAME,
                right_encoder_name=PASSAGE_ENCODER_NAME,
                contrastive_loss_scale_factor=contrastive_loss_scale_factor,
            )
        )
    }


def set_dpr_model_config(
    *,
    query_encoder_cfg: TextEmbeddingStreamEncoder.Config,
    passage_encoder_cfg: TextEmbeddingStreamEncoder.Config,
    contrastive_loss_scale_factor: float = 1.0,
) -> TextEmbeddingDualEncoder.Config:
    """The DPR dual encoder: separate query and passage encoders, in-batch contrastive loss.

    Args:
        query_encoder_cfg: The query encoder.
        passage_encoder_cfg: The passage encoder.
        contrastive_loss_scale_factor: The inverse temperature of the contrastive loss.

    Returns:
        The dual encoder config.
    """
    return TextEmbeddingDualEncoder.default_config().set(
        param_init=HF_PARAM_INIT,
        stream_encoder={
            QUERY_ENCODER_NAME: query_encoder_cfg,
            PASSAGE_ENCODER_NAME: passage_encoder_cfg,
        },
        fusion_network=_contrastive_fusion(contrastive_loss_scale_factor),
    )


def set_siamese_dpr_model_config(
    *,
    shared_encoder_cfg: TextEmbeddingStreamEncoder.Config,
    contrastive_loss_scale_factor: float = 1.0,
) -> TextEmbeddingDualEncoder.Config:
    """The Siamese DPR dual encoder: the passage stream redirects to the query encoder.

    Args:
        shared_encoder_cfg: The encoder of both streams (its parameters live once, under the
            query encoder).
        contrastive_loss_scale_factor: The inverse temperature of the contrastive loss.

    Returns:
        The dual encoder config.
    """
    passage_encoder_cfg = RedirectToSharedModule.default_config().set(
        shared_module=TEXT_DUAL_ENCODER_SHARED_MODULE_NAME
    )
    return TextEmbeddingDualEncoder.default_config().set(
        param_init=HF_PARAM_INIT,
        stream_encoder={
            QUERY_ENCODER_NAME: shared_encoder_cfg,
            PASSAGE_ENCODER_NAME: passage_encoder_cfg,
        },
        fusion_network=_contrastive_fusion(contrastive_loss_scale_factor),
        shared_encoder_name=QUERY_ENCODER_NAME,
    )
