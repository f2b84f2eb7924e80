"""Tests axlearn.common.attention.softmax_with_biases against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.attention import NEG_INF, make_causal_biases, softmax_with_biases


def _np_softmax(x, sink=None):
    x = np.asarray(x, np.float64)
    if sink is not None:
        x = np.concatenate([x, np.broadcast_to(sink[None, :, None, None], (*x.shape[:-1], 1))], -1)
    e = np.exp(x - x.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return p[..., :-1] if sink is not None else p


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_with_biases_and_sink(causal):
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 4, 4))
    biases = make_causal_biases(4) if causal else None
    biased = np.asarray(logits) + (np.asarray(biases) if causal else 0.0)
    probs = softmax_with_biases(logits, attention_logit_biases=biases)
    np.testing.assert_allclose(probs, _np_softmax(biased), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)

    sink = jnp.array([1.0, -0.5, 0.0])
    with_sink = softmax_with_biases(logits, attention_logit_biases=biases, logit_sink=sink)
    np.testing.assert_allclose(
        with_sink, _np_softmax(biased, np.asarray(sink)), rtol=1e-5, atol=1e-7
    )
    assert np.all(np.asarray(with_sink.sum(-1)) < 1.0)
    if causal:
        assert np.all(np.triu(np.asarray(with_sink[0, 0]), k=1) < 1e-6)


def test_16_bit_logits_are_softmaxed_in_float32():
    logits = jnp.array([[0.0, 8.0, NEG_INF]], jnp.bfloat16)
    probs = softmax_with_biases(logits)
    assert probs.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(probs, np.float32), _np_softmax(np.asarray(logits, np.float32)), atol=4e-3
    )
    with pytest.raises(ValueError, match="logit_sink of shape \\(2,\\).*num_heads=2"):
        softmax_with_biases(jnp.zeros((1, 3, 2, 2)), logit_sink=jnp.zeros(2))
