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
    first = top_k_logits(1, break_ties="lowest-token-id")(ties)
    np.testing.assert_array_equal(_kept(first), [[0, 1, 0, 0]])
    with pytest.raises(ValueError, match="temperature"):
        scale_by(0.0)
    with pytest.raises(ValueError, match="top_k"):
        top_k_logits(0)
    with pytest.raises(NotImplementedError):
        top_k_logits(2, break_ties="lowest-token-id")
    with pytest.raises(ValueError, match="top_p"):
        top_p_logits(1.5)


def test_chain_accepts_configs():
    logits = jnp.array([[1.0, 2.0, 4.0]])
    fn = chain(scale_by(2.0), config_for_function(top_k_logits).set(k=1))
    out = np.asarray(fn(logits))
    np.testing.assert_allclose(out[0, 2], 2.0)
    np.testing.assert_array_equal(_kept(out), [[0, 0, 1]])
