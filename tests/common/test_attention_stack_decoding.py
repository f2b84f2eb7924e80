"""Tests of decoding through nested stacks (axlearn.common.attention.stack): a
RepeatedTransformerLayer over a StackedTransformerLayer (a list-shaped per-layer state)."""

import jax
import numpy as np

from axlearn.common.attention import (
    RepeatedTransformerLayer,
    StackedTransformerLayer,
    TransformerLayer,
)
from axlearn.common.module import functional
from axlearn.common.utils import VDict

D, B, T = 8, 2, 4


def test_repeated_over_stacked_extend_step_equals_forward():
    inner = TransformerLayer.default_config()
    inner.self_attention.attention.set(num_heads=2, causal=True)
    inner.feed_forward.set(hidden_dim=16)
    stacked = StackedTransformerLayer.default_config().set(num_layers=2, layer=inner)
    cfg = RepeatedTransformerLayer.default_config().set(
        name="repeat", input_dim=D, num_layers=2, layer=stacked
    )
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, D))
    full, _ = functional(layer, None, params, dict(data=x), is_training=False)
    state = layer.init_states(batch_size=B, max_len=T)
    # One VDict per inner layer, each with a leading axis over the repeated layers.
    assert isinstance(state["repeat"], list) and len(state["repeat"]) == 2
    assert all(isinstance(s, VDict) for s in state["repeat"])
    steps = []
    for t in range(T):
        (state, out), _ = functional(
            layer,
            None,
            params,
            dict(cached_states=state, data=x[:, t : t + 1]),
            method="extend_step",
            is_training=False,
        )
        steps.append(np.asarray(out.data))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full.data, atol=1e-5)
