"""The LM head and its cross-entropy loss computed in chunks of tokens, with a custom gradient.

The plain path computes logits [batch, seq_len, vocab] = hidden @ weight.T, casts them to float32,
and the loss, the z-loss and the accuracy read them; the backward pass then holds the float32
softmax and the logits' gradient, each as large again. `chunked_lm_head_loss` never holds
[batch, seq_len, vocab]: it scans over chunks of `chunk_size` positions along the sequence, and
for each chunk computes the logits [batch, chunk_size, vocab], the per-token cross-entropy,
log-normalizer and argmax, and, when a gradient is asked for, the chunk's gradients with respect
to the hidden states and the head weight (the softmax of the chunk is at hand; no logits are
recomputed in the backward pass, so the FLOPs are the plain path's). The backward pass only scales
those gradients by the incoming cotangent of the (scalar) loss.

Math (per position, with log_z = logsumexp(logits), target label t, weight w, z-loss scale s):
    loss = sum_positions w * (log_z - logits[t] + s * log_z ** 2)
    d loss / d logits = w * ((1 + 2 s log_z) * softmax(logits) - one_hot(t))
With a soft cap c the logits are c * tanh(raw / c) and the gradient is multiplied by
1 - tanh(raw / c) ** 2.

The per-token outputs (cross-entropy, log_z, whether the argmax is the target) are for metrics
and are returned under `jax.lax.stop_gradient`: the gradient flows through the loss only.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.utils import Tensor, with_sharding_constraint


def first_max_index(logits: Tensor) -> Tensor:
    """`jnp.argmax(logits, axis=-1)` (the first index of the maximum) for non-NaN logits, faster.

    XLA's CPU backend lowers argmax to a variadic (value, index) reduction that runs several times
    slower than a plain reduction; on P1's [4, 128, 32768] logits it took ~73 ms of CPU time per
    step. Here the maximum is a plain max-reduce (shared with the loss's logsumexp) and the first
    index reaching it a float32 min-reduce (indices below 2**24 are exact in float32): ~39 ms.
    Ties resolve to the first index, as argmax does. Rows containing NaN give
    logits.shape[-1] (argmax would point at the NaN).

    Args:
        logits: Float tensor [..., num_classes] with num_classes <= 2**24.

    Returns:
        Int32 tensor [...].
    """
    num_classes = logits.shape[-1]
    if num_classes > 2**24:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    top = jnp.max(logits, axis=-1, keepdims=True)
    index = jnp.arange(num_classes, dtype=jnp.float32)
    first = jnp.min(jnp.where(logits == top, index, float(num_classes)), axis=-1)
    return first.astype(jnp.int32)


def _chunk_logits(
    hidden: Tensor, weight: Tensor, soft_cap: Optional[float], spec: Optional[tuple]
) -> tuple[Tensor, Tensor]:
    """(raw, logits) of one chunk [batch, chunk, vocab], in the inputs' dtype (as the head)."""
    raw = jnp.einsum("bcd,vd->bcv", hidden, weight)
    if spec is not None:
        raw = with_sharding_constraint(raw, PartitionSpec(*spec))
    if soft_cap is not None and soft_cap > 0:
        return raw, soft_cap * jnp.tanh(raw / soft_cap)
    return raw, raw


def _chunk_stats(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(cross-entropy, log_z, correct, float32 logits) of one chunk's logits."""
    logits32 = logits.astype(jnp.float32)
    num_classes = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits32, axis=-1)
    valid = (labels >= 0) & (labels < num_classes)
    safe = jnp.where(valid, labels, 0)
    target = jnp.take_along_axis(logits32, safe[..., None], axis=-1)[..., 0]
    correct = (first_max_index(logits) == labels).astype(jnp.float32)
    return log_z - target, log_z, correct, logits32


def _to_chunks(x: Tensor, chunk_size: int) -> Tensor:
    """[batch, seq, ...] -> [num_chunks, batch, chunk_size, ...]."""
    batch, seq = x.shape[:2]
    x = x.reshape(batch, seq // chunk_size, chunk_size, *x.shape[2:])
    return jnp.moveaxis(x, 1, 0)


def _from_chunks(x: Tensor) -> Tensor:
    """[num_chunks, batch, chunk_size, ...] -> [batch, seq, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _fused_loss(hidden, weight, labels, token_weights, chunk_size, z_loss_scale, soft_cap, spec):
    """Loss and per-token stats without gradients (the primal; see `_fused_loss_fwd`)."""

    def body(_, xs):
        h, lab, w = xs
        _, logits = _chunk_logits(h, weight, soft_cap, spec)
        ce, log_z, correct, _ = _chunk_stats(logits, lab)
        loss = jnp.sum(w * (ce + z_loss_scale * jnp.square(log_z)))
        return None, (loss, ce, log_z, correct)

    xs = tuple(_to_chunks(x, chunk_size) for x in (hidden, labels, token_weights))
    _, (losses, ce, log_z, correct) = jax.lax.scan(body, None, xs)
    return jnp.sum(losses), (_from_chunks(ce), _from_chunks(log_z), _from_chunks(correct))


def _fused_loss_fwd(
    hidden, weight, labels, token_weights, chunk_size, z_loss_scale, soft_cap, spec
):
    """Forward with the gradients of the loss (w.r.t. hidden and weight) computed per chunk."""

    def body(grad_weight, xs):
        h, lab, w = xs
        raw, logits = _chunk_logits(h, weight, soft_cap, spec)
        ce, log_z, correct, logits32 = _chunk_stats(logits, lab)
        loss = jnp.sum(w * (ce + z_loss_scale * jnp.square(log_z)))
        probs = jnp.exp(logits32 - log_z[..., None])
        num_classes = logits.shape[-1]
        safe = jnp.where((lab >= 0) & (lab < num_classes), lab, 0)
        one_hot = jnp.arange(num_classes, dtype=safe.dtype) == safe[..., None]
        scale = (w * (1.0 + 2.0 * z_loss_scale * log_z))[..., None]
        d_logits = scale * probs - jnp.where(one_hot, w[..., None], 0.0)
        d_logits = d_logits.astype(logits.dtype)
        if soft_cap is not None and soft_cap > 0:
            d_logits = d_logits * (1 - jnp.square(jnp.tanh(raw / soft_cap)))
        d_raw = d_logits.astype(raw.dtype)
        d_hidden = jnp.einsum("bcv,vd->bcd", d_raw, weight)
        grad_weight = grad_weight + jnp.einsum(
            "bcv,bcd->vd", d_raw, h, preferred_element_type=jnp.float32
        )
        return grad_weight, (loss, ce, log_z, correct, d_hidden)

    xs = tuple(_to_chunks(x, chunk_size) for x in (hidden, labels, token_weights))
    grad_weight, (losses, ce, log_z, correct, d_hidden) = jax.lax.scan(
        body, jnp.zeros(weight.shape, jnp.float32), xs
    )
    outputs = (jnp.sum(losses), (_from_chunks(ce), _from_chunks(log_z), _from_chunks(correct)))
    residuals = (_from_chunks(d_hidden), grad_weight.astype(weight.dtype), labels, token_weights)
    return outputs, residuals


def _fused_loss_bwd(chunk_size, z_loss_scale, soft_cap, spec, residuals, cotangents):
    """Scales the forward's gradients by the loss's cotangent (per-token outputs: no gradient)."""
    del chunk_size, z_loss_scale, soft_cap, spec
    d_hidden, grad_weight, labels, token_weights = residuals
    g = cotangents[0]
    return (
        (g * d_hidden.astype(jnp.float32)).astype(d_hidden.dtype),
        (g * grad_weight.astype(jnp.float32)).astype(grad_weight.dtype),
        jnp.zeros(labels.shape, jax.dtypes.float0),
        jnp.zeros_like(token_weights),
    )


_fused_loss.defvjp(_fused_loss_fwd, _fused_loss_bwd)


def chunked_lm_head_loss(
    hidden_states: Tensor,
    weight: Tensor,
    target_labels: Tensor,
    *,
    live_targets: Tensor,
    chunk_size: int,
    z_loss_scale: float = 0.0,
    soft_cap: Optional[float] = None,
    logits_partition_spec: Optional[tuple] = None,
    config_path: str = "logits_chunk_size",
) -> tuple[Tensor, dict[str, Tensor]]:
    """Cross-entropy (+ z-loss) of the LM head `hidden_states @ weight.T`, in chunks of tokens.

    Equals `loss.cross_entropy(logits, target_labels, live_targets=live_targets,
    z_loss_scale=z_loss_scale)` of the full logits (and the accuracy of their first argmax), but
    holds at most [batch, chunk_size, vocab] logits at a time, in the forward and in the backward
    pass. A sequence length that `chunk_size` does not divide is padded (with positions that are
    not targets) up to a multiple of it; a `chunk_size` above the sequence length means one chunk.

    Args:
        hidden_states: [batch, seq_len, dim], what the LM head reads.
        weight: [vocab, dim], the head's weight (the tied embedding table or `LmHead.weight`).
        target_labels: Int [batch, seq_len].
        live_targets: Bool or float [batch, seq_len]: which positions count, and how much.
        chunk_size: Positions per chunk along the sequence (each chunk: batch x chunk_size tokens).
        z_loss_scale: Scale of the z-loss (log_z ** 2 averaged over live targets).
        soft_cap: If positive, logits are soft_cap * tanh(raw / soft_cap), as the tied head's
            `soft_cap_logits`.
        logits_partition_spec: Optional partition spec of each chunk's logits
            [batch, chunk, vocab].
        config_path: The config field named by errors.

    Returns:
        (loss, aux): loss = (sum(live * ce) + z_loss_scale * sum(live * log_z ** 2)) /
        max(1, sum(live)); aux has the per-token "per_target_loss" (ce + z, [batch, seq_len]),
        "cross_entropy" and "z_loss" (means over live targets), "num_targets", "accuracy"
        (live-weighted mean of first-argmax == label) and "log_z" [batch, seq_len].

    Raises:
        ValueError: If chunk_size < 1 or the shapes do not match.
    """
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(
            f"{config_path}={chunk_size!r} must be a positive int (positions per chunk); "
            "set it to a divisor of the sequence length, e.g. 256, or None for no chunking."
        )
    if hidden_states.ndim != 3 or target_labels.shape != hidden_states.shape[:2]:
        raise ValueError(
            f"hidden_states {hidden_states.shape} must be [batch, seq_len, dim] with "
            f"target_labels {target_labels.shape} = [batch, seq_len]."
        )
    if weight.ndim != 2 or weight.shape[1] != hidden_states.shape[2]:
        raise ValueError(f"weight {weight.shape} must be [vocab, {hidden_states.shape[2]}].")
    seq_len = hidden_states.shape[1]
    chunk_size = min(chunk_size, seq_len)
    live = jnp.broadcast_to(live_targets, target_labels.shape).astype(jnp.float32)
    num_targets = live.sum()
    denom = jnp.maximum(1.0, num_targets)
    pad = -seq_len % chunk_size
    labels = target_labels.astype(jnp.int32)
    if pad:
        hidden_states = jnp.pad(hidden_states, ((0, 0), (0, pad), (0, 0)))
        labels = jnp.pad(labels, ((0, 0), (0, pad)), constant_values=-1)
        live = jnp.pad(live, ((0, 0), (0, pad)))
    spec = tuple(logits_partition_spec) if logits_partition_spec is not None else None
    loss, (ce, log_z, correct) = _fused_loss(
        hidden_states,
        weight,
        labels,
        live / denom,
        chunk_size,
        float(z_loss_scale),
        soft_cap,
        spec,
    )
    ce, log_z, correct, live = (x[:, :seq_len] for x in (ce, log_z, correct, live))
    ce, log_z, correct = jax.lax.stop_gradient((ce, log_z, correct))
    per_token_z = z_loss_scale * jnp.square(log_z)
    return loss, dict(
        per_target_loss=ce + per_token_z,
        cross_entropy=(ce * live).sum() / denom,
        z_loss=(per_token_z * live).sum() / denom,
        num_targets=num_targets,
        accuracy=(correct * live).sum() / denom,
        log_z=log_z,
    )
