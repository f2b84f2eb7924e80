"""Tests of axlearn.common.decoding: logit filtering, stop conditions, sampling, beam search.

The loops are checked against a bigram "model" (next-token log-probs depend only on the current
token) whose sequence scores are computed independently with NumPy, and beam search against
brute-force enumeration.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import decoding, logit_modifiers
from axlearn.common.decoding import (
    NEG_INF,
    CompositeDecodingCondition,
    StopOnMaxLength,
    StopOnSubsequence,
    add_decoding_dim,
    beam_search_decode,
    brevity_penalty_fn,
    flatten_decoding_dim,
    infer_initial_time_step,
    sample_decode,
    sample_tokens,
    top_k_logits,
    top_p_logits,
    unflatten_decoding_dim,
)
from axlearn.common.utils import VDict


def test_top_k_and_top_p():
    logits = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept_k = np.asarray(top_k_logits(logits, 2)) > -1e29
    np.testing.assert_array_equal(kept_k, [[True, True, False, False, False]])
    # Nucleus 0.8: 0.5 + 0.2 < 0.8 so the third token is needed.
    kept_p = np.asarray(top_p_logits(logits[:, ::-1], 0.8)) > -1e29
    np.testing.assert_array_equal(kept_p, [[False, False, True, True, True]])
    assert (np.asarray(top_p_logits(logits, 1e-6)) > -1e29).sum() == 1
    with pytest.raises(ValueError, match="top_k"):
        top_k_logits(logits, 0)
    with pytest.raises(ValueError, match="top_p"):
        top_p_logits(logits, 0.0)


def test_sampling_distribution():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = jnp.log(jnp.tile(jnp.asarray(probs)[None], (20000, 1)))
    key = jax.random.PRNGKey(0)
    greedy = sample_tokens(None, logits, temperature=0.0)
    assert (np.asarray(greedy) == 0).all()
    samples = np.asarray(jax.jit(lambda k: sample_tokens(k, logits))(key))
    np.testing.assert_allclose(np.bincount(samples, minlength=4) / samples.size, probs, atol=0.015)
    # Temperature 0.5 squares and renormalizes the probabilities.
    hot = np.asarray(jax.jit(lambda k: sample_tokens(k, logits, temperature=0.5))(key))
    expected = probs**2 / (probs**2).sum()
    np.testing.assert_allclose(np.bincount(hot, minlength=4) / hot.size, expected, atol=0.015)
    top2 = np.asarray(jax.jit(lambda k: sample_tokens(k, logits, top_k=2))(key))
    np.testing.assert_allclose(
        np.bincount(top2, minlength=4) / top2.size, [5 / 8, 3 / 8, 0, 0], atol=0.015
    )
    with pytest.raises(ValueError, match="prng_key"):
        sample_tokens(None, logits, temperature=1.0)


def test_infer_initial_time_step():
    # The index of the last non-pad token (AXLearn's convention), 0 for an empty prompt.
    prefix = jnp.array([[3, 4, 0, 0], [3, 0, 5, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(infer_initial_time_step(prefix, pad_id=0), [1, 2, 0])


def test_decoding_dim_round_trip():
    x = jnp.arange(6).reshape(2, 3)
    tiled = add_decoding_dim(x, 4)
    assert tiled.shape == (2, 4, 3)
    np.testing.assert_array_equal(tiled[:, 2], x)
    flat = flatten_decoding_dim(tiled)
    assert flat.shape == (8, 3)
    np.testing.assert_array_equal(unflatten_decoding_dim(flat, 2, 4), tiled)
    assert add_decoding_dim(jnp.float32(1.0), 4).shape == ()
    with pytest.raises(ValueError, match="2 \\* 3"):
        unflatten_decoding_dim(flat, 2, 3)


def test_stop_conditions():
    seqs = jnp.array([[[5, 7, 1, 0]], [[5, 2, 3, 1]]])  # [batch=2, decodes=1, 4].
    eos = StopOnSubsequence([[1]])
    np.testing.assert_array_equal(
        eos(index=jnp.array([2, 2]), sequences=seqs, prefix_len=jnp.array([1, 1])),
        [[True], [False]],
    )
    pair = StopOnSubsequence([[2, 3], [9]])
    np.testing.assert_array_equal(
        pair(index=jnp.array([2, 2]), sequences=seqs, prefix_len=jnp.array([1, 1])),
        [[False], [True]],
    )
    # Matching at index 0 must not wrap around to the end of the sequence.
    np.testing.assert_array_equal(
        pair(index=jnp.array([0, 0]), sequences=seqs, prefix_len=jnp.array([1, 1])),
        [[False], [False]],
    )
    longest = StopOnMaxLength(2)
    np.testing.assert_array_equal(
        longest(index=jnp.array([2, 3]), sequences=seqs, prefix_len=jnp.array([1, 2])),
        [[False], [False]],
    )
    np.testing.assert_array_equal(
        longest(index=jnp.array([3, 3]), sequences=seqs, prefix_len=jnp.array([1, 2])),
        [[True], [False]],
    )
    both = CompositeDecodingCondition([eos, longest])
    np.testing.assert_array_equal(
        both(index=jnp.array([2, 3]), sequences=seqs, prefix_len=jnp.array([1, 1])),
        [[True], [True]],
    )
    with pytest.raises(ValueError, match="Zero length stopping seqs"):
        StopOnSubsequence([[1], []])
    with pytest.raises(ValueError, match="at least one"):
        CompositeDecodingCondition([])


VOCAB = 5
EOS = 1


def _bigram_log_probs(seed=0):
    rng = np.random.RandomState(seed)
    logits = rng.normal(size=(VOCAB, VOCAB)) * 2
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _bigram_fn(table):
    """tokens_to_scores of a bigram model; the cache counts calls per row (and has a VDict)."""
    table = jnp.asarray(table, jnp.float32)

    def fn(token_ids, cache):
        assert token_ids.shape[1] == 1
        new_cache = dict(
            calls=cache["calls"] + 1, stacked=VDict(x=cache["stacked"]["x"] + token_ids[None])
        )
        return table[token_ids[:, 0]], new_cache

    return fn


def _init_cache(batch):
    # "stacked" has a leading layer axis of 3 in front of the batch axis.
    return dict(
        calls=jnp.zeros([batch], jnp.int32), stacked=VDict(x=jnp.zeros([3, batch, 1], jnp.int32))
    )


def test_sample_decode_scores_prompt_forcing_and_stop():
    table = _bigram_log_probs()
    inputs = jnp.array([[3, 4, 0, 2, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0, 0, 0]])
    # Row 0: prompt [3, 4], then a forced 2 at index 3 after a sampled token at index 2.
    time_step = jnp.array([1, 0])
    batch, length = inputs.shape
    num_decodes = 16
    out = jax.jit(
        lambda key: sample_decode(
            inputs=inputs,
            time_step=time_step,
            cache=_init_cache(batch),
            tokens_to_scores=_bigram_fn(table),
            stop_decoding_condition=StopOnSubsequence([[EOS]]),
            num_decodes=num_decodes,
            prng_key=key,
        )
    )(jax.random.PRNGKey(0))
    seqs, scores = np.asarray(out.sequences), np.asarray(out.token_scores)
    assert seqs.shape == scores.shape == (batch, num_decodes, length)
    np.testing.assert_array_equal(seqs[0, :, 0], 4)  # Output position j = input position j + 1.
    np.testing.assert_array_equal(seqs[0, :, 2], 2)  # Forced, even in rows that sampled EOS.
    saw_eos = False
    for b in range(batch):
        for n in range(num_decodes):
            full = np.concatenate([np.asarray(inputs[b, :1]), seqs[b, n]])
            stopped = False
            for j in range(int(time_step[b]), length):
                token = full[j + 1]
                if stopped:
                    assert token == 0 and scores[b, n, j] == 0
                    continue
                np.testing.assert_allclose(scores[b, n, j], table[full[j], token], rtol=1e-6)
                forced = j + 1 < length and int(inputs[b, j + 1]) != 0
                if token == EOS and not forced:
                    stopped = saw_eos = True
    assert saw_eos
    # Samples differ across decodes (the distribution is not degenerate).
    assert len({tuple(r) for r in seqs[1]}) > 1


def test_sample_decode_greedy_and_distribution():
    table = _bigram_log_probs(1)
    inputs = jnp.zeros((1, 6), jnp.int32).at[0, 0].set(2)

    def run(key, modifier, n):
        return sample_decode(
            inputs=inputs,
            time_step=jnp.array([0]),
            cache=_init_cache(1),
            tokens_to_scores=lambda t, c: (modifier(_bigram_fn(table)(t, c)[0]), c),
            stop_decoding_condition=StopOnSubsequence([[99]]),
            num_decodes=n,
            prng_key=key,
        )

    greedy = run(jax.random.PRNGKey(0), logit_modifiers.top_k_logits(1), 2)
    expected, token = [], 2
    for _ in range(6):
        token = int(np.argmax(table[token]))
        expected.append(token)
    np.testing.assert_array_equal(greedy.sequences[0, 0], expected)
    np.testing.assert_array_equal(greedy.sequences[0, 1], expected)
    # The first sampled token follows softmax(table[2]).
    many = jax.jit(lambda k: run(k, lambda x: x, 4000))(jax.random.PRNGKey(1))
    first = np.asarray(many.sequences[0, :, 0])
    np.testing.assert_allclose(
        np.bincount(first, minlength=VOCAB) / first.size, np.exp(table[2]), atol=0.03
    )


def _brute_force_beams(table, prompt, total_len, alpha):
    """All EOS-terminated continuations of `prompt` within total_len + 1 tokens, best first."""
    results = []
    last = len(prompt) - 1
    non_eos = [t for t in range(VOCAB) if t != EOS]
    for n in range(0, total_len - last):
        for middle in itertools.product(non_eos, repeat=n):
            seq = list(prompt) + list(middle) + [EOS]
            if len(seq) > total_len + 1:
                continue
            raw = sum(table[seq[i], seq[i + 1]] for i in range(last, len(seq) - 1))
            length = len(seq) - 1
            results.append((raw / ((5.0 + length) / 6.0) ** alpha, seq))
    results.sort(key=lambda r: -r[0])
    return results


@pytest.mark.parametrize("alpha", [0.0, 0.8])
def test_beam_search_matches_brute_force(alpha):
    table = _bigram_log_probs(2)
    length, beams = 5, 64  # Beams >= live candidates: the search is exhaustive.
    inputs = jnp.array([[3, 4, 0, 0, 0], [2, 0, 0, 0, 0]])
    out = jax.jit(
        lambda: beam_search_decode(
            inputs=inputs,
            time_step=jnp.array([1, 0]),
            cache=_init_cache(2),
            tokens_to_scores=_bigram_fn(table),
            eos_id=EOS,
            num_decodes=beams,
            brevity_penalty=brevity_penalty_fn(alpha=alpha),
        )
    )()
    for b, prompt in enumerate([[3, 4], [2]]):
        expected = _brute_force_beams(table, prompt, length, alpha)[:beams]
        k = len(expected)
        np.testing.assert_allclose(out.scores[b, :k], [r[0] for r in expected], rtol=1e-5)
        assert (np.asarray(out.scores[b, k:]) < NEG_INF / 2).all()
        # Each returned sequence is EOS-terminated and has its reported score (ties may order
        # equal-score sequences differently from the brute force).
        found = set()
        for i in range(k):
            seq = [prompt[0]] + list(np.asarray(out.sequences[b, i]))
            end = seq.index(EOS)
            raw = sum(table[seq[j], seq[j + 1]] for j in range(len(prompt) - 1, end))
            np.testing.assert_allclose(out.scores[b, i], raw / ((5.0 + end) / 6.0) ** alpha, 1e-5)
            assert seq[: len(prompt)] == prompt
            found.add(tuple(seq[: end + 1]))
        cutoff = expected[-1][0] + 1e-4  # Sequences tied with the last kept one may differ.
        assert {tuple(r[1]) for r in expected if r[0] > cutoff} <= found
        # Live scores are sorted and are sums of log-probs of the live sequences.
        live = np.asarray(out.live_scores[b])
        assert (np.diff(live) <= 1e-6).all()
        seq = [prompt[0]] + list(np.asarray(out.live_sequences[b, 0]))
        raw = sum(table[seq[i], seq[i + 1]] for i in range(len(prompt) - 1, length))
        np.testing.assert_allclose(live[0], raw, rtol=1e-5)


def test_beam_search_small_beam_keeps_best():
    table = _bigram_log_probs(3)
    inputs = jnp.array([[3, 0, 0, 0, 0, 0]])
    out = beam_search_decode(
        inputs=inputs,
        time_step=jnp.array([0]),
        cache=_init_cache(1),
        tokens_to_scores=_bigram_fn(table),
        eos_id=EOS,
        num_decodes=2,
        loop="python",
    )
    scores = np.asarray(out.scores[0])
    assert scores[0] >= scores[1]
    # Each finished score is the log-prob of its sequence up to and including EOS.
    for i in range(2):
        seq = [3] + list(np.asarray(out.sequences[0, i]))
        end = seq.index(EOS)
        raw = sum(table[seq[j], seq[j + 1]] for j in range(end))
        np.testing.assert_allclose(scores[i], raw, rtol=1e-5)
    # The best finished sequence is at least as good as stopping right away.
    assert scores[0] >= table[3, EOS] - 1e-6


def test_gather_beams_matches_numpy_indexing():
    from axlearn.common.decoding import _gather_beams  # pylint: disable=import-outside-toplevel

    rng = np.random.RandomState(0)
    x = rng.randint(0, 100, size=(2, 3, 4))
    y = rng.randn(2, 3, 2, 5).astype(np.float32)
    idx = np.asarray([[2, 0, 0, 1, 2], [1, 1, 0, 2, 2]])
    expected = [x[np.arange(2)[:, None], idx], y[np.arange(2)[:, None], idx]]
    for one_hot in (True, False):
        got = _gather_beams(
            dict(x=x, y=y, step=jnp.zeros([])), jnp.asarray(idx), 2, 3, 5, one_hot=one_hot
        )
        np.testing.assert_array_equal(got["x"], expected[0])
        np.testing.assert_allclose(got["y"], expected[1], rtol=1e-6)
        assert got["step"].shape == ()


def test_decode_and_beam_init_states():
    from axlearn.common.decoding import _beam_init, _decode_init  # pylint: disable=import-outside-toplevel

    inputs = jnp.asarray([[5, 6, 0], [5, 0, 0]])
    time_step = decoding.infer_initial_time_step(inputs, pad_id=0)
    scores = jnp.asarray([[0.5, 0.25, 0.0], [0.75, 0.0, 0.0]])
    state = _decode_init(
        inputs=inputs,
        time_step=time_step,
        num_decodes=2,
        max_decode_len=5,
        cache=dict(k=jnp.ones((2, 7))),
        prng_key=jax.random.PRNGKey(0),
        pad_id=0,
        token_scores=scores,
    )
    np.testing.assert_array_equal(state.cur_index, [1, 0])
    np.testing.assert_array_equal(state.sequences[:, 0], [[5, 6, 0, 0, 0], [5, 0, 0, 0, 0]])
    np.testing.assert_allclose(state.token_scores[:, 1, 1:4], scores)
    np.testing.assert_array_equal(state.token_scores[:, :, 0], 0)
    assert state.cache["k"].shape == (2, 2, 7) and not state.stop_decoding.any()
    with pytest.raises(ValueError, match="token_scores.shape"):
        _decode_init(
            **{
                **dict(inputs=inputs, time_step=time_step, num_decodes=1),
                **dict(max_decode_len=3, cache={}, prng_key=None, pad_id=0),
                "token_scores": scores,
            }
        )
    beam = _beam_init(
        inputs=inputs, time_step=time_step, beam_size=3, max_decode_len=4, cache={}, pad_id=0
    )
    np.testing.assert_array_equal(beam.live_scores[0], [0.0, decoding.NEG_INF, decoding.NEG_INF])
    np.testing.assert_array_equal(beam.live_seqs[1, 2], [5, 0, 0, 0])
    assert beam.prefix_merger is None
    with pytest.raises(ValueError, match="max_decode_len"):
        _beam_init(
            inputs=inputs, time_step=time_step, beam_size=1, max_decode_len=2, cache={}, pad_id=0
        )
    with pytest.raises(ValueError, match="time_step.shape"):
        _beam_init(
            inputs=inputs,
            time_step=time_step[:1],
            beam_size=1,
            max_decode_len=4,
            cache={},
            pad_id=0,
        )
