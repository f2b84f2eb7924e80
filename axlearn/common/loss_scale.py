"""Dynamic loss scaling for float16 training.

Float16 gradients underflow (small values flush to zero) unless the loss is multiplied by a large
factor before the backward pass and the gradients divided by it afterwards. The factor is
adjusted dynamically: it starts high (2^32 by default), is halved whenever the scaled gradients
overflow (the step is then skipped: parameters and optimizer state stay unchanged), and doubled
after `growth_interval` consecutive clean steps.

Set `Learner.Config.loss_scaler = DynamicLossScaler.default_config()` and train with
`train_dtype=jnp.float16`; the learner applies the scale, skips overflowing steps and reports
`loss_scale/scale`, `loss_scale/num_skipped_steps` and `loss_scale/num_nan_steps` summaries.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
from jax import numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.config import Configurable, config_class
from axlearn.common.utils import Tensor, TensorSpec


class LossScaleState(NamedTuple):
    """The state of a DynamicLossScaler (all scalars)."""

    # The current loss scale (float32).
    scale: Tensor
    # Consecutive steps without overflow since the last scale change (int32).
    good_steps: Tensor
    # Total steps skipped because of non-finite gradients (int32).
    num_skipped_steps: Tensor
    # Total steps whose loss was NaN or infinite (int32).
    num_nan_steps: Tensor


class DynamicLossScaler(Configurable):
    """Dynamic loss scaling: back off on overflow (and skip the step), grow after clean steps."""

    @config_class
    class Config(Configurable.Config):
        """Configures DynamicLossScaler."""

        # The scale at the first step.
        initial_scale: float = 2.0**32
        # Multiplier applied after `growth_interval` consecutive steps without overflow.
        growth_factor: float = 2.0
        # Multiplier applied on overflow.
        backoff_factor: float = 0.5
        # Consecutive clean steps before the scale grows.
        growth_interval: int = 1000
        # The scale never goes below this.
        min_scale: float = 1.0
        # The scale never goes above this.
        max_scale: float = 2.0**32

    def init(self) -> LossScaleState:
        """Returns the initial state."""
        cfg = self.config
        zero = jnp.zeros([], jnp.int32)
        return LossScaleState(jnp.asarray(cfg.initial_scale, jnp.float32), zero, zero, zero)

    def partition(self) -> LossScaleState:
        """Returns the state's specs (replicated scalars)."""

        def spec(dtype):
            return TensorSpec(shape=[], dtype=dtype, mesh_axes=PartitionSpec())

        return LossScaleState(spec(jnp.float32), spec(jnp.int32), spec(jnp.int32), spec(jnp.int32))

    def scale_loss(self, loss: Tensor, state: LossScaleState) -> Tensor:
        """Returns loss * scale, in float32."""
        return loss.astype(jnp.float32) * state.scale

    def unscale(self, tree: Any, state: LossScaleState) -> Any:
        """Divides every leaf of `tree` (e.g. gradients) by the scale, keeping dtypes."""
        inv = 1.0 / state.scale
        return jax.tree.map(lambda x: (x.astype(jnp.float32) * inv).astype(x.dtype), tree)

    def update(
        self, state: LossScaleState, *, grads_finite: Tensor, loss_finite: Tensor
    ) -> LossScaleState:
        """Returns the state after a step.

        Args:
            state: The state before the step.
            grads_finite: Whether all unscaled gradients were finite (else the step is skipped).
            loss_finite: Whether the loss was finite.

        Returns:
            The new state.
        """
        cfg = self.config
        good = state.good_steps + 1
        grow = good >= cfg.growth_interval
        grown = jnp.minimum(state.scale * cfg.growth_factor, cfg.max_scale)
        backed_off = jnp.maximum(state.scale * cfg.backoff_factor, cfg.min_scale)
        scale = jnp.where(grads_finite, jnp.where(grow, grown, state.scale), backed_off)
        good_steps = jnp.where(jnp.logical_and(grads_finite, jnp.logical_not(grow)), good, 0)
        return LossScaleState(
            scale=scale.astype(jnp.float32),
            good_steps=good_steps.astype(jnp.int32),
            num_skipped_steps=state.num_skipped_steps + jnp.logical_not(grads_finite),
            num_nan_steps=state.num_nan_steps + jnp.logical_not(loss_finite),
        )
