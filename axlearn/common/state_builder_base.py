"""The core of `axlearn.common.state_builder`: builders, converters and their combinators.

Import these names from `axlearn.common.state_builder` (they report that module as theirs).

A `Builder` maps a `Builder.State` (step, trainer state, the set of paths it built) to another.
It declares whether it reads a state of arrays (`StateType.TENSORS`: it runs after the trainer's
random initialization) or of specs (`StateType.TENSOR_SPECS`: it runs before it, and the
trainer initializes only the parameters it did not build).

A `Converter` maps between a target state (the run being initialized) and a source state (the
layout of the checkpoint being read) in two halves: `target_to_source` before the restore, and
`source_to_target` after it (with whatever it kept from the first half). `RestoreAndConvertBuilder`
runs a converter around a restoring builder.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import re
from collections.abc import Sequence
from typing import Any, Optional, Union

import jax
from absl import logging

from axlearn.common.checkpointer import CheckpointValidationType, check_state_structure
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.module import Module
from axlearn.common.utils import NestedTensor, NestedTensorSpec, Tensor, flatten_items, tree_paths


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def built_paths(tree: Any, *, tensors_only: bool = False) -> set[str]:
    """The "/"-joined paths of the leaves of `tree`.

    Args:
        tree: A trainer state (or any pytree).
        tensors_only: If True, only the paths of array leaves.

    Returns:
        The set of paths.
    """
    return {path for path, leaf in flatten_items(tree) if not tensors_only or _is_tensor(leaf)}


def is_dict(x: Any, has_key: Union[str, Sequence[str]]) -> bool:
    """Whether `x` is a dict holding every key of `has_key`.

    Args:
        x: Any value.
        has_key: One key or a sequence of keys.

    Returns:
        True if `x` is a dict with all the keys.
    """
    keys = [has_key] if isinstance(has_key, str) else list(has_key)
    return isinstance(x, dict) and all(key in x for key in keys)


def clone_tree(in_tree: Any) -> Any:
    """Copies the structure of `in_tree`: arrays are shared, other leaves are deep-copied.

    Arrays are immutable, so sharing them is safe; containers and other leaves (specs, ints,
    sets) are new objects, so mutating the copy leaves `in_tree` unchanged.

    Args:
        in_tree: A pytree (e.g. a trainer state or a `Builder.State`).

    Returns:
        The copy.
    """
    return jax.tree.map(lambda x: x if _is_tensor(x) else copy.deepcopy(x), in_tree)


@dataclasses.dataclass
class _BuilderState:
    """The state a `Builder` reads and returns (a pytree: `jax.tree.map` walks its fields)."""

    # The step of the state (None before the trainer's initialization).
    step: Optional[int]
    # The trainer state: a nested structure of Tensors, or of TensorSpecs.
    trainer_state: Union[NestedTensor, NestedTensorSpec]
    # The "/"-joined paths of `trainer_state` that the builders have built.
    built_keys: set[str]


jax.tree_util.register_dataclass(
    _BuilderState, data_fields=["step", "trainer_state", "built_keys"], meta_fields=[]
)


class Builder(Module):
    """Builds (part of) a trainer state, e.g. from another run's checkpoint."""

    class StateType(enum.Enum):
        """Which leaves a builder's input state holds."""

        # Arrays: the builder runs after the trainer's random initialization.
        TENSORS = "tensors"
        # TensorSpecs: the builder runs before it; what it leaves unbuilt is initialized.
        TENSOR_SPECS = "tensor_specs"

    @config_class
    class Config(Module.Config):
        """Configures Builder."""

    State = _BuilderState
    State.__qualname__ = "Builder.State"

    def input_state_type(self) -> Builder.StateType:
        """Returns whether `__call__` expects arrays or specs in `state.trainer_state`.

        Returns:
            The `Builder.StateType`.
        """
        raise NotImplementedError(type(self))

    def __call__(self, state: Builder.State) -> Builder.State:  # pylint: disable=arguments-differ
        """Builds the trainer state.

        Args:
            state: The input state; its leaves are arrays or specs, per `input_state_type()`.

        Returns:
            The built state.
        """
        raise NotImplementedError(type(self))


