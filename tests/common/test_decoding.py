"""Tests of axlearn.common.decoding: logit filtering, sampling and the decode loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.decoding import (
    decode_loop,
    infer_initial_time_step,
    sample_tokens,
    top_k_logits,
    top_p_logits,
)


def test_top_k_and_top_p():
    logits = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept_k = np.asarray(top_k_logits(logits, 2)) > -1e29
    np.testing.assert_array_equal(kept_k, [[True, True, False, False, False]])
    # Nucleus 0.8: 0.5 + 0.2 < 0.8 so the third token is needed.
    kept_p = np.asarray(top_p_logits(logits[:, ::-1], 0.8)) > -1e29
    np.testing.assert_array_equal(kept_p, [[False, False, True, True, True]])
    assert (np.asarray(top_p_logits(logits, 1e-6)) > -1e29).sum() == 1
    with pytest.raises(ValueError, match="top_k"):
        top_k_logits(logits, 0)
    with pytest.raises(ValueError, match="top_p"):
        top_p_logits(logits, 0.0)


def test_sampling_distribution():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = jnp.log(jnp.tile(jnp.asarray(probs)[None], (20000, 1)))
    key = jax.random.PRNGKey(0)
    greedy = sample_tokens(None, logits, temperature=0.0)
    assert (np.asarray(greedy) == 0).all()
    samples = np.asarray(jax.jit(lambda k: sample_tokens(k, logits))(key))
    np.testing.assert_allclose(np.bincount(samples, minlength=4) / samples.size, probs, atol=0.015)
    # Temperature 0.5 squares and renormalizes the probabilities.
    hot = np.asarray(jax.jit(lambda k: sample_tokens(k, logits, temperature=0.5))(key))
    expected = probs**2 / (probs**2).sum()
    np.testing.assert_allclose(np.bincount(hot, minlength=4) / hot.size, expected, atol=0.015)
    top2 = np.asarray(jax.jit(lambda k: sample_tokens(k, logits, top_k=2))(key))
    np.testing.assert_allclose(
        np.bincount(top2, minlength=4) / top2.size, [5 / 8, 3 / 8, 0, 0], atol=0.015
    )
    with pytest.raises(ValueError, match="prng_key"):
        sample_tokens(None, logits, temperature=1.0)


def test_infer_initial_time_step():
    prefix = jnp.array([[3, 4, 0, 0], [3, 0, 5, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(infer_initial_time_step(prefix, pad_id=0), [2, 3, 0])


def test_decode_loop_counts_and_eos():
    vocab = 6

    # A "model" whose next token is (previous token + 1) mod vocab.
    def step_fn(token_ids, states):
        return jax.nn.one_hot((token_ids[:, 0] + 1) % vocab, vocab) * 10.0, states

    sequences = jnp.array([[2, 0, 0, 0, 0, 0], [4, 5, 0, 0, 0, 0]])
    init_logits = jax.nn.one_hot(jnp.array([3, 0]), vocab) * 10.0
    out = decode_loop(
        step_fn=step_fn,
        init_states={},
        init_logits=init_logits,
        sequences=sequences,
        time_step=jnp.array([1, 2]),
        num_steps=4,
        prng_key=None,
        eos_id=1,
        pad_id=0,
    )
    np.testing.assert_array_equal(out.tokens, [[3, 4, 5, 0], [0, 1, 0, 0]])
    np.testing.assert_array_equal(out.num_decoded, [4, 2])
    np.testing.assert_array_equal(out.sequences, [[2, 3, 4, 5, 0, 0], [4, 5, 0, 1, 0, 0]])
