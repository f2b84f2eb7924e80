"""Tests of axlearn.common.loss against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.loss import cross_entropy


@pytest.mark.slow
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


def _np_log_softmax(x):
    x = np.asarray(x, np.float64)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_cross_entropy_axlearn_keys_live_targets_and_default_mask():
    from axlearn.common.loss import cross_entropy as ce_fn

    logits = jax.random.normal(jax.random.PRNGKey(2), (4, 7)) * 2
    labels = jnp.asarray([1, 3, -1, 9])  # Two out-of-range labels.
    loss, aux = ce_fn(logits, labels)
    lsm = _np_log_softmax(logits)
    want = -(lsm[0, 1] + lsm[1, 3]) / 2  # Out-of-range labels are not live by default.
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    assert set(aux) >= {"total_loss", "cross_entropy_loss", "per_target_loss", "accuracy"}
    np.testing.assert_allclose(aux["total_loss"], loss)
    pred = np.argmax(np.asarray(logits), -1)
    np.testing.assert_allclose(aux["accuracy"], ((pred[:2] == [1, 3]).sum()) / 2)
    # Float live_targets weight the positions.
    w = jnp.asarray([2.0, 1.0, 0.0, 0.0])
    loss, _ = ce_fn(logits, labels, live_targets=w)
    np.testing.assert_allclose(loss, -(2 * lsm[0, 1] + lsm[1, 3]) / 3, rtol=1e-5)
    with pytest.raises(ValueError, match="at most one of mask and live_targets"):
        ce_fn(logits, labels, live_targets=w, mask=w)
    with pytest.raises(ValueError, match="z_loss_scale should not be negative"):
        ce_fn(logits, labels, z_loss_scale=-1.0)


def test_cross_entropy_label_smoothing_and_soft_targets():
    from axlearn.common.loss import cross_entropy as ce_fn

    logits = jax.random.normal(jax.random.PRNGKey(3), (3, 5))
    labels = jnp.asarray([0, 4, 2])
    lsm = _np_log_softmax(logits)
    s = 0.1
    targets = np.eye(5)[np.asarray(labels)] * (1 - s) + s / 5
    loss, _ = ce_fn(logits, labels, label_smoothing=s)
    np.testing.assert_allclose(loss, -(targets * lsm).sum(-1).mean(), rtol=1e-5)
    soft = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(4), (3, 5)))
    loss, _ = ce_fn(logits, labels, soft_target_labels=soft)
    np.testing.assert_allclose(loss, -(np.asarray(soft) * lsm).sum(-1).mean(), rtol=1e-5)
    with pytest.raises(ValueError, match="Label smoothing should be set to 0"):
        ce_fn(logits, labels, soft_target_labels=soft, label_smoothing=0.1)
    with pytest.raises(ValueError, match=r"label_smoothing should be in the range \[0, 1\]"):
        ce_fn(logits, labels, label_smoothing=1.5)
    # Gradients through smoothing match NumPy's softmax - targets.
    g = jax.grad(lambda x: ce_fn(x, labels, label_smoothing=s)[0])(logits)
    np.testing.assert_allclose(g, (np.exp(lsm) - targets) / 3, rtol=1e-4, atol=1e-6)


def test_binary_and_regression_losses():
    from axlearn.common import loss as L

    x = jnp.asarray([-30.0, -1.0, 0.5, 40.0])
    t = jnp.asarray([0, 1, 1, 0])
    xn, tn = np.asarray(x, np.float64), np.asarray(t)
    # -log(sigmoid(x)) = logaddexp(0, -x); -log(1 - sigmoid(x)) = logaddexp(0, x).
    ref = tn * np.logaddexp(0, -xn) + (1 - tn) * np.logaddexp(0, xn)
    np.testing.assert_allclose(L.sigmoid_cross_entropy_with_logits(x, t), ref, rtol=1e-5)
    loss, aux = L.binary_cross_entropy(x, target_labels=t, live_targets=jnp.asarray([1, 1, 1, 0]))
    np.testing.assert_allclose(loss, ref[:3].mean(), rtol=1e-5)
    np.testing.assert_allclose(aux["per_target_loss"], ref, rtol=1e-5)
    preds = jnp.asarray([[1.0, 2.0], [3.0, 5.0]])
    targets = jnp.zeros((2, 2))
    mse = L.mean_squared_error(preds, targets, sample_weight=jnp.asarray([1.0, 0.0]))
    assert float(mse.mean) == pytest.approx(2.5) and float(mse.weight) == 2.0
    l1 = L.l1_loss(preds, targets)
    assert float(l1.mean) == pytest.approx(11 / 4) and float(l1.weight) == 4.0
    per = jnp.asarray([1.0, 2.0, 3.0])
    assert float(L._reduce_loss(loss=per, reduction=L.ReductionMethod.SUM, sample_weight=None)) == 6
    got = L._reduce_loss(
        loss=per, reduction=L.ReductionMethod.MEAN, sample_weight=jnp.asarray([1.0, 1.0, 0.0])
    )
    assert float(got) == pytest.approx(1.5)
    # A [rows, 1] weight counts once per row: (1*(1+3+10) + 5*(2+3+0)) / (1 + 5).
    rows = jnp.asarray([[1.0, 3.0, 10.0], [2.0, 3.0, 0.0]])
    got = L._reduce_loss(
        loss=rows, reduction=L.ReductionMethod.MEAN, sample_weight=jnp.asarray([[1.0], [5.0]])
    )
    assert float(got) == pytest.approx(39 / 6)


def test_contrastive_and_hinge_losses():
    from axlearn.common import loss as L

    x = jax.random.normal(jax.random.PRNGKey(5), (3, 4))
    y = jax.random.normal(jax.random.PRNGKey(6), (3, 4))
    logits = L.contrastive_logits(x, y)
    np.testing.assert_allclose(logits, np.asarray(x) @ np.asarray(y).T, rtol=1e-5)
    lsm = _np_log_softmax(np.asarray(logits) / 0.5)
    want = -np.mean(np.diag(lsm))
    got = L.asymmetric_contrastive_loss_from_logits(logits, temperature=0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # A padded key is excluded from the softmax.
    pad = jnp.asarray([0.0, 0.0, 1.0])
    lsm2 = _np_log_softmax(np.asarray(logits)[:2, :2])
    got = L.asymmetric_contrastive_loss_from_logits(logits[:2], key_paddings=pad)
    np.testing.assert_allclose(got, -np.mean(np.diag(lsm2)), rtol=1e-5)
    sym = L.symmetric_contrastive_loss_from_logits(logits, logits.T)
    lsm_t = _np_log_softmax(np.asarray(logits).T)
    np.testing.assert_allclose(
        sym, (-np.mean(np.diag(_np_log_softmax(logits))) - np.mean(np.diag(lsm_t))) / 2, rtol=1e-5
    )
    hinge = L.categorical_hinge_loss(jnp.asarray([[2.0, 0.5, 1.8]]), jnp.asarray([[1.0, 0, 0]]))
    np.testing.assert_allclose(hinge, [0.8], rtol=1e-6)


def test_focal_huber_kl_and_cosine_losses():
    from axlearn.common import loss as L

    logits = jnp.asarray([[2.0, -1.0], [0.5, 0.0]])
    targets = jnp.asarray([[1.0, 0.0], [0.0, 1.0]])
    x, t = np.asarray(logits, np.float64), np.asarray(targets)
    p = 1 / (1 + np.exp(-x))
    p_t = np.where(t == 1, p, 1 - p)
    bce = -np.log(p_t)
    want = np.sum(np.where(t == 1, 0.25, 0.75) * (1 - p_t) ** 2.0 * bce)
    np.testing.assert_allclose(L.focal_loss(logits, targets, gamma=2.0), want, rtol=1e-5)
    pred, targ = jnp.asarray([0.0, 0.5, 3.0]), jnp.zeros(3)
    np.testing.assert_allclose(L.huber_loss(predictions=pred, targets=targ), [0, 0.125, 2.5])
    got = L.huber_loss(predictions=pred, targets=targ, reduction=L.ReductionMethod.MEAN)
    np.testing.assert_allclose(got, 2.625 / 3, rtol=1e-6)
    log_p = jax.nn.log_softmax(jnp.asarray([[1.0, 2.0, 0.0]]))
    q = jnp.asarray([[0.5, 0.5, 0.0]])
    kl, aux = L.kl_divergence(log_p, q)
    want = sum(0.5 * (np.log(0.5) - float(log_p[0, i])) for i in range(2))
    np.testing.assert_allclose(kl, want, rtol=1e-5)
    kl_log, _ = L.kl_divergence(
        log_p, jnp.log(jnp.asarray([[0.5, 0.5, 1e-30]])), is_log_targets=True
    )
    np.testing.assert_allclose(kl_log, want, rtol=1e-4)
    a, b = jnp.asarray([[1.0, 0.0], [0.0, 2.0]]), jnp.asarray([[1.0, 1.0], [0.0, 1.0]])
    loss, aux = L.negative_cosine_similarity_loss(a, b)
    np.testing.assert_allclose(aux["cosine_similarity"], [np.sqrt(0.5), 1.0], rtol=1e-5)
    np.testing.assert_allclose(loss, -(np.sqrt(0.5) + 1) / 2, rtol=1e-5)


def test_giou_koleo_flops_margin_and_ranking_losses():
    from axlearn.common import loss as L

    # Identical boxes: 0; disjoint unit boxes 2 apart in a 1x3 hull: 1 - (0 - 1/3).
    boxes = jnp.asarray([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    other = jnp.asarray([[0.0, 0.0, 1.0, 1.0], [0.0, 2.0, 1.0, 3.0]])
    np.testing.assert_allclose(
        L.giou_loss(predictions=boxes, targets=other), [0.0, 4 / 3], atol=1e-5
    )
    emb = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    # Brute-force nearest-neighbour distances: sqrt(2) for each point.
    np.testing.assert_allclose(L.koleo_loss(emb), -np.log(np.sqrt(2)), rtol=1e-4)
    e = jnp.asarray([[1.0, -2.0, 0.0], [3.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    loss, sparse = L.flops_loss(embeddings=e, paddings=jnp.asarray([0, 0, 1]))
    np.testing.assert_allclose(loss, 2.0**2 + 1.0**2, rtol=1e-6)
    np.testing.assert_allclose(sparse, (1 + 2) / 2)
    cos = jnp.asarray([[0.9, 0.1], [0.2, 0.8]])
    loss, aux = L.large_margin_cosine_loss(cos, labels=jnp.asarray([0, 1]), alpha=4.0, margin=0.2)
    scaled = 4.0 * (np.asarray(cos) - 0.2 * np.eye(2))
    want = -np.mean(np.diag(_np_log_softmax(scaled)))
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    assert float(aux["accuracy"]) == 1.0
    with pytest.raises(ValueError, match="Neither labels nor soft_labels"):
        L.large_margin_cosine_loss(cos)
    logits = jnp.asarray([[2.0, 1.0, 0.0]])
    ranks = jnp.asarray([[1, 2, 0]])  # One ranked pair: doc 0 ahead of doc 1.
    loss, n = L.ranking_pairwise_loss(logits=logits, ranks=ranks, loss_scale=jnp.ones(1))
    assert float(n) == 1.0
    np.testing.assert_allclose(loss, np.log1p(np.exp(-1.0)), rtol=1e-5)


def _np_linear_resize_matrix(n, m):
    """[m, n] weights of a half-pixel-centred linear resize from n to m samples, edges clamped."""
    w = np.zeros((m, n))
    for o in range(m):
        x = min(max((o + 0.5) * n / m - 0.5, 0.0), n - 1.0)
        lo = int(np.floor(x))
        hi = min(lo + 1, n - 1)
        frac = x - lo
        w[o, lo] += 1 - frac
        w[o, hi] += frac
    return w


def test_bilinear_mean_squared_error_matches_numpy():
    from axlearn.common.loss import bilinear_mean_squared_error, mean_squared_error

    preds = jax.random.normal(jax.random.PRNGKey(3), (2, 8, 4))
    targets = jax.random.normal(jax.random.PRNGKey(4), (2, 8, 4))
    weight = jnp.asarray([1.0, 3.0])
    for shape in [(2, 4, 2), (2, 2, 8), (2, 16, 4)]:
        got = bilinear_mean_squared_error(preds, targets, shape=shape, sample_weight=weight)
        diff = np.asarray(preds, np.float64) - np.asarray(targets, np.float64)
        for axis, (n, m) in enumerate(zip(diff.shape, shape)):
            resized = np.tensordot(_np_linear_resize_matrix(n, m), diff, (1, axis))
            diff = np.moveaxis(resized, 0, axis)
        w = np.broadcast_to(np.asarray(weight)[:, None, None], shape)
        np.testing.assert_allclose(got.mean, (w * diff**2).sum() / w.sum(), rtol=1e-5)
        np.testing.assert_allclose(got.weight, w.sum(), rtol=1e-6)
    # Downsampling by 2 averages neighbouring pairs (no antialiasing beyond that).
    got = bilinear_mean_squared_error(preds, targets, shape=(2, 4, 2))
    d = np.asarray(preds - targets, np.float64).reshape(2, 4, 2, 2, 2).mean(axis=(2, 4))
    np.testing.assert_allclose(got.mean, np.mean(d**2), rtol=1e-5)
    # The identity shape is plain mean squared error.
    same = bilinear_mean_squared_error(preds, targets, shape=preds.shape)
    np.testing.assert_allclose(same.mean, mean_squared_error(preds, targets).mean, rtol=1e-6)
    with pytest.raises(NotImplementedError, match="whole multiples"):
        bilinear_mean_squared_error(preds, targets, shape=(2, 3, 4))
    with pytest.raises(ValueError, match="one entry per dimension"):
        bilinear_mean_squared_error(preds, targets, shape=(4, 2))
