"""BaseLayer: a Module with parameters, a default dtype, initializers, partitioning and remat.

A layer declares its own parameters in `_create_layer_parameter_specs()` (name -> ParameterSpec);
its children (added with `_add_child`) declare theirs. Then

- `create_parameter_specs_recursively()` returns the nested dict of ParameterSpecs (shape, dtype,
  PartitionSpec, fan axes), following child names: `{"decoder": {"emb": {"token_emb":
  {"weight": ParameterSpec(...)}}}}`;
- `initialize_parameters_recursively(prng_key)` returns the same tree of arrays, drawn as
  AXLearn draws them, so one seed gives AXLearn's weights bit for bit: the key is split once per
  local parameter, in the order `_create_layer_parameter_specs()` lists them (`prng_key,
  param_key = split(prng_key)`, also for a prebuilt parameter), then once per BaseLayer child in
  the order the children were added, each child recursing with its key. A parameter's value
  thus depends on the root key and on the layer's structure before it (adding a parameter or
  child moves the draws of those after it). It is pure JAX, so it runs under `jax.eval_shape`
  (no allocation) and under `jax.jit(out_shardings=...)` (see `initialize_parameters_on_mesh`),
  which creates every parameter directly sharded;
- inside `forward`, `self.parameters` is the layer's own subtree.

Parameters are stored in `dtype` (float32 unless configured; inherited from the parent when
None). Casting to a training dtype happens in the computation (the trainer's loss), never on the
stored parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import jax
import jax.ad_checkpoint
import jax.extend  # noqa: F401  (AXLearn code and tests use jax.extend.core after importing this)
import numpy as np
from absl import logging
from jax import numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common import param_init
from axlearn.common.config import ConfigOr, Configurable, config_class, maybe_instantiate
from axlearn.common.metrics import WeightedScalar
from axlearn.common.module import (
    Module,
    child_context,
    current_context,
    new_output_collection,
)
from axlearn.common.param_init import DefaultInitializer, FanAxes
from axlearn.common.utils import (
    Nested,
    NestedTensor,
    Tensor,
    TensorSpec,
    flatten_items,
    get_or_none,
    partition_spec_to_named_sharding,
)


@dataclasses.dataclass
class FactorizationSpec:
    """How to factorize a parameter's second-moment statistics (e.g. for Adafactor).

    `axes` has one entry per parameter axis: None (not factorized) or a name such as "row"/"col".
    """

    # One entry per parameter axis.
    axes: Sequence[Optional[str]]


# A nested dict of FactorizationSpec (or None) leaves.
NestedFactorizationSpec = dict[str, Union[FactorizationSpec, Any]]


@dataclasses.dataclass
class ParameterSpec(TensorSpec):
    """Specification of a layer parameter.

    Inherits `shape`, `dtype` (None: the layer's dtype) and `mesh_axes` (None: replicated; else one
    mesh axis name, tuple of names, or None per parameter axis) from TensorSpec.
    """

    # The initializer; None: the layer's `param_init()` (its DefaultInitializer).
    initializer: Optional[param_init.Initializer] = None
    # Factorization of the parameter's optimizer statistics, if any.
    factorization: Optional[FactorizationSpec] = None
    # Fan axes for fan-scaled initializers; None: computed by the layer's `_compute_fan_axes`.
    fan_axes: Optional[FanAxes] = None
    # Per-parameter weight decay scale (0 disables decay); None: the learner's default.
    weight_decay_scale: Optional[float] = None

    def fans(self) -> dict[str, float]:
        """Returns {"fan_in", "fan_out", "fan_avg"} of this parameter (needs `fan_axes`)."""
        if self.fan_axes is None:
            raise ValueError(f"ParameterSpec {self} has no fan_axes")
        return param_init.compute_fans(self.shape, self.fan_axes)


# A nested dict of ParameterSpec leaves.
NestedParameterSpec = Optional[Union[ParameterSpec, dict[str, Any]]]


@dataclasses.dataclass
class RematSpec:
    """Arguments for `jax.checkpoint` (a.k.a. remat) applied to a layer's methods."""

    # Passed to jax.checkpoint(prevent_cse=...).
    prevent_cse: bool = True
    # The checkpoint policy (a function, or a config that instantiates to one); None: save nothing.
    policy: Optional[ConfigOr[Callable[..., Any]]] = None


