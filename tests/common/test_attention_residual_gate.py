"""Tests the learned residual gate (`residual_gate_init`) of the v2 transformer/MoE layers.

Reference: the same layer without a gate gives x + branch (so branch = out - x); the gated output
must be sqrt(1 - p**2) * x + p * branch with p = sigmoid(theta), computed here in NumPy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.attention import (
    NormPosition,
    TransformerAttentionLayer,
    TransformerFeedForwardLayer,
)
from axlearn.common.attention_bias import CausalAttentionBias
from axlearn.common.layers import RMSNorm
from axlearn.common.mixture_of_experts import TransformerFeedForwardMoE
from axlearn.common.module import functional

DIM = 8


def _config(kind, **kwargs):
    norm = {NormPosition.IN_NORM: RMSNorm.default_config()}
    if kind == "attention":
        cfg = TransformerAttentionLayer.default_config().set(
            name="layer", target_dim=DIM, source_dim=DIM, structure="v2", norm=norm, **kwargs
        )
        cfg.attention.set(num_heads=2, mask=CausalAttentionBias.default_config())
        return cfg
    if kind == "ffn":
        return TransformerFeedForwardLayer.default_config().set(
            name="layer", input_dim=DIM, hidden_dim=16, structure="v2", norm=norm, **kwargs
        )
    return TransformerFeedForwardMoE.default_config().set(
        name="layer",
        input_dim=DIM,
        hidden_dim=16,
        num_experts=4,
        num_groups=2,
        structure="v2",
        norm=norm,
        **kwargs,
    )


def _forward(layer, params, x):
    name = "target" if isinstance(layer, TransformerAttentionLayer) else "inputs"
    out, aux = functional(layer, jax.random.PRNGKey(1), params, {name: x}, is_training=False)
    out = out.data if isinstance(layer, TransformerAttentionLayer) else out
    return out, aux


@pytest.mark.parametrize("kind", ["attention", "ffn", "moe"])
@pytest.mark.parametrize("init", [None, 0.0, -1.0])
def test_residual_gate(kind, init):
    layer = _config(kind, residual_gate_init=init).instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    specs = layer.create_parameter_specs_recursively()
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 4, DIM))
    if init is None:
        assert "residual_gate_theta" not in params
        return
    theta = params["residual_gate_theta"]
    assert theta.shape == () and theta.dtype == jnp.float32 and float(theta) == init
    assert specs["residual_gate_theta"].weight_decay_scale == 0.0

    ungated_layer = _config(kind).instantiate(parent=None)
    ungated = {k: v for k, v in params.items() if k != "residual_gate_theta"}
    plain, _ = _forward(ungated_layer, ungated, x)
    branch = np.asarray(plain) - np.asarray(x)
    for value in (init, 2.5):
        params["residual_gate_theta"] = jnp.float32(value)
        out, aux = _forward(layer, params, x)
        p = 1 / (1 + np.exp(-value))
        expected = np.sqrt(1 - p * p) * np.asarray(x) + p * branch
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
        assert float(aux.summaries["residual_gate/theta"]) == value


@pytest.mark.parametrize("kind", ["attention", "ffn", "moe"])
def test_residual_gate_needs_v2(kind):
    cfg = _config(kind, residual_gate_init=0.0).set(
        structure="prenorm", norm=RMSNorm.default_config()
    )
    with pytest.raises(ValueError, match=r"layer\.residual_gate_init=0\.0 needs structure='v2'"):
        cfg.instantiate(parent=None)


def test_residual_gate_keeps_16_bit_dtype():
    layer = _config("ffn", residual_gate_init=0.0, dtype=jnp.bfloat16).instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert params["residual_gate_theta"].dtype == jnp.float32
    out, _ = _forward(layer, params, jnp.ones((1, 2, DIM), jnp.bfloat16))
    assert out.dtype == jnp.bfloat16
