"""Tests of axlearn.common.pipeline.StreamSchedule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.layers import Linear
from axlearn.common.module import functional
from axlearn.common.pipeline import GPipeSchedule, Pipeline, StreamSchedule


class _TanhPipeline(Pipeline):
    def forward(self, x):
        return self._run(lambda carry, _: (jnp.tanh(self.layer(carry)), {}), x)


def test_stream_schedule_matches_numpy_and_gpipe_items():
    s, m, dim, batch = 2, 4, 3, 8
    stream = StreamSchedule.default_config().set(num_stages=s, num_microbatches=m).instantiate()
    gpipe = GPipeSchedule.default_config().set(num_stages=s, num_microbatches=m).instantiate()
    assert stream.num_steps() == gpipe.num_steps() == m + s - 1
    for t in range(stream.num_steps()):
        for a, b in zip(stream.stage_items(t), gpipe.stage_items(t)):
            np.testing.assert_array_equal(a, b)

    layer = (
        _TanhPipeline.default_config()
        .set(
            name="pipe",
            layer=Linear.default_config().set(input_dim=dim, output_dim=dim),
            num_layers=s,
            num_microbatches=m,
            schedule=StreamSchedule.default_config(),
        )
        .instantiate(parent=None)
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    x = jax.random.normal(jax.random.PRNGKey(2), (batch, dim))
    out, _ = functional(layer, jax.random.PRNGKey(0), params, [x], is_training=True)
    h = np.asarray(x, np.float64)
    for c in range(s):
        h = np.tanh(h @ np.asarray(params["layer"]["weight"][c]) + params["layer"]["bias"][c])
    np.testing.assert_allclose(np.asarray(out.carry), h, rtol=1e-5, atol=1e-6)


def test_stream_schedule_needs_divisible_microbatches():
    with pytest.raises(ValueError, match="num_microbatches=5 must be a multiple of num_stages=3"):
        StreamSchedule.default_config().set(num_stages=3, num_microbatches=5).instantiate()
