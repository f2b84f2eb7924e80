"""Tests axlearn/common/utils_numpy.py (utils.as_numpy_array)."""

import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from axlearn.common.utils import as_numpy_array


def test_as_numpy_array_leaves_and_structure():
    out = as_numpy_array(
        {"n": 3, "np": np.arange(2.0), "jax": jnp.ones([2], jnp.bfloat16), "tf": [tf.eye(2)]}
    )
    assert isinstance(out["n"], np.ndarray) and out["n"].shape == () and out["n"] == 3
    assert out["np"].dtype == np.float64
    assert out["jax"].dtype == jnp.bfloat16 and isinstance(out["jax"], np.ndarray)
    np.testing.assert_array_equal(out["tf"][0], np.eye(2, dtype=np.float32))


def test_as_numpy_array_rejects_unknown():
    with pytest.raises(NotImplementedError, match="cannot convert a object"):
        as_numpy_array(object())
