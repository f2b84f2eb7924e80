"""Low-Rank Adaptation (LoRA): a trainable low-rank update beside a frozen projection.

A LoRA layer wraps an original projection (`layer`) and adds an `adapter` in parallel:

    y = layer(x) + (alpha / rank) * lora_up(lora_down(dropout(x)))

`lora_down` maps the input to `rank` features (the paper's A matrix, fan-scaled init) and
`lora_up` maps them back (B, initialized to zero), so a fresh adapter leaves the layer's output
unchanged and the merged weight is `W + (alpha / rank) * A @ B`.

References: LoRA (https://arxiv.org/abs/2106.09685); its generalized form
(https://arxiv.org/abs/2110.04366); Microsoft's PyTorch implementation (`loralib`), whose fused
`MergedLinear` the fused QKV adapter reproduces.

Parameter paths: `<proj>/layer/...` holds the original projection's parameters and
`<proj>/adapter/lora_down/weight`, `<proj>/adapter/lora_up/weight` the adapter's, so freezing
everything but `.*/adapter/.*` trains only the adapters (see
`axlearn.experiments.text.gpt.fuji_lora`).
"""

from typing import Optional

import jax.numpy as jnp

from axlearn.common.attention import (
    BaseMultiheadLinear,
    BaseQKVLinear,
    FusedQKVLinear,
    MultiheadOutputLinear,
)
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.layers import Dropout, Linear
from axlearn.common.module import Module
from axlearn.common.param_init import (
    PARAM_REGEXP_WEIGHT,
    ConstantInitializer,
    DefaultInitializer,
    FanAxes,
)
from axlearn.common.utils import Tensor

__all__ = [
    "LoraDownFusedLinear",
    "LoraDownMultiheadLinear",
    "LoraFusedQKVAdapter",
    "LoraFusedQKVLinear",
    "LoraLinear",
    "LoraLinearAdapter",
    "LoraMultiheadOutputAdapter",
    "LoraMultiheadOutputLinear",
    "LoraUpFusedGroupedLinear",
    "LoraUpFusedLinear",
]

# The q/k/v names of `LoraFusedQKVAdapter.Config.enable_lora`, in projection order.
_QKV_NAMES = ("query", "key", "value")


def _zero_weight_init() -> DefaultInitializer.Config:
    """An initializer config that sets every "*weight" parameter to zero (LoRA's B matrix)."""
    return DefaultInitializer.default_config().set(
        init_by_param_name={
            PARAM_REGEXP_WEIGHT: ConstantInitializer.default_config().set(value=0.0)
        }
    )


