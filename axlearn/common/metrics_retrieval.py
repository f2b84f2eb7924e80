"""Retrieval metrics of a [num_queries, num_items] score (similarity) matrix.

Relevance is given either as `gt_targets` ([num_queries, max_targets] item indices, -1 for
padding) or as `relevance_labels` ([num_queries, num_items], 0/1 or graded gains). Scores may be
masked by adding NEG_INF (`attention_bias.NEG_INF`) to excluded items.

Per-query metrics:
- `top_k_accuracy`: whether (or how many) relevant items are among the top k;
- `top_k_recall`: relevant items in the top k / min(k, number of relevant items);
- `average_precision_at_k`: AP@k = sum_{i<=k} precision@i * rel(i) / min(k, number relevant);
- `ndcg_at_k`: DCG@k / ideal DCG@k with gain / log2(rank + 1), optionally tie-aware
  (`_tie_averaged_dcg`, the average over the orderings of tied scores, as scikit-learn's);
Averages over valid queries: `mean_reciprocal_rank` and `average_rank` of each query's first
relevant item, `calculate_mean_metrics` (optionally per category) and the
`calculate_{accuracy,recall,mean_average_precision}_metrics` helpers built on it.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common.utils import Tensor, cast_floats

__all__ = [
    "average_precision_at_k",
    "average_rank",
    "calculate_accuracy_metrics",
    "calculate_mean_average_precision_metrics",
    "calculate_mean_metrics",
    "calculate_recall_metrics",
    "mean_reciprocal_rank",
    "metric_at_k_name",
    "ndcg_at_k",
    "top_k_accuracy",
    "top_k_recall",
]


def _rows(x: Tensor) -> Tensor:
    """[num_queries, 1] row indices for gathering along the item axis."""
    return jnp.arange(x.shape[0])[:, None]


def _labels_from_targets(gt_targets: Tensor, num_items: int) -> Tensor:
    """[M, N] counts of each item among a query's targets (-1 targets count nowhere)."""
    return jnp.sum(jax.nn.one_hot(gt_targets, num_items), axis=1)


def top_k_accuracy(
    sim: Tensor,
    gt_targets: Optional[Tensor],
    top_ks: list[int],
    similarity_bias: Optional[Tensor] = None,
    relevance_labels: Optional[Tensor] = None,
    return_counts: bool = False,
) -> Tensor:
    """Whether (or how many) relevant items are among each query's top-k scored items.

    Args:
        sim: [M, N] float scores of M queries against N items.
        gt_targets: Optional int [M, T] relevant item indices per query, -1 for padding (e.g. an
            image with 5 captions has 5 targets; a caption with its image has 1).
        top_ks: The k values.
        similarity_bias: Optional [M, N] or [N] bias added to `sim` before the top-k (NEG_INF
            masks an item).
        relevance_labels: Optional 0/1 [M, N]; used instead of gt_targets when given.
        return_counts: Whether to return the number of relevant items in the top k (else
            whether there is at least one, as 0/1 floats).

    Returns:
        [len(top_ks), M]: the hits per k and query.

    Raises:
        ValueError: If neither gt_targets nor relevance_labels is given.
        AssertionError: If the bias's item axis differs from sim's.
    """
    sim = cast_floats(sim, jnp.float32)
    if similarity_bias is not None:
        if similarity_bias.shape != sim.shape:
            similarity_bias = similarity_bias.reshape(1, -1)
        if similarity_bias.shape[1] != sim.shape[1]:
            raise AssertionError(
                f"similarity_bias.shape={similarity_bias.shape}, but sim.shape={sim.shape}"
            )
        sim = sim + similarity_bias
    if gt_targets is None and relevance_labels is None:
        raise ValueError("Either `gt_targets` or `relevance_labels` is required.")
    # With one target per query, compare indices directly (no [M, N] one-hot).
    single_target = relevance_labels is None and gt_targets.shape[1] == 1
    if not single_target and relevance_labels is None:
        relevance_labels = _labels_from_targets(gt_targets, sim.shape[1])
    hits = []
    for k in top_ks:
        _, indices = jax.lax.top_k(sim, k)
        if single_target:
            hits.append(jnp.sum(indices == gt_targets, axis=1))
        else:
            hits.append(jnp.sum(jnp.take_along_axis(relevance_labels, indices, axis=1), axis=-1))
    hits = jnp.stack(hits)
    if return_counts:
        return hits
    return (hits > 0).astype(jnp.float32)


