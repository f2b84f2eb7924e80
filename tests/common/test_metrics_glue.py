"""Tests axlearn.common.metrics_glue against NumPy (accuracy, F1, MCC) and scipy.stats."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from axlearn.common.metrics_glue import GLUEMetricAccumulator, GLUEMetricCalculator, glue_metrics
from axlearn.common.test_utils import DummyForwardModel


def _glue(task, **kwargs):
    """`glue_metrics` jitted (eager dispatch of its many small ops is slower than one compile)."""
    return jax.jit(functools.partial(glue_metrics, task=task))(**kwargs)


def _np_f1(y_true, y_pred) -> float:
    tp = np.sum((y_true == 1) & (y_pred == 1))
    fp = np.sum((y_true != 1) & (y_pred == 1))
    fn = np.sum((y_true == 1) & (y_pred != 1))
    return 2 * tp / (2 * tp + fp + fn)


def _np_mcc(y_true, y_pred) -> float:
    """Binary MCC from the four counts."""
    tp = np.sum((y_true == 1) & (y_pred == 1))
    tn = np.sum((y_true == 0) & (y_pred == 0))
    fp = np.sum((y_true == 0) & (y_pred == 1))
    fn = np.sum((y_true == 1) & (y_pred == 0))
    return (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))


def test_glue_metrics_classification_tasks():
    rng = np.random.default_rng(0)
    n, live = 64, 50
    labels = rng.integers(0, 2, n)
    preds = np.where(rng.random(n) < 0.7, labels, 1 - labels)
    mask = np.arange(n) < live
    cola = _glue("cola", target_labels=labels, preds=preds, mask=mask)
    assert sorted(cola) == ["accuracy", "matthews_corr"]
    np.testing.assert_allclose(cola["accuracy"].mean, np.mean(labels[:live] == preds[:live]))
    np.testing.assert_allclose(
        cola["matthews_corr"].mean, _np_mcc(labels[:live], preds[:live]), atol=1e-5
    )
    assert int(cola["accuracy"].weight) == live == int(cola["matthews_corr"].weight)
    # MRPC: predictions outside {0, 1} count as wrong in F1 and in accuracy.
    bad = preds.copy()
    bad[:5] = [2, -1, 3, 5, 2]
    mrpc = _glue("mrpc", target_labels=labels, preds=bad, mask=mask)
    assert sorted(mrpc) == ["accuracy", "f1"]
    fixed = np.where(np.isin(bad, [0, 1]), bad, 1 - labels)
    np.testing.assert_allclose(mrpc["f1"].mean, _np_f1(labels[:live], fixed[:live]), atol=1e-6)
    np.testing.assert_allclose(mrpc["accuracy"].mean, np.mean(labels[:live] == bad[:live]))
    # Other tasks (3-way MNLI) report accuracy only.
    labels3 = rng.integers(0, 3, n)
    mnli = _glue("mnli", target_labels=labels3, preds=preds, mask=np.ones(n))
    assert sorted(mnli) == ["accuracy"]
    np.testing.assert_allclose(mnli["accuracy"].mean, np.mean(labels3 == preds))


def test_glue_metrics_stsb():
    rng = np.random.default_rng(1)
    labels = rng.uniform(0, 5, 40).astype(np.float32)
    preds = (labels + rng.normal(size=40)).astype(np.float32)
    mask = np.arange(40) < 32
    out = _glue("stsb", target_labels=labels, preds=preds, mask=mask)
    assert sorted(out) == ["pearson_corr", "spearman_corr"]
    np.testing.assert_allclose(
        out["pearson_corr"].mean, stats.pearsonr(preds[:32], labels[:32]).statistic, atol=1e-5
    )
    np.testing.assert_allclose(
        out["spearman_corr"].mean, stats.spearmanr(preds[:32], labels[:32]).statistic, atol=1e-5
    )


def test_accumulator_equals_one_call():
    rng = np.random.default_rng(2)
    labels = rng.uniform(0, 5, (3, 16)).astype(np.float32)
    preds = rng.uniform(0, 5, (3, 16)).astype(np.float32)
    acc = GLUEMetricAccumulator.default_config().instantiate(task="stsb")
    for p, t in zip(preds, labels):
        acc.update(target_labels=jnp.asarray(t), preds=jnp.asarray(p))
    got = acc.summaries()
    np.testing.assert_allclose(
        got["spearman_corr"].mean,
        stats.spearmanr(preds.ravel(), labels.ravel()).statistic,
        atol=1e-5,
    )
    assert int(got["spearman_corr"].weight) == 48
    with pytest.raises(ValueError, match="exactly one dimension"):
        acc.update(target_labels=jnp.ones((2, 2)), preds=jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="same shape"):
        acc.update(target_labels=jnp.ones(3), preds=jnp.ones(2))


def test_calculator_masks_ignored_targets():
    model = DummyForwardModel.default_config().set(name="model").instantiate(parent=None)
    cfg = GLUEMetricCalculator.default_config().set(
        name="glue", task="cola", ignore_target_label=-1
    )
    calc = cfg.instantiate(parent=None, model=model, model_param_partition_specs={})
    state = calc.init_state(prng_key=jax.random.PRNGKey(0), model_params={})
    labels = np.array([1, 0, 1, 1, -1, -1])
    logits = np.eye(2, dtype=np.float32)[[1, 0, 0, 1, 1, 0]]  # Predictions 1, 0, 0, 1.
    batch = dict(target_labels=jnp.asarray(labels), aux=dict(logits=jnp.asarray(logits)))
    out = calc.forward(batch, model_params={}, state=state)
    summaries = calc.get_summaries(model_params={}, state=out["state"], all_forward_outputs=[])
    assert sorted(summaries) == ["accuracy", "loss", "matthews_corr"]
    np.testing.assert_allclose(summaries["accuracy"].mean, 0.75)
    assert int(summaries["accuracy"].weight) == 4 == int(summaries["loss"].weight)
    np.testing.assert_allclose(
        summaries["matthews_corr"].mean,
        _np_mcc(np.array([1, 0, 1, 1]), np.array([1, 0, 0, 1])),
        atol=1e-6,
    )
