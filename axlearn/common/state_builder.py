"""State builders: produce a trainer (or inference) state, e.g. by restoring a checkpoint.

A `Builder` maps a `Builder.State` (a step, a state tree and the set of paths built so far) to
another. Its `input_state_type` says whether it expects the tree's leaves to be tensors or
`TensorSpec`s (the shapes, dtypes and mesh axes of a state not yet allocated).

This module holds the builders `InferenceRunner` restores its state with:
- `TensorStoreStateStorageBuilder` reads one step directory of a `TensorStoreStateStorage`
  checkpoint into the given specs (with a `CheckpointValidationType`: e.g. the checkpoint may
  hold more than the target, such as optimizer state, and its dtypes may differ);
- `ChainBuilder` applies a sequence of builders in turn (e.g. one per encoder of a dual encoder),
  checking that the tree's paths are unchanged;
- `RestoreAndConvertBuilder` restores through a `Converter`, which maps the target state to the
  state the checkpoint holds and the restored state back (`EmaParamsConverter`: the model
  parameters are read from the learner's EMA of them).
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common.checkpointer import (
    CheckpointValidationType,
    StateStorage,
    TensorStoreStateStorage,
    check_state_structure,
    parse_step_from_dir,
    step_dir_name,
)
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.module import Module
from axlearn.common.optimizers import ParamEmaState
from axlearn.common.utils import NestedTensor, Tensor, TensorSpec, flatten_items


class Builder(Module):
    """Builds a state tree (abstract): see the module docstring."""

    class StateType(enum.Enum):
        """The kind of leaves a builder expects in `State.trainer_state`."""

        TENSORS = "tensors"
        TENSOR_SPECS = "tensor_specs"

    @config_class
    class Config(Module.Config):
        """Configures Builder."""

    @dataclass
    class State:
        """The state a builder reads and returns."""

        # The step of the state.
        step: int
        # The state tree: Tensors or TensorSpecs as leaves (see `input_state_type`).
        trainer_state: Any
        # The paths of `trainer_state` built so far.
        built_keys: set[str]

    def input_state_type(self) -> Builder.StateType:
        """The kind of leaves `__call__` expects.

        Returns:
            `StateType.TENSORS` or `StateType.TENSOR_SPECS`.
        """
        raise NotImplementedError(type(self))

    # pylint: disable-next=arguments-differ
    def __call__(self, state: Builder.State) -> Builder.State:
        """Builds a state from `state`.

        Args:
            state: The input state (leaves of the kind `input_state_type` names).

        Returns:
            The built state.
        """
        raise NotImplementedError(type(self))


class Converter(Module):
    """Maps a target state to the (e.g. legacy) state a checkpoint holds, and back (abstract)."""

    @config_class
    class Config(Module.Config):
        """Configures Converter."""

    def target_state_type(self) -> Builder.StateType:
        """The kind of leaves `target_to_source` expects in its target.

        Returns:
            `StateType.TENSORS` or `StateType.TENSOR_SPECS`.
        """
        raise NotImplementedError(type(self))

    def target_to_source(self, target: Builder.State) -> tuple[Builder.State, Any]:
        """Maps the target state to the source (checkpoint) state; called first.

        Args:
            target: The target state.

        Returns:
            (the source state, auxiliary data for `source_to_target`).
        """
        raise NotImplementedError(type(self))

    def source_to_target(self, source: Builder.State, aux: Any) -> Builder.State:
        """Maps a restored source state back to the target state; called second.

        Args:
            source: The restored source state.
            aux: What `target_to_source` returned with the source.

        Returns:
            The target state.
        """
        raise NotImplementedError(type(self))


def clone_tree(in_tree: NestedTensor) -> NestedTensor:
    """Copies a tree: Tensors by reference (they are immutable), other leaves deeply.

    Args:
        in_tree: The tree.

    Returns:
        The copy.
    """
    return jax.tree.map(lambda x: x if isinstance(x, Tensor) else copy.deepcopy(x), in_tree)


def _shape_of(x: Any) -> tuple:
    return tuple(getattr(x, "shape", ()))


class ChainBuilder(Builder):
    """Applies `builders` in order, each to the previous one's output state."""

    @config_class
    class Config(Builder.Config):
        """Configures ChainBuilder."""

        # The builders, applied first to last (the first one's input_state_type is the chain's).
        builders: Required[Sequence[Builder.Config]] = REQUIRED
        # How the output tree's paths must match the input's (None: not checked).
        validation: Optional[CheckpointValidationType] = CheckpointValidationType.EXACT

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not cfg.builders:
            raise ValueError(f"{self.path()}: builders is empty")
        self._builders = [
            self._add_child(f"builder{i:03d}", builder_cfg)
            for i, builder_cfg in enumerate(cfg.builders)
        ]

    def input_state_type(self) -> Builder.StateType:
        """The first builder's input state type (see `Builder.input_state_type`)."""
        return self._builders[0].input_state_type()

    def __call__(self, state: Builder.State) -> Builder.State:
        """Runs the builders in turn (see `Builder.__call__`).

        Raises:
            ValueError: If `validation` is set and the output's paths do not match the input's.
        """
        cfg = self.config
        before = [(key, None) for key, _ in flatten_items(state.trainer_state)]
        for builder in self._builders:
            state = builder(state)
        if cfg.validation is not None:
            after = [(key, None) for key, _ in flatten_items(state.trainer_state)]
            try:
                check_state_structure(after, before, validation=cfg.validation)
            except ValueError as e:
                raise ValueError(f"{self.path()}: {e}") from e
        return state


