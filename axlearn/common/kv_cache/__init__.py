"""KV caches for decoding as layers: `kv_cache.KVCache` and `paged_kv_cache.PagedKVCache`."""
