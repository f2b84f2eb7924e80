"""Tests of utils.safe_not and utils.sequence_mask against NumPy."""

import numpy as np
from jax import numpy as jnp

from axlearn.common import utils


def test_safe_not():
    for mask in ([True, False], [3, 0], [0.5, 0.0]):
        out = utils.safe_not(jnp.array(mask))
        assert out.dtype == jnp.bool_
        np.testing.assert_array_equal(out, np.logical_not(np.array(mask)))


def test_sequence_mask():
    lengths = np.array([[0, 2], [5, 3]])
    out = utils.sequence_mask(lengths=jnp.array(lengths), max_len=4, dtype=jnp.float32)
    ref = (np.arange(4) < lengths[..., None]).astype(np.float32)
    assert out.shape == (2, 2, 4) and out.dtype == jnp.float32
    np.testing.assert_array_equal(out, ref)
    assert utils.sequence_mask(lengths=jnp.array([1]), max_len=2).dtype == jnp.bool_
