"""The checkpointer interface (AXLearn's `BaseCheckpointer`) and savable-object helpers.

- `BaseCheckpointer`: what the trainer calls on any checkpointer (`save`, `restore`,
  `wait_until_finished`, `stop`, `ckpt_dir`, `latest_checkpoint_path`, `checkpoint_paths`).
  `Checkpointer` (TensorStore) and `checkpointer_orbax.OrbaxCheckpointer` implement it.
- `PythonSavable`: objects with `get_state()` / `set_state(state)` (e.g. an input iterator).
- `async_save_tf_savables` / `restore_tf_savables`: TF objects with checkpointable state (e.g.
  `tf.data` iterators), written with `tf.train.Checkpoint` per name under a directory.
- `check_state_structure`: compares (path, spec) lists with a `CheckpointValidationType`.
- `drop_learner_optimizer_cfg`: a restore filter config that keeps the optimizer state out.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any, Optional, Protocol, runtime_checkable

from axlearn.common import file_system as fs
from axlearn.common.checkpointer.tensorstore_restore import CheckpointValidationType
from axlearn.common.config import REQUIRED, Required, config_class, config_for_function
from axlearn.common.module import Module


class BaseCheckpointer(Module):
    """Base class of checkpointers: saves state trees by policy and restores them."""

    @config_class
    class Config(Module.Config):
        """Configures BaseCheckpointer."""

        # The checkpoint directory.
        dir: Required[str] = REQUIRED

    def ckpt_dir(self, step: int) -> str:
        """The directory of step `step`'s checkpoint."""
        raise NotImplementedError(type(self))

    def save(self, *, step: int, state: Any, evaler_summaries: Optional[dict] = None, **kwargs):
        """Saves `state` as `step` if the save policy says so."""
        raise NotImplementedError(type(self))

    def restore(self, *, step: Optional[int] = None, state: Any) -> tuple[Optional[int], Any]:
        """Restores `step` (None: the latest) into `state`'s structure; returns (step, state)."""
        raise NotImplementedError(type(self))

    def wait_until_finished(self):
        """Waits for the save in flight."""
        raise NotImplementedError(type(self))

    def stop(self):
        """Waits for saves and stops background work."""
        raise NotImplementedError(type(self))


@runtime_checkable
class PythonSavable(Protocol):
    """An object whose state is a (JSON-serializable or bytes) Python value."""

    def get_state(self) -> Any:
        """Returns the state to save."""

    def set_state(self, state: Any) -> None:
        """Restores a state returned by `get_state`."""


def _tf():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return tf


def async_save_tf_savables(
    value_map: dict[str, Any], *, executor: concurrent.futures.Executor, dir: str
) -> concurrent.futures.Future:
    """Saves TF checkpointable objects (e.g. `tf.data` iterators) under `dir`, asynchronously.

    The objects' state is captured before returning (written to a local temporary directory),
    so they may be advanced right away; copying it to `dir/<name>*` happens on `executor`. An
    empty `value_map` creates nothing.

    Args:
        value_map: {name: TF trackable object}.
        executor: Runs the copy.
        dir: The destination directory (created when something is saved).

    Returns:
        A future that completes when the files are in `dir`.
    """
    if not value_map:
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(None)
        return done
    tf = _tf()
    local_dir = tempfile.mkdtemp(prefix="axlearn_tf_savables_")
    for name, value in value_map.items():
        tf.train.Checkpoint(value).write(os.path.join(local_dir, name))

    def copy_out():
        try:
            fs.makedirs(dir)
            for filename in os.listdir(local_dir):
                fs.copy(
                    os.path.join(local_dir, filename), os.path.join(dir, filename), overwrite=True
                )
        finally:
            shutil.rmtree(local_dir, ignore_errors=True)

    return executor.submit(copy_out)


def restore_tf_savables(value_map: dict[str, Any], *, dir: str) -> dict[str, Any]:
    """Restores TF checkpointable objects saved by `async_save_tf_savables`, in place.

    Args:
        value_map: {name: TF trackable object of the same kind as saved}.
        dir: The directory they were saved to.

    Returns:
        `value_map`.
    """
    tf = _tf()
    for name, value in value_map.items():
        tf.train.Checkpoint(value).read(os.path.join(dir, name)).assert_consumed()
    return value_map


def _without_dtype(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "dtype"}
    return value


def _is_empty(value: Any) -> bool:
    return isinstance(value, dict) and not value


def check_state_structure(
    actual_structure: Sequence[tuple[str, Any]],
    target_structure: Sequence[tuple[str, Any]],
    validation: CheckpointValidationType = CheckpointValidationType.EXACT,
) -> None:
    """Checks a checkpoint's (path, spec) list against a restore target's.

    EXACT: the same entries; CONTAINS_STATE: the target's entries are a subset of the
    checkpoint's; the `*_UP_TO_DTYPE` variants ignore the specs' "dtype" keys. Empty-dict
    entries (empty subtrees) are ignored.

    Args:
        actual_structure: The checkpoint's (path, spec) pairs.
        target_structure: The target's (path, spec) pairs.
        validation: How strictly they must match.

    Raises:
        ValueError: Naming each differing entry as "path=spec".
    """
    up_to_dtype = validation in (
        CheckpointValidationType.EXACT_UP_TO_DTYPE,
        CheckpointValidationType.CONTAINS_STATE_UP_TO_DTYPE,
    )
    contains = validation in (
        CheckpointValidationType.CONTAINS_STATE,
        CheckpointValidationType.CONTAINS_STATE_UP_TO_DTYPE,
    )

    def entries(structure: Sequence[tuple[str, Any]]) -> dict[str, str]:
        out = {}
        for path, value in structure:
            if _is_empty(value):
                continue
            out[path] = str(_without_dtype(value) if up_to_dtype else value)
        return out

    actual, target = entries(actual_structure), entries(target_structure)
    missing = [f"{p}={v}" for p, v in target.items() if actual.get(p) != v]
    extra = [] if contains else [f"{p}={v}" for p, v in actual.items() if target.get(p) != v]
    if missing or extra:
        raise ValueError(
            f"Checkpoint structure does not match the target ({validation.value}): "
            f"in the target but not the checkpoint: {missing}; in the checkpoint but not the "
            f"target: {extra}"
        )


def drop_paths_filter(*, regex: str) -> Any:
    """A restore-state filter: paths fully matching `regex` are not restored.

    Args:
        regex: A regex over "/"-joined state paths.

    Returns:
        A function path -> bool (True: restore that leaf from the checkpoint).
    """
    import re  # pylint: disable=import-outside-toplevel

    pattern = re.compile(regex)
    return lambda path: pattern.fullmatch(path) is None


def drop_learner_optimizer_cfg() -> Any:
    """The config of a restore filter that leaves the learner's optimizer state out.

    Returns:
        `config_for_function(drop_paths_filter)` for "learner/optimizer/...".
    """
    return config_for_function(drop_paths_filter).set(regex=r"learner/optimizer(/.*)?")
