"""Tests of axlearn.common.attention against NumPy references and across equivalent paths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import attention
from axlearn.common.attention import (
    FlashAttention,
    FusedGroupedQKVLinear,
    FusedQKVLinear,
    GroupedQKVLinear,
    GroupedQueryAttention,
    MultiheadAttention,
    QKVLinear,
    RoFormerQKVLinear,
    TransformerFeedForwardLayer,
    sliding_window_causal_mask,
)
from axlearn.common.attention_bias import NEG_INF, causal_mask, make_segment_mask
from axlearn.common.config import config_for_function
from axlearn.common.layers import RMSNorm
from axlearn.common.module import functional

B, T, D, N, K, H = 2, 7, 32, 4, 2, 8


def _build(cfg, name="layer"):
    return cfg.set(name=name).instantiate(parent=None)


def _init(layer, seed=0):
    return jax.jit(layer.initialize_parameters_recursively)(jax.random.PRNGKey(seed))


def _randomize(params, seed=1):
    """Replaces every leaf by N(0, 0.3^2) noise (+1 for vectors, e.g. norm scales)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda x: jnp.asarray(0.3 * rng.standard_normal(x.shape) + (x.ndim == 1), x.dtype), params
    )


_JITTED = {}


def _call(layer, params, inputs, method="forward", is_training=False, key=None):
    """Jitted functional call (cached per layer/method); non-array inputs are static."""
    arrays = {k: v for k, v in inputs.items() if isinstance(v, (jax.Array, np.ndarray))}
    static = {k: v for k, v in inputs.items() if k not in arrays}
    cache_key = (id(layer), method, is_training, repr(sorted(static.items())))
    if cache_key not in _JITTED:

        def run(params, arrays, key):
            out, _ = functional(
                layer, key, params, {**arrays, **static}, method=method, is_training=is_training
            )
            return out

        _JITTED[cache_key] = (layer, jax.jit(run))
    return _JITTED[cache_key][1](params, arrays, key)


def _np_rms_norm(x, scale, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps) * scale


def _np_rope(x, positions, theta):
    """NumPy RoPE on interleaved pairs: x [B, T, N, H], positions [B, T]."""
    h = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, h, 2) / h)
    ang = positions[..., None, None] * inv_freq  # [B, T, 1, H/2]
    out = np.empty_like(x, dtype=np.float64)
    out[..., 0::2] = x[..., 0::2] * np.cos(ang) - x[..., 1::2] * np.sin(ang)
    out[..., 1::2] = x[..., 1::2] * np.cos(ang) + x[..., 0::2] * np.sin(ang)
    return out


