"""Tests of axlearn.common.loss against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common.loss import cross_entropy


def test_cross_entropy_matches_numpy():
    logits = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 11)) * 3
    labels = jax.random.randint(jax.random.PRNGKey(1), (3, 5), 0, 11)
    labels = labels.at[0, 0].set(-1)
    mask = labels >= 0
    loss, aux = cross_entropy(logits, labels, mask=mask, z_loss_scale=0.01)
    x = np.asarray(logits, np.float64)
    log_z = np.log(np.exp(x).sum(-1))
    ce = log_z - np.take_along_axis(x, np.maximum(np.asarray(labels), 0)[..., None], -1)[..., 0]
    m = np.asarray(mask)
    np.testing.assert_allclose(aux["cross_entropy"], (ce * m).sum() / m.sum(), rtol=1e-5)
    np.testing.assert_allclose(aux["z_loss"], (0.01 * log_z**2 * m).sum() / m.sum(), rtol=1e-5)
    np.testing.assert_allclose(loss, aux["cross_entropy"] + aux["z_loss"], rtol=1e-6)
    assert float(aux["num_targets"]) == 14
    # No targets at all: loss 0, not NaN.
    loss, _ = cross_entropy(logits, labels, mask=jnp.zeros_like(mask))
    assert float(loss) == 0.0
