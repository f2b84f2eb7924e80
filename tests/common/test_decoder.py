"""Tests of axlearn.common.decoder: KV-cache decoding equals full-sequence forwards."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.attention import CausalAttentionLogitBiasLayer
from axlearn.common.module import functional
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

VOCAB, BATCH, LENGTH = 64, 2, 12


_DECODERS = {}


def _decoder(stack="repeat", *, causal_mask_layer=False):
    """A small decoder and its parameters (cached: tests share models and compiled functions)."""
    key = (stack, causal_mask_layer)
    if key in _DECODERS:
        return _DECODERS[key]
    cfg = transformer_lm_config(
        num_layers=2,
        model_dim=32,
        num_heads=4,
        num_kv_heads=2,
        hidden_dim=48,
        vocab_size=VOCAB,
        rope_theta=500.0,
        qk_norm=True,
        stack=stack,
    ).decoder
    if causal_mask_layer:
        cfg.set(attention_mask=CausalAttentionLogitBiasLayer.default_config())
    decoder = cfg.set(name="decoder").instantiate(parent=None)
    params = jax.jit(decoder.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    # Non-trivial norm scales.
    params = jax.tree.map(
        lambda x: x * (1 + 0.2 * jnp.sin(jnp.arange(x.size).reshape(x.shape))) if x.ndim else x,
        params,
    )
    _DECODERS[key] = (decoder, params)
    return _DECODERS[key]


_METHODS = {}


def _method(decoder, method):
    """A jitted functional call of `method`; non-array kwargs are static."""
    cache = _METHODS.setdefault((id(decoder), method), {})

    def call(params, kwargs, key):
        arrays = {k: v for k, v in kwargs.items() if isinstance(v, (jax.Array, dict))}
        static = {k: v for k, v in kwargs.items() if k not in arrays}
        cache_key = repr(sorted(static.items()))
        if cache_key not in cache:

            def run(params, arrays, key):
                out, _ = functional(
                    decoder, key, params, {**arrays, **static}, method=method, is_training=False
                )
                return out

            cache[cache_key] = jax.jit(run)
        return cache[cache_key](params, arrays, key)

    return call


def _ids(seed=1, shape=(BATCH, LENGTH)):
    return jax.random.randint(jax.random.PRNGKey(seed), shape, 2, VOCAB)


@pytest.mark.parametrize("stack,causal_mask_layer", [("repeat", False), ("stack", True)])
def test_extend_step_matches_forward(stack, causal_mask_layer):
    decoder, params = _decoder(stack, causal_mask_layer=causal_mask_layer)
    ids = _ids()
    full = _method(decoder, "forward")(params, dict(input_ids=ids), None)["logits"]

    # From an empty cache, one token at a time.
    states = _method(decoder, "init_states")(
        params, dict(batch_size=BATCH, max_sequence_length=LENGTH), None
    )
    extend = _method(decoder, "extend_step")
    for t in range(LENGTH):
        states, out = extend(params, dict(cached_states=states, input_ids=ids[:, t : t + 1]), None)
        np.testing.assert_allclose(out["logits"][:, 0], full[:, t], atol=1e-5, rtol=1e-5)

    # Prefill the first 5 tokens (per-row time steps), then extend.
    prefix_len = jnp.array([5, 3])
    masked = jnp.where(jnp.arange(LENGTH)[None] < prefix_len[:, None], ids, 0)
    states, out = _method(decoder, "prefill_states")(
        params, dict(time_step=prefix_len, input_ids=masked), None
    )
    for b in range(BATCH):
        n = int(prefix_len[b])
        np.testing.assert_allclose(out["logits"][b, :n], full[b, :n], atol=1e-5, rtol=1e-5)
    for step in range(4):
        tokens = jnp.take_along_axis(ids, (prefix_len + step)[:, None], axis=1)
        states, out = extend(params, dict(cached_states=states, input_ids=tokens), None)
        expected = jnp.take_along_axis(full, (prefix_len + step)[:, None, None], axis=1)[:, 0]
        np.testing.assert_allclose(out["logits"][:, 0], expected, atol=1e-5, rtol=1e-5)


def test_greedy_decode_matches_repeated_forwards():
    decoder, params = _decoder("repeat")
    num_new, prefix_len = 32, 4
    prefix = _ids(shape=(BATCH, prefix_len))
    outputs = _method(decoder, "sample_decode")(
        params,
        dict(prefix=prefix, max_decode_len=num_new, temperature=0.0, stop_at_eos=False),
        None,
    )
    forward = _method(decoder, "forward")
    total = prefix_len + num_new
    seq = jnp.concatenate([prefix, jnp.zeros((BATCH, num_new), prefix.dtype)], axis=1)
    for t in range(prefix_len, total):
        logits = forward(params, dict(input_ids=seq), None)["logits"]
        seq = seq.at[:, t].set(jnp.argmax(logits[:, t - 1], axis=-1))
    np.testing.assert_array_equal(outputs.sequences, seq)
    np.testing.assert_array_equal(outputs.tokens, seq[:, prefix_len:])
    np.testing.assert_array_equal(outputs.num_decoded, [num_new] * BATCH)


def test_sample_decode_variable_prefix_and_eos():
    decoder, params = _decoder("stack", causal_mask_layer=True)
    prefix = jnp.array([[5, 6, 7, 0], [8, 9, 0, 0]])
    run = _method(decoder, "sample_decode")
    kwargs = dict(prefix=prefix, max_decode_len=6, temperature=0.8, top_k=5, top_p=0.9)
    a = run(params, kwargs, jax.random.PRNGKey(3))
    b = run(params, kwargs, jax.random.PRNGKey(3))
    np.testing.assert_array_equal(a.sequences, b.sequences)
    assert a.sequences.shape == (2, 10)
    # Prompts are kept; generation starts right after each prompt.
    np.testing.assert_array_equal(a.sequences[0, :3], [5, 6, 7])
    np.testing.assert_array_equal(a.sequences[1, :2], [8, 9])
    np.testing.assert_array_equal(a.sequences[1, 2:8], a.tokens[1])
    # After EOS (id 1) a row emits padding.
    for row in np.asarray(a.tokens):
        eos = np.where(row == 1)[0]
        if eos.size:
            assert (row[eos[0] + 1 :] == 0).all()
