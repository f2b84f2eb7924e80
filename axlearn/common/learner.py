"""The learner: computes gradients of a loss and applies optimizer updates to the parameters.

A `Learner` owns the optimizer (a `PartitionedGradientTransformation`), optional Polyak averaging
of the parameters (`ema`), per-parameter update rules (freeze parameters, or allow only optimizer
or only state updates, by path regex), optional gradient accumulation
(`forward_fn_transformation`) and optional float16 dynamic loss scaling (`loss_scaler`).

The API a trainer uses (see trainer.py):

    state_specs = learner.create_state_partition_specs(model_param_specs)
    state = learner.init(opt_params)                 # opt_params: tree of OptParam
    (fwd_bwd, collection) = functional(
        learner, method="forward_and_backward", prng_key=key, state=state, is_training=True,
        inputs=dict(fn=loss_fn, opt_params=opt_params, inputs=dict(input_batch=..., ...)))
    fwd_bwd.forward_outputs.loss / .aux / .output_collection   # from loss_fn
    fwd_bwd.backward_outputs.updated_params                   # the new parameters
    collection.state_updates                                  # the new learner state (whole)
    collection.summaries       # optimizer/learning_rate, optimizer/gradient_norm, loss_scale/...

`loss_fn(*, model_params, inputs) -> ForwardOutputs(loss, aux, output_collection)`; the learner
differentiates `loss` with respect to `model_params` (the values of `opt_params`).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Sequence
from typing import Any, Callable, Mapping, Optional, Union

import jax
import optax
from jax import numpy as jnp

from axlearn.common.config import (
    REQUIRED,
    ConfigOr,
    InstantiableConfig,
    Required,
    config_class,
    config_for_function,
    maybe_instantiate,
)
from axlearn.common.learner_base import LearnerModule
from axlearn.common.learner_updates import (  # noqa: F401 (AXLearn's names)
    _apply_updates,
    _forward_and_grads,
    _split_gradients,
    _updates_from_forward,
    _value_and_grad,
)
from axlearn.common.module import (
    Module,
    child_context,
    functional,
    new_output_collection,
    nowrap,
)
from axlearn.common.optimizer_base import OptParam, PartitionedGradientTransformation
from axlearn.common.optimizers import global_norm, opt_params_from_specs, param_ema
from axlearn.common.per_param_settings import (
    L2_REGULARIZER_SCALE,
    LEARNER_UPDATE_TYPE,
    WEIGHT_DECAY_SCALE,
    collect_per_param_settings,
    register_per_param_settings,
)
from axlearn.common.per_param_settings import per_param_settings_text as settings_to_text
from axlearn.common.update_transformation import (  # noqa: F401 (re-exported)
    BackwardOutputs,
    ForwardBackwardOutputs,
    ForwardFn,
    ForwardOutputs,
    ForwardPass,
    Updates,
    UpdateTransformation,
    mask_tree,
)
from axlearn.common.utils import (
    Nested,
    Tensor,
    all_finite,
    flatten_items,
    get_recursively,
    tree_paths,
)


class UpdateType(enum.Enum):
    """Which updates a parameter receives (see `Learner.Config.update_rules`)."""

    # Frozen: no optimizer update (no gradient, no optimizer state) and no state update.
    NO_UPDATE = "no_update"
    # Only optimizer (gradient-based) updates.
    OPTIMIZERS = "optimizers"
    # Only state updates from the forward pass (e.g. moving statistics); no optimizer state.
    STATE_UPDATES = "state_updates"
    # Both (the default).
    ALL_UPDATES = "all_updates"


def should_update_with_optimizers(update_type: UpdateType) -> bool:
    """Whether `update_type` allows optimizer updates."""
    return update_type in (UpdateType.OPTIMIZERS, UpdateType.ALL_UPDATES)


def should_apply_state_updates(update_type: UpdateType) -> bool:
    """Whether `update_type` allows state updates."""
    return update_type in (UpdateType.STATE_UPDATES, UpdateType.ALL_UPDATES)


# Transforms a ForwardFn into another, e.g. `gradient_accumulation.with_minibatch_steps`.
ForwardFnTransformation = Callable[[ForwardFn], ForwardFn]


def _mask_tree(tree: Any, keep: Any) -> Any:
    """Replaces the leaves of `tree` where `keep` is False with None."""
    return jax.tree.map(lambda k, x: x if k else None, keep, tree)


def _tree_where(pred: Tensor, new: Any, old: Any) -> Any:
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), new, old)


class BaseLearner(LearnerModule):
    """The interface of learners (state specs and `init` as in `LearnerModule`)."""

    def update(self, updates: Updates) -> Nested[Tensor]:
        """Transforms `updates` and applies them to the parameters.

        Args:
            updates: The updates (parameters, gradients, forward-pass state updates).

        Returns:
            The updated parameter values. The new learner state is added as state updates.
        """
        raise NotImplementedError(type(self))

    def should_update_with_optimizers(self, model_params: Nested[Any]) -> Nested[bool]:
        """Whether each parameter receives optimizer (delta) updates, i.e. needs a gradient.

        Args:
            model_params: A tree of parameters (OptParams, arrays or specs).

        Returns:
            A tree of bools with the same structure.
        """
        raise NotImplementedError(type(self))

    @nowrap
    def handles_undefined_loss(self) -> bool:
        """Whether this learner skips a step whose loss is NaN/inf (so the trainer goes on).

        Returns:
            True if such a step leaves the parameters and the learner state unchanged.
        """
        return False

    def forward_and_backward(
        self, *, fn: ForwardFn, inputs: Any, opt_params: Nested[OptParam]
    ) -> ForwardBackwardOutputs:
        """Computes the loss and gradients of `fn` and updates `opt_params`.

        Args:
            fn: The loss function.
            inputs: Passed to `fn` (not differentiated).
            opt_params: The parameters.

        Returns:
            The forward outputs and the updated parameters. The new learner state is added as
            state updates, summaries as summaries.
        """
        raise NotImplementedError(type(self))


class Learner(BaseLearner):
    """The learner: optimizer, parameter EMA, update rules, gradient accumulation, loss scaling."""

    @config_class
    class Config(BaseLearner.Config):
        """Configures Learner."""

        # The optimizer: a config instantiating to a PartitionedGradientTransformation.
        optimizer: Required[InstantiableConfig] = REQUIRED
        # (param_path_regex, UpdateType) rules; the first full match decides a parameter's update
        # type (ALL_UPDATES if none matches). A rule matching no parameter is an error.
        update_rules: Sequence[tuple[str, Optional[UpdateType]]] = []
        # Polyak averaging of the parameters (see optimizers.param_ema); set `decay` to enable it.
        ema: InstantiableConfig = config_for_function(param_ema)
        # True: add param_rms/<path> and grad_rms/<path> summaries; a list of path prefixes: add
        # grad_norm/<prefix> summaries. Costs time every step.
        enable_per_variable_summaries: Union[bool, list[str]] = False
        # Optional transformation of the loss function, e.g. gradient accumulation
        # (`config_for_function(gradient_accumulation.with_minibatch_steps).set(steps=4)`).
        forward_fn_transformation: Optional[ConfigOr[ForwardFnTransformation]] = None
        # Optional dynamic loss scaling for float16 training (loss_scale.DynamicLossScaler).
        loss_scaler: Optional[InstantiableConfig] = None
        # True: a step whose loss is not finite (NaN/inf) leaves the parameters and the learner
        # state unchanged (the step is skipped); False: such a step is applied like any other.
        ignore_undefined_loss: bool = False

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        # Either a PartitionedGradientTransformation (the usual optimizers, called directly) or,
        # when cfg.optimizer configures an UpdateTransformation, the child module "optimizer".
        self._optimizer_module: Optional[UpdateTransformation] = None
        if isinstance(cfg.optimizer, UpdateTransformation.Config):
            self._optimizer_module = self._add_child("optimizer", cfg.optimizer)
        else:
            self.optimizer: PartitionedGradientTransformation = maybe_instantiate(cfg.optimizer)
            if not isinstance(self.optimizer, PartitionedGradientTransformation):
                raise ValueError(
                    f"{self.path()}.optimizer must instantiate to a "
                    "PartitionedGradientTransformation or configure an UpdateTransformation, "
                    f"got {type(self.optimizer)}"
                )
        self._ema: Optional[PartitionedGradientTransformation] = None
        if getattr(cfg.ema, "decay", None) is not None:
            self._ema = cfg.ema.instantiate()
        self._forward_fn_transformation = maybe_instantiate(cfg.forward_fn_transformation) or (
            lambda fn: fn
        )
        self._loss_scaler = maybe_instantiate(cfg.loss_scaler)
        for i, (regex, _) in enumerate(cfg.update_rules):
            try:
                re.compile(regex)
            except re.error as e:
                raise ValueError(
                    f"{self.path()}.update_rules[{i}]: bad regex {regex!r}: {e}"
                ) from e

    # ---------------------------------------------------------------------------------------
    # Update rules.
    # ---------------------------------------------------------------------------------------

    def _update_types(self, tree: Nested[Any]) -> Nested[UpdateType]:
        """The UpdateType of every leaf of `tree`, by path. Raises on rules matching nothing."""
        cfg = self.config
        paths = tree_paths(tree)
        all_paths = [p for _, p in flatten_items(paths)]
        for i, (regex, _) in enumerate(cfg.update_rules):
            if not any(re.fullmatch(regex, p) for p in all_paths):
                examples = ", ".join(all_paths[:5]) + (", ..." if len(all_paths) > 5 else "")
                raise ValueError(
                    f"{self.path()}.update_rules[{i}] {regex!r} matches no parameter "
                    f"(parameters: {examples})"
                )

        def update_type(path: str) -> UpdateType:
            for regex, value in cfg.update_rules:
                if re.fullmatch(regex, path):
                    return UpdateType.NO_UPDATE if value is None else UpdateType(value)
            return UpdateType.ALL_UPDATES

        return jax.tree.map(update_type, paths)

    @nowrap
    def handles_undefined_loss(self) -> bool:
        """Whether `ignore_undefined_loss` is set (see `BaseLearner.handles_undefined_loss`)."""
        return self.config.ignore_undefined_loss

    def should_update_with_optimizers(self, model_params: Nested[Any]) -> Nested[bool]:
        """Whether each parameter receives optimizer updates (and has optimizer state).

        Args:
            model_params: A tree of parameters (OptParams, arrays or specs).

        Returns:
            A tree of bools with the same structure.
        """
        return jax.tree.map(should_update_with_optimizers, self._update_types(model_params))

    def _optimizer_params(self, model_params: Nested[Any]) -> Nested[Any]:
        return _mask_tree(model_params, self.should_update_with_optimizers(model_params))

    # ---------------------------------------------------------------------------------------
    # State.
    # ---------------------------------------------------------------------------------------

    def create_state_partition_specs(self, model_param_specs: Nested[Any]) -> dict[str, Any]:
        optimizer_specs = self._optimizer_params(model_param_specs)
        if self._optimizer_module is not None:
            specs = dict(
                optimizer=self._optimizer_module.create_state_partition_specs(optimizer_specs)
            )
        else:
            specs = dict(optimizer=self.optimizer.partition(optimizer_specs))
        if self._ema is not None:
            specs["ema"] = self._ema.partition(model_param_specs)
        if self._loss_scaler is not None:
            specs["loss_scale"] = self._loss_scaler.partition()
        return specs

    def init(self, model_params: Nested[OptParam]) -> dict[str, Any]:
        register_per_param_settings(
            self._update_types(model_params), description=LEARNER_UPDATE_TYPE, path=self.path()
        )
        optimizer_params = self._optimizer_params(model_params)
        if self._optimizer_module is not None:
            state = dict(optimizer=self._optimizer_module.init(optimizer_params))
        else:
            state = dict(optimizer=self.optimizer.init(optimizer_params))
        if self._ema is not None:
            state["ema"] = self._ema.init(model_params)
        if self._loss_scaler is not None:
            state["loss_scale"] = self._loss_scaler.init()
        return state

    # ---------------------------------------------------------------------------------------
    # Updates.
    # ---------------------------------------------------------------------------------------

    def update(self, updates: Updates, *, is_valid_step: Optional[Tensor] = None) -> Nested[Tensor]:
        """Transforms `updates` with the optimizer and applies them to the parameters.

        Must run in the learner's invocation context (state = the learner state); the new
        learner state is added as state updates.

        Args:
            updates: `opt_params` (the parameters as OptParams), `delta_updates` (the gradients,
                None where a parameter gets no optimizer update) and `inplace_updates` (the
                forward pass's state updates, e.g. moving statistics: a nested dict of new
                values for a subset of the parameters, or None).
            is_valid_step: Optional scalar bool; when False the parameters and the learner state
                are left unchanged (e.g. a float16 overflow).

        Returns:
            The updated parameter values.
        """
        model_params = updates.opt_params
        gradients = updates.delta_updates
        state_updates = updates.inplace_updates if updates.inplace_updates is not None else {}
        cfg = self.config
        should_update = self.should_update_with_optimizers(model_params)
        values = jax.tree.map(lambda p: p.value, model_params)
        if cfg.enable_per_variable_summaries is True:
            for path, p in flatten_items(values):
                self.add_summary(f"param_rms/{path}", optax.safe_root_mean_squares(p, 1e-3))
            for path, g in flatten_items(gradients):
                self.add_summary(f"grad_rms/{path}", optax.safe_root_mean_squares(g, 1e-3))
        elif isinstance(cfg.enable_per_variable_summaries, (list, tuple)):
            for prefix in cfg.enable_per_variable_summaries:
                self.add_summary(
                    f"grad_norm/{prefix}", global_norm(get_recursively(gradients, prefix))
                )

        opt_params = _mask_tree(model_params, should_update)
        opt_grads = _mask_tree(gradients, should_update)
        old_opt_state = self.state["optimizer"]
        # The optimizer runs in a child context "optimizer", so its summaries are
        # `optimizer/learning_rate`, `optimizer/gradient_norm`, ... in the learner's collection.
        if self._optimizer_module is not None:
            transformed = self._optimizer_module(
                dataclasses.replace(
                    updates,
                    opt_params=opt_params,
                    delta_updates=opt_grads,
                    inplace_updates=state_updates,
                )
            )
            param_updates = transformed.delta_updates
            state_updates = transformed.inplace_updates
            opt_state = self._new_optimizer_state(old_opt_state)
        else:
            with child_context("optimizer", module=self, state=old_opt_state):
                param_updates, opt_state = self.optimizer.update(
                    opt_grads, old_opt_state, opt_params
                )
        new_values = jax.tree.map(
            lambda keep, v, u: (v + u).astype(v.dtype) if keep else v,
            should_update,
            values,
            param_updates,
        )
        new_values = self._apply_state_updates(new_values, state_updates)
        if is_valid_step is not None:
            new_values = _tree_where(is_valid_step, new_values, values)
            opt_state = _tree_where(is_valid_step, opt_state, old_opt_state)
        self.add_state_update("optimizer", opt_state)
        if self._ema is not None:
            _, ema_state = self._ema.update(
                {},
                self.state["ema"],
                jax.tree.map(
                    lambda p, v: dataclasses.replace(p, value=v), model_params, new_values
                ),
            )
            if is_valid_step is not None:
                ema_state = _tree_where(is_valid_step, ema_state, self.state["ema"])
            self.add_state_update("ema", ema_state)
        return new_values

    def _new_optimizer_state(self, old_state: Any) -> Any:
        """The optimizer module's state after its call: its state updates over `old_state`."""
        new_state = self.get_invocation_context().output_collection.state_updates.get(
            "optimizer", old_state
        )
        if isinstance(old_state, dict) and isinstance(new_state, dict):
            # A module that updates only some entries (add_state_update) keeps the others.
            new_state = {**old_state, **new_state}
        return new_state

    def _apply_state_updates(self, values: Nested[Tensor], state_updates: Any) -> Nested[Tensor]:
        """Replaces parameter values by forward-pass state updates where the rules allow it."""
        if not state_updates or not jax.tree.leaves(state_updates):
            return values
        allowed = dict(
            flatten_items(jax.tree.map(should_apply_state_updates, self._update_types(values)))
        )
        replacements = {}
        for path, value in flatten_items(state_updates):
            if path not in allowed:
                raise ValueError(
                    f"{self.path()}: state update {path!r} does not match any model parameter."
                )
            if allowed[path]:
                replacements[path] = value
        paths = tree_paths(values)
        return jax.tree.map(
            lambda path, v: replacements.get(path, v).astype(v.dtype), paths, values
        )

    def forward_and_backward(
        self, *, fn: ForwardFn, inputs: Any, opt_params: Nested[OptParam]
    ) -> ForwardBackwardOutputs:
        should_compute = self.should_update_with_optimizers(opt_params)
        values = jax.tree.map(lambda p: p.value, opt_params)
        scaler = self._loss_scaler
        scale_state = self.state["loss_scale"] if scaler is not None else None

        def scaled_fn(*, model_params, inputs):
            outputs = fn(model_params=model_params, inputs=inputs)
            if scaler is not None:
                # Differentiate the scaled loss; carry the unscaled one (it may be finite when
                # the scaled one overflows) alongside the aux outputs.
                outputs = outputs._replace(
                    loss=scaler.scale_loss(outputs.loss, scale_state),
                    aux=(outputs.aux, outputs.loss),
                )
            return outputs

        forward = self._forward_fn_transformation(scaled_fn)

        outputs, grads = _forward_and_grads(
            forward, values=values, inputs=inputs, should_compute=should_compute
        )

        is_valid_step = None
        if scaler is not None:
            aux, loss = outputs.aux
            outputs = outputs._replace(loss=loss, aux=aux)
            grads = scaler.unscale(grads, scale_state)
            is_valid_step = all_finite(grads)
            new_scale_state = scaler.update(
                scale_state, grads_finite=is_valid_step, loss_finite=jnp.isfinite(loss)
            )
            self.add_state_update("loss_scale", new_scale_state)
            self.add_summary("loss_scale/scale", new_scale_state.scale)
            self.add_summary("loss_scale/num_skipped_steps", new_scale_state.num_skipped_steps)
            self.add_summary("loss_scale/num_nan_steps", new_scale_state.num_nan_steps)
        if self.config.ignore_undefined_loss:
            loss_finite = jnp.isfinite(outputs.loss)
            is_valid_step = (
                loss_finite
                if is_valid_step is None
                else jnp.logical_and(is_valid_step, loss_finite)
            )
        updated = self.update(
            _updates_from_forward(
                fn,
                opt_params=opt_params,
                model_params=values,
                inputs=inputs,
                outputs=outputs,
                grads=grads,
            ),
            is_valid_step=is_valid_step,
        )
        return ForwardBackwardOutputs(
            forward_outputs=outputs, backward_outputs=BackwardOutputs(updated_params=updated)
        )


