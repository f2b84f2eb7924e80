"""SpmdTrainer's checkpointing: restore, save (never a non-finite state), preemption stop.

`TrainerCheckpointMixin` holds the parts of `SpmdTrainer` that talk to its checkpointer; the
public import path of everything here is `axlearn.common.trainer`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, NamedTuple, Optional

import jax
from absl import logging

from axlearn.common import utils
from axlearn.common.trainer_utils import all_finite

# In the checkpointer dir: the `restore_step` already applied (JSON {"step": N}).
RESTORE_STEP_MARKER = "restore_step_applied"


class TrainerState(NamedTuple):
    """The state the trainer trains and checkpoints."""

    # The PRNG key of the next step.
    prng_key: Any
    # The model parameters.
    model: Any
    # The learner (optimizer) state.
    learner: Any


class NonFiniteStateError(RuntimeError):
    """The trainer state holds NaN/inf values; it is never checkpointed."""


class SnapshotMemoryError(RuntimeError):
    """A train step could not allocate device memory while a checkpoint snapshot held some."""


def _is_resource_exhausted(error: BaseException) -> bool:
    return "RESOURCE_EXHAUSTED" in str(error) or "Out of memory" in str(error)


def snapshot_memory_message(
    *,
    step: int,
    error: BaseException,
    held_bytes: int,
    saved_step: Optional[int],
    peak_bytes: Optional[int],
    limit_bytes: Optional[int],
) -> str:
    """The one-line message of a `SnapshotMemoryError` (both numbers and the fixes).

    Args:
        step: The step that failed.
        error: The allocation error.
        held_bytes: Bytes per device the snapshot held on the device when the step started.
        saved_step: The step whose snapshot it is.
        peak_bytes: The step's compiled peak per device, if known.
        limit_bytes: The device memory limit, if known.

    Returns:
        The message.
    """
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    need = f"{peak_bytes / 1e9:.2f} GB" if peak_bytes else "an unknown amount"
    limit = f" of the {limit_bytes / 1e9:.2f} GB limit" if limit_bytes else ""
    return (
        f"Step {step} could not allocate device memory ({first}) while the checkpoint snapshot "
        f"of step {saved_step} held {held_bytes / 1e9:.2f} GB per device on the device; the "
        f"step needs {need} (compiled peak){limit}. Set checkpointer.storage.snapshot='host' "
        "(or 'partial'), or leave more device memory to JAX (XLA_PYTHON_CLIENT_MEM_FRACTION)."
    )


class _DeferredFinite:
    """The finiteness flag of a saved state, computed by the next step (fused with it).

    On CPU a save references the state and the step after it runs without donation; that step
    also reduces its input state (the saved one) to one finiteness flag, which costs almost
    nothing inside the step but ~16 ms (a full read of a P1-sized state) as a computation of
    its own. The checkpointer's writer waits for the flag before writing anything. If no step
    follows the save (end of run, preemption, an error), `resolve` computes the flag directly.
    """

    def __init__(self, tree: Any):
        self._tree = tree  # The saved floats, for `resolve` (held by the save anyway).
        self._event = threading.Event()
        self._value: Any = None

    def set(self, value: Any) -> None:
        """Sets the flag (a device boolean) from the step that read the saved state."""
        if not self._event.is_set():
            self._value, self._tree = value, None
            self._event.set()

    def resolve(self) -> None:
        """Computes the flag directly if no step has set it."""
        if not self._event.is_set():
            self.set(all_finite(self._tree))

    def get(self) -> bool:
        """Waits for the flag (set by the next step's dispatch or `resolve`); returns it."""
        self._event.wait()
        return bool(self._value)


class TrainerCheckpointMixin:
    """Restore/save/preemption methods of SpmdTrainer (uses its children and loop state)."""

    # Set by a save that referenced the state (CPU): the next step must not donate it.
    _state_held_by_save: bool = False
    # That save's finiteness flag, set by the next step (see _DeferredFinite).
    _pending_finite: Optional[_DeferredFinite] = None
    # The parts of the last save's blocking time, for the next step record.
    _pending_checkpoint_split: Optional[dict[str, Any]] = None
    # Seconds the end of the run waited for the last save's write.
    _end_of_run_wait_s: Optional[float] = None
    # The checkpoint snapshot chosen for this run (see `_choose_checkpoint_snapshot`).
    _snapshot_choice: Any = None

    def restore_checkpoint(self, restore_step: Optional[int] = None) -> Optional[int]:
        """Restores the latest committed checkpoint (or `restore_step`) into the state shardings.

        If the checkpoint holds an input iterator position (and `save_input_iterator` is set),
        the input resumes from it; a checkpoint saved with the other `save_input_iterator`
        setting is restored too (the input then starts from its beginning).

        Args:
            restore_step: The step to restore; None: the latest committed one, if any.

        Returns:
            The restored step, or None if there was nothing to restore.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.checkpointer import StateMismatchError

        with_input = bool(self._config.save_input_iterator) and self._input_is_checkpointable()
        with self._mesh_context():
            try:
                step, state = self.checkpointer.restore(
                    step=restore_step, state=self._checkpoint_state_spec(with_input=with_input)
                )
            except StateMismatchError as e:
                if e.paths - {"input_iter"}:
                    raise  # The model differs: the input iterator is not the cause.
                logging.warning(
                    "Restoring with input iterator=%s failed (%s); retrying with %s.",
                    with_input,
                    e,
                    not with_input,
                )
                with_input = not with_input and self._input_is_checkpointable()
                step, state = self.checkpointer.restore(
                    step=restore_step, state=self._checkpoint_state_spec(with_input=with_input)
                )
        if step is None:
            return None
        self._step = int(step)
        self._trainer_state = TrainerState(
            **{k: v for k, v in state.items() if k in TrainerState._fields}
        )
        if self._config.save_input_iterator and "input_iter" in state:
            self._input_iter = self.input.restore_iterator(state["input_iter"])
            self._step_log("Restored the input iterator position.")
        self._step_log("Restored checkpoint at step %s.", step)
        return self._step

    def _restore_step_to_apply(self) -> Optional[int]:
        """The step `restore_step` asks for, the first time only (None: the newest one).

        Applying it sets every newer step directory aside (nothing is deleted) and records the
        step in `<checkpointer dir>/restore_step_applied`, so that a restart with the same flag
        resumes from the run's newer checkpoints instead of discarding them again.
        """
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.checkpointer import layout, recovery

        step = self._config.restore_step
        if step is None:
            return None
        ckpt_dir = self.checkpointer.config.dir
        marker = os.path.join(ckpt_dir, RESTORE_STEP_MARKER)
        try:
            with open(marker, encoding="utf-8") as f:
                if json.load(f).get("step") == step:
                    self._step_log(
                        "restore_step=%d was applied by an earlier start (%s); resuming from "
                        "the newest checkpoint.",
                        step,
                        marker,
                    )
                    return None
        except (OSError, ValueError):
            pass
        step_dir = self.checkpointer.ckpt_dir(step)
        if not layout.is_committed(step_dir):
            raise recovery.RestoreStepError(
                recovery.restore_step_message(f"{self.path()}.restore_step", ckpt_dir, step)
            )
        if jax.process_index() == 0:
            # Read the chosen step's index before anything is renamed.
            try:
                layout.read_index_file(step_dir)
            except layout.CheckpointIndexError as e:
                raise recovery.CorruptCheckpointError(recovery.corrupt_message(step_dir, e)) from e
            recovery.supersede_newer(ckpt_dir, step)
            layout.write_json_atomically(marker, {"step": step})
        return step

    def _input_is_checkpointable(self) -> bool:
        return hasattr(self.input, "iterator_state") and hasattr(self.input, "restore_iterator")

    def _checkpoint_state_spec(self, *, with_input: bool) -> dict[str, Any]:
        """The tree of (shape, dtype, sharding) the checkpointer restores into."""

        def spec(s, sharding):
            return jax.ShapeDtypeStruct(shape=tuple(s.shape), dtype=s.dtype, sharding=sharding)

        specs = jax.tree.map(
            spec,
            self._trainer_state_specs,
            self._trainer_state_shardings,
            is_leaf=lambda x: isinstance(x, (utils.TensorSpec, jax.ShapeDtypeStruct)),
        )
        state = specs._asdict()
        if with_input:
            state["input_iter"] = b""
        return state

    # Abstract (jax.eval_shape): no computation, so this works under a mesh of devices this
    # process cannot run on (AOT compilation for a TPU topology).
    @staticmethod
    def _prng_key_shape() -> tuple:
        return tuple(jax.eval_shape(lambda: jax.random.PRNGKey(0)).shape)

    @staticmethod
    def _prng_key_dtype():
        return jax.eval_shape(lambda: jax.random.PRNGKey(0)).dtype

    def _save_checkpoint(
        self, evaler_summaries: Optional[dict[str, Any]], *, force: bool = False
    ) -> Any:
        """Saves the current state (the caller checked the policy); never a non-finite state.

        On CPU the save references the state's arrays instead of copying them, and the next
        step runs without donation (see `_saves_alias_state`).

        The state's finiteness is reduced to one flag on the device (on CPU by the next step,
        see `_DeferredFinite`); the checkpointer's writer reads it before writing anything
        (`precondition`), so the loop does not wait for it. A
        non-finite state is not written: NonFiniteStateError is raised by the next save or at
        the end of the run (at once for synchronous saves).

        Returns:
            The checkpointer's `SaveStats`, or None if it did not save.
        """
        streak = getattr(getattr(self, "_skip_streak", None), "streak", 0)
        if streak and not force:
            # The skipped steps left the parameters as they were before the streak; a streak
            # that reaches its limit stops the run, and none of its steps is a checkpoint.
            logging.info(
                "Not saving step %d: it is step %d of a streak of skipped steps.",
                self._step,
                streak,
            )
            return
        self._resolve_pending_finite()
        alias = self._saves_alias_state()
        if alias:
            # The next step (non-donating) computes the flag of its input, this state.
            finite = self._pending_finite = _DeferredFinite(self._checkpointed_floats())
        else:
            # Dispatched before the state's buffers can be donated to the next step.
            finite = all_finite(self._checkpointed_floats())
        step = self._step

        def require_finite():
            if not (finite.get() if alias else bool(finite)):
                raise NonFiniteStateError(
                    f"Step {step}: the trainer state (parameters or optimizer state) holds "
                    "NaN/inf values; refusing to checkpoint it. The last committed checkpoint "
                    "is kept."
                )

        ckpt_state = self._trainer_state._asdict()
        start = time.perf_counter()
        if self._config.save_input_iterator and self._input_is_checkpointable():
            ckpt_state["input_iter"] = self.input.iterator_state(self._input_iter)
        self._input_state_s = time.perf_counter() - start
        with self._mesh_context():
            stats = self.checkpointer.save(
                step=self._step,
                state=ckpt_state,
                evaler_summaries=evaler_summaries,
                force=force,
                precondition=require_finite,
                alias_arrays=alias,
            )
        # The save may read these arrays until its write is done: the next step keeps them.
        self._state_held_by_save = alias
        self._last_saved_step = self._step
        return stats

    def _save_checkpoint_timed(
        self, evaler_summaries: Optional[dict[str, Any]], *, force: bool = False
    ) -> None:
        """`_save_checkpoint` as the step's "checkpoint" overhead, split into its parts for the
        step record: the snapshot, waiting for the previous save, and the rest."""
        timer = self._timer
        before = timer.pending_overheads().get("checkpoint", 0.0)
        with timer.overhead("checkpoint"):
            stats = self._save_checkpoint(evaler_summaries, force=force)
        total = timer.pending_overheads().get("checkpoint", 0.0) - before
        if stats is None:
            return
        snapshot = stats.snapshot
        if stats.choice is not None:
            snapshot = stats.choice.short()
        elif self._snapshot_choice is not None and stats.snapshot == "reference":
            snapshot = "reference (CPU: no copy, the next step keeps the state)"
        split = dict(
            blocking_s=total,
            snapshot_s=stats.snapshot_s,
            wait_for_previous_s=stats.wait_for_previous_s,
            other_s=max(0.0, total - stats.snapshot_s - stats.wait_for_previous_s),
            # Part of the rest: reading the input iterator's position.
            input_position_s=getattr(self, "_input_state_s", 0.0),
            snapshot=snapshot,
        )
        split["waited"] = bool(stats.waited)
        if stats.waited and stats.previous is not None:
            split["previous_write_gb_per_s"] = stats.previous.write_gb_per_s
            split["previous_write_s"] = stats.previous.write_s
        self._pending_checkpoint_split = split

    def _take_checkpoint_split(self) -> Optional[dict[str, Any]]:
        """The parts of the save charged to the step being recorded (then cleared)."""
        split, self._pending_checkpoint_split = self._pending_checkpoint_split, None
        return split

    def _finish_saves(self) -> None:
        """At the end of the run: waits for the last save's write; records the wait."""
        self._resolve_pending_finite()
        start = time.perf_counter()
        try:
            self.checkpointer.wait_until_finished()
        finally:
            self._end_of_run_wait_s = time.perf_counter() - start

    def _choose_checkpoint_snapshot(self, compiled: Any) -> None:
        """Chooses where this run's checkpoint snapshots live, from the compiled step's peak
        memory, the state's bytes per device and each device's limit (logged once)."""
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.device_memory import compiled_memory_stats

        choose = getattr(getattr(self.checkpointer, "storage", None), "choose_snapshot", None)
        if choose is None:
            return
        memory = compiled_memory_stats(compiled)
        peak = None
        if memory is not None:
            # XLA's peak estimate can be below argument + output + temp (on CPU it reports the
            # arguments alone): take the larger, so a device copy is never planned into memory
            # the step needs.
            peak = max(memory.peak_bytes or 0, memory.total_bytes)
        self._snapshot_peak_bytes = peak
        with self._mesh_context():
            self._snapshot_choice = choose(
                self._checkpoint_state_spec(with_input=False), step_peak_bytes=peak
            )
        if self._snapshot_choice is None:
            return
        # The storage logged the choice and its numbers (once, when it changes).
        if self._saves_alias_state():
            self._step_log(
                "checkpoint snapshot on CPU: no copy at all; the step after a save keeps (does "
                "not donate) the saved state until its write ends."
            )

    def _prepare_checkpoint_transfer(self) -> None:
        """Before the first step, sets up the host memory the first save's transfer would
        allocate while steps run (see `StateStorage.prepare_host_transfer`; logged there)."""
        storage = getattr(self.checkpointer, "storage", None)
        if self._snapshot_choice is not None and hasattr(storage, "prepare_host_transfer"):
            storage.prepare_host_transfer(self._trainer_state._asdict())

    def _dispatch_train_step(self, global_batch: Any) -> dict[str, Any]:
        """Dispatches the next train step (updating the state); returns its outputs.

        After a save that references the state (CPU) the step does not donate it and checks it
        for NaN/inf for the save's writer. A step that cannot allocate device memory while a
        checkpoint snapshot holds some raises SnapshotMemoryError naming both numbers.
        """
        storage = getattr(self.checkpointer, "storage", None)
        held = storage.device_snapshot_bytes() if hasattr(storage, "device_snapshot_bytes") else 0
        try:
            if self._state_held_by_save:
                # The last save still reads the state's arrays: do not donate them. This step
                # also checks that they (the saved state) are finite, for the save's writer.
                self._state_held_by_save = False
                self._trainer_state, outputs, finite = self._compiled_train_step_keep_state(
                    self._trainer_state, global_batch
                )
                self._resolve_pending_finite(finite)
            else:
                self._trainer_state, outputs = self._compiled_train_step(
                    self._trainer_state, global_batch
                )
        except Exception as e:
            if held and _is_resource_exhausted(e):
                choice = self._snapshot_choice
                raise SnapshotMemoryError(
                    snapshot_memory_message(
                        step=self._step,
                        error=e,
                        held_bytes=held,
                        saved_step=getattr(self, "_last_saved_step", None),
                        peak_bytes=getattr(self, "_snapshot_peak_bytes", None),
                        limit_bytes=choice.limit_bytes if choice is not None else None,
                    )
                ) from e
            raise
        return outputs

    def _resolve_pending_finite(self, value: Any = None) -> None:
        """Sets the last aliased save's finiteness flag: `value` from the step after it, or
        (None) computed now when no such step will run. Idempotent."""
        pending, self._pending_finite = self._pending_finite, None
        if pending is not None:
            if value is None:
                pending.resolve()
            else:
                pending.set(value)

    def _saves_alias_state(self) -> bool:
        """Whether saves reference the state instead of copying it (on CPU meshes).

        On CPU the snapshot copy would be a host memcpy of the whole state in the step's time;
        instead the step after a save runs without donating the state (one extra compiled
        variant, compiled with the train step), so the saved arrays stay unchanged while the
        checkpointer writes them. That costs one state's worth of memory for a step, as a device
        snapshot would: so only while the snapshot choice (if made) is "device". On
        accelerators the state stays donated and the snapshot is a copy.
        """
        if not all(d.platform == "cpu" for d in self._mesh.devices.flat):
            return False
        choice = self._snapshot_choice
        return choice is None or choice.mode == "device"

    def _checkpoint_due(self, evaler_summaries) -> bool:
        policy = getattr(self.checkpointer, "save_policy", None)
        if policy is None:
            policy = getattr(self.checkpointer, "_save_policy", None)
        if policy is None:
            return True
        return bool(policy(step=self._step, evaler_summaries=evaler_summaries))

    def _checkpointed_floats(self, state: Optional[TrainerState] = None) -> Any:
        """The parts of `state` (default: the current trainer state) checked for NaN/inf before
        each save."""
        state = self._trainer_state if state is None else state
        return (state.model, state.learner)

    def _stop_for_preemption(self, current: Any) -> None:
        """After a preemption notice: finishes step `current`, saves it, waits, exits.

        The step is saved unless its save policy just did; see axlearn/common/preemption.py.

        Raises:
            TrainingPreempted: Always, once the save is committed (a SystemExit whose code is
                preemption.PREEMPTED_EXIT_CODE).
        """
        preemption = self._preemption
        preemption.set_activity(f"finishing step {current.step}")
        self._drain(current)
        self._finish_step(current)
        self._stop_trace()
        if getattr(self, "_last_saved_step", None) != current.step:
            preemption.set_activity(f"saving step {current.step}")
            self._save_checkpoint(None, force=True)
        preemption.set_activity(f"committing step {current.step}")
        self._resolve_pending_finite()
        self.checkpointer.wait_until_finished()
        error = preemption.preempted(step=current.step, saved_step=current.step)
        self._step_log("%s", error)
        raise error
