"""Tests causal_lm.gpt_decoder_config and embedding.LearnedPositionalEmbedding.

The GPT-2 decoder is checked against a NumPy forward written from GPT-2's definition (learned
positions added to token embeddings; pre-norm layers of causal multi-head attention and a 4x
ReLU feed-forward; final LayerNorm; logits tied to the token table).
"""

import jax
import numpy as np
import pytest

from axlearn.common.attention import RepeatedTransformerLayer, StackedTransformerLayer
from axlearn.common.causal_lm import gpt_decoder_config, residual_initializer_cfg
from axlearn.common.embedding import LearnedPositionalEmbedding
from axlearn.common.layers import Linear
from axlearn.common.module import functional
from axlearn.common.utils import flatten_items

_DIM, _HEADS, _LAYERS, _VOCAB, _MAX_POS = 8, 2, 2, 11, 6
_EPS = 1e-5


def _decoder(stack=StackedTransformerLayer):
    cfg = gpt_decoder_config(
        stack.default_config(),
        num_layers=_LAYERS,
        hidden_dim=_DIM,
        num_heads=_HEADS,
        vocab_size=_VOCAB,
        max_position_embeddings=_MAX_POS,
        layer_norm_epsilon=_EPS,
    )
    return cfg.set(name="decoder").instantiate(parent=None)


def _random_params(decoder):
    """Parameters with every leaf (biases, norm scales included) randomized."""
    params = decoder.initialize_parameters_recursively(jax.random.PRNGKey(0))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    leaves = [
        np.asarray(x) + 0.3 * np.asarray(jax.random.normal(k, x.shape))
        for k, x in zip(keys, leaves)
    ]
    return jax.tree.unflatten(treedef, leaves)


def _layer_norm(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + _EPS) * p["scale"] + p["bias"]


def _numpy_gpt2(params, ids):
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    seq_len = ids.shape[1]
    x = p["emb"]["token_emb"]["weight"][ids] + p["emb"]["pos_emb"]["weight"][0, :seq_len]
    causal = np.tril(np.ones((seq_len, seq_len), bool))
    for i in range(_LAYERS):
        layer = p["transformer"][f"layer{i}"]
        att = layer["self_attention"]
        h = _layer_norm(x, att["norm"])
        proj = att["attention"]["i_proj"]
        q, k, v = (
            np.einsum("btd,dnh->btnh", h, proj[n]["weight"]) + proj[n]["bias"]
            for n in ("q_proj", "k_proj", "v_proj")
        )
        logits = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(_DIM // _HEADS)
        logits = np.where(causal, logits, -np.inf)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = np.einsum("bnts,bsnh->btnh", probs, v)
        o = att["attention"]["o_proj"]
        x = x + np.einsum("btnh,dnh->btd", ctx, o["weight"]) + o["bias"]
        ff = layer["feed_forward"]
        h = _layer_norm(x, ff["norm"])
        h = np.maximum(h @ ff["linear1"]["weight"] + ff["linear1"]["bias"], 0)
        x = x + h @ ff["linear2"]["weight"] + ff["linear2"]["bias"]
    x = _layer_norm(x, p["output_norm"])
    return x @ p["emb"]["token_emb"]["weight"].T


def test_gpt_decoder_config_structure():
    cfg = gpt_decoder_config(
        RepeatedTransformerLayer.default_config(),
        num_layers=3,
        hidden_dim=16,
        num_heads=4,
        vocab_size=50,
        max_position_embeddings=32,
        activation_function="nn.gelu",
    )
    assert cfg.attention_mask is None and cfg.lm_head is None
    assert cfg.emb.pos_emb.klass is LearnedPositionalEmbedding
    assert tuple(cfg.emb.pos_emb.shape) == (32,)
    layer = cfg.transformer.layer
    assert cfg.transformer.num_layers == 3
    assert layer.feed_forward.hidden_dim == 64 and layer.feed_forward.activation == "nn.gelu"
    assert layer.self_attention.attention.causal and layer.self_attention.attention.num_heads == 4
    assert cfg.output_norm.eps == 1e-8
    # Residual projections: N(0, 0.02 / sqrt(2 * 3)).
    init = layer.feed_forward.linear2.param_init.init_by_param_name
    (weight_init,) = init.values()
    assert weight_init.scale == pytest.approx(0.02 / np.sqrt(6))
    assert residual_initializer_cfg(3).init_by_param_name == init


def test_gpt_decoder_config_rejects_other_stacks():
    with pytest.raises(ValueError, match="stack_cfg must configure one of"):
        gpt_decoder_config(
            Linear.default_config(),
            num_layers=1,
            hidden_dim=8,
            num_heads=2,
            vocab_size=11,
            max_position_embeddings=4,
        )


def test_gpt_decoder_forward_matches_numpy_gpt2():
    decoder = _decoder()
    params = _random_params(decoder)
    shapes = {k: v.shape for k, v in flatten_items(params)}
    assert shapes["emb/pos_emb/weight"] == (1, _MAX_POS, _DIM)
    ids = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], np.int32)
    out, _ = functional(
        decoder,
        jax.random.PRNGKey(2),
        params,
        dict(input_batch=dict(input_ids=ids)),
        is_training=False,
    )
    np.testing.assert_allclose(out["logits"], _numpy_gpt2(params, ids), rtol=1e-4, atol=1e-4)


def test_gpt_decoder_extend_step_matches_forward():
    # Learned positions must follow the decode position in extend_step.
    decoder = _decoder()
    params = _random_params(decoder)
    ids = np.array([[3, 1, 4, 1, 5, 7], [9, 2, 6, 5, 3, 8]], np.int32)
    full, _ = functional(
        decoder, None, params, dict(input_batch=dict(input_ids=ids)), is_training=False
    )
    time_step = np.array([2, 2], np.int32)
    (states, _), _ = functional(
        decoder,
        None,
        params,
        dict(time_step=time_step, input_batch=dict(input_ids=ids)),
        is_training=False,
        method="prefill_states",
    )
    for t in range(2, ids.shape[1]):
        (states, out), _ = functional(
            decoder,
            None,
            params,
            dict(cached_states=states, input_ids=ids[:, t : t + 1]),
            is_training=False,
            method="extend_step",
        )
        np.testing.assert_allclose(out["logits"][:, 0], full["logits"][:, t], atol=1e-5)


def test_learned_positional_embedding():
    layer = (
        LearnedPositionalEmbedding.default_config()
        .set(name="pos", dim=4, shape=(5,))
        .instantiate(parent=None)
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    table = np.asarray(params["weight"])
    assert table.shape == (1, 5, 4)
    # Default init: N(0, 1/dim) (fan_out = dim).
    big = (
        LearnedPositionalEmbedding.default_config()
        .set(name="pos", dim=64, shape=(512,))
        .instantiate(parent=None)
    )
    std = np.asarray(big.initialize_parameters_recursively(jax.random.PRNGKey(1))["weight"]).std()
    assert std == pytest.approx(1 / 8, rel=0.05)
    positions = np.array([[0, 4, 2], [1, 1, 3]])
    out, _ = functional(layer, None, params, dict(positions=positions), is_training=False)
    np.testing.assert_array_equal(out, table[0][positions])
    emb, _ = functional(layer, None, params, {}, is_training=False, method="embeddings")
    np.testing.assert_array_equal(emb, table[0])