class CompositeLearner(BaseLearner):
    """Several sub-learners, each updating the parameters that `rules` assign to it.

    Each parameter belongs to exactly one sub-learner (the first rule whose regex fully matches
    its path). A sub-learner sees the whole parameter tree with the other sub-learners'
    parameters masked by `optax.MaskedNode()`, so its optimizer state covers only its own
    parameters. The learner state is `{<learner name>: <its state>, ["ema": ...]}`.

    Parameter EMA is kept by the composite learner (`ema`), not by the sub-learners. The
    composite runs the forward and backward pass itself and calls the sub-learners' `update`;
    sub-learners' `forward_fn_transformation` and `loss_scaler` are therefore not supported and
    rejected.
    """

    @config_class
    class Config(BaseLearner.Config):
        """Configures CompositeLearner."""

        # {name: Learner config}; names are module names ([a-z][a-z0-9_]*, not "ema").
        learners: Mapping[str, Learner.Config] = {}
        # (param_path_regex, learner name) pairs; the first full match assigns a parameter to a
        # learner. Every parameter must be assigned.
        rules: Required[Sequence[tuple[str, str]]] = REQUIRED
        # Polyak averaging of all the parameters (see Learner.Config.ema).
        ema: InstantiableConfig = config_for_function(param_ema)

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        for name, learner_cfg in cfg.learners.items():
            if name == "ema":
                raise ValueError(f"Sublearner name cannot be ema. ({self.path()}.learners)")
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(
                    f"{self.path()}.learners: sub-learner name {name!r} must match [a-z][a-z0-9_]*."
                )
            if getattr(learner_cfg.ema, "decay", None) is not None:
                raise ValueError(
                    f"Sublearner {name} ema decay is not None: "
                    f"{self.path()}.learners[{name!r}].ema.decay={learner_cfg.ema.decay}; "
                    f"set {self.path()}.ema instead."
                )
            for field in ("forward_fn_transformation", "loss_scaler"):
                if getattr(learner_cfg, field, None) is not None:
                    raise ValueError(
                        f"{self.path()}.learners[{name!r}].{field} is not supported in a "
                        "CompositeLearner (the composite runs forward and backward); got "
                        f"{getattr(learner_cfg, field)}"
                    )
            self._add_child(name, learner_cfg.clone(name=name))
        for i, (regex, name) in enumerate(cfg.rules):
            if name not in cfg.learners:
                raise ValueError(
                    f"{name} is not found in the known learners: {self.path()}.rules[{i}] "
                    f"({regex!r}, {name!r}); learners: {sorted(cfg.learners)}."
                )
            try:
                re.compile(regex)
            except re.error as e:
                raise ValueError(f"{self.path()}.rules[{i}]: bad regex {regex!r}: {e}") from e
        self._ema: Optional[PartitionedGradientTransformation] = None
        if getattr(cfg.ema, "decay", None) is not None:
            self._ema = cfg.ema.instantiate()

    def _learner_tree(self, params: Nested[Any]) -> Nested[str]:
        """The name of the sub-learner of every leaf of `params`. Raises on unassigned ones."""
        cfg = self.config

        def learner_name(path: str) -> str:
            for regex, name in cfg.rules:
                if re.fullmatch(regex, path):
                    return name
            raise ValueError(
                "Composite learner rules do not update all model params: parameter "
                f"{path!r} matches none of {self.path()}.rules "
                f"{[regex for regex, _ in cfg.rules]}."
            )

        return jax.tree.map(learner_name, tree_paths(params))

    def _sub_learner_params(self, tree: Nested[Any], learner_tree: Nested[str], name: str) -> Any:
        """`tree` with the parameters of sub-learners other than `name` masked out."""
        keep = jax.tree.map(lambda n: n == name, learner_tree)
        return mask_tree(tree, keep=keep, mask_value=optax.MaskedNode())

    def create_state_partition_specs(self, model_param_specs: Nested[Any]) -> dict[str, Any]:
        learner_tree = self._learner_tree(model_param_specs)
        specs = {
            name: getattr(self, name).create_state_partition_specs(
                self._sub_learner_params(model_param_specs, learner_tree, name)
            )
            for name in self.config.learners
        }
        if self._ema is not None:
            specs["ema"] = self._ema.partition(model_param_specs)
        return specs

    def init(self, model_params: Nested[OptParam]) -> dict[str, Any]:
        learner_tree = self._learner_tree(model_params)
        register_per_param_settings(learner_tree, description="learner_rule", path=self.path())
        state = {
            name: getattr(self, name).init(
                self._sub_learner_params(model_params, learner_tree, name)
            )
            for name in self.config.learners
        }
        if self._ema is not None:
            state["ema"] = self._ema.init(model_params)
        return state

    @nowrap
    def handles_undefined_loss(self) -> bool:
        """True if every sub-learner skips a step with an undefined loss (then this one does)."""
        return all(getattr(self, name).handles_undefined_loss() for name in self.config.learners)

    def should_update_with_optimizers(self, model_params: Nested[Any]) -> Nested[bool]:
        learner_tree = self._learner_tree(model_params)
        result = jax.tree.map(lambda _: False, learner_tree)
        for name in self.config.learners:
            sub = getattr(self, name).should_update_with_optimizers(
                self._sub_learner_params(model_params, learner_tree, name)
            )
            result = jax.tree.map(
                lambda n, new, old, name=name: new if n == name else old, learner_tree, sub, result
            )
        return result

    def update(self, updates: Updates, *, is_valid_step: Optional[Tensor] = None) -> Nested[Tensor]:
        """Lets each sub-learner update its own parameters (see `BaseLearner.update`).

        Args:
            updates: The updates of every parameter.
            is_valid_step: Optional scalar bool; when False no parameter, sub-learner state or
                EMA changes (each sub-learner is given it).

        Returns:
            The updated parameter values.
        """
        learner_tree = self._learner_tree(updates.opt_params)
        values = updates.param_values()
        updated = values
        for name in self.config.learners:
            keep = lambda tree, name=name: jax.tree.map(  # noqa: E731
                lambda n: n == name, self._learner_tree(tree)
            )
            sub_updates = (
                updates.mask(keep, fields=("inplace_updates",))
                if jax.tree.leaves(updates.inplace_updates)
                else updates
            )
            sub_updates = sub_updates.mask(
                lambda _, name=name: jax.tree.map(lambda n: n == name, learner_tree),
                fields=("opt_params", "delta_updates"),
            )
            sub_values = getattr(self, name).update(sub_updates, is_valid_step=is_valid_step)
            updated = jax.tree.map(
                lambda n, new, old, name=name: new if n == name else old,
                learner_tree,
                sub_values,
                updated,
            )
        if self._ema is not None:
            _, ema_state = self._ema.update(
                {},
                self.state["ema"],
                jax.tree.map(
                    lambda p, v: dataclasses.replace(p, value=v), updates.opt_params, updated
                ),
            )
            if is_valid_step is not None:
                ema_state = _tree_where(is_valid_step, ema_state, self.state["ema"])
            self.add_state_update("ema", ema_state)
        return updated

    def forward_and_backward(
        self, *, fn: ForwardFn, inputs: Any, opt_params: Nested[OptParam]
    ) -> ForwardBackwardOutputs:
        # The sub-learners are called again by `update`: ask them in a separate context.
        with child_context(
            "should_compute_gradients", module=self, output_collection=new_output_collection()
        ):
            should_compute = self.should_update_with_optimizers(opt_params)
        values = jax.tree.map(lambda p: p.value, opt_params)
        outputs, grads = _forward_and_grads(
            fn, values=values, inputs=inputs, should_compute=should_compute
        )
        # Every sub-learner skips a step with an undefined loss: skip it as one step.
        is_valid_step = jnp.isfinite(outputs.loss) if self.handles_undefined_loss() else None
        updated = self.update(
            _updates_from_forward(
                fn,
                opt_params=opt_params,
                model_params=values,
                inputs=inputs,
                outputs=outputs,
                grads=grads,
            ),
            is_valid_step=is_valid_step,
        )
        return ForwardBackwardOutputs(
            forward_outputs=outputs, backward_outputs=BackwardOutputs(updated_params=updated)
        )


