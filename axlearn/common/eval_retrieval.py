"""Retrieval metric calculators (`evaler.GlobalMetricCalculator`s) over a whole eval set.

- `CLIPRetrievalMetricCalculator`: image-to-text and text-to-image top-k accuracy of paired
  image and caption embeddings (`calculate_clip_retrieval_metrics`, labels from
  `clip_generate_labels`).
- `EmbeddingRetrievalMetricCalculator`: every valid example (label >= 0) queries the others (or,
  with "is_query", the query examples query the index ones) by negative squared L2 distance; an
  index item is relevant when it has the query's label. `metrics` names what is averaged over
  the queries: "MAP" / "MAP@k", "accuracy@k", "recall@k" (optionally per "category").
- `CxcImageRetrievalMetricCalculator`: the same with the CxC image-similarity relevance scores
  (https://arxiv.org/abs/2004.15020) of a CSV file, relevant when >= `threshold`.
- `KnnMetricCalculator`: weighted k-NN classification accuracy (Wu et al.,
  https://arxiv.org/abs/1805.01978, sec. 3.4) for each k and temperature.

The calculators' `_calculate_metrics` run on the host after all batches; `get_summaries` adds
the calculator's prefix to the names.
"""

import csv
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Callable, Optional

import jax
import numpy as np
from absl import logging
from jax import numpy as jnp

from axlearn.common import file_system as fs
from axlearn.common import utils
from axlearn.common.attention_bias import NEG_INF
from axlearn.common.base_model import BaseModel
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.evaler import GlobalMetricCalculator, PredictionOutputs
from axlearn.common.loss import contrastive_logits
from axlearn.common.metrics_retrieval import (
    average_precision_at_k,
    calculate_mean_metrics,
    metric_at_k_name,
    top_k_accuracy,
    top_k_recall,
)
from axlearn.common.module import Module
from axlearn.common.utils import NestedPartitionSpec, NestedTensor, Tensor

__all__ = [
    "CLIPRetrievalMetricCalculator",
    "CxcImageRetrievalMetricCalculator",
    "EmbeddingRetrievalMetricCalculator",
    "KnnMetricCalculator",
    "calculate_clip_retrieval_metrics",
    "clip_generate_labels",
    "get_pairwise_distances_sqr",
]


def clip_generate_labels(sentence_paddings: Tensor) -> dict[str, Tensor]:
    """Retrieval labels of aligned images and captions (image i has captions i * S .. i * S + S-1).

    Args:
        sentence_paddings: 0/1 int [num_images, S] (1: padded caption).

    Returns:
        {"image_to_text_label": int [num_images, S], the caption indices of each image (-1 for
            padded captions),
         "image_to_text_similarity_bias": [num_images, S] NEG_INF at padded captions (the bias
            of the flattened captions, as a [num_images * S] row once reshaped),
         "text_to_image_label": int [num_images * S, 1], each caption's image (-1: padding),
         "text_to_image_similarity_bias": [num_images, 1] NEG_INF at images without captions}.
    """
    num_images, num_sentences = sentence_paddings.shape
    flat_paddings = sentence_paddings.reshape(-1, 1)
    image_of_text = jnp.repeat(jnp.arange(num_images, dtype=jnp.int32), num_sentences)[:, None]
    text_to_image = image_of_text * (1 - flat_paddings) - flat_paddings
    texts = jnp.arange(num_images * num_sentences, dtype=jnp.int32).reshape(
        num_images, num_sentences
    )
    image_to_text = texts * (1 - sentence_paddings) - sentence_paddings
    image_paddings = 1 - (jnp.sum(1 - sentence_paddings, axis=1, keepdims=True) > 0)
    return dict(
        image_to_text_label=image_to_text,
        image_to_text_similarity_bias=sentence_paddings * NEG_INF,
        text_to_image_label=text_to_image,
        text_to_image_similarity_bias=image_paddings * NEG_INF,
    )


