"""Tests axlearn/common/grpo/loss.py against NumPy written here, on fixed samples."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.grpo.loss import group_advantages, grpo_loss, k3_kl, token_log_probs


def _np_advantages(rewards, group_size, eps):
    out = np.zeros_like(rewards, dtype=np.float64)
    for start in range(0, len(rewards), group_size):
        g = rewards[start : start + group_size].astype(np.float64)
        out[start : start + group_size] = (g - g.mean()) / (
            np.sqrt(((g - g.mean()) ** 2).mean()) + eps
        )
    return out


def _np_loss(logp, old, ref, adv, mask, clip, beta):
    """The GRPO objective, sample by sample and token by token, in float64 loops."""
    n, t = logp.shape
    per_sample, policy, kls, clipped, count = [], [], [], 0, 0
    for i in range(n):
        terms, pol, kl_terms = [], [], []
        for j in range(t):
            if not mask[i, j]:
                continue
            ratio = np.exp(logp[i, j] - old[i, j])
            a = ratio * adv[i]
            b = min(max(ratio, 1 - clip), 1 + clip) * adv[i]
            kl = np.exp(ref[i, j] - logp[i, j]) - (ref[i, j] - logp[i, j]) - 1
            terms.append(-(min(a, b) - beta * kl))
            pol.append(-min(a, b))
            kl_terms.append(kl)
            clipped += b < a
            count += 1
        denom = max(len(terms), 1)
        per_sample.append(sum(terms) / denom)
        policy.append(sum(pol) / denom)
        kls.append(sum(kl_terms) / denom)
    return np.mean(per_sample), np.mean(policy), np.mean(kls), clipped / max(count, 1)


def _fixed_samples():
    rng = np.random.default_rng(7)
    n, t = 6, 5
    logp = np.log(rng.uniform(0.05, 0.9, (n, t)))
    # Ratios between ~0.6 and ~1.6: some inside the clip range, some clipped on each side.
    old = logp + rng.uniform(-0.5, 0.5, (n, t))
    ref = logp + rng.uniform(-1.0, 1.0, (n, t))
    rewards = np.array([1.0, 0.0, 0.5, 0.0, 0.0, 1.0])
    mask = np.ones((n, t))
    mask[1, 3:] = 0  # A sample that stopped early.
    mask[4, :] = 0  # A sample with no completion token.
    return logp, old, ref, rewards, mask


def test_group_advantages_match_numpy():
    rewards = np.array([1.0, 0.0, 0.5, 0.25, 3.0, 3.0, 3.0, 3.0, 0.0, 2.0, 1.0, 7.0])
    got = np.asarray(group_advantages(jnp.asarray(rewards), group_size=4, eps=1e-4))
    np.testing.assert_allclose(got, _np_advantages(rewards, 4, 1e-4), rtol=1e-5, atol=1e-6)
    # A group of equal rewards gets zero advantage; each group's advantages sum to zero.
    np.testing.assert_array_equal(got[4:8], 0.0)
    np.testing.assert_allclose(got.reshape(3, 4).sum(axis=1), 0.0, atol=1e-5)


def test_group_advantages_refuse_a_partial_group():
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        group_advantages(jnp.zeros([6]), group_size=4)


def test_token_log_probs_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
    tokens = rng.integers(0, 7, (2, 3))
    for temperature in (1.0, 0.7):
        z = logits.astype(np.float64) / temperature
        z = z - np.log(np.exp(z).sum(-1, keepdims=True))
        want = np.take_along_axis(z, tokens[..., None], -1)[..., 0]
        got = token_log_probs(jnp.asarray(logits), jnp.asarray(tokens), temperature=temperature)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_k3_kl_matches_numpy_and_is_nonnegative():
    logp, _, ref, _, _ = _fixed_samples()
    got = np.asarray(k3_kl(jnp.asarray(logp), jnp.asarray(ref)))
    np.testing.assert_allclose(got, np.exp(ref - logp) - (ref - logp) - 1, rtol=1e-5, atol=1e-6)
    assert (got >= 0).all()
    assert float(k3_kl(jnp.asarray(logp), jnp.asarray(logp)).max()) == 0.0


@pytest.mark.parametrize("clip,beta", [(0.2, 0.04), (0.1, 0.0), (10.0, 1.0)])
def test_grpo_loss_matches_numpy(clip, beta):
    logp, old, ref, rewards, mask = _fixed_samples()
    adv = _np_advantages(rewards, 3, 1e-4)
    out = grpo_loss(
        log_probs=jnp.asarray(logp, jnp.float32),
        old_log_probs=jnp.asarray(old, jnp.float32),
        ref_log_probs=jnp.asarray(ref, jnp.float32),
        advantages=jnp.asarray(adv, jnp.float32),
        mask=jnp.asarray(mask),
        clip_epsilon=clip,
        kl_coef=beta,
    )
    loss, policy, kl, clip_fraction = _np_loss(logp, old, ref, adv, mask, clip, beta)
    np.testing.assert_allclose(float(out.loss), loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(out.policy_loss), policy, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(out.kl), kl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(out.clip_fraction), clip_fraction, rtol=1e-6)
    if clip == 0.2:
        assert 0 < clip_fraction < 1  # The fixed samples exercise both branches of the min.
    if clip == 10.0:
        assert clip_fraction == 0


def test_grpo_loss_gradient_matches_numpy():
    """d loss / d logp: per token (-A * ratio [unclipped branch] + beta * (1 - exp(ref - logp)))
    / (n * |o_i|); zero where the clipped branch is taken or off the mask."""
    logp, old, ref, rewards, mask = _fixed_samples()
    adv = _np_advantages(rewards, 3, 1e-4)
    clip, beta = 0.2, 0.04

    def loss_of(lp):
        return grpo_loss(
            log_probs=lp,
            old_log_probs=jnp.asarray(old, jnp.float32),
            ref_log_probs=jnp.asarray(ref, jnp.float32),
            advantages=jnp.asarray(adv, jnp.float32),
            mask=jnp.asarray(mask),
            clip_epsilon=clip,
            kl_coef=beta,
        ).loss

    got = np.asarray(jax.grad(loss_of)(jnp.asarray(logp, jnp.float32)))
    ratio = np.exp(logp - old)
    a = ratio * adv[:, None]
    b = np.clip(ratio, 1 - clip, 1 + clip) * adv[:, None]
    d_surrogate = np.where(a <= b, adv[:, None] * ratio, 0.0)
    d_kl = 1 - np.exp(ref - logp)
    lengths = np.maximum(mask.sum(1, keepdims=True), 1)
    want = mask * (-d_surrogate + beta * d_kl) / lengths / logp.shape[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