class ParameterNoise(Configurable):
    """Interface for adding noise to parameters (called explicitly by a trainer)."""

    def apply(self, prng_key: Tensor, params: NestedTensor) -> NestedTensor:
        """Returns `params` with noise added."""
        raise NotImplementedError(type(self))


class TensorStats(Module):
    """Adds summaries about tensors passed to `BaseLayer._add_tensor_stats`."""

    def add_stats(self, name: str, value: Nested[Tensor]):
        """Adds summaries about `value` (named `name`)."""
        raise NotImplementedError(type(self))


class CompositeTensorStats(TensorStats):
    """Runs several TensorStats."""

    @config_class
    class Config(TensorStats.Config):
        """Configures CompositeTensorStats."""

        # The child stats, by name.
        tensor_stats: dict[str, TensorStats.Config] = {}
        # If True, child summaries are added directly rather than under the child name.
        inline_child_summaries: bool = False

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        for name, child_cfg in self.config.tensor_stats.items():
            self._add_child(name, child_cfg)

    def add_stats(self, name: str, value: Nested[Tensor]):
        cfg = self.config
        for child_name, child in self.children.items():
            collection = new_output_collection()
            with child_context(child_name, output_collection=collection):
                child.add_stats(name, value)
            summaries = self.get_invocation_context().output_collection.summaries
            if cfg.inline_child_summaries:
                summaries.update(collection.summaries)
            else:
                summaries[child_name] = collection.summaries


class TensorRMSNorm(TensorStats):
    """Adds the RMS of a tensor as summary "rms_norm"."""

    def add_stats(self, name: str, value: Nested[Tensor]):
        self.add_summary("rms_norm", jnp.sqrt(jnp.mean(jnp.square(value.astype(jnp.float32)))))


class TensorMaxAbs(TensorStats):
    """Adds the maximum absolute value of a tensor as summary "max_abs"."""

    def add_stats(self, name: str, value: Nested[Tensor]):
        self.add_summary("max_abs", jnp.max(jnp.abs(value)).astype(jnp.float32))


class DefaultTensorStats(CompositeTensorStats):
    """The usual tensor stats: "norm" (TensorRMSNorm, "rms_norm") and "max" (TensorMaxAbs,
    "max_abs"), so a tensor x gets summaries {"norm": {"rms_norm"}, "max": {"max_abs"}}."""

    @classmethod
    def default_config(cls) -> CompositeTensorStats.Config:
        cfg = super().default_config()
        cfg.tensor_stats = {
            "norm": TensorRMSNorm.default_config(),
            "max": TensorMaxAbs.default_config(),
        }
        return cfg


def no_remat(fn: Callable) -> Callable:
    """Marks a layer method so that `remat_spec` is not applied to it (e.g. non-JAX outputs)."""
    fn._no_remat = True  # pylint: disable=protected-access
    return fn


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


