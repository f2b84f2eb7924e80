"""Update transformations: modules that transform a model update (`Updates`) before it is applied.

An `Updates` value carries what a learner is about to apply to the parameters:

- `opt_params`: the parameters (`OptParam` leaves; masked entries are None or
  `optax.MaskedNode()`);
- `delta_updates`: additive updates (gradients before the optimizer, parameter deltas after it);
- `inplace_updates`: values that replace parameters (e.g. moving statistics from the forward
  pass); they take precedence over `delta_updates`;
- `forward_pass`: the named forward passes that produced the update (`"default"` for the loss).

An `UpdateTransformation` is a `Module` mapping `Updates` to `Updates` (e.g. an optimizer turning
gradients into parameter deltas). `Learner.Config.optimizer` accepts either a config of a
`PartitionedGradientTransformation` (the usual optimizers) or the config of an
`UpdateTransformation`; `WrappedPartitionedGradientTransformation` adapts the former to the latter.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, Callable, Literal, NamedTuple, Optional, Protocol, Union

import jax
import optax
from jax import numpy as jnp

from axlearn.common.config import (
    REQUIRED,
    ConfigOr,
    InstantiableConfig,
    Required,
    config_class,
    maybe_instantiate,
)
from axlearn.common.learner_base import LearnerModule
from axlearn.common.module import Module
from axlearn.common.optimizer_base import (
    OptParam,
    OptStateSpec,
    PartitionedGradientTransformation,
)
from axlearn.common.utils import (
    Nested,
    PartitionSpec,
    Tensor,
    TensorSpec,
    flatten_items,
    set_recursively,
    tree_paths,
)


class ForwardOutputs(NamedTuple):
    """What a loss function (ForwardFn) returns."""

    # The scalar to minimize.
    loss: Tensor
    # Auxiliary outputs (not differentiated).
    aux: Any
    # The model's OutputCollection (summaries, state_updates, module_outputs).
    output_collection: Any


class BackwardOutputs(NamedTuple):
    """What the backward pass and update produce."""

    # The model parameters after the update.
    updated_params: Nested[Tensor]


class ForwardBackwardOutputs(NamedTuple):
    """The result of `Learner.forward_and_backward`."""

    # The loss function's outputs (with the unscaled loss).
    forward_outputs: ForwardOutputs
    # The updated parameters.
    backward_outputs: BackwardOutputs


class ForwardFn(Protocol):
    """A loss function: `fn(*, model_params, inputs) -> ForwardOutputs`."""

    def __call__(self, *, model_params: Nested[Tensor], inputs: Any) -> ForwardOutputs: ...


def mask_tree(tree: Nested[Any], *, keep: Nested[bool], mask_value: Any) -> Nested[Any]:
    """Replaces the leaves of `tree` where `keep` is False by `mask_value`.

    Args:
        tree: A nested structure (OptParams, specs or tensors as leaves).
        keep: Bools; its structure must be a prefix of `tree`'s.
        mask_value: What masked leaves become (e.g. None or `optax.MaskedNode()`).

    Returns:
        The masked tree.
    """
    return jax.tree.map(lambda k, leaf: leaf if k else mask_value, keep, tree)


@dataclasses.dataclass(frozen=True)
class ForwardPass:
    """One invocation of a `ForwardFn` (a pytree; `forward_fn` is static)."""

    # The forward function.
    forward_fn: Callable
    # The inputs it was called with.
    inputs: Any
    # The parameter values it was called with.
    model_params: Nested[Tensor]
    # What it returned.
    outputs: ForwardOutputs


jax.tree_util.register_dataclass(
    ForwardPass, data_fields=["inputs", "model_params", "outputs"], meta_fields=["forward_fn"]
)

_UpdatesField = Literal["opt_params", "delta_updates", "inplace_updates", "forward_pass"]


@dataclasses.dataclass(frozen=True)
class Updates:
    """An update to the parameters, to be transformed and then applied (a pytree)."""

    # The parameters (OptParam leaves). `Learner` masks parameters without optimizer updates
    # with None; `CompositeLearner` masks other sub-learners' parameters with optax.MaskedNode().
    opt_params: Nested[Union[OptParam, optax.MaskedNode, None]]
    # Additive updates of (a subset of) `opt_params`: gradients, or deltas after an optimizer.
    delta_updates: Optional[Nested[Union[Tensor, optax.MaskedNode, None]]] = None
    # Replacement values of (a subset of) `opt_params`; take precedence over `delta_updates`.
    inplace_updates: Optional[Nested[Union[Tensor, optax.MaskedNode, None]]] = None
    # The named forward passes behind this update ("default": the loss function's).
    forward_pass: dict[str, ForwardPass] = dataclasses.field(default_factory=dict)

    def param_values(self) -> Nested[Tensor]:
        """Returns the values of `opt_params` (same structure, tensors as leaves)."""
        return jax.tree.map(
            lambda p: p.value, self.opt_params, is_leaf=lambda x: isinstance(x, OptParam)
        )

    def param_specs(self) -> Nested[TensorSpec]:
        """Returns the `ParameterSpec`s of `opt_params` (same structure).

        Each spec has the parameter's shape and dtype and its OptParam's `factorization_spec`
        (as `factorization`) and `weight_decay_scale`.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.base_layer import ParameterSpec  # base_layer imports module.

        return jax.tree.map(
            lambda p: ParameterSpec(
                shape=p.value.shape,
                dtype=p.value.dtype,
                factorization=p.factorization_spec,
                weight_decay_scale=p.weight_decay_scale,
            ),
            self.opt_params,
            is_leaf=lambda x: isinstance(x, OptParam),
        )

    def mask(
        self,
        keep: Callable[[Nested[Any]], Nested[bool]],
        *,
        fields: Sequence[_UpdatesField] = ("opt_params", "delta_updates", "inplace_updates"),
    ) -> Updates:
        """Returns a copy whose `fields` are masked with `optax.MaskedNode()`.

        Args:
            keep: Called on each field's value; returns bools whose structure is a prefix of the
                value's. Leaves where it is False are replaced by `optax.MaskedNode()`.
            fields: The fields to mask.

        Returns:
            The masked copy.

        Raises:
            NotImplementedError: If `fields` contains "forward_pass".
        """
        if "forward_pass" in fields:
            raise NotImplementedError("Updates.mask: masking forward_pass is not implemented.")
        replacements = {}
        for name in fields:
            value = getattr(self, name)
            replacements[name] = mask_tree(value, keep=keep(value), mask_value=optax.MaskedNode())
        return dataclasses.replace(self, **replacements)


