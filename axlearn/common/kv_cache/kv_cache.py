"""The default KV cache: one [batch, num_kv_heads, per_head_dim, kv_len] buffer per K and V.

Keys and values are stored with the length last (one-hot writes then contract over it). See
`base_kv_cache` for the interface.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from axlearn.common.kv_cache.base_kv_cache import BaseKVCache
from axlearn.common.utils import Nested, Tensor


class KVCache(BaseKVCache):
    """A dense KV cache of `kv_len` slots per sequence, written at key positions."""

    def init_states(self, shape: BaseKVCache.Shape, *, dtype: jnp.dtype) -> Nested[Tensor]:
        """Zero key/value buffers [batch, num_kv_heads, per_head_dim, kv_len]."""
        full = (shape.batch_size, shape.num_kv_heads, shape.per_head_dim, shape.kv_len)
        dtype = self._cache_dtype(dtype)
        return dict(key=jnp.zeros(full, dtype), value=jnp.zeros(full, dtype))

    def extend_step(
        self,
        cached_states: Nested[Tensor],
        *,
        k_proj: Tensor,
        v_proj: Tensor,
        key_positions: Tensor,
        live_step_len: Optional[Tensor] = None,
    ) -> tuple[Nested[Tensor], BaseKVCache.Output]:
        """See `BaseKVCache.extend_step`."""
        del live_step_len
        self._check(k_proj, v_proj, key_positions)
        key, value = cached_states["key"], cached_states["value"]
        kv_len = key.shape[-1]
        # [batch, steps, kv_len]: which slot each step writes (none if out of range).
        write = jax.nn.one_hot(key_positions, kv_len, dtype=key.dtype)
        keep = (1 - write.sum(axis=1))[:, None, None, :]
        new_k = jnp.einsum("btnh,bts->bnhs", k_proj.astype(key.dtype), write)
        new_v = jnp.einsum("btnh,bts->bnhs", v_proj.astype(value.dtype), write)
        key = key * keep + new_k
        value = value * keep + new_v
        output = self.Output(
            k_proj=jnp.einsum("bnhs->bsnh", key),
            v_proj=jnp.einsum("bnhs->bsnh", value),
            key_positions=jnp.arange(kv_len)[None],
        )
        return dict(key=key, value=value), output
