"""Tests of axlearn.common.param_init: statistics, rules, debug strings, errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.param_init import (
    PARAM_REGEXP_BIAS,
    PARAM_REGEXP_SCALE,
    PARAM_REGEXP_WEIGHT,
    ConstantInitializer,
    DefaultInitializer,
    FanAxes,
    GaussianInitializer,
    PerGroupInitializer,
    WeightInitializer,
    compute_fans,
    constant_initializer,
)

SHAPE = (512, 2048)
AXES = FanAxes(in_axis=-2, out_axis=-1)
FANS = {"fan_in": 512, "fan_out": 2048, "fan_avg": (512 + 2048) / 2}


def test_regexps():
    assert (PARAM_REGEXP_WEIGHT, PARAM_REGEXP_BIAS, PARAM_REGEXP_SCALE) == (
        ".*weight$",
        ".*bias$",
        ".*scale$",
    )


def test_compute_fans():
    assert compute_fans(SHAPE, AXES) == dict(fan_in=512, fan_out=2048, fan_avg=1280)
    # Receptive-field axes count towards both fans; batch axes towards neither.
    fans = compute_fans((3, 5, 7, 11), FanAxes(in_axis=1, out_axis=2, batch_axis=0))
    assert fans == dict(fan_in=5 * 11, fan_out=7 * 11, fan_avg=66)
    fans = compute_fans((4, 6, 10), FanAxes(in_axis=0, out_axis=(1, 2)))
    assert fans["fan_in"] == 4 and fans["fan_out"] == 60


@pytest.mark.parametrize("distribution", ["normal", "uniform", "truncated_normal"])
@pytest.mark.parametrize("fan", ["fan_in", "fan_out", "fan_avg", None])
def test_weight_initializer_std(distribution, fan):
    scale = 2.0
    init = (
        WeightInitializer.default_config()
        .set(distribution=distribution, fan=fan, scale=scale)
        .instantiate()
    )
    value = init.initialize(
        "weight", prng_key=jax.random.PRNGKey(0), shape=SHAPE, dtype=jnp.float32, axes=AXES
    )
    assert value.shape == SHAPE and value.dtype == jnp.float32
    value = np.asarray(value, np.float64)
    if fan is not None:
        target = math.sqrt(scale / FANS[fan])
    elif distribution == "uniform":
        target = scale / math.sqrt(3.0)  # U(-scale, scale).
    else:
        target = scale
    assert abs(value.std() / target - 1) < 0.02, (value.std(), target)
    assert abs(value.mean()) < 0.01 * target
    if distribution == "truncated_normal":
        assert np.abs(value).max() <= 2 * target / 0.87962566103423978 + 1e-6
    if distribution == "uniform":
        assert np.abs(value).max() <= target * math.sqrt(3.0) + 1e-6


def test_weight_initializer_errors():
    with pytest.raises(ValueError, match="distribution"):
        WeightInitializer.default_config().set(distribution="laplace").instantiate()
    with pytest.raises(ValueError, match="fan"):
        WeightInitializer.default_config().set(fan="fan_max").instantiate()
    init = WeightInitializer.default_config().instantiate()
    with pytest.raises(ValueError, match="fan axes.*'w'"):
        init.initialize("w", prng_key=jax.random.PRNGKey(0), shape=(2, 2), dtype=jnp.float32)


def test_debug_strings():
    def weight(**kw):
        return WeightInitializer.default_config().set(**kw).instantiate()

    shape = [4, 8]
    assert (
        weight(distribution="normal", fan="fan_in").debug_string(shape=shape, axes=AXES)
        == "normal(0, 1.0 / fan_in), shape=[4, 8], "
        "axes=FanAxes(in_axis=-2, out_axis=-1, batch_axis=())"
    )
    assert weight().debug_string(shape=(4, 8), axes=AXES) == (
        "uniform(-sqrt(3.0 / fan_avg), sqrt(3.0 / fan_avg)), shape=(4, 8), "
        "axes=FanAxes(in_axis=-2, out_axis=-1, batch_axis=())"
    )
    assert (
        weight(distribution="truncated_normal", fan="fan_out", scale=2.0)
        .debug_string(shape=shape, axes=AXES)
        .startswith("truncated_normal(-2, 2) * sqrt(2.0 / fan_out) / 0.88, shape=[4, 8]")
    )
    assert weight(fan=None, scale=0.5).debug_string() == "uniform(-0.5, 0.5)"
    assert weight(fan=None, distribution="normal", scale=0.5).debug_string() == "normal(0, 0.5^2)"
    assert constant_initializer(1.0).debug_string() == "constant(1.0)"
    std = GaussianInitializer.default_config().set(std=0.02).instantiate()
    assert std.debug_string() == "normal(0, 0.02^2)"


def test_default_initializer_rules():
    cfg = DefaultInitializer.default_config().set(
        init_by_param_name={
            ".*special_weight$": ConstantInitializer.default_config().set(value=7.0),
            PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                distribution="normal", fan="fan_in"
            ),
        }
    )
    before = cfg.debug_string()
    init = cfg.instantiate()
    # The config is not modified by adding the default rules.
    assert cfg.debug_string() == before
    key = jax.random.PRNGKey(0)
    kwargs = dict(prng_key=key, shape=(4, 8), dtype=jnp.float32, axes=AXES)
    # The first full match wins: "special_weight" matches both rules.
    np.testing.assert_array_equal(init.initialize("special_weight", **kwargs), 7.0)
    np.testing.assert_array_equal(init.initialize("bias", **kwargs), 0.0)
    np.testing.assert_array_equal(init.initialize("scale", **kwargs), 1.0)
    assert init.debug_string(name="weight", shape=[4, 8], axes=AXES).startswith(
        "normal(0, 1.0 / fan_in)"
    )
    ref = WeightInitializer.default_config().set(distribution="normal", fan="fan_in")
    np.testing.assert_array_equal(
        init.initialize("weight", **kwargs), ref.instantiate().initialize("weight", **kwargs)
    )
    with pytest.raises(NotImplementedError, match="'moving_mean'"):
        init.initialize("moving_mean", **kwargs)
    # Full match, not search: "weight_x" does not match ".*weight$".
    with pytest.raises(NotImplementedError):
        init.initialize("weight_x", **kwargs)


def test_constant_dtype():
    value = constant_initializer(3).initialize(
        "bias", prng_key=None, shape=(2,), dtype=jnp.bfloat16
    )
    assert value.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(value, np.float32), 3.0)


def test_per_group_initializer():
    cfg = PerGroupInitializer.default_config().set(
        initializer=ConstantInitializer.default_config().set(value=2.0), num_groups=4
    )
    init = cfg.instantiate()
    value = init.initialize("w", prng_key=jax.random.PRNGKey(0), shape=(3, 8), dtype=jnp.float32)
    np.testing.assert_array_equal(value, 2.0)
    assert init.debug_string(name="w") == "constant(2.0) [PerGroupInitializer]"
    with pytest.raises(ValueError, match="divisible"):
        init.initialize("w", prng_key=jax.random.PRNGKey(0), shape=(3, 7), dtype=jnp.float32)


def test_fan_axes_canonicalize_insert_and_maybe_prepend():
    from axlearn.common.param_init import FanAxes, compute_fans, maybe_prepend_axis

    axes = FanAxes(in_axis=0, out_axis=(2, 1))
    assert axes.canonicalize() == FanAxes(in_axis=(0,), out_axis=(1, 2), batch_axis=())
    assert axes == FanAxes(in_axis=(0,), out_axis=(1, 2))  # Equality up to canonical form.
    assert hash(axes) == hash(FanAxes(in_axis=(0,), out_axis=(1, 2)))
    # A leading batch axis (e.g. stacked repeated layers) leaves the fans unchanged.
    stacked = axes.prepend_axis(axis_type=FanAxes.AxisType.BATCH_AXIS)
    assert stacked == FanAxes(in_axis=1, out_axis=(2, 3), batch_axis=0)
    assert compute_fans((5, 4, 3, 2), stacked) == compute_fans((4, 3, 2), axes)
    # Appending a receptive-field axis moves negative indices only.
    neg = FanAxes(in_axis=-2, out_axis=-1).append_axis(axis_type=FanAxes.AxisType.NONE)
    assert neg == FanAxes(in_axis=-3, out_axis=-2)
    assert FanAxes(0, 1).append_axis(axis_type=FanAxes.AxisType.OUT_AXIS) == FanAxes(0, (1, -1))
    assert maybe_prepend_axis(None, axis_type=FanAxes.AxisType.IN_AXIS) is None
    assert maybe_prepend_axis(FanAxes(0, 1), axis_type=FanAxes.AxisType.IN_AXIS) == FanAxes(
        (0, 1), 2
    )
    with pytest.raises(ValueError, match="Location must be either 0 or -1"):
        FanAxes(0, 1)._insert_axis(1, axis_type=FanAxes.AxisType.NONE)
    with pytest.raises(TypeError, match="Invalid type"):
        FanAxes([0], 1).canonicalize()


def test_unmatched_parameter_name_message():
    init = DefaultInitializer.default_config().instantiate()
    with pytest.raises(NotImplementedError, match="Unsupported parameter name 'codebook'"):
        init.initialize("codebook", prng_key=jax.random.PRNGKey(0), shape=[2, 2], dtype=jnp.float32)
