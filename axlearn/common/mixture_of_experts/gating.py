"""Routers of the mixture-of-experts layers: `Top2Gating`, `TopKGating` and drop-free variants.

A router maps logits [O, G, S, E] (outer batch, groups, tokens per group, experts) to a combine
tensor [O, G, S, E, C] (the gate of token s in slot c of expert e; C the per-group capacity of an
expert) and a boolean dispatch tensor of the same shape, plus auxiliary losses:

- load balance: E * sum_e f_e * P_e, averaged over (O, G); f_e the fraction of token choices that
  go to expert e (first choices only for `Top2Gating`), P_e the mean score of e (1 when balanced);
- router z-loss: mean(logsumexp(logits)^2).

Slots of an expert fill over the group in token order, all first choices before any second choice;
choices beyond the capacity are dropped (their gate is 0). The kept gates of a token are divided by
the sum of its selected scores, so a token's combine weights sum to 1 when none is dropped.
The drop-free routers (`TopKDropFreeGating`, `TopKBiasGating`) return per-token expert indices and
weights instead, for the grouped-matmul layer.
"""

import enum
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.layers_misc import MovingAverage
from axlearn.common.module import Module
from axlearn.common.param_init import ConstantInitializer
from axlearn.common.utils import Tensor


class GateNoise(enum.Enum):
    """Noise added to router logits before the top-k choice (`TopKGating.noisy_gating`).

    GUMBEL: -log(-log(u)), u ~ U(0, 1) per logit (sampling from the softmax without replacement).
    """

    GUMBEL = "gumbel"


def sigmoid(x: Tensor) -> Tensor:
    """A router score function (`TopKGating.score_fn`): elementwise 1 / (1 + exp(-x)).

    Args:
        x: Router logits.

    Returns:
        Scores in (0, 1), same shape.
    """
    return jax.nn.sigmoid(x)


def approx_max_k(operand: Tensor, k: int, *, recall_target: float = 0.95) -> tuple[Tensor, Tensor]:
    """A top-k function (`TopKGating.topk_fn`) built on `jax.lax.approx_max_k`.

    Args:
        operand: Scores [..., E].
        k: How many to keep.
        recall_target: The expected recall of the approximate search (exact on CPU).

    Returns:
        (values, indices), each [..., k], best first.
    """
    return jax.lax.approx_max_k(operand, k, recall_target=recall_target)


def _compute_expert_capacity(
    *,
    group_size: int,
    num_experts: int,
    expert_capacity: Optional[int],
    capacity_factor: Optional[float],
) -> int:
    """The per-group slots of an expert: int(group_size * capacity_factor / num_experts).

    `expert_capacity`, when set, is a lower bound (and the capacity when no factor is given).

    Args:
        group_size: Tokens per group.
        num_experts: Number of experts.
        expert_capacity: Optional lower bound.
        capacity_factor: Optional capacity factor.

    Returns:
        The capacity, at least 1.

    Raises:
        ValueError: If neither `capacity_factor` nor `expert_capacity` is set.
    """
    if not (capacity_factor or expert_capacity):
        raise ValueError(
            "expert capacity: set capacity_factor or expert_capacity (both are 0/None)"
        )
    capacity = expert_capacity or 1
    if capacity_factor:
        capacity = max(capacity, int(group_size * capacity_factor / num_experts))
    return capacity


def _cap_logits(logits: Tensor, gating_logit_cap: float) -> Tensor:
    """cap * tanh(logits / cap) if cap > 0 else logits."""
    if gating_logit_cap and gating_logit_cap > 0:
        return gating_logit_cap * jnp.tanh(logits / gating_logit_cap)
    return logits


def _router_z_loss(logits: Tensor) -> Tensor:
    """mean(logsumexp(logits, -1)^2)."""
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)


def _over_capacity_ratio(mask: Tensor, position: Tensor, capacity: int) -> Tensor:
    """Fraction of the choices in `mask` [..., S, E] whose slot `position` is >= capacity."""
    over = jnp.sum((mask * position >= capacity) * mask).astype(jnp.float32)
    return over / jnp.maximum(1.0, jnp.sum(mask).astype(jnp.float32))