def top_k_recall(
    sim: Tensor,
    gt_targets: Optional[Tensor],
    top_ks: list[int],
    similarity_bias: Optional[Tensor] = None,
    relevance_labels: Optional[Tensor] = None,
) -> Tensor:
    """Recall@k: relevant items in the top k / min(k, number of relevant items) per query.

    Args:
        sim: [M, N] float scores (see `top_k_accuracy`).
        gt_targets: Optional int [M, T] relevant item indices (-1: padding).
        top_ks: The k values.
        similarity_bias: Optional [M, N] or [N] bias added to sim.
        relevance_labels: Optional 0/1 [M, N]; used instead of gt_targets when given.

    Returns:
        [len(top_ks), M] float recalls (0 for a query without relevant items).

    Raises:
        ValueError: If neither gt_targets nor relevance_labels is given.
    """
    if gt_targets is None and relevance_labels is None:
        raise ValueError("Either `gt_targets` or `relevance_labels` is required.")
    if relevance_labels is None and gt_targets.shape[1] == 1:
        # One target: a query has one relevant item unless its target is padding (-1).
        num_relevant = (gt_targets[:, 0] >= 0).astype(jnp.int32)
    else:
        if relevance_labels is None:
            relevance_labels = _labels_from_targets(gt_targets, sim.shape[1])
        num_relevant = jnp.sum(relevance_labels, axis=-1)
    counts = top_k_accuracy(
        sim,
        gt_targets,
        top_ks,
        similarity_bias=similarity_bias,
        relevance_labels=relevance_labels,
        return_counts=True,
    )
    return jnp.stack(
        [c / jnp.maximum(jnp.minimum(num_relevant, k), 1.0) for k, c in zip(top_ks, counts)]
    )


def _reciprocal_rank(
    *, scores: Tensor, relevance_labels: Tensor, query_padding: Tensor
) -> tuple[Tensor, Tensor]:
    """1 / (rank of each query's best-scored relevant item), and the query padding extended
    to queries without relevant items.

    Args:
        scores: [M, N] scores (NEG_INF masks an item).
        relevance_labels: 0/1 [M, N].
        query_padding: 0/1 [M, 1] or [M] (1: padding).

    Returns:
        (reciprocal ranks [M] (0 without a relevant item), bool padding [M]).
    """
    order = jnp.argsort(-scores, axis=-1)
    ranked_labels = relevance_labels[_rows(scores), order]
    ranks = jnp.arange(1, scores.shape[1] + 1)
    reciprocal = jnp.max(ranked_labels / ranks, axis=-1)
    no_relevant = relevance_labels.max(axis=-1) == 0
    return reciprocal, jnp.logical_or(query_padding.reshape(-1), no_relevant)


def mean_reciprocal_rank(
    *, scores: Tensor, relevance_labels: Tensor, query_padding: Tensor
) -> dict[str, Tensor]:
    """Mean reciprocal rank of each query's first relevant item (MRR).

    Args:
        scores: [M, N] scores (NEG_INF masks an item).
        relevance_labels: 0/1 [M, N].
        query_padding: 0/1 [M, 1] (1: padding). Queries without a relevant item are left out too.

    Returns:
        {"mrr": the mean over valid queries}.
    """
    reciprocal, padding = _reciprocal_rank(
        scores=scores, relevance_labels=relevance_labels, query_padding=query_padding
    )
    return calculate_mean_metrics(
        metric_name="mrr", query_metrics=reciprocal, query_padding=padding
    )


