"""Tests of quantized attention projections (axlearn/common/attention/qkv.py): the multi-head
linears are `DenseGeneralBaseLayer`s, so fp8/int8 configs reach q/k/v/o, and `FusedQKVLinear`
keeps one slice of quantization state per projection."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
from jax import numpy as jnp

from axlearn.common.attention import (
    FusedGroupedQKVLinear,
    FusedQKVLinear,
    MultiheadAttention,
    MultiheadInputLinear,
    MultiheadOutputLinear,
    QKVLinear,
)
from axlearn.common.module import functional as F
from axlearn.common.quantized_dot_general.layers import (
    DenseGeneralBaseLayer,
    DotGeneralQuantizationType,
    QuantizedDotGeneral,
    set_quantized_dot_general_recursively,
)
from axlearn.common.utils import flatten_items

KEY = jax.random.PRNGKey(0)
DIM, HEADS, PER_HEAD = 16, 2, 4
FP8_MAX = 448.0


def _fp8_cfg(length=3):
    return QuantizedDotGeneral.default_config().set(
        quantization_type=DotGeneralQuantizationType.FP_8, fp8_amax_history_length=length
    )


def _rand(shape, seed, scale=1.0):
    return np.asarray(jax.random.normal(jax.random.PRNGKey(seed), shape) * scale, np.float32)


def _qdq(x, scale):
    """NumPy fp8 e4m3 quantize-dequantize with `scale` (saturating), as the fp8 dot does."""
    q = np.clip(x / scale, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    return q.astype(np.float32) * scale


def test_multihead_linears_are_dense_general_layers():
    attn = MultiheadAttention.default_config().set(
        query_dim=DIM, key_dim=DIM, value_dim=DIM, num_heads=HEADS
    )
    attn.input_linear = QKVLinear.default_config()
    # The projection config QKVLinear clones for q/k/v, and output_linear.
    assert set_quantized_dot_general_recursively(attn, _fp8_cfg()) == 2
    assert isinstance(attn.output_linear, DenseGeneralBaseLayer.Config)
    assert attn.output_linear.quantized_dot_general.fp8_amax_history_length == 3
    params = attn.set(name="attn").instantiate(parent=None).initialize_parameters_recursively(KEY)
    quantized = sorted(
        path.rsplit("/quantized_dot_general/", 1)[0]
        for path, _ in flatten_items(params)
        if path.endswith("/quantized_dot_general/input_scale")
    )
    assert quantized == [
        "i_proj/k_proj", "i_proj/q_proj", "i_proj/v_proj", "o_proj"
    ]  # fmt: skip
    fused = MultiheadAttention.default_config().set(
        query_dim=DIM, key_dim=DIM, value_dim=DIM, num_heads=HEADS
    )
    fused.input_linear = FusedGroupedQKVLinear.default_config().set(num_kv_heads=1)
    assert set_quantized_dot_general_recursively(fused, _fp8_cfg()) == 2  # qkv_proj + output.


def _fp8_reference(x, w, in_hist, ker_hist):
    """NumPy fp8 projection with delayed scaling: scale = max(history) / 448 (1 if all 0)."""
    sx = np.max(in_hist) / FP8_MAX if np.max(in_hist) > 0 else 1.0
    sw = np.max(ker_hist) / FP8_MAX if np.max(ker_hist) > 0 else 1.0
    return _qdq(x, np.float32(sx)), _qdq(w, np.float32(sw))


def test_input_and_output_linear_fp8_forward_matches_numpy():
    x = _rand((2, 5, DIM), seed=1, scale=3.0)
    for klass, subscripts, x_in in (
        (MultiheadInputLinear, "btd,dnh->btnh", x),
        (MultiheadOutputLinear, "btnh,dnh->btd", _rand((2, 5, HEADS, PER_HEAD), 2, 3.0)),
    ):
        cfg = klass.default_config().set(
            name="proj", model_dim=DIM, num_heads=HEADS, per_head_dim=PER_HEAD, bias=True
        )
        cfg.quantized_dot_general = _fp8_cfg()
        layer = cfg.instantiate(parent=None)
        params = layer.initialize_parameters_recursively(KEY)
        params["bias"] = jnp.asarray(_rand(params["bias"].shape, seed=3))
        q = params["quantized_dot_general"]
        q["input_amax_history"] = jnp.array([4.0, 9.0, 1.0])
        q["kernel_amax_history"] = jnp.array([0.5, 0.0, 0.75])

        def loss(params, layer=layer, x_in=x_in):
            y, _ = F(layer, is_training=True, prng_key=KEY, state=params, inputs=(x_in,))
            return jnp.sum(y), y

        grads, y = jax.grad(loss, has_aux=True)(params)
        w = np.asarray(params["weight"])
        xq, wq = _fp8_reference(x_in, w, [4.0, 9.0, 1.0], [0.5, 0.0, 0.75])
        expected = np.einsum(subscripts, xq, wq) + np.asarray(params["bias"])
        np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-5)
        # The histories' "gradients" are their next values: this step's amax rolled in front.
        g = grads["quantized_dot_general"]
        np.testing.assert_array_equal(
            np.asarray(g["input_amax_history"]), [np.abs(x_in).max(), 4.0, 9.0]
        )
        np.testing.assert_array_equal(
            np.asarray(g["kernel_amax_history"]), [np.abs(w).max(), 0.5, 0.0]
        )


def _fused_fp8(bias: bool):
    cfg = FusedQKVLinear.default_config().set(
        name="qkv", query_dim=DIM, key_dim=DIM, value_dim=DIM, num_heads=HEADS,
        per_head_dim=PER_HEAD,
    )  # fmt: skip
    cfg.layer.bias = bias
    cfg.layer.quantized_dot_general = _fp8_cfg()
    layer = cfg.instantiate(parent=None)
    return layer, layer.initialize_parameters_recursively(KEY)


def test_fused_qkv_fp8_has_per_projection_state():
    _, params = _fused_fp8(bias=False)
    shapes = {path: value.shape for path, value in flatten_items(params)}
    assert shapes["qkv_proj/weight"] == (3, DIM, HEADS, PER_HEAD)
    assert shapes["qkv_proj/quantized_dot_general/input_scale"] == (3,)
    assert shapes["qkv_proj/quantized_dot_general/kernel_amax_history"] == (3, 3)


def test_fused_qkv_fp8_equals_numpy_per_projection():
    """Each of q, k, v is quantized with its own delayed scales (slice i of the stacked state),
    for self- and cross-attention, and its history update lands in slice i."""
    layer, params = _fused_fp8(bias=True)
    q_state = params["qkv_proj"]["quantized_dot_general"]
    in_hist = np.array([[4.0, 1.0, 0.0], [2.0, 8.0, 0.5], [0.0, 0.0, 0.0]], np.float32)
    ker_hist = np.array([[0.5, 0.1, 0.2], [0.0, 0.0, 0.0], [1.5, 0.25, 0.0]], np.float32)
    q_state["input_amax_history"] = jnp.asarray(in_hist)
    q_state["kernel_amax_history"] = jnp.asarray(ker_hist)
    params["qkv_proj"]["bias"] = jnp.asarray(_rand((3, HEADS, PER_HEAD), seed=4))
    w = np.asarray(params["qkv_proj"]["weight"])
    b = np.asarray(params["qkv_proj"]["bias"])
    query = _rand((2, 5, DIM), seed=5, scale=2.0)
    key, value = _rand((2, 5, DIM), seed=6, scale=5.0), _rand((2, 5, DIM), seed=7, scale=0.3)

    for inputs in (dict(query=query), dict(query=query, key=key, value=value)):
        xs = (query, query, query) if len(inputs) == 1 else (query, key, value)

        def loss(params, inputs=inputs):
            out, _ = F(layer, is_training=True, prng_key=KEY, state=params, inputs=inputs)
            return jnp.sum(out.query) + jnp.sum(out.key) + jnp.sum(out.value), out

        grads, out = jax.grad(loss, has_aux=True)(params)
        for i, got in enumerate((out.query, out.key, out.value)):
            xq, wq = _fp8_reference(xs[i], w[i], in_hist[i], ker_hist[i])
            expected = np.einsum("btd,dnh->btnh", xq, wq) + b[i]
            np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)
        g = grads["qkv_proj"]["quantized_dot_general"]
        for i in range(3):
            np.testing.assert_array_equal(
                np.asarray(g["input_amax_history"][i]),
                [np.abs(xs[i]).max(), *in_hist[i][:-1]],
            )
            np.testing.assert_array_equal(
                np.asarray(g["kernel_amax_history"][i]),
                [np.abs(w[i]).max(), *ker_hist[i][:-1]],
            )


def test_fused_qkv_unquantized_unchanged():
    """Without a quantizer the fused projection is the plain fused einsum."""
    cfg = FusedQKVLinear.default_config().set(
        name="qkv", query_dim=DIM, key_dim=DIM, value_dim=DIM, num_heads=HEADS,
        per_head_dim=PER_HEAD,
    )  # fmt: skip
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(KEY)
    assert "quantized_dot_general" not in params["qkv_proj"]
    query = _rand((2, 5, DIM), seed=5)
    out, _ = F(layer, is_training=False, prng_key=KEY, state=params, inputs=dict(query=query))
    w, b = np.asarray(params["qkv_proj"]["weight"]), np.asarray(params["qkv_proj"]["bias"])
    for i, got in enumerate((out.query, out.key, out.value)):
        np.testing.assert_allclose(
            np.asarray(got), np.einsum("btd,dnh->btnh", query, w[i]) + b[i], rtol=1e-5, atol=1e-5
        )
