"""Tests of axlearn/common/quantized_dot_general/activation_clipping.py."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common.module import functional as F
from axlearn.common.quantized_dot_general.activation_clipping import (
    DummyActivationClippingLayer,
    HardActivationClippingLayer,
    TanhActivationClippingLayer,
)

X = np.array([[-3.0, -0.5, 0.0, 0.25, 2.0, 10.0]], np.float32)


def _run(cls, **kwargs):
    layer = cls.default_config().set(name="clip", **kwargs).instantiate(parent=None)
    return F(layer, is_training=False, prng_key=None, state={}, inputs=(jnp.asarray(X),))


def test_hard_clipping():
    out, _ = _run(HardActivationClippingLayer, clipping_max_abs=1.0)
    np.testing.assert_array_equal(np.asarray(out), np.clip(X, -1, 1))


def test_tanh_clipping():
    out, _ = _run(TanhActivationClippingLayer, clipping_max_abs=2.0)
    np.testing.assert_allclose(np.asarray(out), 2.0 * np.tanh(X / 2.0), rtol=1e-6)


def test_dummy_clipping_summary():
    out, coll = _run(DummyActivationClippingLayer, clipping_max_abs=1.0, clipping_summary=True)
    np.testing.assert_array_equal(np.asarray(out), X)
    summary = coll.summaries["clipped_activation"]
    assert float(summary.mean) == pytest.approx(3 / 6)
    assert float(summary.weight) == 6


@pytest.mark.parametrize("bound", [0.0, -1.0])
def test_bad_bound(bound):
    with pytest.raises(ValueError, match=r"clip\.clipping_max_abs must be a positive number"):
        jax.jit(lambda: _run(HardActivationClippingLayer, clipping_max_abs=bound))()
