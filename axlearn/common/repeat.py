"""A layer that repeats a sub-layer N times with parameters stacked on a leading axis.

`Repeat` holds one child `layer` whose parameters have a leading axis of size `num_layers`
(parameter paths `.../repeat/layer/...`); its computation is a `jax.lax.scan` over that axis,
so the compiled program does not grow with the number of layers. Subclasses describe the
per-layer computation with `_run(fn, carry, xs=...)`:

    for i in range(num_layers):
        carry, ys[i] = fn(carry, xs[i])

Each iteration runs in the layer's context with the i-th slice of the parameters and its own
PRNG key (split from the module's key). As in AXLearn, the outputs land in the Repeat's output
collection: state updates and module outputs stacked (leading axis num_layers) under `layer`,
i.e. at the stacked parameters' own paths, and the summaries of iteration i under `layer{i}`.
Outputs matched by `drop_output` are dropped (by default all module outputs).
"""

import dataclasses
from collections.abc import Sequence
from typing import Callable, NamedTuple, Optional, Union

import jax
from jax.sharding import PartitionSpec

from axlearn.common.base_layer import BaseLayer, FactorizationSpec, ParameterSpec
from axlearn.common.config import (
    REQUIRED,
    InstantiableConfig,
    Required,
    config_class,
    config_for_function,
)
from axlearn.common.module import Module, child_context, scan_in_context
from axlearn.common.param_init import FanAxes
from axlearn.common.utils import (
    NestedTensor,
    Tensor,
    get_or_none,
    match_regex_rules,
    split_prng_key,
)


def _drop_by_regex(rules: Sequence[str]) -> Callable[[str], bool]:
    """Returns a predicate that is True for paths fully matching one of the regex `rules`.

    Args:
        rules: Regular expressions over output paths such as "module_outputs/layer/output".

    Returns:
        The predicate.
    """
    return lambda path: bool(
        match_regex_rules(path, rules=[(rule, True) for rule in rules], default_value=False)
    )


def _shift_axes(axes, offset: int):
    if isinstance(axes, int):
        return axes + offset if axes >= 0 else axes
    return tuple(a + offset if a >= 0 else a for a in axes)


def _prepend_fan_axes(fan_axes: Optional[FanAxes]) -> Optional[FanAxes]:
    if fan_axes is None:
        return None
    batch = fan_axes.batch_axis
    batch = (batch,) if isinstance(batch, int) else tuple(batch)
    return FanAxes(
        in_axis=_shift_axes(fan_axes.in_axis, 1),
        out_axis=_shift_axes(fan_axes.out_axis, 1),
        batch_axis=(0, *_shift_axes(batch, 1)),
    )


def prepend_axis_to_specs(specs, size: int, *, mesh_axis: Optional[str] = None):
    """Adds a leading (batch) axis of `size` to every ParameterSpec in `specs`.

    Args:
        specs: A nested dict of completed ParameterSpecs.
        size: The new leading dimension (e.g. the number of repeated layers).
        mesh_axis: The mesh axis the new axis is sharded over (None: unpartitioned), e.g.
            "pipeline" for pipeline stages.

    Returns:
        The transformed tree.
    """

    def transform(spec: ParameterSpec) -> ParameterSpec:
        factorization = spec.factorization
        if factorization is not None:
            factorization = FactorizationSpec(axes=[None, *factorization.axes])
        return dataclasses.replace(
            spec,
            shape=(size, *spec.shape),
            mesh_axes=PartitionSpec(mesh_axis, *(spec.mesh_axes or (None,) * len(spec.shape))),
            factorization=factorization,
            fan_axes=_prepend_fan_axes(spec.fan_axes),
        )

    return jax.tree.map(transform, specs, is_leaf=lambda x: isinstance(x, ParameterSpec))


