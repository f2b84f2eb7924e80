"""KV caches for decoding as layers: `kv_cache.KVCache` and `paged_kv_cache.PagedKVCache`;
`sliding_window_kv_cache.enable_sliding_window_attention` configures sliding-window attention."""
