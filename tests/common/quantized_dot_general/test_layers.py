"""Tests of axlearn/common/quantized_dot_general/layers.py (and utils.py, int8_ops.py)."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common.config import InvalidConfigValueError
from axlearn.common.layers import Linear
from axlearn.common.module import functional as F
from axlearn.common.quantized_dot_general.activation_clipping import (
    TanhActivationClippingLayer,
)
from axlearn.common.quantized_dot_general.int8_ops import quantize_dequantize_int8
from axlearn.common.quantized_dot_general.layers import (
    ClippingChoice,
    DenseGeneralBaseLayer,
    DotGeneralQuantizationType,
    QuantizedDotGeneral,
    get_all_fp8_param_names,
    set_quantized_dot_general_recursively,
)
from axlearn.common.quantized_dot_general.utils import is_einsum_swapped_operands

KEY = jax.random.PRNGKey(0)


def _fp8_cfg(length=4):
    return QuantizedDotGeneral.default_config().set(
        quantization_type=DotGeneralQuantizationType.FP_8, fp8_amax_history_length=length
    )


def _linear(qcfg=None, bias=False):
    cfg = Linear.default_config().set(name="linear", input_dim=16, output_dim=8, bias=bias)
    cfg.quantized_dot_general = qcfg
    layer = cfg.instantiate(parent=None)
    return layer, layer.initialize_parameters_recursively(KEY)


def _x(shape=(4, 16), scale=2.0, seed=1):
    return np.asarray(jax.random.normal(jax.random.PRNGKey(seed), shape) * scale, np.float32)


def test_fp8_param_names_and_specs():
    assert get_all_fp8_param_names() == [
        "input_scale",
        "kernel_scale",
        "output_grad_scale",
        "input_amax_history",
        "kernel_amax_history",
        "output_grad_amax_history",
    ]
    _, params = _linear(_fp8_cfg(length=5))
    q = params["quantized_dot_general"]
    assert sorted(q) == sorted(get_all_fp8_param_names())
    assert q["input_scale"].shape == () and float(q["input_scale"]) == 1.0
    assert q["input_amax_history"].shape == (5,) and not np.any(q["input_amax_history"])
    # In-batch scaling (no history length): scales only.
    _, params = _linear(_fp8_cfg(length=None))
    assert sorted(params["quantized_dot_general"]) == [
        "input_scale",
        "kernel_scale",
        "output_grad_scale",
    ]
    # Without quantization the layer is unchanged.
    _, params = _linear(None)
    assert sorted(params) == ["weight"]


def test_linear_fp8_forward_and_state_gradients():
    layer, params = _linear(_fp8_cfg(length=3))
    # A history as after earlier steps: the scale is max(history) / 448.
    q = params["quantized_dot_general"]
    q["input_amax_history"] = jnp.array([6.0, 8.0, 1.0])
    q["kernel_amax_history"] = jnp.array([0.5, 0.25, 0.0])
    x = _x()

    def loss(params):
        y, _ = F(layer, is_training=True, prng_key=KEY, state=params, inputs=(jnp.asarray(x),))
        return jnp.sum(y), y

    grads, y = jax.grad(loss, has_aux=True)(params)
    sx, sw = np.float32(8.0) / 448, np.float32(0.5) / 448
    w = np.asarray(params["weight"])
    xq = (np.clip(x / sx, -448, 448).astype(ml_dtypes.float8_e4m3fn)).astype(np.float32) * sx
    wq = (np.clip(w / sw, -448, 448).astype(ml_dtypes.float8_e4m3fn)).astype(np.float32) * sw
    np.testing.assert_allclose(np.asarray(y), xq @ wq, rtol=1e-5, atol=1e-5)
    g = grads["quantized_dot_general"]
    assert float(g["input_scale"]) == sx and float(g["kernel_scale"]) == sw
    np.testing.assert_array_equal(np.asarray(g["input_amax_history"]), [np.abs(x).max(), 6, 8])
    np.testing.assert_array_equal(
        np.asarray(g["kernel_amax_history"]), [np.abs(w).max(), 0.5, 0.25]
    )


@pytest.mark.parametrize(
    "subscripts,act_shape,ker_shape,swapped",
    [
        ("...d,dh->...h", (2, 3, 16), (16, 8), False),
        ("btnh,dnh->btd", (2, 3, 4, 5), (6, 4, 5), False),
        ("bd,dh->hb", (4, 16), (16, 8), True),
    ],
)
def test_is_einsum_swapped_operands(subscripts, act_shape, ker_shape, swapped):
    act, ker = jnp.zeros(act_shape), jnp.zeros(ker_shape)
    assert is_einsum_swapped_operands(subscripts, act, ker) == swapped


def test_swapped_einsum_keeps_activation_state_on_activation():
    """When einsum passes (kernel, activation), the input history still records the input."""
    cfg = _fp8_cfg(length=2).set(name="q")
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(KEY)
    x, w = _x((4, 16), scale=5.0), _x((16, 8), scale=0.1, seed=2)

    def loss(params):
        y, _ = F(
            layer,
            method="einsum_maybe_quantized",
            is_training=True,
            prng_key=KEY,
            state=params,
            inputs=dict(subscripts="bd,dh->hb", activation=jnp.asarray(x), kernel=jnp.asarray(w)),
        )
        return jnp.sum(y)

    grads = jax.grad(loss)(params)
    assert float(grads["input_amax_history"][0]) == np.abs(x).max()
    assert float(grads["kernel_amax_history"][0]) == np.abs(w).max()


def test_int8_with_tanh_clipping_close_to_float():
    qcfg = QuantizedDotGeneral.default_config().set(
        quantization_type=DotGeneralQuantizationType.INT_8,
        activation_clipping=TanhActivationClippingLayer.default_config().set(clipping_max_abs=1e6),
    )
    ref_layer, params = _linear(None)
    test_layer, test_params = _linear(qcfg)
    assert not jax.tree.leaves(test_params["quantized_dot_general"])  # No int8 state.
    x = jnp.asarray(_x())
    ref, _ = F(ref_layer, is_training=False, prng_key=KEY, state=params, inputs=(x,))
    out, _ = F(test_layer, is_training=False, prng_key=KEY, state=params, inputs=(x,))
    err = np.abs(np.asarray(ref) - np.asarray(out))
    assert 0 < err.max() < 0.05 * np.abs(np.asarray(ref)).max()
    # Int8 rounding: 255 levels per row along the contracting axis.
    xq = np.asarray(quantize_dequantize_int8(x, (1,)))
    step = np.abs(np.asarray(x)).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(xq - np.asarray(x)) <= step / 2 + 1e-6)


def test_output_clipping():
    qcfg = QuantizedDotGeneral.default_config().set(
        activation_clipping=TanhActivationClippingLayer.default_config().set(clipping_max_abs=0.5),
        clipping_choice=ClippingChoice.OUTPUT_ACTIVATION,
    )
    layer, params = _linear(qcfg)
    x = jnp.asarray(_x(scale=10.0))
    out, _ = F(layer, is_training=False, prng_key=KEY, state=params, inputs=(x,))
    ref = 0.5 * np.tanh((np.asarray(x) @ np.asarray(params["weight"])) / 0.5)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-6)


def test_set_quantized_dot_general_recursively():
    from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

    model = transformer_lm_config(
        num_layers=2, model_dim=16, num_heads=2, hidden_dim=32, vocab_size=32
    )
    n = set_quantized_dot_general_recursively(model, _fp8_cfg())
    assert n >= 2  # At least the feed-forward linear1/linear2.
    ffn = model.decoder.transformer.layer.feed_forward
    assert ffn.linear1.quantized_dot_general.fp8_amax_history_length == 4
    assert ffn.linear1.quantized_dot_general is not ffn.linear2.quantized_dot_general
    int8 = QuantizedDotGeneral.default_config().set(
        quantization_type=DotGeneralQuantizationType.INT_8
    )
    set_quantized_dot_general_recursively(model, int8, set_only_if_none=True)
    assert ffn.linear1.quantized_dot_general.quantization_type == DotGeneralQuantizationType.FP_8
    assert isinstance(ffn.linear1, DenseGeneralBaseLayer.Config)


@pytest.mark.parametrize("length", [0, -3])
def test_bad_history_length(length):
    with pytest.raises(ValueError, match=r"q\.fp8_amax_history_length must be None"):
        _fp8_cfg(length=length).set(name="q").instantiate(parent=None)


def test_bad_field_types():
    cfg = QuantizedDotGeneral.default_config()
    with pytest.raises(InvalidConfigValueError, match="quantization_type expects"):
        cfg.set(quantization_type="fp8")
    with pytest.raises(InvalidConfigValueError, match="fp8_amax_history_length expects"):
        cfg.set(fp8_amax_history_length=2.5)
