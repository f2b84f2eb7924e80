"""BaseNormalizationLayer, GroupNorm, NormType, BatchNorm, L2Norm: the norm layers in `layers`.

Defined here to keep layers.py short; `axlearn.common.layers` re-exports them and they report
`axlearn.common.layers` as their module, so configs dump as `axlearn.common.layers.GroupNorm`.
The other norm layers (LayerNorm, RMSNorm, ...) live in layers.py and derive from the base here.
"""

from __future__ import annotations

import enum
from typing import Optional, Union

import jax
from jax import numpy as jnp

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.param_init import constant_initializer
from axlearn.common.utils import Tensor


class BaseNormalizationLayer(BaseLayer):
    """Base class of normalization layers over the last axis."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseNormalizationLayer."""

        # The size of the normalized (last) axis.
        input_dim: Required[int] = REQUIRED

    def forward(self, x: Tensor, *, paddings: Optional[Tensor] = None) -> Tensor:
        """Normalizes `x` ([..., input_dim]); `paddings` is accepted for API compatibility."""
        raise NotImplementedError(type(self))


def _masked_mean(x: Tensor, *, axes: tuple[int, ...], paddings: Optional[Tensor]) -> Tensor:
    """Mean of `x` over `axes` (kept as size 1), leaving out padded positions."""
    if paddings is None:
        return jnp.mean(x, axis=axes, keepdims=True)
    mask = (1 - paddings).astype(x.dtype).reshape(paddings.shape + (1,) * (x.ndim - 2))
    mask = jnp.broadcast_to(mask, x.shape)
    count = jnp.maximum(jnp.sum(mask, axis=axes, keepdims=True), 1.0)
    return jnp.sum(x * mask, axis=axes, keepdims=True) / count


def _paddings_with_segment_ids(
    paddings: Optional[Tensor], segment_ids: Optional[Tensor]
) -> Optional[Tensor]:
    """Paddings [batch, time] that also mark segment id 0 (AXLearn's padding segment)."""
    if segment_ids is None:
        return paddings
    from_segments = (jnp.asarray(segment_ids) == 0).astype(jnp.int32)
    if paddings is None:
        return from_segments
    return jnp.maximum(jnp.asarray(paddings).astype(jnp.int32), from_segments)


def _compute_moments_with_segment_ids(
    *, x: Tensor, segment_ids: Optional[Tensor], reduction_axis, keepdims: bool = True
) -> tuple[Tensor, Tensor]:
    """Mean and variance of `x` over `reduction_axis`, leaving out positions of segment 0.

    Args:
        x: [batch, time, ...].
        segment_ids: Optional int [batch, time]; 0 marks padding. None: every position counts.
        reduction_axis: The axes to reduce (a list or tuple of ints, negative allowed).
        keepdims: Whether the reduced axes stay as size 1.

    Returns:
        (mean, variance).
    """
    axes = tuple(sorted(a % x.ndim for a in reduction_axis))
    paddings = None if segment_ids is None else (jnp.asarray(segment_ids) == 0).astype(x.dtype)
    mean, var = _masked_moments(x, axes=axes, paddings=paddings)
    if not keepdims:
        mean, var = jnp.squeeze(mean, axis=axes), jnp.squeeze(var, axis=axes)
    return mean, var


def compute_mean_square_with_segment_ids(
    *, x: Tensor, segment_ids: Optional[Tensor], reduction_axis, keepdims: bool = True
) -> Tensor:
    """Mean of `x ** 2` over `reduction_axis`, leaving out positions of segment 0.

    Args:
        x: [batch, time, ...].
        segment_ids: Optional int [batch, time]; 0 marks padding. None: every position counts.
        reduction_axis: The axes to reduce.
        keepdims: Whether the reduced axes stay as size 1.

    Returns:
        The mean square.
    """
    axes = tuple(sorted(a % x.ndim for a in reduction_axis))
    paddings = None if segment_ids is None else (jnp.asarray(segment_ids) == 0).astype(x.dtype)
    out = _masked_mean(x * x, axes=axes, paddings=paddings)
    return out if keepdims else jnp.squeeze(out, axis=axes)


