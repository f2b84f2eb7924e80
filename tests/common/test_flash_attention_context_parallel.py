"""Tests of axlearn.common.flash_attention.context_parallel (on 8 CPU devices, float32).

Context-parallel attention at degree 2, 4 and 8 (ring and all-gather forms) equals the
one-device layer and a NumPy reference written here, in values and gradients, for causal,
packed (segment ids), sliding-window, non-causal and GQA cases; decoding is unaffected; bad
settings fail with one line naming the config path.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from axlearn.common.attention import GroupedQKVLinear
from axlearn.common.attention_bias import causal_mask, sliding_window_causal_mask
from axlearn.common.config import config_for_function
from axlearn.common.flash_attention.context_parallel import (
    ContextParallelConfig,
    context_parallel_attention,
    from_load_balanced,
    shard_positions,
    to_load_balanced,
)
from axlearn.common.flash_attention.layer import FlashAttention
from axlearn.common.module import functional

DIM, HEADS, BATCH, LEN = 16, 4, 2, 32
WINDOW = 5


def _mesh(degree: int) -> Mesh:
    devices = np.array(jax.devices()[:8]).reshape(8 // degree, degree)
    return Mesh(devices, ("data", "seq"))


def _reference(q, k, v, segment_ids, mask_fn):
    """NumPy float64 attention of q [B,T,N,H] over k/v [B,T,K,H] (K divides N)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    logits = np.einsum("btnh,bsnh->bnts", q, k)
    pos = np.arange(q.shape[1])
    allowed = np.ones((len(pos), len(pos)), bool)
    if mask_fn == "causal":
        allowed = pos[:, None] >= pos[None, :]
    elif mask_fn == "window":
        delta = pos[:, None] - pos[None, :]
        allowed = (delta >= 0) & (delta <= WINDOW)
    allowed = np.broadcast_to(allowed, (q.shape[0], 1, len(pos), len(pos)))
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
        allowed = allowed & (seg[:, None, :, None] == seg[:, None, None, :])
    logits = np.where(allowed, logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", probs, v)


MASK_FNS = {"causal": causal_mask, "window": sliding_window_causal_mask(WINDOW), "none": None}


def _segments(rng):
    return jnp.asarray(np.sort(rng.integers(0, 3, size=(BATCH, LEN)), axis=1), jnp.int32)


def test_load_balanced_layout():
    x = jnp.arange(16)[None]
    y = to_load_balanced(x, 2)
    # Chunks of 4: device 0 holds chunks 0 and 3, device 1 chunks 1 and 2.
    np.testing.assert_array_equal(y[0], [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11])
    np.testing.assert_array_equal(from_load_balanced(y, 2), x)
    for i in range(2):
        positions = shard_positions(i, length=16, degree=2, load_balance=True)
        np.testing.assert_array_equal(positions, y[0, i * 8 : (i + 1) * 8])


@pytest.mark.parametrize(
    "degree,form,mask,packed,kv_heads",
    [
        (4, "ring", "causal", True, 2),
        pytest.param(4, "all_gather", "causal", True, 2, marks=pytest.mark.slow),
        pytest.param(2, "ring", "window", False, 1, marks=pytest.mark.slow),
        pytest.param(8, "ring", "none", True, 4, marks=pytest.mark.slow),
    ],
)
def test_function_equals_reference(degree, form, mask, packed, kv_heads):
    rng = np.random.default_rng(degree)
    head = 8
    q = jnp.asarray(rng.normal(size=(BATCH, LEN, HEADS, head)) / np.sqrt(head), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(BATCH, LEN, kv_heads, head)), jnp.float32) for _ in "kv")
    segments = _segments(rng) if packed else None
    cfg = ContextParallelConfig(form=form)
    with jax.set_mesh(_mesh(degree)):
        out = jax.jit(
            lambda q, k, v: context_parallel_attention(
                q, k, v, segment_ids=segments, mask_fn=MASK_FNS[mask], cfg=cfg
            )
        )(q, k, v)
    np.testing.assert_allclose(out, _reference(q, k, v, segments, mask), atol=1e-5)


def _layer(*, mask: str, kv_heads: int, context_parallel=None, **kwargs):
    cfg = FlashAttention.default_config().set(
        name="attn",
        query_dim=DIM,
        key_dim=DIM,
        value_dim=DIM,
        num_heads=HEADS,
        input_linear=GroupedQKVLinear.default_config().set(num_kv_heads=kv_heads),
        context_parallel=context_parallel,
        **kwargs,
    )
    if mask == "causal":
        cfg.causal = True
    elif mask == "window":
        cfg.mask = config_for_function(sliding_window_causal_mask).set(sliding_window_size=WINDOW)
    return cfg.instantiate(parent=None)


def _loss_and_grads(layer, params, x, segments, cotangent):
    def loss(params, x):
        inputs = dict(query=x)
        if segments is not None:
            inputs["segment_ids"] = segments
        out, _ = functional(layer, None, params, inputs, is_training=True)
        return jnp.sum(out.data * cotangent)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)


