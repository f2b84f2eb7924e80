"""Tests for axlearn/common/decoding_merge.py: merge matrices and merging beam scores."""

import itertools

import jax.numpy as jnp
import numpy as np

from axlearn.common import decoding
from axlearn.common.decoding_merge import (
    PrefixMerger,
    _merge_prefixes,
    compute_merge_matrix_by_prefix_ids,
)


def _reference_merge_matrix(ids: np.ndarray) -> np.ndarray:
    """By loops: beam j goes into the first beam i whose ids equal j's."""
    batch, n = ids.shape[:2]
    out = np.zeros((batch, n, n), np.int32)
    for b, j in itertools.product(range(batch), range(n)):
        i = next(i for i in range(n) if np.array_equal(ids[b, i], ids[b, j]))
        out[b, i, j] = 1
    return out


def test_merge_matrix_matches_a_loop_and_is_valid():
    rng = np.random.RandomState(0)
    for shape in [(3, 5), (2, 6, 2)]:
        ids = rng.randint(0, 2, size=shape)
        matrix = np.asarray(compute_merge_matrix_by_prefix_ids(jnp.asarray(ids)))
        np.testing.assert_array_equal(matrix, _reference_merge_matrix(ids))
        # Each beam is merged into exactly one beam, which keeps itself, ranked no lower.
        np.testing.assert_array_equal(matrix.sum(axis=1), 1)
        for b, to, frm in zip(*np.nonzero(matrix)):
            assert matrix[b, to, to] == 1 and to <= frm


def test_merge_prefixes_adds_probabilities():
    matrix = jnp.asarray([[[1, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]])
    probs = np.asarray([[0.1, 0.2, 0.3, 0.4]])
    merged = np.asarray(_merge_prefixes(matrix, log_probs=jnp.log(jnp.asarray(probs))))
    np.testing.assert_allclose(np.exp(merged[0, :2]), [0.5, 0.5], rtol=1e-5)
    assert (merged[0, 2:] < decoding.NEG_INF / 2).all()


class _AllEquivalentMerger(PrefixMerger):
    """Treats all beams as one hypothesis: every step pools them into the first beam."""

    def init_state(self, *, tokens):
        return dict(key=jnp.zeros(tokens.shape[:2], jnp.int32), fed=jnp.zeros(tokens.shape[:2]))

    def compute(self, state):
        return compute_merge_matrix_by_prefix_ids(state["key"])

    def update(self, *, tokens, state):
        return dict(key=state["key"], fed=state["fed"] + 1)


def test_beam_search_with_a_merger_pools_equal_beams():
    """Tokens 2 and 3 have probability 1/2 for two steps, then EOS is certain.

    Without merging each of the 4 sequences has probability 1/4 (2 beams keep two of them).
    Merging all beams at every step pools the probability mass of both beams into the first,
    so the best finished sequence carries the whole mass: 1.
    """
    eos = 1

    def tokens_to_scores(tokens, cache):
        del tokens
        step = cache["step"]
        cont = jnp.log(jnp.asarray([0.0, 0.0, 0.5, 0.5]) + 1e-30)
        fin = jnp.log(jnp.asarray([0.0, 1.0, 0.0, 0.0]) + 1e-30)
        return jnp.where(step[:, None] >= 2, fin, cont), dict(step=step + 1)

    kwargs = dict(
        inputs=jnp.zeros((1, 4), jnp.int32),
        time_step=jnp.zeros((1,), jnp.int32),
        cache=dict(step=jnp.zeros((1,), jnp.int32)),
        tokens_to_scores=tokens_to_scores,
        eos_id=eos,
        num_decodes=2,
    )
    plain = decoding.beam_search_decode(**kwargs)
    np.testing.assert_allclose(np.exp(plain.scores[0]), [0.25, 0.25], rtol=1e-4)
    merger = _AllEquivalentMerger()
    merged = decoding.beam_search_decode(**kwargs, prefix_merger=merger)
    np.testing.assert_allclose(np.exp(merged.scores[0, 0]), 1.0, rtol=1e-4)
    np.testing.assert_array_equal(merged.sequences[0, 0], [2, 2, 1, 0])
    # The runner-up is an (almost impossible) early EOS: the other beam was merged away.
    assert merged.scores[0, 1] < -60
