"""Sliding-window attention: a rolling KV cache and `enable_sliding_window_attention`.

`SlidingWindowKVCache` keeps only the last `cached_kv_length` positions of each sequence, in a
ring buffer: position p lives in slot `p % cached_kv_length`. `extend_step` returns the cache as
it was before the step followed by the step's own keys/values, with the true position of every
entry (`key_positions`), so the attention mask (e.g. the sliding-window causal mask) picks the
visible ones; slots never written hold a position larger than any query, which causal masks
exclude. The attended source length is `cached_kv_length + steps`, whatever the decode length.

`enable_sliding_window_attention(cfg, sliding_window_size)` returns a copy of an attention
layer's config (`MultiheadAttention` and its subclasses) whose mask is
`SlidingWindowAttentionBias.default_config(sliding_window_size=...)` (a query at position q
attends to keys at positions `q - sliding_window_size ... q`) and whose decoding cache is a
`SlidingWindowKVCache` of `sliding_window_size` slots (keeping the old cache's `cache_dtype`).
The causal flag is cleared (the sliding-window mask is causal itself).
"""

from typing import Optional

import jax
import jax.numpy as jnp

from axlearn.common.attention_bias import SlidingWindowAttentionBias
from axlearn.common.config import REQUIRED, ConfigBase, Required, config_class
from axlearn.common.kv_cache.base_kv_cache import BaseKVCache
from axlearn.common.module import nowrap
from axlearn.common.utils import Nested, Tensor

# The position of a slot never written (or of a padding step): larger than any query position,
# so `query_position >= key_position` is False for it.
_EMPTY_POSITION = int(jnp.iinfo(jnp.int32).max)


class SlidingWindowKVCache(BaseKVCache):
    """A ring-buffer KV cache of the last `cached_kv_length` positions (see the module doc)."""

    @config_class
    class Config(BaseKVCache.Config):
        """Configures SlidingWindowKVCache."""

        # Slots per sequence (the window the cache keeps); `init_states` ignores shape.kv_len.
        cached_kv_length: Required[int] = REQUIRED

    @nowrap
    def init_states(self, shape: BaseKVCache.Shape, *, dtype: jnp.dtype) -> Nested[Tensor]:
        """Empty buffers [batch, num_kv_heads, per_head_dim, cached_kv_length] and positions.

        Raises:
            ValueError: If cached_kv_length is not positive.
        """
        length = self.config.cached_kv_length
        if not isinstance(length, int) or length <= 0:
            raise ValueError(
                f"{self.path()}.cached_kv_length={length!r} must be a positive int; set it to "
                "the sliding window size."
            )
        full = (shape.batch_size, shape.num_kv_heads, shape.per_head_dim, length)
        dtype = self._cache_dtype(dtype)
        return dict(
            key=jnp.zeros(full, dtype),
            value=jnp.zeros(full, dtype),
            key_positions=jnp.full((shape.batch_size, length), _EMPTY_POSITION, jnp.int32),
        )

    def extend_step(
        self,
        cached_states: Nested[Tensor],
        *,
        k_proj: Tensor,
        v_proj: Tensor,
        key_positions: Tensor,
        segment_ids: Optional[Tensor] = None,
        live_step_len: Optional[Tensor] = None,
    ) -> tuple[Nested[Tensor], BaseKVCache.Output]:
        """Writes the step's live positions into the ring; returns (states, old cache + step).

        See `BaseKVCache.extend_step`. The output's step part keeps the step's true positions
        (padding steps included), so a prefill attends exactly as the full forward pass does.
        """
        key, value = cached_states["key"], cached_states["value"]
        cached_pos = cached_states["key_positions"]
        length = key.shape[-1]
        batch, steps = k_proj.shape[:2]
        step_pos = jnp.broadcast_to(key_positions, (batch, steps)).astype(jnp.int32)
        positions = self._write_positions(
            k_proj,
            v_proj,
            step_pos,
            segment_ids=segment_ids,
            live_step_len=live_step_len,
            invalid=-1,
        )
        valid = positions >= 0
        # Of the step's live positions only the last `length` survive in the ring.
        newest = jnp.max(jnp.where(valid, positions, -1), axis=1, keepdims=True)
        kept = valid & (positions > newest - length)
        slot = jnp.where(kept, positions % length, -1)
        # [batch, steps, length]: which slot each step writes (none for padding/evicted steps).
        write = jax.nn.one_hot(slot, length, dtype=key.dtype)
        keep = 1 - write.sum(axis=1)  # [batch, length]
        new_k = jnp.einsum("btnh,bts->bnhs", k_proj.astype(key.dtype), write)
        new_v = jnp.einsum("btnh,bts->bnhs", v_proj.astype(value.dtype), write)
        written = jax.nn.one_hot(slot, length, dtype=jnp.int32)
        new_pos = jnp.einsum("bt,bts->bs", jnp.where(kept, positions, 0), written)
        updated = dict(
            key=key * keep[:, None, None, :] + new_k,
            value=value * keep[:, None, None, :] + new_v,
            key_positions=jnp.where(written.sum(axis=1) > 0, new_pos, cached_pos),
        )
        output = self.Output(
            k_proj=jnp.concatenate(
                [jnp.einsum("bnhs->bsnh", key), k_proj.astype(key.dtype)], axis=1
            ),
            v_proj=jnp.concatenate(
                [jnp.einsum("bnhs->bsnh", value), v_proj.astype(value.dtype)], axis=1
            ),
            key_positions=jnp.concatenate([cached_pos, step_pos], axis=1),
        )
        return updated, output


def enable_sliding_window_attention(cfg: ConfigBase, sliding_window_size: int) -> ConfigBase:
    """Returns a copy of the attention config `cfg` with sliding-window attention.

    Args:
        cfg: An attention layer config with `mask` and `causal` fields (e.g.
            `MultiheadAttention.Config`).
        sliding_window_size: How many previous positions each query sees besides itself (>= 0).

    Returns:
        The modified copy: the sliding-window mask and, if `cfg` has a `kv_cache` field, a
        `SlidingWindowKVCache` of `sliding_window_size` slots (at least 1).

    Raises:
        ValueError: If `cfg` has no `mask` field or the window size is negative.
    """
    if "mask" not in cfg:
        raise ValueError(
            f"enable_sliding_window_attention needs an attention config with a `mask` field "
            f"(e.g. MultiheadAttention.Config), got {type(cfg).__name__}"
        )
    if not isinstance(sliding_window_size, int) or sliding_window_size < 0:
        raise ValueError(f"sliding_window_size must be an int >= 0, got {sliding_window_size!r}")
    cfg = cfg.clone()
    if "causal" in cfg:
        cfg.causal = False
    cfg.mask = SlidingWindowAttentionBias.default_config(sliding_window_size=sliding_window_size)
    if "kv_cache" in cfg:
        cache_dtype = cfg.kv_cache.cache_dtype if cfg.kv_cache is not None else None
        cfg.kv_cache = SlidingWindowKVCache.default_config().set(
            cache_dtype=cache_dtype, cached_kv_length=max(sliding_window_size, 1)
        )
    return cfg
