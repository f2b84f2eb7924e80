"""Logits-to-logits functions for decoding: temperature, top-k, top-p and their chains.

Each builder returns a `LogitsToLogitsFn` applied to scores [..., vocab] before sampling
(`Decoder.sample_decode(..., logits_modifier=...)`), e.g.
`chain(scale_by(0.7), top_k_logits(40), top_p_logits(0.9))`; `top_k_logits(1)` is greedy.
"""

from typing import Callable, Literal, Union

import jax
import jax.numpy as jnp

from axlearn.common.config import maybe_instantiate
from axlearn.common.decoding import NEG_INF
from axlearn.common.utils import Tensor

# A function mapping logits [..., vocab] to modified logits of the same shape and dtype.
LogitsToLogitsFn = Callable[[Tensor], Tensor]


def chain(*args) -> LogitsToLogitsFn:
    """Applies the given functions (or function configs) in order.

    Args:
        *args: LogitsToLogitsFns or configs instantiating to them.

    Returns:
        Their composition.
    """

    def fn(logits: Tensor) -> Tensor:
        for modifier in args:
            logits = maybe_instantiate(modifier)(logits)
        return logits

    return fn


def scale_by(temperature: float, *, min_temperature: float = 1e-4) -> LogitsToLogitsFn:
    """Divides logits by `temperature` (for temperature sampling).

    Args:
        temperature: The temperature.
        min_temperature: Smallest allowed temperature.

    Returns:
        The function.

    Raises:
        ValueError: If temperature < min_temperature.
    """
    if temperature < min_temperature:
        raise ValueError(f"temperature should be >= {min_temperature}, got {temperature}")

    def fn(logits: Tensor) -> Tensor:
        return logits / max(temperature, min_temperature)

    return fn


def top_k_logits(
    k: int, *, break_ties: Literal["all", "smallest_index"] = "all"
) -> LogitsToLogitsFn:
    """Keeps the k largest logits (others become `decoding.NEG_INF`).

    Args:
        k: Number of logits to keep (>= 1).
        break_ties: "all" keeps every logit tied with the k-th largest (more than k in all);
            "smallest_index" (k=1 only) keeps only the smallest index among tied maxima.

    Returns:
        The function.

    Raises:
        ValueError: If k < 1 or break_ties is unknown.
        NotImplementedError: For "smallest_index" with k > 1.
    """
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    if break_ties == "all":

        def keep_ties(logits: Tensor) -> Tensor:
            kth = jax.lax.top_k(logits, min(k, logits.shape[-1]))[0][..., -1:]
            return jnp.where(logits >= kth, logits, NEG_INF).astype(logits.dtype)

        return keep_ties
    if break_ties == "smallest_index":
        if k != 1:
            raise NotImplementedError(f"break_ties='smallest_index' needs k=1, got {k}")

        def first_max(logits: Tensor) -> Tensor:
            keep = jnp.arange(logits.shape[-1]) == jnp.argmax(logits, axis=-1, keepdims=True)
            return jnp.where(keep, logits, NEG_INF).astype(logits.dtype)

        return first_max
    raise ValueError(f"Unsupported break_ties: {break_ties!r}; use 'all' or 'smallest_index'")


