"""Tests of axlearn.common.conformer against a Conformer block written in NumPy."""

import math

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common.config import InvalidConfigValueError
from axlearn.common.conformer import (
    ConformerLayer,
    LConvLayer,
    RepeatedConformerLayer,
    set_double_shard_weights_config,
)
from axlearn.common.module import functional

DIM, HEADS, WINDOW = 8, 2, 5


def _layer_norm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _linear(x, p):
    return x @ p["weight"] + p["bias"]


def _sinusoid(positions, dim):
    half = dim // 2
    scales = np.array([10_000 ** (k / (half - 1)) for k in range(half)])
    angles = positions[:, None] / scales[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


def _np_feed_forward(x, p, eps):
    """x + 0.5 * linear2(silu(linear1(norm(x)))) (pre-norm, half step)."""
    return x + 0.5 * _linear(
        _silu(_linear(_layer_norm(x, p["norm"], eps), p["linear1"])), p["linear2"]
    )


def _np_xl_self_attention(x, p, segment_ids, eps):
    """x + XL attention of norm(x): relative sinusoid positions, u/v biases, same-segment mask."""
    a = p["attention"]
    h = _layer_norm(x, p["norm"], eps)
    q, k, v = (
        np.einsum("btd,dnh->btnh", h, a["i_proj"][f"{n}_proj"]["weight"])
        + a["i_proj"][f"{n}_proj"]["bias"]
        for n in "qkv"
    )
    seq_len, head_dim = x.shape[1], q.shape[-1]
    # rel[t - s + T - 1] embeds the distance t - s (from T - 1 down to -(T - 1)).
    rel = np.einsum(
        "ld,dnh->lnh",
        _sinusoid(np.arange(seq_len - 1, -seq_len, -1.0), x.shape[-1]),
        a["pos_proj"]["weight"],
    )
    t_idx, s_idx = np.meshgrid(np.arange(seq_len), np.arange(seq_len), indexing="ij")
    rel_ts = rel[s_idx - t_idx + seq_len - 1]  # [T, S, N, H]
    content = np.einsum("btnh,bsnh->bnts", q + a["u_bias"], k)
    position = np.einsum("btnh,tsnh->bnts", q + a["v_bias"], rel_ts)
    logits = (content + position) / math.sqrt(head_dim)
    same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    logits = np.where(same, logits, -1e30)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bnts,bsnh->btnh", probs, v)
    return x + np.einsum("btnh,dnh->btd", context, a["o_proj"]["weight"]) + a["o_proj"]["bias"]


def _np_lconv(x, p, segment_ids, *, ln_eps, bn_eps):
    """The lightweight conv module with eval-mode batch norm (moving statistics)."""
    mask = (segment_ids != 0)[..., None]
    h = _layer_norm(x, p["linear1_norm"], ln_eps)
    h = _linear(h, p["linear1_0"]) * _sigmoid(_linear(h, p["linear1_1"]))
    h = h * mask
    w = p["conv"]["weight"][:, 0, :]  # Depthwise [window, dim].
    pad = (w.shape[0] - 1) // 2
    padded = np.pad(h, ((0, 0), (pad, w.shape[0] - 1 - pad), (0, 0)))
    h = sum(padded[:, i : i + x.shape[1]] * w[i] for i in range(w.shape[0]))
    bn = p["conv_norm"]
    h = (h - bn["moving_mean"]) / np.sqrt(bn["moving_variance"] + bn_eps) * bn["scale"] + bn["bias"]
    h = _linear(_silu(h), p["linear2"])
    return (x + h) * mask


def _np_conformer(x, p, segment_ids, *, order, ln_eps, bn_eps):
    def lconv(y):
        return _np_lconv(y, p["lconv"], segment_ids, ln_eps=ln_eps, bn_eps=bn_eps)

    if order == "lconv_before_ff":
        x = lconv(x)
    x = _np_feed_forward(x, p["ff_start"], ln_eps)
    if order == "lconv_before_mhsa":
        x = lconv(x)
    x = _np_xl_self_attention(x, p["self_attention"], segment_ids, ln_eps)
    if order == "mhsa_before_lconv":
        x = lconv(x)
    x = _np_feed_forward(x, p["ff_end"], ln_eps)
    return _layer_norm(x, p["norm"], ln_eps) * (segment_ids != 0)[..., None]


def _conformer_cfg(order=None):
    cfg = ConformerLayer.default_config().set(name="conformer", input_dim=DIM, layer_order=order)
    cfg.self_attention.attention.num_heads = HEADS
    cfg.lconv.conv.window = WINDOW
    return cfg


def _random_params(layer, seed):
    """The layer's parameters replaced by random values (variances positive)."""
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    rng = np.random.default_rng(seed)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    new = []
    for path, leaf in leaves:
        value = rng.normal(0.0, 0.5, leaf.shape)
        if "moving_variance" in jax.tree_util.keystr(path):
            value = np.abs(value) + 0.5
        new.append(jnp.asarray(value, jnp.float32))
    return jax.tree_util.tree_unflatten(treedef, new)


@pytest.mark.parametrize(
    "order", [None, "lconv_before_ff", pytest.param("lconv_before_mhsa", marks=pytest.mark.slow)]
)
def test_conformer_layer_matches_numpy(order):
    layer = _conformer_cfg(order).instantiate(parent=None)
    params = _random_params(layer, 1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 9, DIM)).astype(np.float32)
    # Two segments in the first sequence, padding at the end of both.
    segment_ids = np.array([[1, 1, 1, 1, 2, 2, 2, 0, 0], [1] * 6 + [0] * 3], np.int32)
    out, _ = functional(
        layer, None, params, dict(inputs=x, segment_ids=segment_ids), is_training=False
    )
    p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    cfg = layer.config
    expected = _np_conformer(
        x.astype(np.float64),
        p64,
        segment_ids,
        order=order or "mhsa_before_lconv",
        ln_eps=cfg.norm.eps,
        bn_eps=cfg.lconv.conv_norm.eps,
    )
    np.testing.assert_allclose(out, expected, atol=2e-4, rtol=2e-4)
    assert np.all(np.asarray(out)[segment_ids == 0] == 0)


