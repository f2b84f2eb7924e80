"""A parameter spec's explicit fan_axes win over the layer's `_compute_fan_axes`."""

import math

import jax
import numpy as np

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.param_init import FanAxes


class _ExplicitFan(BaseLayer):
    def _create_layer_parameter_specs(self):
        return {"weight": ParameterSpec(shape=(4, 50, 60), fan_axes=FanAxes(in_axis=0, out_axis=1))}

    def _compute_fan_axes(self, name, parameter_spec):
        raise AssertionError("_compute_fan_axes must not be called for a spec with fan_axes")


def test_explicit_fan_axes_skip_compute_fan_axes():
    layer = _ExplicitFan.default_config().set(name="x").instantiate(parent=None)
    specs = layer.create_parameter_specs_recursively()
    assert specs["weight"].fan_axes == FanAxes(in_axis=0, out_axis=1)
    weight = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))["weight"]
    # Default init: fan_avg of in axis 0 (4) and out axis 1 (50), times the receptive field 60.
    expected_std = math.sqrt(1 / ((4 + 50) / 2 * 60))
    assert 0.8 * expected_std < np.std(weight) < 1.2 * expected_std
