"""Multi-head attention: MultiheadAttention, GroupedQueryAttention and FlashAttention.

Public names are re-exported by `axlearn.common.attention`.

Masking: the attention logits of query i and key j get the sum of
* the `attention_logit_biases` argument (see `axlearn.common.attention_bias`),
* the config's mask (`causal=True` or `mask=<MaskFn config>`), evaluated on sequence indices
  (0..T-1 in `forward`; the absolute cache positions in `extend_step`),
* a segment mask when `segment_ids` is given (packed sequences attend within their segment).
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from axlearn.common.attention.cache_kwargs import accepts_empty_cache_kwargs
from axlearn.common.attention.qkv import (
    MultiheadOutputLinear,
    QKVLinear,
    _input_linear_config,
)
from axlearn.common.attention.scale import ScaleKey, ScaleQuery
from axlearn.common.attention_bias import (
    MaskFn,
    add_biases,
    causal_mask,
    make_segment_mask,
    mask_fn_bias,
)
from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import (
    REQUIRED,
    ConfigOr,
    InstantiableConfig,
    Required,
    config_class,
    maybe_instantiate,
)
from axlearn.common.kv_cache.base_kv_cache import BaseKVCache
from axlearn.common.kv_cache.kv_cache import KVCache
from axlearn.common.layers import Dropout
from axlearn.common.module import Module
from axlearn.common.utils import NestedTensor, Tensor


class _MaskInfo(NamedTuple):
    """A mask function with the positions to evaluate it at (lazily materialized)."""

    mask_fn: Optional[MaskFn]
    # [batch or 1, target_length] int.
    target_positions: Tensor
    # [batch or 1, source_length] int.
    source_positions: Tensor
    # Whether target/source positions are both arange(length) (full-sequence forward).
    default_positions: bool


def _set_cache_dtype(qkv_cfg: InstantiableConfig, cache_dtype) -> None:
    """Sets `cache_dtype` on a QKV projection config and its nested `input_linear`s (if unset)."""
    node = qkv_cfg
    while node is not None:
        if "cache_dtype" in node and node.cache_dtype is None:
            node.cache_dtype = cache_dtype
        node = getattr(node, "input_linear", None) if "input_linear" in node else None


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
        # Optional KV cache config (e.g. `KVCache` with `cache_dtype`) of decoding; its cache_dtype
        # becomes the QKV projection's (and any nested projection's) unless those set their own.
        # None (or a cache without cache_dtype, the default): the projections' own cache_dtype
        # (default: the layer dtype).
        kv_cache: Optional[BaseKVCache.Config] = KVCache.default_config()

    class Output(NamedTuple):
        """Attention outputs.

        Fields:
            data: [batch, target_length, output_dim].
            probs: [batch, num_heads, target_length, source_length] if "probs" in return_aux.
        """

        data: Tensor
        probs: Optional[Tensor] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.causal and cfg.mask is not None:
            raise ValueError(f"{self.path()}: set either causal or mask, not both")
        self._mask_fn = causal_mask if cfg.causal else maybe_instantiate(cfg.mask)
        per_head_dim = self.per_head_dim()
        i_proj_cfg = _input_linear_config(cfg, per_head_dim=per_head_dim)
        if cfg.kv_cache is not None:
            _set_cache_dtype(i_proj_cfg, cfg.kv_cache.cache_dtype)
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
            attention_logit_biases: Optional bias, see `axlearn.common.attention_bias`.
            segment_ids: Optional [batch, length] segment ids (self-attention).
            query_positions: Optional [batch, target_length] positions for position encodings
                (e.g. RoPE restarts at 0 per packed segment); masks use sequence indices.
            return_aux: Optional set; "probs" requests the attention probabilities.

        Returns:
            An Output.
        """
        if (key is None) != (value is None):
            raise ValueError(
                f"{self.path()}: key and value must be both None or both set (got key "
                f"{'None' if key is None else 'set'}, value {'None' if value is None else 'set'}); "
                "pass both for cross-attention, neither for self-attention."
            )
        q, k, v = self.i_proj(query, key=key, value=value, query_positions=query_positions)
        mask = self._mask_info(jnp.arange(q.shape[1])[None], k.shape[1], default_positions=True)
        segment_bias = None
        if segment_ids is not None:
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
        )

    @accepts_empty_cache_kwargs(input_name="query", dim_field="query_dim")
    def init_states(
        self,
        *,
        time_step: Optional[Tensor] = None,
        query: Optional[Tensor] = None,
        attention_logit_biases: Optional[Tensor] = None,
        return_aux: Optional[set[str]] = None,
    ) -> tuple[NestedTensor, Optional[Output]]:
        """Creates the KV cache for self-attention decoding, empty or prefilled.

        Args:
            time_step: None for an empty cache, or [batch] positions where decoding continues
                (then the whole `query` is processed and cached).
            query: [batch, max_len, query_dim] (a `jax.ShapeDtypeStruct` for an empty cache).
            attention_logit_biases: Optional biases for the prefill.
            return_aux: See `forward`.

        Returns:
            (cache, output): output is None for an empty cache.
        """
        i_proj_state, proj = self.i_proj.init_states(time_step=time_step, query=query)
        if proj is None:
            return dict(i_proj=i_proj_state), None
        target_len, source_len = query.shape[1], proj.key.shape[1]
        mask = self._mask_info(
            jnp.arange(target_len)[None], source_len, default_positions=target_len == source_len
        )
        output = self._attend(
            *proj, biases=add_biases(attention_logit_biases), mask=mask, return_aux=return_aux
        )
        return dict(i_proj=i_proj_state), output

    def extend_step(
        self,
        cached_states: NestedTensor,
        query: Tensor,
        *,
        attention_logit_biases: Optional[Tensor] = None,
        return_aux: Optional[set[str]] = None,
    ) -> tuple[NestedTensor, Output]:
        """Attends `query` (at positions time_step + [0, steps)) over the cache, updating it.

        Args:
            cached_states: From `init_states` or a previous `extend_step`.
            query: [batch, steps, query_dim].
            attention_logit_biases: Optional biases [..., steps, max_len].
            return_aux: See `forward`.

        Returns:
            (updated cache, output).
        """
        time_step = cached_states["i_proj"]["time_step"]
        i_proj_state, proj = self.i_proj.extend_step(cached_states["i_proj"], query)
        steps, max_len = query.shape[1], proj.key.shape[1]
        mask = self._mask_info(
            time_step[:, None] + jnp.arange(steps)[None], max_len, default_positions=False
        )
        output = self._attend(
            *proj, biases=add_biases(attention_logit_biases), mask=mask, return_aux=return_aux
        )
        return dict(i_proj=i_proj_state), output

    def _mask_info(
        self, target_positions: Tensor, source_len: int, *, default_positions: bool
    ) -> _MaskInfo:
        """The config's mask at `target_positions` and source positions arange(source_len)."""
        return _MaskInfo(
            self._mask_fn,
            target_positions,
            jnp.arange(source_len)[None],
            default_positions=default_positions,
        )

    def _attend(
        self,
        q_proj: Tensor,
        k_proj: Tensor,
        v_proj: Tensor,
        *,
        biases: Optional[Tensor],
        mask: _MaskInfo,
        return_aux: Optional[set[str]],
    ) -> Output:
        q_proj = self._remat_name(q_proj, "q_proj")
        k_proj = self._remat_name(k_proj, "k_proj")
        v_proj = self._remat_name(v_proj, "v_proj")
        q_proj = self.scale_query(q_proj)
        k_proj = self.scale_key(k_proj)
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
        outputs = self._remat_name(self.o_proj(context), "o_proj")
        return self.Output(data=outputs, probs=probs if "probs" in return_aux else None)

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
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(q_proj.dtype)
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
        if need_probs or (self.is_training and dropout_rate > 0) or cfg.atten_logit_cap:
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
