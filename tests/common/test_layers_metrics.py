"""Tests of the classification metric layers and SqueezeExcitation against NumPy."""

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common.layers import (
    BinaryClassificationMetric,
    CategoricalHingeLossMetric,
    ClassificationMetric,
    SqueezeExcitation,
)
from axlearn.common.module import functional
from axlearn.common.utils import count_model_params


def _run(cfg, inputs, params=None):
    layer = cfg.set(name="metric").instantiate(parent=None)
    if params is None:
        params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    out, collection = functional(layer, jax.random.PRNGKey(1), params, inputs, is_training=True)
    return out, collection.summaries, params


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_classification_metric():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 5)).astype(np.float32)
    labels = np.array([0, 3, -1, 4])  # -1: padding.
    loss, summaries, _ = _run(
        ClassificationMetric.default_config().set(num_classes=5, label_smoothing=0.1),
        dict(logits=logits, labels=labels),
    )
    targets = np.eye(5)[labels] * 0.9 + 0.02
    per = -(targets * _np_log_softmax(logits)).sum(-1)
    live = labels >= 0
    np.testing.assert_allclose(loss, per[live].mean(), rtol=1e-5)
    acc = (logits.argmax(-1) == labels)[live].mean()
    np.testing.assert_allclose(summaries["accuracy"].mean, acc)
    assert float(summaries["loss"].weight) == 3
    with pytest.raises(ValueError, match="soft_labels cannot be combined with label_smoothing"):
        _run(
            ClassificationMetric.default_config().set(num_classes=5, label_smoothing=0.1),
            dict(logits=logits, labels=labels, soft_labels=np.eye(5)[np.maximum(labels, 0)]),
        )


def test_binary_classification_metric():
    rng = np.random.default_rng(1)
    logits = rng.uniform(-1, 1, (30, 3)).astype(np.float32)
    labels = rng.integers(0, 2, (30, 3))
    labels[-1] = -1
    loss, summaries, _ = _run(
        BinaryClassificationMetric.default_config(), dict(logits=logits, labels=labels)
    )
    live = labels >= 0
    probs = 1 / (1 + np.exp(-logits.astype(np.float64)))
    bce = -(labels * np.log(probs) + (1 - labels) * np.log(1 - probs))
    np.testing.assert_allclose(loss, bce[live].mean(), rtol=1e-5)
    preds = (probs > 0.5) & live
    tp = (preds & (labels == 1)).sum()
    np.testing.assert_allclose(summaries["precision"].mean, tp / preds.sum(), rtol=1e-6)
    np.testing.assert_allclose(summaries["recall"].mean, tp / (labels == 1).sum(), rtol=1e-6)
    with pytest.raises(ValueError, match="soft_labels for binary cross entropy must be None"):
        _run(
            BinaryClassificationMetric.default_config(),
            dict(logits=logits, labels=labels, soft_labels=labels),
        )


def test_categorical_hinge_loss_metric():
    logits = np.array([[0.2, 0.9, 0.1], [0.5, 0.4, 0.3]], np.float32)
    labels = np.array([0, 0])
    loss, _, _ = _run(
        CategoricalHingeLossMetric.default_config().set(num_classes=3),
        dict(logits=logits, labels=labels),
    )
    # By hand: max(0, 0.9 - 0.2 + 1) = 1.7 and max(0, 0.4 - 0.5 + 1) = 0.9.
    np.testing.assert_allclose(loss, (1.7 + 0.9) / 2, rtol=1e-6)


def test_squeeze_excitation():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 4, 8))
    cfg = SqueezeExcitation.default_config().set(input_dim=8, se_ratio=0.25, activation="nn.relu")
    out, _, params = _run(cfg, dict(inputs=x))
    # 8 -> 2 -> 8 with biases.
    assert count_model_params(params) == 8 * 2 + 2 + 2 * 8 + 8
    w1, b1 = np.asarray(params["reduce"]["weight"][0, 0]), np.asarray(params["reduce"]["bias"])
    w2, b2 = np.asarray(params["expand"]["weight"][0, 0]), np.asarray(params["expand"]["bias"])
    pooled = np.asarray(x).mean(axis=(1, 2))
    gate = 1 / (1 + np.exp(-(np.maximum(pooled @ w1 + b1, 0) @ w2 + b2)))
    np.testing.assert_allclose(out, np.asarray(x) * gate[:, None, None, :], rtol=1e-5, atol=1e-6)
    off, _, off_params = _run(SqueezeExcitation.default_config().set(input_dim=8), dict(inputs=x))
    assert off_params == {} and bool(jnp.all(off == x))
