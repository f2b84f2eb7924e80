"""Tests of `peak_stochastic_depth_rate` on the transformer stacks and of
`layers.stochastic_depth_rate_scale`.

References: the linear rule rate_i = peak * (i + 1) / N computed by hand, and NumPy's
floor(keep + u) / keep drop-path formula on the uniform draws of the layer's key.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.attention import (
    PipelinedTransformerLayer,
    RepeatedTransformerLayer,
    StackedTransformerLayer,
)
from axlearn.common.layers import StochasticDepth, stochastic_depth_rate_scale
from axlearn.common.module import functional

_DIM, _NUM_LAYERS = 8, 3


class _RecordingStochasticDepth(StochasticDepth):
    """Adds the rate it drops with as a summary (to check which rate each layer gets)."""

    def forward(self, x):
        if self.is_training:
            self.add_summary("rate", jnp.asarray(self.effective_rate(), jnp.float32))
        return super().forward(x)


def _stack_cfg(klass, peak, *, recording=False):
    cfg = klass.default_config().set(
        name="stack", input_dim=_DIM, num_layers=_NUM_LAYERS, peak_stochastic_depth_rate=peak
    )
    cfg.layer.self_attention.attention.set(num_heads=2)
    cfg.layer.feed_forward.hidden_dim = 16
    if recording:
        for name in ("self_attention", "feed_forward"):
            getattr(cfg.layer, name).stochastic_depth = _RecordingStochasticDepth.default_config()
    return cfg


def _forward(layer, *, is_training, key=1):
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    data = jax.random.normal(jax.random.PRNGKey(2), (4, 5, _DIM))
    out, collection = functional(
        layer,
        prng_key=jax.random.PRNGKey(key),
        state=params,
        inputs=dict(data=data),
        is_training=is_training,
        drop_output_collections=(),
    )
    return out.data, collection.summaries


def test_scale_multiplies_the_rate():
    """rate 0.6 under scale 0.5 drops exactly as rate 0.3 (same draws)."""
    layer = StochasticDepth.default_config().set(name="sd", rate=0.6).instantiate(parent=None)
    x = np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32)
    key = jax.random.PRNGKey(5)

    def run(scale):
        def fn(x, scale):
            with stochastic_depth_rate_scale(scale):
                out, _ = functional(
                    layer, prng_key=key, state={}, inputs=dict(x=x), is_training=True
                )
            return out

        return np.asarray(jax.jit(fn)(x, scale))

    u = np.asarray(jax.random.uniform(key, (64, 1), dtype=jnp.float32))
    keep_prob = 1 - 0.6 * 0.5
    ref = x * np.floor(keep_prob + u) / keep_prob
    np.testing.assert_allclose(run(jnp.float32(0.5)), ref, rtol=1e-6)
    # Some rows dropped, some kept: the draw matters.
    assert 0 < (run(jnp.float32(0.5))[:, 0] == 0).sum() < 64
    # Outside the context, the configured rate.
    out, _ = functional(layer, prng_key=key, state={}, inputs=dict(x=x), is_training=True)
    np.testing.assert_allclose(out, x * np.floor(0.4 + u) / 0.4, rtol=1e-6)
    # A traced scale keeps a bfloat16 input's dtype.
    with stochastic_depth_rate_scale(jnp.float32(0.5)):
        out, _ = functional(
            layer,
            prng_key=key,
            state={},
            inputs=dict(x=jnp.asarray(x, jnp.bfloat16)),
            is_training=True,
        )
    assert out.dtype == jnp.bfloat16


def test_stacked_layer_configs_get_linear_rates():
    layer = _stack_cfg(StackedTransformerLayer, 0.3).instantiate(parent=None)
    for i in range(_NUM_LAYERS):
        child = getattr(layer, f"layer{i}").config
        expected = 0.3 * (i + 1) / _NUM_LAYERS  # 0.1, 0.2, 0.3.
        assert child.self_attention.stochastic_depth.rate == pytest.approx(expected)
        assert child.feed_forward.stochastic_depth.rate == pytest.approx(expected)
    # None and 0 leave the layers' rates as configured.
    for peak in (None, 0.0):
        layer = _stack_cfg(StackedTransformerLayer, peak).instantiate(parent=None)
        assert layer.layer2.config.feed_forward.stochastic_depth.rate is None


@pytest.mark.parametrize("klass", [StackedTransformerLayer, RepeatedTransformerLayer])
def test_each_layer_drops_with_its_linear_rate(klass):
    layer = _stack_cfg(klass, 0.3, recording=True).instantiate(parent=None)
    _, summaries = _forward(layer, is_training=True)
    rates = {
        path: float(value)
        for path, value in jax.tree_util.tree_flatten_with_path(summaries)[0]
        for path in [jax.tree_util.keystr(path)]
    }
    found = {}
    for path, value in rates.items():
        for i in range(_NUM_LAYERS):
            for name in ("self_attention", "feed_forward"):
                if f"'layer{i}'" in path and f"'{name}'" in path:
                    found[(i, name)] = value
    expected = {
        (i, name): 0.3 * (i + 1) / _NUM_LAYERS
        for i in range(_NUM_LAYERS)
        for name in ("self_attention", "feed_forward")
    }
    assert found == pytest.approx(expected), rates


@pytest.mark.parametrize("klass", [StackedTransformerLayer, RepeatedTransformerLayer])
def test_rate_changes_training_outputs_only(klass):
    plain = _stack_cfg(klass, None).instantiate(parent=None)
    dropped = _stack_cfg(klass, 0.5).instantiate(parent=None)
    # Evaluation ignores drop paths.
    np.testing.assert_allclose(
        _forward(plain, is_training=False)[0], _forward(dropped, is_training=False)[0], rtol=1e-6
    )
    # Training with drop paths differs from training without (same keys and parameters).
    assert not np.allclose(
        _forward(plain, is_training=True)[0], _forward(dropped, is_training=True)[0]
    )


def test_bad_peak_rates_are_refused():
    for klass in (StackedTransformerLayer, RepeatedTransformerLayer):
        with pytest.raises(ValueError, match="peak_stochastic_depth_rate=1.0"):
            _stack_cfg(klass, 1.0).instantiate(parent=None)
    cfg = _stack_cfg(StackedTransformerLayer, 0.2)
    cfg.layer = StackedTransformerLayer.default_config().set(num_layers=1)
    with pytest.raises(ValueError, match="stochastic_depth"):
        cfg.instantiate(parent=None)
    cfg = PipelinedTransformerLayer.default_config().set(
        name="pipe",
        input_dim=_DIM,
        num_layers=2,
        num_stages=1,
        num_microbatches=1,
        peak_stochastic_depth_rate=0.2,
    )
    with pytest.raises(NotImplementedError, match="peak_stochastic_depth_rate"):
        cfg.instantiate(parent=None)
