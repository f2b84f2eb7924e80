"""The learned residual gate of structure="v2" layers (AXLearn's `residual_gate_init`).

A layer whose config sets `residual_gate_init` (TransformerAttentionLayer,
TransformerFeedForwardLayer, TransformerFeedForwardMoE) owns a scalar float32 parameter
`residual_gate_theta` (initialized to that value, no weight decay) and, in place of the residual
sum `x + branch`, computes in float32

    p = clip(sigmoid(theta), 1e-6, 1 - 1e-6)
    y = sqrt(1 - p**2) * x + p * branch

(cast back to x's dtype), which keeps the variance of y that of x when x and the branch are
uncorrelated with equal variance. It applies to structure="v2" only (before `out_norm`); other
structures reject the field. The layer adds the summary "residual_gate/theta".
"""

from typing import Optional

import jax
import jax.numpy as jnp

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.param_init import constant_initializer
from axlearn.common.utils import Tensor

RESIDUAL_GATE_PARAM = "residual_gate_theta"


def check_residual_gate(layer: BaseLayer, *, structure: str, init: Optional[float]) -> None:
    """Raises a one-line ValueError if `residual_gate_init` is set on a structure other than v2.

    Args:
        layer: The layer (for its path in the message).
        structure: The layer's structure.
        init: The layer's `residual_gate_init`.

    Raises:
        ValueError: If `init` is set and `structure` is not "v2".
    """
    if init is not None and structure != "v2":
        raise ValueError(
            f"{layer.path()}.residual_gate_init={init!r} needs structure='v2' (got "
            f"{structure!r}); use structure='v2' or set residual_gate_init=None."
        )


def residual_gate_parameter_specs(init: Optional[float]) -> dict[str, ParameterSpec]:
    """{"residual_gate_theta": scalar float32 spec initialized to `init`}, or {} for None.

    Args:
        init: The layer's `residual_gate_init`.

    Returns:
        The parameter specs to add to the layer's.
    """
    if init is None:
        return {}
    return {
        RESIDUAL_GATE_PARAM: ParameterSpec(
            shape=(),
            dtype=jnp.float32,
            mesh_axes=(),
            initializer=constant_initializer(float(init)),
            weight_decay_scale=0.0,
        )
    }


def gated_residual(layer: BaseLayer, inputs: Tensor, branch: Tensor) -> Tensor:
    """The residual sum of a v2 layer: `inputs + branch` if its `residual_gate_init` is None,
    else sqrt(1 - p**2) * inputs + p * branch with p = clip(sigmoid(theta)), in float32.

    Args:
        layer: The layer (config field `residual_gate_init`); with the gate it owns
            `residual_gate_theta` and gets the "residual_gate/theta" summary.
        inputs: The residual stream [..., dim].
        branch: The layer's branch output, shaped as `inputs`.

    Returns:
        The (gated) sum, in `inputs`' dtype with the gate.
    """
    if layer.config.residual_gate_init is None:
        return inputs + branch
    theta = layer.parameters[RESIDUAL_GATE_PARAM]
    layer.add_summary("residual_gate/theta", theta)
    p = jnp.clip(jax.nn.sigmoid(theta.astype(jnp.float32)), 1e-6, 1.0 - 1e-6)
    out = jnp.sqrt(1.0 - p * p) * inputs.astype(jnp.float32) + p * branch.astype(jnp.float32)
    return out.astype(inputs.dtype)
