"""GRPO's group-relative advantages and clipped policy-gradient loss with a k3 KL term.

Shapes: a rollout batch holds `num_prompts` prompts with `group_size` samples each, flattened
prompt-major to `N = num_prompts * group_size` rows; `T` is the number of scored positions.

- `group_advantages`: per group, (r - mean(r)) / (std(r) + eps) (std with ddof 0).
- `k3_kl`: the per-token estimator exp(ref - logp) - (ref - logp) - 1 of KL(policy || ref)
  (Schulman's k3, as in the GRPO paper: >= 0, unbiased for samples from the policy).
- `grpo_loss`: per token, -(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) - beta * k3),
  averaged over each sample's completion tokens, then over samples (the paper's
  1/G sum_i 1/|o_i| sum_t).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from axlearn.common.utils import Tensor


def group_advantages(rewards: Tensor, *, group_size: int, eps: float = 1e-4) -> Tensor:
    """Group-relative advantages of rewards laid out prompt-major.

    Args:
        rewards: Float [num_prompts * group_size]: sample j of prompt i at i * group_size + j.
        group_size: Samples per prompt (>= 1).
        eps: Added to each group's standard deviation (a group of equal rewards gets zeros).

    Returns:
        Float32 [num_prompts * group_size]: (r - group mean) / (group std + eps).

    Raises:
        ValueError: If the number of rewards is not a multiple of group_size.
    """
    n = rewards.shape[0]
    if group_size < 1 or n % group_size:
        raise ValueError(
            f"group_advantages: {n} rewards do not split into groups of {group_size}; pass "
            "num_prompts * group_size rewards."
        )
    grouped = rewards.astype(jnp.float32).reshape(n // group_size, group_size)
    mean = grouped.mean(axis=1, keepdims=True)
    std = grouped.std(axis=1, keepdims=True)
    return ((grouped - mean) / (std + eps)).reshape(n)


def token_log_probs(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Log-probabilities of `tokens` under softmax(logits / temperature).

    Args:
        logits: Float [N, T, vocab]: position t scores tokens[:, t].
        tokens: Int [N, T].
        temperature: The sampling temperature (> 0); 1 leaves the logits as they are.

    Returns:
        Float32 [N, T].
    """
    logits = logits.astype(jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_probs, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def k3_kl(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """The k3 estimator of KL(policy || reference) per token.

    Args:
        log_probs: Float [...]: log pi(token).
        ref_log_probs: Float [...]: log pi_ref(token).

    Returns:
        exp(ref - logp) - (ref - logp) - 1, elementwise (>= 0).
    """
    delta = ref_log_probs - log_probs
    return jnp.exp(delta) - delta - 1.0


class GrpoLossOutputs(NamedTuple):
    """What `grpo_loss` returns (scalars)."""

    # The loss to minimize.
    loss: Tensor
    # The clipped surrogate's part: -mean over samples of the per-sample mean of min(...).
    policy_loss: Tensor
    # Mean over samples of the per-sample mean k3 KL.
    kl: Tensor
    # Fraction of completion tokens whose ratio was clipped (|ratio - 1| > clip_epsilon with
    # the clipped term chosen).
    clip_fraction: Tensor


def grpo_loss(
    *,
    log_probs: Tensor,
    old_log_probs: Tensor,
    ref_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_epsilon: float,
    kl_coef: float,
) -> GrpoLossOutputs:
    """GRPO's clipped surrogate loss with a k3 KL penalty (see the module docstring).

    Args:
        log_probs: Float [N, T]: current policy log-probs of the sampled tokens (differentiated).
        old_log_probs: Float [N, T]: log-probs under the policy that sampled them.
        ref_log_probs: Float [N, T]: log-probs under the frozen reference.
        advantages: Float [N]: each sample's advantage (`group_advantages`).
        mask: [N, T]: 1 on completion tokens, 0 elsewhere (prompt, padding after a stop).
        clip_epsilon: The ratio clip (e.g. 0.2).
        kl_coef: beta, the weight of the KL term (0: no KL term).

    Returns:
        GrpoLossOutputs.
    """
    mask = mask.astype(jnp.float32)
    ratio = jnp.exp(log_probs - jax.lax.stop_gradient(old_log_probs))
    adv = advantages.astype(jnp.float32)[:, None]
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon) * adv
    surrogate = jnp.minimum(unclipped, clipped)
    kl = k3_kl(log_probs, jax.lax.stop_gradient(ref_log_probs))
    per_token = -(surrogate - kl_coef * kl)
    lengths = jnp.maximum(mask.sum(axis=1), 1.0)

    def sample_mean(x):
        return ((x * mask).sum(axis=1) / lengths).mean()

    was_clipped = (clipped < unclipped).astype(jnp.float32)
    return GrpoLossOutputs(
        loss=sample_mean(per_token),
        policy_loss=sample_mean(-surrogate),
        kl=sample_mean(kl),
        clip_fraction=(was_clipped * mask).sum() / jnp.maximum(mask.sum(), 1.0),
    )
