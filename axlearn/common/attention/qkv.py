"""Projections of attention inputs to per-head queries, keys and values (with KV caching).

Public names are re-exported by `axlearn.common.attention` (see its docstring).
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from axlearn.common.attention.scale import ScaleKey, ScaleQuery, constant_scale_fn
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import (
    REQUIRED,
    InstantiableConfig,
    Required,
    config_class,
    config_for_function,
)
from axlearn.common.module import Module, child_context
from axlearn.common.param_init import FanAxes
from axlearn.common.quantized_dot_general.layers import DenseGeneralBaseLayer
from axlearn.common.repeat import prepend_axis_to_specs
from axlearn.common.utils import NestedTensor, Tensor, split_prng_key


class BaseMultiheadLinear(DenseGeneralBaseLayer):
    """A linear layer between [..., model_dim] and per-head [..., num_heads, per_head_dim].

    A `DenseGeneralBaseLayer`: with `quantized_dot_general` set (e.g. by `FP8ConfigModifier`) its
    projection runs in int8/fp8.
    """

    @config_class
    class Config(DenseGeneralBaseLayer.Config):
        """Configures BaseMultiheadLinear."""

        model_dim: Required[int] = REQUIRED  # Feature dim of the un-headed side.
        num_heads: Required[int] = REQUIRED  # Number of attention heads.
        per_head_dim: Required[int] = REQUIRED  # Dimension per head.
        bias: bool = True  # Whether the layer has a bias.

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        # Shard the heads axis over the 'model' mesh axis.
        cfg.param_partition_spec = (None, "model", None)
        return cfg

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        params = dict(
            weight=ParameterSpec(
                shape=(cfg.model_dim, cfg.num_heads, cfg.per_head_dim),
                mesh_axes=cfg.param_partition_spec,
                fan_axes=self._weight_fan_axes(),
            )
        )
        if cfg.bias:
            params["bias"] = self._bias_spec(cfg)
        return params

    def _weight_fan_axes(self) -> FanAxes:
        raise NotImplementedError(type(self))

    def _bias_spec(self, cfg) -> ParameterSpec:
        raise NotImplementedError(type(self))

    def _project(self, equation: str, inputs: Tensor) -> Tensor:
        """Returns einsum(equation, inputs, weight), plus the bias if the layer has one."""
        params = self.parameters
        outputs = self.einsum_maybe_quantized(equation, activation=inputs, kernel=params["weight"])
        return outputs + params["bias"] if "bias" in params else outputs


class MultiheadInputLinear(BaseMultiheadLinear):
    """Projects [batch, length, model_dim] to [batch, length, num_heads, per_head_dim]."""

    def _weight_fan_axes(self) -> FanAxes:
        return FanAxes(in_axis=0, out_axis=(1, 2))

    def _bias_spec(self, cfg) -> ParameterSpec:
        return ParameterSpec(
            shape=(cfg.num_heads, cfg.per_head_dim), mesh_axes=tuple(cfg.param_partition_spec)[1:]
        )

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns the per-head projection [batch, length, num_heads, per_head_dim]."""
        return self._project("btd,dnh->btnh", inputs)


class MultiheadOutputLinear(BaseMultiheadLinear):
    """Projects [batch, length, num_heads, per_head_dim] to [batch, length, model_dim]."""

    def _weight_fan_axes(self) -> FanAxes:
        return FanAxes(in_axis=(1, 2), out_axis=0)

    def _bias_spec(self, cfg) -> ParameterSpec:
        return ParameterSpec(shape=(cfg.model_dim,), mesh_axes=tuple(cfg.param_partition_spec)[:1])

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns the output projection [batch, length, model_dim]."""
        return self._project("btnh,dnh->btd", inputs)


def _input_linear_config(cfg, *, per_head_dim: int) -> InstantiableConfig:
    """`cfg.input_linear` (a QKV projection config) set to `cfg`'s dims and `per_head_dim`."""
    return cfg.input_linear.clone(
        query_dim=cfg.query_dim,
        key_dim=cfg.key_dim,
        value_dim=cfg.value_dim,
        num_heads=cfg.num_heads,
        per_head_dim=per_head_dim,
    )


