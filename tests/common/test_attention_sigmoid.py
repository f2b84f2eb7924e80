"""Tests of axlearn.common.attention.SigmoidAttention against NumPy."""

import jax
import numpy as np

from axlearn.common.attention import GroupedQKVLinear, SigmoidAttention
from axlearn.common.module import functional

DIM, HEADS, KV_HEADS, BATCH, LEN = 16, 4, 2, 2, 6


def test_sigmoid_attention_matches_numpy():
    cfg = SigmoidAttention.default_config().set(
        name="attn",
        query_dim=DIM,
        key_dim=DIM,
        value_dim=DIM,
        num_heads=HEADS,
        causal=True,
        seq_len=LEN,
        input_linear=GroupedQKVLinear.default_config().set(num_kv_heads=KV_HEADS),
    )
    cfg.input_linear.layer.set(bias=False)
    cfg.output_linear.set(bias=False)
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, LEN, DIM))
    out, _ = functional(layer, None, params, dict(query=x, return_aux={"probs"}), is_training=False)

    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    xs = np.asarray(x, np.float64)
    q = np.einsum("btd,dnh->btnh", xs, p["i_proj"]["q_proj"]["weight"])
    k = np.einsum("btd,dnh->btnh", xs, p["i_proj"]["k_proj"]["weight"])
    v = np.einsum("btd,dnh->btnh", xs, p["i_proj"]["v_proj"]["weight"])
    head_dim = DIM // HEADS
    k = np.repeat(k, HEADS // KV_HEADS, axis=2)
    v = np.repeat(v, HEADS // KV_HEADS, axis=2)
    logits = np.einsum("btnh,bsnh->bnts", q * head_dim**-0.5, k) - np.log(LEN)
    causal = np.tril(np.ones((LEN, LEN), bool))
    probs = np.where(causal, 1 / (1 + np.exp(-logits)), 0.0)
    context = np.einsum("bnts,bsnh->btnh", probs, v)
    expected = np.einsum("btnh,dnh->btd", context, p["o_proj"]["weight"])
    np.testing.assert_allclose(out.probs, probs, atol=1e-6)
    np.testing.assert_allclose(out.data, expected, atol=1e-5, rtol=1e-5)
    # Probabilities do not sum to one (no softmax normalization).
    assert not np.allclose(np.asarray(out.probs).sum(-1), 1.0)
