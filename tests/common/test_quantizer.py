"""Tests axlearn/common/quantizer.py against a NumPy nearest-codebook reference."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common import quantizer as q
from axlearn.common.module import functional as F
from axlearn.common.param_init import ConstantInitializer, DefaultInitializer


def _np_nearest(inputs, codebook, metric):
    """Brute force: for each [..., g] vector, the codebook entry index of g by the metric."""
    x = np.asarray(inputs, np.float64)  # [..., G, D]
    c = np.asarray(codebook, np.float64)  # [V, G, D]
    if metric == "l2":
        scores = ((x[..., None, :, :] - c) ** 2).sum(-1)  # [..., V, G]
        ids = scores.argmin(-2)
    else:
        ids = (x[..., None, :, :] * c).sum(-1).argmax(-2)
    groups = np.arange(c.shape[1])
    return ids, c[ids, groups]


def _np_stats(ids, paddings, vocab):
    """NumPy coverage, perplexity and entropy of the codes of the valid frames."""
    valid = ~np.asarray(paddings, bool)
    codes = np.asarray(ids)[valid]  # [frames, G]
    pplx = []
    coverage = []
    for g in range(codes.shape[-1]):
        counts = np.bincount(codes[:, g], minlength=vocab)
        p = counts / max(len(codes), 1)
        nz = p[p > 0]
        pplx.append(np.exp(-(nz * np.log(nz)).sum()))
        coverage.append((counts > 0).mean())
    return np.mean(coverage), np.mean(pplx), np.log(np.mean(pplx))


@pytest.mark.parametrize("metric", ["l2", "dot"])
@pytest.mark.parametrize("batch_shape", [(5,), (2, 3), (2, 2, 3)])
def test_nearest_neighbor_matches_brute_force(metric, batch_shape):
    rng = np.random.default_rng(len(batch_shape))
    codebook = rng.standard_normal((7, 3, 4)).astype(np.float32)
    inputs = rng.standard_normal(batch_shape + (3, 4)).astype(np.float32)
    enum = q.SimilarityMetric.L2_DISTANCE if metric == "l2" else q.SimilarityMetric.DOT_PRODUCT
    out = q.quantize_by_nearest_neighbor(inputs, codebook=codebook, metric=enum)
    want_ids, want_vecs = _np_nearest(inputs, codebook, metric)
    np.testing.assert_array_equal(out.ids, want_ids)
    assert out.ids.dtype == jnp.int32
    np.testing.assert_allclose(out.quantized_vectors, want_vecs, rtol=1e-6)


def test_nearest_neighbor_rejects_bad_shapes_and_metrics():
    with pytest.raises(ValueError, match="Last two dimensions"):
        q.quantize_by_nearest_neighbor(
            jnp.zeros((2, 3, 5)),
            codebook=jnp.zeros((4, 3, 4)),
            metric=q.SimilarityMetric.L2_DISTANCE,
        )
    with pytest.raises(ValueError, match="metric"):
        q.quantize_by_nearest_neighbor(
            jnp.zeros((2, 3, 4)), codebook=jnp.zeros((4, 3, 4)), metric=7
        )


def test_code_metrics_match_numpy():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 6, size=(3, 5, 2))
    paddings = np.arange(5)[None, :] >= np.array([5, 2, 4])[:, None]
    onehots = jax.nn.one_hot(ids, 6)
    coverage, pplx, entropy = _np_stats(ids, paddings, 6)
    np.testing.assert_allclose(q.compute_code_coverage(onehots, paddings), coverage, rtol=1e-6)
    got_pplx, got_entropy = q.compute_code_pplx(onehots, paddings)
    np.testing.assert_allclose(got_pplx, pplx, rtol=1e-5)
    np.testing.assert_allclose(got_entropy, entropy, rtol=1e-5)
    hist = q.compute_code_histogram(onehots, paddings)
    want = np.stack([np.bincount(ids[~paddings][:, g], minlength=6) for g in range(2)])
    np.testing.assert_array_equal(hist, want)


def _paddings():
    return jnp.arange(5)[None, :] >= jnp.array([5, 3])[:, None]  # [2, 5]


def test_kmeans_forward_losses_and_gradients_match_numpy():
    G, D, V, beta = 2, 3, 5, 0.25
    layer = (
        q.KmeansVectorQuantizer.default_config()
        .set(name="vq", codebook_dim=D, codebook_size=V, num_codebooks=G, beta=beta)
        .instantiate(parent=None)
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, G * D))
    paddings = _paddings()

    def run(p, inputs):
        out, col = F(
            layer,
            prng_key=None,
            state=p,
            inputs=dict(inputs=inputs, paddings=paddings),
            is_training=True,
            drop_output_collections=(),
        )
        return out, col

    out, col = run(params, x)
    ids, vecs = _np_nearest(np.asarray(x).reshape(2, 5, G, D), params["codebook"], "l2")
    valid = ~np.asarray(paddings)
    np.testing.assert_array_equal(out.ids, np.where(valid[..., None], ids, -1))
    np.testing.assert_allclose(out.quantized_vectors, vecs * valid[..., None, None], rtol=1e-5)
    diff = (vecs.reshape(2, 5, -1) - np.asarray(x)) ** 2 * valid[..., None]
    mse = diff.sum() / (valid.sum() * G * D)
    np.testing.assert_allclose(col.module_outputs["kmeans_loss"], mse, rtol=1e-5)
    np.testing.assert_allclose(col.module_outputs["commitment_loss"], mse, rtol=1e-5)
    np.testing.assert_allclose(out.loss, (1 + beta) * mse, rtol=1e-5)
    coverage, pplx, entropy = _np_stats(ids, paddings, V)
    np.testing.assert_allclose(col.summaries["codebook/coverage"].mean, coverage, rtol=1e-6)
    np.testing.assert_allclose(col.summaries["codebook/pplx"].mean, pplx, rtol=1e-5)
    np.testing.assert_allclose(col.summaries["codebook/entropy"].mean, entropy, rtol=1e-5)
    np.testing.assert_allclose(col.summaries["codebook/num_frames"].mean, valid.sum() / 2)

    # Loss = quantizer loss + sum(quantized_vectors): the inputs get beta * d(commitment) plus
    # the straight-through ones (valid frames only); the codebook gets d(kmeans) only.
    def loss(p, inputs):
        out, _ = run(p, inputs)
        return out.loss + jnp.sum(out.quantized_vectors)

    g_params, g_inputs = jax.grad(loss, argnums=(0, 1))(params, x)
    n = valid.sum() * G * D
    resid = np.asarray(x) - vecs.reshape(2, 5, -1)  # inputs - q.
    want_inputs = (beta * 2 * resid / n + 1.0) * valid[..., None]
    np.testing.assert_allclose(g_inputs, want_inputs, rtol=1e-5, atol=1e-6)
    want_codebook = np.zeros((V, G, D))
    r = (-2 * resid / n * valid[..., None]).reshape(2, 5, G, D)
    for b in range(2):
        for t in range(5):
            for g in range(G):
                want_codebook[ids[b, t, g], g] += r[b, t, g]
    np.testing.assert_allclose(g_params["codebook"], want_codebook, rtol=1e-5, atol=1e-7)


def test_kmeans_normalization_uses_unit_vectors():
    layer = (
        q.KmeansVectorQuantizer.default_config()
        .set(
            name="vq",
            codebook_dim=4,
            codebook_size=6,
            num_codebooks=1,
            beta=0.1,
            normalize_inputs=True,
            normalize_codebook=True,
        )
        .instantiate(parent=None)
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 4)) * 10
    out, _ = F(
        layer,
        prng_key=None,
        state=params,
        inputs=dict(inputs=x, paddings=jnp.zeros((2, 5), bool)),
        is_training=True,
    )
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    ids, vecs = _np_nearest(unit(np.asarray(x)).reshape(2, 5, 1, 4), unit(params["codebook"]), "l2")
    np.testing.assert_array_equal(out.ids, ids)
    np.testing.assert_allclose(out.quantized_vectors, vecs, rtol=1e-5)


def test_kmeans_codebook_init_and_input_check():
    layer = (
        q.KmeansVectorQuantizer.default_config()
        .set(name="vq", codebook_dim=64, codebook_size=512, num_codebooks=2, beta=0.1)
        .instantiate(parent=None)
    )
    codebook = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))["codebook"]
    bound = np.sqrt(3.0 / (2 * 64))  # U(-b, b) with variance 1 / fan_out.
    assert float(jnp.max(jnp.abs(codebook))) <= bound
    np.testing.assert_allclose(np.std(codebook) * np.sqrt(128), 1.0, atol=0.02)
    with pytest.raises(ValueError, match=r"vq: inputs have 5 features"):
        F(
            layer,
            prng_key=None,
            state=dict(codebook=codebook),
            inputs=dict(inputs=jnp.zeros((1, 2, 5)), paddings=jnp.zeros((1, 2), bool)),
            is_training=False,
        )


@pytest.mark.parametrize("normalize", [True, False])
def test_random_quantizer_matches_numpy_and_has_no_gradient(normalize):
    G, D, V, input_dim = 2, 4, 8, 6
    layer = (
        q.RandomVectorQuantizer.default_config()
        .set(
            name="rq",
            input_dim=input_dim,
            codebook_dim=D,
            codebook_size=V,
            num_codebooks=G,
            normalize_codebook=normalize,
            normalize_inputs=normalize,
        )
        .instantiate(parent=None)
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(3))
    norms = np.linalg.norm(params["codebook"], axis=-1)
    if normalize:
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    x = jax.random.normal(jax.random.PRNGKey(4), (2, 5, input_dim))
    paddings = _paddings()

    def run(p, inputs):
        return F(
            layer,
            prng_key=None,
            state=p,
            inputs=dict(inputs=inputs, paddings=paddings),
            is_training=True,
        )

    out, _ = run(params, x)
    proj = (np.asarray(x, np.float64) @ np.asarray(params["rand_proj"]["weight"])).reshape(
        2, 5, G, D
    )
    if normalize:
        proj = proj / np.linalg.norm(proj, axis=-1, keepdims=True)
    ids, vecs = _np_nearest(proj, params["codebook"], "l2")
    valid = ~np.asarray(paddings)
    np.testing.assert_array_equal(out.ids, np.where(valid[..., None], ids, -1))
    np.testing.assert_allclose(out.quantized_vectors, vecs * valid[..., None, None], rtol=1e-5)
    assert out.loss is None

    def loss(p, inputs):
        out, col = run(p, inputs)
        return jnp.sum(out.quantized_vectors**2) + col.summaries["codebook/entropy"].mean

    g_params, g_inputs = jax.grad(loss, argnums=(0, 1))(params, x)
    for leaf in jax.tree.leaves(g_params) + [g_inputs]:
        np.testing.assert_array_equal(leaf, 0)


def _gumbel(step_schedule=2.0):
    return (
        q.GumbelSoftmaxVectorQuantizer.default_config()
        .set(
            name="gq",
            input_dim=3,
            codebook_dim=2,
            codebook_size=4,
            num_codebooks=2,
            temperature_schedule=step_schedule,
        )
        .instantiate(parent=None)
    )


def test_gumbel_eval_is_argmax_of_the_projection():
    layer = _gumbel()
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert float(jnp.max(jnp.abs(params["codebook"]))) <= 1.0
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 3))
    paddings = _paddings()
    out, _ = F(
        layer,
        prng_key=None,
        state=params,
        inputs=dict(inputs=x, paddings=paddings),
        is_training=False,
    )
    proj = params["input_proj"]
    logits = np.einsum("btd,dgv->btgv", np.asarray(x), proj["weight"]) + proj["bias"]
    ids = logits.argmax(-1)
    valid = ~np.asarray(paddings)
    np.testing.assert_array_equal(out.ids, np.where(valid[..., None], ids, -1))
    vecs = np.asarray(params["codebook"])[ids, np.arange(2)]
    np.testing.assert_allclose(out.quantized_vectors, vecs * valid[..., None, None], rtol=1e-6)
    lookup, _ = F(
        layer,
        prng_key=None,
        state=params,
        inputs=dict(ids=jnp.asarray(ids)),
        method="lookup",
        is_training=False,
    )
    np.testing.assert_allclose(lookup.quantized_vectors, vecs, rtol=1e-6)


def test_gumbel_training_straight_through_gradient():
    layer = _gumbel(step_schedule=lambda step: 2.0 + step)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    params["step"] = jnp.float32(3)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 3))
    paddings = _paddings()
    key = jax.random.PRNGKey(7)

    def run(p, inputs):
        return F(
            layer,
            prng_key=key,
            state=p,
            inputs=dict(inputs=inputs, paddings=paddings),
            is_training=True,
            drop_output_collections=(),
        )

    out, col = run(params, x)
    assert float(col.state_updates["step"]) == 4.0
    np.testing.assert_allclose(col.summaries["codebook/temperature"], 5.0)
    probs = np.asarray(col.module_outputs["probs"], np.float64)  # [b, t, g, v]
    valid = ~np.asarray(paddings)
    ids = np.asarray(out.ids)
    np.testing.assert_array_equal(ids[~valid], -1)
    np.testing.assert_array_equal(ids[valid], probs[valid].argmax(-1))
    codebook = np.asarray(params["codebook"], np.float64)
    want_vecs = codebook[np.maximum(ids, 0), np.arange(2)] * valid[..., None, None]
    np.testing.assert_allclose(out.quantized_vectors, want_vecs, rtol=1e-6, atol=1e-7)

    # d sum(vecs) / d logits = (codebook row sums) through the softmax Jacobian, over tau.
    def loss(inputs):
        out, _ = run(params, inputs)
        return jnp.sum(out.quantized_vectors)

    g_inputs = jax.grad(loss)(x)
    d_codes = codebook.sum(-1).T  # [g, v]: d loss / d code.
    jac = probs[..., :, None] * (np.eye(4) - probs[..., None, :])  # [b, t, g, v, v].
    d_logits = np.einsum("gu,btguv->btgv", d_codes, jac) / 5.0 * valid[..., None, None]
    want = np.einsum("btgv,dgv->btd", d_logits, params["input_proj"]["weight"])
    np.testing.assert_allclose(g_inputs, want, rtol=1e-4, atol=1e-6)


def test_base_quantizer_with_a_constant_codebook():
    layer = (
        q.BaseQuantizer.default_config()
        .set(
            name="base",
            codebook_dim=3,
            codebook_size=2,
            num_codebooks=4,
            param_init=DefaultInitializer.default_config().set(
                init_by_param_name={
                    ".*codebook$": ConstantInitializer.default_config().set(value=0.5)
                }
            ),
        )
        .instantiate(parent=None)
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(params["codebook"], np.full((2, 4, 3), 0.5))