def init_stacked_layer(
    owner: BaseLayer, prng_key: Tensor, *, prebuilt: Optional[NestedTensor], count: int
) -> NestedTensor:
    """Initializes `count` independent copies of `owner.layer`, stacked on a leading axis.

    Shared by the layers that hold one child "layer" with stacked parameters (Repeat, Pipeline).

    Args:
        owner: The stacking layer; it must have no parameters of its own.
        prng_key: The key; copy i uses the i-th of `count` successive splits.
        prebuilt: The prebuilt parameters, or None.
        count: How many copies (the leading axis size).

    Returns:
        {"layer": params}, each leaf with leading axis `count`.

    Raises:
        NotImplementedError: If `owner` has parameters of its own.
    """
    if owner._local_parameter_specs():  # pylint: disable=protected-access
        raise NotImplementedError(f"{type(owner).__name__} layers have no parameters of their own")
    prebuilt_layer = get_or_none(prebuilt, "layer")

    def init(key):
        return dict(
            layer=owner.layer.initialize_parameters_recursively(key, prebuilt=prebuilt_layer)
        )

    # As AXLearn: copy i gets the i-th child of `count` successive splits (not one split into
    # `count` keys), so a stack draws what the same layers would as children one after another.
    return jax.vmap(init)(split_prng_key(prng_key, count).keys)


class Repeat(BaseLayer):
    """Repeats `layer` `num_layers` times with a scan over stacked parameters."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures Repeat."""

        # The repeated sub-layer config.
        layer: Required[InstantiableConfig] = REQUIRED
        # Number of repetitions.
        num_layers: Required[int] = REQUIRED
        # Predicate config over output paths ("summaries/...", "module_outputs/...") selecting
        # outputs to drop from the scanned layer; None keeps everything.
        drop_output: Optional[InstantiableConfig] = config_for_function(_drop_by_regex).set(
            rules=["module_outputs.*"]
        )
        # Iterations per step of the scan's loop (jax.lax.scan's `unroll`): an int >= 1, True
        # (unroll all) or False (1); None means 1.
        unroll: Optional[Union[int, bool]] = None

    class Output(NamedTuple):
        """carry: the last iteration's carry; ys: per-iteration outputs stacked on axis 0."""

        carry: NestedTensor
        ys: NestedTensor

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("layer", cfg.layer)
        self._drop_output = cfg.drop_output.instantiate() if cfg.drop_output is not None else None
        if cfg.unroll is not None and not isinstance(cfg.unroll, bool):
            if not isinstance(cfg.unroll, int) or cfg.unroll < 1:
                raise ValueError(
                    f"{self.path()}: unroll={cfg.unroll!r} must be True, False, None or an int >= 1"
                )

    def create_parameter_specs_recursively(self):
        return prepend_axis_to_specs(
            super().create_parameter_specs_recursively(), self._num_layers()
        )

    def _num_layers(self) -> int:
        return self._config.num_layers

    def initialize_parameters_recursively(
        self, prng_key: Tensor, *, prebuilt: Optional[NestedTensor] = None
    ) -> NestedTensor:
        return init_stacked_layer(self, prng_key, prebuilt=prebuilt, count=self._num_layers())

    def _run(self, fn: Callable, carry: NestedTensor = None, *, xs: NestedTensor = None) -> Output:
        """Runs `fn(carry, x_i) -> (carry, y_i)` for each layer i in the layer's context.

        Args:
            fn: The per-layer function; call `self.layer` inside it.
            carry: The initial carry.
            xs: Optional per-layer inputs, each leaf with leading axis num_layers.

        Returns:
            An Output.
        """
        carry = {} if carry is None else carry
        xs = {} if xs is None else xs
        prng_key = self.prng_key
        scan_xs = dict(xs=xs, state=None)
        # The layer's context writes into this module's output collection, so that the scan's
        # outputs are added here as "layer" (stacked) and "layer{i}" (per-layer summaries).
        own_collection = self.get_invocation_context().output_collection
        with child_context(
            "layer", module=self.layer, output_collection=own_collection
        ) as layer_context:
            scan_xs["state"] = layer_context.state
            if prng_key is not None:
                # As many iterations as the state holds layers (a caller may pass the first n).
                leaves = jax.tree.leaves(layer_context.state)
                num_iterations = leaves[0].shape[0] if leaves else self._num_layers()
                scan_xs["prng_key"] = split_prng_key(prng_key, num_iterations).keys
            carry, ys = scan_in_context(
                fn,
                carry=carry,
                xs=scan_xs,
                drop_output=self._drop_output,
                child_name_prefix="layer",
                unroll=1 if self.config.unroll is None else self.config.unroll,
            )
        return self.Output(carry=carry, ys=ys)