class RestoreAndConvertBuilder(Builder):
    """Restores with `builder` the state `converter` maps the target to, then maps it back."""

    @config_class
    class Config(Builder.Config):
        """Configures RestoreAndConvertBuilder."""

        # The builder restoring the source state (e.g. a TensorStoreStateStorageBuilder).
        builder: Required[Builder.Config] = REQUIRED
        # The converter between the target and the source state.
        converter: Required[Converter.Config] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("builder", cfg.builder)
        self._add_child("converter", cfg.converter)

    def input_state_type(self) -> Builder.StateType:
        """The converter's target state type (see `Builder.input_state_type`)."""
        return self.converter.target_state_type()

    def __call__(self, state: Builder.State) -> Builder.State:
        """Converts, restores and converts back (see `Builder.__call__`).

        Raises:
            ValueError: If the result's paths or shapes differ from the input's.
        """
        source, aux = self.converter.target_to_source(state)
        restored = self.builder(source)
        converted = self.converter.source_to_target(restored, aux)
        before = flatten_items(state.trainer_state)
        after = flatten_items(converted.trainer_state)
        if [k for k, _ in before] != [k for k, _ in after]:
            raise ValueError(
                f"{self.path()}: the converted state's paths differ from the target's: "
                f"target-only {sorted({k for k, _ in before} - {k for k, _ in after})}, "
                f"converted-only {sorted({k for k, _ in after} - {k for k, _ in before})}"
            )
        for (key, x), (_, y) in zip(before, after):
            if _shape_of(x) != _shape_of(y):
                raise ValueError(
                    f"{self.path()}: shape of {key}: target {_shape_of(x)}, converted "
                    f"{_shape_of(y)}"
                )
        return converted


# pylint: disable-next=abstract-method
class BaseStateStorageBuilder(Builder):
    """Restores a state from a checkpoint (abstract)."""

    @config_class
    class Config(Builder.Config):
        """Configures BaseStateStorageBuilder."""

        # The trainer's checkpoint directory (holding one `step_%08d` dir per step); with `step`.
        base_dir: Optional[str] = None
        # The step under `base_dir` to restore.
        step: Optional[int] = None
        # How strictly the target must match the checkpoint.
        validation: CheckpointValidationType = CheckpointValidationType.EXACT
        # GB of reads in flight at most.
        concurrent_gb: int = 32

    def input_state_type(self) -> Builder.StateType:
        """TENSOR_SPECS: the target's shapes, dtypes and mesh axes."""
        return Builder.StateType.TENSOR_SPECS


