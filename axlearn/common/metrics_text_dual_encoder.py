"""Retrieval metrics of a text dual encoder (`text_dual_encoder`) over a whole eval set.

Each valid query (a left embedding) retrieves among all the eval set's right embeddings (every
query's positives, then every query's negatives, padded ones masked); its own positives are the
relevant items. Metrics, averaged over valid queries:
- "retrieval_accuracy@k": whether a relevant text is among the top k;
- "avg_rank": the rank of the best-ranked relevant text;
- "ndcg@k" (with `top_ks_for_ndcg`): NDCG@k with 0/1 gains, over queries with a relevant text.
`TextDualEncoderMetricCalculator` computes them from the model's predictions
(`GlobalMetricCalculator`).
"""

from typing import Optional

from jax import numpy as jnp

from axlearn.common.attention_bias import NEG_INF
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.evaler import GlobalMetricCalculator, PredictionOutputs
from axlearn.common.loss import contrastive_logits
from axlearn.common.metrics_retrieval import (
    average_rank,
    calculate_mean_metrics,
    ndcg_at_k,
    top_k_accuracy,
)
from axlearn.common.text_dual_encoder import (
    FLATTENED_LEFT_EMBEDDINGS,
    FLATTENED_RIGHT_EMBEDDINGS,
    NEGATIVE_EMBEDDINGS,
    NEGATIVE_PADDINGS,
    POSITIVE_EMBEDDINGS,
    POSITIVE_PADDINGS,
    RIGHT_PADDINGS,
    flatten_and_concat_embeddings,
)
from axlearn.common.utils import Tensor

__all__ = ["TextDualEncoderMetricCalculator", "calculate_retrieval_metrics_from_similarity_matrix"]


def _calculate_retrieval_metrics_from_embeddings(
    *,
    top_ks_for_accuracy: list[int],
    query_embeddings: Tensor,
    query_paddings: Tensor,
    text_positive_embeddings: Tensor,
    text_positive_paddings: Tensor,
    text_negative_embeddings: Optional[Tensor] = None,
    text_negative_paddings: Optional[Tensor] = None,
    top_ks_for_ndcg: Optional[list[int]] = None,
) -> dict[str, Tensor]:
    """The retrieval metrics of dot-product similarities of the embeddings.

    Args:
        top_ks_for_accuracy: The k values of retrieval_accuracy@k.
        query_embeddings: [num_queries, 1, dim].
        query_paddings: 0/1 [num_queries, 1] (1: padding).
        text_positive_embeddings: [num_queries, max_positives, dim].
        text_positive_paddings: 0/1 [num_queries, max_positives].
        text_negative_embeddings: Optional [num_queries, max_negatives, dim].
        text_negative_paddings: 0/1 [num_queries, max_negatives], given with the negatives.
        top_ks_for_ndcg: Optional k values of ndcg@k.

    Returns:
        See `calculate_retrieval_metrics_from_similarity_matrix`.
    """
    flat = flatten_and_concat_embeddings(
        left_positive_embeddings=query_embeddings,
        right_positive_embeddings=text_positive_embeddings,
        right_positive_paddings=text_positive_paddings,
        right_negative_embeddings=text_negative_embeddings,
        right_negative_paddings=text_negative_paddings,
    )
    sim = contrastive_logits(flat[FLATTENED_LEFT_EMBEDDINGS], flat[FLATTENED_RIGHT_EMBEDDINGS])
    return calculate_retrieval_metrics_from_similarity_matrix(
        sim=sim,
        text_positive_paddings=text_positive_paddings,
        query_paddings=query_paddings,
        text_paddings=flat[RIGHT_PADDINGS],
        top_ks_for_accuracy=top_ks_for_accuracy,
        top_ks_for_ndcg=top_ks_for_ndcg,
    )


