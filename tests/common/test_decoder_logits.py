"""Tests of Decoder.compute_logits and Decoder.logits_forward_dtype against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.module import functional
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

VOCAB = 32


def _decoder(**kwargs):
    cfg = transformer_lm_config(
        num_layers=1, model_dim=16, num_heads=2, hidden_dim=24, vocab_size=VOCAB, stack="stack"
    ).decoder
    return cfg.set(name="decoder", **kwargs).instantiate(parent=None)


def test_compute_logits_equals_forward_and_head_matmul():
    decoder = _decoder()
    params = decoder.initialize_parameters_recursively(jax.random.PRNGKey(0))
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 5), 1, VOCAB)
    out, _ = functional(
        decoder, None, params, dict(input_batch=dict(input_ids=ids)), is_training=False
    )
    logits, _ = functional(
        decoder,
        None,
        params,
        dict(forward_outputs=out),
        is_training=False,
        method="compute_logits",
    )
    np.testing.assert_allclose(logits, out["logits"], rtol=1e-6, atol=1e-6)
    # The tied head: hidden_states @ token_emb.weight.T.
    table = np.asarray(params["emb"]["token_emb"]["weight"], np.float64)
    expected = np.asarray(out["hidden_states"], np.float64) @ table.T
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(KeyError, match="no 'hidden_states'"):
        functional(
            decoder,
            None,
            params,
            dict(forward_outputs={"logits": logits}),
            is_training=False,
            method="compute_logits",
        )


def test_logits_forward_dtype_float32_head_on_bf16_inputs():
    decoder = _decoder(logits_forward_dtype=jnp.float32)
    params = decoder.initialize_parameters_recursively(jax.random.PRNGKey(0))
    hidden = jax.random.normal(jax.random.PRNGKey(2), (2, 3, 16)).astype(jnp.bfloat16)
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    logits, _ = functional(
        decoder,
        None,
        params,
        dict(forward_outputs={"hidden_states": hidden}),
        is_training=False,
        method="compute_logits",
    )
    assert logits.dtype == jnp.bfloat16
    table = np.asarray(params["emb"]["token_emb"]["weight"].astype(jnp.float32), np.float64)
    expected = np.asarray(hidden.astype(jnp.float32), np.float64) @ table.T
    # float32 matmul, then one bf16 rounding of the result.
    np.testing.assert_allclose(np.asarray(logits, np.float64), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_logits_forward_dtype_validation(dtype):
    with pytest.raises(ValueError, match="logits_forward_dtype must be None or jnp.float32"):
        _decoder(logits_forward_dtype=dtype)
