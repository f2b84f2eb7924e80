"""A checkpointer over Orbax's `CheckpointManager` (AXLearn's `checkpointer_orbax`).

`OrbaxCheckpointer` implements `checkpointer.BaseCheckpointer` with `orbax-checkpoint` (install
`axlearn[orbax]`): step `s` is saved (asynchronously) to `<dir>/step_%08d/state/` in Orbax's
PyTree format and restored into the structure, shardings and dtypes of a target tree. Saving
input iterators and other Python objects (`PythonSavable`, `tf.data` iterators) is not supported
by this checkpointer: such leaves are refused with an error (use `Checkpointer` for them).
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

import jax
import numpy as np
from absl import logging

from axlearn.common import file_system as fs
from axlearn.common.checkpointer.base import BaseCheckpointer
from axlearn.common.checkpointer.policies import CheckpointPolicy, every_n_steps_policy
from axlearn.common.config import InstantiableConfig, config_class, config_for_function
from axlearn.common.module import Module
from axlearn.common.utils import TensorSpec, flatten_items, tree_paths

# Whether OrbaxCheckpointer can checkpoint grain iterators. It cannot (see the module
# docstring), whether or not the grain package is installed.
_GRAIN_INSTALLED = False

_STEP_PREFIX = "step"
_STEP_DIGITS = 8


def _orbax():
    try:
        import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError(
            "OrbaxCheckpointer needs orbax-checkpoint: pip install 'axlearn[orbax]'"
        ) from e
    return ocp


def _is_array_leaf(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, bool))


class OrbaxCheckpointer(BaseCheckpointer):
    """Saves and restores array trees with Orbax (see the module docstring)."""

    @config_class
    class Config(BaseCheckpointer.Config):
        """Configures OrbaxCheckpointer."""

        # How many of the newest checkpoints to keep (>= 1).
        keep_last_n: int = 1
        # If set, also keeps every checkpoint whose step is a multiple of this.
        keep_every_n_steps: Optional[int] = None
        # A config that instantiates to a CheckpointPolicy: whether to save at a step.
        save_policy: InstantiableConfig = config_for_function(every_n_steps_policy)
        # Seconds Orbax waits for an async save's processes to agree.
        async_timeout_secs: int = 300

    def __init__(self, cfg: Config, *, parent: Optional[Module] = None):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not isinstance(cfg.keep_last_n, int) or cfg.keep_last_n < 1:
            raise ValueError(f"{self.path()}.keep_last_n must be >= 1, got {cfg.keep_last_n!r}")
        ocp = _orbax()
        self._ocp = ocp
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.keep_last_n,
            keep_period=cfg.keep_every_n_steps,
            create=True,
            enable_async_checkpointing=True,
            async_options=ocp.AsyncOptions(timeout_secs=cfg.async_timeout_secs),
            step_name_format=ocp.step.standard_name_format(
                step_prefix=_STEP_PREFIX, step_format_fixed_length=_STEP_DIGITS
            ),
        )
        self._options = options
        self._manager = ocp.CheckpointManager(
            os.path.abspath(cfg.dir), item_names=("state",), options=options
        )
        self._save_policy: CheckpointPolicy = cfg.save_policy.instantiate()
        self._within_context = False

    @property
    def save_policy(self) -> CheckpointPolicy:
        """The instantiated save policy."""
        return self._save_policy

    def ckpt_dir(self, step: int) -> str:
        return os.path.join(self.config.dir, f"{_STEP_PREFIX}_{step:0{_STEP_DIGITS}d}")

    @staticmethod
    def checkpoint_paths(base_dir: str) -> list[str]:
        """The step directories under `base_dir` that Orbax finalized, oldest first."""
        if not fs.exists(base_dir):
            return []
        pattern = re.compile(rf"{_STEP_PREFIX}_(\d{{{_STEP_DIGITS}}})")
        steps = sorted(int(m.group(1)) for m in map(pattern.fullmatch, fs.listdir(base_dir)) if m)
        return [os.path.join(base_dir, f"{_STEP_PREFIX}_{s:0{_STEP_DIGITS}d}") for s in steps]

    @staticmethod
    def latest_checkpoint_path(base_dir: str) -> Optional[str]:
        """The newest step directory under `base_dir`, or None."""
        paths = OrbaxCheckpointer.checkpoint_paths(base_dir)
        return paths[-1] if paths else None

    @staticmethod
    def latest_checkpoint_step(base_dir: str) -> Optional[int]:
        """The newest step under `base_dir`, or None."""
        path = OrbaxCheckpointer.latest_checkpoint_path(base_dir)
        return None if path is None else int(path.rsplit("_", 1)[-1])

    def __enter__(self) -> OrbaxCheckpointer:
        if self._within_context:
            raise ValueError(
                f"Already in a context: {self.path()} is already in a `with` block (nested "
                "`with checkpointer:` blocks are not supported)"
            )
        self._within_context = True
        return self

    def __exit__(self, *exc_info) -> None:
        self._within_context = False
        self.stop()

    def _check_leaves(self, state: Any) -> None:
        for path, leaf in flatten_items(state):
            if not _is_array_leaf(leaf):
                raise ValueError(
                    f"{self.path()}: cannot save {path} ({type(leaf).__name__}); "
                    "OrbaxCheckpointer saves arrays and numbers only (use Checkpointer for input "
                    "iterators and Python objects)."
                )

    def save(
        self, *, step: int, state: Any, evaler_summaries: Optional[dict] = None, force=False
    ) -> bool:
        """Saves `state` (asynchronously) if the policy (or `force`) says so.

        Returns:
            Whether a save was started.
        """
        if not force and not self._save_policy(step=step, evaler_summaries=evaler_summaries or {}):
            return False
        self._check_leaves(state)
        ocp = self._ocp
        self._manager.save(
            step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(item=state)), force=True
        )
        return True

    def restore(self, *, step: Optional[int] = None, state: Any) -> tuple[Optional[int], Any]:
        """Restores `step` (None: the newest) into the structure and shardings of `state`.

        Returns:
            (step, restored state), or (None, `state`) when there is no checkpoint.
        """
        self.wait_until_finished()
        if step is None:
            step = self._manager.latest_step()
            if step is None:
                logging.info("No checkpoint under %s: nothing to restore.", self.config.dir)
                return None, state
        ocp = self._ocp
        # TensorSpec leaves (shape, dtype, mesh_axes) restore as arrays sharded on the mesh.
        state = jax.tree.map(
            lambda x: (
                jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=x.sharding)
                if isinstance(x, TensorSpec)
                else x
            ),
            state,
        )
        restore_args = ocp.checkpoint_utils.construct_restore_args(state)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(item=state, restore_args=restore_args)
            ),
        )["state"]
        if jax.tree.structure(restored) == jax.tree.structure(state):
            return step, restored
        # Orbax gives plain containers for custom dict types (e.g. VDict): map back by path.
        by_path = dict(flatten_items(restored))
        return step, jax.tree.map(lambda path, _: by_path[path], tree_paths(state), state)

    def wait_until_finished(self):
        self._manager.wait_until_finished()

    def stop(self):
        self.wait_until_finished()
        self._manager.close()
        # A stopped checkpointer can be used again (e.g. a new `with` block).
        self._manager = self._ocp.CheckpointManager(
            self._manager.directory, item_names=("state",), options=self._options
        )
