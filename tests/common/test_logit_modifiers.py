"""Tests of axlearn.common.logit_modifiers against NumPy."""

import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.config import config_for_function
from axlearn.common.logit_modifiers import chain, scale_by, top_k_logits, top_p_logits


def _kept(x):
    return np.asarray(x) > -1e6


def test_scale_top_k_top_p():
    logits = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    np.testing.assert_allclose(scale_by(0.5)(logits), np.asarray(logits) * 2, rtol=1e-6)
    np.testing.assert_array_equal(_kept(top_k_logits(2)(logits)), [[1, 1, 0, 0, 0]])
    # 0.5 + 0.2 < 0.8, so the nucleus needs a third token.
    np.testing.assert_array_equal(_kept(top_p_logits(0.8)(logits)), [[1, 1, 1, 0, 0]])
    # Kept logits are unchanged.
    np.testing.assert_array_equal(top_k_logits(2)(logits)[0, :2], logits[0, :2])
    ties = jnp.array([[1.0, 3.0, 3.0, 0.0]])
    np.testing.assert_array_equal(_kept(top_k_logits(1)(ties)), [[0, 1, 1, 0]])
    first = top_k_logits(1, break_ties="smallest_index")(ties)
    np.testing.assert_array_equal(_kept(first), [[0, 1, 0, 0]])
    with pytest.raises(ValueError, match="temperature"):
        scale_by(0.0)
    with pytest.raises(ValueError, match="top_k"):
        top_k_logits(0)
    with pytest.raises(NotImplementedError):
        top_k_logits(2, break_ties="smallest_index")
    with pytest.raises(ValueError, match="top_p"):
        top_p_logits(1.5)


def test_chain_accepts_configs():
    logits = jnp.array([[1.0, 2.0, 4.0]])
    fn = chain(scale_by(2.0), config_for_function(top_k_logits).set(k=1))
    out = np.asarray(fn(logits))
    np.testing.assert_allclose(out[0, 2], 2.0)
    np.testing.assert_array_equal(_kept(out), [[0, 0, 1]])


def _np_top_p_keep(logits: np.ndarray, p: float) -> np.ndarray:
    """NumPy reference: keep tokens with prob >= the prob where the sorted cumsum reaches p."""
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    order = np.sort(probs)[::-1]
    reached = np.nonzero(np.cumsum(order) >= p - 1e-7)[0]
    threshold = order[reached[0]] if len(reached) else order[-1]
    return probs >= threshold


def test_top_p_batched_p_ties_and_neg_inf():
    from axlearn.common.decoding import NEG_INF

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 11)).astype(np.float32)
    ps = np.array([1e-4, 0.5, 0.9], np.float32)
    out = np.asarray(top_p_logits(jnp.asarray(ps))(jnp.asarray(logits)))
    for row, p in zip(range(3), ps):
        keep = _np_top_p_keep(logits[row], float(p))
        np.testing.assert_array_equal(out[row] > NEG_INF, keep)
        np.testing.assert_array_equal(out[row][keep], logits[row][keep])
        np.testing.assert_array_equal(out[row][~keep], NEG_INF)
    # Equal logits are all kept for any p.
    flat = jnp.zeros((2, 64))
    np.testing.assert_array_equal(top_p_logits(0.1)(flat), flat)
    with pytest.raises(ValueError, match="1-D"):
        top_p_logits(jnp.ones((2, 2)))


def test_binary_searches():
    from axlearn.common.logit_modifiers import _float32_binary_search, _int32_binary_search

    info = np.iinfo(np.int32)
    want = np.array([5, -3, 0, info.min, info.max, info.min + 1], np.int32)
    got = _int32_binary_search(want.shape, predicate=lambda x: x > jnp.asarray(want))
    np.testing.assert_array_equal(got, want)
    always = _int32_binary_search((2,), predicate=lambda x: jnp.ones_like(x, bool))
    np.testing.assert_array_equal(always, [info.min] * 2)
    fwant = np.array([1.5, -1024.0, -1e30, 3e38, 4.3], np.float32)
    fgot = np.asarray(_float32_binary_search(fwant.shape, predicate=lambda x: x > fwant))
    np.testing.assert_array_equal(fgot.view(np.int32), fwant.view(np.int32))
    # At zero (XLA on CPU may flush subnormals), the answer compares equal to the target.
    zeros = jnp.array([0.0, -0.0])
    zgot = _float32_binary_search((2,), predicate=lambda x: x > zeros)
    assert bool(jnp.all(zgot == zeros)), zgot
    # Never True: the largest finite float32.
    never = _float32_binary_search((1,), predicate=lambda x: jnp.zeros_like(x, bool))
    np.testing.assert_array_equal(never, [np.finfo(np.float32).max])
