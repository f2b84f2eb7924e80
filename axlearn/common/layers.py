"""Basic layers: Linear, Embedding, normalization, dropout, stochastic depth, activations."""

from __future__ import annotations

import contextlib
import contextvars
import enum
import math
from collections.abc import Iterator
from typing import Callable, Optional, Union

import jax
from jax import nn
from jax import numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.base_layer import BaseLayer, FactorizationSpec, ParameterSpec
from axlearn.common.config import REQUIRED, ConfigBase, Required, config_class
from axlearn.common.convolution import Conv2D

# Classification metric layers defined in layers_metrics.py, exported here as in AXLearn.
from axlearn.common.layers_metrics import (  # noqa: F401
    BaseClassificationHead,
    BaseClassificationMetric,
    BinaryClassificationMetric,
    CategoricalHingeLossMetric,
    ClassificationMetric,
)

# More layers defined in layers_misc.py, exported here as in AXLearn.
from axlearn.common.layers_misc import (  # noqa: F401
    DropToken,
    MaxPool2D,
    MovingAverage,
    MultiLinear,
    SeparableSpaceTimePositionalEmbedding,
    UnitNormLinear,
    VariationalNoise,
)

# Normalization layers defined in layers_norm.py (kept apart for length), exported here as in
# AXLearn (their `__module__` is this module's name).
from axlearn.common.layers_norm import (  # noqa: F401
    BaseNormalizationLayer,
    BatchNorm,
    GroupNorm,
    L2Norm,
    NormType,
    _compute_moments_with_segment_ids,
    compute_mean_square_with_segment_ids,
)
from axlearn.common.module import Module, child_context
from axlearn.common.param_init import PARAM_REGEXP_WEIGHT, DefaultInitializer, WeightInitializer
from axlearn.common.quantized_dot_general.layers import DenseGeneralBaseLayer
from axlearn.common.utils import Tensor, maybe_shard, with_sharding_constraint

# --------------------------------------------------------------------------------------------
# Activations.
# --------------------------------------------------------------------------------------------


def _identity(x: Tensor) -> Tensor:
    return x


def _quick_gelu(x: Tensor) -> Tensor:
    return x * jax.nn.sigmoid(1.702 * x)


def _exact_gelu(x: Tensor) -> Tensor:
    return nn.gelu(x, approximate=False)


def _squared_relu(x: Tensor) -> Tensor:
    return jnp.square(nn.relu(x))


_NAMED_ACTIVATIONS = {
    "linear": _identity,
    "quick_gelu": _quick_gelu,
    "exact_gelu": _exact_gelu,
    "squared_relu": _squared_relu,
}


def get_activation_fn(name: str) -> Callable[[Tensor], Tensor]:
    """Returns the activation function named `name`.

    Names: "linear" (identity), "quick_gelu" (x * sigmoid(1.702 x)), "exact_gelu" (erf form),
    "squared_relu", "nn.<fn>" for `jax.nn.<fn>` (e.g. "nn.silu", "nn.gelu" (tanh approximation),
    "nn.relu", "nn.tanh", "nn.sigmoid") and "jnp.<fn>" for `jax.numpy.<fn>`.

    Args:
        name: The activation name.

    Returns:
        The function.

    Raises:
        NotImplementedError: For an unknown name.
    """
    if name in _NAMED_ACTIVATIONS:
        return _NAMED_ACTIVATIONS[name]
    for prefix, namespace in (("nn.", nn), ("jnp.", jnp)):
        if name.startswith(prefix):
            fn = getattr(namespace, name[len(prefix) :], None)
            if callable(fn):
                return fn
    raise NotImplementedError(
        f"Unsupported activation function {name!r}: use one of {sorted(_NAMED_ACTIVATIONS)}, "
        "'nn.<jax.nn function>' or 'jnp.<jax.numpy function>'"
    )


# --------------------------------------------------------------------------------------------
# Dropout and stochastic depth.
# --------------------------------------------------------------------------------------------


def get_dropout_mask(shape: tuple[int, ...], *, prng_key: Tensor, rate: float) -> Tensor:
    """Returns a boolean mask of `shape`, True (drop) with probability `rate`."""
    return jax.random.bernoulli(prng_key, rate, shape)


