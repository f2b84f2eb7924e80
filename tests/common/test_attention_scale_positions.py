"""Tests `BaseScaleQK.forward(positions=)`: the positions MultiheadAttention gives its scales."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.attention import MultiheadAttention, QLinear, ScaleKey, ScaleQuery
from axlearn.common.kv_cache.base_kv_cache import KVState
from axlearn.common.module import functional

DIM, HEADS, BATCH, LEN = 8, 2, 2, 5
HEAD_DIM = DIM // HEADS
_SEEN: list = []


class _PositionScaledQuery(ScaleQuery):
    """Multiplies the default query scaling by (position + 1) per token; records positions."""

    def forward(self, proj, *, positions=None):
        _SEEN.append(("query", np.asarray(positions)))
        scale = (positions + 1).astype(proj.dtype)[..., None, None]
        return super().forward(proj, positions=positions) * scale


class _RecordingKey(ScaleKey):
    def forward(self, proj, *, positions=None):
        _SEEN.append(("key", np.asarray(positions)))
        return super().forward(proj, positions=positions)


def _layer(**kwargs):
    cfg = MultiheadAttention.default_config().set(
        name="attn",
        query_dim=DIM,
        key_dim=DIM,
        value_dim=DIM,
        num_heads=HEADS,
        query_scale=_PositionScaledQuery.default_config(),
        key_scale=_RecordingKey.default_config(),
        **kwargs,
    )
    return cfg.instantiate(parent=None)


def _seen() -> dict:
    out = {kind: positions for kind, positions in _SEEN}
    _SEEN.clear()
    return out


def _numpy_attention(params, x, positions, causal):
    """Self-attention with queries scaled by HEAD_DIM**-0.5 * (position + 1), in NumPy."""
    p = jax.tree.map(np.asarray, params)

    def proj(name):
        w, b = p["i_proj"][name]["weight"], p["i_proj"][name]["bias"]
        return np.einsum("btd,dnh->btnh", x, w) + b

    q = proj("q_proj") * HEAD_DIM**-0.5 * (positions + 1)[..., None, None]
    k, v = proj("k_proj"), proj("v_proj")
    logits = np.einsum("btnh,bsnh->bnts", q, k)
    if causal:
        logits = np.where(np.tril(np.ones((LEN, LEN), bool)), logits, -1e30)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bnts,bsnh->btnh", probs, v)
    return np.einsum("btnh,dnh->btd", context, p["o_proj"]["weight"]) + p["o_proj"]["bias"]


def test_scale_layers_accept_positions_and_ignore_them():
    x = jax.random.normal(jax.random.PRNGKey(0), (BATCH, LEN, HEADS, HEAD_DIM))
    positions = jnp.arange(LEN)[None] + 7
    for cfg in (ScaleQuery.default_config(), ScaleKey.default_config()):
        layer = cfg.set(name="s", per_head_dim=HEAD_DIM).instantiate(parent=None)
        with_pos, _ = functional(
            layer, None, {}, dict(proj=x, positions=positions), is_training=False
        )
        without, _ = functional(layer, None, {}, dict(proj=x), is_training=False)
        np.testing.assert_array_equal(with_pos, without)


@pytest.mark.parametrize("given_positions", [False, True])
def test_forward_passes_query_positions_to_both_scales(given_positions):
    layer = _layer(causal=True)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (BATCH, LEN, DIM)))
    positions = np.array([[3, 4, 0, 1, 2], [0, 1, 2, 3, 4]]) if given_positions else None
    inputs = dict(query=x)
    if given_positions:
        inputs["query_positions"] = positions
    out, _ = functional(layer, None, params, inputs, is_training=False)
    expected_positions = positions if given_positions else np.arange(LEN)[None]
    seen = _seen()
    np.testing.assert_array_equal(seen["query"], expected_positions)
    np.testing.assert_array_equal(seen["key"], expected_positions)
    np.testing.assert_allclose(
        out.data,
        _numpy_attention(params, x, np.broadcast_to(expected_positions, (BATCH, LEN)), True),
        rtol=2e-5,
        atol=2e-5,
    )


def test_cross_attention_and_kv_state_key_positions():
    layer = _layer()
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, LEN, DIM))
    source = jax.random.normal(jax.random.PRNGKey(2), (BATCH, 3, DIM))
    functional(layer, None, params, dict(query=x, key=source, value=source), is_training=False)
    seen = _seen()
    np.testing.assert_array_equal(seen["key"], np.arange(3)[None])  # Source tokens count from 0.
    np.testing.assert_array_equal(seen["query"], np.arange(LEN)[None])

    # External keys/values with positions (a KV-sharing projection), keys scaled after reading.
    k = jax.random.normal(jax.random.PRNGKey(3), (BATCH, 3, HEADS, HEAD_DIM))
    kv = KVState(k_proj=k, v_proj=k, key_positions=jnp.array([[5, 6, 7]]))
    shared = _layer(scale_kv_before_cache_update=False, input_linear=QLinear.default_config())
    shared_params = shared.initialize_parameters_recursively(jax.random.PRNGKey(0))
    functional(shared, None, shared_params, dict(query=x, kv_state=kv), is_training=False)
    np.testing.assert_array_equal(_seen()["key"], [[5, 6, 7]])


@pytest.mark.parametrize("scale_kv_first", [True, False])
def test_extend_step_positions_are_time_steps(scale_kv_first):
    layer = _layer(causal=True, scale_kv_before_cache_update=scale_kv_first)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, LEN, DIM))
    state, _ = functional(
        layer,
        None,
        params,
        dict(batch_size=BATCH, max_len=LEN, dtype=jnp.float32),
        is_training=False,
        method="init_states",
    )
    _SEEN.clear()
    (state, _), _ = functional(
        layer,
        None,
        params,
        dict(cached_states=state, query=x[:, :3], is_prefill=True),
        is_training=False,
        method="extend_step",
    )
    seen = _seen()
    np.testing.assert_array_equal(seen["query"], np.broadcast_to(np.arange(3), (BATCH, 3)))
    (_, step_out), _ = functional(
        layer,
        None,
        params,
        dict(cached_states=state, query=x[:, 3:4]),
        is_training=False,
        method="extend_step",
    )
    seen = _seen()
    np.testing.assert_array_equal(seen["query"], [[3], [3]])
    if scale_kv_first:
        np.testing.assert_array_equal(seen["key"], [[3], [3]])  # The new key, before caching.
    else:
        # Keys are scaled after reading the cache, at the cache's positions.
        assert seen["key"].shape[-1] == LEN
    # Decoding equals the full forward at that step.
    full, _ = functional(layer, None, params, dict(query=x[:, :4]), is_training=False)
    _SEEN.clear()
    np.testing.assert_allclose(step_out.data[:, 0], full.data[:, 3], rtol=2e-5, atol=2e-5)