def _check_layer(degree, form, mask, packed, kv_heads):
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.normal(size=(BATCH, LEN, DIM)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(BATCH, LEN, DIM)), jnp.float32)
    segments = _segments(rng) if packed else None
    single = _layer(mask=mask, kv_heads=kv_heads)
    params = single.initialize_parameters_recursively(jax.random.PRNGKey(0))
    expected = _loss_and_grads(single, params, x, segments, cotangent)
    split = _layer(mask=mask, kv_heads=kv_heads, context_parallel=ContextParallelConfig(form=form))
    with jax.set_mesh(_mesh(degree)):
        actual = _loss_and_grads(split, params, x, segments, cotangent)
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-5, atol=1e-5)
    for got, want in zip(jax.tree.leaves(actual[1]), jax.tree.leaves(expected[1])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layer_values_and_gradients():
    _check_layer(4, "ring", "causal", True, 2)


@pytest.mark.slow
@pytest.mark.parametrize("degree", [2, 4, 8])
@pytest.mark.parametrize("form", ["ring", "all_gather"])
@pytest.mark.parametrize(
    "mask,packed,kv_heads",
    [
        ("causal", False, 4),
        ("causal", True, 2),
        ("window", False, 2),
        ("window", True, 1),
        ("none", True, 2),
    ],
)
def test_layer_values_and_gradients_all(degree, form, mask, packed, kv_heads):
    _check_layer(degree, form, mask, packed, kv_heads)


@pytest.mark.slow
def test_decoding_unaffected():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(BATCH, 8, DIM)), jnp.float32)
    single = _layer(mask="causal", kv_heads=2)
    split = _layer(mask="causal", kv_heads=2, context_parallel=ContextParallelConfig())
    params = single.initialize_parameters_recursively(jax.random.PRNGKey(0))

    def decode(layer):
        state, _ = functional(
            layer,
            None,
            params,
            dict(batch_size=BATCH, max_len=8, dtype=jnp.float32),
            method="init_states",
            is_training=False,
        )
        outs = []
        for t in range(8):
            (state, out), _ = functional(
                layer,
                None,
                params,
                dict(cached_states=state, query=x[:, t : t + 1]),
                method="extend_step",
                is_training=False,
            )
            outs.append(out.data)
        return jnp.concatenate(outs, axis=1)

    expected = decode(single)
    with jax.set_mesh(_mesh(4)):
        actual = jax.jit(lambda: decode(split))()
        forward = jax.jit(
            lambda x: functional(split, None, params, dict(query=x), is_training=False)[0].data
        )(x)
    np.testing.assert_allclose(actual, expected, atol=1e-5)
    # Decoding step by step equals the split forward pass over the same tokens.
    np.testing.assert_allclose(forward, expected, atol=1e-5)


def test_all_gather_backend_override_is_axlearns_switch():
    layer = _layer(mask="causal", kv_heads=2, backend_overrides={"all_gather_attention": True})
    assert layer._cp.form == "all_gather" and layer._cp.mesh_axis == "seq"
    with pytest.raises(ValueError, match=r"all_gather_attention'\]=1 must be True or False"):
        _layer(mask="causal", kv_heads=2, backend_overrides={"all_gather_attention": 1})


def _forward(layer, length: int, degree: int, segments=None):
    x = jnp.zeros((BATCH, length, DIM))
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    inputs = dict(query=x) if segments is None else dict(query=x, segment_ids=segments)
    with jax.set_mesh(_mesh(degree)):
        functional(layer, None, params, inputs, is_training=False)


def test_bad_input_one_line():
    cp = ContextParallelConfig()
    layer = _layer(mask="causal", kv_heads=2, context_parallel=cp)
    # Load-balanced causal: the sequence must divide into 2 * degree chunks.
    with pytest.raises(ValueError, match=r"attn\.context_parallel: sequence length 36 .* 2 \* "):
        _forward(layer, 36, 4)
    plain = _layer(mask="none", kv_heads=2, context_parallel=cp)
    with pytest.raises(ValueError, match=r"sequence length 30 is not divisible by degree = 4"):
        _forward(plain, 30, 4)
    wrong = _layer(mask="causal", kv_heads=2, context_parallel=ContextParallelConfig(degree=3))
    with pytest.raises(ValueError, match=r"attn\.context_parallel\.degree=3 does not match"):
        _forward(wrong, 32, 4)
    other = _layer(mask="causal", kv_heads=2, context_parallel=ContextParallelConfig(mesh_axis="x"))
    with pytest.raises(ValueError, match=r"mesh_axis='x' is not an axis of the mesh"):
        _forward(other, 32, 4)
    with pytest.raises(ValueError, match=r"attn\.implementation='cudnn' cannot run with"):
        _layer(mask="causal", kv_heads=2, context_parallel=cp, implementation="cudnn")
    with pytest.raises(ValueError, match=r"context_parallel\.form='ulysses' is not one of"):
        _layer(mask="causal", kv_heads=2, context_parallel=ContextParallelConfig(form="ulysses"))
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    inputs = dict(query=jnp.zeros((BATCH, 32, DIM)), attention_logit_biases=jnp.zeros((32, 32)))
    with pytest.raises(ValueError, match=r"attention_logit_biases were passed"):
        with jax.set_mesh(_mesh(4)):
            functional(layer, None, params, inputs, is_training=False)
    with pytest.raises(ValueError) as error:
        _forward(layer, 36, 4)
    assert "\n" not in str(error.value)