def calculate_clip_retrieval_metrics(
    *,
    top_ks: list[int],
    visual_embeddings: Tensor,
    textual_embeddings: Tensor,
    valid_sentences: Tensor,
) -> dict[str, Tensor]:
    """Image-to-text and text-to-image top-k accuracies by dot-product similarity.

    Args:
        top_ks: The k values.
        visual_embeddings: [num_examples, 1, dim].
        textual_embeddings: [num_examples, num_sentences, dim].
        valid_sentences: 0/1 [num_examples, num_sentences] (1: a real caption).

    Returns:
        {"i2t_top@k": mean over images with a caption, "t2i_top@k": mean over captions}.

    Raises:
        AssertionError: If the shapes disagree.
    """
    num_examples, num_sentences = valid_sentences.shape
    dim = visual_embeddings.shape[-1]
    if textual_embeddings.shape != (num_examples, num_sentences, dim):
        raise AssertionError(f"{textual_embeddings.shape} vs. {valid_sentences.shape}")
    if visual_embeddings.shape != (num_examples, 1, dim):
        raise AssertionError(f"{visual_embeddings.shape} vs. {valid_sentences.shape}")
    valid_images = (jnp.sum(valid_sentences, axis=1) > 0).astype(jnp.float32)
    valid_texts = valid_sentences.reshape(-1).astype(jnp.float32)
    i2t = contrastive_logits(
        visual_embeddings.reshape(-1, dim), textual_embeddings.reshape(-1, dim)
    )
    labels = clip_generate_labels(1 - valid_sentences)
    i2t_hits = top_k_accuracy(
        i2t,
        labels["image_to_text_label"],
        top_ks,
        similarity_bias=labels["image_to_text_similarity_bias"],
    )
    t2i_hits = top_k_accuracy(
        i2t.T,
        labels["text_to_image_label"],
        top_ks,
        similarity_bias=labels["text_to_image_similarity_bias"],
    )
    metrics = {}
    for i, k in enumerate(top_ks):
        metrics[f"i2t_top@{k}"] = jnp.sum(i2t_hits[i] * valid_images) / jnp.sum(valid_images)
        metrics[f"t2i_top@{k}"] = jnp.sum(t2i_hits[i] * valid_texts) / jnp.sum(valid_texts)
    return metrics


class CLIPRetrievalMetricCalculator(GlobalMetricCalculator):
    """CLIP retrieval accuracies from predict_outputs["visual_encoder"|"textual_encoder"]
    ["output_features"] and input_batch["input"]["valid_sentences"]."""

    @config_class
    class Config(GlobalMetricCalculator.Config):
        """Configures CLIPRetrievalMetricCalculator."""

        # The k values of the top-k accuracies.
        top_ks: Required[list[int]] = REQUIRED

    def _calculate_metrics(self, outputs: PredictionOutputs) -> dict[str, Tensor]:
        """See `calculate_clip_retrieval_metrics`."""
        predicted = outputs.predict_outputs
        return calculate_clip_retrieval_metrics(
            top_ks=self.config.top_ks,
            visual_embeddings=predicted["visual_encoder"]["output_features"],
            textual_embeddings=predicted["textual_encoder"]["output_features"],
            valid_sentences=outputs.input_batch["input"]["valid_sentences"],
        )


def _named_metric(fn: Callable, name: str, top_ks: list[int]) -> Callable:
    """A function of (scores, relevance_labels) giving {metric_at_k_name(name, k): [M]}."""

    def compute(*, scores: Tensor, relevance_labels: Tensor) -> dict[str, Tensor]:
        values = fn(scores, relevance_labels, top_ks)
        if not isinstance(values, dict):
            values = dict(zip(top_ks, values))
        return {metric_at_k_name(name, k): v for k, v in values.items()}

    return compute


_RANKING_METRICS = {
    "MAP": lambda s, r, ks: average_precision_at_k(s, r, ks),
    "accuracy": lambda s, r, ks: top_k_accuracy(s, None, ks, relevance_labels=r),
    "recall": lambda s, r, ks: top_k_recall(s, None, ks, relevance_labels=r),
}


def _get_ranking_metrics_fns(metrics: Sequence[str]) -> list[Callable]:
    """Per-query metric functions for names like "MAP", "MAP@5", "accuracy@1", "recall@10"."""
    ks_by_name: dict[str, list[int]] = {}
    for metric in metrics:
        name, k = metric.split("@", 1) if "@" in metric else (metric, -1)
        ks_by_name.setdefault(name, []).append(int(k))
    fns = []
    for name, ks in ks_by_name.items():
        if name not in _RANKING_METRICS:
            raise ValueError(f"Unknown metric: {name} (known: {sorted(_RANKING_METRICS)})")
        fns.append(_named_metric(_RANKING_METRICS[name], name, ks))
    return fns


