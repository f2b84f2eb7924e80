"""Tests of axlearn.common.loss_contrastive against hand-written NumPy references."""

import jax
import numpy as np
import pytest

from axlearn.common import loss as loss_lib
from axlearn.common.loss_contrastive import (
    asymmetric_contrastive_loss_from_features,
    symmetric_contrastive_loss_from_features,
)


def _np_asymmetric(queries, keys, key_paddings, temperature, soft_labels=None):
    """Per-query softmax cross entropy over the non-padded keys, key i the target of query i."""
    q = np.asarray(queries, np.float64)
    k = np.asarray(keys, np.float64)
    valid = np.asarray(key_paddings) == 0
    losses = []
    for i in range(q.shape[0]):
        logits = np.array([q[i] @ k[j] for j in range(k.shape[0])]) / temperature
        v = logits[valid]
        log_z = np.log(np.sum(np.exp(v - v.max()))) + v.max()
        log_p = logits - log_z
        if soft_labels is None:
            losses.append(-log_p[i])
        else:
            s = np.asarray(soft_labels, np.float64)[i] * valid
            losses.append(-np.sum(s[valid] * log_p[valid]))
    return np.mean(losses)


def _features(seed, *shapes):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
    return [np.asarray(jax.random.normal(k, s)) for k, s in zip(keys, shapes)]


def test_asymmetric_from_features_without_negatives():
    q, p = _features(0, (4, 6), (4, 6))
    got = asymmetric_contrastive_loss_from_features(q, p, temperature=0.5)
    np.testing.assert_allclose(got, _np_asymmetric(q, p, np.zeros(4), 0.5), rtol=1e-5)


def test_asymmetric_from_features_with_padded_negatives_and_soft_labels():
    q, p, n = _features(1, (3, 5), (3, 5), (4, 5))
    pad = np.array([0, 1, 0, 1])
    keys = np.concatenate([p, n])
    key_pad = np.concatenate([np.zeros(3), pad])
    got = asymmetric_contrastive_loss_from_features(
        q, p, negative_keys=n, negative_key_paddings=pad, temperature=0.7
    )
    want = _np_asymmetric(q, keys, key_pad, 0.7)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # Padded negatives do not count: dropping them gives the same loss.
    got_dropped = asymmetric_contrastive_loss_from_features(
        q, p, negative_keys=n[pad == 0], temperature=0.7
    )
    np.testing.assert_allclose(got, got_dropped, rtol=1e-5)
    # Unpadded negatives raise the loss relative to no negatives.
    assert float(got) > float(asymmetric_contrastive_loss_from_features(q, p, temperature=0.7))

    soft = np.asarray(jax.random.uniform(jax.random.PRNGKey(9), (3, 7)))
    got = asymmetric_contrastive_loss_from_features(
        q, p, negative_keys=n, negative_key_paddings=pad, soft_labels=soft
    )
    np.testing.assert_allclose(got, _np_asymmetric(q, keys, key_pad, 1.0, soft), rtol=1e-5)


def test_symmetric_from_features_matches_two_directions():
    x, y, xn, yn = _features(2, (3, 4), (3, 4), (2, 4), (5, 4))
    xn_pad = np.array([1, 0])
    yn_pad = np.array([0, 0, 1, 0, 1])
    got = symmetric_contrastive_loss_from_features(
        x,
        y,
        x_negatives=xn,
        y_negatives=yn,
        x_negative_paddings=xn_pad,
        y_negative_paddings=yn_pad,
        temperature=0.3,
    )
    x_to_y = _np_asymmetric(x, np.concatenate([y, yn]), np.concatenate([np.zeros(3), yn_pad]), 0.3)
    y_to_x = _np_asymmetric(y, np.concatenate([x, xn]), np.concatenate([np.zeros(3), xn_pad]), 0.3)
    np.testing.assert_allclose(got, (x_to_y + y_to_x) / 2, rtol=1e-5)

    # Without negatives it is the CLIP loss: the mean of row-wise and column-wise cross entropy.
    got = symmetric_contrastive_loss_from_features(x, y)
    s = np.asarray(x, np.float64) @ np.asarray(y, np.float64).T
    rows = np.mean(np.log(np.exp(s).sum(1)) - np.diag(s))
    cols = np.mean(np.log(np.exp(s).sum(0)) - np.diag(s))
    np.testing.assert_allclose(got, (rows + cols) / 2, rtol=1e-5)


def test_symmetric_from_features_soft_labels():
    x, y, yn = _features(3, (2, 3), (2, 3), (2, 3))
    y_soft = np.asarray(jax.random.uniform(jax.random.PRNGKey(4), (2, 4)))
    x_soft = np.asarray(jax.random.uniform(jax.random.PRNGKey(5), (2, 2)))
    got = symmetric_contrastive_loss_from_features(
        x, y, y_negatives=yn, y_as_key_soft_labels=y_soft, x_as_key_soft_labels=x_soft
    )
    want = (
        _np_asymmetric(x, np.concatenate([y, yn]), np.zeros(4), 1.0, y_soft)
        + _np_asymmetric(y, x, np.zeros(2), 1.0, x_soft)
    ) / 2
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_reexported_from_loss_and_jittable():
    assert loss_lib.asymmetric_contrastive_loss_from_features is (
        asymmetric_contrastive_loss_from_features
    )
    assert loss_lib.symmetric_contrastive_loss_from_features is (
        symmetric_contrastive_loss_from_features
    )
    x, y = _features(6, (3, 4), (3, 4))
    eager = symmetric_contrastive_loss_from_features(x, y, temperature=0.2)
    jitted = jax.jit(symmetric_contrastive_loss_from_features)(x, y, temperature=0.2)
    np.testing.assert_allclose(eager, jitted, rtol=1e-6)


def test_bad_shapes_raise():
    x, y, n = _features(7, (3, 4), (2, 4), (2, 5))
    with pytest.raises(ValueError, match="same number of rows"):
        asymmetric_contrastive_loss_from_features(x, y)
    with pytest.raises(ValueError, match="same number of rows"):
        symmetric_contrastive_loss_from_features(x, y)
    with pytest.raises(ValueError, match="negative_keys has feature size 5"):
        asymmetric_contrastive_loss_from_features(x, x, negative_keys=n)
    with pytest.raises(ValueError, match="must be 2-D"):
        asymmetric_contrastive_loss_from_features(x[0], x[0])
    with pytest.raises(ValueError, match="paddings are given without y_negatives"):
        symmetric_contrastive_loss_from_features(x, x, y_negative_paddings=np.zeros(2))
    with pytest.raises(ValueError, match=r"paddings must have shape \(2,\)"):
        asymmetric_contrastive_loss_from_features(
            x, x, negative_keys=n[:, :4], negative_key_paddings=np.zeros(3)
        )