class _BaseLoraAdapter(BaseLayer):
    """The common part of LoRA adapters: rank/alpha, input dropout, down and up projections."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures _BaseLoraAdapter."""

        # The input feature dim.
        input_dim: Required[int] = REQUIRED
        # The output feature dim.
        output_dim: Required[int] = REQUIRED
        # The rank of the update: 0 < rank <= min(input_dim, output_dim), usually much smaller.
        rank: Required[int] = REQUIRED
        # The adapter's output is scaled by alpha / rank.
        alpha: Required[float] = REQUIRED
        # Dropout of the adapter's input (rate set explicitly, so that
        # `set_dropout_rate_recursively(..., set_only_if_none=True)` leaves it alone).
        dropout: Dropout.Config = Dropout.default_config().set(rate=0.0)
        # The down projection input_dim -> rank (the paper's A matrix).
        lora_down: InstantiableConfig = Linear.default_config()
        # The up projection rank -> output_dim (the paper's B matrix, zero-initialized).
        lora_up: InstantiableConfig = Linear.default_config()

    @property
    def scaling(self) -> float:
        """The factor alpha / rank applied to the adapter's output."""
        cfg = self.config
        return cfg.alpha / cfg.rank if cfg.rank > 0 else 1

    def _is_valid_config(self) -> None:
        cfg = self.config
        if cfg.rank <= 0:
            raise ValueError(
                f"{self.path()}.rank must be > 0, got {cfg.rank}; set a positive rank."
            )
        if cfg.rank > cfg.input_dim:
            raise ValueError(
                f"{self.path()}.rank {cfg.rank} is greater than input_dim {cfg.input_dim}; "
                "use a rank <= input_dim."
            )
        if cfg.rank > cfg.output_dim:
            raise ValueError(
                f"{self.path()}.rank {cfg.rank} is greater than output_dim {cfg.output_dim}; "
                "use a rank <= output_dim."
            )

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._is_valid_config()
        self._add_child("lora_dropout", cfg.dropout)

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns scaling * lora_up(lora_down(dropout(inputs)))."""
        outputs = self.lora_down(self.lora_dropout(inputs))
        outputs = self.lora_up(outputs)
        return outputs * self.scaling


class LoraLinearAdapter(_BaseLoraAdapter):
    """The adapter beside a `Linear` layer: [..., input_dim] -> [..., output_dim]."""

    def __init__(self, cfg: _BaseLoraAdapter.Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "lora_down", cfg.lora_down.set(input_dim=cfg.input_dim, output_dim=cfg.rank, bias=False)
        )
        self._add_child(
            "lora_up",
            cfg.lora_up.set(
                input_dim=cfg.rank,
                output_dim=cfg.output_dim,
                param_init=_zero_weight_init(),
                bias=False,
            ),
        )


class LoraDownFusedLinear(BaseLayer):
    """The fused down projection of `LoraFusedQKVAdapter`: weight [input_dim, num_enabled, rank].

    Maps [batch, seq, input_dim] to [num_enabled, batch, seq, rank] in one einsum.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures LoraDownFusedLinear."""

        input_dim: Required[int] = REQUIRED  # Input feature dim.
        num_enabled: Required[int] = REQUIRED  # Number of enabled q/k/v adapters.
        output_dim: Required[int] = REQUIRED  # Output feature dim (the LoRA rank).

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.param_partition_spec = (None, None, "model")
        return cfg

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        return dict(
            weight=ParameterSpec(
                shape=(cfg.input_dim, cfg.num_enabled, cfg.output_dim),
                mesh_axes=cfg.param_partition_spec,
            )
        )

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns [num_enabled, batch, seq, rank]."""
        return jnp.einsum("btd,dsr->sbtr", inputs, self.parameters["weight"])

    def _compute_fan_axes(self, name: str, parameter_spec: ParameterSpec) -> Optional[FanAxes]:
        if name == "weight":
            return FanAxes(in_axis=0, out_axis=(1, 2))
        return None


class LoraUpFusedLinear(BaseLayer):
    """The fused up projection of `LoraFusedQKVAdapter`: weight
    [num_enabled, rank, num_heads, per_head_dim].

    Maps [num_enabled, batch, seq, rank] to [num_enabled, batch, seq, num_heads, per_head_dim].
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures LoraUpFusedLinear."""

        input_dim: Required[int] = REQUIRED  # Input feature dim (the LoRA rank).
        num_enabled: Required[int] = REQUIRED  # Number of enabled q/k/v adapters.
        num_heads: Required[int] = REQUIRED  # Number of attention heads.
        per_head_dim: Required[int] = REQUIRED  # Dimension per head.

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        # Shard the heads axis over the 'model' mesh axis.
        cfg.param_partition_spec = (None, None, "model", None)
        return cfg

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        return dict(
            weight=ParameterSpec(
                shape=(cfg.num_enabled, cfg.input_dim, cfg.num_heads, cfg.per_head_dim),
                mesh_axes=cfg.param_partition_spec,
            )
        )

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns [num_enabled, batch, seq, num_heads, per_head_dim]."""
        return jnp.einsum("sbtr,srnh->sbtnh", inputs, self.parameters["weight"])

    def _compute_fan_axes(self, name: str, parameter_spec: ParameterSpec) -> Optional[FanAxes]:
        if name == "weight":
            return FanAxes(in_axis=1, out_axis=(2, 3))
        return None


class LoraUpFusedGroupedLinear(BaseLayer):
    """The up projection of `LoraFusedQKVAdapter` beside a grouped-query projection (ours).

    Query heads and key/value heads differ in number under grouped-query attention, so each
    enabled projection has its own weight, `query_weight` [rank, num_heads, per_head_dim] and
    `key_weight`/`value_weight` [rank, num_kv_heads, per_head_dim]. Maps the fused down output
    [num_enabled, batch, seq, rank] to a list of num_enabled projections
    [batch, seq, heads, per_head_dim], in query, key, value order.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures LoraUpFusedGroupedLinear."""

        input_dim: Required[int] = REQUIRED  # Input feature dim (the LoRA rank).
        num_enabled: Required[int] = REQUIRED  # Number of enabled q/k/v adapters.
        num_heads: Required[int] = REQUIRED  # Number of query heads.
        per_head_dim: Required[int] = REQUIRED  # Dimension per head.
        num_kv_heads: Required[int] = REQUIRED  # Number of key/value heads.
        # Which of query/key/value have an adapter (set by LoraFusedQKVAdapter).
        enable_lora: Required[dict[str, bool]] = REQUIRED

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        # Shard the heads axis over the 'model' mesh axis.
        cfg.param_partition_spec = (None, "model", None)
        return cfg

    def _enabled(self) -> list[str]:
        return [name for name in _QKV_NAMES if self.config.enable_lora[name]]

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        params = {}
        for name in self._enabled():
            heads = cfg.num_heads if name == "query" else cfg.num_kv_heads
            params[f"{name}_weight"] = ParameterSpec(
                shape=(cfg.input_dim, heads, cfg.per_head_dim),
                mesh_axes=cfg.param_partition_spec,
            )
        return params

    def forward(self, inputs: Tensor) -> list[Tensor]:
        """Returns one [batch, seq, heads, per_head_dim] per enabled projection."""
        return [
            jnp.einsum("btr,rnh->btnh", inputs[i], self.parameters[f"{name}_weight"])
            for i, name in enumerate(self._enabled())
        ]

    def _compute_fan_axes(self, name: str, parameter_spec: ParameterSpec) -> Optional[FanAxes]:
        if name.endswith("weight"):
            return FanAxes(in_axis=0, out_axis=(1, 2))
        return None


class LoraDownMultiheadLinear(BaseMultiheadLinear):
    """The down projection of `LoraMultiheadOutputAdapter`: weight [rank, num_heads, per_head_dim].

    Maps [batch, seq, num_heads, per_head_dim] to [batch, seq, rank] (`model_dim` is the rank).
    """

    def _weight_fan_axes(self) -> FanAxes:
        return FanAxes(in_axis=(1, 2), out_axis=0)

    def _bias_spec(self, cfg) -> ParameterSpec:
        return ParameterSpec(shape=(cfg.model_dim,), mesh_axes=tuple(cfg.param_partition_spec)[:1])

    def _compute_fan_axes(self, name: str, parameter_spec: ParameterSpec) -> Optional[FanAxes]:
        if name == "weight":
            return self._weight_fan_axes()
        return None

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns [batch, seq, rank]."""
        return self._project("btnh,rnh->btr", inputs)


