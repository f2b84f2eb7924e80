"""Autoregressive decoding: logit modifiers, token sampling and the decode loop.

The loop works with any step function `step_fn(token_ids [batch, 1], states) -> (logits
[batch, vocab], states)`, e.g. `Decoder.extend_step` on a KV cache.
"""

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from axlearn.common.utils import NestedTensor, Tensor

# Logits of disallowed tokens after top-k / top-p filtering.
_MASKED_LOGIT = -1e30


def top_k_logits(logits: Tensor, k: int) -> Tensor:
    """Keeps the `k` largest logits of the last axis (ties at the k-th value are kept).

    Args:
        logits: [..., vocab].
        k: Number of tokens to keep (>= 1).

    Returns:
        Logits with the others set to a very negative value.

    Raises:
        ValueError: If k < 1.
    """
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    k = min(k, logits.shape[-1])
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return jnp.where(logits < kth, _MASKED_LOGIT, logits)


def top_p_logits(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering: keeps the smallest set of most likely tokens with probability >= p.

    The most likely token is always kept.

    Args:
        logits: [..., vocab].
        p: Cumulative probability threshold in (0, 1].

    Returns:
        Logits with the others set to a very negative value.

    Raises:
        ValueError: If p is not in (0, 1].
    """
    if not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    order = jnp.argsort(-logits, axis=-1)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits.astype(jnp.float32), axis=-1)
    # Mass strictly before each token in sorted order; keep a token if that mass is < p.
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < p
    keep = jnp.zeros_like(keep_sorted)
    keep = jnp.put_along_axis(keep, order, keep_sorted, axis=-1, inplace=False)
    return jnp.where(keep, logits, _MASKED_LOGIT)


def sample_tokens(
    prng_key: Optional[Tensor],
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
) -> Tensor:
    """Picks next tokens: argmax if temperature == 0, else samples softmax(logits / temperature).

    Args:
        prng_key: PRNG key (unused and may be None for temperature 0).
        logits: [batch, vocab].
        temperature: Softmax temperature (>= 0).
        top_k: If set, sample among the top_k most likely tokens only.
        top_p: If set, sample from the nucleus of probability top_p only.

    Returns:
        Int32 token ids [batch].

    Raises:
        ValueError: If temperature is negative or a key is missing for sampling.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    logits = logits.astype(jnp.float32)
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    if prng_key is None:
        raise ValueError("Sampling with temperature > 0 needs a prng_key")
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_logits(logits, top_k)
    if top_p is not None:
        logits = top_p_logits(logits, top_p)
    return jax.random.categorical(prng_key, logits, axis=-1).astype(jnp.int32)


def infer_initial_time_step(prefix: Tensor, *, pad_id: int) -> Tensor:
    """The position after each row's last non-padding token (0 for an all-padding row).

    Args:
        prefix: Int tensor [batch, length], right-padded with `pad_id`.
        pad_id: The padding id.

    Returns:
        Int32 [batch].
    """
    length = prefix.shape[1]
    non_pad = prefix != pad_id
    last = jnp.max(jnp.where(non_pad, jnp.arange(length)[None] + 1, 0), axis=1)
    return last.astype(jnp.int32)


class DecodeOutputs(NamedTuple):
    """Decoding results.

    Fields:
        sequences: [batch, length]: the prefix with generated tokens written from each row's
            initial time step (pad_id after EOS and beyond what was generated).
        tokens: [batch, num_steps]: the generated tokens (pad_id after an EOS).
        num_decoded: [batch]: generated tokens per row, including the EOS.
    """

    sequences: Tensor
    tokens: Tensor
    num_decoded: Tensor


def decode_loop(
    *,
    step_fn: Callable[[Tensor, NestedTensor], tuple[Tensor, NestedTensor]],
    init_states: NestedTensor,
    init_logits: Tensor,
    sequences: Tensor,
    time_step: Tensor,
    num_steps: int,
    prng_key: Optional[Tensor],
    temperature: float = 0.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    eos_id: Optional[int] = None,
    pad_id: int = 0,
) -> DecodeOutputs:
    """Generates `num_steps` tokens per row with a `jax.lax.scan`.

    Step i picks token i from the current logits (of the position before time_step + i), writes
    it at time_step + i, and (unless it is the last step) calls `step_fn` to get the next logits.
    After a row emits `eos_id`, it emits `pad_id`.

    Args:
        step_fn: (token_ids [batch, 1], states) -> (logits [batch, vocab], states).
        init_states: The states after the prefix (e.g. a prefilled KV cache).
        init_logits: [batch, vocab] logits predicting the token at `time_step`.
        sequences: [batch, length] buffer holding the prefix; generated tokens are written into
            it (writes at positions >= length are dropped).
        time_step: [batch] position of each row's first generated token.
        num_steps: Number of tokens to generate (static).
        prng_key: Key for sampling (None for greedy decoding).
        temperature: See `sample_tokens`; 0 is greedy.
        top_k: See `sample_tokens`.
        top_p: See `sample_tokens`.
        eos_id: Optional end-of-sequence id.
        pad_id: Id emitted after EOS.

    Returns:
        DecodeOutputs.
    """
    batch, length = sequences.shape
    keys = (
        jax.random.split(prng_key, num_steps)
        if prng_key is not None
        else jnp.zeros((num_steps, 2), jnp.uint32)
    )

    def body(carry, xs):
        states, logits, seqs, done, count = carry
        i, key = xs
        token = sample_tokens(
            key if prng_key is not None else None,
            logits,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )
        token = jnp.where(done, pad_id, token)
        count = count + (~done).astype(jnp.int32)
        if eos_id is not None:
            done = done | (token == eos_id)
        position = time_step + i
        write = jax.nn.one_hot(position, length, dtype=jnp.int32)
        seqs = seqs * (1 - write) + token[:, None] * write

        def advance(states):
            return step_fn(token[:, None], states)

        def stay(states):
            return logits, states

        logits, states = jax.lax.cond(i < num_steps - 1, advance, stay, states)
        return (states, logits, seqs, done, count), token

    init = (
        init_states,
        init_logits,
        sequences.astype(jnp.int32),
        jnp.zeros([batch], bool),
        jnp.zeros([batch], jnp.int32),
    )
    (_, _, seqs, _, count), tokens = jax.lax.scan(body, init, (jnp.arange(num_steps), keys))
    return DecodeOutputs(sequences=seqs, tokens=tokens.T, num_decoded=count)
