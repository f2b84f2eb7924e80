"""Tests of axlearn.common.transducer against a float64 NumPy dynamic program."""

import itertools

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common.config import config_for_function
from axlearn.common.module import functional
from axlearn.common.transducer import (
    Transducer,
    apply_paddings,
    hat_logits_to_log_probs,
    log_prob_alignments,
    log_prob_prefix_alignments,
    log_prob_suffix_alignments,
)


def _np_alpha(log_blank, log_y):
    """log alpha by the recursion, in float64: [T, U+1], [T+1, U] -> [T+1, U+1]."""
    t_len, u_len = log_blank.shape[0], log_y.shape[1]
    alpha = np.full((t_len + 1, u_len + 1), -np.inf)
    alpha[0, 0] = 0.0
    for t in range(t_len + 1):
        for u in range(u_len + 1):
            if t == u == 0:
                continue
            terms = []
            if t > 0:
                terms.append(alpha[t - 1, u] + log_blank[t - 1, u])
            if u > 0:
                terms.append(alpha[t, u - 1] + log_y[t, u - 1])
            alpha[t, u] = np.logaddexp.reduce(terms)
    return alpha


def _brute_force(log_blank, log_y):
    """log alpha[T, U] summed over every path of T blanks and U labels (any order)."""
    t_len, u_len = log_blank.shape[0], log_y.shape[1]
    total = []
    for label_steps in itertools.combinations(range(t_len + u_len), u_len):
        t = u = 0
        logp = 0.0
        for step in range(t_len + u_len):
            if step in label_steps:
                logp += log_y[t, u]
                u += 1
            else:
                logp += log_blank[t, u]
                t += 1
        total.append(logp)
    return np.logaddexp.reduce(total)


def _random_lattice(rng, t_len, u_len):
    blank = rng.uniform(0.05, 0.9, (t_len + 1, u_len + 1))
    y = rng.uniform(0.05, 1.0, (t_len + 1, u_len + 1)) * (1 - blank)
    return np.log(blank[:t_len]), np.log(y[:, :u_len])


@pytest.mark.parametrize(
    "t_len,u_len",
    [
        (1, 1),
        pytest.param(3, 2, marks=pytest.mark.slow),
        pytest.param(5, 4, marks=pytest.mark.slow),
    ],
)
def test_alignment_probs_match_numpy_dp(t_len, u_len):
    log_blank, log_y = _random_lattice(np.random.default_rng(t_len * 10 + u_len), t_len, u_len)
    ref = _np_alpha(log_blank, log_y)
    lb, ly = jnp.asarray(log_blank, jnp.float32), jnp.asarray(log_y, jnp.float32)
    np.testing.assert_allclose(log_prob_prefix_alignments(lb, ly), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref[-1, -1], _brute_force(log_blank, log_y), rtol=1e-10)
    # beta[0, 0] is the same total; beta is alpha of the reversed lattice.
    beta = log_prob_suffix_alignments(lb, ly)
    np.testing.assert_allclose(beta[0, 0], ref[-1, -1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        beta, _np_alpha(log_blank[::-1, ::-1], log_y[::-1, ::-1])[::-1, ::-1], atol=1e-5
    )

    # The custom gradient equals central finite differences of the float64 DP.
    grad_blank, grad_y = jax.grad(log_prob_alignments, argnums=(0, 1))(lb, ly)
    eps = 1e-6
    for arr, grad in ((log_blank, grad_blank), (log_y, grad_y)):
        for idx in np.ndindex(arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += eps
            minus[idx] -= eps
            args_p = (plus, log_y) if arr is log_blank else (log_blank, plus)
            args_m = (minus, log_y) if arr is log_blank else (log_blank, minus)
            numeric = (_np_alpha(*args_p)[-1, -1] - _np_alpha(*args_m)[-1, -1]) / (2 * eps)
            np.testing.assert_allclose(grad[idx], numeric, atol=1e-4)


def test_apply_paddings_keeps_the_unpadded_probability():
    rng = np.random.default_rng(7)
    am_max, lm_max = 6, 5
    for t_len, u_len in [(3, 2), (6, 4), (1, 0), (6, 0)]:
        log_blank, log_y = _random_lattice(rng, am_max, lm_max)
        full_blank, full_y = log_blank[:, :lm_max], log_y[:am_max]  # Both [am_max, lm_max].
        padded = apply_paddings(
            log_prob_blank=jnp.asarray(full_blank),
            log_prob_y=jnp.asarray(full_y),
            am_paddings=jnp.arange(am_max) >= t_len,
            lm_paddings=jnp.arange(lm_max) > u_len,
        )
        # The reference: the unpadded lattice where row T of log_y is unreachable (log 0).
        ref_y = np.concatenate([full_y[:t_len, :u_len], np.full((1, u_len), -np.inf)], axis=0)
        ref = _np_alpha(full_blank[:t_len, : u_len + 1], ref_y)[-1, -1]
        np.testing.assert_allclose(log_prob_alignments(**padded), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_transducer_loss_matches_numpy():
    batch, dim, vocab, am_max, lm_max = 3, 4, 5, 5, 4
    cfg = Transducer.default_config().set(name="rnnt", input_dim=dim, vocab_size=vocab)
    cfg.logits_to_log_probs = config_for_function(hat_logits_to_log_probs).set(blank_id=0)
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    rng = np.random.default_rng(8)
    am = rng.uniform(-1, 1, (batch, am_max, dim)).astype(np.float32)
    lm = rng.uniform(-1, 1, (batch, lm_max, dim)).astype(np.float32)
    labels = rng.integers(1, vocab, (batch, lm_max)).astype(np.int32)
    am_lengths, lm_lengths = np.array([5, 3, 0]), np.array([4, 2, 3])  # lm: U + 1 tokens.
    am_pad = np.arange(am_max)[None] >= am_lengths[:, None]
    lm_pad = np.arange(lm_max)[None] >= lm_lengths[:, None]
    (loss, per_example), _ = functional(
        layer,
        None,
        params,
        dict(am_data=am, am_paddings=am_pad, lm_data=lm, lm_paddings=lm_pad, target_labels=labels),
        is_training=False,
    )
    # NumPy: the joint network in float64, then the DP over each unpadded lattice.
    w = np.asarray(params["proj"]["weight"], np.float64)
    b = np.asarray(params["proj"]["bias"], np.float64)
    losses = []
    for i in range(batch):
        t_len, u_len = am_lengths[i], lm_lengths[i] - 1
        if t_len == 0:
            losses.append(0.0)
            continue
        logits = np.tanh(am[i, :t_len, None, :] + lm[i, None, : u_len + 1, :]) @ w + b
        blank_logit = logits[..., 0]
        log_blank = -np.logaddexp(0.0, -blank_logit)
        label_logits = logits[..., 1:]
        label_lsm = label_logits - np.logaddexp.reduce(label_logits, axis=-1, keepdims=True)
        log_tokens = label_lsm - np.logaddexp(0.0, blank_logit)[..., None]
        log_y = np.stack(
            [log_tokens[:, u, labels[i, u] - 1] for u in range(u_len)], axis=1
        ).reshape(t_len, u_len)
        log_y = np.concatenate([log_y, np.full((1, u_len), -np.inf)], axis=0)
        losses.append(-_np_alpha(log_blank, log_y)[-1, -1])
    np.testing.assert_allclose(per_example["loss"], losses, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(per_example["is_valid_example"], [True, True, False])
    np.testing.assert_allclose(loss, np.mean(losses[:2]), rtol=1e-4)
