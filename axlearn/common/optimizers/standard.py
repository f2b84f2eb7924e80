"""Standard optimizers: SGD, Adam, AdamW (coupled and decoupled), Adafactor, Lion."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Callable, Optional

import jax
import optax
from jax import numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common import schedule
from axlearn.common.config import ConfigOr
from axlearn.common.optimizer_base import (
    OptStateSpec,
    PartitionedGradientTransformation,
)
from axlearn.common.optimizers.per_param import (
    add_decayed_weights,
    l2_regularizer,
)
from axlearn.common.optimizers.transforms import (
    _add_summary,
    _scalar_spec,
    adam_partition,
    chain,
    clip_by_block_rms,
    copy_partition,
    ema,
    scale,
    scale_by_param_block_rms,
    scale_by_schedule,
    scale_by_trust_ratio,
    scale_from_learning_rate,
    trace_partition,
    with_partition_fn,
)

# --------------------------------------------------------------------------------------------
# Optimizers.
# --------------------------------------------------------------------------------------------


def sgd_optimizer(
    learning_rate: schedule.Schedule,
    *,
    decouple_weight_decay: bool,
    momentum: float = 0,
    weight_decay: float = 0,
    weight_decay_per_param_scale: Optional[ConfigOr[Callable]] = None,
) -> PartitionedGradientTransformation:
    """SGD with momentum and weight decay.

    Args:
        learning_rate: The learning-rate schedule.
        decouple_weight_decay: If True, weight decay is added after the momentum (it does not
            enter the momentum); if False, it is added to the gradient first (as in PyTorch).
        momentum: The momentum decay.
        weight_decay: The weight-decay rate (scaled by the learning rate).
        weight_decay_per_param_scale: Optional per-parameter weight-decay scales.

    Returns:
        The optimizer.
    """
    decay = add_decayed_weights(weight_decay, per_param_scale=weight_decay_per_param_scale)
    trace = trace_partition(optax.trace(decay=momentum))
    lr = scale_by_schedule(scale_from_learning_rate(learning_rate))
    return chain(trace, decay, lr) if decouple_weight_decay else chain(decay, trace, lr)


def adam_optimizer(
    learning_rate: schedule.Schedule,
    *,
    b1: float,
    b2: float,
    eps: float,
    l2_regularizer_weight: float = 0,
    l2_regularizer_per_param_scale: Optional[ConfigOr[Callable]] = None,
    mu_dtype: Optional[Any] = None,
) -> PartitionedGradientTransformation:
    """Adam with optional L2 regularization (added to the gradients).

    Args:
        learning_rate: The learning-rate schedule.
        b1: First-moment decay.
        b2: Second-moment decay.
        eps: Added to the root of the second moment.
        l2_regularizer_weight: L2 weight.
        l2_regularizer_per_param_scale: Optional per-parameter L2 scales.
        mu_dtype: Optional dtype of the first moment.

    Returns:
        The optimizer.
    """
    return chain(
        l2_regularizer(l2_regularizer_weight, per_param_scale=l2_regularizer_per_param_scale),
        adam_partition(optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype)),
        scale_by_schedule(scale_from_learning_rate(learning_rate)),
    )


def _adam_updates(b1, b2, eps, mu_dtype, adam_update_transformation) -> list:
    """[Adam's scaling of the gradients, then `adam_update_transformation` if set]."""
    tx = [adam_partition(optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype))]
    if adam_update_transformation is not None:
        tx.append(adam_update_transformation)
    return tx


def adamw_optimizer(
    learning_rate: schedule.Schedule,
    *,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float = 0,
    weight_decay_per_param_scale: Optional[ConfigOr[Callable]] = None,
    mu_dtype: Optional[Any] = None,
    adam_update_transformation: Optional[ConfigOr[PartitionedGradientTransformation]] = None,
) -> PartitionedGradientTransformation:
    """AdamW as in optax/PyTorch: the weight decay is scaled by the learning rate.

    Args:
        learning_rate: The learning-rate schedule.
        b1: First-moment decay.
        b2: Second-moment decay.
        eps: Added to the root of the second moment.
        weight_decay: The weight-decay rate.
        weight_decay_per_param_scale: Optional per-parameter weight-decay scales.
        mu_dtype: Optional dtype of the first moment.
        adam_update_transformation: Optional transformation of the Adam updates, applied before
            weight decay (e.g. `scale_update_per_param`).

    Returns:
        The optimizer.
    """
    tx = _adam_updates(b1, b2, eps, mu_dtype, adam_update_transformation)
    tx.append(add_decayed_weights(weight_decay, per_param_scale=weight_decay_per_param_scale))
    tx.append(scale_by_schedule(scale_from_learning_rate(learning_rate)))
    return chain(*tx)