class ChainBuilder(Builder):
    """Applies builders one after another; checks the result's structure against the input's."""

    @config_class
    class Config(Builder.Config):
        """Configures ChainBuilder."""

        # The builders, applied in order.
        builders: Required[Sequence[Builder.Config]] = REQUIRED
        # How the output's leaf paths must match the input's; None: not checked.
        validation: Optional[CheckpointValidationType] = CheckpointValidationType.EXACT

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        if not self.config.builders:
            raise ValueError(f"{self.path()}: builders is empty (give at least one builder)")
        self._builders = [
            self._add_child(f"builder{i:03d}", builder_cfg)
            for i, builder_cfg in enumerate(self.config.builders)
        ]

    def input_state_type(self) -> Builder.StateType:
        """Returns the first builder's input state type.

        Returns:
            The `Builder.StateType`.
        """
        return self._builders[0].input_state_type()

    def __call__(self, state: Builder.State) -> Builder.State:
        """Applies the builders in order.

        Args:
            state: The input state.

        Returns:
            The last builder's output.

        Raises:
            ValueError: If the output's leaf paths do not match the input's (per `validation`).
        """
        validation = self.config.validation
        before = [(path, None) for path, _ in flatten_items(state.trainer_state)]
        for builder in self._builders:
            logging.info("%s: applying %s", self.path(), builder.path())
            state = builder(state)
        if validation is not None:
            after = [(path, None) for path, _ in flatten_items(state.trainer_state)]
            try:
                check_state_structure(before, after, validation=validation)
            except ValueError as e:
                raise ValueError(f"{self.path()}: {e}") from e
        return state


class Converter(Module):
    """Converts between a target (new) state layout and a source (e.g. legacy) one."""

    @config_class
    class Config(Module.Config):
        """Configures Converter."""

    def target_state_type(self) -> Builder.StateType:
        """Returns whether the target given to `target_to_source` holds arrays or specs.

        Returns:
            The `Builder.StateType`.
        """
        raise NotImplementedError(type(self))

    def target_to_source(self, target: Builder.State) -> tuple[Builder.State, Any]:
        """Turns the target state into the source layout (called first).

        Args:
            target: The state to convert (arrays or specs, per `target_state_type()`).

        Returns:
            (the source state, auxiliary data for `source_to_target`).
        """
        raise NotImplementedError(type(self))

    def source_to_target(self, source: Builder.State, aux: Any) -> Builder.State:
        """Turns a (restored) source state back into the target layout (called second).

        Args:
            source: The state to convert.
            aux: The auxiliary data `target_to_source` returned.

        Returns:
            The target state.
        """
        raise NotImplementedError(type(self))


class ChainConverter(Converter):
    """Applies converters in sequence: `target_to_source` in reverse order, then forward."""

    @config_class
    class Config(Converter.Config):
        """Configures ChainConverter."""

        # The converters; converters[0] is the closest to the target.
        converters: Required[Sequence[Converter.Config]] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._converters = [
            self._add_child(f"converter{i:03d}", converter_cfg)
            for i, converter_cfg in enumerate(self.config.converters)
        ]

    def target_state_type(self) -> Builder.StateType:
        """TENSORS if any converter needs arrays, else TENSOR_SPECS.

        Returns:
            The `Builder.StateType`.
        """
        kinds = [converter.target_state_type() for converter in self._converters]
        for kind in kinds:
            if kind not in (Builder.StateType.TENSORS, Builder.StateType.TENSOR_SPECS):
                raise ValueError(f"{self.path()}: unknown target state type {kind!r}")
        if Builder.StateType.TENSORS in kinds:
            return Builder.StateType.TENSORS
        return Builder.StateType.TENSOR_SPECS

    def target_to_source(self, target: Builder.State) -> tuple[Builder.State, Any]:
        """Applies each converter's `target_to_source`, last converter first.

        Args:
            target: The state to convert.

        Returns:
            (the source state, the list of the converters' auxiliary data).
        """
        auxes = []
        for converter in reversed(self._converters):
            target, aux = converter.target_to_source(target)
            auxes.append(aux)
        return target, auxes

    def source_to_target(self, source: Builder.State, aux: Any) -> Builder.State:
        """Applies each converter's `source_to_target`, first converter first.

        Args:
            source: The state to convert.
            aux: The list `target_to_source` returned (consumed).

        Returns:
            The target state.
        """
        for converter in self._converters:
            source = converter.source_to_target(source, aux.pop())
        return source


class MergeStateSelection(enum.StrEnum):
    """Which state a leaf comes from in `MergeStateConverter`."""

    # Keep the leaf of the target state (before the restore).
    TARGET = "TARGET"
    # Take the leaf of the source state (as restored).
    SOURCE = "SOURCE"