def _masked_moments(
    x: Tensor, *, axes: tuple[int, ...], paddings: Optional[Tensor]
) -> tuple[Tensor, Tensor]:
    """Mean and variance of `x` over `axes`, leaving out padded positions.

    Args:
        x: [batch, time, ...] (any rank >= 2 when paddings is given).
        axes: The axes to reduce (keepdims).
        paddings: Optional 0/1 [batch, time]; 1 marks padding.

    Returns:
        (mean, variance), each with `axes` kept as size 1.
    """
    if paddings is None:
        mean = jnp.mean(x, axis=axes, keepdims=True)
        return mean, jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    mask = (1 - paddings).astype(x.dtype).reshape(paddings.shape + (1,) * (x.ndim - 2))
    mask = jnp.broadcast_to(mask, x.shape)
    count = jnp.maximum(jnp.sum(mask, axis=axes, keepdims=True), 1.0)
    mean = jnp.sum(x * mask, axis=axes, keepdims=True) / count
    var = jnp.sum(jnp.square(x - mean) * mask, axis=axes, keepdims=True) / count
    return mean, var


class L2Norm(BaseNormalizationLayer):
    """Scales the last axis to unit L2 norm: x * rsqrt(sum(x**2) + eps)."""

    @config_class
    class Config(BaseNormalizationLayer.Config):
        """Configures L2Norm."""

        # Unused (L2Norm has no parameters); optional here, as in AXLearn.
        input_dim: Optional[int] = None
        # Added to the sum of squares.
        eps: float = 1e-8

    def forward(self, x: Tensor, *, paddings: Optional[Tensor] = None) -> Tensor:
        """Normalizes `x` ([..., input_dim]); `paddings` is unused."""
        del paddings
        sum2 = jnp.sum(x * x, axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(sum2 + self.config.eps)


class NormType(enum.Enum):
    """How `GroupNorm` normalizes each group.

    - LAYERNORM: subtract the mean, divide by the standard deviation; learned scale and bias.
    - RMSNORM: divide by the root mean square; learned scale only.
    """

    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class GroupNorm(BaseNormalizationLayer):
    """Group normalization (https://arxiv.org/abs/1803.08494).

    The channels (last axis) are split into `num_groups` groups. Each group is normalized over
    its own channels plus `norm_axes` (by default every axis except the batch and group axes),
    leaving out padded time steps when `paddings` ([batch, time]) is given. `norm_type` picks
    layer normalization (scale and bias) or RMS normalization (scale only), as in AXLearn.
    """

    @config_class
    class Config(BaseNormalizationLayer.Config):
        """Configures GroupNorm."""

        # The number of channel groups; must divide input_dim.
        num_groups: Required[int] = REQUIRED
        # Added to the variance (or mean square).
        eps: float = 1e-8
        # Inputs are cast to this dtype for the statistics; None: no cast.
        forward_dtype: Optional[jnp.dtype] = jnp.float32
        # NormType.LAYERNORM or NormType.RMSNORM; None means LAYERNORM.
        norm_type: Optional[NormType] = None
        # Axes of the [batch, ..., num_groups, group_size] tensor to reduce besides the group
        # channels (e.g. (1,) for time only); None: all axes but batch and num_groups.
        norm_axes: Optional[Union[tuple[int, ...], int]] = None

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.norm_type = NormType.LAYERNORM
        return cfg

    def __init__(self, cfg: Config, *, parent):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.num_groups <= 0 or cfg.input_dim % cfg.num_groups != 0:
            raise ValueError(
                f"{self.path()}: num_groups ({cfg.num_groups}) must be positive and divide "
                f"input_dim ({cfg.input_dim})"
            )

    def _norm_type(self) -> NormType:
        return self.config.norm_type or NormType.LAYERNORM

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        dim = self.config.input_dim
        specs = {"scale": ParameterSpec(shape=[dim], mesh_axes=(None,))}
        if self._norm_type() == NormType.LAYERNORM:
            specs["bias"] = ParameterSpec(shape=[dim], mesh_axes=(None,))
        return specs

    def _reduction_axes(self, ndim: int) -> tuple[int, ...]:
        """The axes of the grouped [batch, ..., num_groups, group_size] tensor to reduce."""
        cfg = self.config
        if cfg.norm_axes is None:
            axes = list(range(1, ndim - 2))
        elif isinstance(cfg.norm_axes, int):
            axes = [cfg.norm_axes]
        else:
            axes = list(cfg.norm_axes)
        axes = [a if a >= 0 else ndim + a for a in axes]
        if ndim - 2 in axes:
            raise ValueError(
                f"{self.path()}.norm_axes={cfg.norm_axes}: GroupNorm should not normalize along "
                "the num_groups axis; drop it from norm_axes"
            )
        if 0 in axes:
            raise ValueError(
                f"{self.path()}.norm_axes={cfg.norm_axes}: GroupNorm should not normalize along "
                "the batch axis; drop it from norm_axes"
            )
        if ndim - 1 not in axes:
            axes.append(ndim - 1)
        return tuple(sorted(set(axes)))

    def forward(
        self,
        x: Tensor,
        *,
        paddings: Optional[Tensor] = None,
        segment_ids: Optional[Tensor] = None,
    ) -> Tensor:
        """Normalizes `x` ([batch, ..., input_dim], rank >= 3 when paddings is given).

        `segment_ids` ([batch, time], 0 = padding) leave out positions like `paddings`.
        """
        cfg = self.config
        paddings = _paddings_with_segment_ids(paddings, segment_ids)
        if x.ndim < 2:
            raise ValueError(f"{self.path()}: GroupNorm needs [batch, ..., dim], got {x.shape}")
        x_dtype, shape = x.dtype, x.shape
        if cfg.forward_dtype is not None:
            x = x.astype(cfg.forward_dtype)
        grouped = x.reshape(shape[:-1] + (cfg.num_groups, shape[-1] // cfg.num_groups))
        axes = self._reduction_axes(grouped.ndim)
        if self._norm_type() == NormType.LAYERNORM:
            mean, var = _masked_moments(grouped, axes=axes, paddings=paddings)
            normed = (grouped - mean) * jax.lax.rsqrt(var + cfg.eps)
            normed = normed.reshape(shape).astype(x_dtype)
            return normed * self.parameters["scale"] + self.parameters["bias"]
        mean_square = _masked_mean(grouped * grouped, axes=axes, paddings=paddings)
        normed = grouped * jax.lax.rsqrt(mean_square + cfg.eps)
        return normed.reshape(shape).astype(x_dtype) * self.parameters["scale"]


class BatchNorm(BaseNormalizationLayer):
    """Batch normalization (https://arxiv.org/abs/1502.03167) over all axes but the last.

    Training normalizes by the batch's statistics (leaving out padded positions) and updates the
    moving statistics with `add_state_update`; evaluation uses the moving statistics. The moving
    statistics are parameters with weight decay scale 0 (their gradients are zero).
    """

    @config_class
    class Config(BaseNormalizationLayer.Config):
        """Configures BatchNorm."""

        # Decay of the moving statistics.
        decay: float = 0.999
        # Added to the variance.
        eps: float = 1e-6

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        dim = self.config.input_dim
        return {
            "scale": ParameterSpec(shape=[dim], mesh_axes=(None,)),
            "bias": ParameterSpec(shape=[dim], mesh_axes=(None,)),
            "moving_mean": ParameterSpec(
                shape=[dim],
                mesh_axes=(None,),
                initializer=constant_initializer(0.0),
                weight_decay_scale=0,
            ),
            "moving_variance": ParameterSpec(
                shape=[dim],
                mesh_axes=(None,),
                initializer=constant_initializer(1.0),
                weight_decay_scale=0,
            ),
        }

    def forward(
        self,
        x: Tensor,
        *,
        paddings: Optional[Tensor] = None,
        segment_ids: Optional[Tensor] = None,
    ) -> Tensor:
        """Normalizes `x` ([batch, ..., input_dim]); paddings ([batch, time]) are left out.

        `segment_ids` ([batch, time], 0 = padding) leave out positions like `paddings`.
        """
        cfg = self.config
        paddings = _paddings_with_segment_ids(paddings, segment_ids)
        if self.is_training:
            axes = tuple(range(x.ndim - 1))
            mean, var = _masked_moments(x.astype(jnp.float32), axes=axes, paddings=paddings)
            mean, var = mean.reshape(-1), var.reshape(-1)
            params = self.parameters
            self.add_state_update(
                "moving_mean", cfg.decay * params["moving_mean"] + (1 - cfg.decay) * mean
            )
            self.add_state_update(
                "moving_variance",
                cfg.decay * params["moving_variance"] + (1 - cfg.decay) * var,
            )
        else:
            mean, var = self.parameters["moving_mean"], self.parameters["moving_variance"]
        normed = (x - mean) * jax.lax.rsqrt(var + cfg.eps)
        return (normed * self.parameters["scale"] + self.parameters["bias"]).astype(x.dtype)


for _cls in (BaseNormalizationLayer, L2Norm, GroupNorm, BatchNorm, NormType):
    _cls.__module__ = "axlearn.common.layers"
del _cls