def adamw_decoupled_optimizer(
    learning_rate: float,
    *,
    b1: float,
    b2: float,
    eps: float,
    update_schedule: schedule.Schedule,
    weight_decay: float = 0,
    weight_decay_per_param_scale: Optional[ConfigOr[Callable]] = None,
    mu_dtype: Optional[Any] = None,
    adam_update_transformation: Optional[ConfigOr[PartitionedGradientTransformation]] = None,
) -> PartitionedGradientTransformation:
    """AdamW with weight decay decoupled from the learning rate (Loshchilov & Hutter, Alg. 2).

    update = -update_schedule(step) * (learning_rate * adam_update + weight_decay * param).

    Args:
        learning_rate: The (constant) learning rate, alpha in the paper.
        b1: First-moment decay.
        b2: Second-moment decay.
        eps: Added to the root of the second moment.
        update_schedule: The schedule multiplier eta, scaling both terms.
        weight_decay: The weight-decay rate, lambda in the paper.
        weight_decay_per_param_scale: Optional per-parameter weight-decay scales.
        mu_dtype: Optional dtype of the first moment.
        adam_update_transformation: Optional transformation of the Adam updates.

    Returns:
        The optimizer.
    """
    tx = _adam_updates(b1, b2, eps, mu_dtype, adam_update_transformation)
    tx += [
        scale_by_schedule(scale_from_learning_rate(learning_rate, flip_sign=False)),
        add_decayed_weights(weight_decay, per_param_scale=weight_decay_per_param_scale),
        scale_by_schedule(_with_effective_lr_summary(learning_rate, update_schedule)),
        scale(-1.0),
    ]
    return chain(*tx)


def _with_effective_lr_summary(
    learning_rate: float, update_schedule: schedule.Schedule
) -> schedule.ScheduleFn:
    """`update_schedule`, adding the summary `effective_learning_rate` = lr * schedule(step).

    The `learning_rate` summary of the decoupled optimizer is the constant alpha; the rate that
    the step applies to the Adam update is alpha times the schedule, which is what the trainer's
    log line shows.
    """
    fn = schedule.as_schedule_fn(update_schedule)

    def wrapped(step):
        value = fn(step)
        _add_summary("effective_learning_rate", learning_rate * value)
        return value

    return wrapped


def _factored_dims(shape: Sequence[int], factored: bool, min_dim_size_to_factor: int):
    """The (second largest, largest) axes that optax's factored RMS reduces over, or None."""
    if not factored or len(shape) < 2:
        return None
    order = sorted(range(len(shape)), key=lambda i: (shape[i], i))
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return order[-2], order[-1]


def _drop_axis(spec, axis: int) -> OptStateSpec:
    axes = spec.mesh_axes
    mesh_axes = None
    if axes is not None:
        axes = list(axes) + [None] * (len(spec.shape) - len(axes))
        mesh_axes = PartitionSpec(*(a for i, a in enumerate(axes) if i != axis))
    shape = [d for i, d in enumerate(spec.shape) if i != axis]
    return OptStateSpec(shape=shape, dtype=spec.dtype, mesh_axes=mesh_axes)


def scale_by_factored_rms(
    *,
    factored: bool = True,
    decay_rate: schedule.Schedule,
    epsilon: float = 1e-30,
    min_dim_size_to_factor: int = 128,
) -> PartitionedGradientTransformation:
    """optax.scale_by_factored_rms with the second-moment decay given as a schedule.

    Args:
        factored: Whether to factor the second moment of matrices.
        decay_rate: The second-moment decay (beta2) as a schedule of the 1-based update step.
        epsilon: Added to the squared gradients.
        min_dim_size_to_factor: Only factor when the two largest axes are at least this long.

    Returns:
        The transformation.
    """
    beta2 = schedule.as_schedule_fn(decay_rate)
    base = optax.scale_by_factored_rms(
        factored=factored,
        epsilon=epsilon,
        min_dim_size_to_factor=min_dim_size_to_factor,
        # optax passes the 0-based update count; schedules see the 1-based step.
        decay_rate_fn=lambda count, _: beta2(count + 1),
    )

    def partition_fn(specs):
        def one(spec, field):
            dims = _factored_dims(spec.shape, factored, min_dim_size_to_factor)
            vector = OptStateSpec(shape=[1], dtype=spec.dtype, mesh_axes=PartitionSpec(None))
            if dims is None:
                return copy_partition(spec) if field == "v" else vector
            if field == "v":
                return vector
            return _drop_axis(spec, dims[1] if field == "v_row" else dims[0])

        return optax.FactoredState(
            count=_scalar_spec(),
            v_row=jax.tree.map(lambda s: one(s, "v_row"), specs),
            v_col=jax.tree.map(lambda s: one(s, "v_col"), specs),
            v=jax.tree.map(lambda s: one(s, "v"), specs),
        )

    return with_partition_fn(base, partition_fn)


