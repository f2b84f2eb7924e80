"""The KV-cache layer interface (AXLearn's `axlearn.common.kv_cache.base_kv_cache`).

A KV cache stores the projected keys and values of past positions for autoregressive decoding:

    states = cache.init_states(BaseKVCache.Shape(batch, kv_len, num_kv_heads, head_dim),
                               dtype=jnp.float32)
    states, out = cache.extend_step(states, k_proj=k, v_proj=v, key_positions=positions)

`k_proj`/`v_proj` are [batch, steps, num_kv_heads, head_dim] written at `key_positions`
[batch, steps]; `out.k_proj`/`out.v_proj` are the whole cache [batch, kv_len, num_kv_heads,
head_dim] and `out.key_positions` [1 or batch, kv_len] the position of each slot, for the
attention's causal mask (`query_position >= key_position`; slots not yet written are masked
that way, or hold stale values at positions after the query).
"""

from typing import NamedTuple, Optional

import jax.numpy as jnp

from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import config_class
from axlearn.common.utils import Nested, Tensor


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

    class Output(NamedTuple):
        """The cache after an update.

        Fields:
            k_proj: [batch, kv_len, num_kv_heads, per_head_dim].
            v_proj: [batch, kv_len, num_kv_heads, per_head_dim].
            key_positions: Int [1 or batch, kv_len]: the position of each slot.
        """

        k_proj: Tensor
        v_proj: Tensor
        key_positions: Tensor

    def _cache_dtype(self, dtype: jnp.dtype) -> jnp.dtype:
        return self.config.cache_dtype or dtype

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
        live_step_len: Optional[Tensor] = None,
    ) -> tuple[Nested[Tensor], Output]:
        """Writes `k_proj`/`v_proj` at `key_positions` and returns (states, the whole cache).

        Args:
            cached_states: From `init_states` or a previous `extend_step`.
            k_proj: [batch, steps, num_kv_heads, per_head_dim].
            v_proj: Same shape as k_proj.
            key_positions: Int [batch, steps]; positions >= kv_len are not written.
            live_step_len: Optional int [batch]: steps after this are padding (they are still
                written; the causal mask of later queries excludes them until overwritten).

        Returns:
            (updated states, Output).
        """
        raise NotImplementedError(type(self))

    @staticmethod
    def _check(k_proj: Tensor, v_proj: Tensor, key_positions: Tensor) -> None:
        if k_proj.shape != v_proj.shape:
            raise ValueError(f"k_proj.shape {k_proj.shape} != v_proj.shape {v_proj.shape}")
        if key_positions.shape != k_proj.shape[:2]:
            raise ValueError(
                f"key_positions.shape {key_positions.shape} != [batch, steps] {k_proj.shape[:2]}"
            )