def _route_with_capacity(
    indices: Tensor, gates: Tensor, *, num_experts: int, capacity: int
) -> tuple[Tensor, list[Tensor]]:
    """Builds the [O, G, S, E, C] combine tensor of top-k choices within a capacity.

    Args:
        indices: Int [O, G, S, k]: the experts chosen by each token, best first.
        gates: Float [O, G, S, k]: their (normalized) gates.
        num_experts: E.
        capacity: C.

    Returns:
        (combine tensor, the over-capacity ratio of each choice).
    """
    counts = jnp.zeros(indices.shape[:-2] + (1, num_experts), jnp.int32)
    combine = jnp.zeros(indices.shape[:-1] + (num_experts, capacity), jnp.float32)
    over_capacity = []
    for j in range(indices.shape[-1]):
        mask = jax.nn.one_hot(indices[..., j], num_experts, dtype=jnp.int32)  # [O, G, S, E].
        position = jnp.cumsum(mask, axis=-2) - mask + counts  # Slot of each token in expert.
        counts = counts + jnp.sum(mask, axis=-2, keepdims=True)
        over_capacity.append(_over_capacity_ratio(mask, position, capacity))
        mask = mask * (position < capacity)
        slot = jax.nn.one_hot(jnp.sum(position * mask, axis=-1), capacity)  # [O, G, S, C].
        gate = gates[..., j] * jnp.sum(mask, axis=-1)  # 0 where dropped.
        combine = combine + gate[..., None, None] * mask[..., None] * slot[..., None, :]
    return combine, over_capacity


