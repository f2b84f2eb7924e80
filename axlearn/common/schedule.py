"""Schedules: functions of the training step that return a value (learning rate, decay, ...).

A schedule is anything `as_schedule_fn` accepts: a number (a constant schedule), a function
`step -> value`, or a config whose `instantiate()` returns such a function, e.g.

    config_for_function(cosine_with_linear_warmup).set(peak_lr=1.0, max_step=100, warmup_steps=10)

Every schedule here is a config-able function: its keyword arguments are config fields and it
returns a `ScheduleFn`. Steps count from 1, as in AXLearn: an update sees the number of updates
done including itself (`count + 1` of its transformation's state), so the first update is step 1,
the step the trainer logs and checkpoints. A linear warm-up of 100 steps to 1.0 gives 0.01 at
step 1, 0.02 at step 2 and 1.0 at step 100. Schedule functions are traceable (steps may be JAX
arrays).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Union

import jax
from jax import numpy as jnp

# Re-exported as AXLearn's schedule module does, for configs naming `schedule.constant_schedule`.
from optax import constant_schedule, cosine_decay_schedule  # noqa: F401

from axlearn.common.config import InstantiableConfig, config_for_function

ScheduleFn = Callable[[Any], Any]
# A number, a step -> value function, or a config instantiating to such a function.
Schedule = Union[float, int, jax.Array, ScheduleFn, InstantiableConfig]


def as_schedule_fn(s: Schedule | None) -> ScheduleFn:
    """Turns a `Schedule` into a function of the step.

    Args:
        s: A number (constant schedule), a function of the step, a config that instantiates to
            one, or None (the constant 1.0).

    Returns:
        A function `step -> value`.

    Raises:
        TypeError: If `s` is none of the above.
    """
    if isinstance(s, InstantiableConfig):
        s = s.instantiate()
        if callable(s):
            return s
        raise TypeError(f"A schedule config must instantiate to a function of the step, got {s!r}")
    if s is None:
        s = 1.0
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        value = float(s)
        return lambda step: value
    if isinstance(s, jax.Array) and s.ndim == 0:
        return lambda step: s
    if callable(s):
        return s
    raise TypeError(f"Not a schedule (number, function of the step, or config): {s!r}")


def constant(value: float) -> ScheduleFn:
    """A schedule that always returns `value`.

    Args:
        value: The constant.

    Returns:
        The schedule.
    """
    return lambda step: value


def polynomial(
    *,
    begin_step: int = 0,
    begin_value: float = 0,
    end_step: int = 1,
    end_value: float = 0,
    power: float = 1,
) -> ScheduleFn:
    """Polynomial interpolation (linear when power=1) between two points, constant outside.

    value(step) = begin_value + frac**power * (end_value - begin_value), where
    frac = clip((step - begin_step) / (end_step - begin_step), 0, 1).

    Args:
        begin_step: The step at which the schedule leaves `begin_value`.
        begin_value: The value at and before `begin_step`.
        end_step: The step at which the schedule reaches `end_value`; must be > begin_step.
        end_value: The value at and after `end_step`.
        power: The polynomial power.

    Returns:
        The schedule.

    Raises:
        ValueError: If begin_step >= end_step.
    """
    if begin_step >= end_step:
        raise ValueError(f"begin_step {begin_step} must be < end_step {end_step}.")

    def fn(step):
        frac = (step - begin_step) / (end_step - begin_step)
        frac = jnp.clip(frac, 0.0, 1.0)
        return begin_value + (frac**power) * (end_value - begin_value)

    return fn


def exponential(
    *,
    begin_step: int = 0,
    begin_value: float = 1,
    end_step: int = 1,
    end_value: float = 1,
) -> ScheduleFn:
    """Geometric interpolation between two positive values (linear in log space).

    Args:
        begin_step: The step at which the schedule leaves `begin_value`.
        begin_value: The (positive) value at and before `begin_step`.
        end_step: The step at which the schedule reaches `end_value`; must be > begin_step.
        end_value: The (positive) value at and after `end_step`.

    Returns:
        The schedule.

    Raises:
        ValueError: If begin_step >= end_step or a value is not positive.
    """
    if begin_value <= 0 or end_value <= 0:
        raise ValueError(
            f"begin_value ({begin_value}) and end_value ({end_value}) must be both positive."
        )
    log_fn = polynomial(
        begin_step=begin_step,
        begin_value=math.log(begin_value),
        end_step=end_step,
        end_value=math.log(end_value),
    )
    return lambda step: jnp.exp(log_fn(step))


def inverse_sqrt(step: Any | None = None, warmup_steps: int = 1) -> Any:
    """Inverse square root schedule with a constant warm-up: max(step, warmup_steps) ** -0.5.

    Called with `step`, returns the value at that step (as in T5); called without it (e.g. from
    `config_for_function(inverse_sqrt).set(warmup_steps=...)`), returns the schedule function.

    Args:
        step: The step, or None to get the schedule function.
        warmup_steps: Steps during which the value stays at warmup_steps ** -0.5; must be > 0.

    Returns:
        The value at `step`, or the schedule if `step` is None.

    Raises:
        ValueError: If warmup_steps <= 0.
    """
    if warmup_steps <= 0:
        raise ValueError(f"warmup_steps must be > 0, got {warmup_steps}.")

    def fn(s):
        return jnp.maximum(jnp.asarray(s, jnp.float32), warmup_steps) ** -0.5

    return fn if step is None else fn(step)


def adafactor(
    scale: float = 1.0,
    *,
    warmup_steps: int = 10_000,
    decay_power: float = -0.5,
    step_offset: int = 0,
) -> ScheduleFn:
    """The Transformer schedule: linear warm-up, then (step ** decay_power).

    value = scale * min(t * warmup_steps ** (decay_power - 1), t ** decay_power), t = step +
    step_offset; the peak value is scale * warmup_steps ** decay_power.

    Args:
        scale: Multiplier.
        warmup_steps: Steps of linear warm-up.
        decay_power: The decay exponent (negative).
        step_offset: Added to the step (1 reproduces schedules that count from 1).

    Returns:
        The schedule.
    """

    def fn(step):
        t = jnp.asarray(step, jnp.float32) + step_offset
        return scale * jnp.minimum(t * warmup_steps ** (decay_power - 1.0), t**decay_power)

    return fn


def adafactor_decay_rate(c: float = 0.8, step_offset: int = 0) -> ScheduleFn:
    """Adafactor's second-moment decay (section 7.2 of arXiv:1804.04235): 1 - t ** -c.

    t = max(step - step_offset, 1): the first step (step_offset + 1) gets 0, i.e. the first
    update replaces the running average. With steps counting from 1 this equals optax's adafactor
    decay (`decay_rate=c`), whose update counts start at 0.

    Args:
        c: The exponent.
        step_offset: Steps to subtract (to restart the schedule when fine-tuning from a state that
            has already taken `step_offset` steps); steps <= step_offset are clamped to 1.

    Returns:
        The schedule.
    """

    def fn(step):
        t = jnp.maximum(jnp.asarray(step, jnp.float32) - step_offset, 1.0)
        return 1.0 - t ** (-c)

    return fn


def decay_bias_correction(decay: float) -> ScheduleFn:
    """A bias-corrected decay: decay * (1 - decay**(t - 1)) / (1 - decay**t) at step t.

    Steps count from 1: the decay is 0 at step 1, so an EMA updated with
    `ema = decay_t * ema + (1 - decay_t) * value` holds value(1) after step 1 and equals the
    debiased EMA with constant `decay` afterwards (section 7.1 of arXiv:1804.04235).

    Args:
        decay: The constant decay to bias-correct.

    Returns:
        The schedule.
    """

    def fn(step):
        t = jnp.asarray(step, jnp.float32)
        return decay * (1.0 - decay ** (t - 1.0)) / (1.0 - decay**t)

    return fn


def stepwise(sub: list[Schedule], start_step: list[int]) -> ScheduleFn:
    """Sub-schedules one after another: sub[0] from step 0, sub[i] from start_step[i - 1].

    Each sub-schedule sees the step relative to its own start, so its values do not depend on
    the others.

    Args:
        sub: N sub-schedules.
        start_step: N - 1 non-decreasing, non-negative start steps of sub[1:].

    Returns:
        The composite schedule.

    Raises:
        ValueError: If the lengths disagree or a start step is negative or out of order.
    """
    if len(sub) != len(start_step) + 1:
        raise ValueError(f"Unexpected length: len(sub)={len(sub)} != len(start_step)+1")
    if any(s < 0 for s in start_step) or list(start_step) != sorted(start_step):
        raise ValueError(f"start_step must be non-negative and non-decreasing: {start_step}")
    fns = [as_schedule_fn(s) for s in sub]
    starts = [0] + list(start_step)
    limits = list(start_step) + [None]

    def fn(step):
        total = 0.0
        for sub_fn, start, limit in zip(fns, starts, limits):
            active = step >= start
            if limit is not None:
                active = jnp.logical_and(active, step < limit)
            value = sub_fn(jnp.maximum(step - start, 0))
            total = total + jnp.where(active, value, 0.0)
        return total

    return fn


def segment_wise(segments: list[Schedule], *, segment_steps: list[int]) -> ScheduleFn:
    """Segments one after another, each seeing steps that count from 1.

    With offsets o_k = sum(segment_steps[:k]), segment k serves steps o_k + 1 ... o_{k+1} and is
    called with (step - o_k); the last segment runs forever. Steps <= 0 give 0.

    Args:
        segments: N sub-schedules.
        segment_steps: N - 1 non-negative segment lengths.

    Returns:
        The composite schedule.

    Raises:
        ValueError: If the lengths disagree or a length is negative.
    """
    if len(segments) != len(segment_steps) + 1:
        raise ValueError(
            f"Unexpected length: len(segments)={len(segments)} != len(segment_steps)+1"
        )
    if any(n < 0 for n in segment_steps):
        raise ValueError(f"segment_steps must be >= 0: {segment_steps}")
    fns = [as_schedule_fn(s) for s in segments]
    offsets = [0]
    for n in segment_steps:
        offsets.append(offsets[-1] + n)

    def fn(step):
        total = 0.0
        for k, sub_fn in enumerate(fns):
            active = step >= offsets[k] + 1
            if k + 1 < len(offsets):
                active = jnp.logical_and(active, step <= offsets[k + 1])
            value = sub_fn(jnp.maximum(step - offsets[k], 1))
            total = total + jnp.where(active, value, 0.0)
        return total

    return fn


def cosine_with_linear_warmup(
    peak_lr: float,
    *,
    max_step: int,
    warmup_steps: int = 500,
    begin_value: float = 0.0,
    alpha: float = 0.0,
    decay_begin_step: int | None = None,
) -> ScheduleFn:
    """Linear warm-up from `begin_value` to `peak_lr`, then cosine decay to `alpha * peak_lr`.

    Steps count from 1 (see the module docstring). For 1 <= s <= warmup_steps:
    begin_value + (peak_lr - begin_value) * s / warmup_steps (peak_lr at s = warmup_steps).
    Then, with d the step relative to the decay start and D = max_step - decay start:
    peak_lr * ((1 - alpha) * 0.5 * (1 + cos(pi * min(d, D) / D)) + alpha), reaching
    alpha * peak_lr at max_step.

    Args:
        peak_lr: The peak value.
        max_step: The step at which the cosine decay ends.
        warmup_steps: Steps of linear warm-up (0: no warm-up).
        begin_value: The value the warm-up starts from (at step 0).
        alpha: The final value as a fraction of peak_lr.
        decay_begin_step: If > warmup_steps, the value stays at peak_lr after the warm-up until
            this step, after which the cosine decay begins.

    Returns:
        The schedule.

    Raises:
        ValueError: If max_step is not after the decay start.
    """
    segments, segment_steps = [], []
    if warmup_steps > 0:
        segments.append(
            config_for_function(polynomial).set(
                begin_step=0, begin_value=begin_value, end_step=warmup_steps, end_value=peak_lr
            )
        )
        segment_steps.append(warmup_steps)
    decay_start = warmup_steps
    if decay_begin_step is not None and decay_begin_step > warmup_steps:
        segments.append(
            config_for_function(polynomial).set(
                begin_step=0,
                begin_value=peak_lr,
                end_step=decay_begin_step - warmup_steps,
                end_value=peak_lr,
            )
        )
        segment_steps.append(decay_begin_step - warmup_steps)
        decay_start = decay_begin_step
    if max_step <= decay_start:
        start = (
            f"decay_begin_step={decay_start}"
            if decay_start != warmup_steps
            else f"warmup_steps={warmup_steps}"
        )
        raise ValueError(
            f"The schedule's max_step={max_step} must be > the step its decay starts at ({start}): "
            f"raise max_step or lower {start.split('=')[0]} (for a run shortened with "
            "--config_override=max_step=N, override the schedule's warmup_steps too)."
        )
    segments.append(
        config_for_function(cosine_decay_schedule).set(
            init_value=peak_lr, decay_steps=max_step - decay_start, alpha=alpha
        )
    )
    return segment_wise(segments=segments, segment_steps=segment_steps)


def constant_with_linear_warmup(
    peak_lr: float, *, warmup_steps: int = 500, begin_value: float = 0.0
) -> ScheduleFn:
    """Linear warm-up from `begin_value` to `peak_lr` over `warmup_steps`, then constant.

    Steps count from 1: the value is begin_value + (peak_lr - begin_value) * s / warmup_steps
    for 1 <= s <= warmup_steps, then peak_lr.

    Args:
        peak_lr: The value after warm-up.
        warmup_steps: Steps of linear warm-up (> 0).
        begin_value: The value the warm-up starts from (at step 0).

    Returns:
        The schedule.
    """
    return segment_wise(
        segments=[
            config_for_function(polynomial).set(
                begin_step=0, begin_value=begin_value, end_step=warmup_steps, end_value=peak_lr
            ),
            config_for_function(constant_schedule).set(value=peak_lr),
        ],
        segment_steps=[warmup_steps],
    )


def linear_schedule_with_warmup(
    peak_lr: float,
    *,
    max_step: int,
    warmup_steps: int,
    begin_value: float = 0.0,
    end_value: float = 0.0,
) -> ScheduleFn:
    """Linear warm-up to `peak_lr` (reached at step `warmup_steps`), then linear decay.

    Steps count from 1; the decay reaches `end_value` at `max_step` and stays there.

    Args:
        peak_lr: The peak value, reached at `warmup_steps`.
        max_step: The step at which `end_value` is reached.
        warmup_steps: Steps of linear warm-up (> 0).
        begin_value: The value the warm-up starts from (at step 0).
        end_value: The value at and after `max_step`.

    Returns:
        The schedule.
    """
    return segment_wise(
        segments=[
            config_for_function(polynomial).set(
                begin_step=0, begin_value=begin_value, end_step=warmup_steps, end_value=peak_lr
            ),
            config_for_function(polynomial).set(
                begin_step=0,
                begin_value=peak_lr,
                end_step=max_step - warmup_steps,
                end_value=end_value,
            ),
        ],
        segment_steps=[warmup_steps],
    )


def ema_schedule(
    decay: float = 0.9999, *, warmup_steps: int = 1, step_offset: int = 0
) -> ScheduleFn:
    """EMA decay with warm-up: 0 before `step_offset`, then s / (1 + s) (s = step - step_offset)
    while s < warmup_steps, then `decay`.

    During warm-up the decay is 0, 1/2, 2/3, ... at s = 0, 1, 2, ... (so 1/2 at the first
    update, which sees step 1, when step_offset is 0).

    Args:
        decay: The decay after warm-up.
        warmup_steps: Steps of warm-up (> 0).
        step_offset: Steps (>= 0) before the warm-up starts, during which the decay is 0.

    Returns:
        The schedule.

    Raises:
        ValueError: If warmup_steps <= 0 or step_offset < 0.
    """
    if warmup_steps <= 0:
        raise ValueError(f"warmup_steps must be > 0, got {warmup_steps}.")
    if step_offset < 0:
        raise ValueError(f"step_offset must be >= 0, got {step_offset}.")

    def fn(step):
        s = jnp.asarray(step, jnp.float32) - step_offset
        value = jnp.where(s < warmup_steps, s / (1.0 + s), decay)
        return jnp.where(s < 0, 0.0, value)

    return fn


def warmup_stable_decay(
    *,
    peak_lr: float,
    max_step: int,
    warmup_steps: int,
    decay_begin_step: int,
    begin_value: float = 0.0,
    alpha: float = 0.0,
) -> ScheduleFn:
    """Warm-up, stable, decay ("WSD"): linear from `begin_value` to `peak_lr` over steps
    (0, warmup_steps], `peak_lr` until `decay_begin_step`, then linear to `peak_lr * alpha` at
    `max_step` (and after).

    Args:
        peak_lr: The stable value.
        max_step: The step at which the decay ends.
        warmup_steps: Steps of warm-up (>= 0; 0: start at peak_lr).
        decay_begin_step: The last step at peak_lr (>= warmup_steps, <= max_step).
        begin_value: The value at step 0.
        alpha: The final value as a fraction of peak_lr.

    Returns:
        The schedule.

    Raises:
        ValueError: If the steps are out of order.
    """
    if not 0 <= warmup_steps <= decay_begin_step <= max_step:
        raise ValueError(
            "warmup_stable_decay needs 0 <= warmup_steps <= decay_begin_step <= max_step, got "
            f"warmup_steps={warmup_steps}, decay_begin_step={decay_begin_step}, "
            f"max_step={max_step}"
        )
    end_value = peak_lr * alpha

    def fn(step):
        step = jnp.asarray(step, jnp.float32)
        warmup = begin_value + (peak_lr - begin_value) * step / max(warmup_steps, 1)
        decay_fraction = jnp.clip(
            (step - decay_begin_step) / max(max_step - decay_begin_step, 1), 0.0, 1.0
        )
        decay = peak_lr + (end_value - peak_lr) * decay_fraction
        value = jnp.where(step <= decay_begin_step, peak_lr, decay)
        return jnp.where(step <= warmup_steps, warmup, value) if warmup_steps else value

    return fn