def dropout(
    x: Tensor, *, rate: float, prng_key: Optional[Tensor] = None, mask: Optional[Tensor] = None
) -> Tensor:
    """Zeroes elements of `x` where `mask` is True and scales the rest by 1 / (1 - rate).

    Args:
        x: The input.
        rate: The drop probability, in (0, 1).
        prng_key: Key for drawing the mask (required without `mask`).
        mask: Optional boolean mask of x's shape; True drops.

    Returns:
        The output.

    Raises:
        ValueError: For a rate outside (0, 1) or neither key nor mask.
    """
    if not 0 < rate < 1:
        raise ValueError(f"Dropout rate must be in (0, 1), got {rate}")
    if mask is None:
        if prng_key is None:
            raise ValueError("dropout needs prng_key when mask is not given")
        mask = get_dropout_mask(x.shape, prng_key=prng_key, rate=rate)
    return jnp.where(mask, jnp.zeros((), x.dtype), x) / jnp.asarray(1 - rate, x.dtype)


class Dropout(BaseLayer):
    """Dropout: in training, zeroes elements with probability `rate` and scales the rest."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures Dropout."""

        # The drop probability (1 - keep probability); None or 0 disables dropout.
        rate: Optional[float] = None

    def forward(self, x: Tensor) -> Tensor:
        """Applies dropout when training with a non-zero rate; the identity otherwise."""
        rate = self.config.rate
        if not self.is_training or rate is None or rate == 0:
            return x
        return dropout(x, prng_key=self.prng_key, rate=rate)

    def get_prng_key(self) -> Tensor:
        """The key the dropout mask is drawn from in this invocation."""
        return self.prng_key


def set_dropout_rate_recursively(
    cfg: ConfigBase, dropout_rate: Optional[float], set_only_if_none: bool = False
) -> None:
    """Sets `rate` of every Dropout config in the tree rooted at `cfg`.

    Args:
        cfg: The root config.
        dropout_rate: The rate to set.
        set_only_if_none: If True, only sets rates that are None.
    """

    def visit_fn(_, value):
        if isinstance(value, Dropout.Config) and (not set_only_if_none or value.rate is None):
            value.rate = dropout_rate

    def enter_fn(_, value, default_kv):
        return None if isinstance(value, Dropout.Config) else default_kv

    cfg.visit(visit_fn=visit_fn, enter_fn=enter_fn)


class StochasticDepth(BaseLayer):
    """Stochastic depth: in training, drops whole rows (examples) or the whole batch.

    Reference: https://arxiv.org/abs/1603.09382.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures StochasticDepth."""

        # The drop probability; None or 0 disables it.
        rate: Optional[float] = None
        # "row" (per example, along axis 0) or "batch" (all or nothing).
        mode: str = "row"

    def forward(self, x: Tensor) -> Tensor:
        """Drops and rescales by 1/(1-rate) when training; the identity otherwise.

        Raises:
            ValueError: For a rate outside [0, 1) or an unknown mode.
        """
        cfg = self.config
        if not self.is_training or cfg.rate is None or cfg.rate == 0:
            return x
        if not 0 <= cfg.rate < 1:
            raise ValueError(f"{self.path()}: drop rate must be in [0, 1), got {cfg.rate}")
        if cfg.mode == "row":
            shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        elif cfg.mode == "batch":
            shape = (1,) * x.ndim
        else:
            raise ValueError(f"{self.path()}: mode must be 'row' or 'batch', got {cfg.mode!r}")
        rate = self.effective_rate()
        # A traced rate (in a scanned stack) keeps x's dtype; a Python float is weakly typed.
        keep_prob = 1.0 - (rate if isinstance(rate, float) else jnp.asarray(rate, x.dtype))
        keep = jnp.floor(keep_prob + jax.random.uniform(self.prng_key, shape, dtype=x.dtype))
        return x * keep / keep_prob

    def effective_rate(self) -> Union[float, Tensor]:
        """The drop rate of this call: `rate` times the enclosing `stochastic_depth_rate_scale`
        (a traced scalar inside a scanned stack), or `rate` outside any."""
        scale = _STOCHASTIC_DEPTH_RATE_SCALE.get()
        rate = self.config.rate or 0.0
        return rate if scale is None else rate * scale


# The scale of StochasticDepth rates set by `stochastic_depth_rate_scale` (None: no scaling).
_STOCHASTIC_DEPTH_RATE_SCALE: contextvars.ContextVar = contextvars.ContextVar(
    "stochastic_depth_rate_scale", default=None
)


