"""Tests of axlearn/common/poolings.py against hand-written NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.module import functional as F
from axlearn.common.poolings import (
    AttentionPooling,
    AveragePooling,
    FirstNTokenPooling,
    LastNTokenPooling,
    MaxPooling,
    PoolingWithProjection,
)

_RNG = np.random.default_rng(0)
_TOKENS = _RNG.normal(size=(3, 5, 4)).astype(np.float32)
# Row 0: no padding; row 1: the last two padded; row 2: a hole in the middle and all but 2 padded.
_PADDINGS = np.array([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [1, 0, 1, 0, 1]], dtype=bool)


def _pool(klass, tokens, paddings, state=None, **kwargs):
    kwargs.setdefault("input_dim", tokens.shape[-1])
    kwargs.setdefault("output_dim", tokens.shape[-1])
    layer = klass.default_config().set(name="pool", **kwargs).instantiate(parent=None)
    if state is None:
        # Random values of the parameters' shapes (compiling the initializers is slow on CPU).
        rng = np.random.default_rng(1)
        state = jax.tree.map(
            lambda spec: jnp.asarray(rng.normal(size=spec.shape) * 0.5, jnp.float32),
            layer.create_parameter_specs_recursively(),
            is_leaf=lambda x: hasattr(x, "shape"),
        )
    inputs = dict(tokens=jnp.asarray(tokens))
    if paddings is not None:
        inputs["paddings"] = jnp.asarray(paddings)

    def forward(state, inputs):  # Jitted: op-by-op it compiles every op (slow on CPU).
        return F(
            layer, inputs=inputs, state=state, is_training=False, prng_key=jax.random.PRNGKey(2)
        )[0]

    return layer, state, jax.jit(forward)(state, inputs)


def _real_rows(b):
    return [s for s in range(_TOKENS.shape[1]) if not _PADDINGS[b, s]]


def test_average_and_max_pooling_match_numpy():
    _, _, avg = _pool(AveragePooling, _TOKENS, _PADDINGS)
    _, _, mx = _pool(MaxPooling, _TOKENS, _PADDINGS)
    for b in range(3):
        real = _TOKENS[b, _real_rows(b)]
        np.testing.assert_allclose(avg[b, 0], real.mean(axis=0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mx[b, 0], real.max(axis=0), rtol=1e-6)
    assert avg.shape == mx.shape == (3, 1, 4)
    # No paddings: all tokens; all padded: average 0, max NEG_INF.
    _, _, avg = _pool(AveragePooling, _TOKENS, None)
    np.testing.assert_allclose(avg[:, 0], _TOKENS.mean(axis=1), rtol=1e-5, atol=1e-6)
    _, _, avg = _pool(AveragePooling, _TOKENS, np.ones((3, 5), bool))
    np.testing.assert_allclose(avg, 0.0)
    _, _, mx = _pool(MaxPooling, _TOKENS, np.ones((3, 5), np.float32))
    assert np.all(np.asarray(mx) < -1e14)


@pytest.mark.parametrize("klass", [AveragePooling, MaxPooling])
def test_single_output_poolers_reject_bad_config(klass):
    with pytest.raises(ValueError, match="pool: .*num_outputs=2"):
        _pool(klass, _TOKENS, None, num_outputs=2)
    with pytest.raises(ValueError, match="pool: .*input_dim=4, output_dim=3"):
        _pool(klass, _TOKENS, None, output_dim=3)


@pytest.mark.parametrize("n", [1, 3, 7])
def test_first_n_token_pooling(n):
    _, _, out = _pool(FirstNTokenPooling, _TOKENS, _PADDINGS, num_outputs=n)
    expected = np.zeros((3, n, 4), np.float32)
    for b in range(3):
        for i in range(min(n, 5)):
            if not _PADDINGS[b, i]:
                expected[b, i] = _TOKENS[b, i]
    np.testing.assert_allclose(out, expected)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_last_n_token_pooling(n):
    _, _, out = _pool(LastNTokenPooling, _TOKENS, _PADDINGS, num_outputs=n)
    expected = np.zeros((3, n, 4), np.float32)
    for b in range(3):
        for i, s in enumerate(reversed(_real_rows(b))):
            if i < n:
                expected[b, i] = _TOKENS[b, s]
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    # bfloat16 keeps the dtype.
    _, _, out = _pool(
        LastNTokenPooling, _TOKENS.astype(jnp.bfloat16), _PADDINGS, num_outputs=n, dtype=None
    )
    assert out.dtype == jnp.bfloat16


def _layer_norm(x, params, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * params["scale"] + params["bias"]


def test_attention_pooling_matches_numpy():
    layer, state, out = _pool(AttentionPooling, _TOKENS, _PADDINGS, output_dim=6, num_outputs=2)
    p = jax.tree.map(np.asarray, state)
    att, ffn = p["cross_attention"], p["feed_forward"]
    eps_att = layer.cross_attention.norm.config.eps
    eps_ffn = layer.feed_forward.norm.config.eps
    q0 = p["query_weight"]  # [2, 6]
    for b in range(3):
        q = _layer_norm(q0, att["norm"], eps_att)
        proj = att["attention"]["i_proj"]
        qh = np.einsum("td,dnh->tnh", q, proj["q_proj"]["weight"]) + proj["q_proj"]["bias"]
        kh = np.einsum("sd,dnh->snh", _TOKENS[b], proj["k_proj"]["weight"]) + proj["k_proj"]["bias"]
        vh = np.einsum("sd,dnh->snh", _TOKENS[b], proj["v_proj"]["weight"]) + proj["v_proj"]["bias"]
        logits = np.einsum("tnh,snh->nts", qh, kh) / np.sqrt(qh.shape[-1])
        logits = np.where(_PADDINGS[b][None, None, :], -np.inf, logits)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = np.einsum("nts,snh->tnh", probs, vh)
        o = att["attention"]["o_proj"]
        x = q0 + np.einsum("tnh,dnh->td", ctx, o["weight"]) + o["bias"]
        h = np.maximum(
            _layer_norm(x, ffn["norm"], eps_ffn) @ ffn["linear1"]["weight"]
            + ffn["linear1"]["bias"],
            0,
        )
        expected = x + h @ ffn["linear2"]["weight"] + ffn["linear2"]["bias"]
        np.testing.assert_allclose(out[b], expected, rtol=1e-4, atol=1e-5)
    assert out.shape == (3, 2, 6)
    assert ffn["linear1"]["weight"].shape == (6, 24)  # hidden_dim = 4 * output_dim.


def test_pooling_with_projection():
    cfg_pooler = LastNTokenPooling.default_config().set(num_outputs=2)
    layer, state, out = _pool(
        PoolingWithProjection, _TOKENS, _PADDINGS, output_dim=3, pooler=cfg_pooler
    )
    _, _, pooled = _pool(LastNTokenPooling, _TOKENS, _PADDINGS, num_outputs=2)
    expected = np.asarray(pooled) @ state["proj"]["weight"] + state["proj"]["bias"]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    assert layer.pooler.config.output_dim == 4 and layer.proj.config.input_dim == 4
    with pytest.raises(ValueError, match="pool: tokens must be"):
        F(
            layer,
            inputs=dict(tokens=jnp.zeros((2, 4))),
            state=state,
            is_training=False,
            prng_key=jax.random.PRNGKey(0),
        )