class LoraMultiheadOutputAdapter(_BaseLoraAdapter):
    """The adapter beside a `MultiheadOutputLinear`: [b, t, heads, per_head_dim] -> [b, t, dim]."""

    @config_class
    class Config(_BaseLoraAdapter.Config):
        """Configures LoraMultiheadOutputAdapter."""

        num_heads: Required[int] = REQUIRED  # Number of attention heads of the input.

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.lora_down = LoraDownMultiheadLinear.default_config()
        return cfg

    @property
    def _per_head_dim(self) -> int:
        cfg = self.config
        return cfg.output_dim // cfg.num_heads

    def _is_valid_config(self) -> None:
        super()._is_valid_config()
        cfg = self.config
        if cfg.output_dim != cfg.input_dim:
            raise ValueError(
                f"{self.path()}: input_dim {cfg.input_dim} must equal output_dim "
                f"{cfg.output_dim} (num_heads * per_head_dim == model_dim)."
            )
        if cfg.output_dim % cfg.num_heads != 0:
            raise ValueError(
                f"{self.path()}: output_dim {cfg.output_dim} is not divisible by num_heads "
                f"{cfg.num_heads}."
            )

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "lora_down",
            cfg.lora_down.set(
                model_dim=cfg.rank,
                num_heads=cfg.num_heads,
                per_head_dim=self._per_head_dim,
                bias=False,
            ),
        )
        self._add_child(
            "lora_up",
            cfg.lora_up.set(
                input_dim=cfg.rank,
                output_dim=cfg.output_dim,
                bias=False,
                param_init=_zero_weight_init(),
            ),
        )