@contextlib.contextmanager
def stochastic_depth_rate_scale(scale: Union[float, Tensor]) -> Iterator[None]:
    """Within the context, every StochasticDepth drops with probability `rate * scale`.

    A repeated (scanned) stack whose layers share one config uses this to give layer i of N the
    rate `peak * (i + 1) / N` (see `BaseStackedTransformerLayer.Config.peak_stochastic_depth_rate`):
    the layers' configured rate is the peak and `scale` the traced (i + 1) / N. An inner context
    replaces an outer one.

    Args:
        scale: A float or scalar Tensor in [0, 1].

    Yields:
        None.
    """
    token = _STOCHASTIC_DEPTH_RATE_SCALE.set(scale)
    try:
        yield
    finally:
        _STOCHASTIC_DEPTH_RATE_SCALE.reset(token)


def get_stochastic_depth_linear_rate(peak_rate: float, stage_order: int, num_stages: int) -> float:
    """Returns the drop rate of stage `stage_order` (1-based) rising linearly to `peak_rate`.

    Raises:
        ValueError: If peak_rate is outside [0, 1) or stage_order outside [1, num_stages].
    """
    if peak_rate is None:
        return peak_rate
    if not 0 <= peak_rate < 1:
        raise ValueError(f"Peak drop rate must be in [0, 1), got {peak_rate}")
    if not 1 <= stage_order <= num_stages:
        raise ValueError(f"stage_order must be in [1, {num_stages}], got {stage_order}")
    return peak_rate * stage_order / num_stages


# --------------------------------------------------------------------------------------------
# Normalization.
# --------------------------------------------------------------------------------------------


class LayerNormStateless(BaseNormalizationLayer):
    """LayerNorm without scale and bias: (x - mean) / sqrt(var + eps) over the last axis."""

    @config_class
    class Config(BaseNormalizationLayer.Config):
        """Configures LayerNormStateless."""

        # Added to the variance.
        eps: float = 1e-8
        # Computes in this dtype (then casts back to the input dtype); None: the input dtype.
        forward_dtype: Optional[jnp.dtype] = jnp.float32

    def forward(self, x: Tensor, *, paddings: Optional[Tensor] = None) -> Tensor:
        del paddings
        cfg = self.config
        x_dtype = x.dtype
        if cfg.forward_dtype is not None:
            x = x.astype(cfg.forward_dtype)
        x = x - jnp.mean(x, axis=-1, keepdims=True)
        variance = jnp.mean(x * x, axis=-1, keepdims=True)
        return (x * jax.lax.rsqrt(variance + cfg.eps)).astype(x_dtype)


class LayerNorm(LayerNormStateless):
    """LayerNorm with a learned scale and bias (https://arxiv.org/abs/1607.06450)."""

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        dim = self.config.input_dim
        return {
            "scale": ParameterSpec(shape=[dim], mesh_axes=(None,)),
            "bias": ParameterSpec(shape=[dim], mesh_axes=(None,)),
        }

    def forward(self, x: Tensor, *, paddings: Optional[Tensor] = None) -> Tensor:
        x = super().forward(x, paddings=paddings)
        return x * self.parameters["scale"] + self.parameters["bias"]


class RMSNormStateless(BaseNormalizationLayer):
    """RMSNorm without scale: x / sqrt(mean(x^2) + eps) over the last axis.

    Reference: https://arxiv.org/abs/1910.07467.
    """

    @config_class
    class Config(BaseNormalizationLayer.Config):
        """Configures RMSNormStateless."""

        # Added to the mean square.
        eps: float = 1e-8
        # Computes in this dtype (then casts back to the input dtype); None: the input dtype.
        forward_dtype: Optional[jnp.dtype] = jnp.float32
        # If not None, a sharding constraint on the input (one entry per input axis).
        input_partition_spec: Optional[tuple] = None
        # If not None, a sharding constraint on the output (one entry per output axis).
        output_partition_spec: Optional[tuple] = None
        # If True, subtracts the mean of the last axis after computing the mean square:
        # (x - mean(x)) / sqrt(mean(x^2) + eps). None means False.
        zero_centered: Optional[bool] = None

    def _normalize(self, x: Tensor) -> Tensor:
        cfg = self.config
        x = maybe_shard(x, cfg.input_partition_spec)
        x_dtype = x.dtype
        if cfg.forward_dtype is not None:
            x = x.astype(cfg.forward_dtype)
        moment2 = jnp.mean(x * x, axis=-1, keepdims=True)
        if cfg.zero_centered:
            x = x - jnp.mean(x, axis=-1, keepdims=True)
        return (x * jax.lax.rsqrt(moment2 + cfg.eps)).astype(x_dtype)

    def forward(self, x: Tensor, *, paddings: Optional[Tensor] = None) -> Tensor:
        del paddings
        return maybe_shard(self._normalize(x), self.config.output_partition_spec)


