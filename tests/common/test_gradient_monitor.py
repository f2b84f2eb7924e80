"""Tests axlearn/common/gradient_monitor.py against NumPy top-k clipping and hand gradients."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common import gradient_monitor as gm
from axlearn.common import learner as learner_lib
from axlearn.common import optimizers
from axlearn.common.config import config_for_function
from axlearn.common.layers import Linear
from axlearn.common.module import child_context, new_output_collection
from axlearn.common.module import functional as F
from axlearn.common.summary import CallbackSummary, ImageSummary
from tests.common.learner_test_utils import forward_and_backward_step, opt_params


def _np_top_k(g, k):
    """NumPy reference: (clipped g, k largest norms, their flat indices)."""
    norms = np.sqrt((np.asarray(g, np.float64) ** 2).sum(-1))
    flat = norms.reshape(-1)
    ids = np.argsort(-flat, kind="stable")[:k]
    keep = np.ones(flat.shape, bool)
    keep[ids] = False
    clipped = np.where(keep.reshape(norms.shape)[..., None], g, 0)
    return clipped, flat[ids], ids


@pytest.mark.parametrize("method", ["approx", "topk", "sort"])
@pytest.mark.parametrize("k", [1, 3])
def test_top_k_clip_matches_numpy(method, k):
    g = jax.random.normal(jax.random.PRNGKey(k), (2, 5, 6))
    want_clipped, want_top, want_ids = _np_top_k(g, k)
    clipped, top = gm.top_k_clip_fn(k=k, method=method)(g)
    np.testing.assert_allclose(clipped, want_clipped, rtol=1e-6)
    np.testing.assert_allclose(top, want_top, rtol=1e-5)
    _, stats = gm.top_k_clip_fn(k=k, method=method, log_pos=True)(g)
    assert stats.shape == (5, k)
    np.testing.assert_allclose(stats[0], want_top, rtol=1e-5)
    # The position rows are the 4 little-endian bytes of each index.
    decoded = (np.asarray(stats[1:], np.int64) << (8 * np.arange(4))[:, None]).sum(0)
    np.testing.assert_array_equal(decoded, want_ids)


def test_top_k_needs_fewer_than_all_tokens():
    with pytest.raises(ValueError, match="1 <= k < token count"):
        gm.top_k_clip_fn(k=4)(jnp.ones((2, 2, 3)))


def test_int32_bytes_round_trip_through_bfloat16():
    x = jnp.array([0, 1, 255, 256, 70000, 2**31 - 1, -1, -(2**31)], jnp.int32)
    encoded = gm.encode_int32_to_bf16_bytes(x)
    assert encoded.dtype == jnp.bfloat16 and encoded.shape == (4, 8)
    want = np.asarray(x).astype("<i4").view(np.uint8).reshape(8, 4).T
    np.testing.assert_array_equal(np.asarray(encoded, np.float32), want)


def test_percentiles_match_numpy():
    g = jax.random.normal(jax.random.PRNGKey(0), (3, 7, 5))
    out, stats = gm.compute_grad_percentile_no_clip_fn((10, 50, 90))(g)
    assert out is g
    norms = np.linalg.norm(np.asarray(g, np.float64), axis=-1)
    np.testing.assert_allclose(stats, np.percentile(norms, [10, 50, 90]), rtol=1e-5)


def test_clipping_impl_touches_only_the_supported_path():
    data = jax.random.normal(jax.random.PRNGKey(0), (1, 4, 3))
    other = jax.random.normal(jax.random.PRNGKey(1), (1, 4, 3))
    tree = dict(data=data, other=other)
    clipped, stats = gm.gradient_clipping_impl(
        tree, clip_fn=gm.top_k_clip_fn(k=1), supported_paths=("['data']",)
    )
    np.testing.assert_allclose(clipped["data"], _np_top_k(data, 1)[0])
    np.testing.assert_array_equal(clipped["other"], other)
    assert stats.shape == (1,)
    with pytest.raises(ValueError, match="Exactly one output leaf"):
        gm.gradient_clipping_impl(tree, clip_fn=gm.top_k_clip_fn(k=1))


def _monitored_linear(clip_fn, stats_shape=(2,)):
    base = Linear.default_config().set(name="lin", input_dim=3, output_dim=4, bias=False)
    monitor = gm.GradientMonitorAndClipLayer.default_config().set(
        clip_fn=clip_fn, stats_shape=stats_shape
    )
    cfg = gm.convert_to_monitored_layer_config(base, monitor)
    return base, cfg


def test_backward_clips_the_cotangent_and_returns_stats_as_the_stats_gradient():
    _, cfg = _monitored_linear(config_for_function(gm.top_k_clip_fn).set(k=2, method="sort"))
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 3))
    target = jax.random.normal(jax.random.PRNGKey(2), (2, 3, 4)) * 5

    def loss(p):
        y, _ = F(layer, prng_key=None, state=p, inputs=dict(x=x), is_training=True)
        return 0.5 * jnp.sum((y - target) ** 2)

    grads = jax.grad(loss)(params)
    w = np.asarray(params["weight"], np.float64)
    dy = np.asarray(x, np.float64) @ w - np.asarray(target, np.float64)  # dL/dy.
    clipped_dy, top, _ = _np_top_k(dy, 2)
    want_dw = np.einsum("bti,bto->io", np.asarray(x, np.float64), clipped_dy)
    np.testing.assert_allclose(grads["weight"], want_dw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads["gradient_monitor"]["stats"], top, rtol=1e-5)
    # The forward pass is unchanged.
    y, collection = F(layer, prng_key=None, state=params, inputs=dict(x=x), is_training=True)
    np.testing.assert_allclose(y, np.asarray(x) @ w, rtol=1e-5)
    np.testing.assert_array_equal(collection.summaries["gradient_monitor"]["top_norms_hist"], 0)


def test_wrong_stats_shape_names_the_config_path():
    _, cfg = _monitored_linear(config_for_function(gm.top_k_clip_fn).set(k=2), stats_shape=(3,))
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))

    def loss(p):
        y, _ = F(layer, prng_key=None, state=p, inputs=dict(x=jnp.ones((4, 3))), is_training=True)
        return y.sum()

    with pytest.raises(ValueError, match=r"set lin\.gradient_monitor\.stats_shape"):
        jax.grad(loss)(params)


def test_monitored_class_and_config():
    cls = gm.create_monitored_layer_class(Linear)
    assert cls is gm.create_monitored_layer_class(Linear)
    assert cls.__name__ == "MonitoredLinear" and issubclass(cls, Linear)
    base, cfg = _monitored_linear(config_for_function(gm.top_k_clip_fn))
    assert cfg.klass is cls
    assert (cfg.input_dim, cfg.output_dim, cfg.bias) == (3, 4, False)
    base.input_dim = 7
    assert cfg.input_dim == 3  # Copied, not shared.
    # Without a monitor the layer is the base layer.
    plain = cfg.clone(gradient_monitor=None).instantiate(parent=None)
    assert "gradient_monitor" not in plain.initialize_parameters_recursively(jax.random.PRNGKey(0))


def test_log_pos_summaries():
    class Recorder:
        def __init__(self):
            self.summaries = {}

        def add_summary(self, name, value):
            self.summaries[name] = value

    g = jax.random.normal(jax.random.PRNGKey(3), (4, 6))
    _, stats = gm.top_k_clip_fn(k=3, method="sort", log_pos=True)(g)
    rec = Recorder()
    gm.default_stats_logging_fn(log_pos=True)(rec, stats)
    norms = np.sort(np.linalg.norm(np.asarray(g), axis=-1))[::-1][:3]
    np.testing.assert_allclose(rec.summaries["max_norm"], norms[0], rtol=1e-5)
    np.testing.assert_allclose(rec.summaries["clip_threshold"], norms[-1], rtol=1e-5)
    image = rec.summaries["top_norms"]
    assert isinstance(image, ImageSummary)
    np.testing.assert_allclose(
        image.value()[0, 0, :, 0], (norms - norms[-1]) / (norms[0] - norms[-1]), rtol=1e-4
    )
    text = rec.summaries["clipped_token_pos"]
    assert isinstance(text, CallbackSummary)
    ids = np.argsort(-np.linalg.norm(np.asarray(g), axis=-1))[:3]
    assert text.value().splitlines()[0] == " ".join(str(i) for i in ids)
    with pytest.raises(ValueError, match="log_pos=True"):
        gm.default_stats_logging_fn(log_pos=True)(rec, jnp.zeros((3,)))


def test_learner_replaces_stats_and_next_forward_summarizes_them():
    _, cfg = _monitored_linear(config_for_function(gm.top_k_clip_fn).set(k=2, method="topk"))
    model = cfg.set(name="model").instantiate(parent=None)
    inner = learner_lib.Learner.default_config().set(
        optimizer=config_for_function(optimizers.sgd_optimizer).set(
            learning_rate=0.1, decouple_weight_decay=True
        )
    )
    inner.ema.decay = 0.5
    learner_cfg = gm.gradient_monitoring_learner_cfg_modifier(inner).set(name="learner")
    assert inner.ema.decay is None and learner_cfg.ema.decay == 0.5
    learner = learner_cfg.instantiate(parent=None)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    state = learner.init(opt_params(params))
    x = jax.random.normal(jax.random.PRNGKey(1), (5, 3))

    def loss_fn(*, model_params, inputs):
        collection = new_output_collection()
        with child_context("model", module=model, state=model_params, output_collection=collection):
            y = model(inputs["input_batch"])
        return learner_lib.ForwardOutputs(
            loss=0.5 * jnp.sum(y**2), aux={}, output_collection=collection
        )

    step = forward_and_backward_step(learner, loss_fn)
    w0 = np.asarray(params["weight"], np.float64)
    seen = []
    for _ in range(2):
        outputs, collection = step(params, state, x)
        seen.append(outputs.forward_outputs.output_collection.summaries)
        new = outputs.backward_outputs.updated_params
        dy = np.asarray(x, np.float64) @ np.asarray(params["weight"], np.float64)
        clipped_dy, top, _ = _np_top_k(dy, 2)
        np.testing.assert_allclose(new["gradient_monitor"]["stats"], top, rtol=1e-5)
        want_w = np.asarray(params["weight"]) - 0.1 * np.asarray(x).T @ clipped_dy
        np.testing.assert_allclose(new["weight"], want_w, rtol=1e-4, atol=1e-6)
        params, state = new, collection.state_updates
    # The collection of the model's child context holds its summaries; step 2's show step 1's
    # statistics.
    np.testing.assert_allclose(seen[0]["gradient_monitor"]["top_norms_hist"], 0)
    first_top = _np_top_k(np.asarray(x, np.float64) @ w0, 2)[1]
    np.testing.assert_allclose(seen[1]["gradient_monitor"]["top_norms_hist"], first_top, rtol=1e-5)
    assert set(state) == {"inner", "gradient_monitor_stats", "ema"}
