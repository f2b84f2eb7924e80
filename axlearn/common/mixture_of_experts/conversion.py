"""Dense-to-MoE parameter conversion and the outer batch of a mesh.

`convert_dense_to_moe_parameters` upcycles a dense model's parameters into an MoE model's
(sparse upcycling): every expert starts as a copy of the dense feed-forward layer it replaces,
the router weights are left for the caller to initialize (None), and all other parameters are
copied. Repeated stacks are matched by layer index: a target `repeat/layer/layer{j}` of a stack
of S layers repeated R times takes dense layer r * S + j of a repeated stack of R * S layers.
"""

from collections.abc import Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp

from axlearn.common.utils import HybridMeshShape, MeshShape, Nested, Tensor


def _tile_experts(weight: Tensor, spec: Any) -> Tensor:
    """Repeats a dense weight [..., a, b] into the expert axis of spec.shape [..., E, a, b]."""
    axis = len(spec.shape) - 3
    return jnp.repeat(jnp.expand_dims(weight, axis), spec.shape[axis], axis=axis)


def _convert_feedforward_to_moe_parameters(
    source_parameters: Nested[Tensor],
    *,
    num_experts: int,
    moe_parameter_specs: Nested[Any],
) -> Nested[Optional[Tensor]]:
    """Converts a TransformerFeedForwardLayer's parameters to a TransformerFeedForwardMoE's.

    linear1 / linear1_{0,1} weights become wi_weight / wi_{0,1}_weight and linear2 becomes
    wo_weight, each replicated to every expert; norms are copied; gate_weight is None.

    Args:
        source_parameters: The dense layer's parameters.
        num_experts: Number of experts.
        moe_parameter_specs: The MoE layer's parameter specs (shapes).

    Returns:
        The MoE layer's parameters (None where the caller must initialize).

    Raises:
        NotImplementedError: If the dense layer has biases.
        ValueError: If a converted shape differs from the spec.
    """
    result: dict[str, Any] = {}
    renames = {"linear1": "wi_weight", "linear1_0": "wi_0_weight", "linear1_1": "wi_1_weight"}
    renames["linear2"] = "wo_weight"
    for name, value in source_parameters.items():
        if name in renames:
            if "bias" in value:
                raise NotImplementedError(
                    f"dense-to-MoE conversion: {name} has a bias; MoE experts have no bias"
                )
            target = renames[name]
            spec = moe_parameter_specs[target]
            weight = _tile_experts(value["weight"], spec)
            if tuple(weight.shape) != tuple(spec.shape) or spec.shape[-3] != num_experts:
                raise ValueError(
                    f"dense-to-MoE conversion: {name} {value['weight'].shape} does not fit "
                    f"{target} {spec.shape} with {num_experts} experts"
                )
            result[target] = weight
        elif name in moe_parameter_specs:
            result[name] = value
    for name, spec in moe_parameter_specs.items():
        # Leaves the caller must initialize are None; sub-dicts (e.g. of children without
        # parameters) keep their structure.
        result.setdefault(name, jax.tree.map(lambda _: None, spec))
    return result


def _is_moe_feed_forward(specs: Any) -> bool:
    return isinstance(specs, dict) and "gate_weight" in specs and "wo_weight" in specs


def _select_layer(tree: Any, index: int, num: int) -> Any:
    """Takes layer `index` of every group of `num` along the leading (repeat) axis."""
    if isinstance(tree, dict):
        return {k: _select_layer(v, index, num) for k, v in tree.items()}
    return tree.reshape((-1, num) + tree.shape[1:])[:, index]


def convert_dense_to_moe_parameters(
    source_parameters: Nested[Tensor], *, target_parameter_specs: Nested[Any]
) -> Nested[Any]:
    """Converts a dense model's parameters to an MoE model's (see the module docstring).

    Args:
        source_parameters: The dense model's parameters.
        target_parameter_specs: The MoE model's parameter specs.

    Returns:
        The MoE model's parameters; the router weights are left as their ParameterSpec, to be
        initialized by the caller.

    Raises:
        ValueError: If a parameter is missing or a shape differs.
    """

    def convert(source: Any, specs: Any, path: str) -> Any:
        if _is_moe_feed_forward(specs):
            num_experts = specs["gate_weight"].shape[-1]
            out = _convert_feedforward_to_moe_parameters(
                source, num_experts=num_experts, moe_parameter_specs=specs
            )
            return jax.tree.map(
                lambda spec, value: spec if value is None else value,
                specs,
                out,
                is_leaf=lambda x: x is None,
            )
        if isinstance(specs, dict):
            if not isinstance(source, dict):
                raise ValueError(f"dense-to-MoE conversion: {path} is not a dict in the source")
            stacked = [k for k in specs if k.startswith("layer") and k[5:].isdigit()]
            if stacked and not any(k in source for k in stacked):
                num = len(stacked)
                return {
                    k: convert(_select_layer(source, int(k[5:]), num), specs[k], f"{path}/{k}")
                    if k in stacked
                    else convert(source[k], specs[k], f"{path}/{k}")
                    for k in specs
                }
            missing = [k for k in specs if k not in source]
            if missing:
                raise ValueError(f"dense-to-MoE conversion: {path} lacks {missing} in the source")
            return {k: convert(source[k], v, f"{path}/{k}") for k, v in specs.items()}
        if tuple(source.shape) != tuple(specs.shape):
            raise ValueError(
                f"dense-to-MoE conversion: {path} has shape {source.shape}, target {specs.shape}"
            )
        return source

    return convert(source_parameters, target_parameter_specs, "")


def get_outer_batch_from_mesh(
    *,
    mesh_axis_names: Sequence[str],
    outer_batch_axis_names: Sequence[str],
    mesh_shape: Optional[MeshShape | HybridMeshShape],
) -> Optional[int]:
    """The product of the mesh sizes of `outer_batch_axis_names` (a MoE layer's outer_batch).

    Args:
        mesh_axis_names: The mesh's axis names.
        outer_batch_axis_names: The axes the outer batch spans.
        mesh_shape: A mesh shape, a HybridMeshShape (sizes are ici * dcn), or None.

    Returns:
        The outer batch; -1 if a needed axis is -1 (inferred from the mesh at run time); None
        without a mesh shape.

    Raises:
        NotImplementedError: If a needed DCN size is -1 (unknown number of granules).
    """
    if mesh_shape is None:
        return None
    if isinstance(mesh_shape, HybridMeshShape):
        sizes = {}
        for name, ici, dcn in zip(
            mesh_axis_names, mesh_shape.ici_mesh_shape, mesh_shape.dcn_mesh_shape
        ):
            if name in outer_batch_axis_names and (dcn == -1 or ici == -1):
                raise NotImplementedError(
                    f"Unable to infer number of granules for mesh axis {name!r} of {mesh_shape}; "
                    "give the DCN mesh shape without -1"
                )
            sizes[name] = ici * dcn
    else:
        sizes = dict(zip(mesh_axis_names, mesh_shape))
    result = 1
    for name in outer_batch_axis_names:
        result *= sizes.get(name, 1)
    # Negative (an axis is -1): resolved from the mesh at run time (TransformerFeedForwardMoE).
    return -1 if result < 0 else result
