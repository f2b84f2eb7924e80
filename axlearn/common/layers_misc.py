"""More layers re-exported by `axlearn.common.layers` (AXLearn's names).

- `UnitNormLinear`: a Linear whose weight columns are L2-normalized before use.
- `MultiLinear`: `num_outputs` linear maps at once, weight [input_dim, num_outputs, output_dim].
- `MaxPool2D`: max pooling over [batch, height, width, channels] (VALID, no padding).
- `DropToken`: in training, keeps the first `num_cls_tokens` tokens and a random
  `int((length - num_cls_tokens) * (1 - rate))` of the others (in their order).
- `MovingAverage`: a running mean of scalars with weight `max(1 / count, min_weight)`, kept in
  the parameters `count` and `value` (updated through state updates).
- `VariationalNoise`: parameter noise `param + vn_std * N(0, 1)` (independent per parameter).
- `SeparableSpaceTimePositionalEmbedding`: position p of a (space, time) grid gets
  `spatial[p // num_time] + temporal[p % num_time]`.

Defined here to keep layers.py short; they report `axlearn.common.layers` as their module.
"""

from collections.abc import Sequence
from typing import Optional

import jax
from jax import numpy as jnp

from axlearn.common.base_layer import BaseLayer, ParameterNoise, ParameterSpec
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.module import Module
from axlearn.common.param_init import FanAxes
from axlearn.common.utils import NestedTensor, Tensor


class UnitNormLinear(BaseLayer):
    """y = x @ (weight / ||weight||_col) (+ bias): each output's weight vector has unit L2 norm."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures UnitNormLinear."""

        # Input feature dim.
        input_dim: Required[int] = REQUIRED
        # Output feature dim.
        output_dim: Required[int] = REQUIRED
        # Whether to add a bias.
        bias: bool = False
        # Added to the squared norm before the square root.
        eps: float = 1e-12

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        params = dict(weight=ParameterSpec(shape=(cfg.input_dim, cfg.output_dim)))
        if cfg.bias:
            params["bias"] = ParameterSpec(shape=[cfg.output_dim])
        return params

    def forward(self, x: Tensor) -> Tensor:
        """Returns x @ normalized weight (+ bias) for x [..., input_dim]."""
        weight = self.parameters["weight"]
        norm = jnp.sqrt(jnp.sum(jnp.square(weight), axis=0, keepdims=True) + self.config.eps)
        out = jnp.einsum("...d,dh->...h", x, weight / norm)
        if self.config.bias:
            out = out + self.parameters["bias"]
        return out


class MultiLinear(BaseLayer):
    """`num_outputs` linear maps: [..., input_dim] -> [..., num_outputs, output_dim]."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures MultiLinear."""

        # Input feature dim.
        input_dim: Required[int] = REQUIRED
        # Number of linear maps.
        num_outputs: Required[int] = REQUIRED
        # Output feature dim of each map.
        output_dim: Required[int] = REQUIRED
        # Whether to add a bias [num_outputs, output_dim].
        bias: bool = True

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        params = dict(weight=ParameterSpec(shape=(cfg.input_dim, cfg.num_outputs, cfg.output_dim)))
        if cfg.bias:
            params["bias"] = ParameterSpec(shape=(cfg.num_outputs, cfg.output_dim))
        return params

    def _compute_fan_axes(self, name: str, parameter_spec: ParameterSpec) -> Optional[FanAxes]:
        if name == "weight":
            return FanAxes(in_axis=0, out_axis=(1, 2))
        return super()._compute_fan_axes(name, parameter_spec)

    def forward(self, x: Tensor) -> Tensor:
        """Returns [..., num_outputs, output_dim]."""
        out = jnp.einsum("...d,dnh->...nh", x, self.parameters["weight"])
        if self.config.bias:
            out = out + self.parameters["bias"]
        return out


class MaxPool2D(BaseLayer):
    """Max pooling over the spatial axes of [batch, height, width, channels] (VALID)."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures MaxPool2D."""

        # The pooling window (height, width).
        window: tuple[int, int] = (2, 2)
        # The strides (height, width).
        strides: tuple[int, int] = (1, 1)

    def forward(self, x: Tensor) -> Tensor:
        """Returns the pooled [batch, height', width', channels]."""
        cfg = self.config
        if x.ndim != 4:
            raise ValueError(f"{self.path()}: expected [batch, height, width, channels], {x.shape}")
        return jax.lax.reduce_window(
            x,
            -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min,
            jax.lax.max,
            (1, *cfg.window, 1),
            (1, *cfg.strides, 1),
            "VALID",
        )

    def output_shape(self, *, input_shape: Sequence[Optional[int]]) -> list:
        """Returns [batch, height', width', channels] for `input_shape`."""
        cfg = self.config
        batch, *spatial, channels = input_shape
        out = [
            None if size is None else (size - w) // s + 1
            for size, w, s in zip(spatial, cfg.window, cfg.strides)
        ]
        return [batch, *out, channels]


