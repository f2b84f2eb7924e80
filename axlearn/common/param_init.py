"""Configurable parameter initializers.

An `Initializer` creates a parameter from (name, prng_key, shape, dtype, fan axes) and describes
itself in one line (`debug_string`) for `_init.txt` dumps. `DefaultInitializer` dispatches on the
parameter's local name (e.g. "weight", "bias", "scale") with regex rules; `WeightInitializer` is
the fan-scaled (variance scaling) initializer for weights.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional, Union

import jax
from jax import numpy as jnp

from axlearn.common.config import REQUIRED, Configurable, InstantiableConfig, Required, config_class

Shape = Sequence[int]
Tensor = jax.Array

PARAM_REGEXP_WEIGHT = ".*weight$"
PARAM_REGEXP_BIAS = ".*bias$"
PARAM_REGEXP_SCALE = ".*scale$"

# Standard deviation of a unit normal truncated to (-2, 2).
_TRUNCATED_NORMAL_STDDEV = 0.87962566103423978


class FanAxes(NamedTuple):
    """Which axes of a parameter are its input, output and batch axes, for fan computation.

    Axes not listed are "receptive field" axes (e.g. convolution kernel axes) and count towards
    both fans; batch axes count towards neither.
    """

    class AxisType(enum.Enum):
        """The kind of an axis, for `prepend_axis`/`append_axis`."""

        IN_AXIS = "in_axis"
        OUT_AXIS = "out_axis"
        BATCH_AXIS = "batch_axis"
        NONE = None

    # The input axis (or axes).
    in_axis: Union[tuple[int, ...], int]
    # The output axis (or axes).
    out_axis: Union[tuple[int, ...], int]
    # Axes ignored when computing fans.
    batch_axis: Union[tuple[int, ...], int] = ()

    def canonicalize(self) -> FanAxes:
        """Returns the equivalent FanAxes whose fields are sorted tuples.

        Raises:
            TypeError: If a field is not None, an int or a tuple of ints.
        """

        def one(value):
            if value is None:
                return ()
            if isinstance(value, int):
                return (value,)
            if isinstance(value, tuple):
                return tuple(sorted(value))
            raise TypeError(f"Invalid type {type(value)} for data {value}.")

        return FanAxes(*(one(getattr(self, f)) for f in self._fields))

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, FanAxes):
            return False
        return tuple(self.canonicalize()) == tuple(other.canonicalize())

    def __ne__(self, other: Any) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(tuple(self.canonicalize()))

    def _insert_axis(self, axis: int, *, axis_type: FanAxes.AxisType) -> FanAxes:
        """Returns a copy with a new axis of `axis_type` at the start (0) or end (-1).

        Existing non-negative indices shift by one when inserting at 0; negative ones when
        inserting at -1.

        Raises:
            ValueError: If axis is not 0 or -1.
        """
        if axis not in (0, -1):
            raise ValueError("Location must be either 0 or -1.")

        def move(index: int) -> int:
            if index >= 0 and axis == 0:
                return index + 1
            if index < 0 and axis == -1:
                return index - 1
            return index

        fields = {k: tuple(move(i) for i in v) for k, v in self.canonicalize()._asdict().items()}
        if axis_type != FanAxes.AxisType.NONE:
            fields[axis_type.value] = tuple(fields[axis_type.value]) + (axis,)
        return FanAxes(**fields)

    def prepend_axis(self, *, axis_type: FanAxes.AxisType) -> FanAxes:
        """Returns a copy for a shape with a new leading axis of `axis_type`.

        Args:
            axis_type: The new axis's type (NONE: a receptive-field axis).

        Returns:
            The new FanAxes.
        """
        return self._insert_axis(0, axis_type=axis_type)

    def append_axis(self, *, axis_type: FanAxes.AxisType) -> FanAxes:
        """Returns a copy for a shape with a new trailing axis of `axis_type`.

        Args:
            axis_type: The new axis's type (NONE: a receptive-field axis).

        Returns:
            The new FanAxes.
        """
        return self._insert_axis(-1, axis_type=axis_type)


def maybe_prepend_axis(
    fan_axes: Optional[FanAxes], *, axis_type: FanAxes.AxisType
) -> Optional[FanAxes]:
    """Returns `fan_axes.prepend_axis(axis_type=axis_type)`, or None if `fan_axes` is None.

    Args:
        fan_axes: The fan axes, or None.
        axis_type: The type of the prepended axis.

    Returns:
        The new fan axes, or None.
    """
    if fan_axes is None:
        return None
    return fan_axes.prepend_axis(axis_type=axis_type)


def compute_fans(shape: Shape, axes: FanAxes) -> dict[str, float]:
    """Returns {"fan_in", "fan_out", "fan_avg"} of a parameter of `shape` with `axes`.

    fan_in = (product of all non-batch dims) / (product of out dims);
    fan_out = (product of all non-batch dims) / (product of in dims).

    Args:
        shape: The parameter shape.
        axes: Its fan axes.

    Returns:
        The fans.
    """

    def size(ax):
        ax = (ax,) if isinstance(ax, int) else tuple(ax)
        return math.prod(shape[a] for a in ax)

    receptive = math.prod(shape) / size(axes.batch_axis)
    fan_in = receptive / size(axes.out_axis)
    fan_out = receptive / size(axes.in_axis)
    return dict(fan_in=fan_in, fan_out=fan_out, fan_avg=(fan_in + fan_out) / 2)


class Initializer(Configurable):
    """Base class of initializers."""

    def initialize(
        self,
        name: str,
        *,
        prng_key: Tensor,
        shape: Shape,
        dtype: Any,
        axes: Optional[FanAxes] = None,
    ) -> Tensor:
        """Returns the initial value of the parameter `name`.

        Args:
            name: The parameter's local name (e.g. "weight").
            prng_key: The PRNG key for this parameter.
            shape: The shape.
            dtype: The dtype.
            axes: The fan axes (needed by fan-scaled initializers).

        Returns:
            The initial value.
        """
        raise NotImplementedError(type(self))

    def debug_string(
        self,
        name: Optional[str] = None,
        shape: Optional[Shape] = None,
        axes: Optional[FanAxes] = None,
    ) -> str:
        """Returns a one-line description of the distribution, for `_init.txt` dumps."""
        raise NotImplementedError(type(self))


class ConstantInitializer(Initializer):
    """Fills parameters with a constant."""

    @config_class
    class Config(Initializer.Config):
        """Configures ConstantInitializer."""

        # The constant value.
        value: Required[Any] = REQUIRED

    def initialize(self, name, *, prng_key, shape, dtype, axes=None) -> Tensor:
        del name, prng_key, axes
        return jnp.full(shape, self.config.value, dtype=dtype)

    def debug_string(self, name=None, shape=None, axes=None) -> str:
        return f"constant({self.config.value})"


def constant_initializer(value: Any) -> ConstantInitializer:
    """Returns a ConstantInitializer (an instance, not a config) filling `value`."""
    return ConstantInitializer.default_config().set(value=value).instantiate()


class GaussianInitializer(Initializer):
    """Normal(0, std^2), independent of fans."""

    @config_class
    class Config(Initializer.Config):
        """Configures GaussianInitializer."""

        # The standard deviation.
        std: Required[float] = REQUIRED

    def initialize(self, name, *, prng_key, shape, dtype, axes=None) -> Tensor:
        del name, axes
        return jax.random.normal(prng_key, shape, dtype=dtype) * self.config.std

    def debug_string(self, name=None, shape=None, axes=None) -> str:
        return f"normal(0, {self.config.std}^2)"


def gaussian_initializer(std: float) -> GaussianInitializer:
    """Returns a GaussianInitializer (an instance) with standard deviation `std`."""
    return GaussianInitializer.default_config().set(std=std).instantiate()


_DISTRIBUTIONS = ("uniform", "normal", "truncated_normal")
_FANS = ("fan_in", "fan_out", "fan_avg", None)


class WeightInitializer(Initializer):
    """Fan-scaled weight initializer (variance scaling).

    With `fan` set, samples have variance `scale / fan`:
    - normal: N(0, scale / fan);
    - uniform: U(-sqrt(3 * scale / fan), sqrt(3 * scale / fan));
    - truncated_normal: a unit normal truncated to (-2, 2), rescaled to std sqrt(scale / fan).
    With `fan=None`, `scale` is the std (normal, truncated_normal) or the bound (uniform).

    The default (uniform, fan_avg, 1.0) is the Xavier/Glorot uniform initializer.
    """

    @config_class
    class Config(Initializer.Config):
        """Configures WeightInitializer."""

        # The scale: the variance numerator with a fan, else the std or uniform bound.
        scale: float = 1.0
        # "fan_in", "fan_out", "fan_avg", or None (no fan scaling).
        fan: Optional[str] = "fan_avg"
        # "uniform", "normal" or "truncated_normal".
        distribution: str = "uniform"

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        cfg = self.config
        if cfg.distribution not in _DISTRIBUTIONS:
            raise ValueError(
                f"WeightInitializer.distribution must be one of {_DISTRIBUTIONS}, "
                f"got {cfg.distribution!r}"
            )
        if cfg.fan not in _FANS:
            raise ValueError(f"WeightInitializer.fan must be one of {_FANS}, got {cfg.fan!r}")

    def initialize(self, name, *, prng_key, shape, dtype, axes=None) -> Tensor:
        # Draws exactly as AXLearn does (the same JAX initializers, the same float32
        # arithmetic), so one key gives AXLearn's values bit for bit: with a fan, JAX's
        # variance_scaling (uniform is U(-1, 1) * sqrt(3 * variance), the variance rounded to
        # `dtype` first); without, JAX's normal initializer or a bounded uniform.
        cfg = self.config
        shape = tuple(shape)
        if cfg.fan is not None:
            if axes is None:
                raise ValueError(
                    f"WeightInitializer with fan={cfg.fan!r} needs fan axes for parameter "
                    f"'{name}' (shape {shape}); the layer must define them (_compute_fan_axes)"
                )
            init = jax.nn.initializers.variance_scaling(
                cfg.scale,
                mode=cfg.fan,
                distribution=cfg.distribution,
                in_axis=axes.in_axis,
                out_axis=axes.out_axis,
                batch_axis=axes.batch_axis,
                dtype=dtype,
            )
            return init(prng_key, shape)
        if cfg.distribution == "normal":
            return jax.nn.initializers.normal(cfg.scale, dtype=dtype)(prng_key, shape)
        if cfg.distribution == "truncated_normal":
            sample = jax.random.truncated_normal(prng_key, -2, 2, shape, dtype)
            return sample * (cfg.scale / jnp.asarray(_TRUNCATED_NORMAL_STDDEV, dtype))
        # uniform without a fan: scale is the bound.
        return jax.random.uniform(
            prng_key, shape, dtype=dtype, minval=-cfg.scale, maxval=cfg.scale
        )

    def debug_string(self, name=None, shape=None, axes=None) -> str:
        cfg = self.config
        if cfg.fan is not None:
            where = f"shape={shape}, axes={axes}"
            if cfg.distribution == "uniform":
                bound = f"sqrt({3 * cfg.scale} / {cfg.fan})"
                return f"uniform(-{bound}, {bound}), {where}"
            if cfg.distribution == "normal":
                return f"normal(0, {cfg.scale} / {cfg.fan}), {where}"
            return f"truncated_normal(-2, 2) * sqrt({cfg.scale} / {cfg.fan}) / 0.88, {where}"
        if cfg.distribution == "uniform":
            return f"uniform({-cfg.scale}, {cfg.scale})"
        if cfg.distribution == "normal":
            return f"normal(0, {cfg.scale}^2)"
        return f"truncated_normal(-2, 2) * {cfg.scale} / 0.88"


class DefaultInitializer(Initializer):
    """Picks an initializer by the parameter's local name.

    `init_by_param_name` maps regexes to initializer configs; the first (in insertion order) that
    fully matches the name wins. After the user's rules come the defaults: bias -> constant(0),
    scale -> constant(1), weight -> WeightInitializer's default. A name no rule matches is an error.
    """

    @config_class
    class Config(Initializer.Config):
        """Configures DefaultInitializer."""

        # Ordered {regex: initializer config}; the first full match on the parameter name wins.
        init_by_param_name: dict[str, InstantiableConfig] = {}

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        rules = dict(self._config.init_by_param_name)
        rules.setdefault(PARAM_REGEXP_BIAS, ConstantInitializer.default_config().set(value=0.0))
        rules.setdefault(PARAM_REGEXP_SCALE, ConstantInitializer.default_config().set(value=1.0))
        rules.setdefault(PARAM_REGEXP_WEIGHT, WeightInitializer.default_config())
        # The rules (with defaults), instantiated once. The config itself is left unchanged.
        self._rules = [(re.compile(k), v.instantiate()) for k, v in rules.items()]

    def _match(self, name: str) -> Initializer:
        for pattern, init in self._rules:
            if pattern.fullmatch(name):
                return init
        raise NotImplementedError(
            f"Unsupported parameter name '{name}': no initializer rule matches it "
            f"(rules: {[p.pattern for p, _ in self._rules]}); add one to init_by_param_name"
        )

    def initialize(self, name, *, prng_key, shape, dtype, axes=None) -> Tensor:
        return self._match(name).initialize(
            name, prng_key=prng_key, shape=shape, dtype=dtype, axes=axes
        )

    def debug_string(self, name=None, shape=None, axes=None) -> str:
        if name is None:
            raise ValueError("DefaultInitializer.debug_string needs the parameter name")
        return self._match(name).debug_string(name=name, shape=shape, axes=axes)


class PerGroupInitializer(Initializer):
    """Splits the last axis into `num_groups` groups and initializes each group separately."""

    @config_class
    class Config(Initializer.Config):
        """Configures PerGroupInitializer."""

        # The initializer of each group.
        initializer: Optional[InstantiableConfig] = None
        # The number of groups; must divide the last dim.
        num_groups: int = 1

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        cfg = self.config
        init_cfg = cfg.initializer or DefaultInitializer.default_config()
        self._initializer = init_cfg.instantiate()

    def initialize(self, name, *, prng_key, shape, dtype, axes=None) -> Tensor:
        cfg = self.config
        if shape[-1] % cfg.num_groups != 0:
            raise ValueError(
                f"Parameter '{name}': last dim {shape[-1]} is not divisible by "
                f"PerGroupInitializer.num_groups={cfg.num_groups}; set num_groups to a divisor "
                "of it."
            )
        group_shape = list(shape[:-1]) + [shape[-1] // cfg.num_groups]

        def init(key):
            return self._initializer.initialize(
                name, prng_key=key, shape=group_shape, dtype=dtype, axes=axes
            )

        if cfg.num_groups == 1:
            return init(prng_key)
        groups = jax.vmap(init)(jax.random.split(prng_key, cfg.num_groups))
        return jnp.concatenate(list(groups), axis=-1)

    def debug_string(self, name=None, shape=None, axes=None) -> str:
        inner = self._initializer.debug_string(name=name, shape=shape, axes=axes)
        return f"{inner} [PerGroupInitializer]"