class BaseQKVLinear(BaseLayer):
    """Maps query/key/value inputs to per-head projections; keeps a KV cache for decoding.

    Decoding caches live in the attention layer (`MultiheadAttention.kv_cache`), not here.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseQKVLinear."""

        query_dim: Required[int] = REQUIRED  # Input query feature dim.
        key_dim: Required[int] = REQUIRED  # Input key feature dim.
        value_dim: Required[int] = REQUIRED  # Input value feature dim.
        num_heads: Required[int] = REQUIRED  # Number of query heads.
        per_head_dim: Required[int] = REQUIRED  # Dimension of each head.
        # The dtype of the attention layer's KV cache when its `kv_cache.cache_dtype` is None;
        # None means the layer dtype.
        cache_dtype: Optional[jnp.dtype] = None

    class Output(NamedTuple):
        """Projections: query [B, T, num_heads, H]; key/value [B, S, num_kv_heads, H]."""

        query: Tensor
        key: Tensor
        value: Tensor

    @property
    def num_kv_heads(self) -> int:
        """Number of key/value heads."""
        return self.config.num_heads

    def forward(
        self,
        query: Tensor,
        *,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        kv_state: Optional[Any] = None,
        query_positions: Optional[Tensor] = None,
    ) -> Output:
        """Computes per-head projections.

        Args:
            query: [batch, target_length, query_dim].
            key: Optional [batch, source_length, key_dim]; None means `query` (self-attention).
            value: Optional [batch, source_length, value_dim]; None means `query`.
            kv_state: Optional external `KVState`; only KV-sharing projections (`QLinear`) take
                one, the others raise ValueError when it is given.
            query_positions: Optional [batch, target_length] positions (used by RoPE); None
                means arange(target_length).

        Returns:
            An Output.
        """
        raise NotImplementedError(type(self))

    @classmethod
    def is_kv_sharing(cls, cfg: Config) -> bool:
        """Whether a projection of config `cfg` takes keys/values from a `kv_state` (no cache)."""
        del cfg
        return False

    def _check_no_kv_state(self, kv_state) -> None:
        if kv_state is not None:
            raise ValueError(
                f"{self.path()}: {type(self).__name__} computes its own keys/values and takes no "
                "kv_state; use QLinear (or RoFormerQKVLinear over QLinear) to share a kv_state."
            )


class QKVLinear(BaseQKVLinear):
    """Separate q_proj, k_proj and v_proj projections (num_kv_heads == num_heads)."""

    @config_class
    class Config(BaseQKVLinear.Config):
        """Configures QKVLinear."""

        # The projection layer config, used for each of q/k/v.
        layer: MultiheadInputLinear.Config = MultiheadInputLinear.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        for name, dim, heads in (
            ("q", cfg.query_dim, cfg.num_heads),
            ("k", cfg.key_dim, self.num_kv_heads),
            ("v", cfg.value_dim, self.num_kv_heads),
        ):
            proj = cfg.layer.clone(model_dim=dim, num_heads=heads, per_head_dim=cfg.per_head_dim)
            self._add_child(f"{name}_proj", proj)

    def forward(
        self,
        query: Tensor,
        *,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        kv_state: Optional[Any] = None,
        query_positions: Optional[Tensor] = None,
    ) -> BaseQKVLinear.Output:
        del query_positions
        self._check_no_kv_state(kv_state)
        key = query if key is None else key
        value = query if value is None else value
        return self.Output(query=self.q_proj(query), key=self.k_proj(key), value=self.v_proj(value))


class GroupedQKVLinear(QKVLinear):
    """QKVLinear with `num_kv_heads` key/value heads shared by groups of query heads."""

    @config_class
    class Config(QKVLinear.Config):
        """Configures GroupedQKVLinear."""

        # Number of key/value heads; must divide num_heads.
        num_kv_heads: Required[int] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        _check_kv_heads_divide(cfg)
        super().__init__(cfg, parent=parent)

    @property
    def num_kv_heads(self) -> int:
        return self.config.num_kv_heads


def _check_kv_heads_divide(cfg):
    if cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(
            f"num_kv_heads ({cfg.num_kv_heads}) must divide num_heads ({cfg.num_heads})"
        )


def _check_equal_dims(cfg, cls_name: str):
    if not cfg.query_dim == cfg.key_dim == cfg.value_dim:
        raise ValueError(
            f"{cls_name} needs query_dim == key_dim == value_dim, got "
            f"{cfg.query_dim}, {cfg.key_dim}, {cfg.value_dim}"
        )


