"""Tests of axlearn/common/normalize.py (l2_normalize) against NumPy."""

import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.normalize import l2_normalize


@pytest.mark.parametrize("shape,axis", [((2, 5), -1), ((3, 4, 2), 1), ((3, 4), 0)])
def test_l2_normalize_matches_numpy(shape, axis):
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    expected = x / np.sqrt(np.sum(x * x, axis=axis, keepdims=True) + 1e-8)
    out = l2_normalize(jnp.asarray(x), axis=axis)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(out), axis=axis), 1.0, rtol=1e-5)
    assert out.shape == x.shape and out.dtype == jnp.float32


def test_l2_normalize_eps_inside_sqrt():
    # A zero row stays zero; a tiny row is scaled by 1/sqrt(|x|^2 + eps), not to unit norm.
    x = jnp.asarray([[0.0, 0.0], [3e-3, 4e-3]])
    out = l2_normalize(x, eps=1e-4)
    np.testing.assert_allclose(out[0], [0.0, 0.0])
    np.testing.assert_allclose(out[1], np.array([3e-3, 4e-3]) / np.sqrt(25e-6 + 1e-4), rtol=1e-5)