jax.tree_util.register_dataclass(
    Updates,
    data_fields=["opt_params", "delta_updates", "inplace_updates", "forward_pass"],
    meta_fields=[],
)


class UpdateTransformation(LearnerModule):
    """A module transforming `Updates` (e.g. an optimizer turning gradients into deltas).

    Its state is the learner state entry it is given (`Learner` gives it `state["optimizer"]`).
    `create_state_partition_specs` and `init` are those of `LearnerModule`.
    """

    def transform_update(self, updates: Updates) -> Updates:
        """Returns the transformed `updates`; the new state is added as state updates.

        Args:
            updates: The updates to transform.

        Returns:
            The transformed updates.
        """
        raise NotImplementedError(type(self))

    def __call__(self, updates: Updates) -> Updates:
        """Alias of `transform_update`."""
        return self.transform_update(updates)


class WrappedPartitionedGradientTransformation(UpdateTransformation):
    """Adapts a `PartitionedGradientTransformation` to an `UpdateTransformation`.

    `transform_update` runs `transformation.update(delta_updates, state, opt_params)` and replaces
    `delta_updates` by its result; the whole state is replaced by the new optimizer state.
    """

    @config_class
    class Config(UpdateTransformation.Config):
        """Configures WrappedPartitionedGradientTransformation."""

        # The transformation: a PartitionedGradientTransformation or a config instantiating to one.
        transformation: Required[ConfigOr[PartitionedGradientTransformation]] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self.transformation: PartitionedGradientTransformation = maybe_instantiate(
            cfg.transformation
        )
        if not isinstance(self.transformation, PartitionedGradientTransformation):
            raise ValueError(
                f"{self.path()}.transformation must instantiate to a "
                f"PartitionedGradientTransformation, got {type(self.transformation)}"
            )

    def create_state_partition_specs(self, model_param_specs: Nested[Any]) -> Any:
        return self.transformation.partition(model_param_specs)

    def init(self, model_params: Nested[OptParam]) -> Any:
        return self.transformation.init(model_params)

    def transform_update(self, updates: Updates) -> Updates:
        param_updates, state = self.transformation.update(
            updates.delta_updates, self.state, updates.opt_params
        )
        # The state may be a tuple: replace the whole state update of this context.
        self.get_invocation_context().set_state_update(state)
        return dataclasses.replace(updates, delta_updates=param_updates)


