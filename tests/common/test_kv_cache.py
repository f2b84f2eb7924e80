"""Tests of axlearn.common.kv_cache: attention over the cache equals the plain causal path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.kv_cache.base_kv_cache import BaseKVCache
from axlearn.common.kv_cache.kv_cache import KVCache
from axlearn.common.kv_cache.paged_kv_cache import PagedKVCache
from axlearn.common.module import functional

B, T, NQ, N, H = 2, 16, 4, 2, 8


def _plain_attention(q, k, v, query_pos, key_pos):
    """NumPy GQA softmax attention of q [B, S, NQ, H] over k/v [B, T, N, H], causal by position."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    k = np.repeat(k, NQ // N, axis=2)
    v = np.repeat(v, NQ // N, axis=2)
    logits = np.einsum("bsnh,btnh->bnst", q, k)
    mask = np.asarray(query_pos)[:, None, :, None] >= np.asarray(key_pos)[:, None, None, :]
    logits = np.where(mask, logits, -1e30)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnst,btnh->bsnh", probs, v)


def _cache(cls, **kwargs):
    return cls.default_config().set(name="cache", **kwargs).instantiate(parent=None)


def _call(layer, method, **inputs):
    out, _ = functional(layer, None, {}, inputs, method=method, is_training=False)
    return out


@pytest.mark.parametrize("cls,kwargs", [(KVCache, {}), (PagedKVCache, dict(page_size=4))])
def test_cached_attention_equals_plain_path(cls, kwargs):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(keys[0], (B, T, NQ, H))
    k = jax.random.normal(keys[1], (B, T, N, H))
    v = jax.random.normal(keys[2], (B, T, N, H))
    positions = np.broadcast_to(np.arange(T), (B, T))
    expected = _plain_attention(q, k, v, positions, positions)

    cache = _cache(cls, **kwargs)
    states = _call(cache, "init_states", shape=BaseKVCache.Shape(B, T, N, H), dtype=jnp.float32)
    # Prefill 5 positions at once, then one position per step.
    prefill = 5
    states, out = _call(
        cache,
        "extend_step",
        cached_states=states,
        k_proj=k[:, :prefill],
        v_proj=v[:, :prefill],
        key_positions=jnp.asarray(positions[:, :prefill]),
    )
    got = _plain_attention(
        q[:, :prefill], out.k_proj, out.v_proj, positions[:, :prefill], out.key_positions
    )
    np.testing.assert_allclose(got, expected[:, :prefill], atol=1e-5)
    for t in range(prefill, T):
        states, out = _call(
            cache,
            "extend_step",
            cached_states=states,
            k_proj=k[:, t : t + 1],
            v_proj=v[:, t : t + 1],
            key_positions=jnp.asarray(positions[:, t : t + 1]),
        )
        assert out.k_proj.shape == (B, T, N, H)
        got = _plain_attention(
            q[:, t : t + 1], out.k_proj, out.v_proj, positions[:, t : t + 1], out.key_positions
        )
        np.testing.assert_allclose(got, expected[:, t : t + 1], atol=1e-5)
    # After all steps the cache holds exactly k and v.
    np.testing.assert_array_equal(out.k_proj, k)
    np.testing.assert_array_equal(out.v_proj, v)
    # A write past the end changes nothing.
    _, after = _call(
        cache,
        "extend_step",
        cached_states=states,
        k_proj=jnp.ones((B, 1, N, H)),
        v_proj=jnp.ones((B, 1, N, H)),
        key_positions=jnp.full((B, 1), T),
    )
    np.testing.assert_array_equal(after.k_proj, k)


def test_paged_equals_dense_with_per_row_positions_and_dtype():
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    k = jax.random.normal(keys[0], (B, 3, N, H))
    v = jax.random.normal(keys[1], (B, 3, N, H))
    pos = jnp.array([[0, 1, 2], [6, 7, 8]])  # Rows write at different positions.
    outs = []
    for cache in (_cache(KVCache), _cache(PagedKVCache, page_size=4)):
        states = _call(
            cache, "init_states", shape=BaseKVCache.Shape(B, T, N, H), dtype=jnp.bfloat16
        )
        assert states["key"].dtype == jnp.bfloat16
        _, out = _call(
            cache, "extend_step", cached_states=states, k_proj=k, v_proj=v, key_positions=pos
        )
        outs.append(out)
    np.testing.assert_array_equal(outs[0].k_proj, outs[1].k_proj)
    np.testing.assert_array_equal(outs[0].v_proj, outs[1].v_proj)
    np.testing.assert_array_equal(
        outs[0].k_proj[1, 6:9].astype(jnp.float32), k[1].astype(jnp.bfloat16).astype(jnp.float32)
    )
    assert float(jnp.abs(outs[0].k_proj[1, :6].astype(jnp.float32)).sum()) == 0
    # A kv_len that is not a multiple of page_size is rounded up to whole pages.
    paged = _call(
        _cache(PagedKVCache, page_size=5),
        "init_states",
        shape=BaseKVCache.Shape(B, T, N, H),
        dtype=jnp.float32,
    )
    assert paged["page_indices"].shape == (B, -(-T // 5))
    assert paged["key"].shape == (N, B * -(-T // 5), 5, H)
    with pytest.raises(ValueError, match="key_positions.shape"):
        _call(
            _cache(KVCache),
            "extend_step",
            cached_states=_call(
                _cache(KVCache),
                "init_states",
                shape=BaseKVCache.Shape(B, T, N, H),
                dtype=jnp.float32,
            ),
            k_proj=k,
            v_proj=v,
            key_positions=pos[:, :2],
        )


def test_kv_partition_spec_shards_the_buffers_and_outputs():
    """kv_partition_spec (projection order [batch, kv_len, heads, dim]) shards the buffers
    [batch, heads, dim, kv_len] and the returned k/v over the mesh; values are unchanged."""
    spec = (("data", "fsdp"), "seq", "model", None)
    cache = _cache(KVCache, kv_partition_spec=spec)
    k = jax.random.normal(jax.random.PRNGKey(1), (4, 8, N, H))
    positions = jnp.broadcast_to(jnp.arange(8), (4, 8))
    devices = np.array(jax.devices()[:8]).reshape(2, 1, 2, 2)
    mesh = jax.sharding.Mesh(devices, ("data", "fsdp", "seq", "model"))

    @jax.jit
    def run(k):
        states = _call(cache, "init_states", shape=BaseKVCache.Shape(4, 8, N, H), dtype=k.dtype)
        return _call(
            cache,
            "extend_step",
            cached_states=states,
            k_proj=k,
            v_proj=2 * k,
            key_positions=positions,
        )

    with jax.set_mesh(mesh):
        states, out = run(k)

    def sharded_as(x, *axes):
        return x.sharding.is_equivalent_to(
            jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes)), x.ndim
        )

    assert sharded_as(states["key"], ("data", "fsdp"), "model", None, "seq")
    assert sharded_as(out.k_proj, *spec)
    assert not sharded_as(out.k_proj, None, None, None, None)
    np.testing.assert_allclose(out.k_proj, k, atol=1e-6)
    np.testing.assert_allclose(out.v_proj, 2 * k, atol=1e-6)


def test_kv_partition_spec_of_wrong_rank_is_an_error():
    with pytest.raises(ValueError, match=r"cache\.kv_partition_spec=.*must have 4 entries"):
        _cache(KVCache, kv_partition_spec=("data", None))
