"""Tests of causal_lm.CompositeLossWeights and CompositeLossMetrics with AXLearn-style children
(losses as WeightedSummary), against hand computations and NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import causal_lm
from axlearn.common.config import InvalidConfigValueError
from axlearn.common.loss_metrics import BaseLossMetrics
from axlearn.common.metrics import WeightedSummary
from axlearn.common.module import functional
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config


class _SummaryMetrics(BaseLossMetrics):
    """AXLearn's way: returns WeightedSummary(input_batch[name], input_batch[name + "_w"])."""

    def forward(self, input_batch, *, predict_outputs, module_outputs):
        del predict_outputs, module_outputs
        weight = input_batch.get(f"{self.name}_w", 1.0)
        return WeightedSummary(input_batch[self.name], weight), {f"{self.name}_out": 7.0}


class _TensorMetrics(BaseLossMetrics):
    """Our way: returns (loss Tensor, {"summaries": {}})."""

    def forward(self, input_batch, *, predict_outputs, module_outputs):
        del predict_outputs, module_outputs
        return jnp.asarray(input_batch[self.name]), dict(summaries={})


class _FixedWeights(causal_lm.CompositeLossWeights):
    """Weights from the config (AXLearn's tests subclass CompositeLossWeights like this)."""

    weights = {}

    def forward(self, child_metrics):
        del child_metrics
        return dict(self.weights)


class _InverseLossWeights(causal_lm.CompositeLossWeights):
    """Weights each child by 1 / its loss mean (weights that depend on the child losses)."""

    def forward(self, child_metrics):
        return {name: 1.0 / loss.mean for name, (loss, _) in child_metrics.items()}


def _run(children, loss_weights, batch):
    cfg = causal_lm.CompositeLossMetrics.default_config().set(
        name="metrics", metrics=children, loss_weights=loss_weights
    )
    layer = cfg.instantiate(parent=None)
    (loss, outputs), col = functional(
        layer,
        prng_key=jax.random.PRNGKey(0),
        state={},
        inputs=dict(input_batch=batch, predict_outputs={}, module_outputs={}),
        is_training=True,
    )
    return loss, outputs, col


@pytest.mark.parametrize("w1", [1.0, 0.0])
def test_weights_layer_scales_each_child_mean(w1):
    """AXLearn's test case: equal summary weights, loss = (1.23 * 0.5 + 3.45 * w1) / 2."""
    _FixedWeights.weights = dict(a=0.5, b=w1)
    children = dict(a=_SummaryMetrics.default_config(), b=_SummaryMetrics.default_config())
    loss, outputs, _ = _run(children, _FixedWeights.default_config(), dict(a=1.23, b=3.45))
    assert isinstance(loss, WeightedSummary)
    np.testing.assert_allclose(loss.value(), (1.23 * 0.5 + 3.45 * w1) / 2, rtol=1e-6)
    assert float(loss.weight) == 2.0
    # Unweighted child losses, and the children's outputs.
    assert float(outputs["loss_a"].mean) == pytest.approx(1.23)
    assert float(outputs["loss_b"].mean) == pytest.approx(3.45)
    assert outputs["a_out"] == 7.0 and outputs["b_out"] == 7.0


def test_summary_weights_and_dict_weights():
    """Unequal summary weights: the weighted mean of the weighted means (hand computation)."""
    children = dict(a=_SummaryMetrics.default_config(), b=_SummaryMetrics.default_config())
    batch = dict(a=2.0, a_w=3.0, b=5.0, b_w=1.0)
    expected = (0.5 * 2.0 * 3.0 + 2.0 * 5.0 * 1.0) / 4.0
    loss, outputs, _ = _run(children, dict(a=0.5, b=2.0), batch)
    np.testing.assert_allclose(loss.value(), expected, rtol=1e-6)
    # The "loss" summary (which the model adds) is that weighted mean.
    np.testing.assert_allclose(outputs["summaries"]["loss"].mean, expected, rtol=1e-6)
    assert float(outputs["summaries"]["loss"].weight) == 4.0
    # No weights: all 1.
    loss, _, _ = _run(children, None, batch)
    np.testing.assert_allclose(loss.value(), (2.0 * 3.0 + 5.0) / 4.0, rtol=1e-6)
    # Weights computed from the child losses: each weighted mean becomes 1.
    loss, _, _ = _run(children, _InverseLossWeights.default_config(), batch)
    np.testing.assert_allclose(loss.value(), 1.0, rtol=1e-6)


def test_weights_layer_with_tensor_children_and_mixed_children():
    _FixedWeights.weights = dict(a=0.5, b=3.0)
    tensors = dict(a=_TensorMetrics.default_config(), b=_TensorMetrics.default_config())
    loss, outputs, _ = _run(tensors, _FixedWeights.default_config(), dict(a=2.0, b=5.0))
    assert not isinstance(loss, WeightedSummary)
    np.testing.assert_allclose(loss, 0.5 * 2.0 + 3.0 * 5.0, rtol=1e-6)
    assert "loss_a" not in outputs  # Our children keep our outputs.
    # A Tensor loss among WeightedSummary children is added to their mean (like AXLearn's aux).
    mixed = dict(a=_SummaryMetrics.default_config(), b=_TensorMetrics.default_config())
    loss, _, _ = _run(mixed, _FixedWeights.default_config(), dict(a=2.0, a_w=4.0, b=5.0))
    np.testing.assert_allclose(loss.value(), 0.5 * 2.0 + 3.0 * 5.0, rtol=1e-6)
    assert float(loss.weight) == 4.0


def test_bad_loss_weights_are_refused():
    children = dict(a=_SummaryMetrics.default_config())
    with pytest.raises(ValueError, match="loss_weights names \\['z'\\]"):
        _run(children, dict(z=1.0), dict(a=1.0))
    with pytest.raises(InvalidConfigValueError, match="loss_weights expects"):
        _run(children, 0.5, dict(a=1.0))
    layer = causal_lm.CompositeLossWeights.default_config().set(name="w").instantiate(parent=None)
    with pytest.raises(NotImplementedError):
        layer.forward({})


class _MeanLogitMetrics(BaseLossMetrics):
    """AXLearn-style child of a model: loss = mean logit, weighted by the number of logits."""

    def forward(self, input_batch, *, predict_outputs, module_outputs):
        del input_batch, module_outputs
        logits = predict_outputs["logits"]
        return WeightedSummary(logits.mean(), logits.size), {}


def test_model_with_weighted_summary_metrics():
    cfg = transformer_lm_config(
        num_layers=1, model_dim=16, num_heads=2, hidden_dim=24, vocab_size=16, stack="stack"
    )
    cfg.metrics = causal_lm.CompositeLossMetrics.default_config().set(
        metrics=dict(m=_MeanLogitMetrics.default_config()), loss_weights=dict(m=2.0)
    )
    model = cfg.set(name="model").instantiate(parent=None)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 1, 16)
    batch = dict(input_ids=ids, target_labels=ids)
    predictions, _ = functional(
        model, None, params, dict(input_batch=batch), is_training=False, method="predict"
    )
    (loss, aux), _ = functional(
        model, None, params, dict(input_batch=batch, return_aux=True), is_training=False
    )
    expected = 2.0 * np.asarray(predictions["logits"], np.float64).mean()
    assert np.ndim(loss) == 0  # The model's loss is a Tensor (the WeightedSummary's mean).
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(aux["metrics"]["loss_m"].mean, expected / 2.0, rtol=1e-5)