class OverrideInplaceUpdateTransformation(WrappedPartitionedGradientTransformation):
    """Replaces the parameters matching `rules` by their gradients; optimizes the others.

    For a parameter whose path ("a/b/c") fully matches one of `rules`, the incoming
    `delta_updates` value (its "gradient") becomes its `inplace_updates` value, i.e. its next
    value, and its delta becomes zero; it gets no optimizer state. The other parameters go
    through `transformation` as in `WrappedPartitionedGradientTransformation`. Used for state
    carried through gradients, e.g. the fp8 scales and amax histories of
    `quantized_dot_general` (rules `.*/<name>` for `get_all_fp8_param_names()`).
    """

    @config_class
    class Config(WrappedPartitionedGradientTransformation.Config):
        """Configures OverrideInplaceUpdateTransformation."""

        # Regexes (re.fullmatch on "/"-joined parameter paths) of the parameters to replace.
        rules: Required[Sequence[str]] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None):
        super().__init__(cfg, parent=parent)
        for i, rule in enumerate(self.config.rules):
            try:
                re.compile(rule)
            except re.error as e:
                raise ValueError(f"{self.path()}.rules[{i}]: bad regex {rule!r}: {e}") from e

    def _is_override(self, tree: Nested[Any]) -> Nested[bool]:
        """True for the leaves of `tree` whose path matches one of the rules."""
        rules = self.config.rules
        return jax.tree.map(
            lambda path: any(re.fullmatch(rule, path) for rule in rules), tree_paths(tree)
        )

    def _passthrough(self, tree: Nested[Any]) -> Nested[Any]:
        """`tree` with the overridden leaves replaced by None."""
        return jax.tree.map(lambda o, x: None if o else x, self._is_override(tree), tree)

    def create_state_partition_specs(self, model_param_specs: Nested[Any]) -> Any:
        return super().create_state_partition_specs(self._passthrough(model_param_specs))

    def init(self, model_params: Nested[OptParam]) -> Any:
        return super().init(self._passthrough(model_params))

    def transform_update(self, updates: Updates) -> Updates:
        grads = updates.delta_updates
        override = self._is_override(grads)
        inner = super().transform_update(
            dataclasses.replace(
                updates,
                opt_params=self._passthrough(updates.opt_params),
                delta_updates=self._passthrough(grads),
            )
        )
        # Zero deltas for the overridden parameters (None where the optimizer returned None).
        deltas = jax.tree.map(
            lambda o, g, d: jax.numpy.zeros_like(g) if o else d,
            override,
            grads,
            inner.delta_updates,
            is_leaf=lambda x: x is None,
        )
        inplace = dict(flatten_items(updates.inplace_updates or {}))
        for (path, g), (_, o) in zip(flatten_items(grads), flatten_items(override)):
            if o:
                inplace[path] = g
        nested: dict[str, Any] = {}
        for path, value in inplace.items():
            set_recursively(nested, path=path, value=value)
        return dataclasses.replace(inner, delta_updates=deltas, inplace_updates=nested)


