"""Tests of `module.scan_in_context`'s remat_kwargs and merge_summaries."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.metrics import WeightedSummary
from axlearn.common.module import (
    InvocationContext,
    Module,
    current_context,
    new_output_collection,
    scan_in_context,
    set_current_context,
)


def _root_context():
    module = Module.default_config().set(name="root").instantiate(parent=None)
    return InvocationContext(
        name="root",
        parent=None,
        module=module,
        state={},
        is_training=True,
        prng_key=jax.random.PRNGKey(0),
        output_collection=new_output_collection(),
    )


def _body(carry, x):
    ctx = current_context()
    ctx.add_summary("weighted", WeightedSummary(jnp.mean(x), x.size))
    ctx.add_summary("total", jnp.sum(x))
    return carry + jnp.sum(x * x), x * 2


XS = jnp.array([[1.0, 2.0], [3.0, 3.0], [0.0, 4.0]])


@pytest.mark.parametrize(
    "remat_kwargs", [None, dict(policy=jax.checkpoint_policies.nothing_saveable)]
)
def test_scan_remat_gives_same_values_and_gradients(remat_kwargs):
    def loss(xs):
        with set_current_context(_root_context(), require_parent=False):
            carry, ys = scan_in_context(
                _body, carry=jnp.zeros(()), xs=dict(xs=xs), remat_kwargs=remat_kwargs
            )
        return carry + jnp.sum(ys)

    np.testing.assert_allclose(loss(XS), np.sum(np.square(XS)) + 2 * np.sum(XS))
    np.testing.assert_allclose(jax.grad(loss)(XS), 2 * np.asarray(XS) + 2)


def test_scan_remat_refuses_prevent_cse():
    with set_current_context(_root_context(), require_parent=False):
        with pytest.raises(ValueError, match="prevent_cse=True"):
            scan_in_context(
                _body, carry=jnp.zeros(()), xs=dict(xs=XS), remat_kwargs=dict(prevent_cse=True)
            )


@pytest.mark.parametrize("merge", [False, True])
def test_scan_merge_summaries(merge):
    ctx = _root_context()
    with set_current_context(ctx, require_parent=False):
        scan_in_context(
            _body, carry=jnp.zeros(()), xs=dict(xs=XS), child_name_prefix="s", merge_summaries=merge
        )
    summaries = ctx.output_collection.summaries
    if not merge:
        assert sorted(summaries) == ["s", "s0", "s1", "s2"]
        np.testing.assert_allclose(summaries["s1"]["total"], 6.0)
        return
    # Weighted mean of the row means (1.5, 3, 2) with weights 2 each; totals summed.
    np.testing.assert_allclose(summaries["s"]["weighted"].mean, 13 / 6, rtol=1e-6)
    np.testing.assert_allclose(summaries["s"]["weighted"].weight, 6)
    np.testing.assert_allclose(summaries["s"]["total"], 13.0)
    assert "s0" not in summaries
