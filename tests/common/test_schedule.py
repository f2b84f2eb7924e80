"""Tests of axlearn/common/schedule.py: every schedule against its closed form at 20 steps."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common import schedule
from axlearn.common.config import config_for_function

STEPS = list(range(20))


def _check(fn, expected_fn, steps=STEPS, atol=1e-6):
    """Compares `fn` eagerly and under jit (int32 steps) with the closed form."""
    jitted = jax.jit(fn)
    for step in steps:
        want = expected_fn(step)
        got = float(fn(step))
        got_jit = float(jitted(jnp.asarray(step, jnp.int32)))
        assert got == pytest.approx(want, abs=atol, rel=1e-5), (step, got, want)
        assert got_jit == pytest.approx(want, abs=atol, rel=1e-5), (step, got_jit, want)


def test_as_schedule_fn():
    assert schedule.as_schedule_fn(0.5)(7) == 0.5
    assert schedule.as_schedule_fn(3)(7) == 3.0
    assert schedule.as_schedule_fn(None)(7) == 1.0
    cfg = config_for_function(schedule.polynomial).set(end_step=10, end_value=1.0)
    assert float(schedule.as_schedule_fn(cfg)(5)) == pytest.approx(0.5)
    fn = lambda step: step * 2
    assert schedule.as_schedule_fn(fn) is fn
    with pytest.raises(TypeError, match="Not a schedule"):
        schedule.as_schedule_fn("fast")
    with pytest.raises(TypeError, match="instantiate to a function"):
        schedule.as_schedule_fn(config_for_function(lambda: 3))


def test_constant():
    _check(schedule.constant(0.3), lambda s: 0.3)


@pytest.mark.parametrize("power", [1, 2, 0.5])
def test_polynomial(power):
    fn = schedule.polynomial(begin_step=3, begin_value=2.0, end_step=15, end_value=0.5, power=power)

    def want(s):
        frac = min(max((s - 3) / 12, 0.0), 1.0)
        return 2.0 + frac**power * (0.5 - 2.0)

    _check(fn, want)
    with pytest.raises(ValueError, match="begin_step 5 must be < end_step 5"):
        schedule.polynomial(begin_step=5, end_step=5)


def test_exponential():
    fn = schedule.exponential(begin_step=2, begin_value=1.0, end_step=12, end_value=1e-3)
    _check(fn, lambda s: 1e-3 ** (min(max((s - 2) / 10, 0.0), 1.0)))
    with pytest.raises(ValueError, match="must be both positive"):
        schedule.exponential(begin_value=0.0, end_step=3)


def test_inverse_sqrt():
    fn = config_for_function(schedule.inverse_sqrt).set(warmup_steps=5).instantiate()
    _check(fn, lambda s: max(s, 5) ** -0.5)
    assert float(schedule.inverse_sqrt(16, warmup_steps=4)) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="warmup_steps must be > 0"):
        schedule.inverse_sqrt(warmup_steps=0)


def test_adafactor_schedule():
    fn = schedule.adafactor(2.0, warmup_steps=8, decay_power=-0.5, step_offset=1)
    _check(fn, lambda s: 2.0 * min((s + 1) * 8**-1.5, (s + 1) ** -0.5))


def test_adafactor_decay_rate_and_bias_correction():
    # Steps count from 1: beta2 = 1 - max(step - offset, 1) ** -c, 0 at the first step.
    _check(schedule.adafactor_decay_rate(0.8, step_offset=2), lambda s: 1 - max(s - 2, 1) ** -0.8)
    assert float(schedule.adafactor_decay_rate()(1)) == 0.0
    d = 0.9
    _check(
        schedule.decay_bias_correction(d),
        lambda s: d * (1 - d ** (s - 1)) / (1 - d**s),
        steps=STEPS[1:],
    )
    # An EMA with the corrected decay, updated at steps 1, 2, ..., is the debiased EMA.
    fn = schedule.decay_bias_correction(d)
    values = [3.0, -1.0, 2.0, 5.0]
    ema = 0.0
    for step, v in enumerate(values, start=1):
        decay_t = float(fn(step))
        ema = decay_t * ema + (1 - decay_t) * v
        weights = [d ** (step - i) for i in range(1, step + 1)]
        want = sum(w * x for w, x in zip(weights, values)) / sum(weights)
        assert ema == pytest.approx(want, rel=1e-6)


def test_cosine_with_linear_warmup():
    peak, max_step, warmup, begin, alpha = 1.0, 18, 6, 0.1, 0.05
    cfg = config_for_function(schedule.cosine_with_linear_warmup).set(
        peak_lr=peak, max_step=max_step, warmup_steps=warmup, begin_value=begin, alpha=alpha
    )

    def want(s):
        if s <= 0:
            return 0.0
        if s <= warmup:
            return begin + (peak - begin) * s / warmup
        d = min(s - warmup, max_step - warmup)
        return peak * (
            (1 - alpha) * 0.5 * (1 + math.cos(math.pi * d / (max_step - warmup))) + alpha
        )

    # Steps 0..19 cover warm-up, the decay, and the constant tail after max_step.
    _check(schedule.as_schedule_fn(cfg), want)


def test_cosine_with_decay_begin_and_no_warmup():
    fn = schedule.cosine_with_linear_warmup(2.0, max_step=20, warmup_steps=4, decay_begin_step=10)

    def want(s):
        if s <= 4:
            return 2.0 * s / 4
        if s <= 10:
            return 2.0
        return 2.0 * 0.5 * (1 + math.cos(math.pi * (s - 10) / 10))

    _check(fn, want)
    fn = schedule.cosine_with_linear_warmup(1.0, max_step=19, warmup_steps=0)
    _check(fn, lambda s: 0.0 if s == 0 else 0.5 * (1 + math.cos(math.pi * s / 19)))


def test_linear_warmup_schedules():
    _check(
        schedule.constant_with_linear_warmup(0.8, warmup_steps=5, begin_value=0.3),
        lambda s: 0.0 if s == 0 else 0.3 + 0.5 * min(s / 5, 1.0),
    )
    _check(
        schedule.linear_schedule_with_warmup(1.0, max_step=15, warmup_steps=5, end_value=0.2),
        lambda s: s / 5 if s <= 5 else 1.0 + (0.2 - 1.0) * min((s - 5) / 10, 1.0),
    )


@pytest.mark.parametrize(
    "cfg",
    [
        config_for_function(schedule.cosine_with_linear_warmup).set(
            peak_lr=1.0, max_step=10_000, warmup_steps=100
        ),
        config_for_function(schedule.constant_with_linear_warmup).set(
            peak_lr=1.0, warmup_steps=100
        ),
        config_for_function(schedule.linear_schedule_with_warmup).set(
            peak_lr=1.0, max_step=10_000, warmup_steps=100
        ),
    ],
)
def test_step_convention_pinned(cfg):
    """AXLearn's convention: steps count from 1, so warm-up of 100 steps to 1.0 gives 0.01 at
    step 1, 0.02 at step 2 and exactly the peak at step 100 (not 0 at the first update)."""
    fn = schedule.as_schedule_fn(cfg)
    assert float(fn(1)) == pytest.approx(0.01, rel=1e-6)
    assert float(fn(2)) == pytest.approx(0.02, rel=1e-6)
    assert float(fn(100)) == pytest.approx(1.0, rel=1e-6)
    assert float(fn(50)) == pytest.approx(0.5, rel=1e-6)


def test_constant_schedule_reexported():
    cfg = config_for_function(schedule.constant_schedule).set(value=0.25)
    assert float(schedule.as_schedule_fn(cfg)(3)) == 0.25


def test_stepwise():
    fn = schedule.stepwise(
        sub=[0.5, lambda step: step * 1.0, config_for_function(schedule.constant).set(value=7.0)],
        start_step=[4, 12],
    )
    _check(fn, lambda s: 0.5 if s < 4 else (s - 4.0 if s < 12 else 7.0))
    with pytest.raises(ValueError, match="Unexpected length"):
        schedule.stepwise(sub=[1.0], start_step=[3])
    with pytest.raises(ValueError, match="non-decreasing"):
        schedule.stepwise(sub=[1.0, 2.0, 3.0], start_step=[5, 3])


def test_segment_wise():
    fn = schedule.segment_wise(
        segments=[lambda step: step * 1.0, lambda step: 100.0 + step], segment_steps=[5]
    )
    # Step 0 -> 0; steps 1..5 -> segment 0 with steps 1..5; steps 6.. -> segment 1 with 1...
    _check(fn, lambda s: 0.0 if s <= 0 else (float(s) if s <= 5 else 100.0 + s - 5))
    with pytest.raises(ValueError, match="segment_steps must be >= 0"):
        schedule.segment_wise(segments=[1.0, 2.0], segment_steps=[-1])


def test_ema_schedule():
    _check(schedule.ema_schedule(0.99, warmup_steps=6), lambda s: s / (1 + s) if s < 6 else 0.99)


def test_schedules_are_traceable_in_scan():
    fn = schedule.cosine_with_linear_warmup(1.0, max_step=10, warmup_steps=3)
    values = jax.lax.map(fn, jnp.arange(12))
    expected = [float(fn(i)) for i in range(12)]
    np.testing.assert_allclose(np.asarray(values), expected, rtol=1e-6, atol=1e-7)


def test_warmup_stable_decay_hand_values():
    s = schedule.warmup_stable_decay(
        peak_lr=1.0, max_step=40, warmup_steps=10, decay_begin_step=20, begin_value=0.5, alpha=0.2
    )
    # Warm-up 0.5 -> 1 over 10 steps, stable to step 20, linear to 0.2 at step 40, then flat.
    for step, expected in [
        (0, 0.5),
        (5, 0.75),
        (10, 1.0),
        (15, 1.0),
        (20, 1.0),
        (30, 0.6),
        (40, 0.2),
        (50, 0.2),
    ]:
        np.testing.assert_allclose(s(step), expected, rtol=1e-6)
    no_warmup = schedule.warmup_stable_decay(
        peak_lr=1.0, max_step=10, warmup_steps=0, decay_begin_step=0
    )
    np.testing.assert_allclose([no_warmup(0), no_warmup(5)], [1.0, 0.5], rtol=1e-6)
    with pytest.raises(ValueError, match="warmup_steps <= decay_begin_step <= max_step"):
        schedule.warmup_stable_decay(peak_lr=1, max_step=5, warmup_steps=3, decay_begin_step=2)


def test_ema_schedule_step_offset():
    s = schedule.ema_schedule(0.9, warmup_steps=3, step_offset=2)
    np.testing.assert_allclose([s(i) for i in range(7)], [0, 0, 0, 0.5, 2 / 3, 0.9, 0.9], rtol=1e-6)