class LoraFusedQKVAdapter(_BaseLoraAdapter):
    """The adapter beside a fused QKV projection, as `loralib`'s `MergedLinear`.

    Only the projections enabled in `enable_lora` get an adapter: the input [b, t, input_dim] is
    projected to [s, b, t, rank] (s = number of enabled projections, 0 < s <= 3), then up to
    [s, b, t, num_heads, per_head_dim] (output_dim = num_heads * per_head_dim). With
    `num_kv_heads` set (grouped-query attention; ours), `lora_up` must be a
    `LoraUpFusedGroupedLinear` and the output is a list of s per-projection tensors.
    """

    @config_class
    class Config(_BaseLoraAdapter.Config):
        """Configures LoraFusedQKVAdapter."""

        # Which projections get an adapter: keys exactly "query", "key", "value"; bool values.
        enable_lora: Required[dict[str, bool]] = REQUIRED
        # Number of (query) attention heads.
        num_heads: Required[int] = REQUIRED
        # Number of key/value heads (grouped-query attention, ours); None: num_heads.
        num_kv_heads: Optional[int] = None

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.lora_down = LoraDownFusedLinear.default_config()
        cfg.lora_up = LoraUpFusedLinear.default_config()
        return cfg

    @property
    def _per_head_dim(self) -> int:
        cfg = self.config
        return cfg.output_dim // cfg.num_heads

    @property
    def _num_enabled(self) -> int:
        return sum(self.config.enable_lora.values())

    def _is_grouped(self) -> bool:
        cfg = self.config
        return cfg.num_kv_heads is not None and cfg.num_kv_heads != cfg.num_heads

    def _is_valid_config(self) -> None:
        super()._is_valid_config()
        cfg = self.config
        if not isinstance(cfg.enable_lora, dict) or set(cfg.enable_lora) != set(_QKV_NAMES):
            raise ValueError(
                f"{self.path()}.enable_lora must have exactly the keys query, key, value; got "
                f"{cfg.enable_lora!r}."
            )
        if not all(isinstance(v, bool) for v in cfg.enable_lora.values()):
            raise ValueError(
                f"{self.path()}.enable_lora values must be bools, got {cfg.enable_lora!r}."
            )
        if self._num_enabled == 0:
            raise ValueError(
                f"{self.path()}.enable_lora enables no projection ({cfg.enable_lora!r}); enable "
                "at least one of query, key, value."
            )
        if cfg.output_dim % cfg.num_heads != 0:
            raise ValueError(
                f"{self.path()}: output_dim {cfg.output_dim} is not divisible by num_heads "
                f"{cfg.num_heads}."
            )
        kv_enabled = cfg.enable_lora["key"] or cfg.enable_lora["value"]
        grouped_up = issubclass(cfg.lora_up.klass, LoraUpFusedGroupedLinear)
        if self._is_grouped() and kv_enabled and not grouped_up:
            raise ValueError(
                f"{self.path()}: num_kv_heads {cfg.num_kv_heads} != num_heads {cfg.num_heads} "
                "with a key/value adapter needs lora_up=LoraUpFusedGroupedLinear.default_config()."
            )

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "lora_down",
            cfg.lora_down.set(
                input_dim=cfg.input_dim, output_dim=cfg.rank, num_enabled=self._num_enabled
            ),
        )
        up_cfg = cfg.lora_up.set(
            input_dim=cfg.rank,
            num_heads=cfg.num_heads,
            per_head_dim=self._per_head_dim,
            num_enabled=self._num_enabled,
            param_init=_zero_weight_init(),
        )
        if issubclass(up_cfg.klass, LoraUpFusedGroupedLinear):
            up_cfg.set(
                num_kv_heads=cfg.num_kv_heads if cfg.num_kv_heads is not None else cfg.num_heads,
                enable_lora=dict(cfg.enable_lora),
            )
        self._add_child("lora_up", up_cfg)

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns scaling * [num_enabled, b, t, heads, per_head_dim] (a list when grouped)."""
        outputs = self.lora_up(self.lora_down(self.lora_dropout(inputs)))
        if isinstance(outputs, list):
            return [x * self.scaling for x in outputs]
        return outputs * self.scaling


class LoraLinear(BaseLayer):
    """LoRA's replacement of `Linear`: `layer(x) + adapter(x)`."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures LoraLinear."""

        input_dim: Required[int] = REQUIRED  # Input feature dim.
        output_dim: Required[int] = REQUIRED  # Output feature dim.
        # The original linear layer.
        layer: Linear.Config = Linear.default_config()
        # The LoRA adapter (set its rank and alpha).
        adapter: LoraLinearAdapter.Config = LoraLinearAdapter.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("layer", cfg.layer.set(input_dim=cfg.input_dim, output_dim=cfg.output_dim))
        self._add_child(
            "adapter", cfg.adapter.set(input_dim=cfg.input_dim, output_dim=cfg.output_dim)
        )

    def forward(self, x: Tensor) -> Tensor:
        """Returns layer(x) + adapter(x), [..., output_dim]."""
        return self.layer(x) + self.adapter(x)


