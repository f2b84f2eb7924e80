"""`TransformerFeedForwardMoE`: the capacity-based mixture-of-experts feed-forward layer.

A drop-in replacement of `TransformerFeedForwardLayer`: tokens [batch, seq, M] are split into
[O, G, S, M] (O = `outer_batch`, G = `num_groups`, S = batch * seq / (O * G)); the router
(`gate_weight` [M, E]) picks experts per token (see `gating`); each expert (a gated or plain
feed-forward: `wi_0_weight`/`wi_1_weight` or `wi_weight` [E, M, H], `wo_weight` [E, H, M]) runs
on its [O, G, C, M] slots; outputs are summed weighted by the gates.

structure: prenorm y = x + w * moe(norm(x)); postnorm y = norm(x + w * moe(x));
hybridnorm y = x + w * postnorm(moe(prenorm(x))); nonorm y = moe(x) (no residual);
v2 y = out_norm(x + w * res_norm(moe(in_norm(x)))) with `norm` a dict {NormPosition: config}.
With `residual_gate_init` set (v2 only), the residual sum is the learned gate of
`axlearn.common.attention.residual_gate`: sqrt(1 - p**2) * x + p * branch, p = sigmoid(theta).

"aux_loss" (a module output) = load_balance_loss_weight * load balance loss
+ router_z_loss_weight * router z-loss + corr_loss_weight * expert correlation loss (the mean
squared off-diagonal cosine similarity of the router's expert columns).
"""

import math
from typing import Optional, Union

import jax.numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.attention.residual_gate import (
    check_residual_gate,
    gated_residual,
    residual_gate_parameter_specs,
)
from axlearn.common.attention.transformer import (
    NormPosition,
    _add_structure_norms,
    _maybe_norm,
)
from axlearn.common.base_layer import ParameterSpec
from axlearn.common.config import (
    REQUIRED,
    FunctionConfigBase,
    InstantiableConfig,
    Required,
    config_class,
)
from axlearn.common.invocation_context import child_context
from axlearn.common.layers import Dropout, LayerNorm, StochasticDepth, get_activation_fn
from axlearn.common.mixture_of_experts.gating import BaseGating, Top2Gating, TopKGating
from axlearn.common.module import Module
from axlearn.common.param_init import FanAxes
from axlearn.common.quantized_dot_general.layers import DenseGeneralBaseLayer
from axlearn.common.utils import Tensor, current_mesh, with_sharding_constraint

# Activations whose output is 0 (or nearly) for inputs <= 0: a hidden unit whose pre-activation
# stays <= 0 over all dispatched tokens is "dead".
_DEAD_ZONE_ACTIVATIONS = ("nn.relu", "nn.silu", "nn.gelu", "quick_gelu", "exact_gelu")