class RMSNorm(RMSNormStateless):
    """RMSNorm with a learned scale (initialized to 1)."""

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        return {"scale": ParameterSpec(shape=[self.config.input_dim], mesh_axes=(None,))}

    def forward(self, x: Tensor, *, paddings: Optional[Tensor] = None) -> Tensor:
        del paddings
        x = self._normalize(x) * self.parameters["scale"]
        return maybe_shard(x, self.config.output_partition_spec)


def set_layer_norm_eps_recursively(
    cfg: ConfigBase, eps: float, set_only_if_none: bool = False
) -> None:
    """Sets `eps` of every LayerNorm(Stateless) config in the tree rooted at `cfg`."""

    def visit_fn(_, value):
        if isinstance(value, LayerNormStateless.Config) and (
            not set_only_if_none or value.eps is None
        ):
            value.eps = eps

    def enter_fn(_, value, default_kv):
        return None if isinstance(value, LayerNormStateless.Config) else default_kv

    cfg.visit(visit_fn=visit_fn, enter_fn=enter_fn)


# --------------------------------------------------------------------------------------------
# Linear and embedding.
# --------------------------------------------------------------------------------------------


class Linear(DenseGeneralBaseLayer):
    """y = x @ weight (+ bias), weight of shape [input_dim, output_dim].

    The matmul runs quantized (int8/fp8) when `quantized_dot_general` is set.
    """

    @config_class
    class Config(DenseGeneralBaseLayer.Config):
        """Configures Linear."""

        # Input feature dim.
        input_dim: Required[int] = REQUIRED
        # Output feature dim.
        output_dim: Required[int] = REQUIRED
        # Whether to add a bias.
        bias: bool = True
        # If not None, a sharding constraint on the output (one entry per output axis).
        output_partition_spec: Optional[tuple] = None

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        # (input axis, output axis) partitioning of the weight; the bias follows the output axis.
        cfg.param_partition_spec = (None, None)
        return cfg

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        spec = cfg.param_partition_spec
        params = dict(
            weight=ParameterSpec(
                shape=(cfg.input_dim, cfg.output_dim),
                mesh_axes=spec,
                factorization=FactorizationSpec(axes=("row", "col")),
            )
        )
        if cfg.bias:
            params["bias"] = ParameterSpec(
                shape=[cfg.output_dim], mesh_axes=(spec[-1],) if spec is not None else None
            )
        return params

    def _maybe_shard(self, output: Tensor) -> Tensor:
        spec = self.config.output_partition_spec
        if spec is None:
            return output
        if len(spec) != output.ndim:
            raise ValueError(
                f"{self.path()}: output_partition_spec {spec} has {len(spec)} entries but the "
                f"output has shape {output.shape}"
            )
        return with_sharding_constraint(output, PartitionSpec(*spec))

    def forward(self, x: Tensor) -> Tensor:
        """Returns x @ weight (+ bias) for x of shape [..., input_dim]."""
        output = self.einsum_maybe_quantized(
            "...d,dh->...h", activation=x, kernel=self.parameters["weight"]
        )
        if self.config.bias:
            output = output + self.parameters["bias"]
        return self._maybe_shard(output)


