"""Tests of MultiheadAttention's decoding interface (axlearn.common.attention.multihead):
`init_states(batch_size=, max_len=)`, `extend_step(is_prefill=, segment_ids=)`, `kv_state`,
`scale_kv_before_cache_update` and the sliding-window KV cache, against NumPy float64 attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.attention import (
    GroupedQKVLinear,
    GroupedQueryAttention,
    KVState,
    MultiheadAttention,
    QLinear,
)
from axlearn.common.kv_cache.sliding_window_kv_cache import (
    SlidingWindowKVCache,
    enable_sliding_window_attention,
)
from axlearn.common.layers import RMSNorm
from axlearn.common.module import functional

D, N, K, B, T = 16, 4, 2, 2, 7
H = D // N


def _gqa_cfg(**kwargs):
    return GroupedQueryAttention.default_config().set(
        name="attn",
        query_dim=D,
        key_dim=D,
        value_dim=D,
        num_heads=N,
        input_linear=GroupedQKVLinear.default_config().set(num_kv_heads=K),
        causal=True,
        **kwargs,
    )


def _call(layer, params, method="forward", **inputs):
    out, _ = functional(
        layer, jax.random.PRNGKey(0), params, inputs, method=method, is_training=False
    )
    return out


def _np_attention(params, x, *, window=None, key_norm=False):
    """Float64 reference of grouped-query causal (or sliding-window) self-attention."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x = np.asarray(x, np.float64)

    def proj(name):
        return (
            np.einsum("btd,dnh->btnh", x, p["i_proj"][name]["weight"]) + p["i_proj"][name]["bias"]
        )

    q, k, v = proj("q_proj") * H**-0.5, proj("k_proj"), proj("v_proj")
    if key_norm:
        k = k / np.sqrt(np.mean(k * k, axis=-1, keepdims=True) + 1e-8)
    k, v = np.repeat(k, N // K, axis=2), np.repeat(v, N // K, axis=2)
    logits = np.einsum("btnh,bsnh->bnts", q, k)
    t, s = np.arange(x.shape[1])[:, None], np.arange(x.shape[1])[None]
    visible = t >= s if window is None else (t >= s) & (t - s <= window)
    logits = np.where(visible, logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bnts,bsnh->btnh", probs, v)
    return np.einsum("btnh,dnh->btd", context, p["o_proj"]["weight"]) + p["o_proj"]["bias"]


def _decode(layer, params, x, *, chunks, prefill=None):
    """Prefill `prefill` positions (if given), then extend_step over `chunks`; returns outputs."""
    state = layer.init_states(batch_size=B, max_len=T, dtype=jnp.float32)
    assert list(state) == ["time_step", "kv_cache"]
    outs, start = [], 0
    if prefill is not None:
        live = (np.arange(T)[None] < prefill).astype(np.int32).repeat(B, 0)
        state, out = _call(
            layer,
            params,
            "extend_step",
            cached_states=state,
            query=x,
            is_prefill=True,
            segment_ids=jnp.asarray(live),
        )
        np.testing.assert_array_equal(state["time_step"], [prefill] * B)
        outs.append(out.data[:, :prefill])
        start = prefill
    for size in chunks:
        state, out = _call(
            layer, params, "extend_step", cached_states=state, query=x[:, start : start + size]
        )
        outs.append(out.data)
        start += size
    assert start == T
    return state, np.concatenate([np.asarray(o) for o in outs], axis=1)


@pytest.mark.parametrize("prefill", [None, 3])
def test_prefill_and_extend_step_equal_numpy_attention(prefill):
    layer = _gqa_cfg().instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    x = jax.random.normal(jax.random.PRNGKey(2), (B, T, D))
    expected = _np_attention(params, x)
    full = _call(layer, params, query=x, return_aux={"kv_state"})
    np.testing.assert_allclose(full.data, expected, atol=2e-5)
    chunks = [1, 3, 3] if prefill is None else [1, 2, 1]
    state, decoded = _decode(layer, params, x, chunks=chunks, prefill=prefill)
    np.testing.assert_allclose(decoded, expected, atol=2e-5)
    # The cache holds the keys of every position, [batch, kv_heads, head_dim, max_len].
    np.testing.assert_allclose(
        np.moveaxis(np.asarray(state["kv_cache"]["key"]), 3, 1), full.kv_state.k_proj, atol=1e-6
    )
    np.testing.assert_array_equal(state["time_step"], [T] * B)


def test_sliding_window_cache_equals_masked_attention():
    window = 2
    cfg = enable_sliding_window_attention(_gqa_cfg(), window)
    assert cfg.kv_cache.klass is SlidingWindowKVCache and cfg.kv_cache.cached_kv_length == window
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    expected = _np_attention(params, x, window=window)
    np.testing.assert_allclose(_call(layer, params, query=x).data, expected, atol=2e-5)
    for prefill, chunks in ((None, [1] * T), (None, [3, 1, 3]), (4, [1, 2])):
        state, decoded = _decode(layer, params, x, chunks=chunks, prefill=prefill)
        np.testing.assert_allclose(decoded, expected, atol=2e-5)
        # The ring keeps only the window: slot p % window holds position p.
        assert state["kv_cache"]["key"].shape == (B, K, H, window)
        np.testing.assert_array_equal(
            np.sort(np.asarray(state["kv_cache"]["key_positions"]), axis=1),
            [[T - 2, T - 1]] * B,
        )


@pytest.mark.parametrize("scale_first", [True, False])
def test_scale_kv_before_cache_update(scale_first):
    cfg = _gqa_cfg(scale_kv_before_cache_update=scale_first)
    cfg.key_scale.norm = RMSNorm.default_config()
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    x = jax.random.normal(jax.random.PRNGKey(4), (B, T, D))
    expected = _np_attention(params, x, key_norm=True)
    state, decoded = _decode(layer, params, x, chunks=[2, 5])
    # Where the key norm is applied does not change the outputs ...
    np.testing.assert_allclose(decoded, expected, atol=2e-5)
    # ... but decides what the cache (and kv_state) holds: normalized or raw keys.
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)["i_proj"]["k_proj"]
    raw = np.einsum("btd,dnh->btnh", np.asarray(x, np.float64), p["weight"]) + p["bias"]
    normed = raw / np.sqrt(np.mean(raw * raw, axis=-1, keepdims=True) + 1e-8)
    cached = np.moveaxis(np.asarray(state["kv_cache"]["key"]), 3, 1)
    np.testing.assert_allclose(cached, normed if scale_first else raw, atol=1e-5)
    kv_state = _call(layer, params, query=x, return_aux={"kv_state"}).kv_state
    np.testing.assert_allclose(kv_state.k_proj, normed if scale_first else raw, atol=1e-5)


@pytest.mark.parametrize("scale_first", [True, False])
def test_kv_state_sharing_equals_own_keys(scale_first):
    """A QLinear layer given another layer's kv_state computes what that layer computes (same
    query weights), returns the kv_state unchanged, and keeps no cache."""
    base_cfg = MultiheadAttention.default_config().set(
        name="base",
        query_dim=D,
        key_dim=D,
        value_dim=D,
        num_heads=N,
        causal=True,
        scale_kv_before_cache_update=scale_first,
    )
    base_cfg.key_scale.norm = RMSNorm.default_config()
    base = base_cfg.instantiate(parent=None)
    shared = base_cfg.clone(name="shared", input_linear=QLinear.default_config()).instantiate(
        parent=None
    )
    params = base.initialize_parameters_recursively(jax.random.PRNGKey(1))
    shared_params = dict(params, i_proj=dict(q_proj=params["i_proj"]["q_proj"]))
    x = jax.random.normal(jax.random.PRNGKey(5), (B, T, D))
    ref = _call(base, params, query=x, return_aux={"kv_state"})
    out = _call(shared, shared_params, query=x, kv_state=ref.kv_state, return_aux={"kv_state"})
    np.testing.assert_allclose(out.data, ref.data, atol=1e-6)
    assert out.kv_state is not None
    np.testing.assert_array_equal(out.kv_state.k_proj, ref.kv_state.k_proj)
    # Decoding with a kv_state: no kv_cache in the state; each step attends to kv_state.
    state = shared.init_states(batch_size=B, max_len=T, dtype=jnp.float32)
    assert list(state) == ["time_step"]
    kv = KVState(ref.kv_state.k_proj, ref.kv_state.v_proj, jnp.arange(T)[None])
    steps = []
    for t in range(T):
        state, step = _call(
            shared,
            shared_params,
            "extend_step",
            cached_states=state,
            query=x[:, t : t + 1],
            kv_state=kv,
        )
        steps.append(step.data)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), ref.data, atol=1e-5)
    with pytest.raises(ValueError, match="takes no kv_state"):
        _call(base, params, query=x, kv_state=kv)
