"""Adastar: one optimizer covering AdamW (decoupled) and unfactored Adafactor."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import optax
from jax import numpy as jnp

from axlearn.common import schedule
from axlearn.common.config import ConfigOr
from axlearn.common.optimizer_base import (
    OptStateSpec,
    PartitionedGradientTransformation,
)
from axlearn.common.optimizers.per_param import (
    _weight_decay_scales,
)
from axlearn.common.optimizers.transforms import (
    _add_per_param_summaries,
    _add_summary,
    _is_zero,
    _rms_norms,
    _scalar_spec,
    _vectorized_tree_map,
    clip_by_block_rms,
    named_chain,
    opt_param_values,
)
from axlearn.common.utils import Tensor

# --------------------------------------------------------------------------------------------
# Adastar.
# --------------------------------------------------------------------------------------------


class _AdastarPerParamState(NamedTuple):
    # EMA of gradients (None when gradient_ema_decay is None).
    gradient_ema: Optional[Tensor]
    # EMA of squared gradients (+ eps_square).
    gradient_square_ema: Tensor
    # EMA of raw updates (None when update_ema_decay is None).
    update_ema: Optional[Tensor]


class AdastarState(NamedTuple):
    """Stage-1 state of adastar_optimizer."""

    # Number of updates.
    count: Tensor
    # Per-parameter _AdastarPerParamState tree.
    pps: Any


def adastar_optimizer(
    learning_rate: float,
    *,
    gradient_ema_decay: Optional[float],
    gradient_ema_debias: Optional[bool],
    gradient_square_ema_decay: float,
    gradient_square_ema_debias: bool,
    eps: float,
    eps_square: float,
    raw_update_clipping_threshold: Optional[float],
    update_ema_decay: Optional[float],
    update_ema_debias: bool,
    adam_update_transformation: Optional[ConfigOr[PartitionedGradientTransformation]] = None,
    weight_decay: float = 0,
    weight_decay_per_param_scale: Optional[ConfigOr[Callable]] = None,
    update_schedule: schedule.Schedule,
    verbosity: int = 0,
) -> PartitionedGradientTransformation:
    """A family covering AdamW (decoupled) and Adafactor (unfactored) with update clipping.

    Per parameter, with t the update count starting at 1:
        g_hat = ema(g; gradient_ema_decay, gradient_ema_debias)      (g if the decay is None)
        v_hat = ema(g**2 + eps_square; gradient_square_ema_decay, gradient_square_ema_debias)
        raw = g_hat / (sqrt(v_hat) + eps), clipped to block RMS <= raw_update_clipping_threshold
        u = ema(raw; update_ema_decay, update_ema_debias)          (raw if the decay is None)
        u = adam_update_transformation(u)                          (if set)
        update = -update_schedule(t) * (learning_rate * u + weight_decay * wd_scale * param)
    where ema(x; d, debias) keeps m = d * m + (1 - d) * x and returns m / (1 - d**t) if debias.
    With `weight_decay_per_param_scale`, `wd_scale` is ParameterSpec.weight_decay_scale, else the
    rule's scale; without it, 1 for every parameter (AXLearn's adastar does not consult
    ParameterSpec.weight_decay_scale then).

    Summaries (AXLearn's): schedule_step, schedule_scale, learning_rate and weight_decay_rate
    (weight_decay * schedule, times the last parameter's `weight_decay_per_param_scale` when one
    is set); with verbosity > 0 also per parameter raw_grad_norm, param_norm, raw_update_norm,
    smoothed_update_norm and the param-update correlations.

    Args:
        learning_rate: The base learning rate (scaled by update_schedule).
        gradient_ema_decay: Momentum on gradients; None disables it.
        gradient_ema_debias: Whether to debias the gradient EMA.
        gradient_square_ema_decay: Decay of the second moment.
        gradient_square_ema_debias: Whether to debias the second moment.
        eps: Added to the root of the second moment.
        eps_square: Added to the squared gradients.
        raw_update_clipping_threshold: Block-RMS clipping of raw updates; None: no clipping.
        update_ema_decay: Momentum on raw updates; None disables it.
        update_ema_debias: Whether to debias the update EMA.
        adam_update_transformation: Optional transformation of the smoothed updates, before the
            learning rate and weight decay (e.g. `scale_update_per_param`).
        weight_decay: Decoupled weight-decay rate (not scaled by learning_rate; scaled by
            update_schedule).
        weight_decay_per_param_scale: Optional per-parameter weight-decay scales.
        update_schedule: Multiplier schedule of the whole update.
        verbosity: > 0 adds per-parameter norms and correlations to summaries (they cost step
            time).

    Returns:
        The optimizer; its state is a dict with keys compute_updates, [transform_updates,]
        apply_lr_and_wd.
    """
    schedule_fn = schedule.as_schedule_fn(update_schedule)

    def _moment(x, acc, decay, debias, count):
        if decay is None:
            return x, None
        acc = decay * acc + (1 - decay) * x
        value = acc / (1 - decay ** count.astype(acc.dtype)) if debias else acc
        return value, acc

    def init_fn(params):
        def one(p):
            zeros = jnp.zeros_like(p.value)
            return _AdastarPerParamState(
                gradient_ema=None if gradient_ema_decay is None else zeros,
                gradient_square_ema=zeros,
                update_ema=None if update_ema_decay is None else zeros,
            )

        return AdastarState(count=jnp.zeros([], jnp.int32), pps=jax.tree.map(one, params))

    def update_fn(grads, state, params):
        if params is None:
            raise ValueError("adastar_optimizer needs params.")
        count = optax.safe_increment(state.count)

        def raw_update(g, pps):
            g_hat, g_acc = _moment(
                g, pps.gradient_ema, gradient_ema_decay, gradient_ema_debias, count
            )
            v_hat, v_acc = _moment(
                g * g + eps_square,
                pps.gradient_square_ema,
                gradient_square_ema_decay,
                gradient_square_ema_debias,
                count,
            )
            return g_hat / (jnp.sqrt(v_hat) + eps), _AdastarPerParamState(
                g_acc, v_acc, pps.update_ema
            )

        is_pair = lambda x: (
            isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], _AdastarPerParamState)
        )
        results = _vectorized_tree_map(raw_update, grads, state.pps)
        raw = jax.tree.map(lambda r: r[0], results, is_leaf=is_pair)
        pps = jax.tree.map(lambda r: r[1], results, is_leaf=is_pair)
        raw, _ = clip_by_block_rms(
            raw_update_clipping_threshold,
            summary_suffix="raw_update_norm" if verbosity > 0 else None,
        ).update(raw, optax.EmptyState(), params)

        def smooth(u, s):
            u_hat, u_acc = _moment(u, s.update_ema, update_ema_decay, update_ema_debias, count)
            return u_hat, _AdastarPerParamState(s.gradient_ema, s.gradient_square_ema, u_acc)

        results = _vectorized_tree_map(smooth, raw, pps)
        smoothed = jax.tree.map(lambda r: r[0], results, is_leaf=is_pair)
        pps = jax.tree.map(lambda r: r[1], results, is_leaf=is_pair)

        # Per-parameter statistics cost step time: only in verbose mode (as in AXLearn).
        if verbosity > 0:
            _rms_norms(grads, suffix="raw_grad_norm")
            values = opt_param_values(params)
            param_norm = _rms_norms(values, suffix="param_norm")
            raw_norm = _rms_norms(raw)
            smoothed_norm = _rms_norms(smoothed, suffix="smoothed_update_norm")
            for name, upd, norm in (
                ("corr_param_raw_updates", raw, raw_norm),
                ("corr_param_smoothed_updates", smoothed, smoothed_norm),
            ):
                cov = _vectorized_tree_map(lambda p, u: jnp.mean(p * u), values, upd)
                corr = jax.tree.map(lambda c, pn, un: c / pn / un, cov, param_norm, norm)
                _add_per_param_summaries(corr, suffix=name)
        return smoothed, AdastarState(count=count, pps=pps)

    def partition_fn(specs):
        def one(spec):
            s = OptStateSpec(shape=spec.shape, dtype=spec.dtype, mesh_axes=spec.mesh_axes)
            return _AdastarPerParamState(
                gradient_ema=None if gradient_ema_decay is None else s,
                gradient_square_ema=s,
                update_ema=None if update_ema_decay is None else s,
            )

        return AdastarState(count=_scalar_spec(), pps=jax.tree.map(one, specs))

    def update2_fn(updates, step, params):
        step_inc = optax.safe_increment(step)
        if weight_decay_per_param_scale is not None:
            scales = _weight_decay_scales(params, per_param_scale=weight_decay_per_param_scale)
        else:
            # As in AXLearn: without a per-param rule every parameter decays at scale 1
            # (ParameterSpec.weight_decay_scale is not consulted) and nothing is registered.
            scales = jax.tree.map(lambda _: 1, params)
        schedule_scale = schedule_fn(step_inc)
        _add_summary("schedule_step", step_inc)
        _add_summary("schedule_scale", schedule_scale)
        _add_summary("learning_rate", learning_rate * schedule_scale)
        # AXLearn writes this summary once per parameter, each time with that parameter's
        # `weight_decay_per_param_scale` (1 without one); the last parameter's value remains.
        last_scale = 1.0
        if weight_decay_per_param_scale is not None and jax.tree.leaves(scales):
            last_scale = jax.tree.leaves(scales)[-1]
        _add_summary("weight_decay_rate", weight_decay * schedule_scale * last_scale)

        def one(u, p, s):
            out = learning_rate * u
            if weight_decay and not _is_zero(s):
                out = out + (weight_decay * s) * p.value
            return -schedule_scale * out

        return jax.tree.map(one, updates, params, scales), step_inc

    tx = {"compute_updates": PartitionedGradientTransformation(init_fn, update_fn, partition_fn)}
    if adam_update_transformation is not None:
        tx["transform_updates"] = adam_update_transformation
    tx["apply_lr_and_wd"] = PartitionedGradientTransformation(
        init=lambda _: jnp.zeros([], jnp.int32),
        update=update2_fn,
        partition=lambda _: _scalar_spec(),
    )
    return named_chain(**tx)