def _np_attention(q, k, v, allowed):
    """q [B,T,N,H] (already scaled), k/v [B,S,K,H], allowed [B,1|N,T,S] bool -> [B,T,N,H]."""
    groups = q.shape[2] // k.shape[2]
    k = np.repeat(k, groups, axis=2)
    v = np.repeat(v, groups, axis=2)
    logits = np.einsum("btnh,bsnh->bnts", q, k)
    logits = np.where(allowed, logits, -np.inf)
    logits -= logits.max(-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", probs, v)


def _gqa_config(*, qk_norm=False, cls=GroupedQueryAttention, fused=True, theta=1e4, **kwargs):
    kwargs.setdefault("causal", True)
    qkv = (FusedGroupedQKVLinear if fused else GroupedQKVLinear).default_config()
    qkv.set(num_kv_heads=K)
    qkv.layer.set(bias=False)
    cfg = cls.default_config().set(
        query_dim=D,
        key_dim=D,
        value_dim=D,
        num_heads=N,
        input_linear=RoFormerQKVLinear.default_config().set(input_linear=qkv, rotary_value=False),
        **kwargs,
    )
    cfg.input_linear.rope_pos_emb_layer.set(theta=theta)
    cfg.output_linear.set(bias=False)
    if qk_norm:
        cfg.query_scale.set(norm=RMSNorm.default_config().set(eps=1e-5))
        cfg.key_scale.set(norm=RMSNorm.default_config().set(eps=1e-5))
    return cfg


def test_public_names_dump_under_attention_module():
    for name in ("GroupedQueryAttention", "TransformerLayer", "_TransformerRepeat", "ScaleKey"):
        assert getattr(attention, name).__module__ == "axlearn.common.attention"
    fn = attention._save_and_offload_only_these_names_regex
    assert fn.__module__ == "axlearn.common.attention"


def test_masks():
    q = jnp.arange(5)[:, None]
    k = jnp.arange(5)[None, :]
    np.testing.assert_array_equal(causal_mask(q, k), np.tril(np.ones((5, 5), bool)))
    window = sliding_window_causal_mask(2)(q, k)
    expected = np.tril(np.ones((5, 5), bool)) & ~np.tril(np.ones((5, 5), bool), -3)
    np.testing.assert_array_equal(window, expected)
    seg = jnp.array([[1, 1, 2, 2, 0]])
    bias = make_segment_mask(source_segments=seg, target_segments=seg)
    assert bias.shape == (1, 1, 5, 5)
    assert bias[0, 0, 0, 1] == 0 and bias[0, 0, 0, 2] == NEG_INF and bias[0, 0, 4, 4] == 0
    with pytest.raises(ValueError, match="sliding_window_size"):
        sliding_window_causal_mask(-1)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_gqa_matches_numpy(qk_norm):
    """RoPE + GQA + optional QK-norm (per-head RMSNorm after RoPE) vs a NumPy reference."""
    layer = _build(_gqa_config(qk_norm=qk_norm, theta=500.0))
    params = _randomize(_init(layer))
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    out = _call(layer, params, dict(query=x, return_aux={"probs"}))

    att = jax.tree.map(np.asarray, params)
    w = att["i_proj"]["i_proj"]["qkv_proj"]["weight"]  # [D, N + 2K, H]
    proj = np.einsum("btd,dnh->btnh", np.asarray(x, np.float64), w)
    q, k, v = proj[:, :, :N], proj[:, :, N : N + K], proj[:, :, N + K :]
    pos = np.broadcast_to(np.arange(T), (B, T))
    q, k = _np_rope(q, pos, 500.0), _np_rope(k, pos, 500.0)
    if qk_norm:
        q = _np_rms_norm(q, att["scale_query"]["norm"]["scale"], 1e-5)
        k = _np_rms_norm(k, att["scale_key"]["norm"]["scale"], 1e-5)
    q = q / np.sqrt(H)
    allowed = np.tril(np.ones((T, T), bool))[None, None]
    context = _np_attention(q, k, v, allowed)
    expected = np.einsum("btnh,dnh->btd", context, att["o_proj"]["weight"])
    np.testing.assert_allclose(out.data, expected, atol=2e-5, rtol=1e-5)
    assert out.probs.shape == (B, N, T, T)
    np.testing.assert_allclose(np.asarray(out.probs).sum(-1), 1.0, atol=1e-5)
    assert float(jnp.abs(jnp.triu(out.probs, 1)).max()) == 0.0


def test_qk_norm_scale_shared_across_heads():
    layer = _build(_gqa_config(qk_norm=True))
    specs = layer.create_parameter_specs_recursively()
    assert tuple(specs["scale_query"]["norm"]["scale"].shape) == (H,)
    assert tuple(specs["scale_key"]["norm"]["scale"].shape) == (H,)


def test_fused_grouped_equals_grouped():
    """Same weights through FusedGroupedQKVLinear and GroupedQKVLinear give equal outputs."""
    fused = _build(_gqa_config(fused=True))
    split = _build(_gqa_config(fused=False))
    params = _randomize(_init(fused))
    w = params["i_proj"]["i_proj"]["qkv_proj"]["weight"]
    split_params = dict(params)
    split_params["i_proj"] = dict(
        params["i_proj"],
        i_proj=dict(
            q_proj=dict(weight=w[:, :N]),
            k_proj=dict(weight=w[:, N : N + K]),
            v_proj=dict(weight=w[:, N + K :]),
        ),
    )
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    a = _call(fused, params, dict(query=x)).data
    b = _call(split, split_params, dict(query=x)).data
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_fused_qkv_linear_equals_qkv_linear():
    base = dict(query_dim=D, key_dim=D, value_dim=D, num_heads=N, per_head_dim=H)
    fused = _build(FusedQKVLinear.default_config().set(**base))
    plain = _build(QKVLinear.default_config().set(**base))
    params = _init(fused)
    w = params["qkv_proj"]["weight"]
    b = params["qkv_proj"]["bias"]
    assert w.shape == (3, D, N, H) and b.shape == (3, N, H)
    spec = fused.create_parameter_specs_recursively()["qkv_proj"]["weight"]
    assert tuple(spec.shape) == (3, D, N, H)
    plain_params = {
        f"{p}_proj": dict(weight=w[i], bias=b[i] + 0.1 * i) for i, p in enumerate("qkv")
    }
    fused_params = dict(qkv_proj=dict(weight=w, bias=b + 0.1 * jnp.arange(3)[:, None, None]))
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    y = jax.random.normal(jax.random.PRNGKey(4), (B, T, D))
    for kwargs in (dict(query=x), dict(query=x, key=y, value=y)):
        out_f = _call(fused, fused_params, kwargs)
        out_p = _call(plain, plain_params, kwargs)
        for a, b_ in zip(out_f, out_p):
            np.testing.assert_allclose(a, b_, atol=1e-6)


def test_multihead_attention_with_biases_and_cross_attention():
    cfg = MultiheadAttention.default_config().set(
        query_dim=D, key_dim=12, value_dim=12, num_heads=N
    )
    layer = _build(cfg)
    params = _init(layer)
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    src = jax.random.normal(jax.random.PRNGKey(4), (B, 5, 12))
    bias = jnp.where(jnp.arange(5) < 3, 0.0, NEG_INF)[None, None, None, :]
    out = _call(
        layer,
        params,
        dict(query=x, key=src, value=src, attention_logit_biases=bias, return_aux={"probs"}),
    )
    assert out.data.shape == (B, T, D)
    assert float(out.probs[..., 3:].max()) == 0.0
    p = jax.tree.map(np.asarray, params)["i_proj"]
    q = np.einsum("btd,dnh->btnh", x, p["q_proj"]["weight"]) + p["q_proj"]["bias"]
    k = np.einsum("btd,dnh->btnh", src, p["k_proj"]["weight"]) + p["k_proj"]["bias"]
    logits = np.einsum("btnh,bsnh->bnts", q / np.sqrt(H), k)[..., :3]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(out.probs[..., :3], probs, atol=1e-5)


@pytest.mark.parametrize("variant", ["causal", "segments", "window", "bias", "no_mask"])
def test_flash_equals_plain(variant):
    kwargs = {}
    if variant == "window":
        kwargs = dict(
            causal=False,
            mask=config_for_function(sliding_window_causal_mask).set(sliding_window_size=2),
        )
    elif variant == "no_mask":
        kwargs = dict(causal=False)
    plain = _build(_gqa_config(qk_norm=True, **kwargs))
    flash = _build(_gqa_config(qk_norm=True, cls=FlashAttention, **kwargs))
    params = _randomize(_init(plain))
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    inputs = dict(query=x)
    if variant == "segments":
        inputs["segment_ids"] = jnp.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0]])
    if variant == "bias":
        inputs["attention_logit_biases"] = jax.random.normal(jax.random.PRNGKey(5), (B, 1, T, T))
    a = _call(plain, params, inputs).data
    b = _call(flash, params, inputs).data
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)

    if variant not in ("causal", "segments"):
        return

    # Gradients too.
    def loss(layer, p):
        return jnp.sum(_call(layer, p, inputs).data ** 2)

    ga = jax.grad(lambda p: loss(plain, p))(params)
    gb = jax.grad(lambda p: loss(flash, p))(params)
    for u, v in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(u, v, atol=1e-4, rtol=1e-4)


