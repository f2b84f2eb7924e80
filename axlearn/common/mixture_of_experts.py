"""Mixture-of-experts feed-forward layers (AXLearn's `axlearn.common.mixture_of_experts`).

`TransformerFeedForwardMoE` is a drop-in replacement of `TransformerFeedForwardLayer`: tokens
[batch, seq, input_dim] are split into `num_groups` groups of `group_size` tokens; a router
(`gate_weight` [input_dim, num_experts]) picks up to `top_k` experts per token with
`TopKGating`; each expert (a gated or plain feed-forward: `wi_0_weight`/`wi_1_weight` or
`wi_weight` [num_experts, input_dim, hidden_dim] and `wo_weight` [num_experts, hidden_dim,
input_dim]) processes at most `expert_capacity` tokens per group; outputs are summed weighted
by the gates. Tokens beyond an expert's capacity are dropped by that expert (the residual
connection still carries them).

Gating (GShard/Switch style): router probabilities p = softmax(x @ gate_weight) in float32.
The k-th choice of a token is its k-th most likely expert; slots in an expert are filled over
the group in token order, all first choices before any second choice. Capacity per group and
expert: `ceil(top_k * group_size * capacity_factor / num_experts)` (train or eval factor), at
most `expert_capacity` when set. With top_k > 1 the kept gates of a token are renormalized to
sum to 1; with top_k = 1 the gate is the probability itself.

Auxiliary losses (added as the module output "aux_loss" and as summaries):
load balance = num_experts * sum_e f_e * P_e (f_e: fraction of tokens whose first choice is e,
P_e: mean probability of e; 1 when balanced) times `load_balance_loss_weight`, plus the router
z-loss mean(logsumexp(logits)^2) times `router_z_loss_weight`.

Sharding: the expert axis of weights and dispatched activations is sharded over the "expert"
mesh axis (see `dim_to_mesh_axis_map`).
"""

import math
from typing import NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import (
    REQUIRED,
    FunctionConfigBase,
    InstantiableConfig,
    Required,
    config_class,
)
from axlearn.common.layers import Dropout, LayerNorm, StochasticDepth, get_activation_fn
from axlearn.common.metrics import WeightedScalar
from axlearn.common.module import Module
from axlearn.common.param_init import FanAxes
from axlearn.common.utils import Tensor, current_mesh, with_sharding_constraint