class FusedQKVLinear(BaseQKVLinear):
    """One fused weight [3, model_dim, num_heads, per_head_dim] for q, k and v.

    Self-attention only computes one einsum; cross-attention requires key/value inputs of the
    same shape as the query.
    """

    @config_class
    class Config(BaseQKVLinear.Config):
        """Configures FusedQKVLinear."""

        # The projection layer config; its parameters get a leading axis of 3.
        layer: MultiheadInputLinear.Config = MultiheadInputLinear.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        _check_equal_dims(cfg, "FusedQKVLinear")
        self._add_child(
            "qkv_proj",
            cfg.layer.clone(
                model_dim=cfg.query_dim, num_heads=cfg.num_heads, per_head_dim=cfg.per_head_dim
            ),
        )

    def create_parameter_specs_recursively(self):
        return prepend_axis_to_specs(super().create_parameter_specs_recursively(), 3)

    def initialize_parameters_recursively(self, prng_key: Tensor, **kwargs) -> NestedTensor:
        def init(key):
            return dict(qkv_proj=self.qkv_proj.initialize_parameters_recursively(key, **kwargs))

        # As AXLearn: q, k, v get the children of three successive splits.
        return jax.vmap(init)(split_prng_key(prng_key, 3).keys)

    def forward(
        self,
        query: Tensor,
        *,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        kv_state: Optional[Any] = None,
        query_positions: Optional[Tensor] = None,
    ) -> BaseQKVLinear.Output:
        del query_positions
        self._check_no_kv_state(kv_state)
        if (key is None) != (value is None):
            raise ValueError(
                f"{self.path()}: key and value must be both None or both set (got key "
                f"{'None' if key is None else 'set'}, value {'None' if value is None else 'set'}); "
                "pass both for cross-attention, neither for self-attention."
            )
        with child_context("qkv_proj", module=self.qkv_proj):
            params = self.qkv_proj.parameters
            if "quantized_dot_general" in self.qkv_proj.children:
                proj = self._quantized_projections(query, key=key, value=value)
            elif key is None:
                proj = jnp.einsum("btd,pdnh->pbtnh", query, params["weight"])
            else:
                inputs = jnp.stack([query, key, value], axis=0)
                proj = jnp.einsum("pbtd,pdnh->pbtnh", inputs, params["weight"])
        if "bias" in params:
            proj = proj + params["bias"][:, None, None]
        return self.Output(query=proj[0], key=proj[1], value=proj[2])

    def _quantized_projections(
        self, query: Tensor, *, key: Optional[Tensor], value: Optional[Tensor]
    ) -> Tensor:
        """[3, batch, length, num_heads, per_head_dim]: q, k and v each projected by the
        quantized einsum of `qkv_proj`, with its own slice of the (stacked) quantization state.

        The quantization state (e.g. fp8 scales and amax histories) of `qkv_proj` has the same
        leading axis of 3 as its weight, so query, key and value keep separate scales. Called in
        the `qkv_proj` context.
        """
        layer = self.qkv_proj
        quantizer = layer.quantized_dot_general
        params = layer.parameters
        inputs = (query, query, query) if key is None else (query, key, value)
        outputs = []
        for i, (name, x) in enumerate(zip(("q", "k", "v"), inputs)):
            state = jax.tree.map(lambda v, i=i: v[i], params["quantized_dot_general"])
            with child_context(f"quantized_dot_general_{name}", module=quantizer, state=state):
                outputs.append(
                    quantizer.einsum_maybe_quantized(
                        "btd,dnh->btnh", activation=x, kernel=params["weight"][i]
                    )
                )
        return jnp.stack(outputs, axis=0)


class FusedGroupedQKVLinear(BaseQKVLinear):
    """One fused weight [model_dim, num_heads + 2 * num_kv_heads, per_head_dim] (self-attention).

    The projection is split along the heads axis into query, key and value heads.
    """

    @config_class
    class Config(BaseQKVLinear.Config):
        """Configures FusedGroupedQKVLinear."""

        # Number of key/value heads; must divide num_heads.
        num_kv_heads: Required[int] = REQUIRED
        # The projection layer config.
        layer: MultiheadInputLinear.Config = MultiheadInputLinear.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        _check_equal_dims(cfg, "FusedGroupedQKVLinear")
        _check_kv_heads_divide(cfg)
        self._add_child(
            "qkv_proj",
            cfg.layer.clone(
                model_dim=cfg.query_dim,
                num_heads=cfg.num_heads + 2 * cfg.num_kv_heads,
                per_head_dim=cfg.per_head_dim,
            ),
        )

    @property
    def num_kv_heads(self) -> int:
        return self.config.num_kv_heads

    def forward(
        self,
        query: Tensor,
        *,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        kv_state: Optional[Any] = None,
        query_positions: Optional[Tensor] = None,
    ) -> BaseQKVLinear.Output:
        del query_positions
        self._check_no_kv_state(kv_state)
        if key is not None or value is not None:
            raise ValueError(
                f"{self.path()}: FusedGroupedQKVLinear supports self-attention only (got key or "
                "value); pass key=value=None, or use an unfused QKV linear for cross-attention."
            )
        cfg = self.config
        proj = self.qkv_proj(query)
        q, k, v = jnp.split(proj, [cfg.num_heads, cfg.num_heads + cfg.num_kv_heads], axis=-2)
        return self.Output(query=q, key=k, value=v)


