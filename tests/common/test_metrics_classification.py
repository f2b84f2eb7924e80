"""Tests of axlearn/common/metrics_classification.py against hand-written NumPy formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

from axlearn.common.metrics_classification import (
    binary_classification_roc_auc_score,
    binary_clf_curve,
    brier_score,
    confusion_matrix,
    f_score,
    precision_recall_curve,
    precision_recall_f_score,
    roc_curve,
)

_RNG = np.random.default_rng(0)


def test_confusion_matrix_matches_loop():
    y_true = _RNG.integers(0, 4, size=50)
    y_pred = _RNG.integers(0, 4, size=50)
    weight = _RNG.uniform(0, 3, size=50).astype(np.float32)
    expected = np.zeros((4, 4), np.float32)
    for t, p, w in zip(y_true, y_pred, weight):
        expected[t, p] += w
    out = jax.jit(confusion_matrix, static_argnames="num_classes")(
        y_true, y_pred, num_classes=4, weight=weight
    )
    np.testing.assert_allclose(out, expected, rtol=1e-5)
    counts = jax.jit(confusion_matrix, static_argnames="num_classes")(
        jnp.asarray([0, 0, 1, -1]), jnp.asarray([1, 1, 1, 0]), num_classes=2
    )
    np.testing.assert_array_equal(counts, [[0, 2], [0, 1]])  # The -1 label is left out.
    with pytest.raises(ValueError, match="rank 1"):
        confusion_matrix(jnp.ones((2, 2)), jnp.ones((2, 2)), num_classes=2)
    with pytest.raises(ValueError, match="shapes should be equal"):
        confusion_matrix(jnp.ones(3), jnp.ones(2), num_classes=2)


@pytest.mark.parametrize("beta", [0.5, 2.0])
def test_precision_recall_f_score(beta):
    y_true = _RNG.integers(0, 2, size=40)
    y_pred = _RNG.integers(0, 2, size=40)
    weight = _RNG.uniform(0, 2, size=40).astype(np.float32)
    tp = np.sum(weight * (y_true == 1) * (y_pred == 1))
    p = tp / np.sum(weight * (y_pred == 1))
    r = tp / np.sum(weight * (y_true == 1))
    prf = jax.jit(precision_recall_f_score, static_argnames="beta")
    out = prf(y_true, y_pred, beta=beta, weight=weight)
    np.testing.assert_allclose(out["precision"].mean, p, rtol=1e-5)
    np.testing.assert_allclose(out["recall"].mean, r, rtol=1e-5)
    np.testing.assert_allclose(out["recall"].weight, np.sum(weight * (y_true == 1)), rtol=1e-5)
    f = (1 + beta**2) * p * r / (beta**2 * p + r)
    np.testing.assert_allclose(out["f_score"], f, rtol=1e-5)
    np.testing.assert_allclose(
        jax.jit(f_score, static_argnames="beta")(y_true, y_pred, beta=beta, weight=weight),
        f,
        rtol=1e-5,
    )
    # Nothing predicted positive: precision 0 (not NaN), F 0.
    out = prf(y_true, np.zeros_like(y_pred), beta=beta, weight=weight)
    assert float(out["precision"].mean) == 0.0 and float(out["f_score"]) == 0.0
    with pytest.raises(ValueError, match="beta must be positive"):
        f_score(jnp.ones(2), jnp.ones(2), beta=0)


def _numpy_curve(y_true, y_score, weight):
    """Per distinct score (descending): the weighted tps and fps of `score >= threshold`."""
    keep = weight != 0
    y_true, y_score, weight = y_true[keep], y_score[keep], weight[keep]
    thresholds = np.unique(y_score)[::-1]
    tps = np.array([np.sum(weight * y_true * (y_score >= t)) for t in thresholds])
    fps = np.array([np.sum(weight * (1 - y_true) * (y_score >= t)) for t in thresholds])
    return thresholds, tps, fps


def test_binary_clf_curve_ties_and_zero_weights():
    y_score = np.array([0.4, 0.8, 0.4, 0.6, 0.1, 0.1, 0.9, 0.6], np.float32)
    y_true = np.array([0, 1, 0, 1, 1, 0, 1, 0], np.float32)
    weight = np.array([1.0, 2.0, 0.5, 1.0, 1.0, 3.0, 0.0, 0.0], np.float32)
    out = jax.jit(binary_clf_curve)(y_true, y_score, weight=weight)
    thresholds, tps, fps = (np.asarray(out[k]) for k in ("thresholds", "tps", "fps"))
    # The two zero-weight samples come last with the max float threshold.
    np.testing.assert_array_equal(thresholds[-2:], np.finfo(np.float32).max)
    np.testing.assert_array_equal(thresholds[:-2], sorted(y_score[:6], reverse=True))
    ref_t, ref_tps, ref_fps = _numpy_curve(y_true, y_score, weight)
    for t, rt, rf in zip(ref_t, ref_tps, ref_fps):
        np.testing.assert_allclose(tps[thresholds == t], rt)  # Every tied entry.
        np.testing.assert_allclose(fps[thresholds == t], rf)
    np.testing.assert_allclose(tps[-2:], ref_tps[-1])

    pr_curve = jax.jit(precision_recall_curve)
    pr = pr_curve(y_true, y_score, weight=weight)
    real = np.asarray(pr["thresholds"]) != np.finfo(np.float32).max
    ref_p = ref_tps / (ref_tps + ref_fps)
    for t, p, r in zip(ref_t, ref_p, ref_tps / ref_tps[-1]):
        at = real & (np.asarray(pr["thresholds"]) == t)
        np.testing.assert_allclose(np.asarray(pr["precisions"])[at], p, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(pr["recalls"])[at], r, rtol=1e-6)
    assert np.all(np.diff(np.asarray(pr["thresholds"])[real]) >= 0)
    # No positives: precision and recall 0.
    pr = pr_curve(np.zeros_like(y_true), y_score, weight=weight)
    np.testing.assert_allclose(pr["recalls"], 0.0)
    np.testing.assert_allclose(pr["precisions"], 0.0)


def _numpy_auc(y_true, y_score, weight):
    """ROC AUC as the weighted probability that a positive outscores a negative (ties: 1/2)."""
    pos, neg = y_true == 1, y_true == 0
    wins = (y_score[pos][:, None] > y_score[neg][None, :]) + 0.5 * (
        y_score[pos][:, None] == y_score[neg][None, :]
    )
    pair_w = weight[pos][:, None] * weight[neg][None, :]
    return np.sum(wins * pair_w) / np.sum(pair_w)


def test_roc_curve():
    y_true = _RNG.integers(0, 2, size=30)
    y_score = np.round(_RNG.uniform(size=30), 1).astype(np.float32)  # Many ties.
    weight = _RNG.uniform(0, 1, size=30).astype(np.float32)
    weight[:3] = 0.0
    fpr, tpr = jax.jit(roc_curve)(y_true, y_score, weight)
    assert fpr.shape == tpr.shape == (31,)
    ref_t, ref_tps, ref_fps = _numpy_curve(y_true, y_score, weight)
    # Every point of the reference curve is on ours, and ours starts at (0, 0) and ends at (1, 1).
    points = np.stack([np.asarray(fpr), np.asarray(tpr)], axis=-1)
    for f, t in zip(ref_fps / ref_fps[-1], ref_tps / ref_tps[-1]):
        assert np.min(np.abs(points - [f, t]).max(axis=-1)) < 1e-5
    assert (float(fpr[0]), float(tpr[0])) == (0.0, 0.0) and float(fpr[-1]) == 1.0


def test_roc_auc_score():
    y_true = _RNG.integers(0, 2, size=30)
    y_score = np.round(_RNG.uniform(size=30), 1).astype(np.float32)
    weight = _RNG.uniform(0, 1, size=30).astype(np.float32)
    weight[:3] = 0.0
    # Under jit, the label check needs checkify.
    checked_auc = jax.jit(checkify.checkify(binary_classification_roc_auc_score))
    auc, valid = checked_auc(y_true, y_score, weight)[1]
    np.testing.assert_allclose(auc, _numpy_auc(y_true, y_score, weight), rtol=1e-5)
    assert bool(valid)
    # One label among the counted samples: score 0, not valid.
    # Same shapes below: one compilation.
    auc, valid = checked_auc(y_true, y_score, weight * (y_true == 1))[1]
    assert float(auc) == 0.0 and not bool(valid)
    # A label other than 0 and 1 fails the check.
    err, (auc, valid) = checked_auc(np.where(np.arange(30) == 5, 2, y_true), y_score, weight)
    assert "only be 0 or 1" in str(err.get()) and not bool(valid)


def test_brier_score():
    logits = _RNG.normal(size=(4, 3)).astype(np.float32)
    labels = np.array([0, 2, 1, 2])
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected = np.sum((probs - np.eye(3)[labels]) ** 2, axis=-1)
    np.testing.assert_allclose(jax.jit(brier_score)(labels, logits), expected, rtol=1e-5)