def adafactor_optimizer(
    learning_rate: schedule.Schedule,
    *,
    b1: Optional[schedule.Schedule],
    b2: schedule.Schedule,
    multiply_by_parameter_scale: bool,
    clipping_threshold: Optional[float],
    dtype_momentum: Any = jnp.float32,
    weight_decay: Optional[float] = None,
    weight_decay_scale_by_learning_rate_exponent: Optional[float] = None,
    weight_decay_per_param_scale: Optional[ConfigOr[Callable]] = None,
    eps: float = 1e-30,
    factored: bool = True,
    apply_scale_by_trust_ratio: bool = False,
    min_dim_size_to_factor: int = 128,
) -> PartitionedGradientTransformation:
    """Adafactor (Shazeer & Stern, 2018), as optax.adafactor with schedulable decays.

    Bias correction is not applied to constant b1/b2; use `schedule.decay_bias_correction` or
    `schedule.adafactor_decay_rate` (optax's default b2) as the schedule.

    Args:
        learning_rate: The learning-rate schedule.
        b1: Optional momentum decay schedule (enables a first moment).
        b2: Second-moment decay schedule.
        multiply_by_parameter_scale: Whether to scale updates by the parameters' RMS.
        clipping_threshold: Optional block-RMS clipping threshold of the normalized updates.
        dtype_momentum: dtype of the first moment.
        weight_decay: Optional weight-decay rate.
        weight_decay_scale_by_learning_rate_exponent: The decay is multiplied by lr ** this
            (required with weight_decay; 0 disables the scaling).
        weight_decay_per_param_scale: Optional per-parameter weight-decay scales.
        eps: Added to the squared gradients.
        factored: Whether to factor the second moment of matrices.
        apply_scale_by_trust_ratio: Whether to scale each update by the LAMB trust ratio
            (`scale_by_trust_ratio(eps=eps)`), after weight decay.
        min_dim_size_to_factor: Only factor when the two largest axes are at least this long.

    Returns:
        The optimizer.

    Raises:
        ValueError: If weight_decay is set without its learning-rate exponent.
    """
    tx = [
        scale_by_factored_rms(
            factored=factored,
            decay_rate=b2,
            epsilon=eps,
            min_dim_size_to_factor=min_dim_size_to_factor,
        )
    ]
    if clipping_threshold is not None:
        tx.append(clip_by_block_rms(clipping_threshold))
    if learning_rate is not None:
        tx.append(scale_by_schedule(scale_from_learning_rate(learning_rate, flip_sign=False)))
    if multiply_by_parameter_scale:
        tx.append(scale_by_param_block_rms())
    if b1 is not None:
        tx.append(ema(b1, debias=False, accumulator_dtype=dtype_momentum))
    if weight_decay is not None:
        if weight_decay_scale_by_learning_rate_exponent is None:
            raise ValueError(
                "weight_decay_scale_by_learning_rate_exponent must be specified "
                "when weight_decay is not None"
            )
        tx.append(
            add_decayed_weights(
                weight_decay,
                learning_rate_exponent=weight_decay_scale_by_learning_rate_exponent,
                learning_rate=learning_rate,
                per_param_scale=weight_decay_per_param_scale,
            )
        )
    if apply_scale_by_trust_ratio:
        tx.append(scale_by_trust_ratio(eps=eps))
    tx.append(scale(-1.0))
    return chain(*tx)


def scale_by_lion(
    b1: float = 0.9, b2: float = 0.99, mu_dtype: Optional[Any] = None
) -> PartitionedGradientTransformation:
    """optax.scale_by_lion, partitioned (the momentum is sharded like the parameters).

    Args:
        b1: Interpolation between momentum and gradient for the sign.
        b2: Momentum decay.
        mu_dtype: Optional momentum dtype.

    Returns:
        The transformation.
    """

    def partition_fn(specs):
        mu = copy_partition(specs)
        if mu_dtype is not None:
            mu = jax.tree.map(lambda s: dataclasses.replace(s, dtype=mu_dtype), mu)
        return optax.ScaleByLionState(count=_scalar_spec(), mu=mu)

    return with_partition_fn(optax.scale_by_lion(b1=b1, b2=b2, mu_dtype=mu_dtype), partition_fn)


def lion_optimizer(
    learning_rate: schedule.Schedule,
    b1: float,
    b2: float,
    mu_dtype: Optional[Any] = None,
    weight_decay: float = 0.0,
    multiply_by_parameter_scale: bool = False,
    weight_decay_per_param_scale: Optional[ConfigOr[Callable]] = None,
) -> PartitionedGradientTransformation:
    """Lion (Chen et al., 2023): sign of interpolated momentum, plus decoupled weight decay.

    Args:
        learning_rate: The learning-rate schedule.
        b1: Interpolation between momentum and gradient for the sign.
        b2: Momentum decay.
        mu_dtype: Optional momentum dtype.
        weight_decay: The weight-decay rate (scaled by the learning rate).
        multiply_by_parameter_scale: Whether to scale updates by the parameters' RMS.
        weight_decay_per_param_scale: Optional per-parameter weight-decay scales.

    Returns:
        The optimizer.
    """
    tx = [scale_by_lion(b1=b1, b2=b2, mu_dtype=mu_dtype)]
    if multiply_by_parameter_scale:
        tx.append(scale_by_param_block_rms())
    tx.append(add_decayed_weights(weight_decay, per_param_scale=weight_decay_per_param_scale))
    tx.append(scale_by_schedule(scale_from_learning_rate(learning_rate)))
    return chain(*tx)
