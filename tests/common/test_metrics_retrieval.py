"""Tests of axlearn.common.metrics_retrieval against brute-force NumPy references."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.metrics_retrieval import (
    _tie_averaged_dcg,
    average_precision_at_k,
    average_rank,
    calculate_accuracy_metrics,
    calculate_mean_metrics,
    calculate_recall_metrics,
    mean_reciprocal_rank,
    ndcg_at_k,
    top_k_accuracy,
    top_k_recall,
)


def _case(seed=0, m=4, n=7):
    rng = np.random.default_rng(seed)
    scores = rng.permutation(m * n).reshape(m, n).astype(np.float32)  # No ties.
    labels = (rng.random((m, n)) < 0.3).astype(np.float32)
    labels[-1] = 0  # A query without relevant items.
    return scores, labels


def _order(s):
    return np.argsort(-s, kind="stable")


def test_top_k_accuracy_and_recall():
    scores, labels = _case()
    ks = [1, 3, 7]
    hits = np.asarray(top_k_accuracy(scores, None, ks, relevance_labels=labels, return_counts=True))
    recall = np.asarray(top_k_recall(scores, None, ks, relevance_labels=labels))
    for i, k in enumerate(ks):
        for q in range(4):
            count = labels[q][_order(scores[q])[:k]].sum()
            assert hits[i, q] == count
            assert recall[i, q] == pytest.approx(count / max(min(labels[q].sum(), k), 1))
    # gt_targets (-1: padding) and bias masking give the same as labels.
    targets = np.array([[2, -1], [0, 5], [6, -1], [-1, -1]])
    from_targets = np.zeros((4, 7))
    for q, row in enumerate(targets):
        from_targets[q, row[row >= 0]] = 1
    bias = np.zeros(7)
    bias[0] = -1e9
    a = top_k_accuracy(scores, targets, ks, similarity_bias=bias)
    b = top_k_accuracy(scores, None, ks, similarity_bias=bias, relevance_labels=from_targets)
    np.testing.assert_array_equal(a, b)
    single = top_k_accuracy(scores, targets[:, :1], [1, 3])
    one = np.zeros((4, 7))
    one[[0, 1, 2], [2, 0, 6]] = 1
    np.testing.assert_array_equal(
        single, top_k_accuracy(scores, None, [1, 3], relevance_labels=one)
    )
    with pytest.raises(ValueError, match="gt_targets"):
        top_k_accuracy(scores, None, [1])


def test_average_precision_at_k():
    scores, labels = _case(1)
    ks = [1, 2, 5, -1]
    out = average_precision_at_k(scores, labels, ks)
    for k in ks:
        kk = 7 if k == -1 else k
        for q in range(4):
            rel = labels[q][_order(scores[q])[:kk]]
            total = min(labels[q].sum(), kk)
            precision = np.cumsum(rel) / np.arange(1, kk + 1)
            expected = (precision * rel).sum() / total if total else 0.0
            assert float(out[k][q]) == pytest.approx(expected, abs=1e-6)
    with pytest.raises(AssertionError):
        average_precision_at_k(scores, labels, [8])


def _dcg(gains):
    return sum(g / np.log2(i + 2) for i, g in enumerate(gains))


def test_ndcg_without_ties():
    scores, _ = _case(2)
    labels = np.random.default_rng(2).integers(0, 4, size=scores.shape).astype(np.float32)
    out = ndcg_at_k(scores, labels, [1, 3, -1])
    for k, kk in ((1, 1), (3, 3), (-1, 7)):
        for q in range(4):
            ideal = _dcg(np.sort(labels[q])[::-1][:kk])
            got = _dcg(labels[q][_order(scores[q])[:kk]])
            assert float(out[k][q]) == pytest.approx(got / ideal if ideal else 0.0, abs=1e-6)


def test_tie_averaged_dcg_is_the_mean_over_tie_orderings():
    y_true = np.array([2.0, 1.0, 3.0, 0.0, 4.0])
    y_score = np.array([1.0, 2.0, 1.0, 2.0, 0.5])
    discount = 1 / np.log2(np.arange(2, 7))
    out = np.asarray(_tie_averaged_dcg(y_true=y_true, y_score=y_score, discount_factor=discount))
    # All orderings consistent with the scores (ties permuted), averaged.
    orders = [
        p
        for p in itertools.permutations(range(5))
        if all(y_score[p[i]] >= y_score[p[i + 1]] for i in range(4))
    ]
    expected = np.mean([np.cumsum(y_true[list(p)] * discount) for p in orders], axis=0)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    tied = ndcg_at_k(y_score[None], y_true[None], [5], ignore_ties=False)[5]
    ideal = _dcg(np.sort(y_true)[::-1])
    np.testing.assert_allclose(tied, [expected[-1] / ideal], rtol=1e-6)


def test_mrr_average_rank_and_means():
    scores, labels = _case(3)
    padding = np.array([[0], [1], [0], [0]])
    ranks = []
    for q in range(4):
        rel = labels[q][_order(scores[q])]
        if padding[q, 0] == 0 and rel.any():
            ranks.append(np.argmax(rel) + 1)
    mrr = mean_reciprocal_rank(scores=scores, relevance_labels=labels, query_padding=padding)
    avg = average_rank(scores=scores, relevance_labels=labels, query_padding=padding)
    assert float(mrr["mrr"]) == pytest.approx(np.mean(1 / np.array(ranks)))
    assert float(avg["avg_rank"]) == pytest.approx(np.mean(ranks))
    pad = np.array([False, True, False, False])
    acc = calculate_accuracy_metrics(
        top_ks=[2], scores=scores, relevance_labels=labels, query_padding=pad
    )
    hits = np.asarray(top_k_accuracy(scores, None, [2], relevance_labels=labels))[0]
    assert float(acc["accuracy@2"]) == pytest.approx(hits[~pad].mean())
    rec = calculate_recall_metrics(
        top_ks=[3],
        scores=scores,
        relevance_labels=labels,
        query_padding=pad,
        categories=jnp.array([0, 0, 1, 1]),
        categories_names=("a", "b"),
    )
    per = np.asarray(top_k_recall(scores, None, [3], relevance_labels=labels))[0]
    assert float(rec["recall@3_a"]) == pytest.approx(per[0])
    assert float(rec["recall@3_b"]) == pytest.approx(per[2:].mean())
    assert float(rec["recall@3_avg_category"]) == pytest.approx((per[0] + per[2:].mean()) / 2)
    with pytest.raises(ValueError, match="categories_names"):
        calculate_mean_metrics(
            metric_name="m",
            query_metrics=jnp.ones(2),
            query_padding=jnp.zeros(2),
            query_categories=jnp.zeros(2, jnp.int32),
        )
