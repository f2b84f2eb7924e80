"""A paged KV cache: fixed-size pages in a shared pool, mapped per sequence by a page table.

States: `key`/`value` pools [num_kv_heads, num_pages, page_size, per_head_dim] and
`page_indices` [batch, pages_per_sequence] (page p of sequence b is pool page
`page_indices[b, p]`). Position t of sequence b lives at page `page_indices[b, t // page_size]`,
offset `t % page_size`. `init_states` allocates `batch * pages_per_sequence` pages and maps them
contiguously (a serving system may remap `page_indices` to share or recycle pages). The output
is the same logical cache view as `KVCache`, so attention is unchanged.
"""

import math
from typing import Optional

import jax.numpy as jnp

from axlearn.common.config import config_class
from axlearn.common.kv_cache.base_kv_cache import BaseKVCache
from axlearn.common.module import nowrap
from axlearn.common.utils import Nested, Tensor


class PagedKVCache(BaseKVCache):
    """A KV cache stored in pages of `page_size` positions."""

    @config_class
    class Config(BaseKVCache.Config):
        """Configures PagedKVCache."""

        page_size: int = 16  # Positions per page.

    @nowrap
    def init_states(self, shape: BaseKVCache.Shape, *, dtype: jnp.dtype) -> Nested[Tensor]:
        """Zero page pools and a contiguous page table of ceil(kv_len / page_size) pages per row.

        When kv_len is not a multiple of page_size, the cache view is rounded up to whole pages.
        """
        page_size = self.config.page_size
        pages_per_seq = math.ceil(shape.kv_len / page_size)
        num_pages = shape.batch_size * pages_per_seq
        pool = (shape.num_kv_heads, num_pages, page_size, shape.per_head_dim)
        dtype = self._cache_dtype(dtype)
        return dict(
            key=jnp.zeros(pool, dtype),
            value=jnp.zeros(pool, dtype),
            page_indices=jnp.arange(num_pages, dtype=jnp.int32).reshape(
                shape.batch_size, pages_per_seq
            ),
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
        page_indices = cached_states["page_indices"]
        page_size = key.shape[2]
        kv_len = page_indices.shape[1] * page_size
        key_positions = self._write_positions(
            k_proj,
            v_proj,
            key_positions,
            segment_ids=segment_ids,
            live_step_len=live_step_len,
            invalid=-1,
        )
        in_range = (key_positions >= 0) & (key_positions < kv_len)
        page = jnp.take_along_axis(
            page_indices, jnp.clip(key_positions // page_size, 0, page_indices.shape[1] - 1), 1
        )
        # Out-of-range writes go to an index past the pool and are dropped.
        page = jnp.where(in_range, page, key.shape[1])
        offset = key_positions % page_size
        # Scatter [batch, steps, heads, dim] into [heads, pages, page_size, dim].
        k_src = jnp.moveaxis(k_proj.astype(key.dtype), 2, 0)  # [heads, batch, steps, dim].
        v_src = jnp.moveaxis(v_proj.astype(value.dtype), 2, 0)
        key = key.at[:, page, offset].set(k_src, mode="drop")
        value = value.at[:, page, offset].set(v_src, mode="drop")

        def view(pool):
            # [heads, batch, pages_per_seq, page_size, dim] -> [batch, kv_len, heads, dim].
            pages = pool[:, page_indices]
            pages = pages.reshape(pool.shape[0], page_indices.shape[0], kv_len, pool.shape[-1])
            return jnp.moveaxis(pages, 0, 2)

        output = self.Output(
            k_proj=view(key), v_proj=view(value), key_positions=jnp.arange(kv_len)[None]
        )
        return dict(key=key, value=value, page_indices=page_indices), output