class MergeStateConverter(Converter):
    """Merges the restored state with the state before the restore, leaf by leaf.

    `selection_regexes` is a list of (regex, TARGET or SOURCE); the first regex that matches a
    leaf's path (`re.match`, from the start) picks where the leaf comes from; a leaf that no
    regex matches comes from the source (the restored state).
    """

    @config_class
    class Config(Converter.Config):
        """Configures MergeStateConverter."""

        # (regex, MergeStateSelection or its name) pairs, tried in order.
        selection_regexes: list[tuple[str, Union[str, MergeStateSelection]]] = []

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None):
        super().__init__(cfg, parent=parent)
        self.selection_regexes = [
            (re.compile(regex), MergeStateSelection(selection))
            for regex, selection in self.config.selection_regexes
        ]

    def _select(self, path: str, target: Any, source: Any) -> Any:
        for regex, selection in self.selection_regexes:
            if regex.match(path) is not None:
                return target if selection == MergeStateSelection.TARGET else source
        return source

    def target_state_type(self) -> Builder.StateType:
        """The target must hold arrays (they may be kept).

        Returns:
            `Builder.StateType.TENSORS`.
        """
        return Builder.StateType.TENSORS

    def target_to_source(self, target: Builder.State) -> tuple[Builder.State, Builder.State]:
        """Restores into the target's layout and keeps a copy of it.

        Args:
            target: The state before the restore.

        Returns:
            (target, a copy of target).
        """
        return target, clone_tree(target)

    def source_to_target(self, source: Builder.State, aux: Builder.State) -> Builder.State:
        """Picks each leaf from `source` (restored) or `aux` (the state before).

        Args:
            source: The restored state.
            aux: The state before the restore.

        Returns:
            The merged state (the source's step and built keys).
        """
        merged = jax.tree.map(
            self._select, tree_paths(aux.trainer_state), aux.trainer_state, source.trainer_state
        )
        return Builder.State(step=source.step, trainer_state=merged, built_keys=source.built_keys)


class RestoreAndConvertBuilder(Builder):
    """Restores a checkpoint of another layout: converts the target to it, restores, converts back.

    1. `converter.target_to_source` gives the state to restore into;
    2. `builder` restores it;
    3. `converter.source_to_target` gives the state in the target's layout, which must have the
       target's leaf paths and shapes.
    """

    @config_class
    class Config(Builder.Config):
        """Configures RestoreAndConvertBuilder."""

        # The builder that restores the source state.
        builder: Required[Builder.Config] = REQUIRED
        # The converter between the target and source layouts.
        converter: Required[Converter.Config] = REQUIRED

    @classmethod
    def spec_to_config(cls, spec: str) -> Config:
        """Returns a config whose builder is made from `spec` (see `get_builder`).

        Args:
            spec: The builder's spec, without the prefix.

        Returns:
            The config.
        """
        cfg = cls.default_config()
        cfg.builder = cfg.builder.klass.spec_to_config(spec)
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        self._add_child("builder", self.config.builder)
        self._add_child("converter", self.config.converter)

    def input_state_type(self) -> Builder.StateType:
        """The converter's target state type.

        Returns:
            The `Builder.StateType`.
        """
        return self.converter.target_state_type()

    def __call__(self, state: Builder.State) -> Builder.State:
        """Converts, restores and converts back.

        Args:
            state: The target state.

        Returns:
            The built state.

        Raises:
            ValueError: If the result's paths or shapes differ from the target's (naming them).
        """
        before = flatten_items(state.trainer_state)
        source, aux = self.converter.target_to_source(state)
        restored = self.builder(source)
        converted = self.converter.source_to_target(restored, aux)
        after = flatten_items(converted.trainer_state)
        before_keys = {path for path, _ in before}
        after_keys = {path for path, _ in after}
        if before_keys != after_keys:
            raise ValueError(
                f"{self.path()}: the converted state's paths differ from the target's: "
                f"only in the target: {sorted(before_keys - after_keys)}; "
                f"only in the converted state: {sorted(after_keys - before_keys)}"
            )
        after_values = dict(after)
        for path, value in before:
            shape, new_shape = _shape_of(value), _shape_of(after_values[path])
            if shape != new_shape:
                raise ValueError(
                    f"{self.path()}: shape mismatch for {path}: the target has {shape}, "
                    f"the converted state {new_shape}"
                )
        return converted


def _shape_of(value: Any) -> Optional[tuple]:
    shape = getattr(value, "shape", None)
    return None if shape is None else tuple(shape)


__all__ = [
    "Builder",
    "ChainBuilder",
    "ChainConverter",
    "Converter",
    "MergeStateConverter",
    "MergeStateSelection",
    "RestoreAndConvertBuilder",
    "built_paths",
    "clone_tree",
    "is_dict",
]
