"""Tests of axlearn.common.attention's Transformer-XL attention against NumPy loops."""

import math

import jax
import numpy as np
import pytest

from axlearn.common.attention import (
    MultiheadAttentionXL,
    MultiheadRelativePositionLinear,
    PerDimScale,
    ScaleQuery,
    SinusoidalPositionalEmbedding,
    rel_pos_to_abs_pos,
    xl_attention_logits,
)
from axlearn.common.config import InvalidConfigValueError
from axlearn.common.module import functional
from axlearn.common.param_init import FanAxes

DIM, HEADS, BATCH, LEN = 8, 2, 2, 5
HEAD_DIM = DIM // HEADS


def _np_sinusoid(positions: np.ndarray, dim: int) -> np.ndarray:
    """The sinusoid of each position, channel by channel (timescales 1 .. 10000)."""
    half = dim // 2
    out = np.zeros(positions.shape + (dim,))
    for idx, p in np.ndenumerate(positions):
        for k in range(half):
            timescale = 10_000 ** (k / (half - 1))
            out[idx + (k,)] = math.sin(p / timescale)
            out[idx + (half + k,)] = math.cos(p / timescale)
    return out


def _np_xl_logits(q, k, rel, u, v):
    """logits[b, n, i, j] by the definition, one entry at a time."""
    b_, t_, n_, _ = q.shape
    out = np.zeros((b_, n_, t_, t_))
    for b in range(b_):
        for n in range(n_):
            for i in range(t_):
                for j in range(t_):
                    r = rel[j - i + t_ - 1, n]
                    out[b, n, i, j] = (q[b, i, n] + u[n]) @ k[b, j, n] + (q[b, i, n] + v[n]) @ r
    return out


@pytest.mark.parametrize("t", [1, 2, 5])
def test_rel_pos_to_abs_pos(t):
    x = np.random.default_rng(0).normal(size=(3, t, 2 * t - 1))
    expected = np.zeros((3, t, t))
    for i in range(t):
        for j in range(t):
            expected[:, i, j] = x[:, i, j - i + t - 1]
    np.testing.assert_allclose(rel_pos_to_abs_pos(x), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="2 \\* 3 - 1"):
        rel_pos_to_abs_pos(np.zeros((3, 4)))


def test_xl_attention_logits():
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(2, BATCH, LEN, HEADS, HEAD_DIM))
    rel = rng.normal(size=(2 * LEN - 1, HEADS, HEAD_DIM))
    u, v = rng.normal(size=(2, HEADS, HEAD_DIM))
    actual = xl_attention_logits(q_proj=q, k_proj=k, relative_pos_emb=rel, u=u, v=v)
    np.testing.assert_allclose(actual, _np_xl_logits(q, k, rel, u, v), rtol=1e-5, atol=1e-5)


def test_sinusoidal_positional_embedding():
    layer = (
        SinusoidalPositionalEmbedding.default_config().set(name="e", dim=6).instantiate(parent=None)
    )
    positions = np.array([[-3, 0, 2.5]])
    out, _ = functional(layer, None, {}, dict(positions=positions), is_training=False)
    np.testing.assert_allclose(out, _np_sinusoid(positions, 6), atol=1e-6)
    with pytest.raises(ValueError, match="e.dim=5 must be even"):
        SinusoidalPositionalEmbedding.default_config().set(name="e", dim=5).instantiate(parent=None)


def test_relative_position_linear():
    layer = (
        MultiheadRelativePositionLinear.default_config()
        .set(name="p", model_dim=4, num_heads=3, per_head_dim=2)
        .instantiate(parent=None)
    )
    specs = layer.create_parameter_specs_recursively()
    assert specs["weight"].fan_axes == FanAxes(in_axis=0, out_axis=(1, 2))
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    params["bias"] = np.arange(6.0).reshape(3, 2)
    x = np.random.default_rng(2).normal(size=(7, 4))
    out, _ = functional(layer, None, params, dict(inputs=x), is_training=False)
    expected = np.einsum("ld,dnh->lnh", x, np.asarray(params["weight"])) + params["bias"]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def _xl_layer(scale_position, per_dim_scale):
    cfg = MultiheadAttentionXL.default_config().set(
        name="xl",
        query_dim=DIM,
        key_dim=DIM,
        value_dim=DIM,
        num_heads=HEADS,
        scale_position=scale_position,
        query_scale=ScaleQuery.default_config().set(per_dim_scale=per_dim_scale),
    )
    cfg.output_linear.bias = False
    return cfg.instantiate(parent=None)


