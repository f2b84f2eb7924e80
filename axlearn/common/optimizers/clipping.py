"""Global-norm gradient clipping and skipping of abnormal steps."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import optax
from jax import numpy as jnp

from axlearn.common.config import ConfigOr, maybe_instantiate
from axlearn.common.optimizer_base import (
    PartitionedGradientTransformation,
)
from axlearn.common.optimizers.transforms import (
    _add_summary,
    _scalar_spec,
    _to_partitioned_transformation,
    global_norm,
)
from axlearn.common.utils import Tensor, all_finite

# --------------------------------------------------------------------------------------------
# Gradient clipping and skipping.
# --------------------------------------------------------------------------------------------


def clip_by_global_norm(
    max_norm: Optional[float] = None, *, drop_norm: Optional[float] = None, eps: float = 1e-8
) -> PartitionedGradientTransformation:
    """Scales gradients to global norm <= max_norm; zeroes them when the norm >= drop_norm.

    Unlike `skip_and_clip_by_global_norm`, a dropped step still runs the following
    transformations (on zero gradients), so their state (e.g. momentum) still changes.

    Args:
        max_norm: The maximum global norm (None: no clipping).
        drop_norm: Gradients with a larger global norm are zeroed (None: never).
        eps: Added to the norm in the clipping scale max_norm / (norm + eps).

    Returns:
        The transformation.
    """

    def update_fn(updates, state, params=None):
        del params
        g_norm = global_norm(updates)
        _add_summary("gradient_norm", g_norm)
        if max_norm is None and drop_norm is None:
            return updates, state
        g_scale = 1.0
        if max_norm is not None:
            g_scale = jnp.minimum(1.0, max_norm / (g_norm + eps))
        if drop_norm is not None:
            g_scale = g_scale * (g_norm < drop_norm).astype(g_norm.dtype)
        _add_summary("gradient_scale", g_scale)
        return jax.tree.map(lambda t: t * g_scale, updates), state

    return PartitionedGradientTransformation(
        lambda _: optax.EmptyState(), update_fn, lambda _: optax.EmptyState()
    )


# Maps gradient-norm statistics (count, mean, stddev) to named drop thresholds.
DropNormThresholdFn = Callable[..., dict[str, Tensor]]


def drop_norm_by_grad_norm_ema(multipliers: tuple = (20, 40, 100)) -> DropNormThresholdFn:
    """Drop thresholds at multiples of the running mean of gradient norms.

    Args:
        multipliers: The multiples.

    Returns:
        A DropNormThresholdFn with thresholds named "{m}x_mean".
    """

    def fn(*, count, mean, stddev):
        del count, stddev
        return {f"{m}x_mean": mean * m for m in multipliers}

    return fn


def drop_norm_by_grad_norm_stddev(
    *, min_count: int = 500, multipliers: tuple = (20, 40, 100)
) -> DropNormThresholdFn:
    """Drop thresholds at mean + m * stddev of gradient norms, after `min_count` valid steps.

    Args:
        min_count: No dropping before this many valid steps.
        multipliers: The multiples of the standard deviation.

    Returns:
        A DropNormThresholdFn with thresholds named "{m}x_stddev".
    """

    def fn(*, count, mean, stddev):
        return {
            f"{m}x_stddev": jnp.where(count < min_count, 1e10, mean + stddev * m)
            for m in multipliers
        }

    return fn


def _stddev(mean: Tensor, mean_square: Tensor) -> Tensor:
    """The standard deviation from running E[x] and E[x**2]."""
    return (mean_square - mean**2) ** 0.5


class SkipClipState(NamedTuple):
    """State of skip_and_clip_by_global_norm."""

    # Number of valid steps (adaptive drop norm only).
    count: Optional[Tensor]
    # Number of skipped (non-valid) steps.
    nonvalid_count: Tensor
    # Running mean of gradient norms (adaptive drop norm only).
    grad_norm_ema: Optional[Tensor]
    # Running mean of squared gradient norms (adaptive drop norm only); the norm's standard
    # deviation is sqrt(grad_norm_square_ema - grad_norm_ema**2).
    grad_norm_square_ema: Optional[Tensor]
    # The inner transformation's state.
    inner_state: Any
    # Per threshold name, the number of steps whose norm exceeded it (adaptive drop norm only).
    drop_stats: Optional[dict[str, Tensor]]


def skip_and_clip_by_global_norm(
    inner: ConfigOr[PartitionedGradientTransformation],
    *,
    drop_norm: Optional[Union[float, ConfigOr[DropNormThresholdFn]]] = None,
    max_norm: Optional[float] = None,
    grad_norm_ema_decay: Optional[float] = None,
    eps: float = 1e-8,
) -> PartitionedGradientTransformation:
    """Skips abnormal steps entirely; otherwise clips the global norm and applies `inner`.

    A step is skipped when any gradient is non-finite or the global norm >= drop_norm: its
    updates are zero and the inner state is left unchanged, and `nonvalid_count` (also a
    summary) is incremented. Otherwise gradients are scaled to norm <= max_norm and passed to
    `inner`. Summaries: gradient_norm, nonvalid_count, gradient_scale (with max_norm).

    Args:
        inner: The wrapped transformation (e.g. an optimizer) or its config.
        drop_norm: A number (a fixed threshold), or a DropNormThresholdFn (or config) computing
            thresholds from running gradient-norm statistics; None: only non-finite steps skip.
        max_norm: The clipping norm; None: no clipping.
        grad_norm_ema_decay: Decay of the running gradient-norm statistics; required (e.g. 0.99)
            when drop_norm is a DropNormThresholdFn.
        eps: Added to the norm in the clipping scale max_norm / (norm + eps).

    Returns:
        The transformation.

    Raises:
        ValueError: If drop_norm is a DropNormThresholdFn and grad_norm_ema_decay is None.
    """
    inner = _to_partitioned_transformation(inner)
    fixed_drop = isinstance(drop_norm, (int, float)) and not isinstance(drop_norm, bool)
    adaptive = drop_norm is not None and not fixed_drop
    drop_fn = maybe_instantiate(drop_norm) if adaptive else None
    if adaptive and grad_norm_ema_decay is None:
        raise ValueError("grad_norm_ema_decay must be set (e.g. 0.99).")
    norm_decay = grad_norm_ema_decay

    def _threshold_names():
        one = jnp.ones([], jnp.float32)
        return list(drop_fn(count=one, mean=one, stddev=one).keys())

    def init_fn(params):
        if not adaptive:
            return SkipClipState(
                None, jnp.zeros([], jnp.int32), None, None, inner.init(params), None
            )
        return SkipClipState(
            count=jnp.zeros([], jnp.int32),
            nonvalid_count=jnp.zeros([], jnp.int32),
            # Positive initial statistics so the first steps are not dropped.
            grad_norm_ema=jnp.ones([], jnp.float32),
            grad_norm_square_ema=jnp.ones([], jnp.float32),
            inner_state=inner.init(params),
            drop_stats={k: jnp.zeros([], jnp.int32) for k in _threshold_names()},
        )

    def update_fn(updates, state, params=None):
        is_finite = all_finite(updates)
        g_norm = global_norm(updates)
        new_drop_stats = None
        if fixed_drop:
            is_valid = jnp.logical_and(is_finite, g_norm < drop_norm)
        elif adaptive:
            thresholds = drop_fn(
                count=state.count,
                mean=state.grad_norm_ema,
                stddev=_stddev(state.grad_norm_ema, state.grad_norm_square_ema),
            )
            is_valid = is_finite
            new_drop_stats = {}
            for key, value in thresholds.items():
                below = g_norm < value
                is_valid = jnp.logical_and(is_valid, below)
                new_drop_stats[key] = jnp.where(
                    below, state.drop_stats[key], optax.safe_increment(state.drop_stats[key])
                )
        else:
            is_valid = is_finite
        nonvalid_count = jnp.where(
            is_valid, state.nonvalid_count, optax.safe_increment(state.nonvalid_count)
        )
        count, norm_ema, norm_sq_ema = state.count, state.grad_norm_ema, state.grad_norm_square_ema
        if adaptive:
            count = jnp.where(is_valid, optax.safe_increment(state.count), state.count)
            # Bias-corrected decay (Adafactor, section 7.1).
            t = count.astype(jnp.float32)
            decay = norm_decay * (1 - norm_decay ** (t - 1)) / (1 - norm_decay**t)
            new_mean = decay * norm_ema + (1 - decay) * g_norm
            new_sq = decay * norm_sq_ema + (1 - decay) * g_norm**2
            norm_ema = jnp.where(is_valid, new_mean, norm_ema)
            norm_sq_ema = jnp.where(is_valid, new_sq, norm_sq_ema)
            _add_summary("gradient_norm_ema", norm_ema)
            _add_summary("gradient_norm_std_ema", _stddev(norm_ema, norm_sq_ema))
            _add_summary("count", count)
            for key, value in new_drop_stats.items():
                _add_summary(f"count_exceeds_{key}", value)
        _add_summary("gradient_norm", g_norm)
        _add_summary("nonvalid_count", nonvalid_count)
        clipped = updates
        if max_norm is not None:
            g_scale = jnp.minimum(1.0, max_norm / (g_norm + eps))
            clipped = jax.tree.map(lambda t: t * g_scale, updates)
            _add_summary("gradient_scale", g_scale)
        new_updates, new_inner_state = inner.update(clipped, state.inner_state, params)
        final_updates = jax.tree.map(
            lambda new, old: jnp.where(is_valid, new, jnp.zeros_like(old)), new_updates, updates
        )
        final_inner_state = jax.tree.map(
            lambda new, old: jnp.where(is_valid, new, old), new_inner_state, state.inner_state
        )
        return final_updates, SkipClipState(
            count=count,
            nonvalid_count=nonvalid_count,
            grad_norm_ema=norm_ema,
            grad_norm_square_ema=norm_sq_ema,
            inner_state=final_inner_state,
            drop_stats=new_drop_stats,
        )

    def partition_fn(specs):
        if not adaptive:
            return SkipClipState(None, _scalar_spec(), None, None, inner.partition(specs), None)
        return SkipClipState(
            count=_scalar_spec(),
            nonvalid_count=_scalar_spec(),
            grad_norm_ema=_scalar_spec(jnp.float32),
            grad_norm_square_ema=_scalar_spec(jnp.float32),
            inner_state=inner.partition(specs),
            drop_stats={k: _scalar_spec() for k in _threshold_names()},
        )

    return PartitionedGradientTransformation(init_fn, update_fn, partition_fn)
