"""Tests axlearn.common.metrics_correlation against scipy.stats and a NumPy MCC."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from axlearn.common.metrics_correlation import (
    _rankdata,
    matthews_corrcoef,
    pearson_corrcoef,
    spearman_corrcoef,
)


def _numpy_mcc(y_true, y_pred, weight=None) -> float:
    """MCC from the weighted confusion matrix (Gorodkin's multiclass form, as scikit-learn)."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    weight = np.ones(len(y_true)) if weight is None else np.asarray(weight, np.float64)
    classes = np.unique(np.concatenate([y_true, y_pred]))
    ti, pi = np.searchsorted(classes, y_true), np.searchsorted(classes, y_pred)
    mat = np.zeros((len(classes), len(classes)))
    np.add.at(mat, (ti, pi), weight)
    t, p = mat.sum(axis=1), mat.sum(axis=0)
    c, s = np.trace(mat), mat.sum()
    den = np.sqrt((s * s - p @ p) * (s * s - t @ t))
    return 0.0 if den == 0 else (c * s - t @ p) / den


_jit_mcc = jax.jit(matthews_corrcoef)


def test_matthews_corrcoef_matches_numpy():
    rng = np.random.default_rng(0)
    batch = 1000
    for num_classes in (2, 30):
        y_true = rng.integers(0, num_classes, batch)
        # Correlated predictions: half copy the label.
        y_pred = np.where(rng.random(batch) < 0.5, y_true, rng.integers(0, num_classes, batch))
        weight = rng.uniform(1, 10, batch).astype(np.float32)
        ones = np.ones(batch, np.float32)
        np.testing.assert_allclose(
            _jit_mcc(y_true, y_pred, weight=ones), _numpy_mcc(y_true, y_pred), atol=1e-5
        )
        np.testing.assert_allclose(
            _jit_mcc(y_true, y_pred, weight=weight), _numpy_mcc(y_true, y_pred, weight), atol=1e-5
        )


def test_matthews_corrcoef_edge_cases():
    # Classes outside the labels' range (-1, 2) are classes of their own.
    y_pred = np.array([-1] * 4 + [0] * 4 + [1] * 4 + [2] * 4)
    y_true = np.array([1] * 8 + [0] * 8)
    ones = np.ones(16, np.float32)
    np.testing.assert_allclose(
        _jit_mcc(y_true, y_pred, weight=ones), _numpy_mcc(y_true, y_pred), atol=1e-6
    )
    assert float(_jit_mcc(y_true, y_true, weight=ones)) == pytest.approx(1.0, abs=1e-6)
    assert float(_jit_mcc(y_true, 1 - y_true, weight=ones)) == pytest.approx(-1.0, abs=1e-6)
    # A constant prediction: 0 (scikit-learn's value), not NaN.
    assert float(_jit_mcc(y_true, np.zeros_like(y_true), weight=ones)) == 0.0
    # Zero weights leave the samples out.
    weight = np.array([1.0] * 12 + [0.0] * 4, np.float32)
    np.testing.assert_allclose(
        _jit_mcc(y_true, y_pred, weight=weight), _numpy_mcc(y_true[:12], y_pred[:12]), atol=1e-6
    )
    with pytest.raises(ValueError, match="rank 1"):
        matthews_corrcoef(jnp.ones((1, 2)), jnp.ones((1, 2)))
    with pytest.raises(ValueError, match="shapes should be equal"):
        matthews_corrcoef(jnp.ones(5), jnp.ones(3))


def test_pearson_corrcoef_matches_scipy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=200).astype(np.float32)
    y = (0.3 * x + rng.normal(size=200)).astype(np.float32)
    fn = jax.jit(pearson_corrcoef)
    np.testing.assert_allclose(fn(x, y), stats.pearsonr(x, y).statistic, atol=1e-5)
    # Masked padding does not change the value.
    pad = rng.normal(size=10).astype(np.float32)
    mask = np.concatenate([np.ones(200), np.zeros(10)])
    np.testing.assert_allclose(
        fn(np.concatenate([x, pad]), np.concatenate([y, -pad]), weight=mask),
        stats.pearsonr(x, y).statistic,
        atol=1e-5,
    )
    # Integer inputs and weights: the weighted formula in NumPy.
    xi, yi = rng.integers(0, 30, 50), rng.integers(0, 30, 50)
    w = rng.uniform(0.5, 2.0, 50)
    mx, my = np.average(xi, weights=w), np.average(yi, weights=w)
    ref = np.average((xi - mx) * (yi - my), weights=w) / np.sqrt(
        np.average((xi - mx) ** 2, weights=w) * np.average((yi - my) ** 2, weights=w)
    )
    np.testing.assert_allclose(pearson_corrcoef(xi, yi, weight=w), ref, atol=1e-5)
    assert float(pearson_corrcoef(x, y, weight=np.zeros_like(x))) == 0.0
    with pytest.raises(ValueError, match="shapes should be equal"):
        pearson_corrcoef(jnp.ones(5), jnp.ones(3))


def test_rankdata_matches_scipy():
    x = np.random.default_rng(1).integers(0, 20, 100)  # Many ties.
    np.testing.assert_allclose(jax.jit(_rankdata)(x), stats.rankdata(x), atol=1e-6)


def test_spearman_corrcoef_matches_scipy():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 10, 120).astype(np.float32)  # Ties in both.
    y = (x + rng.integers(0, 6, 120)).astype(np.float32)
    expected = stats.spearmanr(x, y).statistic
    fn = jax.jit(spearman_corrcoef)
    np.testing.assert_allclose(fn(x, y), expected, atol=1e-5)
    pad = rng.normal(size=7).astype(np.float32) * 100
    mask = np.concatenate([np.ones(120), np.zeros(7)])
    np.testing.assert_allclose(
        fn(np.concatenate([x, pad]), np.concatenate([y, pad]), mask=mask), expected, atol=1e-5
    )
    with pytest.raises(ValueError, match="x=\\(5,\\) and mask=\\(4,\\)"):
        spearman_corrcoef(jnp.ones(5), jnp.ones(5), mask=jnp.ones(4))
