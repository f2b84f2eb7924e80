"""When autoregressive decoding stops: `StopDecodingCondition` and its implementations.

A condition is called once per decoding step as `cond(index=..., sequences=..., prefix_len=...)`
and returns a bool [batch, num_decodes]: whether each sequence has finished at `index`. The names
are public under `axlearn.common.decoding` too (AXLearn's path).
"""

from collections.abc import Sequence
from typing import Protocol, Union

import jax.numpy as jnp
import numpy as np

from axlearn.common.utils import Tensor


class StopDecodingCondition(Protocol):
    """Decides which sequences stop after the token at `index` was written."""

    def __call__(self, *, index: Tensor, sequences: Tensor, prefix_len: Tensor) -> Tensor:
        """Returns bool [batch, num_decodes].

        Args:
            index: Int [batch] (or scalar): the index of the token just written.
            sequences: Int [batch, num_decodes, length]; values after `index` are undefined.
            prefix_len: Int [batch]: prompt lengths (index of the last prompt token + 1).
        """


class StopOnSubsequence:
    """Stops a sequence once it ends with one of `stopping_seqs` (e.g. [[eos_id]])."""

    def __init__(
        self, stopping_seqs: Union[int, Sequence[int], Sequence[Sequence[int]]], pad_value=-1
    ):
        """Initializes the condition.

        Args:
            stopping_seqs: A token id, a sequence of ids, or a list of such sequences.
            pad_value: A value no token takes (used to left-pad the shorter stopping sequences).

        Raises:
            ValueError: If a stopping sequence is empty.
        """
        if isinstance(stopping_seqs, int):
            stopping_seqs = [[stopping_seqs]]
        elif len(stopping_seqs) and isinstance(stopping_seqs[0], (int, np.integer)):
            stopping_seqs = [list(stopping_seqs)]
        if not stopping_seqs:
            raise ValueError("StopOnSubsequence needs at least one stopping sequence.")
        empty = [i for i, seq in enumerate(stopping_seqs) if len(seq) == 0]
        if empty:
            raise ValueError(
                f"Zero length stopping seqs are not supported. Zero length seqs at indices {empty}."
            )
        self.pad_value = pad_value
        self.longest = max(len(seq) for seq in stopping_seqs)
        self.targets = jnp.asarray(
            [[pad_value] * (self.longest - len(seq)) + list(seq) for seq in stopping_seqs]
        )

    def __call__(self, *, index: Tensor, sequences: Tensor, prefix_len: Tensor) -> Tensor:
        del prefix_len
        batch = sequences.shape[0]
        index = jnp.broadcast_to(jnp.asarray(index), (batch,))
        padded = jnp.pad(
            sequences,
            [(0, 0), (0, 0), (self.longest - 1, 0)],
            constant_values=self.pad_value,
        )
        # The `longest` tokens ending at `index` (in padded coordinates: index .. index+longest-1).
        window = index[:, None, None] + jnp.arange(self.longest)
        tail = jnp.take_along_axis(padded, window, axis=2)  # [batch, n, longest].
        match = (tail[:, :, None, :] == self.targets) | (self.targets == self.pad_value)
        return match.all(axis=-1).any(axis=-1)


class StopOnMaxLength:
    """Stops once `max_num_decodes` tokens were generated after the prompt."""

    def __init__(self, max_num_decodes: int):
        """Initializes the condition with the number of tokens to generate per prompt."""
        self.max_num_decodes = max_num_decodes

    def __call__(self, *, index: Tensor, sequences: Tensor, prefix_len: Tensor) -> Tensor:
        batch, num_decodes, length = sequences.shape
        index = jnp.broadcast_to(jnp.asarray(index), (batch,))
        limit = jnp.minimum(prefix_len + self.max_num_decodes, length)
        return jnp.broadcast_to((index >= limit)[:, None], (batch, num_decodes))


class CompositeDecodingCondition:
    """Stops when any of `conditions` says so."""

    def __init__(self, conditions: Sequence[StopDecodingCondition]):
        """Initializes with a non-empty list of conditions.

        Raises:
            ValueError: If `conditions` is empty.
        """
        if not conditions:
            raise ValueError(
                "CompositeDecodingCondition: conditions must contain at least one "
                "StopDecodingCondition"
            )
        self.conditions = list(conditions)

    def __call__(self, *, index: Tensor, sequences: Tensor, prefix_len: Tensor) -> Tensor:
        stop = jnp.zeros(sequences.shape[:2], bool)
        for condition in self.conditions:
            stop = stop | condition(index=index, sequences=sequences, prefix_len=prefix_len)
        return stop


# ------------------------------------------------------------------------------------------
# Sampling.
# ------------------------------------------------------------------------------------------