class _ShouldUpdateState(NamedTuple):
    """ConditionalUpdateTransformation's own state."""

    # The number of calls so far (the step given to `update_schedule`).
    count: Tensor


class ConditionalUpdateTransformation(UpdateTransformation):
    """Applies `inner`'s update only at the steps where `update_schedule(step)` is true.

    At every call `inner` runs (so the computation does not depend on the schedule); then, where
    `update_schedule(count)` is true, its deltas and new state are taken, and elsewhere the deltas
    are zeros and `inner`'s state stays as it was. `count` (the 0-based call number) is always
    incremented. The state is `{"should_update": _ShouldUpdateState(count), "inner": ...}`.

    `inner` may be the config of an UpdateTransformation or of a
    PartitionedGradientTransformation (wrapped by `WrappedPartitionedGradientTransformation`).
    Incoming `inplace_updates` are not supported (they would be applied on skipped steps too).
    """

    @config_class
    class Config(UpdateTransformation.Config):
        """Configures ConditionalUpdateTransformation."""

        # The wrapped transformation: an UpdateTransformation config, or the config of a
        # PartitionedGradientTransformation (e.g. config_for_function(adamw_optimizer)).
        inner: Required[InstantiableConfig] = REQUIRED
        # step (int32 scalar, 0-based) -> bool scalar: whether to apply the update; None: always.
        update_schedule: Optional[Callable[[Union[int, Tensor]], Union[bool, Tensor]]] = None

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        inner = cfg.inner
        if not isinstance(inner, UpdateTransformation.Config):
            inner = WrappedPartitionedGradientTransformation.default_config().set(
                transformation=inner
            )
        self.inner: UpdateTransformation = self._add_child("inner", inner)
        self._update_schedule = cfg.update_schedule or (lambda step: True)

    def create_state_partition_specs(self, model_param_specs: Nested[Any]) -> Any:
        return dict(
            should_update=_ShouldUpdateState(
                count=OptStateSpec(shape=[], dtype=jnp.int32, mesh_axes=PartitionSpec())
            ),
            inner=self.inner.create_state_partition_specs(model_param_specs),
        )

    def init(self, model_params: Nested[OptParam]) -> Any:
        return dict(
            should_update=_ShouldUpdateState(count=jnp.zeros([], jnp.int32)),
            inner=self.inner.init(model_params),
        )

    def transform_update(self, updates: Updates) -> Updates:
        inplace = [
            path
            for path, v in flatten_items(updates.inplace_updates or {})
            if not isinstance(v, optax.MaskedNode)
        ]
        if inplace:
            raise NotImplementedError(
                f"{self.path()}: inplace_updates are not supported by "
                f"ConditionalUpdateTransformation (got {inplace}); move the state updates into "
                "another (sub-)learner."
            )
        count = self.state["should_update"].count
        apply = jnp.asarray(self._update_schedule(count), dtype=bool)
        prev_state = self.state["inner"]
        new_updates = self.inner(updates)
        new_state = self.get_invocation_context().get_state_updates().get("inner", prev_state)
        if isinstance(prev_state, dict) and isinstance(new_state, dict):
            # A transformation updating only some entries keeps the others.
            new_state = {**prev_state, **new_state}

        def pick(new, old):
            return jnp.where(apply, new, old)

        zeros = jax.tree.map(jnp.zeros_like, new_updates.delta_updates)
        deltas = jax.tree.map(pick, new_updates.delta_updates, zeros)
        state = jax.tree.map(pick, new_state, prev_state)
        self.add_state_update(
            "should_update", _ShouldUpdateState(optax.safe_int32_increment(count))
        )
        self.add_state_update("inner", state)
        return dataclasses.replace(new_updates, delta_updates=deltas)