def get_pairwise_distances_sqr(a: Tensor, b: Tensor) -> Tensor:
    """Squared L2 distances ||a_i - b_j||^2 without an [N, M, dim] broadcast.

    Args:
        a: [N, dim].
        b: [M, dim].

    Returns:
        [N, M].
    """
    aa = jnp.sum(a**2, axis=-1)
    bb = jnp.sum(b**2, axis=-1)
    return aa[:, None] + bb[None, :] - 2 * jnp.einsum("id,jd->ij", a, b)


def _select_keys(kv: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    return {k: v for k, v in kv.items() if k in keys}


def _squeezed_embeddings(outputs: PredictionOutputs) -> Tensor:
    embeddings = outputs.predict_outputs["embedding"]
    # Multi-stream models give [num_examples, 1, dim].
    return jnp.squeeze(embeddings, 1) if embeddings.ndim == 3 else embeddings


class EmbeddingRetrievalMetricCalculator(GlobalMetricCalculator):
    """Embedding retrieval metrics (see the module docstring).

    The batch's input_batch["input"] holds "label" (int; < 0: padding), optionally "category"
    (int) and "is_query" (bool: queries vs. index items; without it every valid item queries all
    the others); the embeddings are `predict_outputs[embedding_field]`.
    """

    @config_class
    class Config(GlobalMetricCalculator.Config):
        """Configures EmbeddingRetrievalMetricCalculator."""

        # Metric names: "MAP", "MAP@k", "accuracy@k", "recall@k".
        metrics: Required[list[str]] = REQUIRED
        # Optional names of the "category" ids (per-category means are added).
        categories_names: Optional[tuple[str, ...]] = None
        # The predictions' embedding field ("a/b/c" for nested fields).
        embedding_field: Optional[str] = "embedding"
        # Whether a query may retrieve itself (when there is no "is_query").
        allow_self_match: bool = False
        # The most queries scored at once (bounds the [queries, index] score matrix).
        max_query_chunk_size: int = 5000

    def __init__(
        self,
        cfg: Config,
        *,
        parent: Optional[Module],
        model: BaseModel,
        model_param_partition_specs: NestedPartitionSpec,
    ):
        super().__init__(
            cfg, parent=parent, model=model, model_param_partition_specs=model_param_partition_specs
        )
        self._metrics_fns = _get_ranking_metrics_fns(self.config.metrics)

    def forward(
        self, input_batch: NestedTensor, *, model_params: NestedTensor, state: NestedTensor
    ) -> dict[str, NestedTensor]:
        """Predicts one batch and keeps only what the metrics need.

        Args:
            input_batch: The eval batch.
            model_params: The model parameters.
            state: The calculator state.

        Returns:
            {"state": the next state, "output": the selected `PredictionOutputs`}.
        """
        result = super().forward(input_batch, model_params=model_params, state=state)
        result["output"] = self._select_predictions(result["output"])
        return result

    def _calculate_metrics(self, outputs: PredictionOutputs) -> dict[str, Tensor]:
        """Means of the per-query metrics over the queries, plus "num_valid" (the query count)."""
        chunks, num_queries = self._get_query_indices_chunked(outputs)
        per_chunk = [self._get_chunk_metrics(outputs, chunk) for chunk in chunks]
        categories = [self._get_categories(outputs, chunk) for chunk in chunks]
        categories = None if categories[0] is None else jnp.concatenate(categories)
        per_query = jax.tree.map(lambda *xs: jnp.concatenate(xs), *per_chunk)
        metrics = {"num_valid": num_queries}
        for name, values in per_query.items():
            metrics.update(
                calculate_mean_metrics(
                    metric_name=name,
                    query_metrics=values,
                    query_padding=jnp.zeros(num_queries, dtype=bool),
                    query_categories=categories,
                    categories_names=self.config.categories_names,
                )
            )
        logging.info("%s: %s", self.path(), metrics)
        return metrics

    def _get_chunk_metrics(
        self, outputs: PredictionOutputs, query_indices: Tensor
    ) -> dict[str, Tensor]:
        """{metric name: [len(query_indices)]} of one chunk of queries."""
        scores = self._get_scores(outputs, query_indices)
        relevance = self._get_relevance_labels(outputs, query_indices)
        metrics = {}
        for fn in self._metrics_fns:
            metrics.update(fn(scores=scores, relevance_labels=relevance))
        return metrics

    def _select_predictions(self, outputs: PredictionOutputs) -> PredictionOutputs:
        """Keeps the label/category/is_query inputs and the embeddings."""
        embeddings = utils.get_recursively(outputs.predict_outputs, self.config.embedding_field)
        return PredictionOutputs(
            input_batch=_select_keys(
                outputs.input_batch["input"], ("label", "category", "is_query")
            ),
            predict_outputs={"embedding": embeddings},
        )

    def _get_query_indices_chunked(self, outputs: PredictionOutputs) -> tuple[list[Tensor], int]:
        """The indices of the valid queries, in chunks of max_query_chunk_size, and their count."""
        is_query = outputs.input_batch.get("is_query")
        if is_query is None:
            is_query = jnp.ones([outputs.predict_outputs["embedding"].shape[0]], dtype=bool)
        query_indices = jnp.where(jnp.logical_and(is_query, self._get_valids_mask(outputs)))[0]
        num_queries = int(query_indices.shape[0])
        size = self.config.max_query_chunk_size
        return jnp.split(query_indices, np.arange(size, num_queries, size)), num_queries

    def _get_valids_mask(self, outputs: PredictionOutputs) -> Tensor:
        """Bool [num_examples]: the examples that take part (label >= 0)."""
        return outputs.input_batch["label"] >= 0

    def _get_index_mask(self, outputs: PredictionOutputs) -> Tensor:
        """Bool [num_examples]: the index items (valid, and not queries when is_query is given)."""
        mask = self._get_valids_mask(outputs)
        is_query = outputs.input_batch.get("is_query")
        if is_query is not None:
            mask = jnp.logical_and(mask, ~is_query)
        return mask

    def _get_scores(self, outputs: PredictionOutputs, query_indices: Tensor) -> Tensor:
        """[queries, index items] negative squared distances (self-matches masked)."""
        embeddings = _squeezed_embeddings(outputs)
        index_mask = self._get_index_mask(outputs)
        scores = -get_pairwise_distances_sqr(embeddings[query_indices], embeddings[index_mask])
        if "is_query" not in outputs.input_batch and not self.config.allow_self_match:
            # Every query is an index item too: its column is its rank among the index items.
            column = (jnp.cumsum(index_mask) - 1)[query_indices]
            scores += jax.nn.one_hot(column, scores.shape[1]) * NEG_INF
        return scores

    def _get_relevance_labels(self, outputs: PredictionOutputs, query_indices: Tensor) -> Tensor:
        """Bool [queries, index items]: the same label."""
        labels = outputs.input_batch["label"]
        index_labels = labels[self._get_index_mask(outputs)]
        return labels[query_indices][:, None] == index_labels[None, :]

    def _get_categories(
        self, outputs: PredictionOutputs, query_indices: Tensor
    ) -> Optional[Tensor]:
        """The queries' categories, or None."""
        categories = outputs.input_batch.get("category")
        return None if categories is None else categories[query_indices]


def _load_cxc_relevance(path: str) -> tuple[Tensor, dict[str, int]]:
    """The symmetric [n, n] "agg_score" matrix of a CxC CSV (image1, image2, agg_score) and the
    position of each image file name."""
    with fs.open(path) as f:
        rows = list(csv.DictReader(f))
    names = sorted({row[k] for row in rows for k in ("image1", "image2")})
    position = {name: i for i, name in enumerate(names)}
    scores = np.zeros((len(names), len(names)))
    for row in rows:
        i, j = position[row["image1"]], position[row["image2"]]
        scores[i, j] = scores[j, i] = float(row["agg_score"])
    return jnp.asarray(scores), position


class CxcImageRetrievalMetricCalculator(EmbeddingRetrievalMetricCalculator):
    """Image retrieval on COCO val images with CxC relevance (input_batch["input"]["image_id"]);
    images missing from the CSV are left out."""

    @config_class
    class Config(EmbeddingRetrievalMetricCalculator.Config):
        """Configures CxcImageRetrievalMetricCalculator."""

        # The CxC "sis" CSV of image pairs and their aggregated similarity scores.
        image_relevance_path: str = "gs://axlearn-public/generic_embedding/eval/cxc/sis_test.csv"
        # Pairs scoring at least this are relevant.
        threshold: float = 3.0

    def __init__(
        self,
        cfg: Config,
        *,
        parent: Optional[Module],
        model: BaseModel,
        model_param_partition_specs: NestedPartitionSpec,
    ):
        super().__init__(
            cfg, parent=parent, model=model, model_param_partition_specs=model_param_partition_specs
        )
        self._relevance_scores, self._image_id_to_pos = _load_cxc_relevance(
            self.config.image_relevance_path
        )

    def _select_predictions(self, outputs: PredictionOutputs) -> PredictionOutputs:
        """Keeps the image ids and the embeddings."""
        embeddings = utils.get_recursively(outputs.predict_outputs, self.config.embedding_field)
        return PredictionOutputs(
            input_batch=_select_keys(outputs.input_batch["input"], ("image_id",)),
            predict_outputs={"embedding": embeddings},
        )

    def _get_permutation(self, outputs: PredictionOutputs) -> Tensor:
        """Each example's row in the relevance matrix (-1: not in the CSV)."""
        return jnp.array(
            [
                self._image_id_to_pos.get(f"COCO_val2014_{int(image_id):012}.jpg", -1)
                for image_id in outputs.input_batch["image_id"]
            ]
        )

    def _get_valids_mask(self, outputs: PredictionOutputs) -> Tensor:
        return self._get_permutation(outputs) >= 0

    def _get_relevance_labels(self, outputs: PredictionOutputs, query_indices: Tensor) -> Tensor:
        perm = self._get_permutation(outputs)
        perm = perm[perm >= 0]
        relevance = self._relevance_scores[perm][:, perm]
        return relevance[query_indices] >= self.config.threshold


class KnnMetricCalculator(EmbeddingRetrievalMetricCalculator):
    """Weighted k-NN accuracy: each query's label is predicted by its k most similar index items
    (dot products s), each voting for its label with weight exp(s / temp)."""

    @config_class
    class Config(EmbeddingRetrievalMetricCalculator.Config):
        """Configures KnnMetricCalculator."""

        # The numbers of neighbors.
        top_ks: tuple[int, ...] = (1, 20, 200)
        # The vote temperatures.
        temps: tuple[float, ...] = (0.01, 0.03, 0.07)
        # The number of labels (labels lie in [0, num_labels)).
        num_labels: Required[int] = REQUIRED

    @classmethod
    def default_config(cls) -> Config:
        """The default config, without `metrics` (k-NN accuracy is built in)."""
        cfg = super().default_config()
        cfg.metrics = []
        return cfg

    def _get_chunk_metrics(
        self, outputs: PredictionOutputs, query_indices: Tensor
    ) -> dict[str, Tensor]:
        """{"knn-t<temp>@<k>": 0/1 [queries] correct predictions}."""
        cfg = self.config
        embeddings = _squeezed_embeddings(outputs)
        labels = outputs.input_batch["label"]
        index_mask = self._get_index_mask(outputs)
        index_labels = labels[index_mask]
        sims = jnp.einsum("id,jd->ij", embeddings[query_indices], embeddings[index_mask])
        votes_by_label = jax.vmap(partial(jax.ops.segment_sum, num_segments=cfg.num_labels))
        metrics = {}
        for k in cfg.top_ks:
            top_sims, top = jax.lax.top_k(sims, k)
            top_labels = jnp.take(index_labels, top)
            for temp in cfg.temps:
                votes = votes_by_label(jnp.exp(top_sims / temp), top_labels)
                correct = jnp.argmax(votes, axis=-1) == labels[query_indices]
                metrics[f"knn-t{temp:.2f}@{k}"] = correct.astype(votes.dtype)
        return metrics
