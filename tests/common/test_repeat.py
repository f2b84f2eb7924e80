"""Tests of axlearn.common.repeat."""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import config_class
from axlearn.common.layers import Linear
from axlearn.common.module import Module, functional
from axlearn.common.param_init import FanAxes
from axlearn.common.repeat import Repeat, _drop_by_regex

DIM, LAYERS = 4, 3


class _Residual(BaseLayer):
    """x + tanh(linear(x)); adds a summary and a module output."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures _Residual."""

        dim: int = DIM  # Feature dim.

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        dim = self.config.dim
        self._add_child("linear", Linear.default_config().set(input_dim=dim, output_dim=dim))

    def forward(self, x):
        y = x + jnp.tanh(self.linear(x))
        self.add_summary("mean", jnp.mean(y))
        self.add_module_output("out", y)
        return y


class _Stack(Repeat):
    def forward(self, x):
        def fn(carry, _):
            return self.layer(carry), None

        return self._run(fn, carry=x).carry


def _stack(**kwargs):
    cfg = _Stack.default_config().set(
        name="stack", layer=_Residual.default_config(), num_layers=LAYERS, **kwargs
    )
    return cfg.instantiate(parent=None)


def test_drop_by_regex():
    drop = _drop_by_regex(["module_outputs.*"])
    assert drop("module_outputs/layer/out") and not drop("summaries/mean")


def test_parameters_are_stacked():
    stack = _stack()
    params = stack.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert params["layer"]["linear"]["weight"].shape == (LAYERS, DIM, DIM)
    assert params["layer"]["linear"]["bias"].shape == (LAYERS, DIM)
    # Layers get different initial values.
    w = params["layer"]["linear"]["weight"]
    assert not np.allclose(w[0], w[1])
    spec = stack.create_parameter_specs_recursively()["layer"]["linear"]["weight"]
    assert tuple(spec.shape) == (LAYERS, DIM, DIM)
    assert spec.mesh_axes == PartitionSpec(None, None, None)
    assert spec.fan_axes == FanAxes(in_axis=-2, out_axis=-1, batch_axis=(0,))
    shapes = jax.eval_shape(stack.initialize_parameters_recursively, jax.random.PRNGKey(0))
    assert shapes["layer"]["linear"]["weight"].shape == (LAYERS, DIM, DIM)


def test_scan_equals_loop_and_outputs():
    stack = _stack()
    params = stack.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, DIM))
    out, collection = functional(stack, None, params, [x], is_training=False)
    expected = np.asarray(x, np.float64)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["layer"]["linear"])
    means = []
    for i in range(LAYERS):
        expected = expected + np.tanh(expected @ p["weight"][i] + p["bias"][i])
        means.append(expected.mean())
    np.testing.assert_allclose(out, expected, atol=1e-5)
    layer_summaries = collection.summaries["layer"]
    for i in range(LAYERS):
        np.testing.assert_allclose(layer_summaries[f"iter{i}"]["mean"], means[i], atol=1e-5)
    # Module outputs are dropped by default ...
    _, collection = functional(
        stack, None, params, [x], is_training=False, drop_output_collections=()
    )
    assert not jax.tree.leaves(collection.module_outputs)
    # ... and kept, stacked, without drop rules.
    keep = _stack(drop_output=None)
    _, collection = functional(
        keep, None, params, [x], is_training=False, drop_output_collections=()
    )
    assert collection.module_outputs["layer"]["iter"]["out"].shape == (LAYERS, 2, DIM)
