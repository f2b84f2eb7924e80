"""Scaling (and optional per-head normalization) of projected queries and keys.

Public names are re-exported by `axlearn.common.attention`.
"""

import functools
from typing import Callable, Optional

import jax

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import (
    REQUIRED,
    InstantiableConfig,
    Required,
    config_class,
    config_for_function,
)
from axlearn.common.module import Module
from axlearn.common.param_init import constant_initializer
from axlearn.common.utils import Tensor

# A function mapping per_head_dim to a scale factor.
ScaleFn = Callable[[int], float]


def constant_scale_fn(value: float) -> ScaleFn:
    """Returns a `ScaleFn` that always returns `value`.

    Args:
        value: The scale.

    Returns:
        The function.
    """

    def scale_fn(per_head_dim: int) -> float:
        del per_head_dim
        return value

    return scale_fn


def pow_scale_fn(exp: float) -> ScaleFn:
    """Returns a `ScaleFn` computing `per_head_dim ** exp` (exp=-0.5: the usual 1/sqrt(d)).

    Args:
        exp: The exponent.

    Returns:
        The function.
    """
    return functools.partial(pow, exp=exp)


# 1 / softplus(0): PerDimScale's scale is 1 at its initial parameter 0.
_INV_SOFTPLUS_0 = 1.442695041


class PerDimScale(BaseLayer):
    """Learned per-dimension scale: x * softplus(param) / softplus(0), param initialized to 0.

    Used by `ScaleQuery.per_dim_scale` (one scale per query channel, shared by all heads); it is
    the identity at initialization.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures PerDimScale."""

        dim: Required[int] = REQUIRED  # Size of the last axis of the input.

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        return dict(
            param=ParameterSpec(
                shape=(self.config.dim,),
                mesh_axes=(None,),
                initializer=constant_initializer(0.0),
            )
        )

    def forward(self, x: Tensor) -> Tensor:
        """Returns x * softplus(param) / softplus(0) (same dtype as x).

        Raises:
            ValueError: If the last axis of x is not `dim`.
        """
        if x.shape[-1] != self.config.dim:
            raise ValueError(f"{self.path()}: last axis {x.shape[-1]} != dim {self.config.dim}")
        scale = jax.nn.softplus(self.parameters["param"]) * _INV_SOFTPLUS_0
        return (x * scale).astype(x.dtype)


class BaseScaleQK(BaseLayer):
    """Scales projected queries or keys [batch, length, num_heads, per_head_dim].

    `forward(proj, positions=)` also receives the tokens' positions ([batch or 1, length]; the
    attention layer passes them) so that a subclass may scale by position; the scales here
    ignore them.

    If `norm` is set, it is applied over the last (per-head) dimension first, with one scale
    parameter of shape (per_head_dim,) shared by all heads (QK-norm).
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseScaleQK."""

        # The per-head dimension; set by the attention layer.
        per_head_dim: Required[int] = REQUIRED
        # Optional normalization layer over the per-head dim (e.g. RMSNorm for QK-norm).
        norm: Optional[InstantiableConfig] = None
        # Optional config of a `ScaleFn`; None uses the subclass default.
        scale_factor: Optional[InstantiableConfig] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        factor_cfg = cfg.scale_factor or self.default_scale_factor_config()
        self._scale_fn = factor_cfg.instantiate()
        if cfg.norm is not None:
            self._add_child("norm", cfg.norm.clone(input_dim=cfg.per_head_dim))

    @staticmethod
    def default_scale_factor_config() -> InstantiableConfig:
        """The default `ScaleFn` config."""
        raise NotImplementedError

    def scale(self) -> float:
        """The multiplicative scale."""
        return self._scale_fn(self.config.per_head_dim)

    def forward(self, proj: Tensor, *, positions: Optional[Tensor] = None) -> Tensor:
        """Returns norm(proj) * scale (norm only if configured).

        Args:
            proj: [batch, length, num_heads, per_head_dim] projected queries or keys.
            positions: Optional [batch or 1, length] positions of `proj`'s tokens, given by the
                attention layer (the query positions for queries, the key positions for keys).
                Unused here; subclasses may scale by position.

        Returns:
            The scaled projection, shaped as `proj`.
        """
        del positions
        if "norm" in self.children:
            proj = self.norm(proj)
        scale = self._scale_fn(self.config.per_head_dim)
        return proj if scale == 1 else proj * scale


class ScaleQuery(BaseScaleQK):
    """Scales projected queries; by default by per_head_dim ** -0.5.

    Order: norm (if set), per-dim scale (if set), then the scale factor.
    """

    @config_class
    class Config(BaseScaleQK.Config):
        """Configures ScaleQuery."""

        # Optional PerDimScale over the per-head dim (parameter `per_dim_scale/param`).
        per_dim_scale: Optional[InstantiableConfig] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.per_dim_scale is not None:
            self._add_child("per_dim_scale", cfg.per_dim_scale.clone(dim=cfg.per_head_dim))

    def forward(self, proj: Tensor, *, positions: Optional[Tensor] = None) -> Tensor:
        """Returns scale * per_dim_scale(norm(proj)) (each part only if configured).

        Args:
            proj: [batch, length, num_heads, per_head_dim] projected queries.
            positions: Optional [batch or 1, length] query positions (unused here; see
                `BaseScaleQK.forward`).

        Returns:
            The scaled projection, shaped as `proj`.
        """
        del positions
        if "norm" in self.children:
            proj = self.norm(proj)
        if "per_dim_scale" in self.children:
            proj = self.per_dim_scale(proj)
        scale = self._scale_fn(self.config.per_head_dim)
        return proj if scale == 1 else proj * scale

    @staticmethod
    def default_scale_factor_config() -> InstantiableConfig:
        return config_for_function(pow_scale_fn).set(exp=-0.5)


class ScaleKey(BaseScaleQK):
    """Scales projected keys; by default by 1."""

    @staticmethod
    def default_scale_factor_config() -> InstantiableConfig:
        return config_for_function(constant_scale_fn).set(value=1)
