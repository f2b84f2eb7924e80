"""Loss functions."""

from typing import Optional

import jax
import jax.numpy as jnp

Tensor = jnp.ndarray


def cross_entropy(
    logits: Tensor,
    target_labels: Tensor,
    *,
    mask: Optional[Tensor] = None,
    z_loss_scale: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Softmax cross-entropy averaged over the unmasked targets, plus an optional z-loss.

    For each position: `ce = logsumexp(logits) - logits[target]` and
    `z = z_loss_scale * logsumexp(logits) ** 2`. The returned loss is
    `sum(mask * (ce + z)) / max(1, sum(mask))`. Computation is in float32.

    Args:
        logits: Float tensor [..., num_classes].
        target_labels: Int tensor [...]. Entries outside [0, num_classes) must be masked out;
            they contribute nothing (their gathered logit is taken as 0 before masking).
        mask: Optional tensor [...] (bool or 0/1): which positions count. None counts all.
        z_loss_scale: Scale of the auxiliary z-loss (0 disables it).

    Returns:
        (loss, aux), where loss is a scalar and aux has:
            cross_entropy: mean cross-entropy over counted positions (no z-loss);
            z_loss: mean z-loss over counted positions;
            pre_mask_loss: per-position ce + z, shape [...];
            num_targets: number of counted positions (float32 scalar).
    """
    logits = logits.astype(jnp.float32)
    if mask is None:
        mask = jnp.ones(target_labels.shape, jnp.float32)
    mask = mask.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    num_classes = logits.shape[-1]
    valid = (target_labels >= 0) & (target_labels < num_classes)
    safe_labels = jnp.where(valid, target_labels, 0)
    target_logits = jnp.take_along_axis(logits, safe_labels[..., None], axis=-1)[..., 0]
    per_token_ce = log_z - target_logits
    per_token_z = z_loss_scale * jnp.square(log_z)
    num_targets = mask.sum()
    denom = jnp.maximum(1.0, num_targets)
    ce = (per_token_ce * mask).sum() / denom
    z_loss = (per_token_z * mask).sum() / denom
    return ce + z_loss, dict(
        cross_entropy=ce,
        z_loss=z_loss,
        pre_mask_loss=per_token_ce + per_token_z,
        num_targets=num_targets,
    )
