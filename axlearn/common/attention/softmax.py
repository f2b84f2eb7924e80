"""`softmax_with_biases`: the attention softmax over logits plus biases, with an optional sink.

Public names are re-exported by `axlearn.common.attention`.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from axlearn.common.attention_bias import apply_attention_logit_biases
from axlearn.common.utils import Tensor


def softmax_with_biases(
    logits: Tensor,
    attention_logit_biases: Optional[Tensor] = None,
    *,
    logit_sink: Optional[Tensor] = None,
) -> Tensor:
    """Softmax over the last axis of `logits + attention_logit_biases`, computed in float32.

    With `logit_sink` (one logit per head), each row's softmax also includes that extra logit,
    a key without a value: probs[b, n, t, s] = exp(l[b, n, t, s]) / (exp(sink[n]) +
    sum_s' exp(l[b, n, t, s'])), so a row sums to less than 1.

    Args:
        logits: [..., source_length] logits; [batch, num_heads, target_length, source_length]
            when `logit_sink` is given.
        attention_logit_biases: Optional biases broadcastable to `logits` (e.g. NEG_INF where a
            query must not attend); None: no bias.
        logit_sink: Optional [num_heads] per-head sink logits.

    Returns:
        The probabilities, with the shape and dtype of `logits`.

    Raises:
        ValueError: If `logit_sink` is not [num_heads] for logits [batch, num_heads, ...].
    """
    dtype = logits.dtype
    x = apply_attention_logit_biases(logits, attention_logit_biases).astype(jnp.float32)
    if logit_sink is None:
        return jax.nn.softmax(x, axis=-1).astype(dtype)
    if logits.ndim != 4 or logit_sink.shape != (logits.shape[1],):
        raise ValueError(
            f"softmax_with_biases: logit_sink of shape {logit_sink.shape} needs logits "
            f"[batch, num_heads, target, source] with num_heads={logit_sink.shape[0]} (got "
            f"logits of shape {logits.shape}); pass one sink logit per head."
        )
    sink = jnp.broadcast_to(logit_sink.astype(jnp.float32)[None, :, None, None], (*x.shape[:-1], 1))
    probs = jax.nn.softmax(jnp.concatenate([x, sink], axis=-1), axis=-1)
    return probs[..., :-1].astype(dtype)