class Embedding(BaseLayer):
    """An embedding table mapping ids in [0, num_embeddings) to `dim`-vectors.

    `forward(ids)` looks ids up; `attend(x)` multiplies by the transposed table (the logits of a
    tied output head). The default initializer is N(0, 1/dim) (fan_out normal).
    """

    class Scale(enum.Enum):
        """How to scale looked-up embeddings."""

        # Multiply by sqrt(dim).
        UNIT = "unit"
        # Multiply by `scale_constant`.
        CONSTANT = "constant"

    @config_class
    class Config(BaseLayer.Config):
        """Configures Embedding."""

        # The number of rows (vocabulary size).
        num_embeddings: Required[int] = REQUIRED
        # The embedding dim.
        dim: Required[int] = REQUIRED
        # If not None, a sharding constraint on the input ids.
        input_partition_spec: Optional[tuple] = None
        # If not None, a sharding constraint on the table before the lookup.
        embedding_partition_spec: Optional[tuple] = None
        # If not None, a sharding constraint on the output.
        output_partition_spec: Optional[tuple] = None
        # Optional scaling of the looked-up embeddings.
        scale: Optional[Embedding.Scale] = None
        # The constant for Scale.CONSTANT.
        scale_constant: Optional[float] = None

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.param_partition_spec = (None, "model")
        cfg.param_init = DefaultInitializer.default_config().set(
            init_by_param_name={
                PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                    fan="fan_out", distribution="normal"
                )
            }
        )
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.scale == Embedding.Scale.CONSTANT and cfg.scale_constant is None:
            raise ValueError(
                f"{self.path()}: scale_constant must be specified for Scale.CONSTANT; set "
                "scale_constant to the multiplier."
            )

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        return dict(
            weight=ParameterSpec(
                shape=[cfg.num_embeddings, cfg.dim], mesh_axes=cfg.param_partition_spec
            )
        )

    def forward(self, x: Tensor) -> Tensor:
        """Returns the embeddings of int ids `x` ([...] -> [..., dim])."""
        cfg = self.config
        x = maybe_shard(x, cfg.input_partition_spec)
        table = maybe_shard(self.parameters["weight"], cfg.embedding_partition_spec)
        activation = jnp.take(table, x, axis=0)
        activation = self._scale(activation)
        return maybe_shard(activation, cfg.output_partition_spec)

    def _scale(self, x: Tensor) -> Tensor:
        cfg = self.config
        if cfg.scale is None:
            return x
        x_dtype = x.dtype
        x = x.astype(jnp.float32)
        if cfg.scale == Embedding.Scale.UNIT:
            x = x * math.sqrt(x.shape[-1])
        else:
            x = x * cfg.scale_constant
        return x.astype(x_dtype)

    def attend(self, x: Tensor) -> Tensor:
        """Returns x @ weight.T: [..., dim] -> [..., num_embeddings] (tied output logits)."""
        return jnp.einsum("...d,nd->...n", x, self.parameters["weight"])

    def embeddings(self) -> Tensor:
        """The table, [num_embeddings, dim]."""
        return self.parameters["weight"]


def set_bias_recursively(cfg: ConfigBase, bias: bool = False) -> ConfigBase:
    """Sets `bias` on every config in the tree rooted at `cfg` that has a `bias` field.

    Args:
        cfg: The root config (edited in place).
        bias: The value to set.

    Returns:
        `cfg`.
    """

    def enter_fn(_, value, default_kv):
        if isinstance(value, ConfigBase) and "bias" in value and isinstance(value.bias, bool):
            value.bias = bias
        return default_kv

    cfg.visit(visit_fn=lambda k, v: None, enter_fn=enter_fn)
    return cfg


def set_norm_recursively(cfg: ConfigBase, norm_cfg: ConfigBase) -> ConfigBase:
    """Replaces every normalization-layer config under `cfg` by a copy of `norm_cfg`.

    A normalization config is one whose `klass` subclasses BaseNormalizationLayer; the copy keeps
    the replaced config's `input_dim` when it was set.

    Args:
        cfg: The root config (edited in place).
        norm_cfg: The normalization config to use.

    Returns:
        `cfg`.
    """

    def is_norm(value) -> bool:
        klass = getattr(value, "klass", None) if isinstance(value, ConfigBase) else None
        return isinstance(klass, type) and issubclass(klass, BaseNormalizationLayer)

    def enter_fn(_, value, default_kv):
        if isinstance(value, ConfigBase):
            for key, child in value.items():
                if is_norm(child):
                    new = norm_cfg.clone()
                    if "input_dim" in child and child.input_dim is not REQUIRED:
                        new.input_dim = child.input_dim
                    setattr(value, key, new)
            return [(k, v) for k, v in default_kv if not is_norm(v)] if default_kv else default_kv
        return default_kv

    cfg.visit(visit_fn=lambda k, v: None, enter_fn=enter_fn)
    return cfg


# --------------------------------------------------------------------------------------------
# Squeeze-and-excitation.
# --------------------------------------------------------------------------------------------