@pytest.mark.slow
def test_lconv_ignores_padding_and_repeated_stack():
    cfg = LConvLayer.default_config().set(name="lconv", input_dim=DIM)
    cfg.conv.window = WINDOW
    layer = cfg.instantiate(parent=None)
    params = _random_params(layer, 3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, DIM)).astype(np.float32)
    segment_ids = np.array([[1] * 5 + [0] * 3], np.int32)
    other = x.copy()
    other[:, 5:] = 1e3  # Different values at the padded positions.
    outs = [
        functional(layer, None, params, dict(inputs=v, segment_ids=segment_ids), is_training=False)[
            0
        ]
        for v in (x, other)
    ]
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-6)

    # A repeated stack equals its layers applied in turn.
    rep_cfg = RepeatedConformerLayer.default_config().set(name="rep", input_dim=DIM, num_layers=2)
    rep_cfg.layer.self_attention.attention.num_heads = HEADS
    rep_cfg.layer.lconv.conv.window = WINDOW
    rep = rep_cfg.instantiate(parent=None)
    rep_params = rep.initialize_parameters_recursively(jax.random.PRNGKey(5))
    single = _conformer_cfg().instantiate(parent=None)
    y = x
    for i in range(2):
        layer_params = jax.tree.map(lambda a, i=i: a[i], rep_params["repeat"]["layer"])
        y, _ = functional(
            single, None, layer_params, dict(inputs=y, segment_ids=segment_ids), is_training=False
        )
    out, _ = functional(
        rep, None, rep_params, dict(inputs=x, segment_ids=segment_ids), is_training=False
    )
    np.testing.assert_allclose(out, y, atol=1e-5)


def test_sharding_config_and_errors():
    cfg = set_double_shard_weights_config(_conformer_cfg())
    assert cfg.lconv.conv.param_partition_spec == (None, None, "model")
    assert cfg.ff_end.linear1.param_partition_spec == ("fsdp", "model")
    with pytest.raises(InvalidConfigValueError, match="layer_order expects"):
        _conformer_cfg("bad")
    with pytest.raises(ValueError, match="num_layers=0 must be > 0"):
        RepeatedConformerLayer.default_config().set(
            name="r", input_dim=DIM, num_layers=0
        ).instantiate(parent=None)
    layer = _conformer_cfg().instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = np.zeros((1, 4, DIM), np.float32)
    with pytest.raises(ValueError, match="segment_ids must be an int32"):
        functional(
            layer,
            None,
            params,
            dict(inputs=x, segment_ids=np.ones((1, 4), bool)),
            is_training=False,
        )