class TensorStoreStateStorageBuilder(BaseStateStorageBuilder):
    """Restores a state from one step of a `TensorStoreStateStorage` checkpoint."""

    # The prefix of a builder spec string (`spec_to_config`).
    SPEC_PREFIX = "tensor_store_state_storage:"

    @config_class
    class Config(BaseStateStorageBuilder.Config):
        """Configures TensorStoreStateStorageBuilder: `dir`, or `base_dir` and `step`."""

        # One step's checkpoint directory (e.g. `.../checkpoints/step_00001000`).
        dir: Optional[str] = None
        # The storage that reads it.
        storage: StateStorage.Config = TensorStoreStateStorage.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not (cfg.dir is None) ^ (cfg.base_dir is None and cfg.step is None):
            raise ValueError(
                f"{self.path()}: Error in config. You must either specify dir or base_dir and "
                f"step (got dir={cfg.dir}, base_dir={cfg.base_dir}, step={cfg.step})."
            )
        if cfg.base_dir is not None and cfg.step is None:
            raise ValueError(f"{self.path()}: base_dir={cfg.base_dir} needs a step.")

    @classmethod
    def spec_to_config(cls, spec: str) -> Config:
        """The config restoring the step directory `spec`.

        Args:
            spec: A step directory.

        Returns:
            The config with `dir=spec`.
        """
        return cls.default_config().set(dir=spec)

    def __call__(self, state: Builder.State) -> Builder.State:
        """Restores `state.trainer_state` (TensorSpecs) from the checkpoint.

        Args:
            state: The target state.

        Returns:
            The restored state at the checkpoint's step; every restored path is built.
        """
        cfg = self.config
        if cfg.base_dir is not None:
            ckpt_dir = f"{cfg.base_dir.rstrip('/')}/{step_dir_name(cfg.step)}"
            step = cfg.step
        else:
            ckpt_dir = cfg.dir
            step = parse_step_from_dir(cfg.dir)
        storage_cfg = cfg.storage.clone()
        if "max_concurrent_restore_gb" in storage_cfg.keys():
            storage_cfg.max_concurrent_restore_gb = cfg.concurrent_gb
        storage = storage_cfg.instantiate()
        restored = storage.restore_from_dir(
            step, state.trainer_state, ckpt_dir=ckpt_dir, validation=cfg.validation
        )
        built = state.built_keys | {key for key, _ in flatten_items(restored)}
        return Builder.State(step=step, trainer_state=restored, built_keys=built)


class EmaParamsConverter(Converter):
    """Restores the model parameters from the learner's EMA of them (`ParamEmaState`).

    The target state is a NamedTuple with `prng_key`, `model` and `learner` fields (a trainer
    or inference runner state). The checkpoint's optimizer state and raw model parameters are
    not read.
    """

    def target_state_type(self) -> Builder.StateType:
        """TENSOR_SPECS (see `Converter.target_state_type`)."""
        return Builder.StateType.TENSOR_SPECS

    def target_to_source(self, target: Builder.State) -> tuple[Builder.State, Any]:
        """A source holding only `learner/ema` (shaped as the target's model) and `prng_key`.

        Args:
            target: The target state.

        Returns:
            (the source state, the target state as auxiliary data).
        """
        ema = ParamEmaState(
            count=TensorSpec(shape=(), dtype=jnp.int32, mesh_axes=PartitionSpec()),
            ema=clone_tree(target.trainer_state.model),
        )
        source_state = target.trainer_state._replace(learner=dict(ema=ema), model={})
        source = Builder.State(
            step=target.step,
            trainer_state=source_state,
            built_keys={key for key, _ in flatten_items(source_state)},
        )
        return source, target

    def source_to_target(self, source: Builder.State, aux: Any) -> Builder.State:
        """The target with `model` (and a target EMA, if any) from the restored EMA.

        The step stays the target's (as AXLearn's converter), not the checkpoint's.

        Args:
            source: The restored source.
            aux: The target state.

        Returns:
            The target state.
        """
        restored_ema = source.trainer_state.learner["ema"].ema
        target_state = aux.trainer_state._replace(
            model=restored_ema, prng_key=source.trainer_state.prng_key
        )
        learner: Union[dict, None] = target_state.learner
        if isinstance(learner, dict) and isinstance(learner.get("ema"), ParamEmaState):
            learner = dict(learner, ema=learner["ema"]._replace(ema=restored_ema))
            target_state = target_state._replace(learner=learner)
        built = aux.built_keys | {key for key, _ in flatten_items(target_state)}
        return Builder.State(step=aux.step, trainer_state=target_state, built_keys=built)