def _rotary_sin_cos(positions: Tensor, *, dim: int, theta: float) -> Tensor:
    """Returns [..., dim]: sin of the dim/2 frequencies then their cos, at `positions`."""
    if dim % 2:
        raise ValueError(f"RoPE dim must be even, got {dim}")
    freq_exponents = jnp.arange(0, dim, 2, dtype=jnp.float32) / dim
    inv_freq = 1.0 / (theta**freq_exponents)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class RoFormerSinusoidalPositionalEmbedding(BaseLayer):
    """Rotary position embedding (RoPE) tables: sin/cos of position * theta^(-2j/dim)."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures RoFormerSinusoidalPositionalEmbedding."""

        dim: Required[int] = REQUIRED  # The embedding (per-head) dimension; even.
        theta: float = 10000.0  # The base of the frequencies.

    def forward(
        self, *, positions: Optional[Tensor] = None, max_seq_len: Optional[int] = None
    ) -> Tensor:
        """Returns [batch, seq_len, dim]: sin of the dim/2 frequencies, then their cos.

        Args:
            positions: [batch, seq_len] int positions; None means arange(max_seq_len)[None].
            max_seq_len: Required if `positions` is None.

        Raises:
            ValueError: If neither is given, or they disagree.
        """
        cfg = self.config
        if positions is None:
            if max_seq_len is None:
                raise ValueError(
                    f"{self.path()}: both positions and max_seq_len are None; pass one of them."
                )
            positions = jnp.arange(max_seq_len)[None]
        elif max_seq_len is not None and positions.shape[-1] != max_seq_len:
            raise ValueError(
                f"{self.path()}: positions length {positions.shape[-1]} != max_seq_len "
                f"{max_seq_len}; pass positions of that length, or only one of the two."
            )
        return _rotary_sin_cos(positions, dim=cfg.dim, theta=cfg.theta)


def apply_rotary_position_embeddings(x: Tensor, sin_cos: Tensor) -> Tensor:
    """Rotates interleaved channel pairs (2j, 2j+1) of `x` by the angles in `sin_cos`.

    Args:
        x: [batch, seq_len, num_heads, dim].
        sin_cos: [batch or 1, seq_len, dim] from `RoFormerSinusoidalPositionalEmbedding`.

    Returns:
        x rotated: out[2j] = x[2j] cos_j - x[2j+1] sin_j; out[2j+1] = x[2j+1] cos_j + x[2j] sin_j.
    """
    sin, cos = jnp.split(sin_cos[:, :, None, :].astype(x.dtype), 2, axis=-1)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    out_even = x_even * cos - x_odd * sin
    out_odd = x_odd * cos + x_even * sin
    return jnp.stack([out_even, out_odd], axis=-1).reshape(x.shape)


