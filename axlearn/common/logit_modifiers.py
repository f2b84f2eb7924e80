"""Logits-to-logits functions for decoding: temperature, top-k, top-p and their chains.

Each builder returns a `LogitsToLogitsFn` applied to scores [..., vocab] before sampling
(`Decoder.sample_decode(..., logits_modifier=...)`), e.g.
`chain(scale_by(0.7), top_k_logits(40), top_p_logits(0.9))`; `top_k_logits(1)` is greedy.
"""

from typing import Callable, Literal

import jax.numpy as jnp

from axlearn.common import decoding
from axlearn.common.config import maybe_instantiate
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
        return logits / temperature

    return fn


def top_k_logits(
    k: int, *, break_ties: Literal["all", "lowest-token-id"] = "all"
) -> LogitsToLogitsFn:
    """Keeps the k largest logits (others become very negative).

    Args:
        k: Number of logits to keep (>= 1).
        break_ties: "all" keeps every logit tied with the k-th; "lowest-token-id" (k=1 only)
            keeps only the lowest id among tied maxima.

    Returns:
        The function.

    Raises:
        ValueError: If k < 1 or break_ties is unknown.
        NotImplementedError: For "lowest-token-id" with k > 1.
    """
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    if break_ties == "all":
        return lambda logits: decoding.top_k_logits(logits, k)
    if break_ties == "lowest-token-id":
        if k != 1:
            raise NotImplementedError(f"break_ties='lowest-token-id' needs k=1, got {k}")

        def first_max(logits: Tensor) -> Tensor:
            keep = jnp.arange(logits.shape[-1]) == jnp.argmax(logits, axis=-1, keepdims=True)
            return jnp.where(keep, logits, decoding.NEG_INF)

        return first_max
    raise ValueError(f"Unsupported break_ties: {break_ties!r}")


def top_p_logits(p: float) -> LogitsToLogitsFn:
    """Keeps the smallest set of most likely logits with total probability >= p.

    Args:
        p: In (0, 1].

    Returns:
        The function.

    Raises:
        ValueError: If p is not in (0, 1].
    """
    if not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    return lambda logits: decoding.top_p_logits(logits, p)