def test_sliding_window_matches_numpy():
    cfg = _gqa_config(
        causal=False,
        mask=config_for_function(sliding_window_causal_mask).set(sliding_window_size=2),
    )
    layer = _build(cfg)
    params = _randomize(_init(layer))
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    probs = _call(layer, params, dict(query=x, return_aux={"probs"})).probs
    i, j = np.arange(T)[:, None], np.arange(T)[None]
    disallowed = ~((i - j >= 0) & (i - j <= 2))
    assert float(np.abs(np.asarray(probs)[..., disallowed]).max()) == 0.0
    assert float(np.asarray(probs)[..., ~disallowed].min()) > 0.0


def test_causal_and_mask_are_exclusive():
    cfg = _gqa_config(
        mask=config_for_function(sliding_window_causal_mask).set(sliding_window_size=2)
    )
    with pytest.raises(ValueError, match="either causal or mask"):
        _build(cfg)


def test_attention_dropout_only_in_training():
    cfg = _gqa_config()
    cfg.dropout.set(rate=0.5)
    layer = _build(cfg)
    params = _init(layer)
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    inputs = dict(query=x, return_aux={"probs"})
    eval_probs = _call(layer, params, inputs).probs
    train_probs = _call(layer, params, inputs, is_training=True, key=jax.random.PRNGKey(9)).probs
    np.testing.assert_allclose(np.asarray(eval_probs).sum(-1), 1.0, atol=1e-5)
    causal = np.broadcast_to(np.tril(np.ones((T, T), bool)), train_probs.shape)
    dropped = (np.asarray(train_probs) == 0) & causal
    assert 0.3 < dropped.sum() / causal.sum() < 0.7
    kept = ~dropped & causal
    np.testing.assert_allclose(
        np.asarray(train_probs)[kept], 2.0 * np.asarray(eval_probs)[kept], rtol=1e-5
    )