def average_rank(
    *, scores: Tensor, relevance_labels: Tensor, query_padding: Tensor
) -> dict[str, Tensor]:
    """Mean (1-based) rank of each query's first relevant item.

    Args:
        scores: [M, N] scores (NEG_INF masks an item).
        relevance_labels: 0/1 [M, N].
        query_padding: 0/1 [M, 1] (1: padding). Queries without a relevant item are left out too.

    Returns:
        {"avg_rank": the mean over valid queries}.
    """
    reciprocal, padding = _reciprocal_rank(
        scores=scores, relevance_labels=relevance_labels, query_padding=query_padding
    )
    rank = jnp.where(reciprocal == 0, 0.0, 1.0 / jnp.where(reciprocal == 0, 1.0, reciprocal))
    return calculate_mean_metrics(metric_name="avg_rank", query_metrics=rank, query_padding=padding)


def _max_k(top_ks: list[int], num_items: int) -> int:
    """The largest k of top_ks (-1: num_items); AssertionError if not in [1, num_items]."""
    max_k = num_items if -1 in top_ks else max(top_ks)
    if not 0 < max_k <= num_items:
        raise AssertionError(f"top_ks={top_ks} must lie in [1, num_items={num_items}] (or be -1)")
    return max_k


def _at_ks(per_k: Tensor, top_ks: list[int]) -> dict[int, Tensor]:
    """{k: per_k[:, k - 1]} ({-1: the last column})."""
    return {k: per_k[:, -1] if k == -1 else per_k[:, k - 1] for k in top_ks}


def average_precision_at_k(
    scores: Tensor, relevance_labels: Tensor, top_ks: list[int]
) -> dict[int, Tensor]:
    """AP@k = sum_{i<=k} precision@i * rel(i) / min(k, number of relevant items) per query.

    Args:
        scores: [M, N] scores (NEG_INF masks an item).
        relevance_labels: 0/1 [M, N].
        top_ks: The k values; -1 means N.

    Returns:
        {k: [M] AP@k} (0 for a query without relevant items).

    Raises:
        AssertionError: If a k exceeds N.
    """
    max_k = _max_k(top_ks, scores.shape[1])
    _, indices = jax.lax.top_k(scores, max_k)
    ranked = relevance_labels[_rows(scores), indices]
    ranks = jnp.arange(1, max_k + 1)
    precision = jnp.cumsum(ranked, axis=-1) / ranks
    denominator = jnp.minimum(ranks[None, :], jnp.sum(relevance_labels, axis=-1, keepdims=True))
    ap = jnp.where(
        denominator == 0,
        0.0,
        jnp.cumsum(precision * ranked, axis=-1) / jnp.maximum(denominator, 1),
    )
    return _at_ks(ap, top_ks)


def _tie_averaged_dcg(*, y_true: Tensor, y_score: Tensor, discount_factor: Tensor) -> Tensor:
    """Tie-aware DCG@k for k = 1..max_k of one query (McSherry and Najork, ECIR 2008).

    Items with equal scores form a group ranked at consecutive positions; each position of a
    group gets the group's mean gain, i.e. the DCG averaged over the orderings of ties.

    Args:
        y_true: [N] gains >= 0 (0 for padding or masked items).
        y_score: [N] scores (NEG_INF masks an item).
        discount_factor: [max_k] discount of each rank.

    Returns:
        [max_k]: DCG@k for k = 1..max_k.
    """
    max_k = discount_factor.shape[0]
    # Groups of equal scores, best first; only the first max_k groups matter.
    _, group, counts = jnp.unique(-y_score, return_inverse=True, return_counts=True, size=max_k)
    group = group.reshape(-1)
    gains = jnp.zeros(max_k).at[group].add(y_true) / jnp.maximum(counts, 1)
    per_rank = jnp.repeat(gains, counts, total_repeat_length=max_k)
    return jnp.cumsum(per_rank * discount_factor)


