"""Tests of axlearn.common.repeat."""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import config_class
from axlearn.common.layers import Linear
from axlearn.common.module import Module, functional
from axlearn.common.param_init import FanAxes, constant_initializer
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
    # AXLearn's layout: the summaries of layer i under "layer{i}", "layer" itself empty.
    assert collection.summaries["layer"] == {}
    for i in range(LAYERS):
        np.testing.assert_allclose(collection.summaries[f"layer{i}"]["mean"], means[i], atol=1e-5)
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
    assert collection.module_outputs["layer"]["out"].shape == (LAYERS, 2, DIM)
    assert all(collection.module_outputs[f"layer{i}"] == {} for i in range(LAYERS))


class _Counter(BaseLayer):
    """Adds carry to a per-layer state ("inc") and updates the state to inc + 1."""

    def _create_layer_parameter_specs(self):
        return dict(inc=ParameterSpec(shape=[], mesh_axes=[], initializer=constant_initializer(1)))

    def forward(self, carry):
        inc = self.parameters["inc"]
        self.add_state_update("inc", inc + 1)
        self.add_summary("carry_mean", jnp.mean(carry))
        return carry + inc


def test_per_layer_state_updates_land_at_the_stacked_parameter_paths():
    """AXLearn's repeat_test layout: state updates stacked at .../layer/inc (the param path)."""
    cfg = _Stack.default_config().set(name="stack", layer=_Counter.default_config(), num_layers=4)
    stack = cfg.instantiate(parent=None)
    params = stack.initialize_parameters_recursively(jax.random.PRNGKey(1))
    np.testing.assert_array_equal(params["layer"]["inc"], [1, 1, 1, 1])
    carry = jnp.arange(14, dtype=jnp.float32)
    out, collection = functional(
        stack, jax.random.PRNGKey(2), params, [carry], is_training=True, drop_output_collections=()
    )
    np.testing.assert_allclose(out, np.arange(14) + 4)  # + 1 per layer.
    assert jax.tree.structure(collection.state_updates) == jax.tree.structure(
        {"layer": {"inc": 0}, **{f"layer{i}": {} for i in range(4)}}
    )
    np.testing.assert_allclose(collection.state_updates["layer"]["inc"], [2, 2, 2, 2])
    # Layer i sees carry + i: mean 6.5 + i.
    means = [float(collection.summaries[f"layer{i}"]["carry_mean"]) for i in range(4)]
    np.testing.assert_allclose(means, 6.5 + np.arange(4))


@pytest.mark.parametrize("unroll", [True, False, 2])
def test_unroll_same_outputs(unroll):
    """`unroll` changes how the scan loops, not its results (the NumPy-checked default)."""
    params = _stack().initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, DIM))
    ref, _ = functional(_stack(), None, params, [x], is_training=False)
    out, collection = functional(_stack(unroll=unroll), None, params, [x], is_training=False)
    np.testing.assert_allclose(out, ref, atol=1e-6)
    assert sorted(collection.summaries) == sorted(["layer"] + [f"layer{i}" for i in range(LAYERS)])
    # The loop body appears unrolled in the jaxpr: `unroll` reaches jax.lax.scan.
    jaxpr = jax.make_jaxpr(
        lambda p: functional(_stack(unroll=unroll), None, p, [x], is_training=False)[0]
    )(params)
    scans = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    expected = {True: LAYERS, False: 1, 2: 2}[unroll]
    assert scans and scans[0].params["unroll"] == expected


def test_unroll_bad_value():
    with pytest.raises(ValueError, match=r"stack: unroll=0 must be True, False, None or an int"):
        _stack(unroll=0)


def test_runs_as_many_layers_as_the_state_holds():
    """With a prng key and the first 2 layers' parameters, the scan runs 2 layers (NumPy loop)."""
    stack = _stack()
    params = stack.initialize_parameters_recursively(jax.random.PRNGKey(0))
    first2 = jax.tree.map(lambda a: a[:2], params)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, DIM))
    out, _ = functional(stack, jax.random.PRNGKey(5), first2, [x], is_training=True)
    expected = np.asarray(x, np.float64)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), first2["layer"]["linear"])
    for i in range(2):
        expected = expected + np.tanh(expected @ p["weight"][i] + p["bias"][i])
    np.testing.assert_allclose(out, expected, atol=1e-5)