def calculate_retrieval_metrics_from_similarity_matrix(
    *,
    sim: Tensor,
    text_positive_paddings: Tensor,
    query_paddings: Tensor,
    text_paddings: Tensor,
    top_ks_for_accuracy: list[int],
    top_ks_for_ndcg: Optional[list[int]] = None,
) -> dict[str, Tensor]:
    """Query-to-text retrieval metrics of a similarity matrix.

    Query i's relevant texts are columns i * max_positives + j for its unpadded positives j
    (the layout of `flatten_and_concat_embeddings`: all positives first).

    Args:
        sim: [num_queries, num_texts] similarities, num_texts =
            num_queries * (max_positives + max_negatives).
        text_positive_paddings: 0/1 [num_queries, max_positives] (1: padding).
        query_paddings: 0/1 [num_queries, 1] (1: padding).
        text_paddings: 0/1 [num_texts] (1: padding, masked out of the ranking).
        top_ks_for_accuracy: The k values of "retrieval_accuracy@k".
        top_ks_for_ndcg: Optional k values of "ndcg@k".

    Returns:
        {"retrieval_accuracy@k": ..., "avg_rank": ..., and "ndcg@k": ... with top_ks_for_ndcg},
        each a mean over valid queries (ndcg: those with a relevant text).
    """
    num_queries, max_positives = text_positive_paddings.shape
    # targets[i, j] = i * max_positives + j: the column of query i's j-th positive.
    targets = jnp.arange(num_queries * max_positives, dtype=jnp.int32).reshape(
        num_queries, max_positives
    )
    # Padded positives become -1 (no column).
    accuracy = top_k_accuracy(
        sim,
        targets * (1 - text_positive_paddings) - text_positive_paddings,
        top_ks_for_accuracy,
        similarity_bias=text_paddings * NEG_INF,
    )
    relevance = jnp.zeros_like(sim).at[jnp.arange(num_queries)[:, None], targets].set(1)
    relevance = relevance * (1 - text_paddings)
    masked_sim = sim + text_paddings * NEG_INF
    metrics = {}
    if top_ks_for_ndcg:
        no_relevant = relevance.max(axis=-1) == 0
        for k, values in ndcg_at_k(
            scores=masked_sim, relevance_labels=relevance, top_ks=top_ks_for_ndcg
        ).items():
            metrics.update(
                calculate_mean_metrics(
                    metric_name=f"ndcg@{k}",
                    query_metrics=values,
                    query_padding=jnp.logical_or(query_paddings.reshape(-1), no_relevant),
                )
            )
    valid = 1 - jnp.reshape(query_paddings, -1)
    for i, k in enumerate(top_ks_for_accuracy):
        metrics[f"retrieval_accuracy@{k}"] = jnp.sum(accuracy[i] * valid) / jnp.sum(valid)
    metrics["avg_rank"] = average_rank(
        scores=masked_sim, relevance_labels=relevance, query_padding=query_paddings
    )["avg_rank"]
    return metrics


class TextDualEncoderMetricCalculator(GlobalMetricCalculator):
    """Retrieval metrics of a text dual encoder over the eval set (see the module docstring).

    The model's predictions hold `predict_outputs[<encoder>][POSITIVE_EMBEDDINGS]` (and the
    right encoder's NEGATIVE_EMBEDDINGS); the batch holds the paddings under the same names.
    """

    @config_class
    class Config(GlobalMetricCalculator.Config):
        """Configures TextDualEncoderMetricCalculator."""

        # The left (query) encoder's name.
        left_encoder_name: Required[str] = REQUIRED
        # The right (text) encoder's name.
        right_encoder_name: Required[str] = REQUIRED
        # The k values of "retrieval_accuracy@k".
        top_ks_for_accuracy: Required[list[int]] = REQUIRED
        # Optional k values of "ndcg@k".
        top_ks_for_ndcg: Optional[list[int]] = None

    def _calculate_metrics(self, outputs: PredictionOutputs) -> dict[str, Tensor]:
        """The metrics of the eval set's predictions (`get_summaries` adds the prefix)."""
        cfg = self.config
        predicted, batch = outputs.predict_outputs, outputs.input_batch
        left, right = cfg.left_encoder_name, cfg.right_encoder_name
        negatives = predicted[right].get(NEGATIVE_EMBEDDINGS)
        return _calculate_retrieval_metrics_from_embeddings(
            top_ks_for_accuracy=cfg.top_ks_for_accuracy,
            top_ks_for_ndcg=cfg.top_ks_for_ndcg,
            query_embeddings=predicted[left][POSITIVE_EMBEDDINGS],
            query_paddings=batch[left][POSITIVE_PADDINGS],
            text_positive_embeddings=predicted[right][POSITIVE_EMBEDDINGS],
            text_positive_paddings=batch[right][POSITIVE_PADDINGS],
            text_negative_embeddings=negatives,
            text_negative_paddings=(
                batch[right][NEGATIVE_PADDINGS] if negatives is not None else None
            ),
        )
