"""Tests of causal_lm.Model._metrics, forward's aux "metrics" and scan_chunk (against NumPy)."""

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common import causal_lm
from axlearn.common.module import functional
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

VOCAB = 16


def _model(**kwargs):
    cfg = transformer_lm_config(
        num_layers=1, model_dim=16, num_heads=2, hidden_dim=24, vocab_size=VOCAB, stack="stack"
    )
    return cfg.set(name="model", **kwargs).instantiate(parent=None)


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _batch():
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 6), 1, VOCAB)
    labels = jnp.array([[3, 0, 5, -1, 2, 7], [1, 1, 0, 0, 4, 9]])
    return dict(input_ids=ids, target_labels=labels)


def test_metrics_and_forward_aux_metrics_match_numpy():
    model = _model()
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    batch = _batch()
    predictions, _ = functional(
        model, None, params, dict(input_batch=batch), is_training=False, method="predict"
    )
    (loss, metrics), col = functional(
        model,
        None,
        params,
        dict(input_batch=dict(target_labels=batch["target_labels"]), predict_outputs=predictions),
        is_training=False,
        method="_metrics",
    )
    labels = np.asarray(batch["target_labels"])
    live = labels > 0  # pad_token_id is 0; -1 is no target.
    logp = _np_log_softmax(np.asarray(predictions["logits"], np.float64))
    per_token = -np.take_along_axis(logp, np.maximum(labels, 0)[..., None], -1)[..., 0] * live
    np.testing.assert_allclose(loss, per_token.sum() / live.sum(), rtol=1e-5)
    np.testing.assert_array_equal(metrics["live_targets"], live)
    np.testing.assert_allclose(metrics["per_token_loss"], per_token, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["cross_entropy"], loss, rtol=1e-6)
    assert float(metrics["num_targets"]) == live.sum()
    assert "num_tokens" not in metrics and "num_tokens" not in col.summaries  # No input_ids.
    np.testing.assert_allclose(col.summaries["loss"].mean, loss, rtol=1e-6)

    (fwd_loss, aux), _ = functional(
        model, None, params, dict(input_batch=batch, return_aux=True), is_training=False
    )
    np.testing.assert_allclose(fwd_loss, loss, rtol=1e-6)
    assert set(aux["metrics"]) == set(metrics)
    for key, value in metrics.items():
        np.testing.assert_allclose(aux["metrics"][key], value, rtol=1e-6, atol=1e-7)


def test_scan_chunk_equals_unchunked_loss_and_grads():
    ref, chunked = _model(), _model(scan_chunk=4)
    params = ref.initialize_parameters_recursively(jax.random.PRNGKey(0))
    batch = _batch()

    def loss_fn(model, p):
        (loss, _), _ = functional(model, None, p, dict(input_batch=batch), is_training=False)
        return loss

    ref_loss, ref_grads = jax.value_and_grad(lambda p: loss_fn(ref, p))(params)
    loss, grads = jax.value_and_grad(lambda p: loss_fn(chunked, p))(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, ref_grads
    )
    # With a metrics child, scan_chunk computes the same loss unchunked.
    with_metrics = _model(scan_chunk=4, metrics=causal_lm.metrics_config())
    np.testing.assert_allclose(loss_fn(with_metrics, params), ref_loss, rtol=1e-5)