def top_p_logits(p: Union[float, Tensor]) -> LogitsToLogitsFn:
    """Keeps the most likely logits whose total probability reaches p (others: `NEG_INF`).

    The threshold is the largest probability q such that the tokens with probability >= q hold
    a mass >= p; every token at or above it is kept, so tied probabilities are kept together
    (a vocabulary of equal logits is kept whole for any p).

    Args:
        p: In (0, 1]: a number, or a [batch] tensor with one p per leading-axis row.

    Returns:
        The function.

    Raises:
        ValueError: If a number p is not in (0, 1], or a tensor p is not 1-D.
    """
    if isinstance(p, (int, float)):
        if not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {p}")
        p = float(p)
    elif jnp.ndim(p) != 1:
        raise ValueError(
            f"top_p must be a number or a 1-D [batch] tensor, got shape {jnp.shape(p)}"
        )

    def fn(logits: Tensor) -> Tensor:
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        top_p = p
        if not isinstance(top_p, float):
            top_p = jnp.reshape(top_p, (-1,) + (1,) * (probs.ndim - 1))

        def mass_below_p(query: Tensor) -> Tensor:
            # query: [...] (the batch shape). Mass of the tokens with probability >= query.
            mass = jnp.sum(jnp.where(probs >= query[..., None], probs, 0.0), axis=-1)
            return mass[..., None] < top_p

        threshold = _float32_binary_search(
            probs.shape[:-1], predicate=lambda q: mass_below_p(q)[..., 0]
        )
        return jnp.where(probs >= threshold[..., None], logits, NEG_INF).astype(logits.dtype)

    return fn


_INT32_SIGN = -(1 << 31)
# Float32 bits with every exponent bit set: infinities and NaNs.
_FLOAT32_EXPONENT_BITS = 0x7F800000


def _int32_binary_search(
    batched_shape: tuple[int, ...], *, predicate: Callable[[Tensor], Tensor]
) -> Tensor:
    """The largest int32 at which a monotonic predicate is still False, per batch element.

    Bits are decided from the most significant down in the order-preserving offset encoding
    (value + 2**31 as an unsigned number): a bit is kept set when the predicate is False there.

    Args:
        batched_shape: The shape of the int32 queries.
        predicate: Maps int32 [batched_shape] to bool [batched_shape]; False up to some value,
            True above it (monotonic).

    Returns:
        int32 [batched_shape]: per element, the largest value where `predicate` is False, or
        int32's minimum where it is True everywhere.
    """

    def from_offset(offset: Tensor) -> Tensor:
        # Offset 0 is int32's minimum: flipping the sign bit maps offsets to values in order.
        return offset ^ jnp.int32(_INT32_SIGN)

    def step(i: Tensor, offset: Tensor) -> Tensor:
        bit = jax.lax.shift_left(jnp.int32(1), (31 - i).astype(jnp.int32))
        candidate = offset | bit
        return jnp.where(predicate(from_offset(candidate)), offset, candidate)

    offset = jax.lax.fori_loop(0, 32, step, jnp.zeros(batched_shape, jnp.int32))
    return from_offset(offset)


def _ordered_int32_to_float32(x: Tensor) -> Tensor:
    """Maps int32 to float32 so that int32 order is float32 order (non-finite at both ends)."""
    # Non-negative ints are the bits of +0.0 upwards; negative ones get their magnitude bits
    # flipped, so -1 is -0.0 and more negative ints are more negative floats.
    bits = jnp.where(x < 0, x ^ jnp.int32(0x7FFFFFFF), x)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _float32_binary_search(
    batched_shape: tuple[int, ...], *, predicate: Callable[[Tensor], Tensor]
) -> Tensor:
    """The largest finite float32 at which a monotonic predicate is still False.

    Args:
        batched_shape: The shape of the float32 queries.
        predicate: Maps float32 [batched_shape] to bool [batched_shape]; False up to some value,
            True above it (monotonic).

    Returns:
        float32 [batched_shape]: per element, the largest finite value where `predicate` is
        False (-0.0 and 0.0 are told apart: -0.0 is the smaller).
    """

    def int_predicate(x: Tensor) -> Tensor:
        value = _ordered_int32_to_float32(x)
        bits = jax.lax.bitcast_convert_type(value, jnp.int32)
        finite = (bits & _FLOAT32_EXPONENT_BITS) != _FLOAT32_EXPONENT_BITS
        # Non-finite queries: False below every finite float, True above.
        return jnp.where(finite, predicate(value), x >= 0)

    return _ordered_int32_to_float32(_int32_binary_search(batched_shape, predicate=int_predicate))
