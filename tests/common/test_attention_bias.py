"""Tests of the attention-bias classes of axlearn.common.attention_bias against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common.attention_bias import (
    NEG_INF,
    CausalAttentionBias,
    CompositeAttentionBias,
    SegmentIdAttentionBias,
    SlidingWindowAttentionBias,
    TensorAttentionBias,
    ZeroAttentionBias,
    make_causal_biases,
    make_sliding_window_causal_biases,
)

T = 5


def _allowed(bias):
    return np.asarray(bias) > NEG_INF / 2


def test_bias_values_match_numpy():
    pos = jnp.arange(T)[None]
    q, k = np.arange(T)[:, None], np.arange(T)[None, :]
    causal = CausalAttentionBias(target_positions=pos, source_positions=pos)
    np.testing.assert_array_equal(_allowed(causal.value())[0, 0], q >= k)
    window = SlidingWindowAttentionBias(
        target_positions=pos, source_positions=pos, sliding_window_size=1
    )
    np.testing.assert_array_equal(_allowed(window.value())[0, 0], (q >= k) & (q - k <= 1))
    segments = jnp.array([[1, 1, 2, 2, 0]])
    seg = SegmentIdAttentionBias(segments)
    same = np.asarray(segments)[0][:, None] == np.asarray(segments)[0][None, :]
    np.testing.assert_array_equal(_allowed(seg.value())[0, 0], same)
    total = causal + seg + ZeroAttentionBias()
    assert isinstance(total, CompositeAttentionBias) and len(total.biases) == 3
    np.testing.assert_array_equal(_allowed(total.value())[0, 0], (q >= k) & same)
    assert ZeroAttentionBias().value() is None
    assert CompositeAttentionBias([ZeroAttentionBias()]).value() is None
    explicit = TensorAttentionBias(jnp.ones((T, T)))
    assert explicit.value().shape == (1, 1, T, T)


def test_biases_are_pytrees():
    pos = jnp.arange(T)[None]
    bias = SlidingWindowAttentionBias(
        target_positions=pos, source_positions=pos, sliding_window_size=2
    ) + SegmentIdAttentionBias(jnp.ones((1, T), jnp.int32))
    out = jax.jit(lambda b: b.value())(bias)
    np.testing.assert_array_equal(out, bias.value())
    # Only tensors are leaves (the window size is static).
    assert len(jax.tree.leaves(bias)) == 3


def test_make_causal_biases_hand_computed():
    n = np.float32(NEG_INF)
    np.testing.assert_array_equal(
        make_causal_biases(4),
        [[0, n, n, n], [0, 0, n, n], [0, 0, 0, n], [0, 0, 0, 0]],
    )


def test_make_sliding_window_causal_biases_hand_computed():
    n = np.float32(NEG_INF)
    # Each query sees itself and one earlier key.
    np.testing.assert_array_equal(
        make_sliding_window_causal_biases(4, sliding_window_size=1),
        [[0, n, n, n], [0, 0, n, n], [n, 0, 0, n], [n, n, 0, 0]],
    )


def test_bias_default_configs_configure_attention_masks():
    """`*AttentionBias.default_config()` configures an attention layer's mask function."""
    from axlearn.common.attention import MultiheadAttention
    from axlearn.common.attention_bias import causal_mask
    from axlearn.common.module import functional

    assert CausalAttentionBias.default_config().instantiate() is causal_mask
    window_fn = SlidingWindowAttentionBias.default_config(sliding_window_size=2).instantiate()
    q, k = np.arange(6)[:, None], np.arange(6)[None, :]
    np.testing.assert_array_equal(window_fn(q, k), (q >= k) & (q - k <= 2))

    base = MultiheadAttention.default_config().set(
        name="attn", query_dim=8, key_dim=8, value_dim=8, num_heads=2
    )
    layer = base.clone(mask=SlidingWindowAttentionBias.default_config(sliding_window_size=1))
    layer = layer.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 8))
    ref_layer = base.instantiate(parent=None)
    outs = []
    for lyr, biases in ((layer, None), (ref_layer, make_sliding_window_causal_biases(5, 1))):
        out, _ = functional(
            lyr,
            jax.random.PRNGKey(2),
            params,
            dict(query=x, attention_logit_biases=biases),
            is_training=False,
        )
        outs.append(out.data)
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-6)


def test_apply_attention_logit_biases_and_padding_biases():
    from axlearn.common.attention import (
        _next_power_of_two,
        apply_attention_logit_biases,
        compute_padding_biases,
    )

    logits = jnp.ones((2, 3), jnp.bfloat16)
    assert apply_attention_logit_biases(logits, None) is logits
    out = apply_attention_logit_biases(logits, jnp.array([[0.0, -2.0, 1.0]]))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), [[1, -1, 2], [1, -1, 2]])
    ids = jnp.array([[5, 6, 0]])
    bias = np.asarray(compute_padding_biases(ids, pad_token_id=0))
    pad = np.array([0, 0, 1])
    # NumPy: NEG_INF per padded side (to or from).
    np.testing.assert_allclose(bias[0, 0], (pad[:, None] + pad[None, :]) * NEG_INF)
    assert not compute_padding_biases(ids, pad_token_id=None).any()
    assert [_next_power_of_two(x) for x in (300, 127.1, 128, 0.1)] == [512, 128, 128, 2]
