"""The default KV cache: one [batch, num_kv_heads, per_head_dim, kv_len] buffer per K and V.

Keys and values are stored with the length last (one-hot writes then contract over it). See
`base_kv_cache` for the interface.
"""

from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp

from axlearn.common.config import config_class
from axlearn.common.kv_cache.base_kv_cache import BaseKVCache
from axlearn.common.module import Module, nowrap
from axlearn.common.utils import Nested, Tensor, maybe_shard


class KVCache(BaseKVCache):
    """A dense KV cache of `kv_len` slots per sequence, written at key positions."""

    @config_class
    class Config(BaseKVCache.Config):
        """Configures KVCache."""

        # Optional partition spec of the cached keys/values, in the order of the projections
        # [batch, kv_len, num_kv_heads, per_head_dim] (e.g. (("data", "fsdp"), "seq", "model",
        # None)); the buffers and the returned k_proj/v_proj are constrained to it. None: no
        # constraint.
        kv_partition_spec: Optional[Sequence] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        spec = self.config.kv_partition_spec
        if spec is not None and len(spec) != 4:
            raise ValueError(
                f"{self.path()}.kv_partition_spec={tuple(spec)!r} must have 4 entries "
                "([batch, kv_len, num_kv_heads, per_head_dim]); set it so, or None."
            )

    def _buffer_spec(self) -> Optional[tuple]:
        """kv_partition_spec in the buffers' order [batch, num_kv_heads, per_head_dim, kv_len]."""
        spec = self.config.kv_partition_spec
        return None if spec is None else (spec[0], spec[2], spec[3], spec[1])

    @nowrap
    def init_states(self, shape: BaseKVCache.Shape, *, dtype: jnp.dtype) -> Nested[Tensor]:
        """Zero key/value buffers [batch, num_kv_heads, per_head_dim, kv_len]."""
        full = (shape.batch_size, shape.num_kv_heads, shape.per_head_dim, shape.kv_len)
        dtype = self._cache_dtype(dtype)
        spec = self._buffer_spec()
        return dict(
            key=maybe_shard(jnp.zeros(full, dtype), spec),
            value=maybe_shard(jnp.zeros(full, dtype), spec),
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
        """See `BaseKVCache.extend_step`."""
        key, value = cached_states["key"], cached_states["value"]
        kv_len = key.shape[-1]
        # Padding steps get position -1: their one-hot rows are all zero (nothing written).
        positions = self._write_positions(
            k_proj,
            v_proj,
            key_positions,
            segment_ids=segment_ids,
            live_step_len=live_step_len,
            invalid=-1,
        )
        # [batch, steps, kv_len]: which slot each step writes (none if out of range).
        write = jax.nn.one_hot(positions, kv_len, dtype=key.dtype)
        keep = (1 - write.sum(axis=1))[:, None, None, :]
        new_k = jnp.einsum("btnh,bts->bnhs", k_proj.astype(key.dtype), write)
        new_v = jnp.einsum("btnh,bts->bnhs", v_proj.astype(value.dtype), write)
        spec = self._buffer_spec()
        key = maybe_shard(key * keep + new_k, spec)
        value = maybe_shard(value * keep + new_v, spec)
        out_spec = self.config.kv_partition_spec
        output = self.Output(
            k_proj=maybe_shard(jnp.einsum("bnhs->bsnh", key), out_spec),
            v_proj=maybe_shard(jnp.einsum("bnhs->bsnh", value), out_spec),
            key_positions=jnp.arange(kv_len)[None],
        )
        return dict(key=key, value=value), output
