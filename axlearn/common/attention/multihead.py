"""Multi-head attention: MultiheadAttention, GroupedQueryAttention and FlashAttention.

Public names are re-exported by `axlearn.common.attention`.

Decoding (AXLearn's interface): the layer owns a KV cache child (`kv_cache`, default `KVCache`);
its state is {"time_step": [batch] int32, "kv_cache": the cache's state}:

    state = layer.init_states(batch_size=B, max_len=L, dtype=jnp.float32)   # empty cache
    state, out = layer.extend_step(state, query, is_prefill=True, segment_ids=ids)  # prefill
    state, out = layer.extend_step(state, query_step)                        # one or more steps

`init_states(time_step=None|t, query=...)` is the older form (empty, or prefilled with all of
`query`, continuing at `t`). Layers sharing keys/values (`QLinear`, or `forward/extend_step(
kv_state=KVState(...))`) keep no cache. `return_aux={"kv_state"}` returns the keys/values the
layer attended to (`Output.kv_state`); with `scale_kv_before_cache_update` (default True) the
cached (and returned) keys are already scaled by `key_scale`, otherwise the raw keys are cached
and scaled after reading. A `kv_state` passed in is returned unchanged and is read with the same
convention (scaled keys when `scale_kv_before_cache_update`).

Masking: the attention logits of query i and key j get the sum of
* the `attention_logit_biases` argument (see `axlearn.common.attention_bias`),
* the config's mask (`causal=True` or `mask=<MaskFn config>`), evaluated on sequence indices
  (0..T-1 in `forward`; the absolute cache positions in `extend_step`),
* a segment mask when `segment_ids` is given (packed sequences attend within their segment).
"""

from collections.abc import Sequence
from typing import NamedTuple, Optional, Union

import jax
import jax.numpy as jnp

from axlearn.common.attention.cache_kwargs import accepts_empty_cache_kwargs
from axlearn.common.attention.qkv import (
    MultiheadOutputLinear,
    QKVLinear,
    _input_linear_config,
)
from axlearn.common.attention.scale import ScaleKey, ScaleQuery
from axlearn.common.attention.softmax import softmax_with_biases
from axlearn.common.attention_bias import (
    MaskFn,
    add_biases,
    causal_mask,
    make_segment_mask,
    mask_fn_bias,
)
from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import (
    REQUIRED,
    ConfigOr,
    InstantiableConfig,
    Required,
    config_class,
    maybe_instantiate,
)
from axlearn.common.kv_cache.base_kv_cache import BaseKVCache, KVState
from axlearn.common.kv_cache.kv_cache import KVCache
from axlearn.common.layers import Dropout
from axlearn.common.module import Module
from axlearn.common.param_init import constant_initializer
from axlearn.common.utils import NestedTensor, Tensor, maybe_shard


class _MaskInfo(NamedTuple):
    """A mask function with the positions to evaluate it at (lazily materialized)."""

    mask_fn: Optional[MaskFn]
    # [batch or 1, target_length] int.
    target_positions: Tensor
    # [batch or 1, source_length] int.
    source_positions: Tensor
    # Whether target/source positions are both arange(length) (full-sequence forward).
    default_positions: bool
    # [batch, length] self-attention segment ids that are not in the biases (see
    # `_segment_ids_in_mask`); None: none, or already added to the biases.
    segment_ids: Optional[Tensor] = None