class RoFormerQKVLinear(BaseQKVLinear):
    """Wraps a QKV projection (child `i_proj`) and applies RoPE to queries and keys."""

    @config_class
    class Config(BaseQKVLinear.Config):
        """Configures RoFormerQKVLinear."""

        # The rotary embedding config; dim is set to per_head_dim.
        rope_pos_emb_layer: InstantiableConfig = (
            RoFormerSinusoidalPositionalEmbedding.default_config()
        )
        # The wrapped projection config.
        input_linear: InstantiableConfig = QKVLinear.default_config()
        # Whether to also rotate the values.
        rotary_value: Required[bool] = REQUIRED
        # Optional scale layer (e.g. `ScaleQuery` with a norm) applied to the projected queries
        # before RoPE; its per_head_dim is set from this config. None: no scaling here.
        query_scale: Optional[InstantiableConfig] = None
        # Optional scale layer (e.g. `ScaleKey`) applied to the projected keys before RoPE.
        key_scale: Optional[InstantiableConfig] = None
        # Fraction in (0, 1] of each head's dims that RoPE rotates (the leading
        # int(per_head_dim * factor) channels, which must be even); the rest pass through.
        # The rotary frequencies use the rotated width. None means 1.0 (rotate all dims).
        partial_rope_factor: Optional[float] = None

    @classmethod
    def is_kv_sharing(cls, cfg: Config) -> bool:
        """Whether the wrapped projection shares keys/values (e.g. `QLinear`)."""
        inner = cfg.input_linear
        return hasattr(inner.klass, "is_kv_sharing") and inner.klass.is_kv_sharing(inner)

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._rotary_dim = _rotary_dim(cfg)
        self._add_child("rope_pos_emb_layer", cfg.rope_pos_emb_layer.clone(dim=self._rotary_dim))
        self._add_child("i_proj", _input_linear_config(cfg, per_head_dim=cfg.per_head_dim))
        # As AXLearn, the scale children are always there, named `scale_query`/`scale_key` (an
        # identity scale when the field is None, which forward then skips): they take their
        # place in the key splits of parameter init, so the draws after them equal AXLearn's.
        identity = config_for_function(constant_scale_fn).set(value=1.0)
        query_scale = cfg.query_scale or ScaleQuery.default_config().set(scale_factor=identity)
        key_scale = cfg.key_scale or ScaleKey.default_config().set(scale_factor=identity)
        self._add_child("scale_query", query_scale.clone(per_head_dim=cfg.per_head_dim))
        self._add_child("scale_key", key_scale.clone(per_head_dim=cfg.per_head_dim))

    @property
    def num_kv_heads(self) -> int:
        return self.i_proj.num_kv_heads

    def forward(
        self,
        query: Tensor,
        *,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        kv_state: Optional[Any] = None,
        query_positions: Optional[Tensor] = None,
    ) -> BaseQKVLinear.Output:
        cfg = self.config
        if kv_state is not None:
            # Shared keys/values (QLinear inside) are already rotated: rotate the query only.
            q, k, v = self.i_proj(query, key=key, value=value, kv_state=kv_state)
            if cfg.query_scale is not None:
                q = self.scale_query(q, positions=query_positions)
            sin_cos = self.rope_pos_emb_layer(positions=query_positions, max_seq_len=q.shape[1])
            return self.Output(query=self._rotate(q, sin_cos), key=k, value=v)
        q, k, v = self.i_proj(query, key=key, value=value)
        if key is not None and query_positions is None and k.shape[1] != q.shape[1]:
            raise ValueError(
                f"{self.path()}: RoPE with cross-attention needs equal query and key lengths (got "
                f"{q.shape[1]} and {k.shape[1]}) or query_positions; pass query_positions."
            )
        # The keys are rotated at the query positions too; so they are scaled at them.
        if cfg.query_scale is not None:
            q = self.scale_query(q, positions=query_positions)
        if cfg.key_scale is not None:
            k = self.scale_key(k, positions=query_positions)
        sin_cos = self.rope_pos_emb_layer(positions=query_positions, max_seq_len=q.shape[1])
        q = self._rotate(q, sin_cos)
        k = self._rotate(k, sin_cos)
        if cfg.rotary_value:
            v = self._rotate(v, sin_cos)
        return self.Output(query=q, key=k, value=v)

    def _rotate(self, x: Tensor, sin_cos: Tensor) -> Tensor:
        """Rotates the leading `self._rotary_dim` channels of `x`; the rest pass through."""
        if self._rotary_dim == x.shape[-1]:
            return apply_rotary_position_embeddings(x, sin_cos)
        rotated = apply_rotary_position_embeddings(x[..., : self._rotary_dim], sin_cos)
        return jnp.concatenate([rotated, x[..., self._rotary_dim :]], axis=-1)


def _rotary_dim(cfg: RoFormerQKVLinear.Config) -> int:
    """The number of leading channels per head that RoPE rotates (see `partial_rope_factor`).

    Raises:
        ValueError: If the factor is outside (0, 1] or gives an odd or zero width.
    """
    factor = cfg.partial_rope_factor
    if factor is None:
        return cfg.per_head_dim
    if not 0 < factor <= 1:
        raise ValueError(f"{cfg.name}: partial_rope_factor must be in (0, 1], got {factor}")
    dim = int(cfg.per_head_dim * factor)
    if dim == 0 or dim % 2:
        raise ValueError(
            f"{cfg.name}: partial_rope_factor={factor} with per_head_dim={cfg.per_head_dim} "
            f"rotates {dim} dims; it must be a positive even number"
        )
    return dim
