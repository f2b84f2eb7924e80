"""Tests axlearn/common/learner_updates.py against hand-computed gradients."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from axlearn.common.learner import _apply_updates, _split_gradients, _value_and_grad
from axlearn.common.module import new_output_collection
from axlearn.common.optimizer_base import OptParam
from axlearn.common.update_transformation import ForwardOutputs


def _forward(*, model_params, inputs):
    # loss = x * a + c * d**2: d(loss)/da = x, d/dc = d**2, d/dd = 2 c d.
    p = model_params
    loss = inputs * p["a"] + p["b"]["c"] * p["b"]["d"] ** 2
    collection = new_output_collection()
    collection.state_updates["seen"] = p["a"] * 2
    return ForwardOutputs(loss=loss, aux=dict(x=inputs), output_collection=collection)


def _opt(params):
    return {
        k: (_opt(v) if isinstance(v, dict) else OptParam(v, None, None)) for k, v in params.items()
    }


PARAMS = dict(a=jnp.float32(3.0), b=dict(c=jnp.float32(5.0), d=jnp.float32(7.0)))


def test_gradients_equal_the_hand_derivatives():
    updates = _value_and_grad(_forward, opt_params=_opt(PARAMS), inputs=jnp.float32(2.0))
    np.testing.assert_allclose(updates.delta_updates["a"], 2.0)
    np.testing.assert_allclose(updates.delta_updates["b"]["c"], 49.0)
    np.testing.assert_allclose(updates.delta_updates["b"]["d"], 70.0)
    np.testing.assert_allclose(updates.inplace_updates["seen"], 6.0)
    fp = updates.forward_pass["default"]
    np.testing.assert_allclose(fp.outputs.loss, 2 * 3 + 5 * 49)


def test_only_the_selected_parameters_get_gradients():
    should = dict(a=False, b=dict(c=True, d=False))
    updates = _value_and_grad(
        _forward, opt_params=_opt(PARAMS), inputs=jnp.float32(2.0), should_compute_gradients=should
    )
    assert updates.delta_updates["a"] is None and updates.delta_updates["b"]["d"] is None
    np.testing.assert_allclose(updates.delta_updates["b"]["c"], 49.0)
    fp = updates.forward_pass["default"]
    # The recorded pass re-runs to the same loss with its own (split) inputs.
    again = fp.forward_fn(model_params=fp.model_params, inputs=fp.inputs)
    np.testing.assert_allclose(again.loss, fp.outputs.loss)


def test_split_gradients_round_trip():
    should = dict(a=True, b=dict(c=False, d=True))
    forward, split = _split_gradients(_forward, should_compute_gradients=should)
    grad, nograd = split(PARAMS)
    assert grad["b"]["c"] is None and nograd["a"] is None and nograd["b"]["d"] is None
    out = forward(model_params=grad, inputs=(nograd, jnp.float32(1.0)))
    np.testing.assert_allclose(out.loss, 3 + 5 * 49)


def test_apply_updates_merges_in_place_and_skips_masked():
    base = dict(a=1, c=dict(g=6, h=7), d=optax.MaskedNode(), e=4)
    out = _apply_updates(base, dict(c=dict(h=8), d=3, e=optax.MaskedNode(), f=5))
    assert out is base
    assert out == dict(a=1, c=dict(g=6, h=8), d=optax.MaskedNode(), e=4, f=5)
    with pytest.raises(ValueError, match="cannot replace a subtree"):
        _apply_updates(dict(c=dict(g=1)), dict(c=2))
