"""Tests of the attention-bias classes of axlearn.common.attention_bias against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import attention_bias as ab
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


def test_window_masks_match_numpy():
    q = np.arange(6)[:, None]
    k = np.arange(6)[None, :]
    for left, right in [(0, 0), (2, 0), (2, 1), (1, 3)]:
        got = np.asarray(ab.left_right_window_mask(left, right)(jnp.asarray(q), jnp.asarray(k)))
        expected = np.array([[i - left <= j <= i + right for j in range(6)] for i in range(6)])
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="left_context=-1"):
        ab.left_right_window_mask(-1, 0)
    got = np.asarray(ab.truncated_key_mask(3)(jnp.asarray(q), jnp.asarray(k)))
    np.testing.assert_array_equal(got, (np.arange(6) < 3)[None])
    both = ab.and_masks(ab.causal_mask, ab.truncated_key_mask(2))(jnp.asarray(q), jnp.asarray(k))
    either = ab.or_masks(ab.causal_mask, ab.truncated_key_mask(2))(jnp.asarray(q), jnp.asarray(k))
    np.testing.assert_array_equal(np.asarray(both), (k <= q) & (k < 2))
    np.testing.assert_array_equal(np.asarray(either), (k <= q) | (k < 2))


def test_left_right_window_attention_bias_value():
    pos = jnp.arange(5)[None]
    bias = ab.LeftRightWindowAttentionBias(
        target_positions=pos, source_positions=pos, left_context=2, right_context=1
    )
    i, j = np.arange(5)[:, None], np.arange(5)[None, :]
    expected = np.where((j >= i - 2) & (j <= i + 1), 0.0, ab.NEG_INF).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(bias.value())[0, 0], expected)


def test_split_takes_out_types_and_keeps_the_sum():
    pos = jnp.arange(5)[None]
    causal = ab.CausalAttentionBias(target_positions=pos, source_positions=pos)
    upper = ab.MaskFnAttentionBias(
        target_positions=pos, source_positions=pos, mask=lambda q, k: q < k
    )
    segments = ab.SegmentIdAttentionBias(jnp.asarray([[1, 1, 2, 2, 2]]))
    got = list(
        ab.split(
            ab.CompositeAttentionBias([upper, causal]),
            ab.CausalAttentionBias,
            ab.MaskFnAttentionBias,
        )
    )
    assert got[0] is causal and got[1] is upper and got[2].value() is None
    zero, rest = ab.split(causal + segments, ab.TensorAttentionBias)
    assert isinstance(zero, ab.ZeroAttentionBias) and not zero.has_value()
    np.testing.assert_array_equal(np.asarray(rest.value()), np.asarray((causal + segments).value()))
    # Two MaskFn parts merge into one whose mask is their AND: the sum of the two NEG_INF biases
    # is not reproduced, but the connected set (bias == 0) is.
    part, rest = ab.split(
        ab.CompositeAttentionBias([upper, segments, causal]), ab.MaskFnAttentionBias
    )
    i, j = np.arange(5)[:, None], np.arange(5)[None, :]
    np.testing.assert_array_equal(np.asarray(part.value())[0, 0] == 0, (i < j) & (j <= i))
    assert len(rest.biases) == 1 and rest.biases[0] is segments
    seg = np.array([1, 1, 2, 2, 2])
    expected = np.where(seg[:, None] == seg[None, :], 0.0, ab.NEG_INF).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(rest.value())[0, 0], expected)


def test_tensor_attention_bias_from_tensor_is_4d():
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    bias = ab.TensorAttentionBias.from_tensor(jnp.asarray(value))
    assert bias.bias.shape == (1, 1, 3, 4)
    np.testing.assert_array_equal(np.asarray(bias.value()), value[None, None])
    masked = ab.MaskFnAttentionBias(
        ab.causal_mask, target_positions=jnp.arange(3)[None], source_positions=jnp.arange(3)[None]
    )
    np.testing.assert_array_equal(np.asarray(masked.value())[0, 0] == 0, np.tri(3, dtype=bool))


def test_subclass_value_is_cast_and_broadcast():
    """A subclass implementing only `_value()` gets 4-D values, cast by `astype`."""

    class Explicit(ab.BaseAttentionBias):
        def __init__(self, tensor, **kwargs):
            super().__init__(**kwargs)
            self.tensor = tensor

        def _value(self):
            return self.tensor

    for shape, expected in [((5, 7), (1, 1, 5, 7)), ((3, 5, 7), (3, 1, 5, 7))]:
        assert Explicit(jnp.ones(shape)).value().shape == expected
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    bias = TensorAttentionBias.from_tensor(jnp.asarray(value))
    assert bias.dtype is None and bias.value().dtype == jnp.float32
    half = bias.astype(jnp.bfloat16)
    assert half.dtype == jnp.bfloat16 and bias.dtype is None
    assert half.value().dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(half.value(), np.float32)[0, 0], value)
    # The dtype is static: it survives jit and is not a leaf.
    assert jax.jit(lambda b: b.value())(half).dtype == jnp.bfloat16
    assert len(jax.tree.leaves(half)) == 1
    assert half.eval_shape() == (1, 1, 2, 3)
    with pytest.raises(ValueError, match="ZeroAttentionBias has no value"):
        ZeroAttentionBias().eval_shape()


def test_bool_biases_match_numpy():
    rng = np.random.default_rng(0)
    mask = rng.random((2, 4, 6)) > 0.5
    bias = ab.BoolTensorAttentionBias.from_tensor(jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(bias.bool_value()), mask[:, None])
    np.testing.assert_array_equal(
        np.asarray(bias.value()), np.where(mask[:, None], 0.0, NEG_INF).astype(np.float32)
    )
    assert isinstance(bias, ab.BoolAttentionBias)
    with pytest.raises(ValueError, match="must be bool"):
        ab.BoolTensorAttentionBias(jnp.ones((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="must be 4-D"):
        ab.BoolTensorAttentionBias(jnp.ones((2, 2), bool))
    assert ZeroAttentionBias().bool_value() is None
    # Per-example query positions: the mask function gets [batch, target, 1] and [1, 1, source].
    target = np.array([[0, 1, 2], [2, 1, 0]])
    seen = []

    def mask_fn(q, k):
        seen.append((q.shape, k.shape))
        return q >= k

    masked = ab.MaskFnAttentionBias(
        mask_fn, target_positions=jnp.asarray(target), source_positions=jnp.arange(4)[None]
    )
    expected = target[:, :, None] >= np.arange(4)[None, None, :]
    np.testing.assert_array_equal(np.asarray(masked.bool_value()), expected[:, None])
    assert seen[-1] == ((2, 3, 1), (1, 1, 4))
    with pytest.raises(ValueError, match="MaskFnAttentionBias: target_positions"):
        ab.MaskFnAttentionBias(
            mask_fn, target_positions=jnp.arange(3), source_positions=jnp.arange(4)
        ).value()
    # Unbatched segment ids [length] still give a bias (shape [length, 1, 1, length]).
    seg = np.array([1, 1, 2])
    got = SegmentIdAttentionBias(jnp.asarray(seg)).bool_value()
    np.testing.assert_array_equal(np.asarray(got)[:, 0, 0], seg[:, None] == seg[None, :])


def test_as_attention_bias_and_from_sequence_shapes():
    assert isinstance(ab.as_attention_bias(None), ZeroAttentionBias)
    converted = ab.as_attention_bias(jnp.zeros((3, 3)))
    assert isinstance(converted, TensorAttentionBias) and converted.value().shape == (1, 1, 3, 3)
    causal = CausalAttentionBias(target_positions=jnp.arange(3)[None], source_positions=None)
    assert ab.as_attention_bias(causal) is causal
    with pytest.raises(ValueError, match="must be floating"):
        ab.as_attention_bias(jnp.zeros((3, 3), bool))
    with pytest.raises(NotImplementedError):
        ab.as_attention_bias("causal")
    small = CausalAttentionBias(
        target_positions=jnp.arange(3)[None], source_positions=jnp.arange(3)[None]
    )
    large = CausalAttentionBias(
        target_positions=jnp.arange(4)[None], source_positions=jnp.arange(4)[None]
    )
    with pytest.raises(ValueError, match="shape"):
        CausalAttentionBias.from_sequence([small, large])


def test_partition_specs_follow_the_pytree():
    from jax.sharding import PartitionSpec as P

    specs = {"bnts": P("data", "model", None, None), "bsnh": P("data", None, "model", None)}
    pos = jnp.arange(4)[None]
    causal = CausalAttentionBias(target_positions=jnp.ones((2, 4), jnp.int32), source_positions=pos)
    tensor = TensorAttentionBias.from_tensor(jnp.zeros((2, 4, 4)))
    seg = SegmentIdAttentionBias(jnp.ones((2, 4), jnp.int32))
    total = causal + tensor + seg + ZeroAttentionBias()
    spec = total.partition_spec(specs)
    # Same structure as the (flat) sum: one spec per member.
    assert isinstance(spec, CompositeAttentionBias) and len(spec.biases) == 4
    causal_spec, tensor_spec, seg_spec, zero_spec = spec.biases
    # Batched target positions keep the batch sharding; broadcast (size 1) ones do not.
    assert causal_spec.target_positions == P("data", None)
    assert causal_spec.source_positions == P(None, None)
    # The tensor has one head: that dim is not sharded.
    assert tensor_spec == P("data", None, None, None)
    assert seg_spec == P("data", None)
    assert zero_spec == P()
    assert ab.CompositeAttentionBias([ZeroAttentionBias()]).partition_spec(specs).biases == [P()]
    with pytest.raises(ValueError, match="SegmentIdAttentionBias.partition_spec"):
        seg.partition_spec({"bsnh": P("data", "seq", None, None)})
    assert seg.partition_spec({"bsnh": P(None)}) == P(None)


def test_mask_configs_instantiate_to_biases_given_positions():
    """A mask config gives the mask fn; with positions, the bias over them (AXLearn's use)."""
    from axlearn.common.attention_bias import (  # pylint: disable=import-outside-toplevel
        CausalAttentionBias,
        LeftRightWindowAttentionBias,
        SlidingWindowAttentionBias,
    )

    n = 6
    positions = np.arange(n)[None]
    q, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    cases = [
        (CausalAttentionBias.default_config(), k <= q),
        (SlidingWindowAttentionBias.default_config(sliding_window_size=2), (k <= q) & (k >= q - 2)),
        (
            LeftRightWindowAttentionBias.default_config(left_context=1, right_context=2),
            (k >= q - 1) & (k <= q + 2),
        ),
    ]
    for cfg, expected in cases:
        mask_fn = cfg.instantiate()
        np.testing.assert_array_equal(mask_fn(q, k), expected)
        bias = cfg.instantiate(target_positions=positions, source_positions=positions)
        np.testing.assert_array_equal(np.exp(np.asarray(bias.value()))[0, 0], expected)
        with pytest.raises(ValueError, match="pass both or neither"):
            cfg.instantiate(target_positions=positions)
