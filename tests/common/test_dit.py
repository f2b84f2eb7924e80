"""Tests axlearn.common.dit against NumPy references of its blocks written here."""

import jax
import numpy as np
import pytest

from axlearn.common.dit import (
    AdaptiveLayerNormModulation,
    DiTBlock,
    DiTFeedForwardLayer,
    DiTFinalLayer,
    TimeStepEmbedding,
)
from axlearn.common.module import functional as F

DIM, HEADS, EPS = 8, 2, 1e-6


def _run(cfg, inputs, seed=0):
    layer = cfg.set(name="t").instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda x: x + 0.1 * rng.standard_normal(x.shape).astype(x.dtype), params)
    out, _ = F(
        layer, inputs=inputs, state=params, is_training=False, prng_key=jax.random.PRNGKey(0)
    )
    return out, jax.tree.map(np.asarray, params)


def _silu(x):
    return x / (1 + np.exp(-x))


def _gelu(x):  # The tanh form, as jax.nn.gelu.
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _ln(x):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + EPS)


def _lin(p, x):
    return x @ p["weight"] + p["bias"]


def _adaln(p, cond, n):
    out = _lin(p["linear"], _silu(cond))
    if out.ndim == 2:
        out = out[:, None]
    return np.split(out, n, axis=-1)


def _ffn(p, x, shift, scale, gate):
    h = _ln(x) * (1 + scale) + shift
    return x + gate * _lin(p["linear2"], _gelu(_lin(p["linear1"], h)))


def _attn(p, x, shift, scale, gate):
    h = _ln(x) * (1 + scale) + shift
    a = p["attention"]
    q, k, v = (
        np.einsum("btd,dnh->btnh", h, a["i_proj"][n]["weight"]) + a["i_proj"][n]["bias"]
        for n in ("q_proj", "k_proj", "v_proj")
    )
    logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = np.einsum("bnts,bsnh->btnh", probs, v)
    out = np.einsum("btnh,dnh->btd", ctx, a["o_proj"]["weight"]) + a["o_proj"]["bias"]
    return x + gate * out


def test_timestep_embedding():
    t = np.linspace(0, 1, 5).astype(np.float32)
    cfg = TimeStepEmbedding.default_config().set(output_dim=DIM, pos_embed_dim=7)
    out, p = _run(cfg, dict(positions=t))
    half = 3
    freqs = np.exp(-np.log(10000.0) * np.arange(half) / half)
    sig = np.concatenate([np.cos(t[:, None] * freqs), np.sin(t[:, None] * freqs)], -1)
    sig = np.pad(sig, [(0, 0), (0, 1)])
    ref = _lin(p["output_proj"], _silu(_lin(p["embed_proj"], sig)))
    np.testing.assert_allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("seq_cond", [False, True])
def test_block_and_final_layer(seq_cond):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, DIM)).astype(np.float32)
    cond = rng.standard_normal((2, 5, DIM) if seq_cond else (2, DIM)).astype(np.float32)
    cfg = DiTBlock.default_config().set(input_dim=DIM)
    cfg.attention.attention.num_heads = HEADS
    cfg.attention.norm.eps = cfg.feed_forward.norm.eps = EPS
    out, p = _run(cfg, dict(input=x, condition=cond))
    s1, c1, g1, s2, c2, g2 = _adaln(p["adaln"], cond, 6)
    ref = _ffn(p["feed_forward"], _attn(p["attention"], x, s1, c1, g1), s2, c2, g2)
    np.testing.assert_allclose(out, ref, atol=1e-5)

    cfg = DiTFinalLayer.default_config().set(input_dim=DIM, output_dim=12)
    cfg.norm.eps = EPS
    out, p = _run(cfg, dict(input=x, condition=cond))
    shift, scale = _adaln(p["adaln"], cond, 2)
    np.testing.assert_allclose(out, _lin(p["linear"], _ln(x) * (1 + scale) + shift), atol=1e-5)


def test_errors():
    cfg = AdaptiveLayerNormModulation.default_config().set(dim=DIM, num_outputs=2)
    with pytest.raises(ValueError, match="rank 2 or 3"):
        _run(cfg, dict(input=np.zeros((DIM,), np.float32)))
    with pytest.raises(NotImplementedError, match="structure"):
        DiTFeedForwardLayer.default_config().set(
            name="f", input_dim=DIM, structure="x"
        ).instantiate(parent=None)