class BaseLayer(Module):
    """Base class of layers: modules with parameters."""

    @config_class
    class Config(Module.Config):
        """Configures BaseLayer."""

        # The default parameter dtype; None: inherited from the parent (float32 at the root).
        dtype: Optional[jnp.dtype] = None
        # The parameter initializer (a DefaultInitializer config); None: inherited from the parent.
        param_init: Optional[DefaultInitializer.Config] = None
        # How this layer's parameters are partitioned over mesh axes (layer-specific structure:
        # a tuple/PartitionSpec of mesh axes per parameter axis, or a dict of them).
        param_partition_spec: Optional[Union[Sequence[Any], dict[str, Any], ParameterSpec]] = None
        # If not None, the layer's methods run under jax.checkpoint with these arguments.
        remat_spec: Optional[RematSpec] = None
        # If not None, noise applied by apply_parameter_noise_recursively().
        param_noise: Optional[ParameterNoise.Config] = None
        # If not None, computes summaries of tensors given to _add_tensor_stats().
        tensor_stats: Optional[TensorStats.Config] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self._config
        if cfg.param_init is not None:
            self._param_init = cfg.param_init.instantiate()
        elif parent is None or not isinstance(parent, BaseLayer):
            self._param_init = DefaultInitializer.default_config().instantiate()
        else:
            self._param_init = None
        self._param_noise = cfg.param_noise.instantiate() if cfg.param_noise is not None else None
        if cfg.tensor_stats is not None:
            self._add_child("tensor_stats", cfg.tensor_stats)
        self._remat_methods: list[str] = []  # Methods run under remat (for tests).

    def _methods_to_wrap_for_auto_child_context(self) -> dict[str, Callable]:
        return {
            name: fn
            for name, fn in super()._methods_to_wrap_for_auto_child_context().items()
            if not hasattr(BaseLayer, name)
        }

    def dtype(self) -> Any:
        """The parameter dtype: cfg.dtype, else the parent's, else float32."""
        if self._config.dtype is not None:
            return self._config.dtype
        if isinstance(self.parent, BaseLayer):
            return self.parent.dtype()
        return jnp.float32

    def param_init(self) -> param_init.Initializer:
        """The default initializer: this layer's cfg.param_init, else the nearest ancestor's."""
        if self._param_init is not None:
            return self._param_init
        return self.parent.param_init()

    @property
    def parameters(self) -> NestedTensor:
        """The layer's parameters (its state) in the current invocation."""
        return self.state

    # ----------------------------------------------------------------------------------------
    # Parameter specs and initialization.
    # ----------------------------------------------------------------------------------------

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        """Returns this layer's own parameters (not its children's). Subclasses override."""
        return {}

    def _compute_fan_axes(self, name: str, parameter_spec: ParameterSpec) -> Optional[FanAxes]:
        """Default fan axes: for "*weight" parameters, in = axis -2, out = axis -1.

        Raises:
            ValueError: For a weight with fewer than 2 axes (the layer must override this).
        """
        if parameter_spec.fan_axes is not None:
            return parameter_spec.fan_axes
        if not name.endswith("weight"):
            return None
        if len(parameter_spec.shape) < 2:
            raise ValueError(
                f"Default _compute_fan_axes needs >= 2 axes for {self.path()}/{name}, "
                f"shape {parameter_spec.shape}; override _compute_fan_axes or set fan_axes"
            )
        return FanAxes(in_axis=-2, out_axis=-1)

    def _complete_parameter_spec(self, name: str, spec: ParameterSpec) -> ParameterSpec:
        """Fills dtype, a PartitionSpec mesh_axes and fan_axes of a local parameter spec."""
        mesh_axes = spec.mesh_axes
        if mesh_axes is None:
            mesh_axes = (None,) * len(spec.shape)
        if len(mesh_axes) != len(spec.shape):
            raise ValueError(
                f"Parameter {self.path()}/{name}: partition spec {tuple(mesh_axes)} must have one "
                f"entry per axis of shape {tuple(spec.shape)}"
            )
        return dataclasses.replace(
            spec,
            dtype=spec.dtype if spec.dtype is not None else self.dtype(),
            mesh_axes=PartitionSpec(*mesh_axes),
            fan_axes=(
                spec.fan_axes
                if spec.fan_axes is not None
                else self._compute_fan_axes(name=name, parameter_spec=spec)
            ),
        )

    def _local_parameter_specs(self) -> dict[str, ParameterSpec]:
        specs = {}
        for name, spec in self._create_layer_parameter_specs().items():
            if name in self._children:
                raise ValueError(f"{self.path()}: parameter '{name}' clashes with a child name")
            specs[name] = self._complete_parameter_spec(name, spec)
        return specs

    def create_parameter_specs_recursively(self) -> NestedParameterSpec:
        """Returns the nested dict of completed ParameterSpecs of this layer and its descendants.

        Returns:
            {param_name: ParameterSpec, child_name: {...}, ...}; mesh_axes are PartitionSpecs.
        """
        specs: dict[str, Any] = dict(self._local_parameter_specs())
        for name, child in self._children.items():
            if isinstance(child, BaseLayer):
                specs[name] = child.create_parameter_specs_recursively()
        return specs

    def initialize_parameters_recursively(
        self, prng_key: Tensor, *, prebuilt: Optional[NestedTensor] = None
    ) -> NestedTensor:
        """Creates the parameters of this layer and its descendants.

        Args:
            prng_key: The root key, split through this layer's parameters (spec order) and then
                its children (child order), as AXLearn splits it.
            prebuilt: Optional tree (a prefix of the parameter tree) marking parameters that are
                provided elsewhere: where a leaf is an array, it is returned as is; where it is a
                ParameterSpec/TensorSpec, None is returned (the caller fills it in, e.g. from a
                checkpoint); elsewhere the parameter is initialized.

        Returns:
            The nested dict of parameters.
        """
        params: dict[str, Any] = {}
        for name, spec in self._local_parameter_specs().items():
            # The key is split for a prebuilt parameter too, so the others draw the same values.
            prng_key, param_key = jax.random.split(prng_key)
            value = get_or_none(prebuilt, name)
            if value is not None:
                params[name] = value if _is_array(value) else None
                continue
            params[name] = self._initialize_parameter(
                name, prng_key=param_key, parameter_spec=spec
            )
        for name, child in self._children.items():
            if not isinstance(child, BaseLayer):
                continue
            prng_key, child_key = jax.random.split(prng_key)
            params[name] = child.initialize_parameters_recursively(
                child_key, prebuilt=get_or_none(prebuilt, name)
            )
        return params

    def _initialize_parameter(
        self, name: str, *, prng_key: Tensor, parameter_spec: ParameterSpec
    ) -> Tensor:
        """Initializes one (completed) local parameter."""
        initializer = parameter_spec.initializer or self.param_init()
        value = initializer.initialize(
            name,
            prng_key=prng_key,
            shape=tuple(parameter_spec.shape),
            dtype=parameter_spec.dtype,
            axes=parameter_spec.fan_axes,
        )
        if tuple(value.shape) != tuple(parameter_spec.shape):
            raise ValueError(
                f"Initializer of {self.path()}/{name} returned shape {value.shape}, "
                f"expected {tuple(parameter_spec.shape)}"
            )
        return value.astype(parameter_spec.dtype)

    def apply_parameter_noise_recursively(
        self, prng_key: Tensor, params: NestedTensor
    ) -> NestedTensor:
        """Returns a copy of `params` with each layer's `param_noise` applied (children first)."""
        params = dict(params)
        for name, child in self._children.items():
            if not isinstance(child, BaseLayer):
                continue
            # As AXLearn: one split per child (in child order); the rest is this layer's key.
            prng_key, child_key = jax.random.split(prng_key)
            if name in params:
                params[name] = child.apply_parameter_noise_recursively(child_key, params[name])
        if self._param_noise is not None:
            params = self._param_noise.apply(prng_key, params)
        return params

    # ----------------------------------------------------------------------------------------
    # Invocation: remat, names for remat policies, tensor stats.
    # ----------------------------------------------------------------------------------------

    def _call_thunk(self, *args, method_fn: Callable, **kwargs) -> Callable[[], Any]:
        nullary = super()._call_thunk(*args, method_fn=method_fn, **kwargs)
        remat_spec = self._config.remat_spec
        if (
            remat_spec is None
            or current_context() is None
            or getattr(method_fn, "_no_remat", False)
            or not self.is_training
        ):
            return nullary

        def nullary_with_remat():
            context = self.get_invocation_context()
            leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
            is_array = [_is_array(leaf) for leaf in leaves]

            def fn(state, prng_key, *array_leaves):
                it = iter(array_leaves)
                full = [next(it) if a else leaf for leaf, a in zip(leaves, is_array)]
                fn_args, fn_kwargs = jax.tree_util.tree_unflatten(treedef, full)
                collection = new_output_collection()
                with child_context(
                    "remat",
                    module=self,
                    state=state,
                    prng_key=prng_key,
                    output_collection=collection,
                ):
                    outputs = method_fn(self, *fn_args, **fn_kwargs)
                return outputs, collection

            logging.log_first_n(
                logging.INFO, "Applying remat on %s.%s", 10, self.path(), method_fn.__name__
            )
            self._remat_methods.append(method_fn.__name__)
            remat_fn = jax.checkpoint(
                fn,
                prevent_cse=remat_spec.prevent_cse,
                policy=maybe_instantiate(remat_spec.policy),
            )
            outputs, collection = remat_fn(
                context.state,
                context.prng_key,
                *[leaf for leaf, a in zip(leaves, is_array) if a],
            )
            context.output_collection.update(collection)
            return outputs

        return nullary_with_remat

    def _remat_name(self, x: Tensor, name: str) -> Tensor:
        """Tags `x` as f"{ClassName}.{name}" for remat policies (a no-op otherwise)."""
        return jax.ad_checkpoint.checkpoint_name(x, f"{type(self).__name__}.{name}")

    def _add_activation_summary(
        self, *, name: str, activations: Tensor, activation_paddings: Optional[Tensor] = None
    ) -> None:
        """Adds "activations/{name}_mean" and "activations/{name}_norm" summaries.

        Frames are `activations[b]` (no paddings) or `activations[b, t]` with
        `activation_paddings` [batch, time] (1 = padding; padded frames are left out). The mean is
        that of all valid entries; the norm is the mean over valid frames of each frame's RMS
        over its remaining axes. Both are WeightedScalars weighted by the number of valid frames.

        Args:
            name: The activation's name.
            activations: [batch, ...] or [batch, time, ...] with paddings.
            activation_paddings: Optional [batch, time] paddings.
        """
        x = jnp.asarray(activations, jnp.float32)
        if activation_paddings is None:
            frames = x.reshape(x.shape[0], -1)
            valid = jnp.ones(frames.shape[:1], jnp.float32)
        else:
            frames = x.reshape(x.shape[0], x.shape[1], -1)
            valid = jnp.logical_not(jnp.asarray(activation_paddings).astype(bool))
            valid = valid.astype(jnp.float32)
        frame_size = frames.shape[-1]
        num_frames = valid.sum()
        denominator = jnp.maximum(1.0, num_frames)
        mean = (frames.sum(-1) * valid).sum() / denominator / frame_size
        frame_rms = jnp.sqrt((frames**2).sum(-1) / frame_size)
        norm = (frame_rms * valid).sum() / denominator
        self.add_summary(f"activations/{name}_mean", WeightedScalar(mean, num_frames))
        self.add_summary(f"activations/{name}_norm", WeightedScalar(norm, num_frames))

    def _add_tensor_stats(self, name: str, value: Nested[Tensor]) -> None:
        """Adds cfg.tensor_stats summaries of `value` under summaries["tensor_stats"][name]."""
        if "tensor_stats" not in self.children:
            return
        collection = new_output_collection()
        with child_context("tensor_stats", output_collection=collection):
            with child_context(name, module=self.tensor_stats):
                self.tensor_stats.add_stats(name, value)
        summaries = self.get_invocation_context().output_collection.summaries
        summaries.setdefault("tensor_stats", {})[name] = collection.summaries[name]