@pytest.mark.parametrize("per_dim", [False, True])
@pytest.mark.parametrize("position", ["LOGIT", "QUERY"])
def test_multihead_attention_xl_matches_numpy(position, per_dim):
    scale_position = MultiheadAttentionXL.ScalePosition[position]
    layer = _xl_layer(scale_position, PerDimScale.default_config() if per_dim else None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    rng = np.random.default_rng(3)
    params["u_bias"], params["v_bias"] = rng.normal(size=(2, HEADS, HEAD_DIM)).astype(np.float32)
    if per_dim:
        params["scale_query"]["per_dim_scale"]["param"] = rng.normal(size=HEAD_DIM).astype(
            np.float32
        )
    x = rng.normal(size=(BATCH, LEN, DIM)).astype(np.float32)
    causal = np.where(np.tril(np.ones((LEN, LEN), bool)), 0.0, -1e9)
    out, _ = functional(
        layer,
        None,
        params,
        dict(query=x, attention_logit_biases=causal, return_aux={"probs"}),
        is_training=False,
    )

    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    proj = {
        name: np.einsum("btd,dnh->btnh", x, p["i_proj"][f"{name}_proj"]["weight"])
        + p["i_proj"][f"{name}_proj"]["bias"]
        for name in "qkv"
    }
    q = proj["q"]
    if per_dim:
        softplus = np.log1p(np.exp(p["scale_query"]["per_dim_scale"]["param"]))
        q = q * softplus / np.log(2.0)
    scale = HEAD_DIM**-0.5
    distances = np.arange(LEN - 1, -LEN, -1)
    rel = np.einsum("ld,dnh->lnh", _np_sinusoid(distances, DIM), p["pos_proj"]["weight"])
    if position == "LOGIT":
        logits = _np_xl_logits(q, proj["k"], rel, p["u_bias"], p["v_bias"]) * scale
    else:
        logits = _np_xl_logits(q * scale, proj["k"], rel, p["u_bias"], p["v_bias"])
    logits = logits + causal
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bnts,bsnh->btnh", probs, proj["v"])
    expected = np.einsum("btnh,dnh->btd", context, p["o_proj"]["weight"])
    np.testing.assert_allclose(out.probs, probs, atol=1e-5)
    np.testing.assert_allclose(out.data, expected, rtol=1e-4, atol=1e-5)


def test_multihead_attention_xl_positions_differ():
    """LOGIT and QUERY give different results once u/v are non-zero (the scale placement)."""
    outs = []
    for position in MultiheadAttentionXL.ScalePosition:
        layer = _xl_layer(position, None)
        params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
        params["u_bias"] = np.ones((HEADS, HEAD_DIM), np.float32)
        x = np.random.default_rng(4).normal(size=(1, LEN, DIM)).astype(np.float32)
        out, _ = functional(layer, None, params, dict(query=x), is_training=False)
        outs.append(np.asarray(out.data))
    assert not np.allclose(outs[0], outs[1], atol=1e-4)


def test_multihead_attention_xl_errors():
    with pytest.raises(InvalidConfigValueError, match="scale_position"):
        _xl_layer("logit", None)
    layer = _xl_layer(MultiheadAttentionXL.ScalePosition.LOGIT, None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = np.zeros((1, LEN, DIM), np.float32)
    with pytest.raises(ValueError, match="self-attention"):
        functional(
            layer, None, params, dict(query=x, key=x[:, :3], value=x[:, :3]), is_training=False
        )