class SqueezeExcitation(BaseLayer):
    """Squeeze-and-excitation (Hu et al., 2018) over [batch, height, width, input_dim].

    y = x * gating(expand(activation(reduce(mean_hw(x))))), where `reduce` and `expand` are 1x1
    convolutions input_dim -> num_reduced_filters -> input_dim (with biases). With se_ratio 0 the
    layer has no parameters and returns x.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures SqueezeExcitation."""

        # Input (and output) feature dim.
        input_dim: Required[int] = REQUIRED
        # Reduced dim = max(1, int(input_dim * se_ratio)) unless num_reduced_filters is set;
        # 0 disables the layer.
        se_ratio: float = 0.0
        # If set, the reduced dim (overrides se_ratio's).
        num_reduced_filters: Optional[int] = None
        # Activation after the reduction (see get_activation_fn).
        activation: str = "nn.relu"
        # Gating function of the excitation (see get_activation_fn).
        gating: str = "nn.sigmoid"

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.se_ratio < 0:
            raise ValueError(f"{self.path()}: se_ratio={cfg.se_ratio} must be >= 0")
        if cfg.se_ratio > 0:
            reduced = cfg.num_reduced_filters or max(1, int(cfg.input_dim * cfg.se_ratio))
            conv = Conv2D.default_config().set(window=(1, 1), strides=(1, 1), bias=True)
            self._add_child("reduce", conv.clone(input_dim=cfg.input_dim, output_dim=reduced))
            self._add_child("expand", conv.clone(input_dim=reduced, output_dim=cfg.input_dim))

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns the excited inputs (the inputs themselves when se_ratio is 0)."""
        cfg = self.config
        if cfg.se_ratio <= 0:
            return inputs
        squeezed = jnp.mean(inputs, axis=(1, 2), keepdims=True)
        hidden = get_activation_fn(cfg.activation)(self.reduce(squeezed))
        gate = get_activation_fn(cfg.gating)(self.expand(hidden))
        return inputs * gate


# --------------------------------------------------------------------------------------------
# Redirection to a shared module.
# --------------------------------------------------------------------------------------------


class RedirectToSharedModule(BaseLayer):
    """Calls a module that an ancestor shares (`_share_with_descendants`) in place of itself.

    `forward(*args, **kwargs)` runs `method_map.get("forward", "forward")` of the shared module
    `shared_module` with the shared module's own state, so its parameters live (once) where the
    ancestor holds them; this layer has no parameters.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures RedirectToSharedModule."""

        # The name under which an ancestor shares the target module.
        shared_module: Required[str] = REQUIRED
        # Maps this layer's method names to the shared module's (default: the same name).
        method_map: dict[str, str] = {}

        def set(self, **kwargs) -> RedirectToSharedModule.Config:
            """Sets the known fields and ignores the others (as AXLearn's).

            A parent configures its child in place of the module it redirects to (e.g. an
            embedding layer setting `dim` on its `token_emb`); such fields belong to the
            shared module and are dropped here.

            Args:
                **kwargs: Field values.

            Returns:
                This config.
            """
            known = {k: v for k, v in kwargs.items() if k in self}
            return super().set(**known)

    def _redirect(self, method: str, *args, **kwargs):
        cfg = self.config
        shared = self.get_shared_module(cfg.shared_module)
        target = cfg.method_map.get(method, method)
        if not callable(getattr(shared.module, target, None)):
            raise ValueError(
                f"{self.path()}: shared module '{cfg.shared_module}' has no method '{target}' "
                f"(method_map={cfg.method_map})"
            )
        with child_context(cfg.shared_module, module=shared.module, state=shared.state):
            return getattr(shared.module, target)(*args, **kwargs)

    def _methods_to_wrap_for_auto_child_context(self) -> dict:
        # Every key of method_map is a method of this layer (e.g. {"embeddings": "embeddings"}
        # makes `layer.embeddings()` return the shared module's table), run in this layer's
        # context as `forward` is.
        methods = super()._methods_to_wrap_for_auto_child_context()
        for source in self.config.method_map:
            if source not in methods:
                methods[source] = _redirecting_method(source)
        return methods

    def forward(self, *args, **kwargs):
        """Runs the shared module's mapped `forward` (see the class docstring)."""
        return self._redirect("forward", *args, **kwargs)


def _redirecting_method(name: str):
    """An unbound method of RedirectToSharedModule running the shared module's mapped `name`."""

    def method(self, *args, **kwargs):
        return self._redirect(name, *args, **kwargs)  # pylint: disable=protected-access

    method.__name__ = method.__qualname__ = name
    return method