@pytest.mark.parametrize("structure", ["prenorm", "postnorm", "hybridnorm", "nonorm"])
def test_feed_forward_swiglu_matches_numpy(structure):
    cfg = TransformerFeedForwardLayer.default_config().set(
        input_dim=D,
        hidden_dim=24,
        activation=("nn.silu", "linear"),
        structure=structure,
        residual_weight=0.5,
        norm=RMSNorm.default_config().set(eps=1e-6),
        add_dead_neuron_summary=True,
        add_value_rms_norm_summary=["linear2_outputs"],
    )
    layer = _build(cfg)
    params = _randomize(_init(layer))
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    out, collection = functional(layer, None, params, dict(inputs=x), is_training=False)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)

    def ffn(h):
        gate = h @ p["linear1_0"]["weight"] + p["linear1_0"]["bias"]
        up = h @ p["linear1_1"]["weight"] + p["linear1_1"]["bias"]
        act = gate / (1 + np.exp(-gate)) * up
        return act @ p["linear2"]["weight"] + p["linear2"]["bias"]

    xn = np.asarray(x, np.float64)
    if structure == "prenorm":
        expected = xn + 0.5 * ffn(_np_rms_norm(xn, p["norm"]["scale"], 1e-6))
    elif structure == "postnorm":
        expected = _np_rms_norm(xn + 0.5 * ffn(xn), p["norm"]["scale"], 1e-6)
    elif structure == "hybridnorm":
        inner = ffn(_np_rms_norm(xn, p["prenorm"]["scale"], 1e-6))
        expected = xn + 0.5 * _np_rms_norm(inner, p["postnorm"]["scale"], 1e-6)
    else:
        expected = 0.5 * ffn(xn)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-5)
    summaries = collection.summaries
    assert "dead_neurons/nn.silu" in summaries and "rms_norm/linear2_outputs" in summaries


def _checkpoint_names(jaxpr) -> set:
    names = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "name":
            names.add(eqn.params["name"])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    names |= _checkpoint_names(inner)
    return names


def test_remat_names():
    """Attention and feed-forward tensors carry the names the remat policy regexes match."""
    layer = _build(_gqa_config())
    params = _init(layer)
    x = jax.random.normal(jax.random.PRNGKey(3), (B, T, D))
    jaxpr = jax.make_jaxpr(lambda p, x: _call(layer, p, dict(query=x)).data)(params, x)
    names = _checkpoint_names(jaxpr.jaxpr)
    expected = {
        f"GroupedQueryAttention.{n}" for n in ("q_proj", "k_proj", "v_proj", "context", "o_proj")
    }
    assert expected <= names
    ffn = _build(
        TransformerFeedForwardLayer.default_config().set(
            input_dim=D, hidden_dim=8, activation=("nn.silu", "linear")
        )
    )
    fp = _init(ffn)
    jaxpr = jax.make_jaxpr(lambda p, x: _call(ffn, p, dict(inputs=x)))(fp, x)
    assert {f"TransformerFeedForwardLayer.{n}" for n in ("linear1_0", "linear1_1", "linear2")} <= (
        _checkpoint_names(jaxpr.jaxpr)
    )


def test_mask_as_plain_function_equals_causal():
    """`mask=causal_mask` (a plain function, as users write it) is accepted and equals causal."""
    causal_layer = _build(_gqa_config(causal=True))
    fn_cfg = _gqa_config(causal=False)
    fn_cfg.mask = causal_mask  # The config type check must accept a MaskFn function.
    fn_layer = _build(fn_cfg)
    params = _randomize(_init(causal_layer))
    x = jax.random.normal(jax.random.PRNGKey(5), (B, T, D))
    a = _call(causal_layer, params, dict(query=x)).data
    b = _call(fn_layer, params, dict(query=x)).data
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
