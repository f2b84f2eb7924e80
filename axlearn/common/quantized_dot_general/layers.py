"""`QuantizedDotGeneral` and `DenseGeneralBaseLayer` (AXLearn's names and config fields).

A layer whose matmuls may run quantized subclasses `DenseGeneralBaseLayer` and computes them
with `self.einsum_maybe_quantized(subscripts, activation=x, kernel=w)`; setting its
`quantized_dot_general` config (for a whole model: `set_quantized_dot_general_recursively`, or
the trainer's `FP8ConfigModifier`) adds a child `quantized_dot_general` that computes the einsum
in int8 or fp8. With the field None (the default) the einsum is plain `jnp.einsum`.

FP_8 keeps per-layer state as parameters of the child: `input_scale`, `kernel_scale`,
`output_grad_scale` (float32 scalars, initially 1) and, with `fp8_amax_history_length=L`,
`input_amax_history`, `kernel_amax_history`, `output_grad_amax_history` (float32 [L], initially
0). Their "gradients" are their next values (see `fp8_ops`), so the learner must replace rather
than optimize them: wrap the optimizer in `OverrideInplaceUpdateTransformation` with rules
`.*/<name>` for `get_all_fp8_param_names()` (FP8ConfigModifier does both).
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any, Optional

import jax
from jax import numpy as jnp

from axlearn.common.base_layer import BaseLayer, ParameterSpec, no_remat
from axlearn.common.config import config_class
from axlearn.common.module import Module
from axlearn.common.param_init import constant_initializer
from axlearn.common.quantized_dot_general.activation_clipping import BaseActivationClippingLayer
from axlearn.common.quantized_dot_general.fp8_ops import fp8_dot_general
from axlearn.common.quantized_dot_general.int8_ops import int8_dot_general
from axlearn.common.quantized_dot_general.utils import is_einsum_swapped_operands
from axlearn.common.utils import Tensor


class DotGeneralQuantizationType(Enum):
    """The quantized formats."""

    # Int8 operands (symmetric, per slice), float gradients.
    INT_8 = 0
    # Fp8: e4m3 operands, e5m2 output gradients, delayed or in-batch scaling.
    FP_8 = 1


class ClippingChoice(Enum):
    """Which tensor `QuantizedDotGeneral.Config.activation_clipping` clips."""

    # The activation operand, before the dot product.
    INPUT_ACTIVATION = 0
    # The dot product's output.
    OUTPUT_ACTIVATION = 1


class FP8ScaleParams(Enum):
    """Names of the fp8 scale parameters."""

    INPUT_SCALE = "input_scale"
    KERNEL_SCALE = "kernel_scale"
    OUTPUT_GRADE_SCALE = "output_grad_scale"


class FP8AmaxHistoryParams(Enum):
    """Names of the fp8 amax history parameters."""

    INPUT_AMAX_HISTORY = "input_amax_history"
    KERNEL_AMAX_HISTORY = "kernel_amax_history"
    OUTPUT_GRAD_AMAX_HISTORY = "output_grad_amax_history"


def get_all_fp8_param_names() -> list[str]:
    """Returns the names of all fp8 state parameters (scales, then amax histories)."""
    return [p.value for p in FP8ScaleParams] + [p.value for p in FP8AmaxHistoryParams]


class BaseQuantizedEinsum(BaseLayer):
    """The interface: an activation-kernel einsum, possibly quantized."""

    def einsum_maybe_quantized(self, subscripts: str, *, activation: Tensor, kernel: Tensor):
        """Returns `jnp.einsum(subscripts, activation, kernel)`, possibly quantized.

        Args:
            subscripts: Einsum subscripts of two operands (activation first).
            activation: The activation.
            kernel: The weight.

        Returns:
            The einsum result.
        """
        raise NotImplementedError(type(self))


class QuantizedDotGeneral(BaseQuantizedEinsum):
    """Computes activation-kernel einsums with int8 or fp8 dot products.

    Used as the child `quantized_dot_general` of a `DenseGeneralBaseLayer`, not directly. On
    backends without fp8 matmuls (CPU, TPUs before v7) the fp8 rounding is emulated exactly and
    the products are accumulated in the compute dtype.
    """

    @config_class
    class Config(BaseQuantizedEinsum.Config):
        """Configures QuantizedDotGeneral."""

        # The format; None: no quantization (plain dot_general).
        quantization_type: Optional[DotGeneralQuantizationType] = None
        # Optional clipping of the activation (or output, see clipping_choice); for int8.
        activation_clipping: Optional[BaseActivationClippingLayer.Config] = None
        # Which tensor activation_clipping clips.
        clipping_choice: ClippingChoice = ClippingChoice.INPUT_ACTIVATION
        # FP_8: length of the amax histories (delayed scaling); None: in-batch scaling.
        fp8_amax_history_length: Optional[int] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.quantization_type is not None and not isinstance(
            cfg.quantization_type, DotGeneralQuantizationType
        ):
            raise ValueError(
                f"{self.path()}.quantization_type must be None or one of "
                f"{[t.name for t in DotGeneralQuantizationType]}, got {cfg.quantization_type!r}"
            )
        length = cfg.fp8_amax_history_length
        if length is not None and (not isinstance(length, int) or length < 1):
            raise ValueError(
                f"{self.path()}.fp8_amax_history_length must be None (in-batch scaling) or a "
                f"positive int, got {length!r}; e.g. 128"
            )
        if cfg.activation_clipping is not None:
            self._add_child("activation_clipping", cfg.activation_clipping)

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        if cfg.quantization_type != DotGeneralQuantizationType.FP_8:
            return {}
        specs = {
            p.value: ParameterSpec(
                shape=(),
                dtype=jnp.float32,
                mesh_axes=(),
                initializer=constant_initializer(1.0),
                weight_decay_scale=0.0,
            )
            for p in FP8ScaleParams
        }
        if cfg.fp8_amax_history_length is not None:
            for p in FP8AmaxHistoryParams:
                specs[p.value] = ParameterSpec(
                    shape=(cfg.fp8_amax_history_length,),
                    dtype=jnp.float32,
                    mesh_axes=(None,),
                    initializer=constant_initializer(0.0),
                    weight_decay_scale=0.0,
                )
        return specs

    def _fp8_dot(
        self,
        lhs: Tensor,
        rhs: Tensor,
        dimension_numbers: jax.lax.DotDimensionNumbers,
        precision: jax.lax.PrecisionLike,
        preferred_element_type: Optional[Any],
        lhs_is_activation: bool,
    ) -> Tensor:
        params = self.parameters

        def get(name: str) -> Optional[Tensor]:
            return params.get(name)

        act = (get("input_scale"), get("input_amax_history"))
        ker = (get("kernel_scale"), get("kernel_amax_history"))
        lhs_state, rhs_state = (act, ker) if lhs_is_activation else (ker, act)
        scales = (lhs_state[0], rhs_state[0], get("output_grad_scale"))
        histories = (lhs_state[1], rhs_state[1], get("output_grad_amax_history"))
        return fp8_dot_general(
            lhs, rhs, scales, histories, dimension_numbers, precision, preferred_element_type
        )

    def _dot_general_maybe_quantized(
        self,
        lhs: Tensor,
        rhs: Tensor,
        dimension_numbers: jax.lax.DotDimensionNumbers,
        precision: jax.lax.PrecisionLike = None,
        preferred_element_type: Optional[Any] = None,
        lhs_is_activation: bool = True,
        **kwargs,
    ) -> Tensor:
        """`jax.lax.dot_general` in the configured format.

        Args:
            lhs: Left operand.
            rhs: Right operand.
            dimension_numbers: As `jax.lax.dot_general`.
            precision: As `jax.lax.dot_general`.
            preferred_element_type: As `jax.lax.dot_general`.
            lhs_is_activation: Whether lhs is the activation (else the kernel).
            **kwargs: Other `jax.lax.dot_general` arguments (e.g. out_sharding), for the
                unquantized path.

        Returns:
            The product.
        """
        qtype = self.config.quantization_type
        if qtype is None:
            return jax.lax.dot_general(
                lhs,
                rhs,
                dimension_numbers,
                precision=precision,
                preferred_element_type=preferred_element_type,
                **kwargs,
            )
        if qtype == DotGeneralQuantizationType.INT_8:
            return int8_dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type)
        return self._fp8_dot(
            lhs, rhs, dimension_numbers, precision, preferred_element_type, lhs_is_activation
        )

    def einsum_maybe_quantized(self, subscripts: str, *, activation: Tensor, kernel: Tensor):
        cfg = self.config
        clip = "activation_clipping" in self.children
        if clip and cfg.clipping_choice == ClippingChoice.INPUT_ACTIVATION:
            activation = self.activation_clipping(activation)
        swapped = is_einsum_swapped_operands(subscripts, activation, kernel)
        output = jnp.einsum(
            subscripts,
            activation,
            kernel,
            _dot_general=functools.partial(
                self._dot_general_maybe_quantized, lhs_is_activation=not swapped
            ),
        )
        if clip and cfg.clipping_choice == ClippingChoice.OUTPUT_ACTIVATION:
            output = self.activation_clipping(output)
        return output


class DenseGeneralBaseLayer(BaseLayer):
    """Base of layers whose activation-kernel einsums may be quantized.

    Subclasses compute their matmuls with `self.einsum_maybe_quantized`.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures DenseGeneralBaseLayer."""

        # If not None, the child computing this layer's einsums in int8/fp8.
        quantized_dot_general: Optional[QuantizedDotGeneral.Config] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.quantized_dot_general is not None:
            self._add_child("quantized_dot_general", cfg.quantized_dot_general)

    # A helper of the layer's own methods (e.g. `forward`), which remat covers already.
    @no_remat
    def einsum_maybe_quantized(
        self, subscripts: str, *, activation: Tensor, kernel: Tensor
    ) -> Tensor:
        """Returns `jnp.einsum(subscripts, activation, kernel)`, quantized if configured.

        Args:
            subscripts: Einsum subscripts of two operands (activation first).
            activation: The activation.
            kernel: The weight.

        Returns:
            The einsum result.
        """
        if "quantized_dot_general" in self.children:
            return self.quantized_dot_general.einsum_maybe_quantized(
                subscripts, activation=activation, kernel=kernel
            )
        return jnp.einsum(subscripts, activation, kernel)


def set_quantized_dot_general_recursively(
    cfg: Any,
    quantized_dot_general: Optional[QuantizedDotGeneral.Config],
    set_only_if_none: bool = False,
) -> int:
    """Sets `quantized_dot_general` of every `DenseGeneralBaseLayer.Config` under `cfg`.

    Args:
        cfg: The root config (visited recursively; a matching config's own children are not).
        quantized_dot_general: The config to set (each layer gets its own copy), or None.
        set_only_if_none: Only set where the field is None.

    Returns:
        The number of DenseGeneralBaseLayer configs found under `cfg`.
    """
    found = []

    def visit_fn(_, value):
        if isinstance(value, DenseGeneralBaseLayer.Config):
            found.append(value)
            if not set_only_if_none or value.quantized_dot_general is None:
                value.quantized_dot_general = (
                    None if quantized_dot_general is None else quantized_dot_general.clone()
                )

    def enter_fn(_, value, default_children):
        return None if isinstance(value, DenseGeneralBaseLayer.Config) else default_children

    if isinstance(cfg, DenseGeneralBaseLayer.Config):
        visit_fn("", cfg)
    else:
        cfg.visit(visit_fn=visit_fn, enter_fn=enter_fn)
    return len(found)