class BaseGating(BaseLayer):
    """The interface of routers: forward(logits [O, G, S, E]) -> Output."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseGating."""

        num_experts: Required[int] = REQUIRED  # Number of experts (set by the MoE layer).

    class Output(NamedTuple):
        """Routing of a capacity-based router.

        Fields:
            combine_tensor: Float [O, G, S, E, C]: gate of token s in slot c of expert e.
            dispatch_tensor: Bool [O, G, S, E, C]: whether token s occupies that slot.
            load_balance_loss: Scalar.
            router_z_loss: Scalar.
        """

        combine_tensor: Tensor
        dispatch_tensor: Tensor
        load_balance_loss: Optional[Tensor] = None
        router_z_loss: Optional[Tensor] = None

    def forward(self, logits: Tensor) -> Any:
        """Routes router logits [O, G, S, E]."""
        raise NotImplementedError(type(self))

    def _top_k(self, scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """(values, indices) [..., k] of the k best scores."""
        return jax.lax.top_k(scores, k)

    def _compute_index(self, raw_gates: Tensor, *, k: int) -> Tensor:
        """The k experts [..., k] chosen for each token from its scores [..., E], best first.

        The one routing hook: a subclass may override it to force an assignment; the gates are
        then read from `raw_gates` at the returned indices.
        """
        return self._top_k(raw_gates, k)[1]

    def _gates(self, raw_gates: Tensor, *, k: int) -> tuple[Tensor, Tensor]:
        """(normalized gates [..., k], indices [..., k]); publishes "gate_assignment"."""
        indices = self._compute_index(raw_gates, k=k)
        self.add_module_output("gate_assignment", indices)
        gates = jnp.take_along_axis(raw_gates, indices, axis=-1)
        return gates / (jnp.sum(gates, axis=-1, keepdims=True) + 1e-9), indices


class AdaptiveLoadBalanceLoss(BaseLayer):
    """A scale for the load-balance loss that keeps a monitored value inside [min, max].

    Each training call adds `value` to a moving average; while the average is below `min_value`
    the scale shrinks by the factor (1 - adjustment_rate) per call, above `max_value` it grows by
    (1 + adjustment_rate), and inside the range it stays. Returns the new scale (state "scale",
    initially 1); summaries "value_average" and "scale".
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures AdaptiveLoadBalanceLoss."""

        # The moving average of the monitored value.
        moving_average: InstantiableConfig = MovingAverage.default_config()
        min_value: Required[float] = REQUIRED  # Lower end of the target range.
        max_value: Required[float] = REQUIRED  # Upper end of the target range.
        adjustment_rate: float = 0.01  # Relative change of the scale per call outside the range.

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not cfg.min_value < cfg.max_value:
            raise ValueError(
                f"{self.path()}: min_value={cfg.min_value} must be < max_value={cfg.max_value}"
            )
        self._add_child("moving_average", cfg.moving_average)

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        return dict(
            scale=ParameterSpec(
                shape=(),
                dtype=jnp.float32,
                mesh_axes=(),
                initializer=ConstantInitializer.default_config().set(value=1.0).instantiate(),
                weight_decay_scale=0,
            )
        )

    def forward(self, value: Tensor) -> Tensor:
        """Updates the average with `value` and returns the adjusted scale.

        Args:
            value: A scalar (e.g. the over-capacity ratio).

        Returns:
            The scale to multiply the loss with.
        """
        cfg = self.config
        average = self.moving_average(jnp.asarray(value, jnp.float32))
        scale = self.parameters["scale"]
        scale = jnp.where(
            average < cfg.min_value,
            scale * (1 - cfg.adjustment_rate),
            jnp.where(average > cfg.max_value, scale * (1 + cfg.adjustment_rate), scale),
        )
        self.add_state_update("scale", scale)
        self.add_summary("value_average", average)
        self.add_summary("scale", scale)
        return scale


class Top2Gating(BaseGating):
    """GShard top-2 routing: softmax probabilities, the two most likely experts per token.

    Load balance loss uses first choices only. Summaries: load_balance_loss (and
    load_balance_loss_original with an adaptive scale), router_z_loss, dispatch_{0,1,2} (tokens
    sent to 0/1/2 experts) and over_capacity_{1,2} (dropped fraction of first/second choices).
    """

    @config_class
    class Config(BaseGating.Config):
        """Configures Top2Gating."""

        # Soft cap of the logits: cap * tanh(logits / cap); 0 disables.
        gating_logit_cap: float = 0.0
        mask_dtype: Any = jnp.int32  # Dtype of the routing masks.
        # Capacity factor in training and in evaluation (slots = group_size * factor / E).
        train_capacity_factor: float = 2.0
        eval_capacity_factor: float = 2.0
        # Optional lower bound of the per-group capacity of an expert.
        expert_capacity: Optional[int] = None
        # Optional adaptive scale of the load-balance loss, driven by the over-capacity ratio.
        adaptive_load_balance_loss: Optional[InstantiableConfig] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.adaptive_load_balance_loss is not None:
            self._add_child("adaptive_load_balance_loss", cfg.adaptive_load_balance_loss)

    def _capacity(self, group_size: int) -> int:
        cfg = self.config
        factor = cfg.train_capacity_factor if self.is_training else cfg.eval_capacity_factor
        return _compute_expert_capacity(
            group_size=group_size,
            num_experts=cfg.num_experts,
            expert_capacity=cfg.expert_capacity,
            capacity_factor=factor,
        )

    def forward(self, logits: Tensor) -> BaseGating.Output:
        """Routes logits [O, G, S, E] to the top-2 experts (see the class docstring)."""
        cfg = self.config
        logits = _cap_logits(logits.astype(jnp.float32), cfg.gating_logit_cap)
        num_experts = logits.shape[-1]
        probs = jax.nn.softmax(logits, axis=-1)
        gates, indices = self._gates(probs, k=min(2, num_experts))
        capacity = self._capacity(logits.shape[-2])
        combine, over_capacity = _route_with_capacity(
            indices, gates, num_experts=num_experts, capacity=capacity
        )
        dispatch = combine > 0
        first = jax.nn.one_hot(indices[..., 0], num_experts, dtype=jnp.float32)
        density = jnp.mean(first, axis=-2)
        density_proxy = jnp.mean(probs, axis=-2)
        load_balance_loss = jnp.mean(density * density_proxy) * num_experts**2
        router_z_loss = _router_z_loss(logits)
        count = jnp.sum(dispatch.astype(jnp.int32), axis=(-2, -1))
        for n in range(3):
            self.add_summary(f"dispatch_{n}", jnp.sum(count == n))
        for j, ratio in enumerate(over_capacity):
            self.add_summary(f"over_capacity_{j + 1}", ratio)
        if cfg.adaptive_load_balance_loss is not None:
            self.add_summary("load_balance_loss_original", load_balance_loss)
            load_balance_loss = load_balance_loss * self.adaptive_load_balance_loss(
                jnp.max(jnp.stack(over_capacity))
            )
        self.add_summary("load_balance_loss", load_balance_loss)
        self.add_summary("router_z_loss", router_z_loss)
        return self.Output(
            combine_tensor=combine,
            dispatch_tensor=dispatch,
            load_balance_loss=load_balance_loss,
            router_z_loss=router_z_loss,
        )


class TopKGating(BaseGating):
    """Top-k routing within per-group capacities (k = `num_experts_per_token`).

    Scores are softmax(logits) (or `score_fn(x=logits)`); the k best experts per token are
    chosen by `jax.lax.top_k` (or `topk_fn(operand=scores, k=k)`), optionally after Gumbel noise
    on the logits (`noisy_gating`, also in evaluation). Capacity factor None means k.
    """

    @config_class
    class Config(BaseGating.Config):
        """Configures TopKGating."""

        num_experts_per_token: int = 2  # k: experts per token.
        # Soft cap of the logits: cap * tanh(logits / cap); 0 disables.
        gating_logit_cap: float = 0.0
        # Capacity factors in training / evaluation; None: num_experts_per_token.
        train_capacity_factor: Optional[float] = None
        eval_capacity_factor: Optional[float] = None
        # Optional lower bound of the per-group capacity of an expert.
        expert_capacity: Optional[int] = None
        # Optional config of a score function fn(x=logits) -> scores; None: softmax.
        score_fn: Optional[InstantiableConfig] = None
        # Optional config of a top-k function fn(operand, k) -> (values, indices).
        topk_fn: Optional[InstantiableConfig] = None
        # Optional noise on the logits before the choice (a GateNoise).
        noisy_gating: Optional[GateNoise] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not 1 <= cfg.num_experts_per_token <= cfg.num_experts:
            raise ValueError(
                f"{self.path()}.num_experts_per_token={cfg.num_experts_per_token} must be in "
                f"[1, num_experts={cfg.num_experts}]"
            )

    def _score(self, logits: Tensor, axis: int = -1) -> Tensor:
        """Scores of router logits: `score_fn` or softmax over `axis`."""
        if self.config.score_fn is None:
            return jax.nn.softmax(logits, axis=axis)
        return self.config.score_fn.instantiate(x=logits)

    def _top_k(self, scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """(values, indices) [..., k] of the k best scores (`topk_fn` if set)."""
        if self.config.topk_fn is None:
            return jax.lax.top_k(scores, k)
        return self.config.topk_fn.instantiate(operand=scores, k=k)

    def _process_logits(self, logits: Tensor) -> Tensor:
        """float32, capped, plus the configured noise."""
        cfg = self.config
        logits = _cap_logits(logits.astype(jnp.float32), cfg.gating_logit_cap)
        if cfg.noisy_gating == GateNoise.GUMBEL:
            u = jax.random.uniform(
                self.prng_key, logits.shape, jnp.float32, minval=1e-9, maxval=1.0
            )
            logits = logits - jnp.log(-jnp.log(u))
        elif cfg.noisy_gating is not None:
            raise NotImplementedError(f"{self.path()}.noisy_gating={cfg.noisy_gating}")
        return logits

    def _select(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Returns (processed logits, scores, normalized gates [..., k], indices [..., k])."""
        logits = self._process_logits(logits)
        scores = self._score(logits)
        gates, indices = self._gates(scores, k=self.config.num_experts_per_token)
        return logits, scores, gates, indices

    def _load_balance_loss(self, scores: Tensor, indices: Tensor) -> Tensor:
        """E * sum_e f_e * P_e over the last two axes, averaged; f_e over all k choices."""
        num_experts = scores.shape[-1]
        k = indices.shape[-1]
        assigned = jnp.sum(jax.nn.one_hot(indices, num_experts, dtype=jnp.float32), axis=-2)
        density = jnp.mean(assigned, axis=-2) / k
        density_proxy = jnp.mean(scores, axis=-2)
        return jnp.mean(jnp.sum(density * density_proxy, axis=-1)) * num_experts

    def forward(self, logits: Tensor) -> BaseGating.Output:
        """Routes logits [O, G, S, E] to the top-k experts (see the class docstring)."""
        cfg = self.config
        logits, scores, gates, indices = self._select(logits)
        factor = cfg.train_capacity_factor if self.is_training else cfg.eval_capacity_factor
        if factor is None:
            factor = cfg.num_experts_per_token
        capacity = _compute_expert_capacity(
            group_size=logits.shape[-2],
            num_experts=cfg.num_experts,
            expert_capacity=cfg.expert_capacity,
            capacity_factor=factor,
        )
        combine, over_capacity = _route_with_capacity(
            indices, gates, num_experts=logits.shape[-1], capacity=capacity
        )
        load_balance_loss = self._load_balance_loss(scores, indices)
        router_z_loss = _router_z_loss(logits)
        self.add_summary("load_balance_loss", load_balance_loss)
        self.add_summary("router_z_loss", router_z_loss)
        self.add_summary("over_capacity", jnp.max(jnp.stack(over_capacity)))
        return self.Output(
            combine_tensor=combine,
            dispatch_tensor=combine > 0,
            load_balance_loss=load_balance_loss,
            router_z_loss=router_z_loss,
        )


class TopKDropFreeGating(TopKGating):
    """Top-k routing without capacity: every token reaches its k experts (grouped matmul layer).

    forward(logits [..., S, E]) returns `Output(gate_assignment [..., S, k] expert ids,
    expert_weights [..., S, k] normalized gates, load_balance_loss, router_z_loss,
    seq_load_balance_loss)`. The sequence-wise load balance loss (when its weight is set) is the
    load balance loss computed per sequence (axis -2) and averaged.
    """

    @config_class
    class Config(TopKGating.Config):
        """Configures TopKDropFreeGating."""

        train_capacity_factor: Optional[float] = 0  # Unused: no capacity.

    class Output(NamedTuple):
        """Drop-free routing.

        Fields:
            gate_assignment: Int [..., S, k]: the chosen experts, best first.
            expert_weights: Float [..., S, k]: their normalized gates.
            load_balance_loss: Scalar.
            router_z_loss: Scalar.
            seq_load_balance_loss: Scalar or None.
        """

        gate_assignment: Tensor
        expert_weights: Tensor
        load_balance_loss: Tensor
        router_z_loss: Tensor
        seq_load_balance_loss: Optional[Tensor] = None

    def _seq_load_balance_loss(self, scores: Tensor, indices: Tensor) -> Tensor:
        """The load balance loss of each sequence (rows of [B, S, E]), averaged."""
        scores = scores.reshape((-1,) + scores.shape[-2:])
        indices = indices.reshape((-1,) + indices.shape[-2:])
        return self._load_balance_loss(scores, indices)

    def forward(
        self, logits: Tensor, seq_load_balance_loss_weight: Optional[float] = None
    ) -> "TopKDropFreeGating.Output":
        """Routes logits [..., S, E] (see the class docstring)."""
        logits, scores, gates, indices = self._select(logits)
        load_balance_loss = self._load_balance_loss(
            scores.reshape((1, -1, scores.shape[-1])), indices.reshape((1, -1, indices.shape[-1]))
        )
        router_z_loss = _router_z_loss(logits)
        self.add_summary("load_balance_loss", load_balance_loss)
        self.add_summary("router_z_loss", router_z_loss)
        seq_loss = None
        if seq_load_balance_loss_weight:
            seq_loss = self._seq_load_balance_loss(scores, indices)
            self.add_summary("seq_load_balance_loss", seq_loss)
        return self.Output(
            gate_assignment=indices,
            expert_weights=gates,
            load_balance_loss=load_balance_loss,
            router_z_loss=router_z_loss,
            seq_load_balance_loss=seq_loss,
        )


class TopKBiasGating(TopKDropFreeGating):
    """Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias steers the choice only.

    The k experts are chosen by score + gate_bias; the gates use the unbiased scores. In
    training, after each step the bias moves by `bias_update_rate` toward balance: + for experts
    that got fewer than the mean number of choices, - for those that got more (sign of the gap;
    state "gate_bias", not trained by gradients).
    """

    @config_class
    class Config(TopKDropFreeGating.Config):
        """Configures TopKBiasGating."""

        bias_update_rate: float = 0.001  # Step of the bias update.

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        return dict(
            gate_bias=ParameterSpec(
                shape=(self.config.num_experts,),
                dtype=jnp.float32,
                mesh_axes=(None,),
                initializer=ConstantInitializer.default_config().set(value=0.0).instantiate(),
                weight_decay_scale=0,
            )
        )

    def _compute_index(self, raw_gates: Tensor, *, k: int) -> Tensor:
        """Top-k of scores + gate_bias; in training also updates the bias (see class doc)."""
        cfg = self.config
        bias = jax.lax.stop_gradient(self.parameters["gate_bias"])
        indices = self._top_k(raw_gates + bias, k)[1]
        if self.is_training:
            counts = jnp.sum(
                jax.nn.one_hot(indices, cfg.num_experts, dtype=jnp.float32),
                axis=tuple(range(indices.ndim)),
            )
            gap = jnp.mean(counts) - counts
            self.add_state_update(
                "gate_bias", self.parameters["gate_bias"] + cfg.bias_update_rate * jnp.sign(gap)
            )
        return indices


def expert_capacity_for(gating: BaseGating, group_size: int) -> int:
    """The capacity `gating` uses for groups of `group_size` tokens in its current mode."""
    cfg = gating.config
    if isinstance(gating, TopKGating):
        factor = cfg.train_capacity_factor if gating.is_training else cfg.eval_capacity_factor
        factor = cfg.num_experts_per_token if factor is None else factor
    else:
        factor = cfg.train_capacity_factor if gating.is_training else cfg.eval_capacity_factor
    return _compute_expert_capacity(
        group_size=group_size,
        num_experts=cfg.num_experts,
        expert_capacity=cfg.expert_capacity,
        capacity_factor=factor,
    )


__all__ = [
    "AdaptiveLoadBalanceLoss",
    "BaseGating",
    "GateNoise",
    "Top2Gating",
    "TopKBiasGating",
    "TopKDropFreeGating",
    "TopKGating",
    "approx_max_k",
    "sigmoid",
]
