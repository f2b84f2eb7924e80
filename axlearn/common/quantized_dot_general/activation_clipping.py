"""Activation clipping layers, applied around a quantized dot product (AXLearn's names).

Large activation outliers waste the range of a low-precision format; these layers bound the
activation to [-clipping_max_abs, clipping_max_abs] (hard or tanh-soft) before quantization.
"""

from __future__ import annotations

from typing import Union

from jax import numpy as jnp

from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.metrics import WeightedSummary
from axlearn.common.module import Module
from axlearn.common.utils import Tensor


class BaseActivationClippingLayer(BaseLayer):
    """The interface: `forward(x)` returns the clipped `x`."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseActivationClippingLayer."""

        # Whether to add the summary "clipped_activation" (fraction of entries beyond the bound).
        clipping_summary: bool = False

    def _maybe_add_clipping_summary(self, x: Tensor, clipping_max_abs: Union[Tensor, float]):
        """Adds the fraction of `x`'s entries with |x| > clipping_max_abs, if configured.

        Args:
            x: The tensor before clipping.
            clipping_max_abs: The bound.
        """
        if not self.config.clipping_summary:
            return
        beyond = (jnp.abs(x) > clipping_max_abs).astype(jnp.float32)
        self.add_summary("clipped_activation", WeightedSummary(jnp.mean(beyond), float(x.size)))

    def forward(self, x: Tensor) -> Tensor:
        """Returns `x` clipped.

        Args:
            x: The activation.

        Returns:
            The clipped activation, same shape and dtype.
        """
        raise NotImplementedError(type(self))


class _BoundedClippingLayer(BaseActivationClippingLayer):
    """A clipping layer with a positive bound `clipping_max_abs`."""

    @config_class
    class Config(BaseActivationClippingLayer.Config):
        """Configures a bounded clipping layer."""

        # The largest absolute value after clipping (> 0).
        clipping_max_abs: Required[float] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Module):
        super().__init__(cfg, parent=parent)
        bound = self.config.clipping_max_abs
        if not isinstance(bound, (int, float)) or bound <= 0:
            raise ValueError(
                f"{self.path()}.clipping_max_abs must be a positive number, got {bound!r}; "
                "set it to the largest activation magnitude to keep, e.g. 1e3"
            )


class HardActivationClippingLayer(_BoundedClippingLayer):
    """Clips to [-clipping_max_abs, clipping_max_abs] (gradient zero beyond the bound)."""

    def forward(self, x: Tensor) -> Tensor:
        bound = self.config.clipping_max_abs
        self._maybe_add_clipping_summary(x, bound)
        return jnp.clip(x, -bound, bound)


class DummyActivationClippingLayer(_BoundedClippingLayer):
    """Does not clip; only adds the summary of how much a clip would affect."""

    def forward(self, x: Tensor) -> Tensor:
        self._maybe_add_clipping_summary(x, self.config.clipping_max_abs)
        return x


class TanhActivationClippingLayer(_BoundedClippingLayer):
    """Soft clipping: clipping_max_abs * tanh(x / clipping_max_abs)."""

    def forward(self, x: Tensor) -> Tensor:
        bound = self.config.clipping_max_abs
        self._maybe_add_clipping_summary(x, bound)
        return (jnp.tanh(x / bound) * bound).astype(x.dtype)