class TopKGating(BaseLayer):
    """Routes each token to its `top_k` most likely experts, within per-group capacities."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures TopKGating."""

        num_experts: Required[int] = REQUIRED  # Number of experts (set by the MoE layer).
        top_k: int = 2  # Experts per token.
        # Capacity factor in training and in evaluation.
        train_capacity_factor: float = 2.0
        eval_capacity_factor: float = 2.0
        # Optional upper bound of the per-group, per-expert capacity.
        expert_capacity: Optional[int] = None

    class Output(NamedTuple):
        """Gating results.

        Fields:
            combine_tensor: Float [O, G, S, E, C]: gate of token s in slot c of expert e.
            dispatch_tensor: Bool [O, G, S, E, C]: whether token s occupies that slot.
            load_balance_loss: Scalar.
            router_z_loss: Scalar.
        """

        combine_tensor: Tensor
        dispatch_tensor: Tensor
        load_balance_loss: Tensor
        router_z_loss: Tensor

    def capacity(self, group_size: int, *, is_training: Optional[bool] = None) -> int:
        """Slots per group and expert for groups of `group_size` tokens.

        Args:
            group_size: Tokens per group.
            is_training: Which capacity factor to use; None: the invocation's mode.

        Returns:
            The capacity.
        """
        cfg = self.config
        if is_training is None:
            is_training = self.is_training
        factor = cfg.train_capacity_factor if is_training else cfg.eval_capacity_factor
        capacity = max(1, math.ceil(cfg.top_k * group_size * factor / cfg.num_experts))
        if cfg.expert_capacity is not None:
            capacity = min(capacity, cfg.expert_capacity)
        return capacity

    def forward(self, logits: Tensor) -> Output:
        """Computes the routing of router logits [O, G, S, E].

        Raises:
            ValueError: If top_k is not in [1, num_experts].
        """
        cfg = self.config
        if not 1 <= cfg.top_k <= cfg.num_experts:
            raise ValueError(f"{self.path()}: top_k={cfg.top_k} not in [1, {cfg.num_experts}]")
        logits = logits.astype(jnp.float32)
        num_experts = logits.shape[-1]
        group_size = logits.shape[-2]
        capacity = self.capacity(group_size)
        probs = jax.nn.softmax(logits, axis=-1)

        remaining = probs
        counts = jnp.zeros(logits.shape[:-2] + (1, num_experts), jnp.int32)  # Slots used.
        masks, gates = [], []
        for _ in range(cfg.top_k):
            choice = jnp.argmax(remaining, axis=-1)
            mask = jax.nn.one_hot(choice, num_experts, dtype=jnp.int32)  # [O, G, S, E].
            remaining = jnp.where(mask > 0, -1.0, remaining)
            # Slot of each token in its chosen expert: tokens before it (this choice) + earlier
            # choices' usage.
            position = jnp.cumsum(mask, axis=-2) - mask + counts
            counts = counts + jnp.sum(mask, axis=-2, keepdims=True)
            mask = mask * (position < capacity)
            masks.append((mask, position))
            gates.append(jnp.sum(probs * mask, axis=-1))  # [O, G, S]; 0 if dropped.
        if cfg.top_k > 1:
            denom = jnp.maximum(sum(gates), jnp.finfo(jnp.float32).eps)
            gates = [g / denom for g in gates]

        combine = jnp.zeros(logits.shape + (capacity,), jnp.float32)
        for (mask, position), gate in zip(masks, gates):
            slot = jax.nn.one_hot(jnp.sum(position * mask, axis=-1), capacity)  # [O, G, S, C].
            combine = combine + (gate[..., None, None] * mask[..., None] * slot[..., None, :])
        dispatch = combine > 0

        first_choice = jax.nn.one_hot(jnp.argmax(probs, axis=-1), num_experts)
        density = jnp.mean(first_choice, axis=-2)  # [O, G, E].
        density_proxy = jnp.mean(probs, axis=-2)
        load_balance_loss = jnp.mean(jnp.sum(density * density_proxy, axis=-1)) * num_experts
        router_z_loss = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
        return self.Output(
            combine_tensor=combine,
            dispatch_tensor=dispatch,
            load_balance_loss=load_balance_loss,
            router_z_loss=router_z_loss,
        )