def per_param_settings_records(
    learner: Learner, model_param_specs: Nested[Any]
) -> list[dict[str, Any]]:
    """Collects the per-parameter settings `learner` registers in `init` and one `update`.

    Runs them abstractly (`jax.eval_shape`, no compute), with zero gradients for the parameters
    the optimizers update, inside `functional(learner)` (root context "root", so the optimizer
    registers as "root.optimizer", as in AXLearn).

    Args:
        learner: The learner.
        model_param_specs: The model's parameter specs (shape, dtype, optional
            weight_decay_scale).

    Returns:
        The registrations: dicts with keys "description", "path" and "settings".
    """
    opt_params = opt_params_from_specs(model_param_specs)
    values = jax.tree.map(lambda p: p.value, opt_params)

    def init_and_update(values):
        params = jax.tree.map(lambda p, v: dataclasses.replace(p, value=v), opt_params, values)
        state = learner.init(params)
        grads = jax.tree.map(
            lambda keep, v: jnp.zeros_like(v) if keep else None,
            learner.should_update_with_optimizers(params),
            values,
        )
        return functional(
            learner,
            prng_key=None,
            state=state,
            inputs=dict(updates=Updates(opt_params=params, delta_updates=grads)),
            method="update",
            is_training=True,
        )

    with collect_per_param_settings() as records:
        jax.eval_shape(init_and_update, values)
    return records


def per_param_settings_text(
    learner: Learner,
    model_param_specs: Nested[Any],
    *,
    descriptions: Sequence[str] = (WEIGHT_DECAY_SCALE, L2_REGULARIZER_SCALE),
) -> str:
    """Dumps the per-parameter settings `learner` resolves, as `param/path: value` lines.

    The default descriptions give the weight-decay scales; ("update_scale",
    "learner_update_type") give update multipliers and update types. For AXLearn's golden
    `_regularizer.txt` format (with `====...` headers) see `golden_config.regularizer_text`.

    Args:
        learner: The learner.
        model_param_specs: The model's parameter specs (shape, dtype, optional
            weight_decay_scale).
        descriptions: Which settings to dump.

    Returns:
        The text (see `per_param_settings.per_param_settings_text`).
    """
    records = per_param_settings_records(learner, model_param_specs)
    return settings_to_text(records, descriptions)