# --------------------------------------------------------------------------------------------
# Sharded initialization.
# --------------------------------------------------------------------------------------------


def parameter_partition_specs(specs: NestedParameterSpec) -> Nested[PartitionSpec]:
    """Returns the tree of PartitionSpecs (`mesh_axes`) of a tree of ParameterSpecs."""
    return jax.tree.map(
        lambda s: s.mesh_axes, specs, is_leaf=lambda x: isinstance(x, ParameterSpec)
    )


def sharded_parameter_init_fn(
    layer: BaseLayer,
    *,
    mesh: jax.sharding.Mesh,
    prebuilt: Optional[NestedTensor] = None,
) -> Callable[[Tensor], NestedTensor]:
    """Returns `jax.jit(layer.initialize_parameters_recursively, out_shardings=...)`.

    The output shardings are the NamedShardings of the layer's parameter partition specs on
    `mesh`, so XLA computes each parameter shard on its own device: no device ever holds a whole
    sharded parameter. Call the result with the root PRNG key.

    Args:
        layer: The root layer.
        mesh: The device mesh; partition specs must name its axes.
        prebuilt: See `BaseLayer.initialize_parameters_recursively`; only spec (not array)
            leaves are allowed here, and their outputs are None.

    Returns:
        The jitted init function: prng_key -> nested dict of sharded parameters.

    Raises:
        ValueError: If a partition spec names an axis not in `mesh`, or prebuilt has arrays.
    """
    specs = layer.create_parameter_specs_recursively()
    shardings = partition_spec_to_named_sharding(mesh, parameter_partition_specs(specs))
    if prebuilt is not None:
        for path, value in flatten_items(prebuilt):
            if _is_array(value):
                raise ValueError(f"sharded_parameter_init_fn: prebuilt {path} is an array")
        shardings = jax.tree.map(
            lambda s, p: None if p is not None else s,
            shardings,
            _prefix_tree(prebuilt, shardings),
            is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
        )

    def init(prng_key: Tensor) -> NestedTensor:
        return layer.initialize_parameters_recursively(prng_key, prebuilt=prebuilt)

    return jax.jit(init, out_shardings=shardings)