def ndcg_at_k(
    scores: Tensor,
    relevance_labels: Tensor,
    top_ks: list[int],
    ignore_ties: bool = True,
) -> dict[int, Tensor]:
    """NDCG@k = DCG@k / ideal DCG@k, with DCG@k = sum_{i<=k} gain(i) / log2(i + 1).

    Args:
        scores: [M, N] scores (NEG_INF masks an item, whose label must be 0).
        relevance_labels: [M, N] gains >= 0.
        top_ks: The k values; -1 means N.
        ignore_ties: Whether to rank tied scores in top-k order (fast); else average over the
            orderings of ties (`_tie_averaged_dcg`).

    Returns:
        {k: [M] NDCG@k} (0 where the ideal DCG is 0).

    Raises:
        AssertionError: If a k exceeds N.
    """
    max_k = _max_k(top_ks, scores.shape[1])
    discount = 1 / jnp.log2(jnp.arange(2, max_k + 2))
    if ignore_ties:
        rows = _rows(scores)
        by_score = relevance_labels[rows, jax.lax.top_k(scores, max_k)[1]]
        ideal = relevance_labels[rows, jax.lax.top_k(relevance_labels, max_k)[1]]
        dcg = jnp.cumsum(by_score * discount, axis=-1)
        idcg = jnp.cumsum(ideal * discount, axis=-1)
    else:
        discounts = jnp.tile(discount, (scores.shape[0], 1))
        batched = jax.vmap(_tie_averaged_dcg)
        dcg = batched(y_true=relevance_labels, y_score=scores, discount_factor=discounts)
        idcg = batched(y_true=relevance_labels, y_score=relevance_labels, discount_factor=discounts)
    ndcg = jnp.where(idcg == 0, 0.0, dcg / jnp.where(idcg == 0, 1.0, idcg))
    return _at_ks(ndcg, top_ks)


def metric_at_k_name(name: str, k: int) -> str:
    """`name@k`, or `name` for k < 0 (all items).

    Args:
        name: The metric's name.
        k: The cutoff.

    Returns:
        The name.
    """
    return name if k < 0 else f"{name}@{k}"


def calculate_mean_metrics(
    *,
    metric_name: str,
    query_metrics: Tensor,
    query_padding: Tensor,
    query_categories: Optional[Tensor] = None,
    categories_names: Optional[tuple[str, ...]] = None,
) -> dict[str, Tensor]:
    """The mean of a per-query metric over valid queries, optionally also per category.

    Args:
        metric_name: The output key.
        query_metrics: [M] per-query values.
        query_padding: [M] bool or 0/1 (1: padding, left out).
        query_categories: Optional int [M] category ids.
        categories_names: The names of the categories (required with query_categories).

    Returns:
        {metric_name: the mean}; with categories also "<name>_<category>" for each category
        that has a valid query and "<name>_avg_category", the mean of those. The per-category
        part runs eagerly (it skips empty categories).

    Raises:
        ValueError: If query_categories is given without categories_names.
    """
    valid = 1 - query_padding.astype(jnp.int32)
    values = jnp.where(query_padding, 0.0, query_metrics)
    metrics = {metric_name: values.sum() / jnp.maximum(valid.sum(), 1.0)}
    if query_categories is None:
        return metrics
    if categories_names is None:
        raise ValueError("`categories_names` is required when categories were provided.")
    num = len(categories_names)
    sums = jax.ops.segment_sum(values, query_categories, num_segments=num)
    counts = np.asarray(jax.ops.segment_sum(valid, query_categories, num_segments=num))
    per_category = []
    for i, category in enumerate(categories_names):
        if counts[i] == 0:
            continue
        metrics[f"{metric_name}_{category}"] = sums[i] / counts[i]
        per_category.append(metrics[f"{metric_name}_{category}"])
    metrics[f"{metric_name}_avg_category"] = jnp.mean(jnp.array(per_category))
    return metrics