class LoraMultiheadOutputLinear(BaseLayer):
    """LoRA's replacement of `MultiheadOutputLinear`: `layer(x) + adapter(x)`."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures LoraMultiheadOutputLinear."""

        model_dim: Required[int] = REQUIRED  # Output feature dim.
        num_heads: Required[int] = REQUIRED  # Number of attention heads.
        per_head_dim: Required[int] = REQUIRED  # Dimension per head.
        # The original output projection.
        layer: MultiheadOutputLinear.Config = MultiheadOutputLinear.default_config()
        # The LoRA adapter (set its rank and alpha).
        adapter: LoraMultiheadOutputAdapter.Config = LoraMultiheadOutputAdapter.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "layer",
            cfg.layer.set(
                model_dim=cfg.model_dim, num_heads=cfg.num_heads, per_head_dim=cfg.per_head_dim
            ),
        )
        self._add_child(
            "adapter",
            cfg.adapter.set(
                input_dim=cfg.model_dim, output_dim=cfg.model_dim, num_heads=cfg.num_heads
            ),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Returns layer(x) + adapter(x), [batch, seq, model_dim]."""
        return self.layer(x) + self.adapter(x)


class LoraFusedQKVLinear(BaseQKVLinear):
    """LoRA's replacement of a QKV projection: `layer`'s q/k/v plus the enabled adapters.

    Self-attention only (key and value None); query_dim == key_dim == value_dim and the
    adapter's output_dim is num_heads * per_head_dim. With a grouped `layer` (one with
    `num_kv_heads`), the adapter gets that number of key/value heads.
    """

    @config_class
    class Config(BaseQKVLinear.Config):
        """Configures LoraFusedQKVLinear."""

        # The original QKV projection.
        layer: BaseQKVLinear.Config = FusedQKVLinear.default_config()
        # The LoRA adapter (set its rank, alpha and enable_lora).
        adapter: LoraFusedQKVAdapter.Config = LoraFusedQKVAdapter.default_config()

    @classmethod
    def is_kv_sharing(cls, cfg: Config) -> bool:
        """Whether the wrapped layer takes its keys/values from a `kv_state`."""
        return cfg.layer.klass.is_kv_sharing(cfg.layer)

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not cfg.query_dim == cfg.key_dim == cfg.value_dim:
            raise ValueError(
                f"{self.path()}: LoraFusedQKVLinear needs query_dim == key_dim == value_dim, got "
                f"{cfg.query_dim}, {cfg.key_dim}, {cfg.value_dim}."
            )
        layer_cfg = cfg.layer.set(
            query_dim=cfg.query_dim,
            key_dim=cfg.key_dim,
            value_dim=cfg.value_dim,
            num_heads=cfg.num_heads,
            per_head_dim=cfg.per_head_dim,
        )
        self._add_child("layer", layer_cfg)
        adapter_cfg = cfg.adapter.set(
            input_dim=cfg.query_dim,
            output_dim=cfg.num_heads * cfg.per_head_dim,
            num_heads=cfg.num_heads,
        )
        if "num_kv_heads" in layer_cfg and adapter_cfg.num_kv_heads is None:
            adapter_cfg.num_kv_heads = layer_cfg.num_kv_heads
        self._add_child("adapter", adapter_cfg)

    @property
    def num_kv_heads(self) -> int:
        return self.layer.num_kv_heads

    def forward(
        self,
        query: Tensor,
        *,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        kv_state: Optional[Tensor] = None,
        query_positions: Optional[Tensor] = None,
    ) -> BaseQKVLinear.Output:
        """Returns `layer`'s projections plus the enabled adapters' outputs.

        Args:
            query: [batch, seq, query_dim].
            key: Must be None (self-attention only).
            value: Must be None.
            kv_state: Passed to `layer` (a KV-sharing layer such as QLinear needs it).
            query_positions: Passed to `layer`.

        Returns:
            Output(query, key, value), each [batch, seq, heads, per_head_dim].

        Raises:
            ValueError: If key or value is given.
        """
        cfg = self.config
        if key is not None or value is not None:
            raise ValueError(
                f"{self.path()}: LoraFusedQKVLinear supports self-attention only; pass "
                "key=value=None."
            )
        projections = list(self.layer(query, kv_state=kv_state, query_positions=query_positions))
        adapter_outputs = self.adapter(query)
        index = 0
        for i, name in enumerate(_QKV_NAMES):
            if cfg.adapter.enable_lora[name]:
                projections[i] = projections[i] + adapter_outputs[index]
                index += 1
        return self.Output(*projections)