def initialize_parameters_on_mesh(
    layer: BaseLayer,
    prng_key: Tensor,
    *,
    mesh: jax.sharding.Mesh,
    prebuilt: Optional[NestedTensor] = None,
) -> NestedTensor:
    """Initializes `layer`'s parameters directly sharded on `mesh` (see sharded_parameter_init_fn).

    Args:
        layer: The root layer.
        prng_key: The root key.
        mesh: The device mesh.
        prebuilt: See `sharded_parameter_init_fn`.

    Returns:
        The nested dict of sharded parameters (None where prebuilt).
    """
    return sharded_parameter_init_fn(layer, mesh=mesh, prebuilt=prebuilt)(prng_key)


def _prefix_tree(prefix: Optional[NestedTensor], full: Any) -> Any:
    """Expands `prefix` (None where absent) to the structure of `full` (dicts only)."""
    if isinstance(full, dict):
        return {k: _prefix_tree(get_or_none(prefix, k), v) for k, v in full.items()}
    return prefix


# --------------------------------------------------------------------------------------------
# Initializer dumps (`_init.txt`).
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ParamInitSpec:
    """What initializes one parameter: used for `_init.txt` dumps."""

    # The parameter shape, as declared by the layer.
    shape: Optional[Sequence[int]]
    # The initializer that will create it.
    initializer: param_init.Initializer
    # Its fan axes.
    fan_axes: Optional[FanAxes]


