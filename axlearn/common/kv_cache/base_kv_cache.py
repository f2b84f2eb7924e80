"""The KV-cache layer interface (AXLearn's `axlearn.common.kv_cache.base_kv_cache`).

A KV cache stores the projected keys and values of past positions for autoregressive decoding:

    states = cache.init_states(BaseKVCache.Shape(batch, kv_len, num_kv_heads, head_dim),
                               dtype=jnp.float32)
    states, out = cache.extend_step(states, k_proj=k, v_proj=v, key_positions=positions)

`k_proj`/`v_proj` are [batch, steps, num_kv_heads, head_dim] written at `key_positions`
[1 or batch, steps]; `out.k_proj`/`out.v_proj` are the keys/values to attend to [batch,
source_length, num_kv_heads, head_dim] and `out.key_positions` [1 or batch, source_length] the
position of each, for the attention's mask (`query_position >= key_position`; slots not yet
written are masked that way, or hold stale values at positions after the query).

`segment_ids` [batch, steps] (optional): steps whose id is 0 are padding and are not written.

`KVState(k_proj, v_proj, key_positions)` is the key/value state an attention layer returns
(`return_aux={"kv_state"}`) and takes (`forward(kv_state=...)`, KV sharing between layers).
"""

from typing import NamedTuple, Optional

import jax.numpy as jnp

from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import config_class
from axlearn.common.module import nowrap
from axlearn.common.utils import Nested, Tensor


class KVState(NamedTuple):
    """Key/value projections and their positions.

    Fields:
        k_proj: [batch, source_length, num_kv_heads, per_head_dim].
        v_proj: [batch, source_length, num_kv_heads, per_head_dim].
        key_positions: Optional int [1 or batch, source_length]: the position of each key;
            None means arange(source_length).
        page_indices: Optional [batch, pages_per_sequence] page table (paged caches).
    """

    k_proj: Tensor
    v_proj: Tensor
    key_positions: Optional[Tensor] = None
    page_indices: Optional[Tensor] = None


class BaseKVCache(BaseLayer):
    """Stores keys and values of past positions (see the module docstring)."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseKVCache."""

        # The dtype of the stored keys and values; None: the dtype given to init_states.
        cache_dtype: Optional[jnp.dtype] = None

    class Shape(NamedTuple):
        """The logical shape of a cache."""

        batch_size: int
        kv_len: int
        num_kv_heads: int
        per_head_dim: int

    class Output(KVState):
        """The keys/values to attend to after an update (a `KVState`; see the module docstring)."""

    def _cache_dtype(self, dtype: jnp.dtype) -> jnp.dtype:
        return self.config.cache_dtype or dtype

    @nowrap
    def init_states(self, shape: Shape, *, dtype: jnp.dtype) -> Nested[Tensor]:
        """Returns an empty cache of `shape`."""
        raise NotImplementedError(type(self))

    def extend_step(
        self,
        cached_states: Nested[Tensor],
        *,
        k_proj: Tensor,
        v_proj: Tensor,
        key_positions: Tensor,
        segment_ids: Optional[Tensor] = None,
        live_step_len: Optional[Tensor] = None,
    ) -> tuple[Nested[Tensor], Output]:
        """Writes `k_proj`/`v_proj` at `key_positions` and returns (states, the keys to attend).

        Args:
            cached_states: From `init_states` or a previous `extend_step`.
            k_proj: [batch, steps, num_kv_heads, per_head_dim].
            v_proj: Same shape as k_proj.
            key_positions: Int [1 or batch, steps]; positions outside [0, kv_len) are not written.
            segment_ids: Optional int [batch, steps]; steps with id 0 are padding, not written.
            live_step_len: Optional int [batch]: steps at or after this are padding (not
                written), like `segment_ids == 0` there.

        Returns:
            (updated states, Output).
        """
        raise NotImplementedError(type(self))

    @classmethod
    def maybe_normalize_kv(cls, kv_state: KVState) -> tuple[Tensor, Tensor]:
        """Returns (k_proj, v_proj) of `kv_state`, each [batch, source_length, heads, dim]."""
        return kv_state.k_proj, kv_state.v_proj

    @staticmethod
    def _write_positions(
        k_proj: Tensor,
        v_proj: Tensor,
        key_positions: Tensor,
        *,
        segment_ids: Optional[Tensor],
        live_step_len: Optional[Tensor],
        invalid: int,
    ) -> Tensor:
        """Checks shapes; returns [batch, steps] positions with padding steps set to `invalid`."""
        if k_proj.shape != v_proj.shape:
            raise ValueError(f"k_proj.shape {k_proj.shape} != v_proj.shape {v_proj.shape}")
        batch, steps = k_proj.shape[:2]
        if key_positions.ndim != 2 or key_positions.shape[1] != steps:
            raise ValueError(
                f"key_positions.shape {key_positions.shape} != [1 or batch, steps] "
                f"{k_proj.shape[:2]}"
            )
        positions = jnp.broadcast_to(key_positions, (batch, steps))
        if segment_ids is not None:
            positions = jnp.where(segment_ids != 0, positions, invalid)
        if live_step_len is not None:
            live = jnp.arange(steps)[None] < live_step_len[:, None]
            positions = jnp.where(live, positions, invalid)
        return positions