class TransformerFeedForwardMoE(DenseGeneralBaseLayer):
    """A mixture-of-experts feed-forward block with a residual connection (see module doc)."""

    @config_class
    class Config(DenseGeneralBaseLayer.Config):
        """Configures TransformerFeedForwardMoE."""

        input_dim: Required[int] = REQUIRED  # Input (and output) feature dim.
        # Hidden dim of each expert: an int or a function config of input_dim.
        hidden_dim: Required[Union[int, FunctionConfigBase]] = REQUIRED
        # Outer batch O of the [O, G, S, M] token groups; -1: the current mesh's size of the
        # axes of dim 0 of dim_to_mesh_axis_map["ogsm"] (1 outside a mesh).
        outer_batch: int = 1
        # The normalization layer; with structure="v2", a dict {NormPosition: norm config}.
        norm: Union[InstantiableConfig, dict] = LayerNorm.default_config()
        # An activation name, or a pair of names for a gated unit (e.g. ("nn.silu", "linear")).
        activation: Union[str, tuple[str, str]] = "nn.relu"
        dropout: InstantiableConfig = Dropout.default_config()  # Dropout config.
        # Stochastic depth on the residual branch.
        stochastic_depth: InstantiableConfig = StochasticDepth.default_config()
        # "prenorm", "postnorm", "hybridnorm", "nonorm" or "v2" (see the module docstring).
        structure: str = "prenorm"
        residual_weight: float = 1.0  # The weight w of the residual branch.
        num_experts: Required[int] = REQUIRED  # Number of experts E.
        # Groups G per outer batch; capacities are per group.
        num_groups: Required[int] = REQUIRED
        gating: BaseGating.Config = Top2Gating.default_config()  # The router.
        # Weight of the load-balancing loss in "aux_loss".
        load_balance_loss_weight: float = 0.01
        # Weight of the router z-loss in "aux_loss".
        router_z_loss_weight: float = 0.0
        # Weight of the expert correlation loss in "aux_loss" (0 disables it).
        corr_loss_weight: float = 0
        # Partition specs by dims: "me" (router), "emh"/"ehm" (expert weights), "ogsm" (grouped
        # tokens), "ogsec" (routing tensors), "oegcm"/"ogecm" (dispatched tokens), "oegch"
        # (expert hidden activations).
        dim_to_mesh_axis_map: dict[str, Optional[PartitionSpec]] = {
            "me": PartitionSpec(None, None),
            "emh": PartitionSpec("expert", "fsdp", "model"),
            "ehm": PartitionSpec("expert", "model", "fsdp"),
            "ogsm": PartitionSpec("data", "expert", None, "model"),
            "ogsec": PartitionSpec("data", None, None, "expert", None),
            "oegcm": PartitionSpec("data", "expert", None, None, "model"),
            "ogecm": PartitionSpec("data", None, "expert", None, "model"),
            "oegch": PartitionSpec("data", "expert", None, None, "model"),
        }
        # structure="v2" only: the initial value of the learned residual gate parameter
        # `residual_gate_theta` (see `axlearn.common.attention.residual_gate`); None: no gate.
        residual_gate_init: Optional[float] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        _add_structure_norms(self, structure=cfg.structure, norm=cfg.norm, dim=cfg.input_dim)
        check_residual_gate(self, structure=cfg.structure, init=cfg.residual_gate_init)
        if isinstance(cfg.activation, (tuple, list)) and len(cfg.activation) != 2:
            raise ValueError(f"{self.path()}: gated activation needs 2 names: {cfg.activation}")
        self._check_expert_sharding()
        self._add_child("gating", cfg.gating.clone(num_experts=cfg.num_experts))
        self._add_child("dropout", cfg.dropout)
        self._add_child("stochastic_depth", cfg.stochastic_depth)

    def _check_expert_sharding(self) -> None:
        """Inside a mesh, num_experts must divide evenly over the mesh axes of the expert dim.

        Raises:
            ValueError: If it does not (one line naming the config path and the fix).
        """
        cfg = self.config
        mesh = current_mesh()
        spec = cfg.dim_to_mesh_axis_map.get("emh")
        if mesh is None or spec is None or not len(spec) or spec[0] is None:
            return
        axes = spec[0] if isinstance(spec[0], (tuple, list)) else (spec[0],)
        size = math.prod(mesh.shape.get(axis, 1) for axis in axes)
        if cfg.num_experts % size != 0:
            raise ValueError(
                f"{self.path()}.num_experts={cfg.num_experts} is not divisible by the {size}-way "
                f"expert sharding (mesh axes {tuple(axes)} of the expert dim): use a multiple of "
                f"{size} experts or a smaller expert mesh axis."
            )

    def _hidden_dim(self) -> int:
        cfg = self.config
        if isinstance(cfg.hidden_dim, int):
            return cfg.hidden_dim
        return cfg.hidden_dim.clone(input_dim=cfg.input_dim).instantiate()

    def _wi_names(self) -> list[str]:
        gated = isinstance(self.config.activation, (tuple, list))
        return ["wi_0_weight", "wi_1_weight"] if gated else ["wi_weight"]

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        hidden, axes = self._hidden_dim(), cfg.dim_to_mesh_axis_map
        specs = dict(
            gate_weight=ParameterSpec(
                shape=(cfg.input_dim, cfg.num_experts),
                mesh_axes=axes.get("me"),
                fan_axes=FanAxes(in_axis=-2, out_axis=-1),
            ),
            wo_weight=ParameterSpec(
                shape=(cfg.num_experts, hidden, cfg.input_dim),
                mesh_axes=axes.get("ehm"),
                fan_axes=FanAxes(in_axis=-2, out_axis=-1, batch_axis=0),
            ),
        )
        for name in self._wi_names():
            specs[name] = ParameterSpec(
                shape=(cfg.num_experts, cfg.input_dim, hidden),
                mesh_axes=axes.get("emh"),
                fan_axes=FanAxes(in_axis=-2, out_axis=-1, batch_axis=0),
            )
        specs.update(residual_gate_parameter_specs(cfg.residual_gate_init))
        return specs

    def _constrain(self, x: Tensor, dims: str) -> Tensor:
        spec = self.config.dim_to_mesh_axis_map.get(dims)
        return x if spec is None or current_mesh() is None else with_sharding_constraint(x, spec)

    def _einsum(self, name: str, subscripts: str, activation: Tensor, kernel: Tensor) -> Tensor:
        """An expert matmul, quantized if configured (the child runs in context `name`)."""
        if "quantized_dot_general" not in self.children:
            return jnp.einsum(subscripts, activation, kernel)
        with child_context(name, module=self.quantized_dot_general):
            return self.quantized_dot_general.einsum_maybe_quantized(
                subscripts, activation=activation, kernel=kernel
            )

    def _residual_branch(self, x: Tensor) -> Tensor:
        cfg = self.config
        x = self.stochastic_depth(self.dropout(x))
        return x * cfg.residual_weight if cfg.residual_weight != 1 else x

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns the layer output, same shape as `inputs` [batch, seq, input_dim]."""
        cfg = self.config
        if cfg.structure == "prenorm":
            return inputs + self._residual_branch(self._dispatch_and_combine(self.norm(inputs)))
        if cfg.structure == "postnorm":
            return self.norm(inputs + self._residual_branch(self._dispatch_and_combine(inputs)))
        if cfg.structure == "hybridnorm":
            x = self.postnorm(self._dispatch_and_combine(self.prenorm(inputs)))
            return inputs + self._residual_branch(x)
        if cfg.structure == "nonorm":
            return self._residual_branch(self._dispatch_and_combine(inputs))
        x = self._dispatch_and_combine(_maybe_norm(self, NormPosition.IN_NORM, inputs))
        x = self._residual_branch(_maybe_norm(self, NormPosition.RES_NORM, x))
        return _maybe_norm(self, NormPosition.OUT_NORM, gated_residual(self, inputs, x))

    def _expert_correlation_loss(self) -> Tensor:
        """Mean squared off-diagonal cosine similarity of the router's expert columns."""
        w = self.parameters["gate_weight"].astype(jnp.float32)
        w = w / (jnp.linalg.norm(w, axis=0, keepdims=True) + 1e-6)
        cov = w.T @ w
        off_diagonal = cov * (1 - jnp.eye(cov.shape[0], dtype=cov.dtype))
        num_pairs = max(cov.shape[0] * (cov.shape[0] - 1), 1)
        loss = jnp.sum(off_diagonal**2) / num_pairs
        self.add_summary("expert_cov_max", jnp.max(jnp.abs(off_diagonal)))
        self.add_summary("expert_cov_loss", loss)
        return loss

    def _aux_loss(self, load_balance_loss: Tensor, router_z_loss: Tensor) -> Tensor:
        cfg = self.config
        aux_loss = cfg.load_balance_loss_weight * load_balance_loss
        aux_loss = aux_loss + cfg.router_z_loss_weight * router_z_loss
        if cfg.corr_loss_weight:
            aux_loss = aux_loss + cfg.corr_loss_weight * self._expert_correlation_loss()
        return aux_loss

    def _outer_batch(self) -> int:
        cfg = self.config
        if cfg.outer_batch != -1:
            return cfg.outer_batch
        mesh, spec = current_mesh(), cfg.dim_to_mesh_axis_map.get("ogsm")
        if mesh is None or spec is None or spec[0] is None:
            return 1
        axes = spec[0] if isinstance(spec[0], (tuple, list)) else (spec[0],)
        return math.prod(mesh.shape.get(axis, 1) for axis in axes)

    def _group(self, x: Tensor) -> Tensor:
        """[..., M] -> [O, G, S, M]."""
        cfg = self.config
        outer_batch = self._outer_batch()
        num_tokens = math.prod(x.shape[:-1])
        if outer_batch < 1 or num_tokens % (outer_batch * cfg.num_groups):
            raise ValueError(
                f"{self.path()}: outer_batch * num_groups = {outer_batch} * {cfg.num_groups} "
                f"must divide the {num_tokens} tokens"
            )
        return x.reshape(outer_batch, cfg.num_groups, -1, x.shape[-1])

    def _wi_activation(self, x: Tensor) -> Tensor:
        """Applies the expert input projections and activation(s) to dispatched x [O,E,G,C,M]."""
        cfg = self.config
        activations = cfg.activation
        if not isinstance(activations, (tuple, list)):
            activations = (activations,)
        hidden = None
        for name, act in zip(self._wi_names(), activations):
            h = self._einsum(f"einsum_{name}", "oegcm,emh->oegch", x, self.parameters[name])
            h = self._remat_name(h, name.replace("_weight", "").replace("wi", "linear1"))
            if name in ("wi_weight", "wi_0_weight") and act in _DEAD_ZONE_ACTIVATIONS:
                alive = jnp.max(h, axis=(0, 2, 3)) > 0  # [E, H].
                self.add_summary("expert_dead_neurons", jnp.sum(~alive))
            h = get_activation_fn(act)(h)
            hidden = h if hidden is None else hidden * h
        return self._constrain(hidden, "oegch")

    def _dispatch_and_combine(self, x: Tensor) -> Tensor:
        """Routes x [..., M] to the experts, runs them and combines their outputs."""
        shape = x.shape
        groups = self._constrain(self._group(x), "ogsm")
        logits = jnp.einsum("ogsm,me->ogse", groups, self.parameters["gate_weight"])
        gating = self.gating(logits)
        self.add_module_output(
            "aux_loss", self._aux_loss(gating.load_balance_loss, gating.router_z_loss)
        )
        dispatch = self._constrain(gating.dispatch_tensor.astype(x.dtype), "ogsec")
        dispatched = jnp.einsum("ogsec,ogsm->oegcm", dispatch, groups)
        dispatched = self._constrain(dispatched, "oegcm")
        hidden = self._wi_activation(dispatched)
        out = self._einsum(
            "einsum_wo_weight", "oegch,ehm->oegcm", hidden, self.parameters["wo_weight"]
        )
        out = self._constrain(out, "oegcm")
        rms = jnp.sqrt(jnp.mean(jnp.square(out.astype(jnp.float32)), where=None))
        self.add_summary("rms_norm/linear2_outputs", rms)
        combine = self._constrain(gating.combine_tensor.astype(x.dtype), "ogsec")
        combined = jnp.einsum("ogsec,oegcm->ogsm", combine, out)
        return self._constrain(combined, "ogsm").reshape(shape)


__all__ = ["TopKGating", "TransformerFeedForwardMoE"]