def _mean_metrics_at_ks(
    name: str, per_query: dict, *, query_padding, categories, categories_names
) -> dict[str, Tensor]:
    """`calculate_mean_metrics` of each {k: per-query values} as `metric_at_k_name(name, k)`."""
    metrics = {}
    for k, values in per_query.items():
        metrics.update(
            calculate_mean_metrics(
                metric_name=metric_at_k_name(name, k),
                query_metrics=values,
                query_padding=query_padding,
                query_categories=categories,
                categories_names=categories_names,
            )
        )
    return metrics


def calculate_mean_average_precision_metrics(
    *,
    top_ks: list[int],
    scores: Tensor,
    relevance_labels: Tensor,
    query_padding: Tensor,
    categories: Optional[Tensor] = None,
    categories_names: Optional[tuple[str, ...]] = None,
) -> dict[str, Tensor]:
    """MAP@k: the mean of `average_precision_at_k` over valid queries.

    Args:
        top_ks: The k values (-1: all items).
        scores: [M, N] scores.
        relevance_labels: 0/1 [M, N].
        query_padding: Bool [M] (True: padding).
        categories: Optional int [M] category ids (per-category means are added).
        categories_names: The category names (required with categories).

    Returns:
        {"MAP@k": ...} and, with categories, "MAP@k_<category>" and "MAP@k_avg_category".

    Raises:
        ValueError: If categories is given without categories_names.
    """
    return _mean_metrics_at_ks(
        "MAP",
        average_precision_at_k(scores=scores, relevance_labels=relevance_labels, top_ks=top_ks),
        query_padding=query_padding,
        categories=categories,
        categories_names=categories_names,
    )


def calculate_accuracy_metrics(
    *,
    top_ks: list[int],
    scores: Tensor,
    relevance_labels: Tensor,
    query_padding: Tensor,
    categories: Optional[Tensor] = None,
    categories_names: Optional[tuple[str, ...]] = None,
) -> dict[str, Tensor]:
    """accuracy@k: the fraction of valid queries with a relevant item in their top k.

    Args:
        top_ks: The k values.
        scores: [M, N] scores.
        relevance_labels: 0/1 [M, N].
        query_padding: Bool [M] (True: padding).
        categories: Optional int [M] category ids (per-category means are added).
        categories_names: The category names (required with categories).

    Returns:
        {"accuracy@k": ...} and, with categories, per-category entries.

    Raises:
        ValueError: If categories is given without categories_names.
    """
    hits = top_k_accuracy(scores, None, top_ks, relevance_labels=relevance_labels)
    return _mean_metrics_at_ks(
        "accuracy",
        dict(zip(top_ks, hits)),
        query_padding=query_padding,
        categories=categories,
        categories_names=categories_names,
    )


def calculate_recall_metrics(
    *,
    top_ks: list[int],
    scores: Tensor,
    relevance_labels: Tensor,
    query_padding: Tensor,
    categories: Optional[Tensor] = None,
    categories_names: Optional[tuple[str, ...]] = None,
) -> dict[str, Tensor]:
    """recall@k: the mean of `top_k_recall` over valid queries.

    Args:
        top_ks: The k values.
        scores: [M, N] scores.
        relevance_labels: 0/1 [M, N].
        query_padding: Bool [M] (True: padding).
        categories: Optional int [M] category ids (per-category means are added).
        categories_names: The category names (required with categories).

    Returns:
        {"recall@k": ...} and, with categories, per-category entries.

    Raises:
        ValueError: If categories is given without categories_names.
    """
    recalls = top_k_recall(scores, None, top_ks, relevance_labels=relevance_labels)
    return _mean_metrics_at_ks(
        "recall",
        dict(zip(top_ks, recalls)),
        query_padding=query_padding,
        categories=categories,
        categories_names=categories_names,
    )