def read_param_init_specs_recursively(
    layer: BaseLayer,
    *,
    delegates: Optional[dict[str, Callable[[BaseLayer], NestedParameterSpec]]] = None,
) -> Nested[ParamInitSpec]:
    """Returns {path...: ParamInitSpec} for each parameter of `layer` and its descendants.

    Walks the module tree and reads each layer's own `_create_layer_parameter_specs()`, so layers
    that stack their children's parameters (repeat) report the per-layer shapes.

    Args:
        layer: The root layer.
        delegates: Optional {child path (dotted, relative to `layer`): fn(child) -> nested
            ParamInitSpec} to override how a subtree is read.

    Returns:
        The nested dict of ParamInitSpec.
    """
    delegates = delegates or {}

    def visit(node: BaseLayer, rel_path: str) -> dict[str, Any]:
        if rel_path in delegates:
            return delegates[rel_path](node)
        out: dict[str, Any] = {}
        for name, spec in node._create_layer_parameter_specs().items():  # pylint: disable=protected-access
            fan_axes = spec.fan_axes
            if fan_axes is None:
                fan_axes = node._compute_fan_axes(name=name, parameter_spec=spec)  # pylint: disable=protected-access
            out[name] = ParamInitSpec(
                shape=spec.shape,
                initializer=spec.initializer or node.param_init(),
                fan_axes=fan_axes,
            )
        for name, child in node.children.items():
            if isinstance(child, BaseLayer):
                out[name] = visit(child, f"{rel_path}.{name}" if rel_path else name)
        return out

    return visit(layer, "")


def param_init_debug_string(layer: BaseLayer, *, field_separator: str = "\n") -> str:
    """Returns the `_init.txt` dump: one `path: <initializer description>` line per parameter.

    Example line:
    `decoder/emb/token_emb/weight: normal(0, 1.0 / fan_out), shape=[32, 8], axes=FanAxes(...)`

    Args:
        layer: The root layer.
        field_separator: Between lines (the result ends with it).

    Returns:
        The dump.
    """
    lines = []

    # Walk in creation order (a layer's own parameters, then its children), not sorted order.
    def visit(tree: dict[str, Any], prefix: str):
        for name, value in tree.items():
            path = f"{prefix}/{name}" if prefix else name
            if isinstance(value, ParamInitSpec):
                desc = value.initializer.debug_string(
                    name=name, shape=value.shape, axes=value.fan_axes
                )
                lines.append(f"{path}: {desc}")
            else:
                visit(value, path)

    visit(read_param_init_specs_recursively(layer), "")
    return "".join(line + field_separator for line in lines)
