"""Tests of MultiheadAttention.Config.logit_sink: a per-head sink logit joins the softmax."""

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common.attention import MultiheadAttention
from axlearn.common.module import functional

D, N, B, T = 8, 2, 2, 5
H = D // N


def _layer(logit_sink):
    cfg = MultiheadAttention.default_config().set(
        name="attn", query_dim=D, key_dim=D, value_dim=D, num_heads=N, causal=True
    )
    return cfg.set(logit_sink=logit_sink).instantiate(parent=None)


def test_logit_sink_probs_equal_numpy():
    layer = _layer(True)
    spec = layer.create_parameter_specs_recursively()["sink"]
    assert spec.shape == (N,) and tuple(spec.mesh_axes) == ("model",)
    assert spec.weight_decay_scale == 0
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(params["sink"], np.zeros(N))
    params["sink"] = jnp.array([1.0, -0.5])
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, D))
    out, _ = functional(layer, None, params, dict(query=x, return_aux={"probs"}), is_training=False)
    # NumPy float64: p[t, s] = exp(l[t, s]) / (sum_s' exp(l[t, s']) + exp(sink)), causal.
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    xs = np.asarray(x, np.float64)

    def proj(name):
        w = p["i_proj"][name]
        return np.einsum("btd,dnh->btnh", xs, w["weight"]) + w["bias"]

    logits = np.einsum("btnh,bsnh->bnts", proj("q_proj") * H**-0.5, proj("k_proj"))
    visible = np.arange(T)[:, None] >= np.arange(T)[None]
    e = np.where(visible, np.exp(logits), 0.0)
    expected = e / (e.sum(-1, keepdims=True) + np.exp(p["sink"])[None, :, None, None])
    np.testing.assert_allclose(out.probs, expected, atol=1e-5)
    assert np.all(np.asarray(out.probs).sum(-1) < 1)
    assert "sink" not in _layer(None).initialize_parameters_recursively(jax.random.PRNGKey(0))
