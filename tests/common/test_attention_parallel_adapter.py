"""Tests of ParallelTransformerLayer, BottleNeckAdapterTransformerLayer and skip connections."""

import jax
import numpy as np
import pytest

from axlearn.common.attention import (
    BottleNeckAdapterTransformerLayer,
    ParallelTransformerLayer,
    StackedTransformerLayer,
    TransformerLayer,
    update_data_with_skip_connection,
)
from axlearn.common.config import config_for_function
from axlearn.common.layers import RMSNorm, set_bias_recursively
from axlearn.common.module import functional

DIM, HEADS, BATCH, LEN = 8, 2, 2, 4


def _f64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _np_attention(x, p, biases=None):
    q, k, v = (np.einsum("btd,dnh->btnh", x, p["i_proj"][f"{n}_proj"]["weight"]) for n in "qkv")
    logits = np.einsum("btnh,bsnh->bnts", q * (DIM // HEADS) ** -0.5, k)
    if biases is not None:
        logits = logits + biases
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bnts,bsnh->btnh", probs, v)
    return np.einsum("btnh,dnh->btd", context, p["o_proj"]["weight"])


def test_parallel_transformer_layer_matches_numpy():
    cfg = ParallelTransformerLayer.default_config().set(name="par", input_dim=DIM)
    cfg.self_attention.num_heads = HEADS
    cfg.feed_forward.hidden_dim = 16
    cfg.norm = RMSNorm.default_config()
    set_bias_recursively(cfg, bias=False)
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert set(params) == {"norm", "self_attention", "feed_forward"}
    assert "norm" not in params["feed_forward"]
    params["norm"]["scale"] = np.linspace(0.5, 1.5, DIM).astype(np.float32)
    x = np.random.default_rng(0).normal(size=(BATCH, LEN, DIM)).astype(np.float32)
    causal = np.where(np.tril(np.ones((LEN, LEN), bool)), 0.0, -1e9)
    out, _ = functional(
        layer, None, params, dict(data=x, self_attention_logit_biases=causal), is_training=False
    )

    p = _f64(params)
    normed = x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + 1e-8) * p["norm"]["scale"]
    attn = _np_attention(normed, p["self_attention"], causal)
    ff = p["feed_forward"]
    hidden = np.maximum(normed @ ff["linear1"]["weight"], 0.0)
    expected = x + attn + hidden @ ff["linear2"]["weight"]
    np.testing.assert_allclose(out.data, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ratio,hidden", [(0.1, 1), (0.5, 4), (1.0, 8)])
def test_bottleneck_adapter(ratio, hidden):
    layer_cfg = TransformerLayer.default_config()
    layer_cfg.self_attention.attention.num_heads = HEADS
    layer_cfg.feed_forward.hidden_dim = DIM
    cfg = BottleNeckAdapterTransformerLayer.default_config().set(
        name="adapter", input_dim=DIM, bottleneck_ratio=ratio, layer=layer_cfg
    )
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert params["adapter"]["linear1"]["weight"].shape == (DIM, hidden)
    assert params["adapter"]["linear2"]["weight"].shape == (hidden, DIM)
    x = np.random.default_rng(1).normal(size=(BATCH, LEN, DIM)).astype(np.float32)
    out, _ = functional(layer, None, params, dict(data=x), is_training=False)
    inner = layer_cfg.clone(name="inner", input_dim=DIM).instantiate(parent=None)
    h, _ = functional(inner, None, params["layer"], dict(data=x), is_training=False)
    h = np.asarray(h.data, np.float64)
    a = _f64(params["adapter"])
    up = np.maximum(h @ a["linear1"]["weight"] + a["linear1"]["bias"], 0.0)
    expected = h + up @ a["linear2"]["weight"] + a["linear2"]["bias"]
    np.testing.assert_allclose(out.data, expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="adapter.bottleneck_ratio=0"):
        cfg.clone(bottleneck_ratio=0).instantiate(parent=None)


class _AllOutputsStack(StackedTransformerLayer):
    """Returns every layer's Output (via the `_aggregate_layer_outputs` hook)."""

    def _aggregate_layer_outputs(self, layer_outputs):
        return list(layer_outputs)


def test_skip_connection_data_merger():
    layer_cfg = TransformerLayer.default_config()
    layer_cfg.self_attention.attention.num_heads = HEADS
    layer_cfg.feed_forward.hidden_dim = DIM
    cfg = _AllOutputsStack.default_config().set(
        name="stack", input_dim=DIM, num_layers=4, layer=layer_cfg
    )
    skip_cfg = cfg.clone(
        data_merger=config_for_function(update_data_with_skip_connection).set(
            skip_connections={3: 1}
        )
    )
    base, skip = cfg.instantiate(parent=None), skip_cfg.instantiate(parent=None)
    params = base.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = np.random.default_rng(2).normal(size=(BATCH, LEN, DIM)).astype(np.float32)
    base_out, _ = functional(base, None, params, dict(data=x), is_training=False)
    skip_out, _ = functional(skip, None, params, dict(data=x), is_training=False)
    for i in range(3):
        np.testing.assert_array_equal(base_out[i].data, skip_out[i].data)
    # Layer 3 reads layer 2's output plus layer 1's output.
    layer3 = layer_cfg.clone(name="l3", input_dim=DIM).instantiate(parent=None)
    merged = skip_out[2].data + skip_out[1].data
    expected, _ = functional(layer3, None, params["layer3"], dict(data=merged), is_training=False)
    np.testing.assert_allclose(skip_out[3].data, expected.data, rtol=1e-6, atol=1e-6)
    assert not np.allclose(base_out[3].data, skip_out[3].data)
    with pytest.raises(ValueError, match=r"skip_connections\[2\]=2"):
        update_data_with_skip_connection({2: 2})
