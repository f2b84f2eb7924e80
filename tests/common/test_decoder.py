"""Tests of axlearn.common.decoder: KV-cache decoding equals full-sequence forwards (fp32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import logit_modifiers
from axlearn.common.attention import CausalAttentionLogitBiasLayer
from axlearn.common.decoding import StopOnSubsequence
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
        # Non-array kwargs (ints, functions) are static; functions are keyed by identity.
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


def _forward_logits(decoder, params, ids):
    return _method(decoder, "forward")(params, dict(input_batch=dict(input_ids=ids)), None)[
        "logits"
    ]


@pytest.mark.parametrize("stack,causal_mask_layer", [("repeat", False), ("stack", True)])
def test_extend_step_matches_forward(stack, causal_mask_layer):
    decoder, params = _decoder(stack, causal_mask_layer=causal_mask_layer)
    ids = _ids()
    full = _forward_logits(decoder, params, ids)

    # From an empty cache, one token at a time.
    states = _method(decoder, "init_states")(
        params, dict(batch_size=BATCH, max_sequence_length=LENGTH), None
    )
    extend = _method(decoder, "extend_step")
    for t in range(LENGTH):
        states, out = extend(params, dict(cached_states=states, input_ids=ids[:, t : t + 1]), None)
        np.testing.assert_allclose(out["logits"][:, 0], full[:, t], atol=1e-5, rtol=1e-5)

    # Prefill the first 5 / 3 tokens (per-row time steps), then extend.
    prefix_len = jnp.array([5, 3])
    masked = jnp.where(jnp.arange(LENGTH)[None] < prefix_len[:, None], ids, 0)
    states, out = _method(decoder, "prefill_states")(
        params, dict(time_step=prefix_len, input_batch=dict(input_ids=masked)), None
    )
    for b in range(BATCH):
        n = int(prefix_len[b])
        np.testing.assert_allclose(out["logits"][b, :n], full[b, :n], atol=1e-5, rtol=1e-5)
    for step in range(4):
        tokens = jnp.take_along_axis(ids, (prefix_len + step)[:, None], axis=1)
        states, out = extend(params, dict(cached_states=states, input_ids=tokens), None)
        expected = jnp.take_along_axis(full, (prefix_len + step)[:, None, None], axis=1)[:, 0]
        np.testing.assert_allclose(out["logits"][:, 0], expected, atol=1e-5, rtol=1e-5)


def test_forward_requires_input_ids():
    decoder, params = _decoder("repeat")
    with pytest.raises(KeyError, match="input_ids"):
        functional(decoder, None, params, dict(input_batch=dict(ids=_ids())), is_training=False)


_GREEDY = logit_modifiers.top_k_logits(1)
_NO_STOP = StopOnSubsequence([[VOCAB + 1]])


def test_greedy_sample_decode_matches_repeated_forwards():
    decoder, params = _decoder("repeat")
    max_len, prefix_len = 24, 4
    prefix = _ids(shape=(BATCH, prefix_len))
    outputs = _method(decoder, "sample_decode")(
        params,
        dict(
            input_batch=dict(prefix=prefix),
            max_sequence_length=max_len,
            num_decodes=1,
            logits_modifier=_GREEDY,
            stop_decoding_condition=_NO_STOP,
        ),
        jax.random.PRNGKey(0),
    )
    seq = jnp.concatenate([prefix, jnp.zeros((BATCH, max_len - prefix_len), prefix.dtype)], 1)
    for t in range(prefix_len, max_len):
        logits = _forward_logits(decoder, params, seq)
        seq = seq.at[:, t].set(jnp.argmax(logits[:, t - 1], axis=-1))
    # Outputs drop the first (prompt) token.
    assert outputs.sequences.shape == (BATCH, 1, max_len)
    np.testing.assert_array_equal(outputs.sequences[:, 0, : max_len - 1], seq[:, 1:])
    # Generated tokens' scores are the forward's log-probabilities (top-1 keeps the argmax's).
    log_probs = jax.nn.log_softmax(_forward_logits(decoder, params, seq), axis=-1)
    expected = jnp.take_along_axis(log_probs[:, :-1], seq[:, 1:, None], axis=-1)[..., 0]
    generated = slice(prefix_len - 1, max_len - 1)
    np.testing.assert_allclose(
        outputs.token_scores[:, 0, generated], expected[:, generated], atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("stack,causal_mask_layer", [("repeat", False), ("stack", True)])
def test_sample_decode_scores_equal_forward(stack, causal_mask_layer):
    """Every sampled sequence's token scores equal the full forward's (modified) log-probs."""
    decoder, params = _decoder(stack, causal_mask_layer=causal_mask_layer)
    max_len, num_decodes, temperature = 10, 3, 0.7
    prefix = jnp.array([[5, 6, 7, 0], [8, 9, 0, 0]])
    outputs = _method(decoder, "sample_decode")(
        params,
        dict(
            input_batch=dict(prefix=prefix),
            max_sequence_length=max_len,
            num_decodes=num_decodes,
            logits_modifier=logit_modifiers.scale_by(temperature),
        ),
        jax.random.PRNGKey(3),
    )
    assert outputs.sequences.shape == (BATCH, num_decodes, max_len)
    prompt_lens = [3, 2]
    saw_eos = False
    for b in range(BATCH):
        for n in range(num_decodes):
            row = np.asarray(outputs.sequences[b, n])
            full = np.concatenate([np.asarray(prefix[b, :1]), row])  # Re-attach the BOS.
            np.testing.assert_array_equal(full[: prompt_lens[b]], prefix[b, : prompt_lens[b]])
            eos = np.where(row[prompt_lens[b] - 1 :] == 1)[0]
            end = max_len if not eos.size else prompt_lens[b] + eos[0]
            saw_eos |= bool(eos.size)
            assert (row[end:] == 0).all()  # Padding after EOS.
            logits = _forward_logits(decoder, params, jnp.asarray(full[None, :max_len]))[0]
            # Scores are the modified log-probabilities (sampling normalizes them).
            scores = jax.nn.log_softmax(logits, -1) / temperature
            for j in range(end):
                np.testing.assert_allclose(
                    outputs.token_scores[b, n, j], scores[j, full[j + 1]], atol=1e-5, rtol=1e-5
                )
        # Different samples for the same prompt (temperature sampling).
        assert len({tuple(np.asarray(r)) for r in outputs.sequences[b]}) > 1
    del saw_eos


def test_beam_search_decode_scores_equal_forward():
    decoder, params = _decoder("repeat")
    max_len, beams = 8, 3
    prefix = jnp.array([[5, 6, 7, 0], [8, 0, 0, 0]])
    outputs = _method(decoder, "beam_search_decode")(
        params,
        dict(input_batch=dict(prefix=prefix), max_sequence_length=max_len, num_decodes=beams),
        None,
    )
    assert outputs.sequences.shape == outputs.live_sequences.shape == (BATCH, beams, max_len)
    for b, plen in enumerate([3, 1]):
        for kind, seqs, scores in (
            ("finished", outputs.sequences, outputs.scores),
            ("live", outputs.live_sequences, outputs.live_scores),
        ):
            assert (np.diff(np.asarray(scores[b])) <= 1e-6).all()
            for k in range(beams):
                row = np.asarray(seqs[b, k])
                full = np.concatenate([np.asarray(prefix[b, :1]), row])
                if kind == "finished":
                    if scores[b, k] < -1e6:  # Empty slot.
                        continue
                    end = plen - 1 + int(np.where(row[plen - 1 :] == 1)[0][0]) + 1
                else:  # Live beams stop growing once the search terminates early.
                    end = int(np.nonzero(full)[0].max())
                logits = _forward_logits(decoder, params, jnp.asarray(full[None, :max_len]))[0]
                log_probs = jax.nn.log_softmax(logits, -1)
                total = sum(float(log_probs[j, full[j + 1]]) for j in range(plen - 1, end))
                np.testing.assert_allclose(scores[b, k], total, atol=1e-4, rtol=1e-5)
