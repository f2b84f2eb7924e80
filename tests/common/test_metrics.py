"""Tests axlearn/common/metrics.py against hand-computed weighted means."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.metrics import MetricAccumulator, WeightedScalar


def test_weighted_scalar_add():
    c = WeightedScalar(2.0, 1.0) + WeightedScalar(5.0, 2.0)
    assert float(c.mean) == pytest.approx(4.0) and float(c.weight) == 3.0
    zero = WeightedScalar(7.0, 0.0) + WeightedScalar(3.0, 0.0)
    assert float(zero.mean) == 0.0 and float(zero.weight) == 0.0
    one_sided = WeightedScalar(7.0, 0.0) + WeightedScalar(3.0, 2.0)
    assert float(one_sided.mean) == 3.0
    with pytest.raises(TypeError):
        WeightedScalar(1.0, 1.0).accumulate(1.0)


def test_weighted_scalar_is_pytree_and_jittable():
    @jax.jit
    def f(x):
        return WeightedScalar(jnp.mean(x), jnp.float32(x.size))

    out = f(jnp.arange(4.0))
    assert isinstance(out, WeightedScalar)
    assert float(out.mean) == 1.5 and float(out.weight) == 4.0
    assert len(jax.tree.leaves(out)) == 2
    with pytest.raises(ValueError, match="scalar"):
        WeightedScalar(jnp.ones(3), 1.0).validate()


def test_weighted_scalar_zero_weight_grad_is_finite():
    def f(m):
        return (WeightedScalar(m, 0.0) + WeightedScalar(m, 0.0)).mean

    assert np.isfinite(jax.grad(f)(1.0))


def test_metric_accumulator_matches_full_set_mean():
    rng = np.random.default_rng(0)
    losses = [rng.normal(size=n) for n in (5, 3, 8, 1)]  # Batches with unequal token counts.
    acc = MetricAccumulator.default_config().instantiate()
    for batch in losses:
        acc.update(
            dict(
                loss=WeightedScalar(jnp.float32(batch.mean()), jnp.float32(batch.size)),
                nested=dict(acc=WeightedScalar(jnp.float32((batch > 0).mean()), batch.size)),
                plain=jnp.float32(batch.sum()),  # Not a summary: dropped.
            )
        )
    every = np.concatenate(losses)
    got = acc.summaries()
    assert float(got["loss"].mean) == pytest.approx(every.mean(), rel=1e-6)
    assert float(got["loss"].weight) == every.size
    assert float(got["nested"]["acc"].mean) == pytest.approx((every > 0).mean(), rel=1e-6)
    assert got.get("plain") is None


def test_metric_accumulator_structure_change_is_an_error():
    acc = MetricAccumulator.default_config().instantiate()
    assert acc.summaries() == {}
    acc.update(dict(a=WeightedScalar(1.0, 1.0)))
    with pytest.raises(ValueError, match="structure changed"):
        acc.update(dict(b=WeightedScalar(1.0, 1.0)))


def test_weighted_summary_and_reducers():
    from axlearn.common.metrics import (
        MaxSummary,
        MinSummary,
        SumSummary,
        WeightedScalar,
        WeightedSummary,
    )
    from axlearn.common.summary import Summary

    a = WeightedSummary(jnp.asarray([1.0, 3.0]), jnp.asarray(1.0))
    b = WeightedSummary(jnp.asarray([4.0, 0.0]), jnp.asarray(2.0))
    c = a.accumulate(b)
    np.testing.assert_allclose(c.mean, [3.0, 1.0])
    assert float(c.weight) == 3.0 and isinstance(c, Summary)
    with pytest.raises(TypeError, match="Expected WeightedSummary"):
        a.accumulate(MinSummary(jnp.zeros(2)))
    # WeightedScalar is a WeightedSummary (and stays a WeightedScalar when added).
    s = WeightedScalar(2.0, 1.0) + WeightedScalar(5.0, 2.0)
    assert isinstance(s, WeightedScalar) and isinstance(s, WeightedSummary)
    x, y = jnp.asarray([1.0, 5.0]), jnp.asarray([3.0, 2.0])
    np.testing.assert_array_equal(MinSummary(x).accumulate(MinSummary(y)).value(), [1.0, 2.0])
    np.testing.assert_array_equal(MaxSummary(x).accumulate(MaxSummary(y)).value(), [3.0, 5.0])
    np.testing.assert_array_equal(SumSummary(x).accumulate(SumSummary(y)).value(), [4.0, 7.0])
    with pytest.raises(ValueError, match="Shape mismatch"):
        SumSummary(x).accumulate(SumSummary(jnp.zeros(3)))
    with pytest.raises(ValueError, match="must be a Tensor"):
        MinSummary(3).validate()