class DropToken(BaseLayer):
    """Randomly drops tokens in training (keeping the first `num_cls_tokens`)."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures DropToken."""

        # Fraction of the non-cls tokens dropped in training, in [0, 1).
        rate: float = 0.0
        # Leading tokens never dropped.
        num_cls_tokens: int = 0

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        if not 0 <= self.config.rate < 1:
            raise ValueError(f"{self.path()}: rate={self.config.rate} must be in [0, 1)")

    def forward(self, x: Tensor) -> Tensor:
        """Returns [batch, kept, dim] in training, x itself in evaluation."""
        cfg = self.config
        if not self.is_training or cfg.rate == 0:
            return x
        cls_tokens, tokens = x[:, : cfg.num_cls_tokens], x[:, cfg.num_cls_tokens :]
        batch, length = tokens.shape[:2]
        keep = int(length * (1 - cfg.rate))
        scores = jax.random.uniform(self.prng_key, (batch, length))
        # The kept tokens in their original order.
        kept = jnp.sort(jnp.argsort(scores, axis=-1)[:, :keep], axis=-1)
        tokens = jnp.take_along_axis(tokens, kept[:, :, None], axis=1)
        return jnp.concatenate([cls_tokens, tokens], axis=1)


class MovingAverage(BaseLayer):
    """A running mean of scalars: value += w * (x - value), w = max(1 / count, min_weight)."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures MovingAverage."""

        # The smallest weight of a new value (1 / min_weight values are averaged exactly).
        min_weight: float = 1e-3

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        return dict(
            count=ParameterSpec(shape=(), dtype=jnp.int32, mesh_axes=()),
            value=ParameterSpec(shape=(), dtype=jnp.float32, mesh_axes=()),
        )

    def initialize_parameters_recursively(
        self, prng_key: Tensor, *, prebuilt: Optional[NestedTensor] = None
    ) -> NestedTensor:
        """Zero count and value (no random initialization)."""
        del prng_key, prebuilt
        return dict(count=jnp.zeros((), jnp.int32), value=jnp.zeros((), jnp.float32))

    def forward(self, x: Tensor) -> Tensor:
        """Adds `x` to the average (state updates "count" and "value"); returns the average."""
        count = self.parameters["count"] + 1
        weight = jnp.maximum(1.0 / count, self.config.min_weight)
        value = self.parameters["value"] + weight * (x - self.parameters["value"])
        self.add_state_update("count", count)
        self.add_state_update("value", value)
        return value


class VariationalNoise(ParameterNoise):
    """Adds Gaussian noise `vn_std * N(0, 1)` to every parameter (none if vn_std <= 0)."""

    @config_class
    class Config(ParameterNoise.Config):
        """Configures VariationalNoise."""

        # Standard deviation of the noise.
        vn_std: Required[float] = REQUIRED

    def apply(self, prng_key: Tensor, params: NestedTensor) -> NestedTensor:
        """Returns `params` plus independent noise per parameter."""
        if self.config.vn_std <= 0:
            return params
        leaves, treedef = jax.tree.flatten(params)
        keys = jax.random.split(prng_key, max(len(leaves), 1))
        noisy = [
            x + self.config.vn_std * jax.random.normal(k, x.shape, x.dtype)
            for x, k in zip(leaves, keys)
        ]
        return jax.tree.unflatten(treedef, noisy)


class SeparableSpaceTimePositionalEmbedding(BaseLayer):
    """Embeds positions of a (space, time) grid (time fastest): spatial + temporal embeddings."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures SeparableSpaceTimePositionalEmbedding."""

        # Embedding dim.
        dim: Required[int] = REQUIRED
        # The spatial embedding (an Embedding config with num_embeddings = height * width).
        spatial_embeddings: Required[InstantiableConfig] = REQUIRED
        # The temporal embedding (num_embeddings = number of time steps).
        temporal_embeddings: Required[InstantiableConfig] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("spatial", cfg.spatial_embeddings.clone(dim=cfg.dim))
        self._add_child("temporal", cfg.temporal_embeddings.clone(dim=cfg.dim))

    def embeddings(self) -> Tensor:
        """All [num_spatial * num_temporal, dim] embeddings, time fastest."""
        spatial = self.spatial.embeddings()
        temporal = self.temporal.embeddings()
        return (spatial[:, None, :] + temporal[None, :, :]).reshape(-1, self.config.dim)

    def forward(self, positions: Tensor) -> Tensor:
        """Returns [..., dim] for int positions [...]."""
        return jnp.take(self.embeddings(), jnp.asarray(positions), axis=0)


for _cls in (
    UnitNormLinear,
    MultiLinear,
    MaxPool2D,
    DropToken,
    MovingAverage,
    VariationalNoise,
    SeparableSpaceTimePositionalEmbedding,
):
    _cls.__module__ = "axlearn.common.layers"
