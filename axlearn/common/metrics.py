"""Metrics that accumulate over batches: weighted means, reducers and the evalers' accumulator.

AXLearn's names: `WeightedSummary` (any weighted mean), `WeightedScalar` (a scalar one, what
our modules add), `MinSummary`/`MaxSummary`/`SumSummary` (elementwise reductions) and
`MetricAccumulator`; all are `summary.Summary` pytrees.

`WeightedScalar(mean, weight)` is a pytree (it can be returned from jitted functions and added as a
module summary). Adding two gives the weighted mean of both, with the weights summed, so the mean
over an eval set accumulated batch by batch equals the mean over all of its examples/tokens:

    a = WeightedScalar(2.0, 1.0)
    b = WeightedScalar(5.0, 2.0)
    c = a + b                           # mean 4.0 (= (2*1 + 5*2) / 3), weight 3.0

A weight of zero contributes nothing; when all weights are zero the mean is 0.

`MetricAccumulator` keeps a tree of summaries and accumulates each leaf that knows how
(`WeightedScalar` and other objects with an `accumulate` method); plain tensors in the tree are
dropped, since there is no single right way to combine them.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from axlearn.common.config import Configurable
from axlearn.common.summary import Summary


class MetricSummary(Summary):
    """Base class of metric summaries computed during training and evaluation."""


class WeightedValue(MetricSummary):
    """A mean and the (non-negative) weight behind it."""

    # The mean (a tensor or Python number).
    mean: Any
    # The total weight behind the mean (>= 0).
    weight: Any

    def value(self) -> Any:
        """The value shown in summaries: the mean."""
        return self.mean


class WeightedSummary(WeightedValue):
    """A weighted mean that accumulates: adding two gives the weighted mean, weights summed.

    A weight of zero contributes nothing; when all weights are zero the mean is 0.
    """

    def __add__(self, other: WeightedSummary) -> WeightedSummary:
        if not isinstance(other, WeightedSummary):
            return NotImplemented
        weight = self.weight + other.weight
        # Division guarded on both branches so gradients stay finite when the weight is zero.
        safe = jnp.where(weight > 0, weight, 1)
        mean = jnp.where(
            weight > 0, (self.mean * self.weight + other.mean * other.weight) / safe, 0.0
        )
        return type(self)(mean, weight)

    def accumulate(self, other: Summary) -> WeightedSummary:
        """Returns `self + other`.

        Raises:
            TypeError: If `other` is not a WeightedSummary.
        """
        if not isinstance(other, WeightedSummary):
            raise TypeError(f"Expected WeightedSummary, got {type(other)}.")
        return self + other


class WeightedScalar(WeightedSummary):
    """A scalar mean and its (non-negative) weight, e.g. a loss averaged over `weight` tokens.

    Attributes:
        mean: The mean (a scalar tensor or Python number).
        weight: The total weight behind the mean (scalar, >= 0).
    """

    def validate(self) -> None:
        """Raises ValueError if mean or weight is not a scalar."""
        for name in ("mean", "weight"):
            v = getattr(self, name)
            if hasattr(v, "shape") and tuple(v.shape) != ():
                raise ValueError(f"WeightedScalar.{name} must be a scalar, got shape {v.shape}")

    def accumulate(self, other: Summary) -> WeightedSummary:
        """Returns `self + other`.

        Raises:
            TypeError: If `other` is not a WeightedScalar.
        """
        if not isinstance(other, WeightedScalar):
            raise TypeError(
                f"WeightedScalar.accumulate expects a WeightedScalar, got {type(other)}"
            )
        return self + other


class _ReducerSummary(MetricSummary):
    """A tensor reduced elementwise across accumulation (subclasses define the reduction)."""

    # The tensor.
    _value: Any

    def value(self) -> Any:
        """The reduced tensor."""
        return self._value

    def validate(self) -> None:
        """Raises ValueError if the value is not an array."""
        if not hasattr(self._value, "shape"):
            raise ValueError(
                f"{type(self).__name__} value must be a Tensor, but got {type(self._value)}."
            )

    def _accumulate_op(self, this_value: Any, other_value: Any) -> Any:
        raise NotImplementedError(type(self))

    def accumulate(self, other: Summary) -> _ReducerSummary:
        """Combines elementwise with a summary of the same type and shape.

        Raises:
            TypeError: If `other` is of another type.
            ValueError: If the shapes differ.
        """
        if not isinstance(other, type(self)):
            raise TypeError(f"Expected {type(self).__name__}, got {type(other)}.")
        if self._value.shape != other._value.shape:
            raise ValueError(f"Shape mismatch: {self._value.shape} vs {other._value.shape}.")
        return type(self)(self._accumulate_op(self._value, other._value))


class MinSummary(_ReducerSummary):
    """The elementwise minimum across accumulation."""

    def _accumulate_op(self, this_value: Any, other_value: Any) -> Any:
        return jnp.minimum(this_value, other_value)


class MaxSummary(_ReducerSummary):
    """The elementwise maximum across accumulation."""

    def _accumulate_op(self, this_value: Any, other_value: Any) -> Any:
        return jnp.maximum(this_value, other_value)


class SumSummary(_ReducerSummary):
    """The elementwise sum across accumulation."""

    def _accumulate_op(self, this_value: Any, other_value: Any) -> Any:
        return this_value + other_value


def _is_summary(x: Any) -> bool:
    return callable(getattr(x, "accumulate", None))


def _summaries_only(tree: Any) -> Any:
    """Keeps the summary leaves of a tree of dicts/lists; drops other leaves and empty dicts."""
    if _is_summary(tree):
        return tree
    if isinstance(tree, dict):
        kept = {k: _summaries_only(v) for k, v in tree.items()}
        return {k: v for k, v in kept.items() if v is not None and v != {}}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_summaries_only(v) for v in tree)
    return None


class MetricAccumulator(Configurable):
    """Accumulates summaries over batches (used by evalers and gradient accumulation).

    `update(summaries)` merges a tree of summaries: leaves with an `accumulate` method (e.g.
    `WeightedScalar`) are combined with the same path's earlier value; other leaves are dropped.
    `summaries()` returns the accumulated tree.
    """

    def __init__(self, cfg: Configurable.Config):
        super().__init__(cfg)
        self._summaries: Optional[dict[str, Any]] = None

    def update(self, model_outputs: dict[str, Any]) -> None:
        """Accumulates the summaries in `model_outputs`.

        Args:
            model_outputs: A tree of summaries, e.g. an output collection's `summaries`.

        Raises:
            ValueError: If the tree structure differs from the earlier updates'.
        """
        kept = _summaries_only(model_outputs)
        if self._summaries is None:
            self._summaries = kept
            return
        try:
            self._summaries = jax.tree.map(
                lambda x, y: x.accumulate(y), self._summaries, kept, is_leaf=_is_summary
            )
        except ValueError as e:
            raise ValueError(
                f"MetricAccumulator.update: the summaries' structure changed between batches: {e}"
            ) from e

    def summaries(self) -> dict[str, Any]:
        """The accumulated summaries ({} before the first update)."""
        return self._summaries if self._summaries is not None else {}