class TransformerFeedForwardMoE(BaseLayer):
    """A mixture-of-experts feed-forward block with a residual connection (see module doc).

    structure: prenorm y = x + w * moe(norm(x)); postnorm y = norm(x + w * moe(x)).
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures TransformerFeedForwardMoE."""

        input_dim: Required[int] = REQUIRED  # Input (and output) feature dim.
        # Hidden dim of each expert: an int or a function config of input_dim.
        hidden_dim: Required[Union[int, FunctionConfigBase]] = REQUIRED
        num_experts: Required[int] = REQUIRED  # Number of experts.
        # Number of token groups (divides batch * seq); capacities are per group.
        num_groups: Required[int] = REQUIRED
        # Outer batch of groups (groups are [outer_batch, num_groups // outer_batch]).
        outer_batch: int = 1
        # The router.
        gating: InstantiableConfig = TopKGating.default_config()
        # An activation name, or a pair of names for a gated unit (e.g. ("nn.silu", "linear")).
        activation: Union[str, tuple[str, str]] = "nn.relu"
        norm: InstantiableConfig = LayerNorm.default_config()  # The normalization layer.
        dropout: InstantiableConfig = Dropout.default_config()  # Dropout config.
        # Stochastic depth on the residual branch.
        stochastic_depth: InstantiableConfig = StochasticDepth.default_config()
        structure: str = "prenorm"  # "prenorm" or "postnorm".
        residual_weight: float = 1.0  # The weight of the residual branch.
        # Weight of the load-balancing loss in "aux_loss".
        load_balance_loss_weight: float = 0.01
        # Weight of the router z-loss in "aux_loss".
        router_z_loss_weight: float = 0.0
        # Partition specs by dims: "me" (gate), "emh"/"ehm" (expert weights), "ogsm" (grouped
        # tokens), "egcm" (dispatched tokens), "egch" (expert hidden activations).
        dim_to_mesh_axis_map: dict[str, Optional[PartitionSpec]] = {
            "me": PartitionSpec(None, None),
            "emh": PartitionSpec("expert", "fsdp", "model"),
            "ehm": PartitionSpec("expert", "model", "fsdp"),
            "ogsm": PartitionSpec("data", "expert", None, "model"),
            "egcm": PartitionSpec("expert", None, None, "model"),
            "egch": PartitionSpec("expert", None, None, "model"),
        }

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.structure not in ("prenorm", "postnorm"):
            raise NotImplementedError(f"{self.path()}: unsupported structure {cfg.structure}")
        if isinstance(cfg.activation, (tuple, list)) and len(cfg.activation) != 2:
            raise ValueError(f"{self.path()}: gated activation needs 2 names: {cfg.activation}")
        self._check_expert_sharding()
        self._add_child("norm", cfg.norm.clone(input_dim=cfg.input_dim))
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
                fan_axes=FanAxes(in_axis=0, out_axis=1),
            ),
            wo_weight=ParameterSpec(
                shape=(cfg.num_experts, hidden, cfg.input_dim),
                mesh_axes=axes.get("ehm"),
                fan_axes=FanAxes(in_axis=1, out_axis=2, batch_axis=0),
            ),
        )
        for name in self._wi_names():
            specs[name] = ParameterSpec(
                shape=(cfg.num_experts, cfg.input_dim, hidden),
                mesh_axes=axes.get("emh"),
                fan_axes=FanAxes(in_axis=1, out_axis=2, batch_axis=0),
            )
        return specs

    def _constrain(self, x: Tensor, dims: str) -> Tensor:
        spec = self.config.dim_to_mesh_axis_map.get(dims)
        return x if spec is None else with_sharding_constraint(x, spec)

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns the layer output, same shape as `inputs` [batch, seq, input_dim]."""
        cfg = self.config
        x = self.norm(inputs) if cfg.structure == "prenorm" else inputs
        x = self._moe(x)
        x = self.stochastic_depth(self.dropout(x)) * cfg.residual_weight
        x = inputs + x
        return self.norm(x) if cfg.structure == "postnorm" else x

    def _moe(self, x: Tensor) -> Tensor:
        cfg = self.config
        shape = x.shape
        num_tokens = math.prod(shape[:-1])
        if num_tokens % cfg.num_groups or cfg.num_groups % cfg.outer_batch:
            raise ValueError(
                f"{self.path()}: num_groups={cfg.num_groups} must divide the {num_tokens} tokens "
                f"and be a multiple of outer_batch={cfg.outer_batch}"
            )
        groups = x.reshape(
            cfg.outer_batch,
            cfg.num_groups // cfg.outer_batch,
            num_tokens // cfg.num_groups,
            shape[-1],
        )
        groups = self._constrain(groups, "ogsm")
        logits = jnp.einsum("ogsm,me->ogse", groups, self.parameters["gate_weight"])
        gating = self.gating(logits)
        aux_loss = (
            cfg.load_balance_loss_weight * gating.load_balance_loss
            + cfg.router_z_loss_weight * gating.router_z_loss
        )
        self.add_module_output("aux_loss", aux_loss)
        self.add_summary("load_balance_loss", WeightedScalar(gating.load_balance_loss, 1.0))
        self.add_summary("router_z_loss", WeightedScalar(gating.router_z_loss, 1.0))
        dispatch = gating.dispatch_tensor.astype(x.dtype)
        # [O, G, S, E, C] x [O, G, S, M] -> [E, O*G, C, M].
        dispatched = jnp.einsum("ogsec,ogsm->eogcm", dispatch, groups)
        dispatched = dispatched.reshape(cfg.num_experts, cfg.num_groups, *dispatched.shape[3:])
        dispatched = self._constrain(dispatched, "egcm")
        activations = cfg.activation
        if not isinstance(activations, (tuple, list)):
            activations = (activations,)
        hidden = None
        for name, act in zip(self._wi_names(), activations):
            h = get_activation_fn(act)(
                jnp.einsum("egcm,emh->egch", dispatched, self.parameters[name])
            )
            hidden = h if hidden is None else hidden * h
        hidden = self._constrain(hidden, "egch")
        out = jnp.einsum("egch,ehm->egcm", hidden, self.parameters["wo_weight"])
        out = self._constrain(out, "egcm")
        out = out.reshape(cfg.num_experts, cfg.outer_batch, -1, *out.shape[2:])
        combine = gating.combine_tensor.astype(x.dtype)
        combined = jnp.einsum("ogsec,eogcm->ogsm", combine, out)
        return self._constrain(combined, "ogsm").reshape(shape)
