"""Test helpers reading what a layer's parameter initialization and learner resolve.

AXLearn's `test_utils.read_param_init_specs_recursively` / `read_per_param_settings` (and
`ParamInitSpec`, `ThirdPartyInitializer`); import them from `axlearn.common.test_utils`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional
from unittest import mock

import jax
from jax import numpy as jnp

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.param_init import FanAxes, Initializer
from axlearn.common.utils import Nested, tree_paths


@dataclasses.dataclass(frozen=True)
class ParamInitSpec:
    """How one parameter is initialized: its shape, initializer and fan axes (a tree leaf)."""

    shape: Optional[Any]
    initializer: Initializer
    fan_axes: Optional[FanAxes]


class ThirdPartyInitializer(Initializer):
    """Marks a parameter initialized by another library (e.g. a delegate's own init code)."""

    @config_class
    class Config(Initializer.Config):
        # The name of the library that initializes the parameter.
        library: Required[str] = REQUIRED

    def initialize(self, name: str, *, prng_key, shape, dtype, axes=None):
        raise NotImplementedError(
            f"{name} is initialized by {self.config.library}, not by ThirdPartyInitializer"
        )

    def debug_string(self, name=None, shape=None, axes=None) -> str:
        return f"delegated({self.config.library})"


def read_param_init_specs_recursively(
    layer: BaseLayer, *, delegates: Optional[dict[str, ParamInitSpec]] = None
) -> Nested[ParamInitSpec]:
    """Runs `layer.initialize_parameters_recursively` and records each parameter's init spec.

    Parameters are not computed (each initialization returns zeros); the returned tree has the
    parameters' structure (unstacked shapes for repeated layers) with a `ParamInitSpec` per
    parameter. Entries of `delegates` (by path, "a/b") replace what the layer created there,
    for parameters made by code other than `_initialize_parameter`.

    Args:
        layer: The root layer.
        delegates: Optional {path: ParamInitSpec} for delegated parameters.

    Returns:
        A nested dict of ParamInitSpec.
    """
    recorded: dict[tuple[str, str], ParamInitSpec] = {}

    def record(self, name: str, *, prng_key, parameter_spec: ParameterSpec):
        del prng_key
        recorded[(self.path(), name)] = ParamInitSpec(
            shape=parameter_spec.shape,
            initializer=parameter_spec.initializer or self.param_init(),
            fan_axes=parameter_spec.fan_axes,
        )
        return jnp.zeros(tuple(parameter_spec.shape), dtype=parameter_spec.dtype)

    with mock.patch.object(BaseLayer, "_initialize_parameter", record):
        params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    root = layer.path()

    def lookup(path: str, value: Any) -> Any:
        *parents, name = path.split("/")
        layer_path = ".".join([root, *parents]) if root else ".".join(parents)
        return recorded.get((layer_path, name), value)

    out = jax.tree.map(lookup, tree_paths(params), params)
    for path, spec in (delegates or {}).items():
        node = out
        *parents, name = path.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[name] = spec
    return out


def read_per_param_settings(
    module: Any, config_name: str, trainer_config: Optional[Any] = None
) -> dict[str, dict[str, Nested[Any]]]:
    """The per-parameter settings (weight-decay scales, ...) a trainer config's learner resolves.

    Args:
        module: An object with `named_trainer_configs()` ({name: config function}), e.g. an
            experiment module or a test case.
        config_name: The config to read.
        trainer_config: Optional; the trainer config itself (then `module` is not used).

    Returns:
        {description: {registration path: tree of settings}}, e.g.
        `{"weight_decay_scale": {"root.optimizer": {"weight": 1.0, "bias": 0.0}}}`.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.learner import per_param_settings_records

    cfg = trainer_config or module.named_trainer_configs()[config_name]()
    model = cfg.model.clone(name="model").instantiate(parent=None)
    learner = cfg.learner.clone(name="learner").instantiate(parent=None)
    records = per_param_settings_records(learner, model.create_parameter_specs_recursively())
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        by_path = out.setdefault(record["description"], {})
        by_path[record.get("path") or str(len(by_path))] = record["settings"]
    return out