class MultiheadAttention(BaseLayer):
    """Multi-head attention with grouped key/value heads when `input_linear` has fewer KV heads.

    Children: i_proj (the QKV projection), o_proj, dropout (on attention probabilities),
    scale_query, scale_key.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures MultiheadAttention."""

        query_dim: Required[int] = REQUIRED  # Input query feature dim.
        key_dim: Required[int] = REQUIRED  # Input key feature dim.
        value_dim: Required[int] = REQUIRED  # Input value feature dim.
        output_dim: Optional[int] = None  # Output feature dim; None means query_dim.
        hidden_dim: Optional[int] = None  # Total of all heads' dims; None means query_dim.
        num_heads: Required[int] = REQUIRED  # Number of query heads; divides hidden_dim.
        # The QKV projection config.
        input_linear: InstantiableConfig = QKVLinear.default_config()
        # The output projection config.
        output_linear: InstantiableConfig = MultiheadOutputLinear.default_config()
        # Dropout on the attention probabilities.
        dropout: InstantiableConfig = Dropout.default_config()
        # Scales (and optionally normalizes per head) the projected queries.
        query_scale: InstantiableConfig = ScaleQuery.default_config()
        # Scales (and optionally normalizes per head) the projected keys.
        key_scale: InstantiableConfig = ScaleKey.default_config()
        # If positive, logits are capped as cap * tanh(logits / cap).
        atten_logit_cap: Optional[float] = None
        # Whether to apply causal masking (self-attention); None means False. Exclusive with `mask`.
        causal: Optional[bool] = None
        # Optional mask function config (e.g. `sliding_window_causal_mask`). Exclusive with causal.
        mask: Optional[ConfigOr[MaskFn]] = None
        # The KV cache of decoding (child `kv_cache`; e.g. `KVCache` with `cache_dtype`, or
        # `SlidingWindowKVCache`). None means the default `KVCache`. A cache without cache_dtype
        # stores in the QKV projection's `cache_dtype` if set, else the layer dtype.
        kv_cache: Optional[BaseKVCache.Config] = KVCache.default_config()
        # Whether keys are scaled by `key_scale` before they are cached (and returned as
        # kv_state); False caches raw keys and scales them after reading. None means True.
        scale_kv_before_cache_update: Optional[bool] = None
        # If True, a learned per-head logit (parameter `sink` [num_heads], initialized to 0,
        # no weight decay) joins each softmax as an extra key with no value, so a query's
        # probabilities may sum to less than 1. None means False.
        logit_sink: Optional[bool] = None
        # Sharding constraints (one entry per axis: a mesh axis name, a tuple of names, or None)
        # on the projected queries [batch, target_length, num_heads, per_head_dim]; None: none.
        q_partition_spec: Optional[Sequence] = None
        # Constraint on the projected keys [batch, source_length, num_kv_heads, per_head_dim];
        # None: q_partition_spec.
        k_partition_spec: Optional[Sequence] = None
        # Constraint on the projected values (as keys); None: q_partition_spec.
        v_partition_spec: Optional[Sequence] = None
        # Constraint on the layer's output [batch, target_length, output_dim]; None: none.
        o_partition_spec: Optional[Sequence] = None

    class Output(NamedTuple):
        """Attention outputs.

        Fields:
            data: [batch, target_length, output_dim].
            probs: [batch, num_heads, target_length, source_length] if "probs" in return_aux.
            kv_state: The attended keys/values (`KVState`) if "kv_state" in return_aux.
        """

        data: Tensor
        probs: Optional[Tensor] = None
        kv_state: Optional[KVState] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.causal and cfg.mask is not None:
            raise ValueError(f"{self.path()}: set either causal or mask, not both")
        self._mask_fn = causal_mask if cfg.causal else maybe_instantiate(cfg.mask)
        per_head_dim = self.per_head_dim()
        i_proj_cfg = _input_linear_config(cfg, per_head_dim=per_head_dim)
        # Children in AXLearn's order (i_proj, o_proj, dropout, scale_query, scale_key,
        # kv_cache): parameter init splits the key through them in this order.
        self._add_child("i_proj", i_proj_cfg)
        self._add_child(
            "o_proj",
            cfg.output_linear.clone(
                model_dim=cfg.output_dim or cfg.query_dim,
                num_heads=cfg.num_heads,
                per_head_dim=per_head_dim,
            ),
        )
        self._add_child("dropout", cfg.dropout)
        self._add_child("scale_query", cfg.query_scale.clone(per_head_dim=per_head_dim))
        self._add_child("scale_key", cfg.key_scale.clone(per_head_dim=per_head_dim))
        self._add_child("kv_cache", cfg.kv_cache or KVCache.default_config())

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        if not cfg.logit_sink:
            return {}
        return dict(
            sink=ParameterSpec(
                shape=(cfg.num_heads,),
                mesh_axes=("model",),
                initializer=constant_initializer(0.0),
                weight_decay_scale=0.0,
            )
        )

    def _softmax(self, logits: Tensor) -> Tensor:
        """Softmax over the last axis in float32, with the per-head logit sink if configured."""
        sink = self.parameters["sink"] if self.config.logit_sink else None
        return softmax_with_biases(logits.astype(jnp.float32), logit_sink=sink)

    def per_head_dim(self) -> int:
        """hidden_dim // num_heads."""
        cfg = self.config
        hidden_dim = cfg.hidden_dim or cfg.query_dim
        if hidden_dim % cfg.num_heads:
            raise ValueError(
                f"{self.path()}.num_heads={cfg.num_heads} must divide the hidden dim {hidden_dim} "
                "(hidden_dim, else query_dim); set num_heads to a divisor of it."
            )
        return hidden_dim // cfg.num_heads

    @property
    def num_kv_heads(self) -> int:
        """Number of key/value heads."""
        return self.i_proj.num_kv_heads

    def forward(
        self,
        query: Tensor,
        *,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        kv_state: Optional[KVState] = None,
        attention_logit_biases: Optional[Tensor] = None,
        segment_ids: Optional[Tensor] = None,
        query_positions: Optional[Tensor] = None,
        return_aux: Optional[set[str]] = None,
    ) -> Output:
        """Computes attention of `query` over `key`/`value` (self-attention if both None).

        Args:
            query: [batch, target_length, query_dim].
            key: Optional [batch, source_length, key_dim].
            value: Optional [batch, source_length, value_dim].
            kv_state: Optional external keys/values (for a KV-sharing `input_linear` such as
                `QLinear`); returned unchanged as `Output.kv_state`.
            attention_logit_biases: Optional bias, see `axlearn.common.attention_bias`.
            segment_ids: Optional [batch, length] segment ids (self-attention).
            query_positions: Optional [batch, target_length] positions for position encodings
                (e.g. RoPE restarts at 0 per packed segment); masks use sequence indices.
            return_aux: Optional set; "probs" requests the attention probabilities, "kv_state"
                the keys/values attended to.

        Returns:
            An Output.
        """
        if (key is None) != (value is None):
            raise ValueError(
                f"{self.path()}: key and value must be both None or both set (got key "
                f"{'None' if key is None else 'set'}, value {'None' if value is None else 'set'}); "
                "pass both for cross-attention, neither for self-attention."
            )
        q, k, v = self._project(
            query, key=key, value=value, kv_state=kv_state, positions=query_positions
        )
        # Positions of the tokens for the scale layers (masks use sequence indices).
        q_positions = query_positions
        if q_positions is None:
            q_positions = jnp.arange(q.shape[1])[None]
        source_len = k.shape[1]
        if kv_state is None:
            # Self-attention keys are the query tokens; cross-attention keys count from 0.
            k_positions = q_positions if key is None else jnp.arange(source_len)[None]
            k, kv_state = self._cache_convention(k, v, positions=k_positions)
            key_positions, default_positions = None, True
        else:
            key_positions = kv_state.key_positions
            default_positions = key_positions is None
            k_positions = key_positions
            if k_positions is None:
                k_positions = jnp.arange(source_len)[None]
        if key_positions is None:
            key_positions = jnp.arange(source_len)[None]
        q, k = self._scale_for_attention(
            q, k, query_positions=q_positions, key_positions=k_positions
        )
        mask = _MaskInfo(
            self._mask_fn,
            jnp.arange(q.shape[1])[None],
            key_positions,
            default_positions=default_positions,
        )
        segment_bias = None
        if segment_ids is not None and self._segment_ids_in_mask():
            mask = mask._replace(segment_ids=segment_ids)
        elif segment_ids is not None:
            segment_bias = make_segment_mask(
                source_segments=segment_ids, target_segments=segment_ids
            )
        return self._attend(
            q,
            k,
            v,
            biases=add_biases(attention_logit_biases, segment_bias),
            mask=mask,
            return_aux=return_aux,
            kv_state=kv_state,
        )

    def _segment_ids_in_mask(self) -> bool:
        """Whether `forward` passes segment ids in the mask info instead of as a [B, 1, T, T] bias.

        A subclass whose `_compute_attention` reads `mask.segment_ids` returns True.
        """
        return False

    def _project(
        self,
        query: Tensor,
        *,
        key: Optional[Tensor],
        value: Optional[Tensor],
        kv_state: Optional[KVState],
        positions: Optional[Tensor],
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(q, k, v) of the QKV projection; kv_state is passed only to KV-sharing projections."""
        kwargs = dict(key=key, value=value, query_positions=positions)
        if kv_state is not None:
            kwargs["kv_state"] = kv_state
        q, k, v = self.i_proj(query, **kwargs)
        return q, k, v

    def _scale_kv_first(self) -> bool:
        flag = self.config.scale_kv_before_cache_update
        return True if flag is None else bool(flag)

    def _cache_convention(
        self, k_proj: Tensor, v_proj: Tensor, *, positions: Tensor
    ) -> tuple[Tensor, KVState]:
        """Keys as they are cached/returned (scaled if scale_kv_before_cache_update).

        `positions` ([batch or 1, source_length]) are the keys' positions, for `scale_key`.
        """
        if self._scale_kv_first():
            k_proj = self.scale_key(k_proj, positions=positions)
        return k_proj, KVState(k_proj=k_proj, v_proj=v_proj)

    def _scale_for_attention(
        self,
        q_proj: Tensor,
        k_proj: Tensor,
        *,
        query_positions: Tensor,
        key_positions: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Scales the query, and keys held in the cache convention (see `_cache_convention`).

        The positions ([batch or 1, length]) are passed to `scale_query` / `scale_key`.
        """
        q_proj = self.scale_query(q_proj, positions=query_positions)
        if not self._scale_kv_first():
            k_proj = self.scale_key(k_proj, positions=key_positions)
        return q_proj, k_proj

    def _scale_qk(
        self,
        *,
        q_proj: Tensor,
        k_proj: Tensor,
        query_positions: Optional[Tensor] = None,
        key_positions: Optional[Tensor] = None,
    ) -> tuple[Tensor, Tensor]:
        """Returns (scale_query(q_proj), scale_key(k_proj)), each given its positions.

        Args:
            q_proj: [batch, target_length, num_heads, per_head_dim].
            k_proj: [batch, source_length, num_kv_heads, per_head_dim].
            query_positions: Optional [batch, target_length]; None: arange(target_length).
            key_positions: Optional [batch, source_length]; None: arange(source_length).

        Returns:
            The scaled (q_proj, k_proj).
        """
        if query_positions is None:
            query_positions = jnp.arange(q_proj.shape[1])[None]
        if key_positions is None:
            key_positions = jnp.arange(k_proj.shape[1])[None]
        return (
            self.scale_query(q_proj, positions=query_positions),
            self.scale_key(k_proj, positions=key_positions),
        )

    def _cache_dtype(self, dtype) -> jnp.dtype:
        """The cache dtype when the kv_cache sets none: the projection's, else `dtype`."""
        return getattr(self.i_proj.config, "cache_dtype", None) or dtype

    def _uses_cache(self, kv_state: Optional[KVState]) -> bool:
        """Whether decoding keeps a KV cache (not with an external kv_state or KV sharing)."""
        i_proj_cfg = self.i_proj.config
        sharing = hasattr(i_proj_cfg.klass, "is_kv_sharing") and i_proj_cfg.klass.is_kv_sharing(
            i_proj_cfg
        )
        return kv_state is None and not sharing

    def _empty_state(
        self, *, batch_size: int, max_len: int, dtype, kv_state: Optional[KVState]
    ) -> NestedTensor:
        state = dict(time_step=jnp.zeros([batch_size], jnp.int32))
        if self._uses_cache(kv_state):
            shape = BaseKVCache.Shape(batch_size, max_len, self.num_kv_heads, self.per_head_dim())
            state["kv_cache"] = self.kv_cache.init_states(shape, dtype=self._cache_dtype(dtype))
        return state

    @accepts_empty_cache_kwargs(input_name="query", dim_field="query_dim")
    def init_states(
        self,
        *,
        time_step: Optional[Tensor] = None,
        query: Optional[Union[Tensor, jax.ShapeDtypeStruct]] = None,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        kv_state: Optional[KVState] = None,
        attention_logit_biases: Optional[Tensor] = None,
        return_aux: Optional[set[str]] = None,
    ) -> tuple[NestedTensor, Optional[Output]]:
        """Creates the decoding state, empty or prefilled.

        `init_states(batch_size=B, max_len=L, dtype=...)` returns only an empty state (AXLearn's
        form; prefill then with `extend_step(..., is_prefill=True)`).

        Args:
            time_step: None for an empty cache, or [batch] positions where decoding continues
                (then the whole `query` is processed and its keys/values before `time_step` are
                cached).
            query: [batch, max_len, query_dim] (a `jax.ShapeDtypeStruct` for an empty cache).
            key: Optional keys of the prefill (cross-attention inputs cached like self-attention).
            value: Optional values of the prefill.
            kv_state: Optional external keys/values (then no cache is kept).
            attention_logit_biases: Optional biases for the prefill.
            return_aux: See `forward`.

        Returns:
            (state, output): output is None for an empty cache.
        """
        batch, max_len = query.shape[:2]
        state = self._empty_state(
            batch_size=batch, max_len=max_len, dtype=query.dtype, kv_state=kv_state
        )
        if time_step is None:
            return state, None
        live = jnp.arange(max_len)[None] < time_step[:, None]
        state, output = self.extend_step(
            state,
            query,
            key=key,
            value=value,
            kv_state=kv_state,
            attention_logit_biases=attention_logit_biases,
            segment_ids=live.astype(jnp.int32),
            is_prefill=True,
            return_aux=return_aux,
        )
        return dict(state, time_step=time_step.astype(jnp.int32)), output

    def extend_step(
        self,
        cached_states: NestedTensor,
        query: Tensor,
        *,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        kv_state: Optional[KVState] = None,
        attention_logit_biases: Optional[Tensor] = None,
        segment_ids: Optional[Tensor] = None,
        is_prefill: bool = False,
        return_aux: Optional[set[str]] = None,
    ) -> tuple[NestedTensor, Output]:
        """Attends `query` (at positions time_step + [0, steps)) over the cache, updating it.

        Args:
            cached_states: From `init_states` or a previous `extend_step`.
            query: [batch, steps, query_dim].
            key: Optional [batch, steps, key_dim] keys of these steps (cached as self-attention).
            value: Optional [batch, steps, value_dim].
            kv_state: Optional external keys/values to attend to (no cache is updated).
            attention_logit_biases: Optional biases [..., steps, source_length].
            segment_ids: Optional [batch, steps]; id 0 marks padding steps, which are not
                cached. With `is_prefill`, time_step advances by the non-padding steps.
            is_prefill: Whether this call fills an empty cache with a prompt: the queries
                attend to the prompt's own keys (exactly as `forward`, padding included) and
                time_step becomes the number of non-padding steps.
            return_aux: See `forward`.

        Returns:
            (updated state, output).
        """
        if (key is None) != (value is None):
            raise ValueError(
                f"{self.path()}: key and value must be both None or both set; pass both or neither."
            )
        time_step = cached_states["time_step"]
        steps = query.shape[1]
        positions = time_step[:, None] + jnp.arange(steps)[None]
        q, k, v = self._project(query, key=key, value=value, kv_state=kv_state, positions=positions)
        new_state = {}
        if kv_state is not None or "kv_cache" not in cached_states:
            if kv_state is None:
                raise ValueError(
                    f"{self.path()}: this decoding state has no kv_cache (a KV-sharing layer); "
                    "pass kv_state to extend_step."
                )
            out_kv = kv_state
            k_all, v_all = k, v
            key_positions = kv_state.key_positions
            if key_positions is None:
                key_positions = jnp.arange(k_all.shape[1])[None]
        else:
            k, _ = self._cache_convention(k, v, positions=positions)
            new_state["kv_cache"], out_kv = self.kv_cache.extend_step(
                cached_states["kv_cache"],
                k_proj=k,
                v_proj=v,
                key_positions=positions,
                segment_ids=segment_ids,
            )
            if is_prefill:
                # The prompt attends to its own keys: exact for every position (padding too).
                k_all, v_all, key_positions = k, v, positions
            else:
                k_all = out_kv.k_proj.astype(q.dtype)
                v_all = out_kv.v_proj.astype(q.dtype)
                key_positions = out_kv.key_positions
        q, k_all = self._scale_for_attention(
            q, k_all, query_positions=positions, key_positions=key_positions
        )
        mask = _MaskInfo(self._mask_fn, positions, key_positions, default_positions=False)
        output = self._attend(
            q,
            k_all,
            v_all,
            biases=add_biases(attention_logit_biases),
            mask=mask,
            return_aux=return_aux,
            kv_state=out_kv,
        )
        if is_prefill and segment_ids is not None:
            advance = jnp.sum(segment_ids != 0, axis=1).astype(jnp.int32)
        else:
            advance = steps
        return dict(time_step=time_step + advance, **new_state), output

    def _attend(
        self,
        q_proj: Tensor,
        k_proj: Tensor,
        v_proj: Tensor,
        *,
        biases: Optional[Tensor],
        mask: _MaskInfo,
        return_aux: Optional[set[str]],
        kv_state: Optional[KVState] = None,
    ) -> Output:
        """Attention of scaled projections; `kv_state` is returned if "kv_state" is requested.

        The projections are constrained to `{q,k,v}_partition_spec` and the output to
        `o_partition_spec` (where set).
        """
        cfg = self.config
        q_spec = cfg.q_partition_spec
        k_spec = cfg.k_partition_spec if cfg.k_partition_spec is not None else q_spec
        v_spec = cfg.v_partition_spec if cfg.v_partition_spec is not None else q_spec
        q_proj = self._remat_name(self._shard(q_proj, q_spec, "q_partition_spec"), "q_proj")
        k_proj = self._remat_name(self._shard(k_proj, k_spec, "k_partition_spec"), "k_proj")
        v_proj = self._remat_name(self._shard(v_proj, v_spec, "v_partition_spec"), "v_proj")
        return_aux = return_aux or set()
        context, probs = self._compute_attention(
            q_proj=q_proj,
            k_proj=k_proj,
            v_proj=v_proj,
            biases=biases,
            mask=mask,
            need_probs="probs" in return_aux,
        )
        context = self._remat_name(context, "context")
        outputs = self._shard(self.o_proj(context), cfg.o_partition_spec, "o_partition_spec")
        outputs = self._remat_name(outputs, "o_proj")
        return self.Output(
            data=outputs,
            probs=probs if "probs" in return_aux else None,
            kv_state=kv_state if "kv_state" in return_aux else None,
        )

    def _shard(self, x: Tensor, spec: Optional[Sequence], field: str) -> Tensor:
        """`maybe_shard(x, spec)`, with an error naming the config field on a rank mismatch."""
        if spec is not None and len(spec) != x.ndim:
            raise ValueError(
                f"{self.path()}.{field}={tuple(spec)!r} has {len(spec)} entries but the tensor "
                f"it constrains has shape {x.shape}; give one entry per axis."
            )
        return maybe_shard(x, spec)

    def _full_biases(self, biases: Optional[Tensor], mask: _MaskInfo, dtype) -> Optional[Tensor]:
        """All biases materialized: explicit biases plus the mask function's bias."""
        mask_bias = None
        if mask.mask_fn is not None:
            mask_bias = mask_fn_bias(
                mask.mask_fn,
                target_positions=mask.target_positions,
                source_positions=mask.source_positions,
                dtype=dtype,
            )
        return add_biases(biases, mask_bias)

    def _compute_attention(
        self,
        *,
        q_proj: Tensor,
        k_proj: Tensor,
        v_proj: Tensor,
        biases: Optional[Tensor],
        mask: _MaskInfo,
        need_probs: bool,
    ) -> tuple[Tensor, Optional[Tensor]]:
        """Returns (context [B, T, N, H], probs [B, N, T, S]) from scaled projections.

        q_proj is [B, T, N, H]; k_proj and v_proj are [B, S, K, H] with K dividing N (query
        head n uses key/value head n // (N / K)).
        """
        del need_probs
        logits = self._logits(q_proj, k_proj)
        full_biases = self._full_biases(biases, mask, logits.dtype)
        if full_biases is not None:
            logits = logits + full_biases.astype(logits.dtype)
        probs = self._softmax(logits).astype(q_proj.dtype)
        probs = self.dropout(probs)
        return self._context(probs, v_proj), probs

    def _logits(self, q_proj: Tensor, k_proj: Tensor) -> Tensor:
        """Attention logits [B, N, T, S] of q_proj [B, T, N, H] and k_proj [B, S, K, H].

        K divides N: query head n uses key head n // (N / K). The logits are soft-capped at
        `atten_logit_cap` when it is set.
        """
        cfg = self.config
        batch, target_len, num_heads, head_dim = q_proj.shape
        source_len, kv_heads = k_proj.shape[1], k_proj.shape[2]
        q = q_proj.reshape(batch, target_len, kv_heads, num_heads // kv_heads, head_dim)
        logits = jnp.einsum("btkgh,bskh->bkgts", q, k_proj)
        logits = logits.reshape(batch, num_heads, target_len, source_len)
        if cfg.atten_logit_cap is not None and cfg.atten_logit_cap > 0:
            cap = jnp.asarray(cfg.atten_logit_cap, logits.dtype)
            logits = cap * jnp.tanh(logits / cap)
        return logits

    def _context(self, probs: Tensor, v_proj: Tensor) -> Tensor:
        """Context [B, T, N, H] of probs [B, N, T, S] over v_proj [B, S, K, H] (K divides N)."""
        batch, num_heads, target_len, source_len = probs.shape
        kv_heads, head_dim = v_proj.shape[2], v_proj.shape[3]
        grouped = probs.reshape(batch, kv_heads, num_heads // kv_heads, target_len, source_len)
        context = jnp.einsum("bkgts,bskh->btkgh", grouped, v_proj)
        return context.reshape(batch, target_len, num_heads, head_dim).astype(v_proj.dtype)


class GroupedQueryAttention(MultiheadAttention):
    """Grouped-query attention (https://arxiv.org/abs/2305.13245).

    Use with an `input_linear` that has `num_kv_heads` (e.g. `GroupedQKVLinear` or
    `FusedGroupedQKVLinear`): each key/value head serves num_heads / num_kv_heads query heads.
    With num_kv_heads == 1 it is multi-query attention; with num_kv_heads == num_heads it equals
    MultiheadAttention.
    """


class FlashAttention(GroupedQueryAttention):
    """GroupedQueryAttention computed by `jax.nn.dot_product_attention` (fused attention).

    The implementation is cuDNN on GPU for 16-bit inputs and XLA otherwise (CPU, TPU, fp32), or
    as configured. Numerically equal to the plain path up to float rounding. Falls back to the
    plain path when attention dropout is active or attention probabilities are requested.
    """

    @config_class
    class Config(GroupedQueryAttention.Config):
        """Configures FlashAttention."""

        # "xla", "cudnn", or None to pick by backend and dtype.
        implementation: Optional[str] = None

    def _implementation(self, dtype) -> str:
        impl = self.config.implementation
        if impl is not None:
            return impl
        if jax.default_backend() == "gpu" and dtype in (jnp.bfloat16, jnp.float16):
            return "cudnn"
        return "xla"

    def _compute_attention(
        self,
        *,
        q_proj: Tensor,
        k_proj: Tensor,
        v_proj: Tensor,
        biases: Optional[Tensor],
        mask: _MaskInfo,
        need_probs: bool,
    ) -> tuple[Tensor, Optional[Tensor]]:
        cfg = self.config
        dropout_rate = getattr(cfg.dropout, "rate", None) or 0.0
        if (
            need_probs
            or (self.is_training and dropout_rate > 0)
            or cfg.atten_logit_cap
            or cfg.logit_sink
        ):
            return super()._compute_attention(
                q_proj=q_proj,
                k_proj=k_proj,
                v_proj=v_proj,
                biases=biases,
                mask=mask,
                need_probs=need_probs,
            )
        is_causal, window = False, None
        if mask.mask_fn is not None and mask.default_positions:
            if mask.mask_fn is causal_mask:
                is_causal = True
            elif getattr(mask.mask_fn, "sliding_window_size", None) is not None:
                window = (mask.mask_fn.sliding_window_size, 0)
        if is_causal or window is not None:
            bias = biases
        else:
            bias = self._full_biases(biases, mask, q_proj.dtype)
        if bias is not None:
            bias = bias.astype(q_proj.dtype)
        context = jax.nn.dot_product_attention(
            q_proj,
            k_proj,
            v_proj,
            bias=bias,
            scale=1.0,
            is_causal=is_causal,
            local_window_size=window,
            implementation=self._implementation(q_proj.dtype),
        )
        return context.astype(v_proj.dtype), None
